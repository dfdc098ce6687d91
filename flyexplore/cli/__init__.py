"""The ``flyexplore`` command line: thin wrappers over the library's functions.

Bad input (unknown operator, suite, backend or dtype, malformed shapes, an output path that
cannot be written) prints one line, ``flyexplore: error: ...``, and exits with code 2.
``--help`` and the name checks of :func:`catalogue` answer without importing torch (well
under a second); torch is imported only by the commands that run something.

Exit codes: 0 success (``explain``: FlyDSL YES / AOTriton eligible); 1 ``explain``: NO / not
eligible (``xray``: the X-ray cannot run here); 2 usage error; 3 ``explain --op attention``:
unverified (a condition cannot be evaluated away from the device); 130 interrupted (Ctrl-C);
a closed output pipe (``flyexplore explain ... | head``) ends quietly with 141 (128 + SIGPIPE,
what a shell reports for a program stopped by it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from flyexplore.errors import UsageError, bad_choice


def catalogue() -> dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """What the command line accepts, per operator: ``{op: (backends, dtypes, suites)}`` in the
    catalogue's order, read from the registry (:mod:`flyexplore.ops`, which imports no torch,
    so ``--help`` and name errors stay fast), operators added by ``register_op`` included."""
    from flyexplore.ops import get_op, list_ops

    out = {}
    for n in list_ops():
        op = get_op(n)
        out[n] = (tuple(op.backends), tuple(op.dtypes), tuple(op.suites))
    return out


def explain_ops() -> tuple[str, ...]:
    """Operators ``explain`` answers for (:func:`flyexplore.insight.explain.explainable`, attention included)."""
    from flyexplore.insight.explain import explainable
    return tuple(explainable(True))


#: Timing modes by order (``flyexplore.measure.interleaved.INTERLEAVED_MODES`` and ``MODES``; checked by a test).
TIMING_MODES = {"interleaved": ("auto", "cpu-thread", "cpu-wall", "event-gated", "event", "kernel"),
                "block": ("auto", "cpu-thread", "cpu-wall", "event", "graph", "kernel")}
#: Figures ``flyexplore export`` draws from a result file (see :func:`_cmd_export`).
EXPORT_FIGURES = ("speedup", "sweep", "roofline", "error")
#: ``explain`` exit codes by answer (documented in the module docstring and README).
EXIT_YES, EXIT_NO, EXIT_USAGE, EXIT_UNVERIFIED, EXIT_PIPE = 0, 1, 2, 3, 141


def _values_text(only: str | None = None) -> str:
    """The valid values of :func:`catalogue` as help text, one block per operator."""
    lines = ["operators, with their backends, dtypes (first: the default for --shapes on a GPU; "
             "fp32 on the CPU when the operator has it) and suites:"]
    for op, (bk, dt, su) in catalogue().items():
        if only and op != only:
            continue
        lines.append(f"  {op}")
        lines.append(f"    backends: {', '.join(bk)}")
        lines.append(f"    dtypes:   {', '.join(dt)}")
        lines.append(f"    suites:   {', '.join(su)}")
    return "\n".join(lines)


def _check_names(op: str | None, backends: str | None = None, dtypes: str | None = None,
                 suite: str | None = None, what: str = "operator") -> None:
    """Check names against :func:`catalogue` (no torch), with the library's messages. An
    operator given as ``module:attribute`` (an Operator outside the catalogue, see
    :mod:`flyexplore.run.engine`) is checked later, when it is imported."""
    if op is None or ":" in op:
        return
    cat = catalogue()
    if op not in cat:
        raise bad_choice(what, op, cat)
    bk, dt, su = cat[op]
    for b in (backends or "").split(","):
        if b.strip() and b.strip() not in bk:
            raise bad_choice(f"backend for {op}", b.strip(), bk)
    for d in (dtypes or "").split(","):
        if d.strip() and d.strip() not in dt:
            raise bad_choice(f"dtype for {op}", d.strip(), dt)
    if suite is not None and suite not in su:
        raise bad_choice(f"suite for {op}", suite, su)


def _gpu_visible() -> bool:
    """Whether this machine shows a GPU device node (NVIDIA or AMD KFD), without torch."""
    return Path("/dev/kfd").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def quiet_cpu_noise() -> None:
    """On a machine without a GPU, silence two harmless messages torch prints there: Inductor's
    ``W... cpp_extension.py ... No CUDA runtime is found, using CUDA_HOME=...`` (the CUDA wheel
    looks for a CUDA toolkit it does not need on the CPU) and the profiler's (Kineto)
    ``gpuGetDeviceCount failed with code 35`` (CUDA error 35, insufficient driver: there is no
    GPU driver to ask). Neither affects a CPU result. Sets ``KINETO_LOG_LEVEL=5`` unless the
    user set it, and the ``torch.utils.cpp_extension`` logger to errors only."""
    if _gpu_visible():
        return
    import logging

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message):  # one line, no usage dump
        raise UsageError(message)


def _cmd_env(a):
    from flyexplore.world.env import collect

    env = collect()
    print(json.dumps(env.to_dict(), indent=2, default=str) if a.json else env.to_text())


def _cmd_suites(a):
    from flyexplore.ops import get_op, list_ops

    ops = [a.op] if a.op else list_ops()
    for name in ops:
        op = get_op(name)
        for s in op.suites.values():
            dts = ",".join(sorted({d for _, d in s.pairs()}))
            print(f"{name:9s} {s.name:16s} {len(s.pairs()):3d} runs  {dts:14s} {s.description}  [{s.source}]")


def _timer_opts(a) -> dict:
    """Timer options from the sweep's flags, checked (:func:`flyexplore.run.validate.sweep_options`:
    --rep >= 1, --warmup >= 0, --rep-ms > 0, the mode against the device, --device, --seed)
    before any file is opened."""
    from flyexplore.run.validate import sweep_options

    t = {"mode": a.timing}
    if a.rep is not None:
        t["rep"] = a.rep
    if a.warmup is not None:
        t["warmup"] = a.warmup
    elif isinstance(a.rep, int) and a.rep >= 1:
        t["warmup"] = max(1, a.rep // 4)
    if a.rep_ms is not None:
        t["rep_ms"] = a.rep_ms
    if a.order == "interleaved":
        if a.ci_target is not None:
            t["target"] = a.ci_target
        if a.budget_s is not None:
            t["budget_s"] = a.budget_s
    elif a.ci_target is not None or a.budget_s is not None:
        raise UsageError("--ci-target and --budget-s apply to --order interleaved only")
    return sweep_options(t, a.device, a.seed, cli=True, order=a.order)


def _cmd_sweep(a):
    from flyexplore.run.sweep import run_sweep
    from flyexplore.views.report import scan_table, summary_table

    if a.resume and a.overwrite:
        raise UsageError("--resume and --overwrite exclude each other (continue the file, or replace it)")
    for name, v in (("--ci-target", a.ci_target), ("--band", a.band)):
        if v is not None and not 0 < v < 0.5:
            raise UsageError(f"{name} must be a fraction in (0, 0.5), e.g. 0.01 for ±1%, got {v!r}")
    timer = _timer_opts(a)
    if a.in_process and a.executor == "ray":
        raise UsageError("--in-process and --executor ray exclude each other")
    if a.ray_address and a.executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    engine = "in-process" if a.in_process else ("ray" if a.executor == "ray" else
                                                ("local" if a.executor == "local" else "auto"))
    try:
        df = run_sweep(a.op, suite=a.suite, shapes=a.shapes, dtypes=a.dtypes, backends=a.backends,
                       out=a.out, resume=a.resume, overwrite=a.overwrite, device=a.device,
                       seed=a.seed, timer=timer, progress=not a.quiet, trace=a.trace,
                       order=a.order, band=a.band if a.band is not None else 0.01,
                       baseline=a.baseline, engine=engine, devices=a.devices, workers=a.workers,
                       case_timeout=a.case_timeout, max_cases_per_worker=a.max_cases_per_worker,
                       retry_failed=a.retry_failed, ray_address=a.ray_address)
    except KeyboardInterrupt:
        print(f"flyexplore: interrupted; finished rows kept in {a.out}; "
              "to continue, re-run the same command with --resume", file=sys.stderr)
        sys.exit(130)
    table, caption, notes = scan_table(summary_table(df))
    print(table.to_string(index=False))
    if caption:
        print("all rows: " + "; ".join(caption) + "; times in µs")
    for n in notes:
        print(n)
    print(f"{len(df)} rows written to {a.out}")


def _parse_opts(items) -> dict:
    """``--opt`` values (each ``key=value`` pairs separated by ``;``) -> one dict, by
    :func:`flyexplore.parsing.parse_options` (later values win)."""
    from flyexplore.parsing import parse_options

    out = {}
    for it in items or ():
        out.update(parse_options(it))
    return out


def _cmd_explain(a):
    from flyexplore.insight import explain as X
    from flyexplore.ops import get_op

    path = get_op(a.op).flydsl if a.op in explain_ops() else None
    if path is not None and path.route == "aotriton":
        ex = X.explain_text(a.op, a.shape, a.dtype, _parse_opts(a.opt), arch=a.arch, aotriton=a.aotriton,
                            assume_rocm=a.assume_rocm)
        print(ex.to_json() if a.json else ex.to_text())
        return {"eligible": EXIT_YES, "not eligible": EXIT_NO}.get(ex.verdict, EXIT_UNVERIFIED)
    if a.aotriton is not None:
        raise UsageError(f"--aotriton is for --op attention only (AOTriton operators), not {a.op!r}")
    if path is None:
        raise bad_choice("operator for explain", a.op, explain_ops())
    comp = None
    if path.route == "compile":
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

            from flyexplore.world.switches import compile_options
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
    return EXIT_YES if ex.taken else EXIT_NO


def _cmd_trace(a):
    from flyexplore.insight.case_trace import trace_case

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
    from flyexplore.world import switches

    if a.json:
        print(json.dumps(switches.table().to_dict(orient="records"), indent=2, default=str))
    else:
        print(switches.text())


def _cmd_demo(a):
    from flyexplore.cli.demo import run_demo

    _static_note(a.no_images)
    path = run_demo(a.out, progress=not a.quiet, static=not a.no_images)
    print(f"report: {path}")


def _baseline(text: str):
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"empty --baseline {text!r} (e.g. aten, or aten,triton for the faster of both)")
    return parts[0] if len(parts) == 1 else parts


def _cmd_published(a):
    import pandas as pd

    from flyexplore.results import published as P
    from flyexplore.results import table as R

    names = [n.strip() for n in (a.suite or "").split(",") if n.strip()] or None
    for n in names or ():
        if n not in P.SUITE_NAMES:
            from flyexplore.errors import bad_choice
            raise bad_choice("published suite", n, P.SUITE_NAMES)
    special = [n for n in names or () if n in ("vllm", "ranges")]
    if special and len(names) > 1:
        raise UsageError(f"--suite {special[0]} is not per-kernel rows; ask for it alone "
                         f"(kernel suites: {', '.join(P.SUITES)})")
    pd.set_option("display.width", 200)
    if special == ["ranges"]:
        df = P.ranges()
    elif special == ["vllm"]:
        df = P.vllm_published()
    else:
        df = P.load(names)
    if a.out:
        from pathlib import Path

        out = Path(a.out)
        if special:
            from flyexplore.views.export import TABLE_FORMATS, save_table
            if out.suffix.lstrip(".") not in TABLE_FORMATS:
                raise UsageError(f"unknown table file extension {out.suffix!r} in {a.out!r} "
                                 f"(valid: {', '.join('.' + f for f in TABLE_FORMATS)})")
            save_table(df, out)
        else:
            R.save(df, out)
        print(f"{len(df)} rows written to {a.out}")
        return
    if special:
        print(df.drop(columns=[c for c in ("provenance",) if c in df]).to_string(index=False))
        return
    print(P.summary(df).to_string(index=False))
    if names is None:
        print("\nHeadline numbers recomputed from the per-case rows (flyexplore.results.table.speedup/geomean):")
        h = P.headlines(df)
        h["value"] = h["value"].map(lambda v: f"{v:.4f}")
        print(h.to_string(index=False))
        print("\nPublic only as ranges (no per-case values):")
        print(P.ranges()[["what", "subject", "low", "high"]].to_string(index=False))
    print("\nAll rows: status=published, source=published, device AMD Instinct MI355X (gfx950); "
          "not measured by flyexplore. Write them with --out FILE (.parquet, .csv, .jsonl).")


def _static_note(no_images: bool) -> None:
    """Say on stderr when static figure files will be skipped (the report says it too)."""
    if not no_images:
        from flyexplore.views.export import static_export_problem

        why = static_export_problem()
        if why:
            print(f"flyexplore: note: PNG/SVG/PDF figures skipped: {why}", file=sys.stderr)


def _load_many(paths):
    from flyexplore.results import table as R

    return R.concat([R.load(p) for p in paths])


def _inputs_in(paths, folder) -> list[str]:
    """Names of the input files that lie directly in ``folder`` (kept beside a report there)."""
    from pathlib import Path

    f = Path(folder).resolve()
    return [Path(p).name for p in paths if Path(p).resolve().parent == f]


def _cmd_report(a):
    from flyexplore.views.report import write_report

    df = _load_many(a.results)
    _static_note(a.no_images)
    path = write_report(df, a.out, title=a.title or f"flyexplore report: {', '.join(a.results)}",
                        baseline=_baseline(a.baseline), static=not a.no_images, published=a.with_published,
                        keep=_inputs_in(a.results, a.out))
    print(f"report: {path}")


def _cmd_compare(a):
    from flyexplore.results.vllm import looks_like_vllm
    from flyexplore.views.report import write_compare_report, write_vllm_report

    names = tuple(n.strip() for n in a.names.split(",")) if a.names else ("A", "B")
    if len(names) != 2 or not all(names):
        raise UsageError(f"--names needs two comma-separated names, got {a.names!r}")
    va, vb = looks_like_vllm(a.a), looks_like_vllm(a.b)
    _static_note(a.no_images)
    if va != vb:
        raise UsageError(f"cannot compare a vllm bench result with a flyexplore result file ({a.a!r}, {a.b!r})")
    if va:
        path = write_vllm_report(a.a, a.b, a.out, names, title=a.title, static=not a.no_images)
    else:
        from flyexplore.results import table as R
        path = write_compare_report(R.load(a.a), R.load(a.b), a.out, names, a.a_backend, a.b_backend,
                                    title=a.title, static=not a.no_images)
    print(f"report: {path}")


def _cmd_xray(a):
    from flyexplore.errors import bad_choice
    from flyexplore.insight.xray import (
        XRAY_DTYPES,
        XRayUnavailable,
        coverage_text,
        resources_figure,
        xray_batch,
        xray_frame,
        xray_shapes,
    )

    if a.coverage:
        print(coverage_text())
        return
    if not a.op or not a.shape:
        raise UsageError("xray needs --op and --shape (or --coverage)")
    if a.op not in XRAY_DTYPES:
        raise bad_choice("operator for xray", a.op, XRAY_DTYPES)
    shapes = xray_shapes(a.op, a.shape)
    dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
    try:
        res = xray_batch([(a.op, s, d) for s in shapes for d in dtypes], arch=a.arch, out=a.out,
                         autotune=a.autotune, keep_ir=a.keep_ir)
    except XRayUnavailable as exc:
        print(f"flyexplore: {exc}", file=sys.stderr)
        sys.exit(1)
    if a.json:
        print(json.dumps([x.to_dict() for x in res], indent=2, default=str))
    else:
        print("\n\n".join(x.to_text() for x in res))
    if a.figure:
        fig = resources_figure(xray_frame(res))
        if a.figure.endswith(".html"):
            fig.write_html(a.figure)
        else:
            fig.write_image(a.figure)
        if not a.json:
            print(f"figure: {a.figure}")


def _cmd_export(a):
    formats = ("png", "svg", "pdf", "html")  # flyexplore.views.export.FIGURE_FORMATS, checked before any import
    if Path(a.out).suffix.lstrip(".").lower() not in formats:
        raise UsageError(f"unknown figure file extension {Path(a.out).suffix!r} in {a.out!r} "
                         f"(valid: {', '.join('.' + f for f in formats)})")
    for f in a.results:
        if not Path(f).is_file():
            raise UsageError(f"result file not found: {f!r}")
    from flyexplore.views import plots as F
    from flyexplore.views.export import export_figure

    df = _load_many(a.results)
    for col, v in (("op", a.op), ("dtype", a.dtype)):
        if v is not None:
            if v not in set(df[col].dropna()):
                raise bad_choice(f"{col} in {', '.join(a.results)}", v, sorted(set(df[col].dropna())))
            df = df[df[col] == v]
    if a.figure == "speedup":
        fig = F.speedup_figure(df, _baseline(a.baseline), title=a.title)
    elif a.figure == "sweep":
        from flyexplore.views.report import _sweep_candidates

        x = a.x or next(iter(_sweep_candidates(df)), None)
        if x is None:
            raise UsageError("no case parameter takes three or more values here; give --x")
        fig = F.sweep_figure(df, x=x, y=a.y, title=a.title)
    elif a.figure == "roofline":
        fig = F.roofline_figure(df, kind="measured", title=a.title)
    else:
        fig = F.error_figure(df, title=a.title)
    if a.timeout is not None and not a.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {a.timeout!r}")
    kw = {"timeout": a.timeout} if a.timeout is not None else {}
    path, note = export_figure(fig, a.out, width=a.width, height=a.height, **kw)
    if note:
        print(f"flyexplore: note: {note}", file=sys.stderr)
    print(f"figure: {path}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flyexplore", description="Measure and explain PyTorch's FlyDSL, ATen, "
                "Triton and vendor paths (MI350 gfx950, any CUDA/ROCm GPU, or CPU).",
                epilog="flyexplore COMMAND --help lists a command's valid values (sweep --help: operators, "
                "backends, dtypes, suites, timing modes).\nexit codes: 0 ok (explain: FlyDSL YES), 1 explain: NO, "
                "2 usage error, 3 explain --op attention: unverified, 130 interrupted, 141 output pipe closed.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    e = sub.add_parser("env", help="environment report and FlyDSL readiness")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_cmd_env)

    s = sub.add_parser("suites", help="list the named shape suites")
    s.add_argument("--op", help="only this operator: " + ", ".join(catalogue()))
    s.set_defaults(func=_cmd_suites)

    w = sub.add_parser("sweep", help="run a sweep; rows are kept as they finish",
                       epilog=_values_text() + "\n\ntiming modes: interleaved order: "
                       + ", ".join(TIMING_MODES["interleaved"]) + "; block order: " + ", ".join(TIMING_MODES["block"])
                       + "\n\nexamples:\n  flyexplore sweep --op gemm --suite cpu-small --out r.parquet\n"
                       "  flyexplore sweep --op rmsnorm --shapes '2048x4096;8192x4096' --backends aten,inductor "
                       "--out r.csv")
    w.add_argument("--op", required=True, help="operator: " + ", ".join(catalogue()))
    g = w.add_mutually_exclusive_group(required=True)
    g.add_argument("--suite", help="a named shape set of the operator (below; flyexplore suites)")
    g.add_argument("--shapes", help="inline shapes, e.g. '4096x4096x4096;8x4096x4096:NN'")
    w.add_argument("--dtypes", help="comma-separated, e.g. bf16,fp16 (default: the suite's; with --shapes "
                   "the operator's first dtype on a GPU, fp32 on the CPU)")
    w.add_argument("--backends", help="comma-separated (default: all of the operator's; below)")
    w.add_argument("--out", required=True, help="result file: .parquet, .csv or .jsonl")
    w.add_argument("--resume", action="store_true", help="skip cases already in --out")
    w.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    w.add_argument("--device", help="torch device (default: cuda:0 if present, else cpu)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--order", default="interleaved", choices=("interleaved", "block"),
                   help="interleaved (default): every backend of a case built and warmed, then timed in "
                   "shared rounds until the 95%% intervals are tight; block: one backend after the other "
                   "(the old order; wider, unpaired intervals)")
    w.add_argument("--timing", default="auto",
                   help="interleaved: auto | cpu-thread | cpu-wall | event-gated | event | kernel; "
                   "block: auto | cpu-thread | cpu-wall | event | graph | kernel (default auto: "
                   "cpu-thread on CPU, event-gated (interleaved) or kernel (block) on GPU)")
    w.add_argument("--ci-target", type=float, help="stop a case when every 95%% interval (medians, "
                   "speedups) is within ±this fraction (default 0.01)")
    w.add_argument("--band", type=float, help="equivalence band of the SAME label (default 0.01 = ±1%%)")
    w.add_argument("--budget-s", type=float, help="time budget of one case after warm-up, s "
                   "(default 10 on GPU, 2 on CPU); past it the row is flagged unconverged")
    w.add_argument("--baseline", help="backend speedups are taken against (default: the operator's, "
                   "e.g. aten)")
    w.add_argument("--rep", type=int, help="interleaved: a fixed number of rounds; block: timed calls "
                   "(default: adaptive / by time budget)")
    w.add_argument("--warmup", type=int, help="warm-up rounds (interleaved) or calls (block), with --rep")
    w.add_argument("--rep-ms", type=float, help="interleaved: the case budget, ms; block: time budget "
                   "for timed calls, ms")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.add_argument("--trace", action="store_true",
                   help="record what really ran for every row (observed, autotune; flydsl rows always)")
    w.add_argument("--in-process", action="store_true",
                   help="run every case in this process (for debugging; the default on the CPU). On a GPU "
                   "the default is worker processes: a crash or hang becomes a crashed/timeout row")
    w.add_argument("--executor", choices=("local", "ray"),
                   help="local (default): worker processes on this machine; ray: Ray actors, num_gpus=1 "
                   "each (pip install 'flyexplore[ray]')")
    w.add_argument("--devices", help="all, or GPU indices such as 0,1: one worker per GPU, pinned with "
                   "CUDA_VISIBLE_DEVICES (NVIDIA) or HIP_VISIBLE_DEVICES (ROCm); cases handed out most "
                   "expensive first")
    w.add_argument("--workers", type=int, help="CPU: this many worker processes (sharding on the CPU); "
                   "ray: at most this many actors")
    w.add_argument("--case-timeout", type=float, metavar="SECONDS",
                   help="a case (compile included) running longer gets timeout rows and its worker is "
                   "killed and replaced (default 900; 0 = none)")
    w.add_argument("--max-cases-per-worker", type=int, metavar="N",
                   help="replace a worker after N cases, against leaks (default 50)")
    w.add_argument("--retry-failed", action="store_true",
                   help="with --resume: run crashed and timeout rows again (default: keep them)")
    w.add_argument("--ray-address", help="Ray cluster to join, e.g. ray://head:10001 (default: "
                   "$RAY_ADDRESS, else a local Ray instance for this sweep)")
    w.set_defaults(func=_cmd_sweep)

    x = sub.add_parser("explain", help="would a call take FlyDSL, and if not, why not",
                       epilog="exit codes: 0 FlyDSL YES (attention: eligible), 1 NO (not eligible), "
                       "2 usage error, 3 attention: unverified here\n\nexample:\n  flyexplore explain --op gemm "
                       "--shape 16x28672x4096:NT --dtype bf16 --assume-rocm --arch gfx950 && echo taken")
    x.add_argument("--op", required=True, help="rmsnorm, topk, gemm, grouped_gemm, scaled_gemm, attention")
    x.add_argument("--shape", required=True,
                   help="catalogue shape text: 8192x4096 (rmsnorm), 4096x2048x8 (topk), 16x28672x4096:NT "
                        "(gemm), g8x512x4096x4096 (grouped_gemm, M per group), 32x4096x4096 (scaled_gemm), "
                        "1x32x4096x4096x128:causal=1,bwd (attention, BxHxSQxSKVxD)")
    x.add_argument("--dtype", help="bf16, fp16, fp32; mxfp8/mxfp4 for scaled_gemm (default: the operator's first)")
    x.add_argument("--opt", action="append", metavar="KEY=VALUE",
                   help="more of the call: strides, offsets, bias, out_dtype, dim, ...; attention: backend, "
                        "fa_library, device (repeatable)")
    x.add_argument("--arch", help="take this as the device's gcnArchName (e.g. gfx950)")
    x.add_argument("--cu", type=int, help="CU count for TopK's row gate (default: the device's, else 256)")
    x.add_argument("--assume-rocm", action="store_true",
                   help="judge as on a ROCm torch 2.15 with flydsl 0.3.x (what-if on another machine)")
    x.add_argument("--compile-options", help="JSON torch.compile options for GEMMs, or 'current' for this "
                   "process's Inductor config (default: FLYDSL added, max-autotune)")
    x.add_argument("--aotriton", help="attention: judge with this AOTriton version (e.g. 0.14.2, 0.13b); "
                   "default: the bundled one (what-ifs: 0.14.2, torch main's pin)")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=_cmd_explain)

    t = sub.add_parser("trace", help="run one case and show the kernels that really ran")
    t.add_argument("--op", required=True, help="operator: " + ", ".join(catalogue()))
    t.add_argument("--shape", required=True, help="one case, e.g. 64x64x64 (gemm), 8192x4096 (rmsnorm)")
    t.add_argument("--backend", required=True, help="one of the operator's backends (sweep --help lists them)")
    t.add_argument("--dtype", help="one of the operator's dtypes (default: its first)")
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
    d.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files (faster)")
    d.set_defaults(func=_cmd_demo)

    x = sub.add_parser("xray", help="compile the FlyDSL kernel torch would run on gfx950 (no GPU needed) "
                       "and show its registers, LDS, occupancy and ISA")
    x.add_argument("--op", help="rmsnorm, topk, gemm or grouped_gemm")
    x.add_argument("--shape", help="e.g. 8192x4096 (rmsnorm), 4096x4096x8 (topk), 4096x4096x4096:NT "
                   "(gemm), 8x512x4096x4096 (grouped_gemm G x M x N x K); several with ';'")
    x.add_argument("--dtype", default="bf16", help="bf16, fp16, fp32 (gemm also mxfp8, mxfp4); "
                   "comma-separated for several")
    x.add_argument("--arch", default="gfx950", help="target arch (torch 2.15 runs FlyDSL on gfx950 only)")
    x.add_argument("--out", default="flyexplore-xray", help="folder for the ISA and xray.json "
                   "(default: flyexplore-xray)")
    x.add_argument("--json", action="store_true")
    x.add_argument("--autotune", action="store_true", help="GEMMs: every FlyDSL autotuning candidate, "
                   "not just the baseline config")
    x.add_argument("--keep-ir", action="store_true", help="also keep every IR stage flydsl dumped")
    x.add_argument("--figure", help="write the resources figure (.html, or .png/.svg/.pdf via kaleido)")
    x.add_argument("--coverage", action="store_true", help="list what the X-ray covers and what not")
    x.set_defaults(func=_cmd_xray)

    pb = sub.add_parser("published", help="the published MI355X figures as result rows, with the "
                        "headline numbers recomputed")
    pb.add_argument("--suite", help="comma-separated: dense, mxfp, grouped, rmsnorm, topk; or vllm, or "
                    "ranges alone (default: all kernel suites)")
    pb.add_argument("--out", help="write the rows: .parquet, .csv or .jsonl (vllm/ranges: .csv, .md, .tex, .html)")
    pb.set_defaults(func=_cmd_published)

    r = sub.add_parser("report", help="one HTML report (environment, tables, figures) plus static images")
    r.add_argument("results", nargs="+", help="result files (.parquet, .csv, .jsonl)")
    r.add_argument("--out", required=True, help="output folder")
    r.add_argument("--baseline", default="aten", help="backend for speedups, or several comma-separated "
                   "(the faster of them per case); default aten")
    r.add_argument("--with-published", action="store_true", help="add measured vs published (MI355X) figures")
    r.add_argument("--title")
    r.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")
    r.set_defaults(func=_cmd_report)

    c = sub.add_parser("compare", help="A/B report of two result files paired by case (or two "
                       "vllm bench serve --save-result files/folders)")
    c.add_argument("a", help="side A (baseline): result file, or vllm JSON file/folder")
    c.add_argument("b", help="side B: result file, or vllm JSON file/folder")
    c.add_argument("--out", required=True, help="output folder")
    c.add_argument("--names", help="display names of A and B, comma-separated (default A,B)")
    c.add_argument("--a-backend", help="compare this backend of A ...")
    c.add_argument("--b-backend", help="... with this backend of B (e.g. aten vs flydsl of one sweep)")
    c.add_argument("--title")
    c.add_argument("--no-images", action="store_true", help="skip the PNG/SVG/PDF figure files")
    c.set_defaults(func=_cmd_compare)

    ex = sub.add_parser("export", help="one figure from result files, as .png/.svg/.pdf (kaleido) or .html",
                        epilog="figures: speedup (bars per case against --baseline, 95%% whiskers), sweep "
                        "(--y across case parameter --x, one line per backend), roofline (needs a known device), "
                        "error (err_rel per case).\nWithout a browser for kaleido a .png/.svg/.pdf request writes "
                        ".html instead and says so.\n\nexample:\n  flyexplore export flyexplore-demo/results.parquet "
                        "--figure speedup --op gemm --out gemm.png")
    ex.add_argument("results", nargs="+", help="result files (.parquet, .csv, .jsonl)")
    ex.add_argument("--figure", default="speedup", choices=EXPORT_FIGURES,
                    help="which figure: " + ", ".join(EXPORT_FIGURES) + " (default speedup)")
    ex.add_argument("--out", required=True, help="figure file: .png, .svg, .pdf or .html")
    ex.add_argument("--op", help="only this operator's rows")
    ex.add_argument("--dtype", help="only this dtype's rows")
    ex.add_argument("--baseline", default="aten", help="speedup: backend, or several comma-separated "
                    "(the faster per case); default aten")
    ex.add_argument("--x", help="sweep: case parameter on the x axis (default: the first with 3+ values)")
    ex.add_argument("--y", default="time_ms", choices=("time_ms", "tflops", "gbps"), help="sweep: the value "
                    "(default time_ms)")
    ex.add_argument("--title")
    ex.add_argument("--width", type=int, default=1100, help="CSS pixels (default 1100)")
    ex.add_argument("--height", type=int, help="CSS pixels (default: the figure's)")
    ex.add_argument("--timeout", type=float, help="time limit for the image, s (kaleido's; default 60); "
                    "past it the figure is written as .html")
    ex.set_defaults(func=_cmd_export)
    return p


def _precheck(a) -> None:
    """Name checks that need no torch (:func:`catalogue`), before a command imports anything
    heavy; and the CPU's default dtype for ``sweep --shapes`` (fp32: bf16 is emulated slowly
    on most CPUs and rarely what a CPU user means)."""
    cmd = a.command
    if cmd == "sweep":
        _check_names(a.op, a.backends, a.dtypes, a.suite)
        modes = TIMING_MODES.get(a.order, ())
        if a.timing not in modes:
            raise bad_choice("timing mode", a.timing, modes)
        on_cpu = (a.device or "").startswith("cpu") or (a.device is None and not _gpu_visible())
        if a.shapes and not a.dtypes and on_cpu and "fp32" in catalogue().get(a.op, ((), ()))[1]:
            a.dtypes = "fp32"
    elif cmd in ("trace",):
        _check_names(a.op, a.backend, a.dtype)
    elif cmd == "suites":
        _check_names(a.op)
    elif cmd == "explain" and a.op not in explain_ops():
        raise bad_choice("operator for explain", a.op, explain_ops())


def _pipe_closed() -> None:
    """The reader of stdout went away (``| head``): send what is left to /dev/null so that
    Python's exit flush raises nothing (the recipe in Python's ``signal`` documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flyexplore`` console script. Returns the exit code."""
    try:
        a = build_parser().parse_args(argv)
        _precheck(a)
        quiet_cpu_noise()
        rc = a.func(a)
        sys.stdout.flush()
    except UsageError as exc:
        print(f"flyexplore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        _pipe_closed()
        return EXIT_PIPE
    except KeyboardInterrupt:   # sweep says more itself (which rows were kept)
        print("flyexplore: interrupted", file=sys.stderr)
        return 130
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
