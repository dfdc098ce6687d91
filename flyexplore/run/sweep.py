"""Sweeps that keep every result.

:func:`run_sweep` runs a :class:`~flyexplore.run.spec.SweepSpec` (what the sweep is, every option
checked when the spec was made) -- every (case, dtype, backend) of its plan -- and returns a result
set (:mod:`flyexplore.results.table`). With ``out``, the sweep holds ``out``'s writer lock (a second
sweep on it is refused), each finished row is committed at once to a SQLite journal
(``<out>.journal.sqlite``, :mod:`flyexplore.run.journal`: a row is never lost and never written
twice), and the result file is written from the journal, atomically, when the sweep ends, is
stopped, or is interrupted (Ctrl-C). After a hard crash or a full disk the journal remains;
``resume=True`` goes on from it and skips the (op, case, dtype, backend) keys already there; a
resume with another plan is refused unless ``extend``. A failing case becomes a row (``unavailable``, ``error`` or ``oom``, with
the message) and the sweep goes on. Where cases run -- this process, worker processes (the
default on a GPU; a crash or hang becomes ``crashed``/``timeout`` rows), several GPUs or Ray --
is :mod:`flyexplore.run.engine`'s part; the unit of work is :func:`run_case`. The spec travels
with the rows: the result frame's ``attrs["sweeps"]`` (:func:`sweep_record`).

Order (``order=``): ``interleaved`` (the default, GPU and CPU) builds, compiles and warms every
backend of a case first, then times them in shared rounds until every label is decided and every
median's interval tight, or a time cap ends the case
(:func:`flyexplore.measure.interleaved.measure_interleaved`), so that all backends see one clock
regime; each row gets its raw samples, the 95% interval of its median, and its speedup against the case's
baseline with an interval and a label (:mod:`flyexplore.measure.stats`), plus the device state
(:mod:`flyexplore.measure.devstate`). ``block`` is the old order: each backend's calls in one block
(:class:`flyexplore.measure.timing.Timer`), then the next backend; its speedups get only the wider,
unpaired intervals. After timing, each backend is built again on fresh input values and its
output checked once more (``recheck_ok``), so that a stale JIT cache or a kernel that returns
a previous result cannot pass as a speedup.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.measure.devstate import default_device, sampler_for
from flyexplore.ops.base import RunContext
from flyexplore.results import table as R
from flyexplore.run import envab
from flyexplore.run._ray import run_ray
from flyexplore.run.cases import (
    _base_row,
    _now,
    case_cost,
    physical_device_id,
    run_case,
)
from flyexplore.run.engine import CaseSettings, Task, limits, run_tasks
from flyexplore.run.journal import Journal, JournalError, journal_path  # noqa: F401 - journal_path: re-exported
from flyexplore.run.memory import Guard, memory_check
from flyexplore.run.processes import PassRule, combine, pass_loop
from flyexplore.run.spec import TIME_NOTE_S, SweepSpec
from flyexplore.world import env as ENV

#: The result frame's ``attrs`` key holding :func:`sweep_record` of each run that wrote its rows.
SWEEPS_ATTR = "sweeps"
#: The returned frame's ``attrs`` key (not saved) holding one-line notes on what went wrong
#: around the rows: workers that could not start (their cases got ``crashed`` rows), a torn
#: journal line dropped. The command line prints them and exits non-zero for worker problems.
PROBLEMS_ATTR = "problems"
#: The returned frame's ``attrs`` key (not saved) holding notes that change no row: duplicate
#: plan entries folded (:attr:`flyexplore.run.plan.Plan.notes`), a torn old-journal line dropped.
NOTES_ATTR = "notes"


def sweep_record(spec: SweepSpec, run_id: str) -> dict:
    """What a run of ``spec`` leaves beside its rows: ``{"run_id", "fingerprint", "spec",
    "plan_fingerprint", "plan"}`` (:meth:`~flyexplore.run.spec.SweepSpec.fingerprint`,
    :meth:`~flyexplore.run.spec.SweepSpec.to_dict`, :meth:`~flyexplore.run.spec.SweepSpec.plan_dict`;
    JSON values). Rows find theirs by ``run_id``."""
    return {"run_id": run_id, "fingerprint": spec.fingerprint(), "spec": spec.to_dict(),
            "plan_fingerprint": spec.plan_fingerprint(), "plan": spec.plan_dict()}


def _through_links(out) -> Path:
    """``out``, or where it points when it is a symbolic link: the file is written (and locked)
    there, so a link and its target are one output, and the link stays a link."""
    p = Path(out)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


class _Memory:
    """The rows of a sweep without an output file (the same calls as a :class:`Journal`)."""

    def __init__(self, record: dict):
        self.rows, self.record, self.notes, self.rank = [], record, [], {}
        self.passes: dict = {}

    def done(self) -> set:
        return set()

    def add_passes(self, rows) -> None:
        for k, row in rows:
            self.passes.setdefault((row["case"], row["dtype"]), {}).setdefault(int(k), {})[row["backend"]] = row

    def pass_rows(self) -> dict:
        return {}

    def pending(self) -> int:
        final = {(r["case"], r["dtype"], r["backend"]) for r in self.rows}
        return sum(1 for (c, d), per in self.passes.items() for rows in per.values() for b in rows
                   if (c, d, b) not in final)

    def add(self, row: dict) -> bool:
        self.rows.append(row)
        return True

    def add_record(self, record: dict) -> None:
        pass  # the frame carries its one record (frame)

    def frame(self) -> pd.DataFrame:
        self.rows.sort(key=lambda r: self.rank.get((r["case"], r["dtype"], r["backend"]), -1))
        df = R.frame(self.rows)
        df.attrs[SWEEPS_ATTR] = [self.record]
        return df

    def finish(self, df) -> None:
        pass

    def close(self) -> None:
        pass


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

    Before anything runs: a case whose estimated memory is over the device's free memory or
    ``max_memory`` gets ``refused`` rows (:func:`flyexplore.run.memory.memory_check`: measured on
    small cases where it matters); on the CPU a case over half of that limit runs in a watched
    worker process, even in an in-process sweep, and one that grows past the limit there (or that
    the kernel's OOM killer takes) gets ``oom`` rows naming its estimate and the limit.
    Workers that cannot start leave ``crashed`` rows for the cases they did not run, and a line
    each in the returned frame's ``attrs["problems"]`` (:data:`PROBLEMS_ATTR`); notes that
    change no row (duplicates folded, a torn old-journal line dropped) are in
    ``attrs["notes"]``.

    Raises :class:`UsageError` when ``spec`` is not a SweepSpec, for the output file (unknown
    extension, not writable, there without ``resume``/``overwrite``, damaged, another plan's
    without ``extend``, locked by another sweep: its pid named) and when every case is over the
    memory limit -- before anything runs and with every file untouched;
    :class:`~flyexplore.run.journal.JournalError` (a :class:`UsageError`) when a journal write
    fails mid-sweep (every row committed before is kept for ``resume``);
    ``KeyboardInterrupt`` is re-raised after the finished rows are saved and every worker is
    stopped.
    """
    import torch

    if not isinstance(spec, SweepSpec):
        raise UsageError(f"run_sweep takes a SweepSpec (flyexplore.run.spec), got {type(spec).__name__}; "
                         "fx.sweep(op, ...) builds one from keywords")
    plan, device, kind = spec.plan, spec.device, spec.engine_kind
    outp = R.check_path(_through_links(spec.out)) if spec.out is not None else None
    ray_gpus = None if device is None else torch.device(device).type == "cuda"
    device = torch.device(device) if device is not None else default_device()
    run_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    record = sweep_record(spec, run_id)
    keys = [(c.label, d, b) for c, d, b in plan.items()]
    mem = memory_check(plan, device, spec.max_memory,  # UsageError when every case is over
                       copies=len(spec.environments) if kind == "envab" else 1)
    refusals = mem.refused
    # on the CPU a case near the limit runs in a watched worker process, never in this one
    guards = {k: Guard.of(mem, k) for k in mem.near} if device.type == "cpu" and kind in ("in-process", "local") \
        else {}
    if progress and spec.time_bound_s() > TIME_NOTE_S:
        print(f"flyexplore: note: {spec.time_note()}", file=sys.stderr)
    ab = None
    if kind == "envab":  # the first pair of workers starts before any file is opened: a bad env writes nothing
        ab = _ABStart(spec, device, True)
    try:
        if outp is None:
            writer = _Memory(record)
            writer.rank = {k: i for i, k in enumerate(keys)}
        else:
            writer = Journal.open(outp, resume=spec.resume, overwrite=spec.overwrite, extend=spec.extend,
                                  retry_failed=spec.retry_failed, plan_fingerprint=spec.plan_fingerprint(),
                                  plan=spec.plan_dict(), op=plan.op.name, keys=keys)
    except BaseException:
        if ab is not None:
            ab.close()
        raise
    try:
        writer.notes.extend(mem.notes)
        return _run(spec, writer, record, device, kind, ray_gpus, refusals, progress, on_row, should_stop, ab, guards)
    finally:
        writer.close()
        if ab is not None:
            ab.close()


class _ABStart:
    """An environment A/B's setup and first pair of workers, started before the sweep opens its
    output (:func:`flyexplore.run.envab.start_first_pair`: a bad environment is one line, nothing
    written); what each environment's worker reported (:func:`flyexplore.run.envab.env_report`:
    what is being compared) is printed to stderr when ``say``, progress bar or not."""

    def __init__(self, spec: SweepSpec, device, say: bool):
        self.logs = tempfile.TemporaryDirectory(prefix="flyexplore-ab-")
        try:
            self.setup = envab.setup_of(spec, device, self.logs.name)
            self.pair = envab.start_first_pair(self.setup)
        except BaseException:
            self.logs.cleanup()
            raise
        self.notes = envab.check_hellos_differ(self.setup)   # a thread-count A/B on the CPU: refused by the spec
        if say:
            for line in envab.env_report(self.setup):
                print(f"flyexplore: {line}", file=sys.stderr)

    def close(self) -> None:
        if self.pair is not None:
            self.pair.stop()
            self.pair = None
        self.logs.cleanup()


def _run(spec, writer, record, device, kind, ray_gpus, refusals, progress, on_row, should_stop,
         ab: _ABStart | None = None, guards: dict | None = None) -> pd.DataFrame:
    """:func:`run_sweep` once its output is open: the rows not yet there, then the final file.
    ``guards``: ``{(case label, dtype): Guard}`` of the CPU cases near the memory limit, which
    run in a watched worker process (in-process sweeps too)."""
    plan = spec.plan
    done = writer.done()
    writer.add_record(record)
    env = ENV.collect()
    ctx = RunContext(device, env)
    fp = {**env.fingerprint(), **env.code_columns()}
    run_id = record["run_id"]
    todo = [(c, d, b) for c, d, b in plan.items() if (plan.op.name, c.label, d, b) not in done]
    problems: list[str] = []

    from tqdm.auto import tqdm

    total = len(todo)
    if kind == "envab":   # an A/B's bar counts pass rows: each arm once in each pair of workers
        n_ref = sum(1 for c, d, _ in todo if (c.label, d) in refusals)
        have = sum(len(r) for per in writer.pass_rows().values() for r in per.values())
        total = n_ref + max((len(todo) - n_ref) * ab.setup.pairs - have, 0)
    bar = tqdm(total=total, disable=not progress, unit="row", desc=f"{plan.op.name} sweep")

    def make_row(case, dtype, b, cols, info):
        row = _base_row(plan.op, case, dtype, b, run_id, {**fp, **(info.get("fp") or {})})
        row["plan"] = record["plan_fingerprint"]
        row.update(cols)
        row.update(plan.meta.get((case.label, dtype), {}))
        row["worker"] = info.get("worker") or row.get("worker")
        if not row.get("device_id"):
            row["device_id"] = info.get("device_id")
        row["timestamp"] = _now()
        return row

    def write(row):
        if writer.add(row) and on_row is not None:
            on_row(row)

    def emit(case, dtype, b, cols, info, tick=True):
        row = make_row(case, dtype, b, cols, info)
        if tick:
            bar.update(1)
        write(row)

    refused = [(c, d, b) for c, d, b in todo if (c.label, d) in refusals]
    for c, d, b in refused:
        extra = {"env": b.partition("@")[2]} if kind == "envab" else {}   # an A/B's arm keeps its env
        emit(c, d, b, {"status": "refused", "message": refusals[(c.label, d)], **extra},
             {"worker": None, "device_id": None})
    todo = [t for t in todo if (t[0].label, t[1]) not in refusals]

    by_case: dict[tuple[str, str], list[str]] = {}
    for c, d, b in todo:
        by_case.setdefault((c.label, d), []).append(b)
    cases = {c.label: c for c, _ in plan.pairs}
    settings = CaseSettings.of(spec) if kind != "in-process" else None
    try:
        if kind == "envab":
            st = ab.setup
            passes = writer.pass_rows()
            work = [(c, d) for c, d in plan.pairs if (c.label, d) not in refusals
                    and any((plan.op.name, c.label, d, a) not in done for a in plan.backends)]

            def add_final(case, dtype, a, row):
                row.update(envab.env_columns(st, a))
                write(row)

            problems += envab.run_passes(st, work, passes, first_pair=ab.pair, make_row=make_row,
                                         add_passes=writer.add_passes, add_final=add_final,
                                         sampler=sampler_for(device), bar=bar, should_stop=should_stop,
                                         status=bar.set_postfix_str, platform=env.platform, run_id=run_id)
            ab.pair = None   # run_passes stopped it
            writer.notes.extend(ab.notes)
            if st.start_s:
                first, rest = st.start_s[0], st.start_s[1:]
                later = (f"; each later pass waited {min(rest):.1f}-{max(rest):.1f} s for its pair (a spare, launched "
                         "while the pass before it measured; a failed start's wait included)" if rest else "")
                writer.notes.append(f"{len(st.start_s)} pair(s) of workers: the first started in {first:.1f} s"
                                    f"{later} (not counted in any case's time)")
            if st.failed_starts:
                n = len(st.failed_starts)
                writer.notes.append(f"{n} pair start{'s' if n != 1 else ''} failed: " + "; ".join(
                    f"{label}: {why[:300]}" for label, why in st.failed_starts[:3]) + ("; ..." if n > 3 else ""))
        elif kind == "in-process":
            inproc = {"worker": "in-process", "device_id": physical_device_id(device)}
            guarded, stopped = _guarded(spec, by_case, guards or {}, cases, writer.notes), False
            for (label, dtype), bks in by_case.items():
                if should_stop is not None and should_stop():
                    stopped = True
                    break
                if (label, dtype) in guarded:
                    continue
                case = cases[label]
                bar.set_postfix_str(f"{label} {dtype}")
                for b, cols in run_case(plan.op, case, dtype, bks, ctx, order=spec.order,
                                        timer_opts=dict(spec.timer), trace=spec.trace, seed=spec.seed,
                                        band=spec.band, baseline=spec.baseline, should_stop=should_stop):
                    if b is None:
                        stopped = True
                        break
                    emit(case, dtype, b, cols, inproc)
                if stopped:
                    break
            if guarded and not stopped:   # near the memory limit: one watched worker process per case
                problems += run_tasks(list(guarded.values()), CaseSettings.of(spec), "local", device=device, env=env,
                                      workers=1, case_timeout=spec.case_timeout, max_cases=1,
                                      emit=lambda t, b, cols, info: emit(t.case, t.dtype, b, cols, info),
                                      should_stop=should_stop, status=bar.set_postfix_str,
                                      start_timeout=spec.worker_start_timeout)
        else:
            pos = {k: i for i, k in enumerate(by_case)}
            tasks = [Task(pos[(label, dtype)], cases[label], dtype, tuple(bks),
                          case_cost(plan.op, cases[label], dtype), (guards or {}).get((label, dtype)))
                     for (label, dtype), bks in by_case.items()]
            task_row = lambda t, b, cols, info: emit(t.case, t.dtype, b, cols, info)  # noqa: E731
            if kind == "ray":
                limit, max_cases = limits(spec.case_timeout, spec.max_cases_per_worker)
                got = run_ray(tasks, settings, device=device, workers=spec.workers, case_timeout=limit,
                              max_cases=max_cases, address=spec.ray_address, emit=task_row,
                              should_stop=should_stop, status=bar.set_postfix_str, use_gpus=ray_gpus,
                              start_timeout=spec.worker_start_timeout)
            else:
                def one_pass(ts, sink):
                    return run_tasks(ts, settings, kind, device=device, env=env, devices=spec.devices,
                                     workers=spec.workers, case_timeout=spec.case_timeout,
                                     max_cases=spec.max_cases_per_worker, emit=sink, should_stop=should_stop,
                                     status=bar.set_postfix_str, start_timeout=spec.worker_start_timeout)

                n = spec.processes or 1
                if n > 1:
                    have = writer.pass_rows()
                    bar.total = len(refused) + max(len(todo) * n - _count(have, todo), 0)
                    bar.refresh()
                    got = _passes(tasks, n, one_pass, _Passes(have, writer.add_passes, make_row, write, run_id),
                                  spec.band, bar, should_stop, env.platform)
                else:
                    got = one_pass(tasks, task_row)
            problems += list(got or [])
    except JournalError:
        bar.close()  # every committed row is in the journal, for --resume: no final write now
        raise
    except BaseException:
        bar.close()
        with contextlib.suppress(Exception):  # the first error is the one to report; rows stay journaled
            _finish(writer, spec, env.platform)
        raise
    bar.close()
    result = _finish(writer, spec, env.platform)
    result.attrs[PROBLEMS_ATTR] = problems
    result.attrs[NOTES_ATTR] = list(getattr(plan, "notes", ())) + list(writer.notes)
    return result


def _guarded(spec: SweepSpec, by_case: dict, guards: dict, cases: dict, notes: list) -> dict:
    """The tasks of an in-process sweep's cases near the memory limit (``guards``), each to run in a
    watched worker process (:func:`flyexplore.run.engine.run_tasks`); ``{}`` (they run here, a
    note in ``notes`` says why) for an operator a worker cannot import."""
    near = [(k, g) for k, g in guards.items() if k in by_case and g is not None]
    if not near:
        return {}
    try:
        CaseSettings.of(spec)
    except UsageError as exc:
        notes.append(f"{len(near)} case(s) near the memory limit ran in this process: {exc}")
        return {}
    return {k: Task(i, cases[k[0]], k[1], tuple(by_case[k]), 0.0, g) for i, (k, g) in enumerate(near)}


def _finish(writer, spec: SweepSpec, platform: str | None) -> pd.DataFrame:
    """The result frame, and the result file written from it -- unless the journal still holds
    pass rows of cases missing a pass (an environment A/B's or ``--processes``', stopped or
    interrupted): the journal then stays for ``--resume`` and no file is written. Without an
    output file such rows are combined over the passes that ran (each row's ``processes`` says
    how many)."""
    if isinstance(writer, _Memory) and writer.pending():
        final = {(r["case"], r["dtype"], r["backend"]) for r in writer.rows}
        ab = spec.engine_kind == "envab"
        wanted, kind = (spec.pairs_or_default, "pairs") if ab else (spec.processes or 1, "processes")
        conf = (PassRule(spec.pairs_or_default, spec.pairs_max, spec.band, platform, auto=spec.pairs_auto).confidence
                if ab else S.CONFIDENCE)
        for (c, d), per in writer.passes.items():
            arms = sorted({b for rows in per.values() for b in rows})
            for b in arms:
                if (c, d, b) in final:
                    continue
                rows = [per[k][b] for k in sorted(per) if b in per[k]]
                row = combine(rows, wanted, spec.band, platform, kind=kind, confidence=conf)
                writer.add(row)
    result = writer.frame()
    if not (isinstance(writer, Journal) and writer.pending()):
        writer.finish(result)
    return result


def _count(have: dict, todo) -> int:
    """How many of ``todo``'s ``(case, dtype, backend)`` pass rows are in ``have``
    (``{(case, dtype): {pass: {backend: row}}}``)."""
    return sum(1 for c, d, b in todo for rows in have.get((c.label, d), {}).values() if b in rows)


class _Passes:
    """Where ``--processes`` keeps its pass rows: ``have`` (``{(case, dtype): {pass: {backend:
    row}}}``, a resume's from the journal), ``add`` (:meth:`flyexplore.run.journal.Journal.add_passes`:
    each pass row committed as it comes), ``make_row`` (a full result row from a worker's columns)
    and ``write`` (a combined row to the result rows, given this run's ``run_id``)."""

    def __init__(self, have: dict, add: Callable, make_row: Callable, write: Callable, run_id: str):
        self.have, self.add, self.make_row, self.write, self.run_id = have, add, make_row, write, run_id

    def rows(self, t, k: int) -> dict:
        return self.have.get((t.case.label, t.dtype), {}).get(k, {})


def _passes(tasks, n: int, one_pass, store: _Passes, band: float, bar, should_stop,
            platform: str | None = None) -> list[str]:
    """``--processes n``: run ``tasks`` ``n`` times through the one pass loop of fresh workers
    (:func:`flyexplore.run.processes.pass_loop`, the environment A/B's too), each pass in new worker
    processes (``one_pass(tasks, sink)``: :func:`flyexplore.run.engine.run_tasks`, whose pool starts
    its own workers and stops them at the end) with the case order rotated
    (:func:`flyexplore.run.processes.rotated`). Each row of a pass is committed to the journal as it
    comes (``store``, a :class:`_Passes`); a resume's passes already there are not run again (a
    pass runs only the backends of each case it is missing). A case's rows are written once,
    combined (:func:`flyexplore.run.processes.combine`), when its last pass is in. Stopped or
    interrupted, the pass rows stay in the journal for ``--resume`` (without an output file the
    sweep's end combines what ran: :func:`_finish`). Returns the passes' problems."""
    rule = PassRule(n, n, band, platform, auto=False, kind="processes")
    by_key = {(t.case.label, t.dtype): t for t in tasks}

    def finalize(key) -> None:
        t = by_key[key]
        for b, row in rule.combined(store.have.get(key, {}), t.backends).items():
            row["run_id"], row["timestamp"] = store.run_id, _now()
            store.write(row)

    def run_pass(k: int, keys: list, close: Callable) -> tuple[list, bool]:
        todo = [replace(by_key[key], backends=tuple(b for b in by_key[key].backends if b not in store.rows(by_key[key], k)))
                for key in keys]
        bar.set_description(f"{str(getattr(bar, 'desc', '') or 'sweep').split(' (pass')[0]} (pass {k + 1}/{n})")

        def sink(t, b, cols, info):
            row = store.make_row(t.case, t.dtype, b, cols, info)
            store.add([(k, row)])
            store.have.setdefault((t.case.label, t.dtype), {}).setdefault(k, {})[b] = row
            bar.update(1)
            close((t.case.label, t.dtype))

        return [f"pass {k + 1}/{n}: {p}" for p in one_pass([t for t in todo if t.backends], sink) or []], False

    return pass_loop(list(by_key), rule, store.have, lambda key: by_key[key].backends, run_pass, finalize,
                     should_stop)
