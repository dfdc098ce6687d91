"""``flyexplore demo``: the main job, a sweep and an HTML report sized for this machine; the work
is :func:`flyexplore.cli.demo_job.run_demo`. Prints the verdicts (one line per comparison,
:func:`flyexplore.views.report.verdict_lines`), then the report's path."""
from __future__ import annotations

import argparse

from flyexplore.cli._shared import static_note

HELP = "the main job: a sweep and an HTML report sized for this machine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="flyexplore-demo", help="output folder (default: flyexplore-demo)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files (faster)")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.cli.demo_job import run_demo
    from flyexplore.results import table as R
    from flyexplore.views.report import verdict_lines

    static_note(a.no_images)
    path = run_demo(a.out, progress=not a.quiet, static=not a.no_images)
    # the verdicts on the terminal (one line per comparison), then where the rest is
    for line in verdict_lines(R.load(path.parent / "results.parquet")):
        print(line)
    print(f"report: {path}")
    return 0
