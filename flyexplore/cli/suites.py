"""``flyexplore suites``: the named shape suites of every operator (or one)."""
from __future__ import annotations

import argparse

from flyexplore.cli._shared import catalogue, check_names
from flyexplore.ops import get_op, list_ops

HELP = "list the named shape suites"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", help="only this operator: " + ", ".join(catalogue()))


def run(a: argparse.Namespace) -> int:
    check_names(a.op)
    ops = [a.op] if a.op else list_ops()
    for name in ops:
        op = get_op(name)
        for s in op.suites.values():
            dts = ",".join(sorted({d for _, d in s.pairs()}))
            print(f"{name:9s} {s.name:16s} {len(s.pairs()):3d} runs  {dts:14s} {s.description}  [{s.source}]")
    return 0
