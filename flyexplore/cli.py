"""The ``flyexplore`` command line: thin wrappers over the library's functions.

Bad input (unknown operator, suite, backend or dtype, malformed shapes, an output path that
cannot be written) prints one line, ``flyexplore: error: ...``, and exits with code 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(message)


def _cmd_env(a):
    from .env import collect

    env = collect()
    print(json.dumps(env.to_dict(), indent=2, default=str) if a.json else env.to_text())


def _cmd_suites(a):
    from .ops import get_op, list_ops

    ops = [a.op] if a.op else list_ops()
    for name in ops:
        op = get_op(name)
        for s in op.suites.values():
            dts = ",".join(sorted({d for _, d in s.pairs()}))
            print(f"{name:9s} {s.name:16s} {len(s.pairs()):3d} runs  {dts:14s} {s.description}  [{s.source}]")


def _timer_opts(a) -> dict:
    t = {"mode": a.timing}
    if a.rep is not None:
        t["rep"] = a.rep
        t["warmup"] = a.warmup if a.warmup is not None else max(1, a.rep // 4)
    if a.rep_ms is not None:
        t["rep_ms"] = a.rep_ms
    return t


def _cmd_sweep(a):
    from .report import summary_table
    from .sweep import run_sweep

    if a.timing not in ("auto", "cpu-wall", "event", "graph", "kernel"):
        raise UsageError(f"unknown timing mode {a.timing!r} (valid: auto, cpu-wall, event, graph, kernel)")
    try:
        df = run_sweep(a.op, suite=a.suite, shapes=a.shapes, dtypes=a.dtypes, backends=a.backends,
                       out=a.out, resume=a.resume, overwrite=a.overwrite, device=a.device,
                       seed=a.seed, timer=_timer_opts(a), progress=not a.quiet)
    except KeyboardInterrupt:
        print(f"flyexplore: interrupted; finished rows kept in {a.out}", file=sys.stderr)
        sys.exit(130)
    with_cols = summary_table(df)
    print(with_cols.to_string(index=False, max_colwidth=60))
    print(f"{len(df)} rows written to {a.out}")


def _cmd_demo(a):
    from .demo import run_demo

    path = run_demo(a.out, progress=not a.quiet)
    print(f"report: {path}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flyexplore", description="Measure and explain PyTorch's FlyDSL, ATen, "
                "Triton and vendor paths (MI350 gfx950, any CUDA/ROCm GPU, or CPU).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    e = sub.add_parser("env", help="environment report and FlyDSL readiness")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_cmd_env)

    s = sub.add_parser("suites", help="list the named shape suites")
    s.add_argument("--op")
    s.set_defaults(func=_cmd_suites)

    w = sub.add_parser("sweep", help="run a sweep; rows are kept as they finish")
    w.add_argument("--op", required=True)
    g = w.add_mutually_exclusive_group(required=True)
    g.add_argument("--suite")
    g.add_argument("--shapes", help="inline shapes, e.g. '4096x4096x4096;8x4096x4096:NN'")
    w.add_argument("--dtypes", help="comma-separated, e.g. bf16,fp16 (default: the suite's)")
    w.add_argument("--backends", help="comma-separated (default: all of the operator's)")
    w.add_argument("--out", required=True, help="result file: .parquet, .csv or .jsonl")
    w.add_argument("--resume", action="store_true", help="skip cases already in --out")
    w.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    w.add_argument("--device", help="torch device (default: cuda:0 if present, else cpu)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--timing", default="auto", help="auto | cpu-wall | event | graph | kernel")
    w.add_argument("--rep", type=int, help="timed calls (default: by time budget)")
    w.add_argument("--warmup", type=int, help="warm-up calls (with --rep)")
    w.add_argument("--rep-ms", type=float, help="time budget for timed calls, ms")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.set_defaults(func=_cmd_sweep)

    d = sub.add_parser("demo", help="the main job: a sweep and an HTML report sized for this machine")
    d.add_argument("--out", default="flyexplore-demo", help="output folder (default: flyexplore-demo)")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flyexplore`` console script. Returns the exit code."""
    try:
        a = build_parser().parse_args(argv)
        a.func(a)
    except UsageError as exc:
        print(f"flyexplore: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
