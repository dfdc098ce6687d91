"""Sweeps that keep every result.

:func:`run_sweep` runs every (case, dtype, backend) of a plan and returns a result set
(:mod:`flyexplore.results`). With ``out``, each finished row is appended at once to a journal
(``<out>.partial.jsonl``, flushed and fsynced), and the result file is written atomically when
the sweep ends, is stopped, or is interrupted (Ctrl-C). After a hard crash the journal remains;
``resume=True`` reads the result file and the journal and skips the (op, case, dtype, backend)
keys already there. A failing case becomes a row (``unavailable``, ``error`` or ``oom``, with
the message) and the sweep goes on.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd

from . import results as R
from . import validate
from .env import collect
from .errors import UsageError
from .ops import get_op
from .ops.base import Case, Operator, RunContext
from .timing import Timer


@dataclass(frozen=True)
class Plan:
    """What a sweep will run: an operator, ``(case, dtype)`` pairs and backend names."""

    op: Operator
    pairs: tuple[tuple[Case, str], ...]
    backends: tuple[str, ...]

    def items(self) -> list[tuple[Case, str, str]]:
        return [(c, d, b) for c, d in self.pairs for b in self.backends]

    def __len__(self) -> int:
        return len(self.pairs) * len(self.backends)


def _split(v: str | Iterable[str] | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return list(v)


def make_plan(op: str | Operator, suite: str | None = None, shapes: str | Sequence | None = None,
              dtypes: str | Sequence[str] | None = None,
              backends: str | Sequence[str] | None = None) -> Plan:
    """Resolve and validate a sweep plan. Exactly one of ``suite`` and ``shapes`` (a text such
    as ``"4096x4096x4096;8x4096x4096"`` or a list of texts / :class:`Case`).
    ``dtypes`` defaults to the suite's (or the operator's first); ``backends`` to all.
    Raises :class:`UsageError` naming any unknown operator, suite, dtype, backend or bad shape.
    """
    op = get_op(op) if isinstance(op, str) else op
    if (suite is None) == (shapes is None):
        raise UsageError("give exactly one of a suite and shapes")
    dts = _split(dtypes)
    for d in dts or ():
        op.check_dtype(d)
    if suite is not None:
        pairs = op.get_suite(suite).pairs(dts)
    else:
        if isinstance(shapes, str):
            cases = op.parse_shapes(shapes)
        else:
            cases = tuple(s if isinstance(s, Case) else op.case(s) for s in shapes)
            if not cases:
                raise UsageError(f"no {op.name} shapes given")
        pairs = tuple((c, d) for c in cases for d in (dts or [op.dtypes[0]]))
    bks = _split(backends) or list(op.backends)
    for b in bks:
        op.get_backend(b)
    if not bks:
        raise UsageError("no backends given")
    return Plan(op, pairs, tuple(dict.fromkeys(bks)))


def journal_path(out: str | os.PathLike) -> Path:
    """The append-only journal beside a result file: ``<out>.partial.jsonl``."""
    return Path(str(out) + ".partial.jsonl")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _first_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500]


def _is_oom(exc: BaseException) -> bool:
    import torch
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class _Writer:
    """Appends rows to the journal; writes the final file atomically on close."""

    def __init__(self, out: Path | None, old: pd.DataFrame):
        self.out, self.old, self.rows = out, old, []
        self.journal = journal_path(out) if out else None

    def add(self, row: dict):
        self.rows.append(row)
        if self.journal:
            with open(self.journal, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def frame(self) -> pd.DataFrame:
        return R.concat([self.old, R.frame(self.rows)])

    def close(self) -> pd.DataFrame:
        df = self.frame()
        if self.out:
            R.save(df, self.out)
            if self.journal.exists():
                self.journal.unlink()
        return df


def _previous(out: Path, resume: bool, overwrite: bool) -> pd.DataFrame:
    jp = journal_path(out)
    if not resume:
        if (out.exists() or jp.exists()) and not overwrite:
            raise UsageError(f"output file {str(out)!r} exists (use --resume to continue it, "
                             "--overwrite to replace it, or choose another path)")
        if jp.exists():
            jp.unlink()
        return R.empty_frame()
    frames = [R.load(out)] if out.exists() else []
    if jp.exists():
        frames.append(R.load(jp))
    return R.concat(frames)


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

    With ``trace`` -- and always for the ``flydsl`` backend -- the row also gets what really
    ran (:func:`flyexplore.trace.row_columns`: ``observed``, ``autotune``, ``flydsl_taken``,
    ``flydsl_reason``), from the kernels the timer saw or one extra profiled call."""
    bk = op.get_backend(backend)
    why = bk.available(ctx, case, dtype)
    if why:
        return {"status": "unavailable", "message": why}
    want_trace = trace or backend == "flydsl"
    tr = None
    with bk.context(ctx, case):
        if want_trace:
            from .trace import capture_autotune
            cap = capture_autotune()
        else:
            import contextlib
            cap = contextlib.nullcontext([])
        with cap as decisions:
            fn = bk.build(case, dtype, inputs, ctx)
            t0 = time.perf_counter()
            outv = fn()
            if ctx.gpu:
                import torch
                torch.cuda.synchronize(ctx.device)
            first_ms = (time.perf_counter() - t0) * 1e3
        errs = op.error(outv, ref, case, dtype) if ref is not None else {}
        del outv
        m = Timer(fn, ctx.device, **timer_opts).measure()
        if want_trace:
            from .trace import Trace, from_kernels
            from .trace import trace as run_trace
            if m.kernels:
                tr = from_kernels(m.kernels, decisions)
            else:
                try:
                    t = run_trace(fn, device=ctx.device, reps=1, warmup=0, autotune=False)
                    tr = Trace(t.kernels, t.cpu_ops, tuple(decisions), t.device, t.notes)
                except Exception as exc:  # no profiler here: what ran stays unknown, the time stands
                    tr = Trace((), (), tuple(decisions), "cuda" if ctx.gpu else "cpu",
                               (f"tracing failed: {_first_line(exc)}",))
    row = {"status": "ok", "message": "; ".join(m.notes) or None, "source": bk.source,
           "first_call_ms": first_ms, **m.summary(), **errs}
    if tr is not None:
        from .trace import row_columns
        row.update(row_columns(tr, backend, op.name, case, dtype))
        if row.get("flydsl_taken") is False:
            note = f"FlyDSL requested but not taken; the time is of what ran ({tr.observed})"
            row["message"] = f"{row['message']}; {note}" if row["message"] else note
    if m.kernels:
        row["kernels"] = json.dumps([[k.name, k.calls_per_iter, round(k.us_per_iter, 3)] for k in m.kernels])
    flops, nbytes = op.flops(case), op.bytes(case, dtype)
    row["flops"], row["bytes"] = flops, nbytes
    sec = m.median * 1e-3
    row["tflops"] = flops / sec / 1e12 if flops and sec > 0 else None
    row["gbps"] = nbytes / sec / 1e9 if nbytes and sec > 0 else None
    if "err_rel" in errs:
        row["accuracy_ok"] = errs.get("accuracy_ok", errs["err_rel"] <= errs.get("err_tol", float("inf")) + 1e-12)
    return row


def default_device():
    import torch
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def run_sweep(op: str | Operator, *, suite: str | None = None, shapes=None, dtypes=None,
              backends=None, out: str | os.PathLike | None = None, resume: bool = False,
              overwrite: bool = False, device=None, seed: int = 0, timer: dict | None = None,
              progress: bool = True, on_row: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None, trace: bool = False) -> pd.DataFrame:
    """Run a sweep and return its result set (resumed rows included).

    ``timer`` is passed to :class:`~flyexplore.timing.Timer` (``mode``, ``rep``, ``rep_ms``, ...).
    ``on_row(row)`` is called after each row is written; ``should_stop()`` is checked between
    rows, and a true answer ends the sweep keeping every finished row (the widgets' Stop).
    ``trace=True`` records what ran for every row (``observed``, ``autotune``); rows of the
    ``flydsl`` backend always get it, with ``flydsl_taken`` / ``flydsl_reason``
    (see :mod:`flyexplore.trace`).
    Raises :class:`UsageError` for bad input before anything runs; ``KeyboardInterrupt`` is
    re-raised after the finished rows are saved.
    """
    import torch

    timer = validate.sweep_options(timer, device, seed)
    plan = make_plan(op, suite, shapes, dtypes, backends)
    outp = R.check_path(out) if out is not None else None
    old = _previous(outp, resume, overwrite) if outp else R.empty_frame()
    done = {tuple(r) for r in old[list(R.KEY)].astype(str).itertuples(index=False)} if len(old) else set()
    device = torch.device(device) if device is not None else default_device()
    env = collect()
    ctx = RunContext(device, env)
    fp = {**env.fingerprint(), "flyexplore": env.versions.get("flyexplore", "")}
    run_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    timer_opts = dict(timer or {})
    todo = [(c, d, b) for c, d, b in plan.items() if (plan.op.name, c.label, d, b) not in done]
    writer = _Writer(outp, old)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), disable=not progress, unit="case", desc=f"{plan.op.name} sweep")
    try:
        by_case: dict[tuple[str, str], list[str]] = {}
        for c, d, b in todo:
            by_case.setdefault((c.label, d), []).append(b)
        cases = {c.label: c for c, _ in plan.pairs}
        stopped = False
        for (label, dtype), bks in by_case.items():
            case = cases[label]
            inputs = ref = None
            setup_err = None
            try:
                inputs = plan.op.make_inputs(case, dtype, device, seed)
                ref = plan.op.reference(case, dtype, inputs)
            except Exception as exc:  # OOM or unsupported dtype while making inputs
                setup_err = exc
            for b in bks:
                if should_stop is not None and should_stop():
                    stopped = True
                    break
                bar.set_postfix_str(f"{label} {dtype} {b}")
                row = _base_row(plan.op, case, dtype, b, run_id, fp)
                try:
                    if setup_err is not None:
                        raise setup_err
                    row.update(measure_one(plan.op, case, dtype, b, ctx, inputs, ref, timer_opts, trace))
                except KeyboardInterrupt:
                    raise
                except Exception as exc:
                    row.update(status="oom" if _is_oom(exc) else "error", message=_first_line(exc))
                    if os.environ.get("FLYEXPLORE_DEBUG"):
                        traceback.print_exc()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                row["timestamp"] = _now()
                writer.add(row)
                bar.update(1)
                if on_row is not None:
                    on_row(row)
            del inputs, ref
            if stopped:
                break
    finally:
        bar.close()
        result = writer.close()
    return result
