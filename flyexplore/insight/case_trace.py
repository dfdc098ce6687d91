"""One catalogue case traced (what ``flyexplore trace`` runs: :func:`trace_case`,
:func:`backend_status`, :func:`trace_autotune`) and the "what ran" columns a sweep row gets from
its trace (:func:`trace_columns`: ``observed``, ``autotune``, ``flydsl_taken``,
``flydsl_reason``; the FlyDSL verdict is the explainer's, :func:`flyexplore.insight.explain.explain_case`).
"""
from __future__ import annotations

import json
from typing import Any

from flyexplore.errors import UsageError
from flyexplore.insight.autotune import autotune_dict
from flyexplore.insight.explain import explain_case
from flyexplore.insight.trace import Trace, trace
from flyexplore.measure.devstate import default_device
from flyexplore.ops import get_op
from flyexplore.ops.base import RunContext, reset_dynamo, torch_dtype
from flyexplore.world import env as ENV
from flyexplore.world.switches import compile_options

# -- sweep rows ----------------------------------------------------------------------------

def flydsl_compile_options(op: str) -> dict:
    """The ``torch.compile`` options the catalogue's ``flydsl`` backend of ``op`` uses: the
    ``FLYDSL_OPTIONS`` of the module defining that backend (found through the registry,
    :func:`flyexplore.ops.get_op`) if it has one, else
    :func:`flyexplore.world.switches.compile_options`."""
    import sys


    try:
        bk = get_op(op).backends.get("flydsl")
    except UsageError:
        bk = None
    mod = sys.modules.get(getattr(bk.build, "__module__", "")) if bk is not None else None
    opts = getattr(mod, "FLYDSL_OPTIONS", None)
    if isinstance(opts, dict):
        return dict(opts)
    return compile_options(True)


def _path(op: str):
    """The registered :class:`~flyexplore.ops.base.FlyDSLPath` of ``op``, or None for an
    operator without one or outside the catalogue."""

    try:
        return get_op(op).flydsl
    except UsageError:
        return None


def trace_columns(tr: Trace, backend: str, op: str, case, dtype: str,
                compile_options: dict | None = None) -> dict:
    """The result columns a traced sweep row gets: ``observed``, ``autotune`` (JSON) and, for
    a ``flydsl`` request, ``flydsl_taken`` and ``flydsl_reason`` (what ran, and on a miss the
    explainer's reason or the autotune decision that picked another backend). A family whose
    FlyDSL path reads its own rows (``op.flydsl.trace_columns``; attention, whatever SDPA
    backend the row asked for: AOTriton's FlyDSL ("flyc") kernels count as FlyDSL taken,
    :func:`flyexplore.ops.attention.aotriton.aotriton_trace_columns`) fills these columns itself."""
    cols: dict[str, Any] = {"observed": tr.observed}
    if tr.autotune:
        cols["autotune"] = json.dumps([autotune_dict(d) for d in tr.autotune])
    path = _path(op)
    if path is not None and path.trace_columns is not None:  # e.g. attention: what AOTriton ran
        cols.update(path.trace_columns(tr, case, dtype))
        return cols
    if backend != "flydsl":
        return cols
    taken = tr.flydsl_taken
    cols["flydsl_taken"] = taken
    if taken:
        names = sorted({k.name for k in tr.kernels if k.family == "FlyDSL"})
        cols["flydsl_reason"] = "taken: FlyDSL kernels " + ", ".join(names)[:300]
        return cols
    if taken is None:
        won = [d for d in tr.autotune if d.winner_family == "FlyDSL"]
        if not tr.kernels:
            why = "the profiler recorded no device kernel for the call"
        else:
            why = ("no kernel named like a FlyDSL kernel, but some kernels are unclassified: "
                   + ", ".join(tr.unclassified)[:400])
        if won:
            why += "; the autotune picked FlyDSL (" + "; ".join(d.summary() for d in won) + ")"
        cols["flydsl_reason"] = "unknown: " + why
        return cols
    reason = None
    if compile_options is None:
        compile_options = flydsl_compile_options(op)
    lost = [d for d in tr.autotune if d.best_of("FlyDSL") is not None and d.winner_family != "FlyDSL"]
    if lost:
        reason = "not taken: FlyDSL was a candidate but lost the autotune -- " + "; ".join(d.summary() for d in lost)
    else:
        try:
            ex = explain_case(op, case, dtype, compile_options=compile_options)
        except Exception as exc:  # the explainer must never break a sweep
            ex = None
            reason = f"not taken (explainer failed: {type(exc).__name__}: {exc})"
        if ex is not None:
            reason = (ex.reason if not ex.taken else
                      "not taken although the explainer finds the call eligible; no autotune decision was "
                      "captured (a graph from Inductor's FX graph cache is not autotuned again), and for a "
                      "compiled GEMM another backend winning the autotune is the usual cause (observed: "
                      + tr.observed + ")")
            if ex.notes:  # e.g. a ragged grouped GEMM's groups, as `flyexplore explain` prints them
                reason += " (note: " + "; ".join(ex.notes) + ")"
        elif reason is None:
            reason = f"not taken (observed: {tr.observed}; no explainer for {op})"
    cols["flydsl_reason"] = reason[:1000]
    return cols


def trace_case(op: str, shape: str, backend: str, dtype: str | None = None, device=None,
               reps: int = 3, seed: int = 0) -> dict:
    """Trace one catalogue case (what ``flyexplore trace`` runs): build the inputs, enter the
    backend's context, run it under :func:`trace`. Returns a dict with ``status`` (``ok`` or
    ``unavailable``), ``message``, ``trace`` (a :class:`Trace` or ``None``) and, for the
    ``flydsl`` backend, ``flydsl_taken`` / ``flydsl_reason``. Raises
    :class:`~flyexplore.errors.UsageError` for an unknown operator, backend, dtype or a bad
    shape."""
    import torch


    o = get_op(op)
    case = o.case(shape)
    dt = o.check_dtype(dtype or o.dtypes[0])
    bk = o.get_backend(backend)
    dev = torch.device(device) if device is not None else default_device()
    ctx = RunContext(dev, ENV.collect())
    out: dict[str, Any] = {"op": op, "case": case.label, "dtype": dt, "backend": backend, "device": str(dev)}
    why = bk.available(ctx, case, dt)
    if why:
        return {**out, "status": "unavailable", "message": why, "trace": None}
    reset_dynamo()
    with bk.context(ctx, case):
        inputs = o.make_inputs(case, dt, dev, seed)
        fn = bk.build(case, dt, inputs, ctx)
        tr = trace(fn, device=dev, reps=reps, warmup=1)
    out.update(status="ok", message=None, trace=tr)
    if backend == "flydsl":
        cols = trace_columns(tr, backend, op, case, dt)
        out.update(flydsl_taken=cols.get("flydsl_taken"), flydsl_reason=cols.get("flydsl_reason"))
    return out


def backend_status(op: str, shape: str, dtype: str | None = None, device=None) -> dict[str, str | None]:
    """Which of ``op``'s catalogue backends can run ``shape`` in ``dtype`` on ``device``
    (default: the first GPU, else the CPU): backend name -> ``None`` (can run) or the reason it
    cannot (what :func:`trace_case` would report as ``unavailable``). Raises
    :class:`~flyexplore.errors.UsageError` for an unknown operator, dtype or a bad shape."""
    import torch


    o = get_op(op)
    case = o.case(shape)
    dt = o.check_dtype(dtype or o.dtypes[0])
    ctx = RunContext(torch.device(device) if device is not None else default_device(), ENV.collect())
    return {name: b.available(ctx, case, dt) for name, b in o.backends.items()}


#: Default autotune case per device type: (shape MxNxK, dtype).
AUTOTUNE_CASES = {"cpu": ("32x16x48", "fp32"), "cuda": ("4096x4096x4096", "bf16")}


def trace_autotune(shape: str | None = None, dtype: str | None = None, device=None,
                   backends: str | None = None, reps: int = 3) -> Trace:
    """Compile one GEMM with max-autotune (Inductor's FX graph and autotune caches off, so the
    autotune really runs), trace it and return the :class:`Trace`: the autotune decision (every
    candidate, its time, the winner: :meth:`Trace.autotune_frame`) and what then ran.

    On a GPU: ``torch.mm`` of A [M, K] and B [K, N] (``shape`` ``MxNxK``, default 4096^3 bf16),
    ``max_autotune_gemm_backends`` = ``backends`` or ``ATEN,TRITON``, plus ``FLYDSL`` where
    :func:`flyexplore.world.env.collect` finds the FlyDSL compile templates ready (ROCm torch 2.15 on
    gfx950), so "FlyDSL enabled but Triton won" shows. On a CPU: ``torch.bmm`` over a batch of 2
    (default 32x16x48 fp32) with ``ATEN,CPP``: Inductor's CPU max-autotune benchmarks ATen
    against its C++ GEMM template for it (the case ``tests/insight/test_trace.py`` uses; a plain CPU mm
    was not autotuned in torch 2.15). The options used are valid in torch 2.11 and 2.15.
    Compiling takes seconds on a CPU and tens of seconds on a GPU (Triton autotuning).
    Raises :class:`~flyexplore.errors.UsageError` for a malformed shape or unknown dtype."""
    import torch


    dev = torch.device(device) if device is not None else default_device()
    kind = "cuda" if dev.type == "cuda" else "cpu"
    d_shape, d_dtype = AUTOTUNE_CASES[kind]
    p = get_op("gemm").case(shape or d_shape).p
    dt = torch_dtype(dtype or d_dtype)
    if backends is None:
        backends = "ATEN,CPP" if kind == "cpu" else "ATEN,TRITON"
        if kind == "cuda" and ENV.collect().flydsl_compile.ready:
            backends += ",FLYDSL"
    opts = {"max_autotune": True, "max_autotune_gemm_backends": backends, "fx_graph_cache": False,
            "autotune_local_cache": False}
    if kind == "cuda":
        opts["triton.cudagraphs"] = False
    m, n, k = p["m"], p["n"], p["k"]
    g = torch.Generator(device="cpu").manual_seed(0)
    torch._dynamo.reset()
    if kind == "cpu":
        a = torch.randn(2, m, k, generator=g, dtype=torch.float32).to(dt)
        b = torch.randn(2, k, n, generator=g, dtype=torch.float32).to(dt)
        f = torch.compile(torch.bmm, dynamic=False, options=opts)
    else:
        a = torch.randn(m, k, generator=g, dtype=torch.float32).to(dev, dt)
        b = torch.randn(k, n, generator=g, dtype=torch.float32).to(dev, dt)
        f = torch.compile(torch.mm, dynamic=False, options=opts)
    tr = trace(lambda: f(a, b), device=dev, reps=reps, warmup=1)
    what = (f"torch.{'bmm' if kind == 'cpu' else 'mm'} {'2x' if kind == 'cpu' else ''}{m}x{k} @ "
            f"{'2x' if kind == 'cpu' else ''}{k}x{n} {dtype or d_dtype}, max-autotune over {backends}")
    return Trace(tr.kernels, tr.cpu_ops, tr.autotune, tr.device, (what,) + tr.notes)


def result_text(r: dict) -> str:
    """A :func:`trace_case` result as text (what ``flyexplore trace`` prints): the case, the
    status and, when it ran, the :meth:`Trace.to_text` and the FlyDSL verdict."""
    lines = [f"{r['op']} {r['case']} {r['dtype']} backend {r['backend']} on {r['device']}: {r['status']}"]
    if r.get("message"):
        lines.append(str(r["message"]))
    if r.get("trace") is not None:
        lines.append(r["trace"].to_text())
    if r.get("flydsl_reason"):
        lines.append(f"FlyDSL: {r['flydsl_reason']}")
    return "\n".join(lines)
