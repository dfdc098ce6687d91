"""``flyexplore report``: one HTML report (environment, tables, figures) plus static images of
result files (:func:`flyexplore.views.report.write_report`)."""
from __future__ import annotations

import argparse

from flyexplore.cli._shared import baseline_arg, inputs_in, static_note

HELP = "one HTML report (environment, tables, figures) plus static images"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="result files (.parquet, .csv, .jsonl)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--baseline", help="backend for speedups, or several comma-separated "
                   "(the faster of them per case); default aten (an environment A/B file: its baseline arm, "
                   "e.g. flash@0.13b)")
    p.add_argument("--with-published", action="store_true", help="add measured vs published (MI355X) figures")
    p.add_argument("--title")
    p.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")


def run(a: argparse.Namespace) -> int:
    """Check the output folder, read and validate the result files
    (:func:`flyexplore.results.table.load_set`: files without any result row are refused,
    :func:`~flyexplore.views.report.refuse_no_rows`) and the baseline, then write the report; any
    problem is one :class:`~flyexplore.errors.UsageError` line before anything is written."""
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.results import table as R
    from flyexplore.views.export import check_writable
    from flyexplore.views.report import check_report_dir, refuse_no_rows, write_report

    keep = inputs_in(a.results, a.out)
    baseline = baseline_arg(a.baseline) if a.baseline is not None else None
    check_report_dir(a.out, keep)
    check_writable(a.out, "report folder", folder=True)
    df = R.load_set(a.results)
    refuse_no_rows(df, a.results)   # before anything is written
    if baseline is None:
        baseline = R.default_baseline(df)
    R.check_backends(df, baseline, "--baseline", ", ".join(repr(r) for r in a.results))
    static_note(a.no_images)
    path = write_report(df, a.out, title=a.title or f"flyexplore report: {', '.join(a.results)}",
                        baseline=baseline, static=not a.no_images, published=a.with_published, keep=keep)
    print(f"report: {path}")
    return 0
