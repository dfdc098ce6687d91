"""Interleaved timing: several backends of one case timed round by round (A B C, B C A, ...)
until their labels are decided and their intervals tight, or a time cap ends the case --
:func:`measure_interleaved`, its outcome :class:`Interleaved` and its defaults (the named
constants below).

Every backend's calls run in the same rounds, so all see one clock regime and a speedup is taken
over paired rounds (:func:`flyexplore.measure.stats.paired_ratio`). The rules are in
:func:`_measure_interleaved`: in short, a case stops once every speedup's label can no longer
change (its :data:`LOOK_CONFIDENCE` interval is wholly inside or wholly beyond the SAME band)
and every median's 95% interval is within +-:data:`CI_TARGET`; with decided labels the medians
get at most :data:`PRECISION_CAP_S` per backend, an undecided label at most :data:`LABEL_CAP_S`
per backend, and no case more than :data:`CASE_BUDGET_S`. The modes it takes are the
``interleaved`` ones of :data:`flyexplore.measure.modes.TABLE`. Times are milliseconds. Block-wise
timing of one callable is :class:`flyexplore.measure.timing.Timer`; this module builds on
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
from flyexplore.measure.stats import BAND, median_ci, paired_ratio, round_values, verdict
from flyexplore.measure.timing import KernelTime, Measurement, cpu_threads, flush_bytes_for, ranges_device_ms

#: Interleaved timing defaults: calls per backend per round, rounds before the first stopping
#: check (6 is the fewest that give a finite 95% order-statistic interval, 8 for 99%), the
#: precision target (relative half-width of every median's 95% interval).
CALLS_PER_ROUND = 5
#: Longest block of one backend's calls in a round when ``calls_per_round`` is not given (ms).
BLOCK_MS = {"cpu": 5.0, "cuda": 1.0}
MIN_ROUNDS = 10
#: A safety net on the number of rounds, not a stopping rule: the time caps below end a case
#: long before it on any real device (a GPU round takes 0.1 ms or more: 100,000 rounds are 10 s,
#: the whole budget); it keeps a clock that does not advance from timing for ever.
MAX_ROUNDS = 100_000
CI_TARGET = 0.01
#: The hard limit of one case after warm-up (s): past it a case stops whatever its state
#: (``stop_reason="budget"``, ``converged=False``). The time caps below, per backend, are lower
#: for cases of up to 33 backends (GPU) or 3 (CPU), so they decide when most cases stop.
CASE_BUDGET_S = {"cpu": 2.0, "cuda": 10.0}
#: Precision cap, s per backend of the case, counted from the first warm-up call: once every
#: label is decided, the medians get this long to reach +-``target``, then the case stops
#: (``stop_reason="precision_cap"``). On a GPU 0.1 s per backend is triton's ``do_bench``
#: (25 ms warm-up and 100 ms of repetitions per callable: a median 0.37 s for three backends
#: of one case on an H200) less its warm-up, which here is one for all backends
#: (:data:`WARMUP_MS`); a case of short calls whose labels decide early so costs about what
#: ``do_bench`` costs. The CPU value is twice that: CPU timing is noisier, and the CPU is for
#: tests and small checks.
PRECISION_CAP_S = {"cpu": 0.2, "cuda": 0.1}
#: Label cap, s per backend of the case, counted from the first warm-up call: a speedup whose
#: label is still undecided (AMBIGUOUS at :data:`LOOK_CONFIDENCE`, and its 95% interval wider
#: than +-band/2) keeps the case going this long at most (``stop_reason="label_cap"``,
#: ``converged=False``). Never before ``2 * min_rounds`` rounds (a long call gets some rounds).
#: The GPU value keeps the slowest case within 3x ``do_bench``: on an H200
#: (``benchmarks/evidence/reproducible.py``, ``data/h200/reproducible/``) do_bench took 0.21-0.33 s for
#: the three backends of a case of 9-70 µs calls, 0.07 s a callable at the least; 3x that is
#: 0.21 s a backend, less the case's share of the profiled round and stopping checks (about
#: 0.02 s a case): 0.18 s. At 0.2 s the slowest case read 3.09x its do_bench. The CPU value is
#: 3x the CPU precision cap.
LABEL_CAP_S = {"cpu": 0.6, "cuda": 0.18}
#: Least time in timed rounds before a case may stop at ``target``, s per backend. On an H200
#: (``benchmarks/evidence/reproducible.py``, first GPU run of the sequential rule) cases that stopped
#: after 10-13 rounds (20-40 ms of rounds after the 50 ms warm-up) read absolute times 2-3.5%
#: apart between fresh processes -- the clock had not settled after the GPU idled through the
#: case's compile -- where the same cases read 0.15-0.7% apart with longer timing. Speedups were
#: unaffected (the rounds pair them). 50 ms per backend of rounds, as do_bench's 100 ms of
#: repetitions, keeps the medians of one process comparable with the next. The label cap above
#: was lowered to 0.2 s, then 0.18 s, per backend (see there).
MIN_TIMED_S = {"cpu": 0.0, "cuda": 0.05}
#: Confidence of the speedup interval at each stopping check ("look"): a label counts as decided
#: when this interval, not only the reported 95% one, lies wholly inside the SAME band or wholly
#: beyond one of its edges. The looks are repeated (a case stops at the first look that decides
#: it), so each needs more than 95%: with looks at least :data:`LOOK_GROWTH` times as many
#: rounds apart from 10 rounds on, the chance that *any* look's 99% interval misses the true
#: median ratio is 4.3% up to 300 rounds (15 looks), 6.2% up to 1,000 (20 looks) and 8.0% up to
#: 3,000 (25 looks), where looks at 95% would miss 26% of the time up to 1,000 rounds
#: (``benchmarks/evidence/sequential_looks.py``: seeded, exact for any continuous distribution of the
#: ratios, since order-statistic intervals depend only on ranks). A wrong label needs a miss on
#: one side, beyond a band edge: 2.2%, 3.2% and 4.1%, against the 2.5% of a single 95% interval.
#: Bonferroni over 20 looks would ask for 99.75% per look, and some 38% more rounds than 99%
#: for a label near a band edge, ignoring that successive looks share most of their rounds.
LOOK_CONFIDENCE = 0.99
#: Stopping checks ("looks") are at least this factor apart in rounds (a case stops at most
#: 25% later than the round its labels were decided in, and the number of looks, which sets
#: the figures of :data:`LOOK_CONFIDENCE`, grows with the log of the rounds). With decided
#: labels and medians not yet tight, the next look is where the medians should reach the
#: target (at most 4x the rounds so far); every look is also placed no later than the cap or
#: budget that applies. ``kernel`` mode looks at 2x steps (each look is a profiler session).
LOOK_GROWTH = 1.25
#: Why a case stopped (:attr:`Interleaved.stop_reason`, the row column ``stop_reason``):
#: ``target`` every label decided (or settled at a band edge) and every median within
#: +-target (``converged=True``); ``precision_cap`` labels decided, medians not yet within
#: target when the precision cap passed; ``label_cap`` a label still undecided at the label cap;
#: ``budget`` the case budget ran out first; ``max_rounds`` the round limit (a fixed number of
#: rounds: ``rep``).
STOP_REASONS = ("target", "precision_cap", "label_cap", "budget", "max_rounds")
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
    (``order="interleaved"``, with ``rounds``); ``baseline``: the name speedups are taken
    against; ``converged``: every label was decided (or settled at a band edge) and every
    median's interval met ``target`` (``stop_reason == "target"``); ``wall_s``: wall time from
    the first warm-up call to the end (s); ``round_clocks``: the SM clock (MHz) read at the
    start of each round (``None`` where there is no reading); ``state_start``/``state_end``:
    :meth:`flyexplore.measure.devstate.NvmlSampler.sample` readings; ``max_clock_mhz``: the
    device's maximum; ``device_id``: GPU UUID or PCI bus id; ``verdict_s``: wall time from the
    start until the first stopping check at which every speedup's label was decided (or settled
    at a band edge; ``None`` if never; with one backend, ``None``); ``stop_reason``: why the
    rounds ended, one of :data:`STOP_REASONS`."""

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
    stop_reason: str | None = None

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
                        max_rounds: int | None = MAX_ROUNDS, target: float = CI_TARGET,
                        budget_s: float | None = None, precision_cap_s: float | None = None,
                        label_cap_s: float | None = None, warmup_ms: float | None = None,
                        warmup_rounds: int | None = None, band: float | None = BAND, enter=None,
                        sampler=None, flush: bool | None = None,
                        clock: Callable[[], float] = time.perf_counter) -> Interleaved:
    """Time several callables of one case interleaved, until their labels are decided and their
    intervals tight, or a time cap ends the case.

    ``fns`` maps backend names to zero-argument callables, already built and compiled (their
    first call done). After an interleaved warm-up of ``warmup_ms`` (default 50 ms on GPU,
    20 ms on CPU), rounds run A B C, B C A, C A B, ... (the order rotates each round), each
    backend ``calls_per_round`` calls in a row (default: as many as fit in :data:`BLOCK_MS`
    of the slowest backend's warm-up call time, 1 to :data:`CALLS_PER_ROUND`: short blocks keep
    all backends in one clock regime even when the GPU is power-capped, where the clock follows
    each kernel's power within milliseconds), each call preceded by the same cache flush as
    :class:`~flyexplore.measure.timing.Timer`'s. ``enter(name)`` (optional) returns a context manager entered around each
    block of one backend's calls (its switches, e.g. FlyDSL overrides off for ATen).
    ``warmup_rounds`` replaces the warm-up time by a number of rounds.

    Stopping (a sequential rule): after ``min_rounds`` rounds, and then at looks
    :data:`LOOK_GROWTH` (1.25) times as many rounds apart or more (closer only where a cap or
    the budget comes first), each speedup against ``baseline`` (paired rounds) and each
    backend's median are checked.

    * A speedup's label is *decided* when its :data:`LOOK_CONFIDENCE` (99%) order-statistic
      interval gives a label other than AMBIGUOUS with ``band`` (the SAME band of
      :func:`flyexplore.measure.stats.verdict`, default :data:`~flyexplore.measure.stats.BAND`
      = 1%): the whole interval inside ``[1 - band, 1 + band]`` (SAME) or wholly beyond an edge
      (FASTER, SLOWER), so that at the stated confidence more rounds cannot change it. 99%, not
      the reported 95%, because the case looks many times (the figures are at
      :data:`LOOK_CONFIDENCE`); the reported 95% interval lies inside the 99% one, so the row's
      label is the decided one. A label that stays AMBIGUOUS is *settled* once its 95% interval
      is within ``+-band/2`` (the effect sits at a band edge: a firm answer, not too few rounds).
    * The medians are *tight* when every backend's 95% interval is within ``+-target`` of its
      median (default 1%, nvbench's ``stdrel`` idea applied to intervals).

    The case stops at the first look where (in this order): every label is decided or settled
    and the medians are tight (``stop_reason="target"``, ``converged=True``); ``max_rounds``
    rounds have run (``"max_rounds"``: a fixed number of rounds when ``min_rounds ==
    max_rounds``; otherwise a safety net, :data:`MAX_ROUNDS`; ``None``: none); the labels are
    decided or settled and ``precision_cap_s`` has passed (``"precision_cap"``: the medians got
    what the time allows); a label is still undecided, ``label_cap_s`` has passed and at least
    ``2 * min_rounds`` rounds ran (``"label_cap"``); ``budget_s`` has passed after warm-up
    (``"budget"``). Only ``target`` is ``converged``. The caps are seconds of the whole case,
    counted from the first warm-up call, by default :data:`PRECISION_CAP_S` and
    :data:`LABEL_CAP_S` per backend (GPU 0.1 s and 0.18 s: about ``do_bench``'s time and, with
    the warm-up, 3x it; CPU 0.2 s and 0.6 s); the label cap is raised to the precision cap where it is lower.
    ``budget_s`` (default :data:`CASE_BUDGET_S`: 10 s on GPU, 2 s on CPU) is the hard limit; to
    measure longer, raise the caps too. With one backend there are no labels: the medians'
    target and the precision cap. Each look is placed no later than the cap or budget then in
    force, so a case overshoots it by at most one round. A look costs a few sorts of the
    per-round values (numpy; the order-statistic ranks from
    :func:`flyexplore.measure.stats.median_ci_ranks`), kept as arrays as the rounds come in.

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
    counts, target, band, budget or caps; :class:`~flyexplore.errors.UsageError` (a ``ValueError``) for a mode
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
                 ("max_rounds", 1 if max_rounds is None else max_rounds)):
        if int(v) < 1:
            raise ValueError(f"{k} must be >= 1, got {v!r}")
    if not (target > 0):
        raise ValueError(f"target must be > 0, got {target!r}")
    band = BAND if band is None else float(band)
    if not (0 < band < 1):
        raise ValueError(f"band must be in (0, 1), got {band!r}")
    dev = torch.device(device)
    gpu = dev.type == "cuda"
    eff = modes.effective(mode, "interleaved", gpu, clock is not time.perf_counter)
    limits = Limits.of(len(names), gpu, budget_s=budget_s, precision_cap_s=precision_cap_s,
                       label_cap_s=label_cap_s, timed=clock is time.perf_counter)
    warmup_ms = WARMUP_MS["cuda" if gpu else "cpu"] if warmup_ms is None else float(warmup_ms)
    if sampler is None:
        sampler = sampler_for(dev)
    runner = RoundRunner(fns, dev, eff, enter=enter, sampler=sampler, flush=flush, clock=clock)
    runner.mode_fixed = mode == "kernel"

    import scipy.special  # noqa: F401 - the stopping checks need it; loading it must not eat the budget

    t_start = clock()
    state_start = sampler.sample()
    k_warm = calls_per_round or 2
    warm_rounds = warm_up(lambda: runner.warm(k_warm), warmup_rounds, warmup_ms, clock)
    runner.size(calls_per_round)
    out = sequential_rounds(runner, {nm: (baseline if nm != baseline else None) for nm in names},
                            band=band, target=target, min_rounds=min_rounds, max_rounds=max_rounds,
                            limits=limits, clock=clock, t_start=t_start)
    if runner.how == "event-gated":  # one profiled round: which kernels each backend ran
        try:
            kern = runner.run(1, out.n, "kernel").kernels
            for nm in names:
                for kname, d in kern.get(nm, {}).items():
                    out.kernels[nm].setdefault(kname, []).extend(d)
            kcalls = runner.calls_per_round
        except Exception as exc:  # noqa: BLE001 - no profiler: the times stand, kernels unknown
            runner.notes.append(f"kernel names not recorded: {type(exc).__name__}")
            kcalls = 0
    else:
        kcalls = None
    state_end = sampler.sample()
    wall = clock() - t_start
    ms = {nm: measurement(out, nm, runner.how, runner.calls_per_round, kcalls, runner.per_call_ms(nm),
                          runner.flush_bytes, warm_rounds * k_warm, runner.notes) for nm in names}
    return Interleaved(ms, baseline, out.stop_reason == "target", target, wall, tuple(out.round_clocks),
                       state_start, state_end, getattr(sampler, "max_clock_mhz", None),
                       getattr(sampler, "device_id", None), tuple(runner.notes),
                       out.verdict_s if len(names) > 1 else None, out.stop_reason)


def measurement(out: "Rounds", name: str, how: str, calls_per_round: int, kcalls: int | None,
                per_call_ms: float | None, flush_bytes: int, warmup: int, notes: list) -> Measurement:
    """The :class:`~flyexplore.measure.timing.Measurement` of backend ``name`` from the rounds of
    :func:`sequential_rounds` (``out``): its rounds, the kernels seen (per call: the profiled
    round's ``kcalls`` calls when ``kcalls`` is given, else every timed call), ``per_call_ms``
    (``kernel`` mode: the median event time of a call; ``event-gated``: the warm-up's ungated
    per-call time), ``flush_bytes``, the ``warmup`` calls and ``notes``. Shared by
    :func:`measure_interleaved` and an environment A/B's driver (:mod:`flyexplore.run.envab`)."""
    calls = len(out.rounds[name]) * calls_per_round if kcalls is None else max(kcalls, 1)
    kts = tuple(KernelTime(k, len(d) / calls, sum(d) * 1e3 / calls)
                for k, d in sorted(out.kernels[name].items(), key=lambda kv: -sum(kv[1])))
    rr = tuple(tuple(r) for r in out.rounds[name])
    pc = (float(np.median(out.events[name])) if how == "kernel" and out.events[name]
          else per_call_ms if how == "event-gated" else None)
    return Measurement(tuple(x for r in rr for x in r), how, per_call_ms=pc, flush_bytes=flush_bytes,
                       warmup=warmup, kernels=kts, notes=tuple(notes), rounds=rr, order="interleaved")


@dataclass(frozen=True)
class Limits:
    """The time limits of one case of ``n`` timed callables, s, counted from the first warm-up
    call: ``budget_s`` after warm-up (:data:`CASE_BUDGET_S`), ``precision_cap_s``
    (:data:`PRECISION_CAP_S` x n), ``label_cap_s`` (:data:`LABEL_CAP_S` x n, at least the
    precision cap) and ``min_timed_s`` (:data:`MIN_TIMED_S` x n of timed rounds before a case may
    stop at target; 0 with a test's clock). :meth:`of` checks given values."""

    budget_s: float
    precision_cap_s: float
    label_cap_s: float
    min_timed_s: float

    @classmethod
    def of(cls, n: int, gpu: bool, *, budget_s=None, precision_cap_s=None, label_cap_s=None,
           timed: bool = True) -> "Limits":
        """The limits of ``n`` callables on a GPU (``gpu``) or the CPU, the defaults where a value
        is None. Raises ``ValueError`` for a value that is not > 0."""
        kind = "cuda" if gpu else "cpu"
        budget_s = CASE_BUDGET_S[kind] if budget_s is None else float(budget_s)
        if not budget_s > 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s!r}")
        pcap = PRECISION_CAP_S[kind] * n if precision_cap_s is None else float(precision_cap_s)
        lcap = LABEL_CAP_S[kind] * n if label_cap_s is None else float(label_cap_s)
        for k, v in (("precision_cap_s", pcap), ("label_cap_s", lcap)):
            if not v > 0:
                raise ValueError(f"{k} must be > 0, got {v!r}")
        return cls(budget_s, pcap, max(lcap, pcap), MIN_TIMED_S[kind] * n if timed else 0.0)


def warm_up(one_round: Callable[[], object], rounds: int | None, ms: float, clock: Callable[[], float]) -> int:
    """The interleaved warm-up: ``one_round()`` again and again -- ``rounds`` times when given
    (0: none), else until ``ms`` milliseconds have passed by ``clock`` (at least one round, at
    most 1,000). Returns the rounds run."""
    w0 = clock()
    n = 0
    while rounds != 0:
        one_round()
        n += 1
        if rounds is not None:
            if n >= rounds:
                break
        elif (clock() - w0) * 1e3 >= ms or n >= 1000:
            break
    return n


def calls_for(slowest_ms: float | None, gpu: bool, least: int = 1) -> int:
    """Calls of each backend in a round: as many as fit in :data:`BLOCK_MS` of the slowest
    backend's call (``slowest_ms``, its warm-up median), between ``least`` and
    :data:`CALLS_PER_ROUND`; :data:`CALLS_PER_ROUND` without a time."""
    if not slowest_ms or slowest_ms <= 0:
        return CALLS_PER_ROUND
    return int(min(CALLS_PER_ROUND, max(least, BLOCK_MS["cuda" if gpu else "cpu"] // slowest_ms)))


@dataclass
class Chunk:
    """What a chunk of rounds gave (:meth:`RoundRunner.run`): per name the rounds (each a list of
    call times, ms), the per-call event times (ms; GPU), the kernels the profiler saw (name ->
    durations, ``kernel`` mode) and the clock read at the start of each round (MHz or None)."""

    rounds: dict
    events: dict
    kernels: dict
    clocks: list


class RestartRounds(Exception):
    """Raised by a round source's ``run`` when its timing mode changed midway (the profiler gave
    no device time): :func:`sequential_rounds` drops what it collected and starts again."""


class RoundRunner:
    """The rounds of several built callables of one case, timed as :func:`measure_interleaved`
    times them: per round, the order rotated (A B C, B C A, ...), each callable
    ``calls_per_round`` calls in a row, each call after the same cache flush, inside ``enter(name)``.

    ``fns``: name -> zero-argument callable (built, first call done); ``device``: a torch device;
    ``how``: the effective mode (:func:`flyexplore.measure.modes.effective`); ``sampler``: read
    once per round (its ``clock_mhz``); ``flush``: the cache flush (default: on a GPU);
    ``lead_call``: before the timed calls of each round, one untimed call of the round's first
    callable (an environment A/B's worker: the first call after the GPU was handed over from
    another process is not timed, :mod:`flyexplore.run.envworker`). ``clock`` (s) as in
    :func:`measure_interleaved`. A round source of :func:`sequential_rounds` (:attr:`how`,
    :meth:`run`)."""

    def __init__(self, fns: dict, device, how: str, *, enter=None, sampler=None, flush: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter, lead_call: bool = False):
        import torch

        self.fns, self.names, self.how = fns, list(fns), how
        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        self.enter = enter or (lambda name: contextlib.nullcontext())
        self.sampler = sampler
        self.clock = clock
        self.call_clock = time.thread_time if how == "cpu-thread" else clock
        self.lead_call = lead_call
        self.cache = None
        if (self.gpu if flush is None else flush):
            nbytes = flush_bytes_for(self.device) if self.gpu else 64 * 2**20
            self.cache = torch.empty(nbytes // 4, dtype=torch.int32, device=self.device)
        self.flush_bytes = int(self.cache.numel() * 4) if self.cache is not None else 0
        self.sync = (lambda: torch.cuda.synchronize(self.device)) if self.gpu else (lambda: None)
        self.gate = GATE_CYCLES[1] // 20
        self.calls_per_round = 0
        self.notes: list[str] = []
        self._warm_ev: dict = {nm: [] for nm in self.names}
        self._warm_wall: dict = {nm: [] for nm in self.names}

    def warm(self, calls: int) -> dict:
        """One warm-up round: each callable ``calls`` times, after the flush, timed by events (GPU)
        or the call clock (CPU). Returns this round's per-call times (ms) per name; all of them are
        kept for :meth:`size` and :meth:`per_call_ms`."""
        import torch

        got = {nm: [] for nm in self.names}
        ev = []
        for name in self.names:
            with self.enter(name):
                for _ in range(calls):
                    if self.cache is not None:
                        self.cache.zero_()
                    if self.gpu:
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        self.fns[name]()
                        e.record()
                        ev.append((name, s, e))
                    else:
                        c0 = self.call_clock()
                        self.fns[name]()
                        got[name].append((self.call_clock() - c0) * 1e3)
        self.sync()
        for name, s, e in ev:
            got[name].append(s.elapsed_time(e))
        for nm in self.names:
            (self._warm_ev if self.gpu else self._warm_wall)[nm].extend(got[nm])
        return got

    def per_call_ms(self, name: str) -> float | None:
        """The median warm-up call of ``name`` (ms; GPU: events, ungated), None without one."""
        v = self._warm_ev[name] or self._warm_wall[name]
        return float(np.median(v)) if v else None

    def size(self, calls_per_round: int | None = None, slowest_ms: float | None = None) -> int:
        """Set and return :attr:`calls_per_round`: as given, else as many calls as fit in
        :data:`BLOCK_MS` of the slowest callable's warm-up call (``slowest_ms``, default this
        runner's own warm-up), 1 to :data:`CALLS_PER_ROUND`."""
        if calls_per_round is None:
            slowest = slowest_ms if slowest_ms is not None else max(
                (v for v in (self.per_call_ms(n) for n in self.names) if v), default=0.0)
            calls_per_round = calls_for(slowest, self.gpu)
        self.calls_per_round = int(calls_per_round)
        return self.calls_per_round

    def run(self, n_rounds: int, first: int, how: str | None = None) -> Chunk:
        """``n_rounds`` rounds, the first numbered ``first`` (its rotation), in mode ``how``
        (default :attr:`how`; ``"kernel"``: one profiler session over the chunk). Raises
        :class:`RestartRounds` when the profiler attributes no device time in ``kernel`` mode
        that was not asked for (the mode becomes ``event``, with a note), and ``RuntimeError``
        when it was asked for (``mode="kernel"``)."""
        import torch

        how = how or self.how
        names, fns, cache, gpu = self.names, self.fns, self.cache, self.gpu
        calls = self.calls_per_round
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
                clocks.append(self.sampler.clock_mhz() if self.sampler is not None else None)
                k0 = (first + r) % len(names)
                order = names[k0:] + names[:k0]
                if how == "event-gated":
                    h0 = self.clock()
                    torch.cuda._sleep(self.gate)
                if self.lead_call:  # the first call after a hand-off: not timed
                    with self.enter(order[0]):
                        fns[order[0]]()
                for name in order:
                    fn = fns[name]
                    times = []
                    with self.enter(name):
                        for _ in range(calls):
                            if cache is not None:
                                cache.zero_()
                            if not gpu:
                                t0 = self.call_clock()
                                fn()
                                times.append((self.call_clock() - t0) * 1e3)
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
                    h = self.clock() - h0
                    self.gate = int(min(max(h * 1.5 * 2e9, GATE_CYCLES[0]), GATE_CYCLES[1]))
                    self.sync()  # the next round's gate must start on an idle stream
                elif gpu and r % 8 == 7:
                    self.sync()  # keep the host within a few rounds of the device
            self.sync()
        finally:
            if prof is not None:
                prof.__exit__(None, None, None)
        for name, r, s, e in pending:
            ms = s.elapsed_time(e)
            ev[name].append(ms)
            if how in ("event", "event-gated"):
                out[name][r].append(ms)
        kern = {}
        if how == "kernel":
            per = ranges_device_ms(prof, {f"flyexplore::{nm}": nm for nm in names})
            for nm in names:
                got = per.get(nm, ([], {}))
                if len(got[0]) != n_rounds * calls or min(got[0], default=0) <= 0:
                    if how != self.how:   # an extra profiled round (which kernels ran): the caller's
                        raise _ProfilerGaveNothing(nm)
                    if self.mode_fixed:
                        raise RuntimeError(f"the profiler attributed no device time to backend {nm}")
                    self.notes.append("profiler attributed no device time to the calls; per-call events used")
                    self.how = "event"
                    raise RestartRounds(nm)
                it = iter(got[0])
                out[nm] = [[next(it) for _ in range(calls)] for _ in range(n_rounds)]
                kern[nm] = got[1]
        return Chunk(out, ev, kern, clocks)

    #: ``mode="kernel"`` was asked for (not a fallback): no device time is an error.
    mode_fixed = False


@dataclass
class Rounds:
    """The outcome of :func:`sequential_rounds`: per name the rounds (lists of call times, ms), the
    per-call event times (ms), the kernels seen (name -> durations, ms), the clock read at the start
    of each round, why the rounds ended (:data:`STOP_REASONS`) and when the labels were decided
    (``verdict_s``, s from ``t_start``; None if never)."""

    rounds: dict
    events: dict
    kernels: dict
    round_clocks: list
    stop_reason: str
    verdict_s: float | None

    @property
    def n(self) -> int:
        return len(self.round_clocks)


def sequential_rounds(source, baselines: dict, *, band: float, target: float, min_rounds: int,
                      max_rounds: int | None, limits: Limits, clock: Callable[[], float],
                      t_start: float) -> Rounds:
    """The sequential stopping rule of :func:`_measure_interleaved` over a round source.

    ``source``: has ``how`` (the mode now: ``kernel`` looks at 2x steps) and ``run(n_rounds,
    first) -> Chunk`` (a :class:`RoundRunner` in this process; an environment A/B's turns across
    worker processes, :mod:`flyexplore.run.envab`); ``run`` may raise :class:`RestartRounds`
    (what was collected is dropped). ``baselines``: every timed name -> the name its speedup is
    taken against (None: none; the labels decided at each look are these pairs'). ``band``,
    ``target``, ``min_rounds``, ``max_rounds`` (None: none) as in :func:`_measure_interleaved`;
    ``limits`` its caps (:class:`Limits`); ``clock`` and ``t_start`` (the first warm-up call) in
    seconds. Rounds start after warm-up. Returns :class:`Rounds`."""
    names = list(baselines)
    pairs = [(nm, b) for nm, b in baselines.items() if b is not None]
    rounds = {nm: [] for nm in names}
    values = {nm: np.empty(0) for nm in names}  # per-round values (round_values), as they come in
    events = {nm: [] for nm in names}
    kdur: dict[str, dict[str, list[float]]] = {nm: {} for nm in names}
    round_clocks: list = []
    t0 = clock()
    chunk = max(int(min_rounds), 1)
    verdict_s = None
    stop_reason = None
    label_min = 2 * max(int(min_rounds), 1)
    run_s = 0.0  # time spent in rounds (the stopping checks between chunks excluded)
    while True:
        chunk_t0 = clock()
        try:
            got = source.run(chunk, len(round_clocks))
        except RestartRounds:
            rounds = {nm: [] for nm in names}
            values = {nm: np.empty(0) for nm in names}
            events = {nm: [] for nm in names}
            round_clocks = []
            run_s = 0.0
            continue
        run_s += clock() - chunk_t0
        for nm in names:
            rounds[nm] += got.rounds[nm]
            values[nm] = np.concatenate([values[nm], round_values(got.rounds[nm])])
            events[nm] += got.events.get(nm, [])
            for kname, d in got.kernels.get(nm, {}).items():
                kdur[nm].setdefault(kname, []).extend(d)
        round_clocks += got.clocks
        n = len(round_clocks)
        settled, med_w = _look(values, pairs, band)
        now = clock()
        case_s, after_warmup_s = now - t_start, now - t0
        if settled and verdict_s is None:
            verdict_s = case_s
        if settled and med_w <= target and run_s >= limits.min_timed_s:
            stop_reason = "target"
        elif max_rounds is not None and n >= max_rounds:
            stop_reason = "max_rounds"
        elif settled and case_s >= limits.precision_cap_s:
            stop_reason = "precision_cap"
        elif not settled and case_s >= limits.label_cap_s and n >= label_min:
            stop_reason = "label_cap"
        elif after_warmup_s >= limits.budget_s:
            stop_reason = "budget"
        if stop_reason is not None:
            break
        # the next look: LOOK_GROWTH x the rounds so far; with the labels decided, where the
        # medians should reach the target (an interval narrows as 1/sqrt(rounds); +20%, at most
        # 4x the rounds so far); no later than the cap or budget now in force
        growth = 2.0 if source.how == "kernel" else LOOK_GROWTH
        nxt = math.ceil(n * growth)
        if settled:
            want = n * (med_w / target) ** 2 * 1.2 if math.isfinite(med_w) else math.inf
            nxt = max(nxt, math.ceil(min(want, 4 * n)))
        step = max(nxt - n, 1)
        deadline = min(limits.precision_cap_s if settled else limits.label_cap_s, (t0 - t_start) + limits.budget_s)
        per_round = run_s / n
        fit = math.ceil((deadline - case_s) / per_round) if per_round > 0 else step
        if not settled and n < label_min:
            fit = max(fit, label_min - n)
        chunk = max(1, min(step, fit))
        if max_rounds is not None:
            chunk = min(chunk, max_rounds - n)
    return Rounds(rounds, events, kdur, round_clocks, stop_reason, verdict_s)


def _half_width(est: float, lo: float, hi: float) -> float:
    """The larger relative half-width ``max((hi - est) / est, (est - lo) / est)``; ``inf``
    where an interval is missing (too few rounds) or ``est`` is not positive."""
    if not all(math.isfinite(x) for x in (est, lo, hi)) or est <= 0:
        return math.inf
    return max((hi - est) / est, (est - lo) / est)


def _look(values: dict, pairs, band: float) -> tuple[bool, float]:
    """One stopping check over the per-round values of each backend (in round order, the same
    for every backend). ``pairs``: ``(name, baseline name)`` of every speedup that needs a label.
    Returns ``(settled, medians)``: ``settled``, every such speedup (the paired per-round ratios,
    as :func:`flyexplore.measure.stats.paired_ratio`) has a label other than AMBIGUOUS at
    :data:`LOOK_CONFIDENCE`, or its 95% interval within ``+-band/2``; ``medians``, the largest
    relative half-width of a backend's 95% median interval (:func:`_half_width`)."""
    medians = 0.0
    for v in values.values():
        medians = max(medians, _half_width(float(np.median(v)), *median_ci(v)) if v.size else math.inf)
    settled = True
    for nm, b in pairs:
        v, base = values[nm], values[b]
        if not v.size or not base.size:
            return False, medians
        with np.errstate(divide="ignore", invalid="ignore"):
            r = base / v
        if verdict(*median_ci(r, LOOK_CONFIDENCE), band) != "AMBIGUOUS":
            continue
        if _half_width(float(np.median(r)), *median_ci(r)) > band / 2:
            settled = False
            break
    return settled, medians
