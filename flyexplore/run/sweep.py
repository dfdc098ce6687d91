"""Sweeps that keep every result.

:func:`run_sweep` runs every (case, dtype, backend) of a plan and returns a result set
(:mod:`flyexplore.results.table`). With ``out``, each finished row is appended at once to a journal
(``<out>.partial.jsonl``, flushed and fsynced), and the result file is written atomically when
the sweep ends, is stopped, or is interrupted (Ctrl-C). After a hard crash the journal remains;
``resume=True`` reads the result file and the journal and skips the (op, case, dtype, backend)
keys already there. A failing case becomes a row (``unavailable``, ``error`` or ``oom``, with
the message) and the sweep goes on. Where cases run -- this process, worker processes (the
default on a GPU; a crash or hang becomes ``crashed``/``timeout`` rows), several GPUs or Ray --
is :mod:`flyexplore.run.engine`'s part; the unit of work is :func:`run_case`.

Order (``order=``): ``interleaved`` (the default, GPU and CPU) builds, compiles and warms every
backend of a case first, then times them in shared rounds until every interval is tight
(:func:`flyexplore.measure.interleaved.measure_interleaved`), so that all backends see one clock regime; each
row gets its raw samples, the 95% interval of its median, and its speedup against the case's
baseline with an interval and a label (:mod:`flyexplore.measure.stats`), plus the device state
(:mod:`flyexplore.measure.devstate`). ``block`` is the old order: each backend's calls in one block
(:class:`flyexplore.measure.timing.Timer`), then the next backend; its speedups get only the wider,
unpaired intervals. After timing, each backend is built again on fresh input values and its
output checked once more (``recheck_ok``), so that a stale JIT cache or a kernel that returns
a previous result cannot pass as a speedup.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.ops.base import Case, Operator, RunContext
from flyexplore.results import table as R
from flyexplore.run import validate
from flyexplore.run._ray import run_ray
from flyexplore.run.cases import (  # noqa: F401 (re-exported)
    _base_row,
    _interleaved_opts,
    _now,
    case_cost,
    default_device,
    measure_case,
    measure_one,
    physical_device_id,
    run_case,
)
from flyexplore.run.engine import Settings, Task, choose_engine, limits, op_ref, resolve_op, run_tasks
from flyexplore.world import env as ENV

#: Timing orders of a sweep (see the module text).
ORDERS = ("interleaved", "block")


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
    """Resolve and validate a sweep plan. ``op``: a catalogue name, an :class:`Operator`, or
    an import path ``"module:attribute"`` of one (:func:`flyexplore.run.engine.resolve_op`).
    Exactly one of ``suite`` and ``shapes`` (a text such
    as ``"4096x4096x4096;8x4096x4096"`` or a list of texts / :class:`Case`).
    ``dtypes`` defaults to the suite's (or the operator's first); ``backends`` to all.
    Raises :class:`UsageError` naming any unknown operator, suite, dtype, backend or bad shape,
    or what an operator lacks to be measured (``make_inputs``, ``reference``, ``error``, a backend).
    """

    op = resolve_op(op) if isinstance(op, str) else op
    missing = [k for k in ("make_inputs", "reference", "error") if not callable(getattr(op, k, None))]
    if missing or not op.backends:
        raise UsageError(f"operator {op.name!r} cannot be measured: it has no "
                         + ", ".join(missing + ([] if op.backends else ["backend"]))
                         + " (docs/adding-an-operator.md)")
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


def run_sweep(op: str | Operator, *, suite: str | None = None, shapes=None, dtypes=None,
              backends=None, out: str | os.PathLike | None = None, resume: bool = False,
              overwrite: bool = False, device=None, seed: int = 0, timer: dict | None = None,
              progress: bool = True, on_row: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None, trace: bool = False,
              order: str = "interleaved", band: float = S.BAND,
              baseline: str | None = None, engine: str = "auto", devices=None,
              workers: int | None = None, case_timeout: float | None = None,
              max_cases_per_worker: int | None = None, retry_failed: bool = False,
              ray_address: str | None = None) -> pd.DataFrame:
    """Run a sweep and return its result set (resumed rows included).

    ``order``: ``interleaved`` (default) or ``block`` (see the module text). ``timer``: for
    interleaved order the options of :func:`~flyexplore.measure.interleaved.measure_interleaved`
    (``mode``, ``target``, ``budget_s``, ``calls_per_round``, ``min_rounds``, ``max_rounds``,
    ``warmup_ms``; ``rep`` = a fixed number of rounds, ``warmup`` = warm-up rounds, ``rep_ms`` =
    the budget in ms); for block order those of :class:`~flyexplore.measure.timing.Timer`. ``band``:
    the equivalence band of the SAME label (default 0.01 = +-1%). ``baseline``: the backend
    speedups are taken against (default: the operator's baseline backend, e.g. ``aten``).
    ``on_row(row)`` is called after each row is written; ``should_stop()`` is checked between
    cases (and between backends in block order); a true answer ends the sweep keeping every
    finished row (the widgets' Stop). ``trace=True`` records what ran for every row
    (``observed``, ``autotune``); rows of the ``flydsl`` backend always get it, with
    ``flydsl_taken`` / ``flydsl_reason`` (see :mod:`flyexplore.insight.trace`).

    Engines (:mod:`flyexplore.run.engine`): ``engine="auto"`` (default) runs cases in worker
    processes on a GPU and in this process on the CPU (unless ``workers``, ``devices`` or
    ``case_timeout`` ask for workers); ``"in-process"``, ``"local"`` (worker processes, one per
    GPU of ``devices`` -- ``"all"`` or indices -- or ``workers`` CPU processes) or ``"ray"``
    (Ray actors, ``ray_address``). In workers a case that crashes its process becomes
    ``crashed`` rows, one past ``case_timeout`` seconds (default
    :data:`flyexplore.run.engine.CASE_TIMEOUT_S`; 0 = none) ``timeout`` rows; a worker is replaced
    after those and after ``max_cases_per_worker`` cases. ``resume`` skips ``crashed`` and
    ``timeout`` rows like any other unless ``retry_failed``, which runs them again.
    Raises :class:`UsageError` for bad input (including an unknown order, a band outside
    (0, 0.5), an unknown timer option or engine, or engine options that do not fit the device)
    before anything runs or any file is opened; ``KeyboardInterrupt`` is re-raised after the
    finished rows are saved and every worker is stopped.
    """
    import torch

    if order not in ORDERS:
        raise UsageError(f"unknown order {order!r} (valid: {', '.join(ORDERS)})")
    timer = validate.sweep_options(timer, device, seed, order=order)
    plan = make_plan(op, suite, shapes, dtypes, backends)
    if not (isinstance(band, (int, float)) and 0 < band < 0.5):
        raise UsageError(f"band must be a fraction in (0, 0.5), e.g. 0.01 for +-1%, got {band!r}")
    if baseline is not None and baseline not in plan.backends:
        raise UsageError(f"baseline {baseline!r} is not among the backends ({', '.join(plan.backends)})")
    timer_opts = dict(timer or {})
    if order == "interleaved":
        _interleaved_opts(timer_opts)
    kind = choose_engine(engine, device, devices=devices, workers=workers, case_timeout=case_timeout,
                         max_cases=max_cases_per_worker, op=plan.op)
    if retry_failed and not resume:
        raise UsageError("--retry-failed runs the crashed and timeout rows of a file again: it needs --resume")
    outp = R.check_path(out) if out is not None else None
    old = _previous(outp, resume, overwrite) if outp else R.empty_frame()
    if retry_failed and len(old):
        old = old[~old["status"].isin(["crashed", "timeout"])].reset_index(drop=True)
    done = {tuple(r) for r in old[list(R.KEY)].astype(str).itertuples(index=False)} if len(old) else set()
    ray_gpus = None if device is None else torch.device(device).type == "cuda"
    device = torch.device(device) if device is not None else default_device()
    env = ENV.collect()
    ctx = RunContext(device, env)
    fp = {**env.fingerprint(), "flyexplore": env.versions.get("flyexplore", "")}
    run_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    todo = [(c, d, b) for c, d, b in plan.items() if (plan.op.name, c.label, d, b) not in done]
    writer = _Writer(outp, old)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), disable=not progress, unit="row", desc=f"{plan.op.name} sweep")

    def emit(case, dtype, b, cols, info):
        row = _base_row(plan.op, case, dtype, b, run_id, {**fp, **(info.get("fp") or {})})
        row.update(cols)
        row["worker"] = info.get("worker")
        if not row.get("device_id"):
            row["device_id"] = info.get("device_id")
        row["timestamp"] = _now()
        writer.add(row)
        bar.update(1)
        if on_row is not None:
            on_row(row)

    by_case: dict[tuple[str, str], list[str]] = {}
    for c, d, b in todo:
        by_case.setdefault((c.label, d), []).append(b)
    cases = {c.label: c for c, _ in plan.pairs}
    settings = None
    if kind != "in-process":
        settings = Settings(op_ref(plan.op), order, timer_opts, trace, seed, band, baseline)
    try:
        if kind == "in-process":
            inproc = {"worker": "in-process", "device_id": physical_device_id(device)}
            for (label, dtype), bks in by_case.items():
                if should_stop is not None and should_stop():
                    break
                case = cases[label]
                bar.set_postfix_str(f"{label} {dtype}")
                stopped = False
                for b, cols in run_case(plan.op, case, dtype, bks, ctx, order=order, timer_opts=timer_opts,
                                        trace=trace, seed=seed, band=band, baseline=baseline,
                                        should_stop=should_stop):
                    if b is None:
                        stopped = True
                        break
                    emit(case, dtype, b, cols, inproc)
                if stopped:
                    break
        else:
            pos = {k: i for i, k in enumerate(by_case)}
            tasks = [Task(pos[(label, dtype)], cases[label], dtype, tuple(bks),
                          case_cost(plan.op, cases[label], dtype))
                     for (label, dtype), bks in by_case.items()]
            task_row = lambda t, b, cols, info: emit(t.case, t.dtype, b, cols, info)  # noqa: E731
            if kind == "ray":
                limit, max_cases = limits(case_timeout, max_cases_per_worker)
                run_ray(tasks, settings, device=device, workers=workers, case_timeout=limit, max_cases=max_cases,
                        address=ray_address, emit=task_row, should_stop=should_stop, status=bar.set_postfix_str,
                        use_gpus=ray_gpus)
            else:
                run_tasks(tasks, settings, kind, device=device, env=env, devices=devices, workers=workers,
                          case_timeout=case_timeout, max_cases=max_cases_per_worker, emit=task_row,
                          should_stop=should_stop, status=bar.set_postfix_str)
            rank = {(c.label, d, b): i for i, (c, d, b) in enumerate(plan.items())}
            writer.rows.sort(key=lambda r: rank.get((r["case"], r["dtype"], r["backend"]), -1))
    finally:
        bar.close()
        result = writer.close()
    return result
