"""One case of a sweep: build every backend, check its output, time them (interleaved or in
block order), recheck on fresh inputs and return the result rows. :func:`run_case` is what a
sweep worker runs (:mod:`flyexplore.run.engine`); :func:`flyexplore.run.sweep.run_sweep` plans the cases
and writes the rows. Split from ``sweep.py`` so that the engine, the trace and the sweep import
it without importing each other.

Also here, because they size a case before it runs: :func:`case_memory` (a case's estimated
memory, from the operator's pure-Python tensor sizes) and :func:`memory_refusals` (the cases of a
plan over the device's free memory or ``max_memory``, which the sweep records as ``refused`` rows
instead of allocating them).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import traceback
from typing import Any, Callable, Mapping, Sequence

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.measure.devstate import _bdf, case_columns, free_memory, sampler_for
from flyexplore.measure.interleaved import measure_interleaved
from flyexplore.measure.timing import MIN_FLUSH_BYTES, Timer, flush_bytes_for
from flyexplore.ops.base import Case, Operator, RunContext, reset_dynamo
from flyexplore.results import table as R
from flyexplore.run import build as B
from flyexplore.run.spec import Plan, interleaved_kwargs

# the build steps live in flyexplore.run.build (no pandas: the environment A/B's worker shares them)
_first_line, _is_oom, _traced, _accuracy_ok, _note = B.first_line, B.is_oom, B.traced, B.accuracy_ok, B.note
_fresh_inputs, _recheck, _trace_of, _failure = B.fresh_inputs, B.recheck, B.trace_of, B.failure


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _base_row(plan_op: Operator, case: Case, dtype: str, backend: str, run_id: str, fp: dict) -> dict:
    row = {"schema_version": R.SCHEMA_VERSION, "run_id": run_id, "timestamp": _now(),
           "op": plan_op.name, "case": case.label, "params": json.dumps(case.p, sort_keys=True),
           "dtype": dtype, "backend": backend, "source": "measured", **fp}
    row.update(case.p)
    return row


def measure_one(op: Operator, case: Case, dtype: str, backend: str, ctx: RunContext,
                inputs: dict, ref, timer_opts: dict, trace: bool = False) -> dict:
    """Run one backend on one case and return the row's measured columns (status ``ok``),
    or ``{"status": "unavailable", ...}``. Exceptions propagate (the caller records them).

    With ``trace`` -- and always for the ``flydsl`` backend, and for attention on a GPU (which
    AOTriton backend ran) -- the row also gets what really ran
    (:func:`flyexplore.insight.case_trace.trace_columns`: ``observed``, ``autotune``, ``flydsl_taken``,
    ``flydsl_reason``), from the kernels the timer saw or one extra profiled call."""
    bk = op.get_backend(backend)
    why = bk.available(ctx, case, dtype)
    if why:
        return {"status": "unavailable", "message": why}
    want_trace = _traced(trace, backend, op, ctx)
    tr = None
    reset_dynamo()
    sampler = sampler_for(ctx.device)
    st0 = sampler.sample()
    with bk.context(ctx, case):
        fn, first_ms, errs, decisions, _ = B.build_first(op, case, dtype, bk, ctx, inputs, ref, want_trace)
        m = Timer(fn, ctx.device, **timer_opts).measure()
    if want_trace:
        tr = _trace_of(m, fn, ctx, decisions, bk, case)
    row = B.ok_row(op, case, dtype, backend, bk.source, m, first_ms, errs, B.trace_cols(op, case, dtype, backend, tr))
    row.update(ci_target=None, device_id=sampler.device_id,
               **case_columns(st0, sampler.sample(), [], sampler.max_clock_mhz))
    return row


def measure_case(op: Operator, case: Case, dtype: str, backends: Sequence[str], ctx: RunContext,
                 inputs: dict, ref, timer_opts: dict, *, trace: bool = False, seed: int = 0,
                 band: float = S.BAND, baseline: str | None = None) -> dict[str, dict]:
    """Measure every backend of one case interleaved; returns ``{backend: row columns}``.

    1. Each available backend is built and called once (compile, autotune), inside its
       context, and its output checked against ``ref``; a backend that raises gets an
       ``error``/``oom`` row, one that cannot run an ``unavailable`` row.
    2. The others are timed together by :func:`~flyexplore.measure.interleaved.measure_interleaved`
       (``timer_opts``, checked by :class:`flyexplore.run.spec.SweepSpec`, translated by
       :func:`flyexplore.run.spec.interleaved_kwargs`) against ``baseline`` (default:
       the operator's baseline backend if timed, else the first timed backend).
    3. Each row gets its speedup against the baseline (paired rounds), its interval and label
       (:func:`flyexplore.measure.stats.verdict` with ``band``), the device state, why the
       rounds ended (``stop_reason``; a note in ``message`` when not ``converged``), and ``recheck_ok``:
       after timing, the inputs are refilled with new values (``seed + 1``), each backend is
       built again and its output checked against the new reference.
    Exceptions while timing become ``error``/``oom`` rows for every timed backend."""
    opts = interleaved_kwargs(timer_opts)
    reset_dynamo()
    rows: dict[str, dict] = {}
    fns: dict = {}
    traces: dict = {}
    decisions_by: dict = {}
    bks = {b: op.get_backend(b) for b in backends}
    for b, bk in bks.items():
        why = bk.available(ctx, case, dtype)
        if why:
            rows[b] = {"status": "unavailable", "message": why}
            continue
        try:
            with bk.context(ctx, case):
                fn, first_ms, errs, decisions, _ = B.build_first(op, case, dtype, bk, ctx, inputs, ref,
                                                                _traced(trace, b, op, ctx))
            fns[b] = fn
            traces[b] = (first_ms, errs)
            decisions_by[b] = decisions
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            rows[b] = _failure(exc, ctx)
    if not fns:
        return rows
    base = baseline if baseline in fns else next((b for b in fns if bks[b].baseline), next(iter(fns)))
    try:
        res = measure_interleaved(fns, ctx.device, baseline=base, band=band,
                                  enter=lambda nm: bks[nm].context(ctx, case), **opts)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        for b in fns:
            rows[b] = _failure(exc, ctx)
        return rows
    ref2 = None
    try:
        ref2 = _fresh_inputs(op, case, dtype, inputs, ctx.device, seed) if ref is not None else None
    except Exception as exc:  # noqa: BLE001 - the recheck is skipped, with the reason
        if os.environ.get("FLYEXPLORE_DEBUG"):
            traceback.print_exc()
        ref2 = exc
    for b, fn in fns.items():
        m = res.measurements[b]
        first_ms, errs = traces[b]
        tr = None
        if _traced(trace, b, op, ctx):
            tr = _trace_of(m, fn, ctx, decisions_by[b], bks[b], case)
        row = B.ok_row(op, case, dtype, b, bks[b].source, m, first_ms, errs, B.trace_cols(op, case, dtype, b, tr))
        rclocks = list(res.round_clocks)
        row.update(case_columns(res.state_start, res.state_end, rclocks, res.max_clock_mhz,
                                list(S.round_values(m.rounds))))
        row.update(device_id=res.device_id, converged=res.converged, ci_target=res.target,
                   wall_s=res.wall_s, verdict_s=res.verdict_s, stop_reason=res.stop_reason,
                   band=band, baseline=base,
                   round_clock_mhz=json.dumps(rclocks) if any(c is not None for c in rclocks) else None)
        if b != base:
            est, lo, hi = res.speedup(b)
            row.update(speedup=est, speedup_lo=lo, speedup_hi=hi, verdict=S.verdict(lo, hi, band))
        if not res.converged:
            _note(row, B.unconverged(res.rounds, res.target, res.stop_reason))
        if ref is not None:
            row["recheck_ok"] = _recheck(op, case, dtype, bks[b], ctx, inputs, ref2, row)
        rows[b] = row
    return rows


def run_case(op: Operator, case: Case, dtype: str, backends: Sequence[str], ctx: RunContext, *,
             order: str = "interleaved", timer_opts: dict | None = None, trace: bool = False,
             seed: int = 0, band: float = S.BAND, baseline: str | None = None,
             should_stop: Callable[[], bool] | None = None):
    """Run one case -- inputs (``seed``), reference, then every backend in ``backends`` -- and
    yield ``(backend, row columns)`` as rows finish: all at the end in ``interleaved`` order
    (:func:`measure_case`), one by one in ``block`` order (:func:`measure_one`; ``should_stop``
    is checked between backends and a true answer yields ``(None, None)`` and ends). The unit of
    work of every engine: in-process, a worker process or a Ray actor
    (:mod:`flyexplore.run.engine`). A failure while making inputs gives every backend an
    ``error``/``oom`` row; ``KeyboardInterrupt`` propagates."""
    timer_opts = dict(timer_opts or {})
    inputs = ref = None
    setup_err = None
    try:
        inputs = op.make_inputs(case, dtype, ctx.device, seed)
        ref = op.reference(case, dtype, inputs)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # OOM or unsupported dtype while making inputs
        setup_err = exc
    if order == "interleaved":
        if setup_err is not None:
            got = {b: _failure(setup_err, ctx) for b in backends}
        else:
            got = measure_case(op, case, dtype, backends, ctx, inputs, ref, timer_opts,
                               trace=trace, seed=seed, band=band, baseline=baseline)
        del inputs, ref
        for b in backends:
            yield b, got[b]
        return
    for b in backends:
        if should_stop is not None and should_stop():
            yield None, None
            return
        try:
            if setup_err is not None:
                raise setup_err
            cols = measure_one(op, case, dtype, b, ctx, inputs, ref, timer_opts, trace)
            cols["order"] = "block"
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            cols = _failure(exc, ctx)
        yield b, cols


def case_cost(op: Operator, case: Case, dtype: str) -> float:
    """Expected cost of a case, for balancing shards over workers: its FLOPs
    (``op.flops``), else its bytes (``op.bytes``), else 1. A count, not a time: cases of one
    operator compare by it (longest-processing-time-first ordering, :mod:`flyexplore.run.engine`)."""
    for f in (lambda: op.flops(case), lambda: op.bytes(case, dtype)):
        try:
            v = float(f())
        except Exception:  # noqa: BLE001 - an operator without a count
            continue
        if v > 0:
            return v
    return 1.0


def physical_device_id(device) -> str | None:
    """The physical GPU behind a torch ``device``: the NVML UUID (``GPU-...``) on NVIDIA, the
    PCI bus id (``0000:05:00.0``) on AMD, from :func:`flyexplore.measure.devstate.sampler_for`, else
    from ``torch.cuda.get_device_properties`` (``uuid``, or the PCI domain/bus/device). Stable
    under ``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES`` pinning, unlike the index. ``None``
    on the CPU. Never raises."""
    import torch

    try:
        dev = torch.device(device)
        if dev.type != "cuda":
            return None
        sid = sampler_for(dev).device_id
        if sid:
            return str(sid)
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        if getattr(torch.version, "hip", None):
            return _bdf(props)
        u = getattr(props, "uuid", None)
        return None if u is None else (str(u) if str(u).startswith("GPU-") else f"GPU-{u}")
    except Exception:  # noqa: BLE001 - the row keeps an empty device_id
        return None




# -- memory: estimate a case before it allocates, refuse what cannot fit ----------------------------

def case_memory_terms(op: Operator, case: Case, dtype: str, *, flush_bytes: int = MIN_FLUSH_BYTES) -> dict[str, int]:
    """The terms of :func:`case_memory`, in bytes, in this order:

    - ``inputs``: the tensors ``op.make_inputs`` builds, held for the whole case -- the ``input``
      entries of :meth:`~flyexplore.ops.base.Operator.tensor_sizes` (the operator's ``tensors``
      hook: storage shape x bytes per element, e.g. GEMM A [M, K] and B [K, N]);
    - ``output``: what one backend call returns (its ``output`` entries, e.g. GEMM [M, N]); the
      timers drop each call's output before the next call, so one is counted;
    - ``flush buffer``: ``flush_bytes``, the cache-flush buffer the timers allocate once per case
      (:class:`~flyexplore.measure.timing.Timer` and
      :func:`~flyexplore.measure.interleaved.measure_interleaved`): on a GPU
      :func:`~flyexplore.measure.timing.flush_bytes_for` the device, at least
      :data:`~flyexplore.measure.timing.MIN_FLUSH_BYTES` (256 MiB, as ``triton.testing.do_bench``;
      the default here); on the CPU none unless the timer's ``flush`` is on (then 64 MiB). Left
      out when 0.

    An operator without a ``tensors`` hook is estimated by ``op.bytes(case, dtype)`` (the bytes an
    ideal kernel moves, usually inputs plus output) as ``inputs and output``, or 0 when it has
    none. Raises :class:`~flyexplore.errors.UsageError` for a tensor past int64 (as the plan does)."""
    sizes = op.tensor_sizes(case, dtype)
    if sizes:
        terms = {"inputs": sum(t.nbytes for t in sizes if t.role == "input"),
                 "output": sum(t.nbytes for t in sizes if t.role == "output")}
    else:
        try:
            nbytes = int(op.bytes(case, dtype)) if callable(op.bytes) else 0
        except Exception:  # noqa: BLE001 - an operator without a byte count: nothing estimated
            nbytes = 0
        terms = {"inputs and output": max(nbytes, 0)}
    if flush_bytes:
        terms["flush buffer"] = int(flush_bytes)
    return terms


def case_memory(op: Operator, case: Case, dtype: str, *, flush_bytes: int = MIN_FLUSH_BYTES) -> int:
    """Estimated bytes ``case`` in ``dtype`` needs on its device before any backend runs: its
    inputs, one output and the timers' cache-flush buffer (``flush_bytes``; the terms and where
    each number comes from: :func:`case_memory_terms`). Pure Python, exact past int64 (no torch,
    nothing allocated).

    A lower bound, not a peak: not counted are the reference (``op.reference``, kept in float64 on
    the CPU and float32 on a GPU beside the inputs), the error check's temporaries, what autograd
    saves (attention ``bwd``), per-backend extras (BLAS/cuBLAS/hipBLASLt workspace, Inductor's
    compile and autotune buffers), the worker's CUDA/HIP context (about 0.5 GB, seen on an H200
    with torch 2.11) and the allocator's rounding. So a case over a limit by this
    estimate cannot run; one under it may still run out of memory (an ``oom`` row)."""
    return sum(case_memory_terms(op, case, dtype, flush_bytes=flush_bytes).values())


def _sci(n: float) -> str:
    """``1.2e19 B``-style bytes (two significant digits; plain digits below 10 kB)."""
    if n < 10_000:
        return f"{int(n)} B"
    mant, _, exp = f"{n:.1e}".partition("e")
    return f"{mant}e{int(exp)} B"


def _human(n: float) -> str:
    """``22.1 GB`` (decimal units)."""
    for unit, scale in (("EB", 1e18), ("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _device_flush_bytes(dev) -> int:
    """The flush buffer the timers allocate on ``dev`` by default: :func:`flush_bytes_for` on a
    GPU (device properties only: no CUDA context is created), none on the CPU (flush off)."""
    if dev.type != "cuda":
        return 0
    try:
        return int(flush_bytes_for(dev))
    except Exception:  # noqa: BLE001 - properties unreadable: the smallest GPU flush
        return MIN_FLUSH_BYTES


def memory_refusals(plan: Plan, device=None, max_memory: int | None = None, *,
                    reader: Callable[[Any], tuple[int | None, str]] | None = None,
                    copies: int = 1) -> dict[tuple[str, str], str]:
    """The cases of ``plan`` that must not be run on ``device``: ``{(case label, dtype): message}``
    for every case whose :func:`case_memory` estimate (with the device's flush buffer) is over the
    limit, the message the sweep gives its ``refused`` rows, e.g. ``estimated memory 1.2e19 B
    (inputs 8.0e18 B, output 4.0e18 B, flush buffer 2.7e8 B) is over the device's free memory
    22.1 GB (NVML nvmlDeviceGetMemoryInfo)``. Cases within the limit are not in the dict.

    The limit is the smaller of ``max_memory`` (bytes, ``--max-memory``) and the device's free
    memory now (``reader(device) -> (bytes or None, source)``, default
    :func:`flyexplore.measure.devstate.free_memory`: MemAvailable on the CPU, NVML on NVIDIA
    without creating a CUDA context, amdsmi or ``torch.cuda.mem_get_info`` on ROCm). Where the free
    memory cannot be read, only ``max_memory`` applies; with neither, nothing is refused.
    ``device``: a torch device or its text (default: a GPU when one is visible, else the CPU);
    with several GPUs (``--devices``) the one given is asked, and its free memory stands for all.

    ``copies``: processes that hold the case at once (an environment A/B: one worker per
    environment, each with its own inputs, output and flush buffer), the estimate multiplied by it.

    Raises :class:`UsageError` (one line: the smallest estimate, its case and the limit) when
    every case of the plan is over, and for a ``max_memory`` that is not an integer >= 1."""
    import torch

    if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory < 1):
        raise UsageError(f"max_memory must be a number of bytes >= 1, got {max_memory!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    free, source = (reader or free_memory)(dev)
    limits = []
    if max_memory is not None:
        limits.append((max_memory, f"max_memory (--max-memory) {_human(max_memory)}"))
    if free is not None:
        limits.append((int(free), f"the device's free memory {_human(free)} ({source})"))
    if not limits:
        return {}
    limit, said = min(limits, key=lambda x: x[0])
    flush = _device_flush_bytes(dev)
    out: dict[tuple[str, str], str] = {}
    smallest: tuple[int, str, Mapping[str, int]] | None = None
    for case, dtype in plan.pairs:
        terms = case_memory_terms(plan.op, case, dtype, flush_bytes=flush)
        est = sum(terms.values()) * max(int(copies), 1)
        if smallest is None or est < smallest[0]:
            smallest = (est, f"{case.label} {dtype}", terms)
        if est > limit:
            each = ", ".join(f"{k} {_sci(v)}" for k, v in terms.items())
            out[(case.label, dtype)] = (f"estimated memory {_sci(est)} ({each}"
                                        f"{f'; x {copies}: one worker per environment' if copies > 1 else ''}) "
                                        f"is over {said}")
    if plan.pairs and len(out) == len(plan.pairs):
        est, name, _ = smallest
        raise UsageError(f"every case of the plan is over the memory limit: the smallest, {name}, is estimated at "
                         f"{_sci(est)}, over {said}")
    return out
