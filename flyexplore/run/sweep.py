"""Sweeps that keep every result.

:func:`run_sweep` runs a :class:`~flyexplore.run.spec.SweepSpec` (what the sweep is, every option
checked when the spec was made) -- every (case, dtype, backend) of its plan -- and returns a result
set (:mod:`flyexplore.results.table`). With ``out``, each finished row is appended at once to a journal
(``<out>.partial.jsonl``, flushed and fsynced), and the result file is written atomically when
the sweep ends, is stopped, or is interrupted (Ctrl-C). After a hard crash the journal remains;
``resume=True`` reads the result file and the journal and skips the (op, case, dtype, backend)
keys already there. A failing case becomes a row (``unavailable``, ``error`` or ``oom``, with
the message) and the sweep goes on. Where cases run -- this process, worker processes (the
default on a GPU; a crash or hang becomes ``crashed``/``timeout`` rows), several GPUs or Ray --
is :mod:`flyexplore.run.engine`'s part; the unit of work is :func:`run_case`. The spec travels
with the rows: the result frame's ``attrs["sweeps"]`` (:func:`sweep_record`).

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
from pathlib import Path
from typing import Callable

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure.devstate import default_device
from flyexplore.ops.base import RunContext
from flyexplore.results import table as R
from flyexplore.run._ray import run_ray
from flyexplore.run.cases import (
    _base_row,
    _now,
    case_cost,
    physical_device_id,
    run_case,
)
from flyexplore.run.engine import CaseSettings, Task, limits, run_tasks
from flyexplore.run.spec import SweepSpec
from flyexplore.world import env as ENV

#: The result frame's ``attrs`` key holding :func:`sweep_record` of each run that wrote its rows.
SWEEPS_ATTR = "sweeps"


def journal_path(out: str | os.PathLike) -> Path:
    """The append-only journal beside a result file: ``<out>.partial.jsonl``."""
    return Path(str(out) + ".partial.jsonl")


def sweep_record(spec: SweepSpec, run_id: str) -> dict:
    """What a run of ``spec`` leaves beside its rows: ``{"run_id", "fingerprint", "spec"}``
    (:meth:`~flyexplore.run.spec.SweepSpec.fingerprint`, :meth:`~flyexplore.run.spec.SweepSpec.to_dict`;
    JSON values). Rows find theirs by ``run_id``."""
    return {"run_id": run_id, "fingerprint": spec.fingerprint(), "spec": spec.to_dict()}


class _Writer:
    """Appends rows to the journal; writes the final file atomically on close, with the runs'
    :func:`sweep_record` list in the frame's ``attrs`` (Parquet keeps it)."""

    def __init__(self, out: Path | None, old: pd.DataFrame, records: list[dict]):
        self.out, self.old, self.rows, self.records = out, old, [], records
        self.journal = journal_path(out) if out else None

    def add(self, row: dict):
        self.rows.append(row)
        if self.journal:
            with open(self.journal, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def frame(self) -> pd.DataFrame:
        df = R.concat([self.old, R.frame(self.rows)])
        df.attrs[SWEEPS_ATTR] = list(self.records)
        return df

    def close(self) -> pd.DataFrame:
        df = self.frame()
        if self.out:
            R.save(df, self.out)
            if self.journal.exists():
                self.journal.unlink()
        return df


def _previous(out: Path, resume: bool, overwrite: bool) -> tuple[pd.DataFrame, list[dict]]:
    """The rows already in ``out`` and its journal (with ``resume``), and the sweep records of
    the file (Parquet keeps them); refuses an existing file without ``resume``/``overwrite``."""
    jp = journal_path(out)
    if not resume:
        if (out.exists() or jp.exists()) and not overwrite:
            raise UsageError(f"output file {str(out)!r} exists (use --resume to continue it, "
                             "--overwrite to replace it, or choose another path)")
        if jp.exists():
            jp.unlink()
        return R.empty_frame(), []
    frames = [R.load(out)] if out.exists() else []
    records = list(frames[0].attrs.get(SWEEPS_ATTR, [])) if frames else []
    if jp.exists():
        frames.append(R.load(jp))
    return R.concat(frames), records


def run_sweep(spec: SweepSpec, *, progress: bool = True, on_row: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> pd.DataFrame:
    """Run ``spec`` (a :class:`~flyexplore.run.spec.SweepSpec`: its options and their rules are
    there) and return its result set, resumed rows included; ``fx.sweep(op, ...)`` builds the
    spec and calls this.

    ``progress``: a progress bar (tqdm, on stderr). ``on_row(row)`` is called after each row is
    written; ``should_stop()`` is checked between cases (and between backends in block order);
    a true answer ends the sweep keeping every finished row (the widgets' Stop). These three
    watch this run; they are not part of the spec.

    Rows: ``order`` interleaved or block (see the module text); ``trace`` records what ran for
    every row (``observed``, ``autotune``); rows of the ``flydsl`` backend always get it, with
    ``flydsl_taken`` / ``flydsl_reason`` (see :mod:`flyexplore.insight.trace`). In workers
    (:mod:`flyexplore.run.engine`) a case that crashes its process becomes ``crashed`` rows,
    one past ``case_timeout`` seconds ``timeout`` rows. ``resume`` skips ``crashed`` and
    ``timeout`` rows like any other unless ``retry_failed``. The returned frame's
    ``attrs["sweeps"]`` lists :func:`sweep_record` of every run whose rows it holds (this one
    last; earlier ones as far as a resumed Parquet file kept them).

    Raises :class:`UsageError` when ``spec`` is not a SweepSpec, or for the output file
    (unknown extension, not writable, or there without ``resume``/``overwrite``) before anything
    runs or any file is opened; ``KeyboardInterrupt`` is re-raised after the finished rows are
    saved and every worker is stopped.
    """
    import torch

    if not isinstance(spec, SweepSpec):
        raise UsageError(f"run_sweep takes a SweepSpec (flyexplore.run.spec), got {type(spec).__name__}; "
                         "fx.sweep(op, ...) builds one from keywords")
    plan, device, kind = spec.plan, spec.device, spec.engine_kind
    outp = R.check_path(spec.out) if spec.out is not None else None
    old, records = _previous(outp, spec.resume, spec.overwrite) if outp else (R.empty_frame(), [])
    if spec.retry_failed and len(old):
        old = old[~old["status"].isin(["crashed", "timeout"])].reset_index(drop=True)
    done = {tuple(r) for r in old[list(R.KEY)].astype(str).itertuples(index=False)} if len(old) else set()
    ray_gpus = None if device is None else torch.device(device).type == "cuda"
    device = torch.device(device) if device is not None else default_device()
    env = ENV.collect()
    ctx = RunContext(device, env)
    fp = {**env.fingerprint(), "flyexplore": env.versions.get("flyexplore", "")}
    run_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    todo = [(c, d, b) for c, d, b in plan.items() if (plan.op.name, c.label, d, b) not in done]
    writer = _Writer(outp, old, records + [sweep_record(spec, run_id)])

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), disable=not progress, unit="row", desc=f"{plan.op.name} sweep")

    def emit(case, dtype, b, cols, info):
        row = _base_row(plan.op, case, dtype, b, run_id, {**fp, **(info.get("fp") or {})})
        row.update(cols)
        row.update(plan.meta.get((case.label, dtype), {}))
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
    settings = CaseSettings.of(spec) if kind != "in-process" else None
    try:
        if kind == "in-process":
            inproc = {"worker": "in-process", "device_id": physical_device_id(device)}
            for (label, dtype), bks in by_case.items():
                if should_stop is not None and should_stop():
                    break
                case = cases[label]
                bar.set_postfix_str(f"{label} {dtype}")
                stopped = False
                for b, cols in run_case(plan.op, case, dtype, bks, ctx, order=spec.order,
                                        timer_opts=dict(spec.timer), trace=spec.trace, seed=spec.seed,
                                        band=spec.band, baseline=spec.baseline, should_stop=should_stop):
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
                limit, max_cases = limits(spec.case_timeout, spec.max_cases_per_worker)
                run_ray(tasks, settings, device=device, workers=spec.workers, case_timeout=limit,
                        max_cases=max_cases, address=spec.ray_address, emit=task_row, should_stop=should_stop,
                        status=bar.set_postfix_str, use_gpus=ray_gpus)
            else:
                run_tasks(tasks, settings, kind, device=device, env=env, devices=spec.devices,
                          workers=spec.workers, case_timeout=spec.case_timeout,
                          max_cases=spec.max_cases_per_worker, emit=task_row, should_stop=should_stop,
                          status=bar.set_postfix_str)
            rank = {(c.label, d, b): i for i, (c, d, b) in enumerate(plan.items())}
            writer.rows.sort(key=lambda r: rank.get((r["case"], r["dtype"], r["backend"]), -1))
    finally:
        bar.close()
        result = writer.close()
    return result
