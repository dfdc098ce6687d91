"""The one case driver: a case built, warmed, timed round by round and finished on one or more
places, and its rows assembled once.

Every place a case runs is a place of :mod:`flyexplore.run.place`: this interpreter
(:class:`~flyexplore.run.place.LocalPlace`: a sweep's in-process cases, a sweep worker's, a
``--processes`` pass's, a memory probe's, all through :func:`flyexplore.run.cases.run_case`) or an
environment's worker process (:class:`flyexplore.run.envab.EnvWorker`: an environment A/B's pair
of places, or a build series' several). :func:`drive_case` speaks the one protocol to them:

1. ``case`` on each place (the base place first: its checked outputs are saved, and each other
   place compares its own with them; the input digests must agree);
2. interleaved warm-up turns (:func:`flyexplore.measure.interleaved.warm_up`);
3. timed rounds under the sweep's sequential rule
   (:func:`flyexplore.measure.interleaved.sequential_rounds`): with one place a turn is a chunk
   of rounds, as in-process timing always was; with several, each round every place takes one
   turn in rotated order (A B C, B C A, C A B, ...), and each turn starts with one untimed call
   (the first call after another process held the device);
4. ``finish`` on each place: the profiled round (``event-gated``), what ran, the recheck on fresh
   inputs, the family's breakdown;
5. the rows: each arm's :class:`~flyexplore.measure.timing.Measurement`, its speedup against its
   baseline arm over paired rounds with an interval and a label, the device state, why the rounds
   ended, and -- with several places -- the input digest and the cross-place output check.

The timing mode is the family's (:attr:`Operator.timing_mode`, e.g. ``event`` for a model step)
unless one is asked for (:func:`how_for`), on every place alike.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from flyexplore.measure import interleaved as IL
from flyexplore.measure import modes
from flyexplore.measure import stats as S
from flyexplore.measure.devstate import case_columns
from flyexplore.results.arms import arm_name, split_arm   # not results.table: a worker's driver imports no pandas
from flyexplore.run import build as B
from flyexplore.run.place import WorkerDied, WorkerFailed, WorkerHung  # noqa: F401 - raised through here

#: Least calls of each arm in a turn of several places (when ``calls_per_round`` is not given): a
#: turn starts with one untimed call, which for a call longer than
#: :data:`flyexplore.measure.interleaved.BLOCK_MS` would otherwise double the turn's device time
#: (on an H200, 8192x8192x8192 bf16, 1.4 ms a call).
MIN_CALLS = 2


def how_for(op, timer: dict, gpu: bool) -> tuple[str, dict]:
    """``(effective interleaved mode, the other timer keywords)`` of a case of ``op`` with the
    interleaved keywords ``timer`` (:func:`flyexplore.run.spec.interleaved_kwargs`): the mode asked
    for, else on a GPU the family's own (:attr:`~flyexplore.ops.base.Operator.timing_mode`), else
    the device's default (:func:`flyexplore.measure.modes.effective`)."""
    t = dict(timer)
    mode = t.pop("mode", modes.DEFAULT)
    if gpu and getattr(op, "timing_mode", None) and mode == "auto":
        mode = op.timing_mode
    return modes.effective(mode, "interleaved", gpu), t


@dataclass
class CaseJob:
    """One case to drive: the operator (``op``; ``op_ref``, its import reference for a worker
    process), the :class:`~flyexplore.ops.base.Case`, ``dtype``, each place's backends
    (``arms``: place name -> backend names), the baseline arm (``base_arm``; None: the family's
    baseline backend in the base place, else the first that built), ``seed``, ``trace``, ``band``,
    the interleaved timer keywords without the mode (``timer``) and the effective mode (``how``;
    ``mode_fixed``: it was asked for, so a profiler without device time is an error), whether the
    device is a GPU, and ``named``: arms are ``backend@place`` (an A/B) rather than backends."""

    op: Any
    case: Any
    dtype: str
    arms: dict
    how: str
    gpu: bool
    op_ref: str | None = None
    base_arm: str | None = None
    seed: int = 0
    trace: bool = False
    band: float = S.BAND
    timer: dict = field(default_factory=dict)
    named: bool = False
    mode_fixed: bool = False
    inputs: Any = None      # made already, for the one local place (run_case's)
    ref: Any = None

    def arm(self, backend: str, place: str) -> str:
        return arm_name(backend, place) if self.named else backend

    def place_of(self, arm: str) -> str:
        return split_arm(arm)[1] if self.named else next(iter(self.arms))

    def backend_of(self, arm: str) -> str:
        return split_arm(arm)[0] if self.named else arm

    def all_arms(self) -> list[str]:
        return [self.arm(b, p) for p, bs in self.arms.items() for b in bs]


def baselines_of(job: CaseJob, ok: list[str], base_place: str) -> tuple[str | None, dict]:
    """``(base arm, {arm: the arm its speedup is taken against, or None})`` over the arms that
    built (``ok``): an arm of another place against the same backend in the base place where that
    built, else against the base arm -- the job's, else the family's baseline backend in the base
    place, else the first arm of the base place that built, else the first that built."""
    if not ok:
        return None, {}
    if job.base_arm in ok:
        base = job.base_arm
    else:
        mine = [a for a in ok if job.place_of(a) == base_place]
        base = next((a for a in mine if job.op.get_backend(job.backend_of(a)).baseline), mine[0] if mine else ok[0])
    out = {}
    for a in ok:
        b, p = job.backend_of(a), job.place_of(a)
        twin = job.arm(b, base_place)
        out[a] = None if a == base else twin if (p != base_place and twin in ok) else base
    return base, out


def _request(w, msg: dict, deadline: float) -> dict:
    """``w.request``, the place attached to what it raises (``exc.worker``)."""
    try:
        return w.request(msg, deadline)
    except (WorkerDied, WorkerHung, WorkerFailed) as exc:
        exc.worker = w
        raise


class _Turns:
    """The round source of :func:`flyexplore.measure.interleaved.sequential_rounds` over places:
    one place runs a chunk of rounds in one turn (its own sampler reads the clock per round); several
    take one turn each per round, in rotated order, the driver reading the clock once per round."""

    def __init__(self, job: CaseJob, places: list, sampler, calls: int, deadline: float):
        self.job, self.places, self.sampler, self.calls, self.deadline = job, places, sampler, calls, deadline
        self.how = job.how
        self.overhead_ms: list[float] = []   # per turn: round trip less the place's own time in it

    def _take(self, w, got: dict, rounds: dict, events: dict, kernels: dict) -> None:
        for b, rr in got["rounds"].items():
            a = self.job.arm(b, w.name)
            rounds.setdefault(a, []).extend(rr)
            events.setdefault(a, []).extend((got.get("events") or {}).get(b, []))
            for k, d in ((got.get("kernels") or {}).get(b) or {}).items():
                kernels.setdefault(a, {}).setdefault(k, []).extend(d)

    def _turn(self, w, first: int, n: int) -> dict:
        t0 = time.perf_counter()
        got = _request(w, {"cmd": "turn", "round": first, "rounds": n, "calls": self.calls}, self.deadline)
        if got.get("restart"):
            self.how = got.get("how") or "event"
            raise IL.RestartRounds(w.name)
        self.overhead_ms.append((time.perf_counter() - t0) * 1e3 - float(got.get("busy_ms") or 0.0))
        return got

    def run(self, n_rounds: int, first: int) -> IL.Chunk:
        rounds: dict = {}
        events: dict = {}
        kernels: dict = {}
        if len(self.places) == 1:
            w = self.places[0]
            got = self._turn(w, first, n_rounds)
            self._take(w, got, rounds, events, kernels)
            return IL.Chunk(rounds, events, kernels, list(got.get("clocks") or [None] * n_rounds))
        clocks = []
        for r in range(n_rounds):
            clocks.append(self.sampler.clock_mhz() if self.sampler is not None else None)
            k0 = (first + r) % len(self.places)
            for w in self.places[k0:] + self.places[:k0]:
                self._take(w, self._turn(w, first + r, 1), rounds, events, kernels)
        return IL.Chunk(rounds, events, kernels, clocks)


def drive_case(places: list, job: CaseJob, *, sampler, deadline: float = float("inf"),
               clock: Callable[[], float] = time.perf_counter, save_dir: str | None = None) -> tuple[dict, bool]:
    """Drive one case on ``places`` (each with ``name`` and ``request(msg, deadline)``: a
    :class:`~flyexplore.run.place.LocalPlace` or an environment's worker; the first is the base
    place) and return ``({arm: row columns}, retire)`` (see the module text). ``sampler``: the
    driver's device-state sampler (start, end, and the clock per round of several places);
    ``deadline`` (driver clock, :func:`time.monotonic`) bounds every wait for a worker;
    ``save_dir``: where the base place saves its checked outputs (several places).

    A place's failed command becomes rows: the arms of that place get its error (``oom`` for out
    of memory), the others a note that the case was cut short; ``retire`` is true when that error
    leaves a GPU context untrustworthy (:data:`flyexplore.run.build.STICKY_ERRORS`) or was out of memory. Raises
    :class:`~flyexplore.run.place.WorkerDied` / :class:`~flyexplore.run.place.WorkerHung` for a
    worker process that died or hung (the caller replaces it); ``KeyboardInterrupt`` propagates."""
    op, case, dtype = job.op, job.case, job.dtype
    multi = len(places) > 1
    base_place = places[0].name
    rows: dict[str, dict] = {}
    built: dict[str, dict] = {}
    digests: dict[str, str | None] = {}
    flush_b, retire = 0, False
    base_backends = job.arms[base_place]
    base_backend = job.backend_of(job.base_arm) if job.base_arm else None
    for w in places:
        msg = {"cmd": "case", "dtype": dtype, "backends": list(job.arms[w.name]), "seed": job.seed,
               "trace": job.trace, "how": job.how, "mode_fixed": job.mode_fixed, "lead_call": multi, "digest": multi}
        if getattr(w, "local", False):   # this process: the objects themselves, and the inputs if made already
            msg.update(op=op, case=case, inputs=job.inputs, ref=job.ref)
        else:           # a worker process: what it resolves (JSON crosses Python and torch versions)
            msg.update(op=job.op_ref, case=case.label)
        if multi and w.name == base_place:
            msg["save_dir"] = save_dir
        elif digests.get(base_place):
            msg["base_dir"] = save_dir
            msg["compare"] = {b: (b if b in base_backends else base_backend) for b in job.arms[w.name]
                              if b in base_backends or base_backend}
        try:
            got = _request(w, msg, deadline)
        except WorkerFailed as exc:   # the case command itself raised: every arm of this place
            for b in job.arms[w.name]:
                rows[job.arm(b, w.name)] = {"status": "oom" if exc.oom else "error", "message": exc.text}
            retire = retire or B.sticky(exc.text)
            continue
        digests[w.name] = got.get("digest")
        flush_b = max(flush_b, int(got.get("flush_bytes") or 0))
        for b, cols in got["arms"].items():
            a = job.arm(b, w.name)
            if cols.get("status") == "ok":
                built[a] = cols
            else:
                rows[a] = {"status": cols.get("status"), "message": cols.get("message")}
    job.inputs = job.ref = None   # the place holds them now
    ok = [a for a in job.all_arms() if a in built]
    base, baselines = baselines_of(job, ok, base_place)
    timing = [w for w in places if any(job.place_of(a) == w.name for a in ok)]
    for w in places:
        if w not in timing:
            with contextlib.suppress(WorkerFailed):
                _request(w, {"cmd": "drop"}, deadline)
    if not ok:
        return rows, retire
    t = job.timer
    limits = IL.Limits.of(len(ok), job.gpu, budget_s=t.get("budget_s"), precision_cap_s=t.get("precision_cap_s"),
                          label_cap_s=t.get("label_cap_s"))
    warmup_ms = IL.WARMUP_MS["cuda" if job.gpu else "cpu"] if t.get("warmup_ms") is None else float(t["warmup_ms"])
    calls = t.get("calls_per_round")
    k_warm = calls or 2
    failed = None
    try:
        t_start = clock()
        state_start = sampler.sample()
        warm: dict[str, list] = {a: [] for a in ok}
        nturn = [0]

        def warm_round():   # every timing place's warm-up turn, in rotated order
            k0 = nturn[0] % len(timing)
            nturn[0] += 1
            for w in timing[k0:] + timing[:k0]:
                got = _request(w, {"cmd": "warm", "calls": k_warm}, deadline)
                for b, v in got["times"].items():
                    warm[job.arm(b, w.name)].extend(v)

        nwarm = IL.warm_up(warm_round, t.get("warmup_rounds"), warmup_ms, clock)
        per_call = {a: (float(sorted(v)[len(v) // 2]) if v else None) for a, v in warm.items()}
        if calls is None:   # as many as fit in BLOCK_MS; with several places at least MIN_CALLS (the lead call)
            calls = IL.calls_for(max((v for v in per_call.values() if v), default=0.0), job.gpu,
                                 MIN_CALLS if multi else 1)
        source = _Turns(job, timing, sampler, int(calls), deadline)
        out = IL.sequential_rounds(source, baselines, band=job.band, target=t.get("target", IL.CI_TARGET),
                                   min_rounds=t.get("min_rounds", IL.MIN_ROUNDS),
                                   max_rounds=t.get("max_rounds", IL.MAX_ROUNDS), limits=limits, clock=clock,
                                   t_start=t_start)
        t_rounds = clock()
        state_end = sampler.sample()
        fin: dict[str, dict] = {}
        how, notes, kcalls, profile_s = source.how, [], None, 0.0
        for w in timing:
            failed = w.name
            got = _request(w, {"cmd": "finish", "profile": source.how == "event-gated", "calls": int(calls),
                               "round": out.n}, deadline)
            failed = None
            profile_s += float(got.get("profile_s") or 0.0)
            how = got.get("how") or how
            notes += [n for n in got.get("notes") or () if n not in notes]
            kcalls = got.get("kcalls") if got.get("kcalls") is not None else kcalls
            for b, cols in got["arms"].items():
                a = job.arm(b, w.name)
                fin[a] = cols
                for k, d in (cols.get("kernels") or {}).items():
                    out.kernels[a].setdefault(k, []).extend(d)
        # as an in-process case's wall_s always was: warm-up, rounds and the profiled round (not the recheck)
        wall = (t_rounds - t_start) + profile_s
    except WorkerFailed as exc:
        who = getattr(getattr(exc, "worker", None), "name", None) or failed or base_place
        for a in ok:
            mine = job.place_of(a) == who
            rows[a] = {"status": "oom" if exc.oom and mine else "error",
                       "message": exc.text if mine or not multi else
                       f"not measured to the end: env {who!r} raised {exc.text}"}
        for w in timing:
            with contextlib.suppress(WorkerFailed, WorkerDied, WorkerHung):
                _request(w, {"cmd": "drop"}, min(deadline, time.monotonic() + 60))
        return rows, retire or B.sticky(exc.text) or exc.oom
    target = t.get("target", IL.CI_TARGET)
    for a in ok:
        info, f = built[a], fin.get(a, {})
        b, p = job.backend_of(a), job.place_of(a)
        m = IL.measurement(out, a, how, int(calls), kcalls, per_call[a], flush_b, nwarm * k_warm, notes)
        cols = B.ok_row(op, case, dtype, b, op.get_backend(b).source, m, float(info["first_call_ms"]),
                        dict(info.get("errs") or {}), f.get("trace"))
        cols.update(case_columns(state_start, state_end, list(out.round_clocks),
                                 getattr(sampler, "max_clock_mhz", None), list(S.round_values(m.rounds))))
        cols.update(device_id=getattr(sampler, "device_id", None) or (getattr(places[0], "info", None) or {}).get(
                        "device_id"),
                    converged=out.stop_reason == "target", ci_target=target, wall_s=wall,
                    verdict_s=out.verdict_s if len(ok) > 1 else None, stop_reason=out.stop_reason, band=job.band,
                    baseline=base, peak_mem_bytes=info.get("peak_mem_bytes"),
                    round_clock_mhz=(json.dumps(out.round_clocks) if any(c is not None for c in out.round_clocks)
                                     else None))
        if baselines.get(a) is not None:
            est, lo, hi = S.paired_ratio(out.rounds[baselines[a]], out.rounds[a])
            cols.update(speedup=est, speedup_lo=lo, speedup_hi=hi, verdict=S.verdict(lo, hi, job.band),
                        baseline=baselines[a])
        if out.stop_reason != "target":
            B.note(cols, B.unconverged(out.n, target, out.stop_reason))
        if "recheck_ok" in f:
            cols["recheck_ok"] = f["recheck_ok"]
        if f.get("accuracy_ok") is False:
            cols["accuracy_ok"] = False
        if f.get("message"):
            B.note(cols, f["message"])
        if "breakdown" in f:
            cols["breakdown"] = f["breakdown"]
        if multi:
            _across(cols, job, a, p, base_place, digests, info, places)
            if source.overhead_ms:
                cols["turn_overhead_ms"] = float(sorted(source.overhead_ms)[len(source.overhead_ms) // 2])
        rows[a] = cols
    return rows, retire


def _across(cols: dict, job: CaseJob, a: str, place: str, base_place: str, digests: dict, info: dict,
            places: list) -> None:
    """An arm's columns across places: its input digest, and where it is not the base place's the
    cross-place output check -- or, where the digests differ, why (named, not guessed)."""
    dg, base_dg = digests.get(place), digests.get(base_place)
    cols["inputs_digest"] = dg
    if place == base_place:
        return
    if base_dg and dg and dg != base_dg:
        B.note(cols, f"inputs differ from env {base_place!r}'s (digest {dg} vs {base_dg}): "
                     f"{digest_cause(places, place, base_place)}; outputs not compared")
        return
    for k in ("cross_env_err_rel", "cross_env_ok", "cross_env_note"):
        if k in info:
            cols[k] = info[k]
    if info.get("cross_env_ok") is False:
        B.note(cols, f"output differs from env {base_place!r}'s by {info.get('cross_env_err_rel'):.3g} "
                     "(relative), past twice the dtype's tolerance")


def digest_cause(places: list, place: str, base_place: str) -> str:
    """Why two places built different inputs from one seed, from what their workers reported at
    start (``info``: the hello's ``versions`` and ``env_vars``): different torch builds (their
    random generators may differ), a variable that changes what the generators give, or -- when
    neither differs -- that the cause is not known (an operator whose inputs are not seeded)."""
    by = {p.name: (getattr(p, "info", None) or {}) for p in places}
    a, b = by.get(place, {}), by.get(base_place, {})
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    diff = [k for k in ("torch", "torch_git", "cuda", "hip") if va.get(k) != vb.get(k)]
    if diff:
        parts = ", ".join(f"{k} {vb.get(k)} vs {va.get(k)}" for k in diff)
        return f"the two environments run different torch builds ({parts}), whose random generators may differ"
    ea, eb = a.get("env_vars") or {}, b.get("env_vars") or {}
    vars_ = sorted(k for k in set(ea) | set(eb) if ea.get(k) != eb.get(k))
    if vars_:
        return f"the same torch build, but the environments set {', '.join(vars_)} differently"
    return ("the same torch build and variables: the operator's inputs are not fully seeded (a cause "
            "outside the seed)")
