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
                       seed=a.seed, timer=_timer_opts(a), progress=not a.quiet, trace=a.trace)
    except KeyboardInterrupt:
        print(f"flyexplore: interrupted; finished rows kept in {a.out}", file=sys.stderr)
        sys.exit(130)
    with_cols = summary_table(df)
    print(with_cols.to_string(index=False, max_colwidth=60))
    print(f"{len(df)} rows written to {a.out}")


def _parse_opts(items) -> dict:
    out = {}
    for it in items or ():
        for tok in filter(None, (t.strip() for t in it.split(";"))):
            k, eq, v = tok.partition("=")
            if not eq or not k.strip():
                raise UsageError(f"malformed --opt {tok!r} (expected key=value)")
            out[k.strip()] = v.strip()
    return out


def _cmd_explain(a):
    from . import explain as X

    if a.op not in X.OPS:
        raise UsageError(f"unknown operator for explain {a.op!r} (valid: {', '.join(X.OPS)})")
    comp = None
    if a.op not in X.EAGER:
        if a.compile_options == "current":
            comp = None
        elif a.compile_options:
            try:
                comp = json.loads(a.compile_options)
            except json.JSONDecodeError:
                raise UsageError(f"--compile-options must be JSON or 'current', got {a.compile_options!r}") from None
            if not isinstance(comp, dict):
                raise UsageError(f"--compile-options must be a JSON object, got {a.compile_options!r}")
        else:
            from torch._inductor import config as ic

            from .switches import compile_options
            comp = compile_options(True, backends=ic.max_autotune_gemm_backends)
    if a.cu is not None and a.cu <= 0:
        raise UsageError(f"--cu must be a positive CU count, got {a.cu}")
    ex = X.explain_shape(a.op, a.shape, a.dtype, _parse_opts(a.opt), arch=a.arch, cu=a.cu,
                         assume_rocm=a.assume_rocm, compile_options=comp)
    if a.json:
        d = ex.to_dict()
        d["compile_options"] = comp
        print(json.dumps(d, indent=2, default=str))
    else:
        if comp is not None:
            print(f"compiled as torch.compile(options={comp}) (--compile-options to change)")
        print(ex.to_text())


def _cmd_trace(a):
    from .trace import trace_case

    if a.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {a.reps}")
    r = trace_case(a.op, a.shape, a.backend, a.dtype, a.device, a.reps)
    tr = r.pop("trace")
    if a.json:
        print(json.dumps({**r, "trace": tr.to_dict() if tr else None}, indent=2, default=str))
        return
    print(f"{r['op']} {r['case']} {r['dtype']} backend {r['backend']} on {r['device']}: {r['status']}")
    if r.get("message"):
        print(r["message"])
    if tr is not None:
        print(tr.to_text())
    if "flydsl_reason" in r:
        print(f"FlyDSL: {r['flydsl_reason']}")


def _cmd_switches(a):
    from . import switches

    if a.json:
        print(json.dumps(switches.table().to_dict(orient="records"), indent=2, default=str))
    else:
        print(switches.text())


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
    w.add_argument("--trace", action="store_true",
                   help="record what really ran for every row (observed, autotune; flydsl rows always)")
    w.set_defaults(func=_cmd_sweep)

    x = sub.add_parser("explain", help="would a call take FlyDSL, and if not, why not")
    x.add_argument("--op", required=True, help="rmsnorm, topk, gemm, grouped_gemm, scaled_gemm")
    x.add_argument("--shape", required=True,
                   help="catalogue shape text: 8192x4096 (rmsnorm), 4096x2048x8 (topk), 16x28672x4096:NT "
                        "(gemm), g8x512x4096x4096 (grouped_gemm, M per group), 32x4096x4096 (scaled_gemm)")
    x.add_argument("--dtype", help="bf16, fp16, fp32; mxfp8/mxfp4 for scaled_gemm (default: the operator's first)")
    x.add_argument("--opt", action="append", metavar="KEY=VALUE",
                   help="more of the call: strides, offsets, bias, out_dtype, dim, ... (repeatable)")
    x.add_argument("--arch", help="take this as the device's gcnArchName (e.g. gfx950)")
    x.add_argument("--cu", type=int, help="CU count for TopK's row gate (default: the device's, else 256)")
    x.add_argument("--assume-rocm", action="store_true",
                   help="judge as on a ROCm torch 2.15 with flydsl 0.3.x (what-if on another machine)")
    x.add_argument("--compile-options", help="JSON torch.compile options for GEMMs, or 'current' for this "
                   "process's Inductor config (default: FLYDSL added, max-autotune)")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=_cmd_explain)

    t = sub.add_parser("trace", help="run one case and show the kernels that really ran")
    t.add_argument("--op", required=True)
    t.add_argument("--shape", required=True)
    t.add_argument("--backend", required=True)
    t.add_argument("--dtype")
    t.add_argument("--device", help="torch device (default: cuda:0 if present, else cpu)")
    t.add_argument("--reps", type=int, default=3, help="profiled calls (default 3)")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_cmd_trace)

    sw = sub.add_parser("switches", help="the state of every FlyDSL switch")
    sw.add_argument("--json", action="store_true")
    sw.set_defaults(func=_cmd_switches)

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
