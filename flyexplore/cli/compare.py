"""``flyexplore compare``: an A/B report of two result files paired by case, or of two
``vllm bench serve --save-result`` files or folders (:mod:`flyexplore.views.report`)."""
from __future__ import annotations

import argparse

from flyexplore.cli._shared import static_note
from flyexplore.errors import UsageError

HELP = ("A/B report of two result files paired by case (or two "
        "vllm bench serve --save-result files/folders)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="side A (baseline): result file, or vllm JSON file/folder")
    p.add_argument("b", help="side B: result file, or vllm JSON file/folder")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--names", help="display names of A and B, comma-separated (default A,B)")
    p.add_argument("--a-backend", help="compare this backend of A ...")
    p.add_argument("--b-backend", help="... with this backend of B (e.g. aten vs flydsl of one sweep); "
                   "one of the two alone compares that backend on both sides")
    p.add_argument("--title")
    p.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.results.compare import sides
    from flyexplore.views.export import check_writable
    from flyexplore.views.report import check_report_dir, write_ab_report

    names = tuple(n.strip() for n in a.names.split(",")) if a.names else ("A", "B")
    if len(names) != 2 or not all(names):
        raise UsageError(f"--names needs two comma-separated names, got {a.names!r}")
    check_report_dir(a.out)   # the output first: nothing is read or written for a folder that is refused
    check_writable(a.out, "report folder", folder=True)
    sd = sides(a.a, a.b, names, a.a_backend, a.b_backend)   # result files read with validation
    static_note(a.no_images)
    path = write_ab_report(sd, a.out, title=a.title, static=not a.no_images)
    print(f"report: {path}")
    return 0
