"""``flyexplore demo``: the main job, a sweep and an HTML report sized for this machine; the work
is :func:`flyexplore.cli.demo_job.run_demo`."""
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

    static_note(a.no_images)
    path = run_demo(a.out, progress=not a.quiet, static=not a.no_images)
    print(f"report: {path}")
    return 0
