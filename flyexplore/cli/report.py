"""``flyexplore report``: one HTML report (environment, tables, figures) plus static images of
result files (:func:`flyexplore.views.report.write_report`)."""
from __future__ import annotations

import argparse

from flyexplore.cli._shared import baseline_arg, inputs_in, load_many, static_note

HELP = "one HTML report (environment, tables, figures) plus static images"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="result files (.parquet, .csv, .jsonl)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--baseline", default="aten", help="backend for speedups, or several comma-separated "
                   "(the faster of them per case); default aten")
    p.add_argument("--with-published", action="store_true", help="add measured vs published (MI355X) figures")
    p.add_argument("--title")
    p.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.views.report import write_report

    df = load_many(a.results)
    static_note(a.no_images)
    path = write_report(df, a.out, title=a.title or f"flyexplore report: {', '.join(a.results)}",
                        baseline=baseline_arg(a.baseline), static=not a.no_images, published=a.with_published,
                        keep=inputs_in(a.results, a.out))
    print(f"report: {path}")
    return 0
