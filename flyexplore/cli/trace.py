"""``flyexplore trace``: run one case and show the kernels that really ran
(:func:`flyexplore.insight.case_trace.trace_case`)."""
from __future__ import annotations

import argparse
import json

from flyexplore.cli._shared import catalogue, check_names
from flyexplore.errors import UsageError

HELP = "run one case and show the kernels that really ran"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", required=True, help="operator: " + ", ".join(catalogue()))
    p.add_argument("--shape", required=True, help="one case, e.g. 64x64x64 (gemm), 8192x4096 (rmsnorm)")
    p.add_argument("--backend", required=True, help="one of the operator's backends (sweep --help lists them)")
    p.add_argument("--dtype", help="one of the operator's dtypes (default: its first)")
    p.add_argument("--device", help="torch device (default: cuda:0 if present, else cpu)")
    p.add_argument("--reps", type=int, default=3, help="profiled calls (default 3)")
    p.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> int:
    check_names(a.op, a.backend, a.dtype)  # no torch yet
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.insight.case_trace import trace_case

    if a.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {a.reps}")
    r = trace_case(a.op, a.shape, a.backend, a.dtype, a.device, a.reps)
    tr = r.pop("trace")
    if a.json:
        print(json.dumps({**r, "trace": tr.to_dict() if tr else None}, indent=2, default=str))
        return 0
    print(f"{r['op']} {r['case']} {r['dtype']} backend {r['backend']} on {r['device']}: {r['status']}")
    if r.get("message"):
        print(r["message"])
    if tr is not None:
        print(tr.to_text())
    if "flydsl_reason" in r:
        print(f"FlyDSL: {r['flydsl_reason']}")
    return 0
