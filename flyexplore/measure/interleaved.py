"""Interleaved timing: several backends of one case timed round by round (A B C, B C A, ...)
until their intervals are tight -- :func:`measure_interleaved`, its outcome :class:`Interleaved`
and its defaults (the named constants below).

Every backend's calls run in the same rounds, so all see one clock regime and a speedup is taken
over paired rounds (:func:`flyexplore.measure.stats.paired_ratio`). The rules are in
:func:`_measure_interleaved`; the modes it takes are the ``interleaved`` ones of
:data:`flyexplore.measure.modes.TABLE`. Times are milliseconds. Block-wise timing of one callable
is :class:`flyexplore.measure.timing.Timer`; this module builds on
:mod:`flyexplore.measure.timing` (:class:`~flyexplore.measure.timing.Measurement`, the flush,
the profiler ranges), which never imports it.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from flyexplore.measure import modes
from flyexplore.measure.devstate import sampler_for
from flyexplore.measure.stats import median_ci, paired_ratio, round_values, verdict
from flyexplore.measure.timing import KernelTime, Measurement, cpu_threads, flush_bytes_for, ranges_device_ms

#: Interleaved timing defaults: calls per backend per round, rounds before the first stopping
#: check (6 is the fewest that give a finite 95% order-statistic interval), the stopping target
#: (relative half-width of every interval), and the time budget of one case after warm-up (s).
CALLS_PER_ROUND = 5
#: Longest block of one backend's calls in a round when ``calls_per_round`` is not given (ms).
BLOCK_MS = {"cpu": 5.0, "cuda": 1.0}
MIN_ROUNDS = 10
MAX_ROUNDS = 2000
CI_TARGET = 0.01
CASE_BUDGET_S = {"cpu": 2.0, "cuda": 10.0}
#: Interleaved warm-up before the first timed round (ms): long enough for the clock to leave
#: idle (do_bench warms up for 25 ms).
WARMUP_MS = {"cpu": 20.0, "cuda": 50.0}
#: ``event-gated``: the spin kernel that holds the stream at the start of each round runs for
#: 1.5x the host's enqueue time of the previous round (cycles counted at 2 GHz, above any
#: current GPU's clock, so it never runs short), between these bounds (cycles).
GATE_CYCLES = (100_000, 100_000_000)


@dataclass(frozen=True)
class Interleaved:
    """The outcome of :func:`measure_interleaved`.

    ``measurements``: one :class:`~flyexplore.measure.timing.Measurement` per backend name
    (``order="interleaved"``, with ``rounds``); ``baseline``: the name speedups are taken against; ``converged``: every
    interval met ``target`` before the budget or ``max_rounds`` ran out; ``wall_s``: wall time
    from the first warm-up call to the end (s); ``round_clocks``: the SM clock (MHz) read at the
    start of each round (``None`` where there is no reading); ``state_start``/``state_end``:
    :meth:`flyexplore.measure.devstate.NvmlSampler.sample` readings; ``max_clock_mhz``: the device's
    maximum; ``device_id``: GPU UUID or PCI bus id; ``verdict_s``: wall time from the start
    until every speedup interval first met ``target`` (``None`` if never; with one backend,
    ``None``)."""

    measurements: dict
    baseline: str | None
    converged: bool
    target: float
    wall_s: float
    round_clocks: tuple = ()
    state_start: dict = field(default_factory=dict)
    state_end: dict = field(default_factory=dict)
    max_clock_mhz: float | None = None
    device_id: str | None = None
    notes: tuple[str, ...] = ()
    verdict_s: float | None = None

    @property
    def rounds(self) -> int:
        return len(next(iter(self.measurements.values())).rounds) if self.measurements else 0

    def speedup(self, name: str) -> tuple[float, float, float]:
        """``(estimate, lo, hi)``: baseline time / ``name``'s time over paired rounds
        (:func:`flyexplore.measure.stats.paired_ratio`)."""
        return paired_ratio(self.measurements[self.baseline].rounds, self.measurements[name].rounds)


class _ProfilerGaveNothing(RuntimeError):
    pass


def measure_interleaved(fns, device="cpu", **kw) -> Interleaved:
    """Time several callables of one case interleaved (see :func:`_measure_interleaved` for
    the arguments and the rules). On the CPU the calls run with :data:`~flyexplore.measure.timing.CPU_TIMING_THREADS`
    intra-op threads."""
    import torch


    with cpu_threads(torch.device(device).type == "cuda"):
        return _measure_interleaved(fns, device, **kw)


def _measure_interleaved(fns, device="cpu", *, mode: str = "auto", baseline: str | None = None,
                        calls_per_round: int | None = None, min_rounds: int = MIN_ROUNDS,
                        max_rounds: int = MAX_ROUNDS, target: float = CI_TARGET,
                        budget_s: float | None = None, warmup_ms: float | None = None,
                        warmup_rounds: int | None = None, band: float | None = None, enter=None, sampler=None, flush: bool | None = None,
                        clock: Callable[[], float] = time.perf_counter) -> Interleaved:
    """Time several callables of one case interleaved, until their intervals are tight.

    ``fns`` maps backend names to zero-argument callables, already built and compiled (their
    first call done). After an interleaved warm-up of ``warmup_ms`` (default 50 ms on GPU,
    20 ms on CPU), rounds run A B C, B C A, C A B, ... (the order rotates each round), each
    backend ``calls_per_round`` calls in a row (default: as many as fit in :data:`BLOCK_MS`
    of the slowest backend's warm-up call time, 1 to :data:`CALLS_PER_ROUND`: short blocks keep
    all backends in one clock regime even when the GPU is power-capped, where the clock follows
    each kernel's power within milliseconds), each call preceded by the same cache flush as
    :class:`~flyexplore.measure.timing.Timer`'s. ``enter(name)`` (optional) returns a context manager entered around each
    block of one backend's calls (its switches, e.g. FlyDSL overrides off for ATen).
    ``warmup_rounds`` replaces the warm-up time by a number of rounds. With ``band`` (the SAME
    band of :func:`flyexplore.measure.stats.verdict`), a speedup whose label is still AMBIGUOUS keeps
    the case going until its interval is within ``+-band/2`` (or the budget ends), so that
    AMBIGUOUS means "at a band edge", not "too few rounds".

    Stopping: after ``min_rounds`` rounds and then after each chunk of rounds, the
    order-statistic 95% interval of every backend's median round time and of every speedup
    against ``baseline`` (paired rounds) is checked; when all lie within ``+-target`` of their
    estimate (default 1%, nvbench's ``stdrel`` idea applied to intervals) the case has
    converged. Otherwise rounds continue until ``max_rounds`` or ``budget_s`` seconds after
    warm-up (default 10 s on GPU, 2 s on CPU), and ``converged`` is False.

    Modes: the ``interleaved`` ones of :data:`flyexplore.measure.modes.TABLE`: ``auto`` (CPU:
    ``cpu-thread`` -- ``cpu-wall`` when a custom ``clock`` is given --; GPU: ``event-gated``;
    :data:`flyexplore.measure.modes.AUTO`), ``cpu-thread``, ``cpu-wall``,
    ``event-gated`` (GPU: an event pair around each call, and at the start of each round a spin
    kernel (``torch.cuda._sleep``) holds the stream while the host enqueues the whole round, so
    the events see device time without host launch gaps -- what graph replay or the
    profiler's kernel time gives, nvbench's "blocking kernel" idea -- at the cost of events;
    then one profiled round lists each backend's kernels; the ungated per-call time of the
    warm-up is kept as ``per_call_ms``), ``event`` (ungated: includes launch gaps of short
    calls), ``kernel`` (device kernel time from ``torch.profiler`` in chunks of rounds: exact
    per-kernel attribution, several times the wall time). Graph replay is block-wise only
    (:class:`~flyexplore.measure.timing.Timer`). ``sampler``: a :mod:`flyexplore.measure.devstate` sampler read
    at the start and end and once per round (default: :func:`flyexplore.measure.devstate.sampler_for`).
    ``clock`` (s) can be swapped for tests.

    Raises ``ValueError`` for an empty ``fns``, a ``baseline`` not in ``fns``, or non-positive
    counts, target or budget; :class:`~flyexplore.errors.UsageError` (a ``ValueError``) for a mode
    this timer does not take or one for the other device (:func:`flyexplore.measure.modes.check`)."""
    import torch


    if not fns:
        raise ValueError("measure_interleaved needs at least one callable")
    modes.check(mode, "interleaved")
    names = list(fns)
    baseline = baseline if baseline is not None else names[0]
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not among {names}")
    for k, v in (("calls_per_round", calls_per_round or 1), ("min_rounds", min_rounds),
                 ("max_rounds", max_rounds)):
        if int(v) < 1:
            raise ValueError(f"{k} must be >= 1, got {v!r}")
    if not (target > 0):
        raise ValueError(f"target must be > 0, got {target!r}")
    dev = torch.device(device)
    gpu = dev.type == "cuda"
    eff = modes.effective(mode, "interleaved", gpu, clock is not time.perf_counter)
    kind = "cuda" if gpu else "cpu"
    budget_s = CASE_BUDGET_S[kind] if budget_s is None else float(budget_s)
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s!r}")
    warmup_ms = WARMUP_MS[kind] if warmup_ms is None else float(warmup_ms)
    if sampler is None:
        sampler = sampler_for(dev)
    call_clock = time.thread_time if eff == "cpu-thread" else clock
    use_flush = gpu if flush is None else flush
    cache = None
    if use_flush:
        nbytes = flush_bytes_for(dev) if gpu else 64 * 2**20
        cache = torch.empty(nbytes // 4, dtype=torch.int32, device=dev)
    enter = enter or (lambda name: contextlib.nullcontext())
    sync = (lambda: torch.cuda.synchronize(dev)) if gpu else (lambda: None)
    notes: list[str] = []

    import scipy.stats  # noqa: F401 - the stopping checks need it; loading it (~1 s) must not eat the budget

    t_start = clock()
    state_start = sampler.sample()
    # interleaved warm-up: whole rounds until warmup_ms has passed (at least one)
    w0 = clock()
    warm_rounds = 0
    warm_ev: dict = {nm: [] for nm in names}
    warm_wall: dict = {nm: [] for nm in names}
    k_warm = calls_per_round or 2
    while warmup_rounds != 0:
        for name in names:
            with enter(name):
                for _ in range(k_warm):
                    if cache is not None:
                        cache.zero_()
                    if gpu:
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        fns[name]()
                        e.record()
                        warm_ev[name].append((s, e))
                    else:
                        c0 = call_clock()
                        fns[name]()
                        warm_wall[name].append((call_clock() - c0) * 1e3)
        sync()
        warm_rounds += 1
        if warmup_rounds is not None:
            if warm_rounds >= warmup_rounds:
                break
        elif (clock() - w0) * 1e3 >= warmup_ms or warm_rounds >= 1000:
            break

    per_call = {nm: (float(np.median([s.elapsed_time(e) for s, e in warm_ev[nm]])) if warm_ev[nm]
                     else float(np.median(warm_wall[nm])) if warm_wall[nm] else None) for nm in names}
    del warm_ev
    if calls_per_round is None:
        slowest = max((v for v in per_call.values() if v), default=0.0)
        calls_per_round = (CALLS_PER_ROUND if slowest <= 0 else
                           int(min(CALLS_PER_ROUND, max(1, BLOCK_MS[kind] // slowest))))
    if not gpu:
        per_call = {nm: None for nm in names}
    gate = {"cycles": GATE_CYCLES[1] // 20}

    def run_chunk(n_rounds: int, first: int, how: str):
        """n_rounds rounds; returns (samples per name: list of rounds, per-call event ms per
        name, kernel durations per name, round clocks)."""
        out = {nm: [] for nm in names}
        ev = {nm: [] for nm in names}
        clocks = []
        pending = []  # (name, round index, start event, end event)
        prof = None
        if how == "kernel":
            from torch.profiler import ProfilerActivity, profile
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        try:
            from torch.autograd.profiler import record_function
            for r in range(n_rounds):
                clocks.append(sampler.clock_mhz())
                k0 = (first + r) % len(names)
                if how == "event-gated":
                    h0 = clock()
                    torch.cuda._sleep(gate["cycles"])
                for name in names[k0:] + names[:k0]:
                    fn = fns[name]
                    times = []
                    with enter(name):
                        for _ in range(calls_per_round):
                            if cache is not None:
                                cache.zero_()
                            if not gpu:
                                t0 = call_clock()
                                fn()
                                times.append((call_clock() - t0) * 1e3)
                                continue
                            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            s.record()
                            if prof is not None:
                                with record_function(f"flyexplore::{name}"):
                                    fn()
                            else:
                                fn()
                            e.record()
                            pending.append((name, r, s, e))
                    out[name].append(times)
                if how == "event-gated":
                    h = clock() - h0
                    gate["cycles"] = int(min(max(h * 1.5 * 2e9, GATE_CYCLES[0]), GATE_CYCLES[1]))
                    sync()  # the next round's gate must start on an idle stream
                elif gpu and r % 8 == 7:
                    sync()  # keep the host within a few rounds of the device
            sync()
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
        for name, r, s, e in pending:
            ev[name].append(s.elapsed_time(e))
            if how in ("event", "event-gated"):
                out[name][r].append(s.elapsed_time(e))
        kern = {}
        if how == "kernel":
            per = ranges_device_ms(prof, {f"flyexplore::{nm}": nm for nm in names})
            for nm in names:
                got = per.get(nm, ([], {}))
                if len(got[0]) != n_rounds * calls_per_round or min(got[0], default=0) <= 0:
                    raise _ProfilerGaveNothing(nm)
                it = iter(got[0])
                out[nm] = [[next(it) for _ in range(calls_per_round)] for _ in range(n_rounds)]
                kern[nm] = got[1]
        return out, ev, kern, clocks

    rounds = {nm: [] for nm in names}
    events = {nm: [] for nm in names}
    kdur: dict[str, dict[str, list[float]]] = {nm: {} for nm in names}
    round_clocks: list = []
    how = eff
    t0 = clock()
    chunk = max(int(min_rounds), 1)
    converged = False
    verdict_s = None
    run_s = 0.0  # time spent in rounds (the stopping checks between chunks excluded)
    while True:
        chunk_t0 = clock()
        try:
            got, ev, kern, clocks = run_chunk(chunk, len(round_clocks), how)
        except _ProfilerGaveNothing as exc:
            if mode == "kernel":
                raise RuntimeError(f"the profiler attributed no device time to backend {exc}") from None
            notes.append("profiler attributed no device time to the calls; per-call events used")
            how = "event"
            rounds = {nm: [] for nm in names}
            events = {nm: [] for nm in names}
            round_clocks = []
            continue
        chunk_s = clock() - chunk_t0
        run_s += chunk_s
        for nm in names:
            rounds[nm] += got[nm]
            events[nm] += ev[nm]
            for kname, d in kern.get(nm, {}).items():
                kdur[nm].setdefault(kname, []).extend(d)
        round_clocks += clocks
        n = len(round_clocks)
        worst = _worst_width(rounds, baseline) / target
        converged = worst <= 1.0
        elapsed = clock() - t0
        if verdict_s is None and _worst_width(rounds, baseline, speedups_only=True) <= target:
            verdict_s = clock() - t_start
        if converged and band is not None:
            # an AMBIGUOUS label goes on until its interval is within +-band/2: then it is a
            # firm answer (the effect sits at a band edge), not a lack of rounds
            amb = _ambiguous_width(rounds, baseline, band)
            if amb > band / 2:
                converged = False
                worst = max(worst, amb / (band / 2))
        if converged or n >= max_rounds or elapsed >= budget_s:
            break
        per_round = run_s / max(n, 1)
        room = max(1, int((budget_s - elapsed) / per_round)) if per_round > 0 else max_rounds
        # an interval narrows as 1/sqrt(rounds): ask for the rounds that should reach the
        # target (+20%), at least 2 and at most 4x what ran, within the budget
        need = int(math.ceil(n * min(worst, 3.0) ** 2 * 1.2)) - n if math.isfinite(worst) else n
        chunk = max(1, min(max(need, 2), 4 * n, max_rounds - n, room))
    if how == "event-gated":  # one profiled round: which kernels each backend ran
        try:
            _, _, kern, _ = run_chunk(1, len(round_clocks), "kernel")
            for nm in names:
                for kname, d in kern.get(nm, {}).items():
                    kdur[nm].setdefault(kname, []).extend(d)
            kcalls = calls_per_round
        except Exception as exc:  # noqa: BLE001 - no profiler: the times stand, kernels unknown
            notes.append(f"kernel names not recorded: {type(exc).__name__}")
            kcalls = 0
    else:
        kcalls = None
    state_end = sampler.sample()
    wall = clock() - t_start
    flush_b = int(cache.numel() * 4) if cache is not None else 0
    ms = {}
    for nm in names:
        calls = len(rounds[nm]) * calls_per_round if kcalls is None else max(kcalls, 1)
        kts = tuple(KernelTime(k, len(d) / calls, sum(d) * 1e3 / calls)
                    for k, d in sorted(kdur[nm].items(), key=lambda kv: -sum(kv[1])))
        rr = tuple(tuple(r) for r in rounds[nm])
        ms[nm] = Measurement(tuple(x for r in rr for x in r), how,
                             per_call_ms=(float(np.median(events[nm])) if how == "kernel"
                                          else per_call[nm] if how == "event-gated" else None),
                             flush_bytes=flush_b, warmup=warm_rounds * k_warm,
                             kernels=kts, notes=tuple(notes), rounds=rr, order="interleaved")
    return Interleaved(ms, baseline, converged, target, wall, tuple(round_clocks), state_start,
                       state_end, getattr(sampler, "max_clock_mhz", None),
                       getattr(sampler, "device_id", None), tuple(notes),
                       verdict_s if len(names) > 1 else None)


def _ambiguous_width(rounds: dict, baseline: str, band: float) -> float:
    """The largest relative half-width among speedups whose label is AMBIGUOUS (0 if none)."""

    worst = 0.0
    for nm, rr in rounds.items():
        if nm == baseline:
            continue
        est, lo, hi = paired_ratio(rounds[baseline], rr)
        if verdict(lo, hi, band) == "AMBIGUOUS":
            if not all(math.isfinite(x) for x in (est, lo, hi)) or est <= 0:
                return math.inf
            worst = max(worst, (hi - est) / est, (est - lo) / est)
    return worst


def _worst_width(rounds: dict, baseline: str, speedups_only: bool = False) -> float:
    """The largest relative half-width (max of ``(hi - est) / est`` and ``(est - lo) / est``)
    over every backend's median interval and every speedup interval against ``baseline``;
    ``inf`` where an interval is missing (too few rounds)."""
    worst = 0.0
    for nm, rr in rounds.items():
        v = round_values(rr)
        ests = [] if speedups_only else [(float(np.median(v)), *median_ci(v))]
        if nm != baseline:
            ests.append(paired_ratio(rounds[baseline], rr))
        for est, lo, hi in ests:
            if not all(math.isfinite(x) for x in (est, lo, hi)) or est <= 0:
                return math.inf
            worst = max(worst, (hi - est) / est, (est - lo) / est)
    return worst
