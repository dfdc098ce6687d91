"""One backend of one case built, called once, checked, rechecked and traced: the steps of a sweep
row that need the device but not the result table, so that a sweep's case
(:mod:`flyexplore.run.cases`) and an environment A/B's worker process (:mod:`flyexplore.run.envworker`,
which imports only what measuring needs: torch and numpy, never pandas) share them.

Also here, for the environment A/B: a digest of a case's inputs (:func:`inputs_digest`) and the
difference between two environments' outputs of one case (:func:`output_difference`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import traceback
from typing import Any

from flyexplore.insight.autotune import capture_autotune
from flyexplore.insight.case_trace import trace_columns
from flyexplore.insight.trace import Trace, from_kernels
from flyexplore.insight.trace import trace as run_trace
from flyexplore.ops.base import ERR_TOL, Case, Operator, RunContext


#: Texts of errors after which a GPU context cannot be trusted (CUDA/HIP errors are sticky; on
#: ROCm a deferred one surfaces in a later call, pytorch/pytorch#194498): the worker (a place) that saw
#: one in a row's message is replaced after that case.
STICKY_ERRORS = ("cuda error", "hip error", "hiperror", "illegal memory access",
                 "device-side assert", "unspecified launch failure", "memory access fault")

def sticky(text) -> bool:
    """Whether an error's text shows that the GPU context that raised it cannot be trusted
    (:data:`STICKY_ERRORS`)."""
    t = str(text or "").lower()
    return any(s in t for s in STICKY_ERRORS)


def first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``, at most 500 characters."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500]


#: Texts of out-of-memory errors: torch's CUDA/HIP allocator (``CUDA out of memory``), its CPU
#: allocator (torch 2.15: ``DefaultCPUAllocator: can't allocate memory: ... Error code 12 (Cannot
#: allocate memory)``; older: ``not enough memory``).
OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error: torch's CUDA/HIP ``OutOfMemoryError``, Python's
    ``MemoryError``, or a message with one of :data:`OOM_TEXTS` (the CPU allocator's failure)."""
    import torch
    msg = str(exc).lower()
    return isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)) or any(t in msg for t in OOM_TEXTS)


def build_first(op: Operator, case: Case, dtype: str, bk, ctx: RunContext, inputs: dict, ref,
                traced: bool, keep_output: bool = False):
    """Build a backend (inside its context, entered by the caller) and make its first call
    (compile, autotune): returns ``(fn, first_ms, error columns against ref and the operator's
    ``input_columns``, autotune decisions, output)``; the decisions are captured only when
    ``traced``; ``output`` is the first call's output when ``keep_output`` (an environment A/B
    compares it across environments), else None. ``first_ms``: wall time of the first call, ms.
    Its callers run it, as the timed calls, with the timing's intra-op threads on the CPU
    (:func:`flyexplore.measure.timing.cpu_threads`: :meth:`flyexplore.run.place.CaseHost.answer`,
    :func:`flyexplore.run.cases.measure_one`), so that the code compiled is the code timed."""
    import contextlib

    with (capture_autotune() if traced else contextlib.nullcontext([])) as decisions:
        fn = bk.build(case, dtype, inputs, ctx)
        t0 = time.perf_counter()
        outv = fn()
        if ctx.gpu:
            import torch
            torch.cuda.synchronize(ctx.device)
        first_ms = (time.perf_counter() - t0) * 1e3
    errs = op.error(outv, ref, case, dtype) if ref is not None else {}
    if getattr(op, "input_columns", None) is not None:   # columns the inputs decide (Operator.input_columns)
        errs = {**errs, **op.input_columns(case, dtype, inputs)}
    kept = outv if keep_output else None
    del outv
    return fn, first_ms, errs, tuple(decisions), kept


def traced(trace: bool, backend: str, op: Operator, ctx: RunContext) -> bool:
    """Whether a row records what really ran: on request, always for ``flydsl``, and on a GPU
    for an operator that asks for it (:attr:`~flyexplore.ops.base.Operator.trace_on_gpu`:
    attention, where which AOTriton backend ran is known from the kernels only)."""
    return trace or backend == "flydsl" or (op.trace_on_gpu and ctx.gpu)


def accuracy_ok(errs: dict):
    """The check's verdict in ``errs``: ``accuracy_ok`` when the operator gave it, else
    ``err_rel <= err_tol``, else None (nothing judged: the row says unchecked, never a pass)."""
    if "accuracy_ok" in errs:
        return errs["accuracy_ok"]
    if "err_rel" in errs and "err_tol" in errs:
        return errs["err_rel"] <= errs["err_tol"] + 1e-12
    return None


def ok_row(op: Operator, case: Case, dtype: str, backend: str, source: str, m, first_ms: float,
           errs: dict, trace_cols: dict | None) -> dict:
    """The measured columns of an ``ok`` row from a :class:`~flyexplore.measure.timing.Measurement`
    ``m``: its summary (times in ms), ``first_call_ms``, the error columns ``errs``, what ran
    (``trace_cols``: :func:`flyexplore.insight.case_trace.trace_columns`; None: not traced), the
    kernels, FLOPs, bytes, TFLOP/s and GB/s, ``accuracy_ok``. ``source``: the backend's
    (``measured``/``emulated``)."""
    row = {"status": "ok", "message": "; ".join(m.notes) or None, "source": source,
           "first_call_ms": first_ms, **m.summary(), **errs, "ci_method": "order-statistic"}
    if trace_cols is not None:
        row.update(trace_cols)
        if row.get("flydsl_taken") is False:
            note(row, f"FlyDSL requested but not taken; the time is of what ran ({trace_cols.get('observed')})")
    if m.kernels:
        row["kernels"] = json.dumps([[k.name, k.calls_per_iter, round(k.us_per_iter, 3)] for k in m.kernels])
    flops, nbytes = op.flops(case), op.bytes(case, dtype)
    row["flops"], row["bytes"] = flops, nbytes
    sec = m.median * 1e-3
    row["tflops"] = flops / sec / 1e12 if flops and sec > 0 else None
    row["gbps"] = nbytes / sec / 1e9 if nbytes and sec > 0 else None
    row["accuracy_ok"] = accuracy_ok(errs)
    return row


def note(row: dict, text: str) -> None:
    """Add ``text`` to the row's ``message`` (``; ``-joined)."""
    row["message"] = f"{row['message']}; {text}" if row.get("message") else text


def fresh_inputs(op: Operator, case: Case, dtype: str, inputs: dict, device, seed: int):
    """Copy new random values (``seed + 1``) into the input tensors in place and return the
    new reference, or ``None`` when the inputs cannot be refreshed in place (non-tensor inputs
    that differ, shapes that differ, or an operator with ``fresh_recheck = False``)."""
    import torch

    if not getattr(op, "fresh_recheck", True):
        return None
    new = op.make_inputs(case, dtype, device, seed + 1)
    if set(new) != set(inputs):
        return None
    for k, v in inputs.items():
        if torch.is_tensor(v) != torch.is_tensor(new[k]):
            return None
        if torch.is_tensor(v):
            if v.shape != new[k].shape or v.dtype != new[k].dtype:
                return None
        elif v != new[k]:
            return None
    with torch.no_grad():
        for k, v in inputs.items():
            if torch.is_tensor(v):
                v.copy_(new[k])
    return op.reference(case, dtype, inputs)


def unconverged(rounds: int, target: float, stop_reason: str | None) -> str:
    """The note of a case that stopped before its target after ``rounds`` rounds, by its stop
    reason (:data:`flyexplore.measure.interleaved.STOP_REASONS`; the row's ``stop_reason`` names
    the cap). Kept within the panel's 60 characters (:data:`flyexplore.ui.tables.NOTE_CHARS`)
    up to 99,999 rounds, so that it shows in the row instead of as a numbered note."""
    t = f"+-{target:.1%}"
    why = {"precision_cap": f"medians not within {t}",
           "label_cap": "a label still undecided",
           "budget": "case budget ran out",
           "max_rounds": f"intervals not within {t}"}
    return f"unconverged after {rounds} rounds: " + why.get(stop_reason, str(stop_reason))


def recheck(op, case, dtype, bk, ctx, inputs, ref2, row) -> bool | None:
    """Build the backend again on the refreshed inputs (:func:`fresh_inputs`'s reference
    ``ref2``, or the exception that made it) and check its output; a failure sets
    ``accuracy_ok=False`` and says why in the row's message. Returns ``recheck_ok``."""
    if isinstance(ref2, Exception) or ref2 is None:
        note(row, "recheck on fresh inputs skipped: " + (first_line(ref2) if ref2 is not None
                                                         else "the inputs cannot be refreshed in place"))
        return None
    try:
        with bk.context(ctx, case):
            out = bk.build(case, dtype, inputs, ctx)()
            errs = op.error(out, ref2, case, dtype)
    except Exception as exc:  # noqa: BLE001
        note(row, f"recheck on fresh inputs failed: {first_line(exc)}")
        row["accuracy_ok"] = False
        return False
    ok = accuracy_ok(errs)
    if ok is False:
        row["accuracy_ok"] = False
        note(row, "output after timing, on fresh input values, is wrong (a stale or cached result?)")
    return ok


def trace_of(m, fn, ctx, decisions, bk, case) -> Trace:
    """What ran for a timed backend: from the kernels its measurement saw, else from one extra
    profiled call (:func:`flyexplore.insight.trace.trace`); a trace with a note when the profiler
    cannot run here (the time stands, what ran stays unknown)."""
    if m.kernels:
        return from_kernels(m.kernels, decisions)
    try:
        with bk.context(ctx, case):
            t = run_trace(fn, device=ctx.device, reps=1, warmup=0, autotune=False)
        return Trace(t.kernels, t.cpu_ops, tuple(decisions), t.device, t.notes)
    except Exception as exc:  # no profiler here: what ran stays unknown, the time stands
        return Trace((), (), tuple(decisions), "cuda" if ctx.gpu else "cpu",
                     (f"tracing failed: {first_line(exc)}",))


def trace_cols(op: Operator, case: Case, dtype: str, backend: str, tr: Trace | None) -> dict | None:
    """:func:`flyexplore.insight.case_trace.trace_columns` of ``tr`` (None: not traced)."""
    return None if tr is None else trace_columns(tr, backend, op.name, case, dtype)


def failure(exc: BaseException, ctx) -> dict:
    """The row columns of a backend that raised: ``oom`` (:func:`is_oom`) or ``error``, with the
    first line of the message; on a GPU the cache allocator is emptied."""
    import torch

    if os.environ.get("FLYEXPLORE_DEBUG"):
        traceback.print_exc()
    if ctx.gpu:
        torch.cuda.empty_cache()
    return {"status": "oom" if is_oom(exc) else "error", "message": first_line(exc)}


# -- across environments (an environment A/B, flyexplore.run.envab) ---------------------------------

def tensors_of(value) -> list:
    """The tensors in an operator's inputs or output, in a fixed order: a tensor, or the tensors
    in a dict (by key), list or tuple, nested; other values are left out."""
    import torch

    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value, key=str) for t in tensors_of(value[k])]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


#: An object's address in its default ``repr`` (``<StaticCache object at 0x7f...>``): it differs
#: between processes for the same object, so a digest leaves it out.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _plain(value):
    """The non-tensor parts of a case's inputs as JSON-able text (a digest covers them too), with
    no object addresses (:data:`_ADDRESS`: a decode step's KV cache object, a callable)."""
    import torch

    if torch.is_tensor(value):
        return f"tensor{tuple(value.shape)}:{value.dtype}"
    if isinstance(value, dict):
        return {str(k): _plain(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return _ADDRESS.sub("", repr(value))


#: Bytes at each end of a tensor that :func:`inputs_digest` hashes as they are (the rest it reads
#: through two sums over all of its 32-bit words).
DIGEST_EDGE_BYTES = 1 << 16


def inputs_digest(inputs: dict) -> str:
    """A digest of a case's inputs (BLAKE2b, 16 hex digits) over every tensor's shape, dtype and
    contents and the non-tensor values. Two environments of an A/B build a case from the same
    seed; equal digests show that their inputs are equal (two torch builds whose random number
    generators differ give different inputs). The contents are read where they lie, with no copy
    of a large tensor to the host: the tensor's bytes as 32-bit words, their sum and their sum
    weighted by position (int64, wrapping), computed on its device, plus its first and last
    :data:`DIGEST_EDGE_BYTES` bytes. Values that differ anywhere change the sums (and a
    permutation the weighted one) but for a chance of about 2**-64; this is a check of equality,
    not a defence against a crafted collision."""
    import torch

    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps(_plain(inputs), sort_keys=True).encode())
    for t in tensors_of(inputs):
        if not t.numel():
            continue
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        n = b.numel()
        pad = (-n) % 4
        if pad:
            b = torch.cat([b, b.new_zeros(pad)])
        w = b.view(torch.int32).to(torch.int64)
        pos = torch.arange(1, w.numel() + 1, device=w.device, dtype=torch.int64)
        sums = torch.stack([w.sum(), (w * (pos * 2654435761 + 97)).sum()]).cpu().tolist()
        edge = torch.cat([b[:DIGEST_EDGE_BYTES], b[-DIGEST_EDGE_BYTES:]]).cpu().numpy().tobytes()
        h.update(json.dumps([n, sums]).encode() + edge)
    return h.hexdigest()


#: How far two environments' outputs of one case may differ: this many times the dtype's
#: tolerance on ``err_rel`` (:data:`flyexplore.ops.base.ERR_TOL`). Each output is within the
#: tolerance of a common high-precision reference when it passes its own check, so two passing
#: outputs differ by at most twice it (the triangle inequality); more means one of them, or one
#: environment's reference, is wrong.
CROSS_ENV_TOL_FACTOR = 2.0


def output_difference(out, base, dtype: str) -> dict:
    """How one environment's output of a case differs from the base environment's (an
    environment A/B; ``out``, ``base``: what the backends returned, a tensor or nested
    tuple/list/dict of them, on any device). Returns ``cross_env_err_rel``: the largest relative
    difference ``||out - base||_2 / ||base||_2`` (float64, over the floating tensors' elements
    finite on both sides), ``cross_env_ok``: within :data:`CROSS_ENV_TOL_FACTOR` x the dtype's
    tolerance (:data:`flyexplore.ops.base.ERR_TOL`) with the same shapes and the same non-finite
    elements, and ``cross_env_note`` where something else differs (shapes, integer tensors such as
    TopK's indices, which may differ among equal values: reported, not failed)."""
    import torch

    a, b = tensors_of(out), tensors_of(base)
    b = [y.to(x.device) if torch.is_tensor(y) and y.device != x.device else y for x, y in zip(a, b)]
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return {"cross_env_err_rel": math.nan, "cross_env_ok": False,
                "cross_env_note": f"outputs differ in structure: {[tuple(x.shape) for x in a]} vs "
                                  f"{[tuple(y.shape) for y in b]}"}
    worst, ok, notes = 0.0, True, []
    for x, y in zip(a, b):   # on the output's own device (a GPU compares 128 MB in milliseconds)
        x, y = x.detach(), y.detach()
        if x.is_floating_point() and y.is_floating_point():
            xd, yd = x.double(), y.double()
            fin = torch.isfinite(xd) & torch.isfinite(yd)
            same_nonfinite = bool(((~torch.isfinite(xd)) == (~torch.isfinite(yd))).all())
            d = float(torch.where(fin, xd - yd, torch.zeros_like(xd)).norm())
            n = float(torch.where(fin, yd, torch.zeros_like(yd)).norm())
            rel = d / n if n > 0 else d
            worst = max(worst, rel)
            if not same_nonfinite:
                ok = False
                notes.append("NaN/Inf in other places")
        else:
            diff = int((x != y).sum()) if x.shape == y.shape else x.numel()
            if diff:
                notes.append(f"{diff} of {x.numel()} {str(x.dtype).removeprefix('torch.')} elements differ")
    tol = CROSS_ENV_TOL_FACTOR * ERR_TOL.get(dtype, ERR_TOL["fp32"])
    return {"cross_env_err_rel": worst, "cross_env_ok": bool(ok and worst <= tol),
            "cross_env_note": "; ".join(notes) or None}


def debug_trace() -> None:
    """Print the current exception's traceback to stderr when ``FLYEXPLORE_DEBUG`` is set."""
    if os.environ.get("FLYEXPLORE_DEBUG"):
        traceback.print_exc()


def jsonable(v: Any):
    """A row value as JSON takes it: numpy scalars as Python numbers, NaN kept (``json.dumps``
    writes it; the driver reads it back), tensors and other objects as text."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    try:
        import numpy as np

        if isinstance(v, np.generic):
            return v.item()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return str(v)
