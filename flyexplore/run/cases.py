"""One case of a sweep: build every backend, check its output, time them (interleaved or in
block order), recheck on fresh inputs and return the result rows. :func:`run_case` is what a
sweep worker runs (:mod:`flyexplore.run.engine`); :func:`flyexplore.run.sweep.run_sweep` plans the cases
and writes the rows. Split from ``sweep.py`` so that the engine, the trace and the sweep import
it without importing each other.

A case's memory (:func:`case_memory`, :func:`memory_refusals`: the cases the sweep records as
``refused`` rows instead of allocating them) is :mod:`flyexplore.run.memory`'s, named here too.
"""
from __future__ import annotations

import datetime as _dt
import json
from typing import Callable, Sequence

from flyexplore.measure import stats as S
from flyexplore.measure.devstate import _bdf, case_columns, sampler_for
from flyexplore.measure.timing import Timer, cpu_threads
from flyexplore.ops.base import Case, Operator, RunContext, reset_dynamo
from flyexplore.results.schema_version import SCHEMA_VERSION  # not results.table: a worker imports no pandas
from flyexplore.run import build as B
from flyexplore.run.driver import CaseJob, drive_case, how_for
from flyexplore.run.memory import case_memory, case_memory_terms, memory_refusals  # noqa: F401 - named here too
from flyexplore.run.place import LocalPlace
from flyexplore.run.spec import interleaved_kwargs

# the build steps live in flyexplore.run.build (no pandas: the environment A/B's worker shares them)
_first_line, _is_oom, _traced, _accuracy_ok, _note = B.first_line, B.is_oom, B.traced, B.accuracy_ok, B.note
_fresh_inputs, _recheck, _trace_of, _failure = B.fresh_inputs, B.recheck, B.trace_of, B.failure


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _base_row(plan_op: Operator, case: Case, dtype: str, backend: str, run_id: str, fp: dict) -> dict:
    row = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "timestamp": _now(),
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
    # the first call, the timed calls and the traced one with the same intra-op threads on the CPU
    # (Dynamo guards on the count: another would compile the case again)
    with cpu_threads(ctx.gpu):
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
    """Measure every backend of one case interleaved in this process; returns ``{backend: row
    columns}``. The case is driven by the one case driver (:func:`flyexplore.run.driver.drive_case`)
    on this interpreter as its one place (:class:`flyexplore.run.place.LocalPlace`), exactly as an
    environment A/B drives its worker processes:

    1. Each available backend is built and called once (compile, autotune), inside its
       context, and its output checked against ``ref``; a backend that raises gets an
       ``error``/``oom`` row, one that cannot run an ``unavailable`` row.
    2. The others are timed together in rounds (:func:`flyexplore.measure.interleaved.sequential_rounds`;
       ``timer_opts``, checked by :class:`flyexplore.run.spec.SweepSpec`, translated by
       :func:`flyexplore.run.spec.interleaved_kwargs`; the family's ``timing_mode`` on a GPU unless
       a mode is asked for) against ``baseline`` (default: the operator's baseline backend if
       timed, else the first timed backend).
    3. Each row gets its speedup against the baseline (paired rounds), its interval and label
       (:func:`flyexplore.measure.stats.verdict` with ``band``), the device state, why the
       rounds ended (``stop_reason``; a note in ``message`` when not ``converged``), its peak
       memory on a GPU (``peak_mem_bytes``), the family's ``breakdown`` where it has one, and
       ``recheck_ok``: after timing, the inputs are refilled with new values (``seed + 1``), each
       backend is built again and its output checked against the new reference.
    Exceptions while timing become ``error``/``oom`` rows for every timed backend."""
    kw = interleaved_kwargs(timer_opts)
    how, t = how_for(op, kw, ctx.gpu)
    job = CaseJob(op=op, case=case, dtype=dtype, arms={"": tuple(backends)}, how=how, gpu=ctx.gpu,
                  base_arm=baseline, seed=seed, trace=trace, band=band, timer=t,
                  mode_fixed=kw.get("mode") == "kernel", inputs=inputs, ref=ref)
    sampler = sampler_for(ctx.device)
    rows, _ = drive_case([LocalPlace(ctx, sampler)], job, sampler=sampler)
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
