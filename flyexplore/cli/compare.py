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
    p.add_argument("--b-backend", help="... with this backend of B (e.g. aten vs flydsl of one sweep)")
    p.add_argument("--title")
    p.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.results.vllm import looks_like_vllm
    from flyexplore.views.report import write_compare_report, write_vllm_report

    names = tuple(n.strip() for n in a.names.split(",")) if a.names else ("A", "B")
    if len(names) != 2 or not all(names):
        raise UsageError(f"--names needs two comma-separated names, got {a.names!r}")
    va, vb = looks_like_vllm(a.a), looks_like_vllm(a.b)
    static_note(a.no_images)
    if va != vb:
        raise UsageError(f"cannot compare a vllm bench result with a flyexplore result file ({a.a!r}, {a.b!r})")
    if va:
        path = write_vllm_report(a.a, a.b, a.out, names, title=a.title, static=not a.no_images)
    else:
        from flyexplore.results import table as R
        path = write_compare_report(R.load(a.a), R.load(a.b), a.out, names, a.a_backend, a.b_backend,
                                    title=a.title, static=not a.no_images)
    print(f"report: {path}")
    return 0
