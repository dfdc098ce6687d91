"""Honest timing: a :class:`Timer` measures, an immutable :class:`Measurement` holds the raw
samples and the statistics.

Timing modes (``Measurement.mode``):

``cpu-thread``
    ``time.thread_time`` around each call (CPU device, the default there): the CPU time of
    the calling thread, with :data:`CPU_TIMING_THREADS` intra-op thread(s), so that time
    slices lost to other processes on a shared machine do not count (on a loaded 2-core
    machine a 256^3 matmul read a 5.4 ms worst call by wall clock, 0.95 ms by thread time).
``cpu-wall``
    ``time.perf_counter`` around each call (CPU device; also when a custom ``clock`` is given).
``event``
    A device event pair around each call, with the cache flushed before each call, as
    ``triton.testing.do_bench`` does. Includes host launch overhead when a call is short.
``graph``
    CUDA/HIP graph replay of a small capture (at most :data:`GRAPH_MAX_CALLS` calls; large
    captures have crashed on MI350), events around each replay, divided by the calls per graph.
    No flush between calls inside a graph (warm cache).
``kernel``
    Device time of the kernels each call launched, from ``torch.profiler`` (kineto), each call
    inside a ``record_function`` range and preceded by a cache flush. No host overhead.
``auto`` (default)
    CPU: ``cpu-wall``. GPU: ``kernel`` as the headline, with the ``event`` per-call median kept
    in ``per_call_ms``, so that short, launch-bound calls get the right verdict (on an H200,
    16x28672x4096 bf16: events say Triton is 0.79x of ATen, kernel time says 1.05x;
    ``shared/measurements/README.md``). Falls back to ``graph`` then ``event`` if the profiler
    gives no device time, with a note saying so.

All times are milliseconds (``*_ms``). The noise and host-bound thresholds are named constants.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .stats import CONFIDENCE, median_ci, paired_ratio, round_values

#: A measurement is flagged noisy when IQR / median exceeds this (torch.utils.benchmark's 10%).
NOISY_IQR_FRACTION = 0.10
#: A GPU call is flagged host-bound when per-call event time / kernel time exceeds this.
HOST_BOUND_RATIO = 1.25
#: Largest number of calls captured in one graph for ``graph`` mode.
GRAPH_MAX_CALLS = 16
#: Smallest cache flush on a GPU (``triton.testing.do_bench`` uses 256 MB).
MIN_FLUSH_BYTES = 256 * 2**20
#: Last-level caches that ``torch.cuda.get_device_properties`` does not report (bytes).
#: AMD Infinity Cache: MI300X (gfx942) and MI350X/MI355X (gfx950) have 256 MiB.
EXTRA_LLC_BYTES = {"gfx942": 256 * 2**20, "gfx950": 256 * 2**20}

MODES = ("auto", "cpu-thread", "cpu-wall", "event", "graph", "kernel")
CPU_MODES = ("auto", "cpu-thread", "cpu-wall")


@dataclass(frozen=True)
class KernelTime:
    """One device kernel seen by the profiler: launches per call and device time per call (µs)."""

    name: str
    calls_per_iter: float
    us_per_iter: float


@dataclass(frozen=True)
class Measurement:
    """Raw samples (ms, one per timed call) and the statistics derived from them.

    ``per_call_ms`` is the per-call event (or wall) median kept beside a ``kernel`` or
    ``graph`` headline; ``kernels`` lists the device kernels the profiler attributed to the
    call (``kernel`` mode only). Statistics use linear-interpolated percentiles; nothing is
    dropped as an outlier.
    """

    samples_ms: tuple[float, ...]
    mode: str
    per_call_ms: float | None = None
    flush_bytes: int = 0
    warmup: int = 0
    kernels: tuple[KernelTime, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Interleaved timing: the samples grouped by round (each round a few calls); empty for
    #: block-wise timing, where every call is its own sample.
    rounds: tuple[tuple[float, ...], ...] = ()
    order: str = "block"

    def __post_init__(self):
        if not self.samples_ms:
            raise ValueError("a Measurement needs at least one sample")
        if any(not math.isfinite(s) or s < 0 for s in self.samples_ms):
            raise ValueError(f"samples must be finite and >= 0, got {self.samples_ms!r}")

    def _q(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.samples_ms, dtype=float), q))

    @property
    def n(self) -> int:
        return len(self.samples_ms)

    @property
    def median(self) -> float:
        """Median of the per-round medians (interleaved) or of the samples (block-wise)."""
        if self.rounds:
            return float(np.median(round_values(self.rounds)))
        return self._q(50)

    def ci(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """Order-statistic ``confidence`` interval of :attr:`median`
        (:func:`flyexplore.stats.median_ci` over the round medians, or over the samples)."""
        return median_ci(round_values(self.rounds) if self.rounds else self.samples_ms, confidence)

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples_ms))

    @property
    def min(self) -> float:
        return float(min(self.samples_ms))

    @property
    def max(self) -> float:
        return float(max(self.samples_ms))

    @property
    def p20(self) -> float:
        return self._q(20)

    @property
    def p80(self) -> float:
        return self._q(80)

    @property
    def iqr(self) -> float:
        return self._q(75) - self._q(25)

    @property
    def noisy(self) -> bool:
        """IQR / median > :data:`NOISY_IQR_FRACTION`."""
        med = self.median
        return med > 0 and self.iqr / med > NOISY_IQR_FRACTION

    @property
    def host_bound(self) -> bool | None:
        """Per-call time / kernel time > :data:`HOST_BOUND_RATIO`; ``None`` when unknown (CPU)."""
        if self.per_call_ms is None or self.mode not in ("kernel", "graph", "event-gated"):
            return None
        med = self.median
        return med > 0 and self.per_call_ms / med > HOST_BOUND_RATIO

    def summary(self) -> dict:
        """Flat dict of the statistics, as stored in a result row (raw samples included, as
        JSON: a list of rounds, each a list of call times in ms; block-wise: one call a round)."""
        lo, hi = self.ci()
        rounds = self.rounds or tuple((s,) for s in self.samples_ms)
        return {
            "time_ms": self.median,
            "time_ci_lo_ms": lo,
            "time_ci_hi_ms": hi,
            "order": self.order,
            "rounds": len(rounds),
            "calls_per_round": max(len(r) for r in rounds),
            "samples_ms": samples_json(rounds),
            "time_iqr_ms": self.iqr,
            "time_p20_ms": self.p20,
            "time_p80_ms": self.p80,
            "time_min_ms": self.min,
            "time_mean_ms": self.mean,
            "n_samples": self.n,
            "timing_mode": self.mode,
            "per_call_ms": self.per_call_ms,
            "noisy": self.noisy,
            "host_bound": self.host_bound,
            "flush_bytes": self.flush_bytes,
        }

    def __repr__(self) -> str:
        flags = []
        if self.noisy:
            flags.append(f"noisy: IQR {100 * self.iqr / self.median:.0f}% of median")
        if self.host_bound:
            flags.append(f"host-bound: per-call {self.per_call_ms * 1e3:.1f} us")
        extra = f" [{'; '.join(flags)}]" if flags else ""
        return (f"Measurement({self.mode}: median {self.median * 1e3:.2f} us, "
                f"IQR {self.iqr * 1e3:.2f} us, min {self.min * 1e3:.2f} us, n={self.n}){extra}")


def flush_bytes_for(device) -> int:
    """Cache-flush buffer size for ``device``: at least :data:`MIN_FLUSH_BYTES` and twice
    the reported L2 plus any last-level cache torch does not report (:data:`EXTRA_LLC_BYTES`).
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return 0
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
    return max(MIN_FLUSH_BYTES, 2 * (l2 + EXTRA_LLC_BYTES.get(arch, 0)))


class Timer:
    """Measure ``fn()`` (a zero-argument callable) on ``device``.

    Repetition is by count (``rep``, ``warmup``) or by time budget (``rep_ms``,
    ``warmup_ms``; the count is estimated from a few calls and kept between ``min_reps``
    and ``max_reps``). ``clock`` (seconds, default ``time.perf_counter``) can be swapped for
    tests of the statistics. ``flush`` (default: on for GPUs, off for CPU) zeroes a buffer of
    :func:`flush_bytes_for` bytes before each timed call.

    Raises ``ValueError`` for an unknown ``mode`` or a GPU mode on CPU.
    """

    def __init__(self, fn: Callable[[], object], device="cpu", *, mode: str = "auto",
                 warmup: int | None = None, rep: int | None = None,
                 warmup_ms: float | None = None, rep_ms: float | None = None,
                 min_reps: int = 5, max_reps: int = 1000, flush: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        import torch

        if mode not in MODES:
            raise ValueError(f"unknown timing mode {mode!r} (valid: {', '.join(MODES)})")
        self.fn = fn
        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        if not self.gpu and mode not in CPU_MODES:
            raise ValueError(f"timing mode {mode!r} needs a GPU; on CPU use 'cpu-thread' or 'cpu-wall'")
        if self.gpu and mode in ("cpu-wall", "cpu-thread"):
            raise ValueError(f"timing mode {mode!r} is for the CPU; on a GPU use event/graph/kernel")
        self.mode = mode
        self.warmup, self.rep = warmup, rep
        self.warmup_ms = warmup_ms if warmup_ms is not None else (25.0 if self.gpu else 20.0)
        self.rep_ms = rep_ms if rep_ms is not None else (100.0 if self.gpu else 100.0)
        self.min_reps, self.max_reps = min_reps, max_reps
        self.flush = self.gpu if flush is None else flush
        self.clock = clock
        # the CPU's default: thread CPU time, unless a clock was given (taken as a wall clock)
        self._cpu_mode = ("cpu-thread" if mode in ("auto", "cpu-thread") and clock is time.perf_counter
                          else "cpu-wall")
        self._call_clock = time.thread_time if self._cpu_mode == "cpu-thread" else clock
        self._cache = None

    # -- helpers -------------------------------------------------------------------------
    def _sync(self):
        if self.gpu:
            import torch
            torch.cuda.synchronize(self.device)

    def _flush_buffer(self):
        import torch

        if not self.flush:
            return None
        if self._cache is None:
            nbytes = flush_bytes_for(self.device) if self.gpu else 64 * 2**20
            self._cache = torch.empty(nbytes // 4, dtype=torch.int32, device=self.device)
        return self._cache

    def _estimate_ms(self) -> float:
        """Mean ms of a few back-to-back calls (used only to size repetition counts)."""
        self.fn()
        self._sync()
        t0 = self.clock()
        k = 0
        while True:
            self.fn()
            k += 1
            self._sync()
            el = (self.clock() - t0) * 1e3
            if k >= 5 or el > self.rep_ms:
                return max(el / k, 1e-6)

    def _counts(self) -> tuple[int, int]:
        if self.warmup is not None and self.rep is not None:
            return self.warmup, self.rep
        est = self._estimate_ms()
        warm = self.warmup if self.warmup is not None else max(1, int(self.warmup_ms / est))
        rep = self.rep if self.rep is not None else int(self.rep_ms / est)
        return min(warm, self.max_reps), max(self.min_reps, min(rep, self.max_reps))

    # -- modes ---------------------------------------------------------------------------
    def _cpu_wall(self, rep: int) -> list[float]:
        cache = self._flush_buffer()
        out = []
        for _ in range(rep):
            if cache is not None:
                cache.zero_()
            t0 = self._call_clock()
            self.fn()
            out.append((self._call_clock() - t0) * 1e3)
        return out

    def _event(self, rep: int) -> list[float]:
        import torch

        cache = self._flush_buffer()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
        for i in range(rep):
            if cache is not None:
                cache.zero_()
            starts[i].record()
            self.fn()
            ends[i].record()
        self._sync()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def _graph(self, rep: int, est_ms: float) -> list[float]:
        import torch

        calls = int(min(GRAPH_MAX_CALLS, max(1, math.ceil(0.05 / max(est_ms, 1e-6)))))
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                self.fn()
        graph.replay()
        self._sync()
        reps = max(self.min_reps, min(rep, 200))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            starts[i].record()
            graph.replay()
            ends[i].record()
        self._sync()
        del graph
        return [s.elapsed_time(e) / calls for s, e in zip(starts, ends)]

    def _kernel(self, rep: int) -> tuple[list[float], tuple[KernelTime, ...]]:
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile

        cache = self._flush_buffer()
        reps = max(self.min_reps, min(rep, 100))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                if cache is not None:
                    cache.zero_()
                with record_function("flyexplore::call"):
                    self.fn()
            self._sync()
        return kernel_times_from_profile(prof, reps, "flyexplore::call")

    def measure(self) -> Measurement:
        """Warm up, then time ``fn`` in the chosen mode; returns a :class:`Measurement`. On the
        CPU with :data:`CPU_TIMING_THREADS` intra-op threads."""
        with cpu_threads(self.gpu):
            return self._measure()

    def _measure(self) -> Measurement:
        warm, rep = self._counts()
        for _ in range(warm):
            self.fn()
        self._sync()
        flush = int(self._flush_buffer().numel() * 4) if self.flush else 0
        if not self.gpu:
            return Measurement(tuple(self._cpu_wall(rep)), self._cpu_mode, flush_bytes=flush, warmup=warm)
        if self.mode == "event":
            return Measurement(tuple(self._event(rep)), "event", flush_bytes=flush, warmup=warm)
        if self.mode == "graph":
            ev = self._event(rep)
            return Measurement(tuple(self._graph(rep, float(np.median(ev)))), "graph",
                               per_call_ms=float(np.median(ev)), warmup=warm)
        if self.mode == "kernel":
            ev = self._event(rep)
            samples, kernels = self._kernel(rep)
            if not samples:
                raise RuntimeError("the profiler attributed no device kernel to the call")
            return Measurement(tuple(samples), "kernel", per_call_ms=float(np.median(ev)),
                               flush_bytes=flush, warmup=warm, kernels=kernels)
        # auto
        ev = self._event(rep)
        per_call = float(np.median(ev))
        notes = []
        try:
            samples, kernels = self._kernel(rep)
            if samples and min(samples) > 0:
                return Measurement(tuple(samples), "kernel", per_call_ms=per_call,
                                   flush_bytes=flush, warmup=warm, kernels=kernels)
            notes.append("profiler attributed no device time to the call")
        except Exception as exc:  # profiler unavailable (e.g. no CUPTI/roctracer)
            notes.append(f"profiler failed: {type(exc).__name__}: {exc}")
        try:
            return Measurement(tuple(self._graph(rep, per_call)), "graph", per_call_ms=per_call,
                               warmup=warm, notes=tuple(notes))
        except Exception as exc:
            notes.append(f"graph capture failed: {type(exc).__name__}: {exc}")
        return Measurement(tuple(ev), "event", flush_bytes=flush, warmup=warm, notes=tuple(notes))


def _device_us(evt) -> float:
    for attr in ("device_time_total", "cuda_time_total"):
        v = getattr(evt, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def kernel_times_from_profile(prof, reps: int, label: str) -> tuple[list[float], tuple[KernelTime, ...]]:
    """Per-call device time (ms) of the kernels launched inside each ``label`` range, and the
    kernels themselves (name, launches per call, µs per call), from a ``torch.profiler`` run.
    """
    samples, per_kernel = _ranges_device_ms(prof, {label: label}).get(label, ([], {}))
    kernels = tuple(
        KernelTime(name, len(d) / max(reps, 1), sum(d) * 1e3 / max(reps, 1))
        for name, d in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1])))
    return samples, kernels


def summarize(samples_ms: Sequence[float]) -> dict:
    """Statistics of raw samples in ms, as :meth:`Measurement.summary` gives (mode ``given``)."""
    return Measurement(tuple(float(s) for s in samples_ms), "given").summary()


def samples_json(rounds: Sequence[Sequence[float]]) -> str:
    """Raw samples as stored in a row: JSON list of rounds, each a list of call times in ms,
    kept to 6 significant digits (far below any timer's resolution)."""
    return json.dumps([[float(f"{x:.6g}") for x in r] for r in rounds], separators=(",", ":"))


def rounds_from_json(text) -> tuple[tuple[float, ...], ...]:
    """Inverse of :func:`samples_json`; ``()`` for a missing value."""
    if not isinstance(text, str) or not text:
        return ()
    return tuple(tuple(float(x) for x in r) for r in json.loads(text))


#: Intra-op threads while timing on the CPU. With two threads on a small shared machine a
#: parallel region waits for a descheduled thread a whole scheduler time slice: on a 2-core
#: machine, right after an Inductor compile (its worker processes busy), a 128^3 fp32 matmul
#: read 16 ms instead of 0.05 ms in most calls with 2 threads and never with 1. CPU numbers
#: are for tests and demos; GPUs are what flyexplore measures.
CPU_TIMING_THREADS = 1


@contextlib.contextmanager
def cpu_threads(gpu: bool):
    """Set torch's intra-op threads to :data:`CPU_TIMING_THREADS` for CPU timing, restored on exit."""
    import torch

    if gpu:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(CPU_TIMING_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(old)


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
INTERLEAVED_MODES = ("auto", "cpu-thread", "cpu-wall", "event-gated", "event", "kernel")
#: ``event-gated``: the spin kernel that holds the stream at the start of each round runs for
#: 1.5x the host's enqueue time of the previous round (cycles counted at 2 GHz, above any
#: current GPU's clock, so it never runs short), between these bounds (cycles).
GATE_CYCLES = (100_000, 100_000_000)


@dataclass(frozen=True)
class Interleaved:
    """The outcome of :func:`measure_interleaved`.

    ``measurements``: one :class:`Measurement` per backend name (``order="interleaved"``, with
    ``rounds``); ``baseline``: the name speedups are taken against; ``converged``: every
    interval met ``target`` before the budget or ``max_rounds`` ran out; ``wall_s``: wall time
    from the first warm-up call to the end (s); ``round_clocks``: the SM clock (MHz) read at the
    start of each round (``None`` where there is no reading); ``state_start``/``state_end``:
    :meth:`flyexplore.devstate.NvmlSampler.sample` readings; ``max_clock_mhz``: the device's
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
        (:func:`flyexplore.stats.paired_ratio`)."""
        return paired_ratio(self.measurements[self.baseline].rounds, self.measurements[name].rounds)


class _ProfilerGaveNothing(RuntimeError):
    pass


def measure_interleaved(fns, device="cpu", **kw) -> Interleaved:
    """Time several callables of one case interleaved (see :func:`_measure_interleaved` for
    the arguments and the rules). On the CPU the calls run with :data:`CPU_TIMING_THREADS`
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
    :class:`Timer`'s. ``enter(name)`` (optional) returns a context manager entered around each
    block of one backend's calls (its switches, e.g. FlyDSL overrides off for ATen).
    ``warmup_rounds`` replaces the warm-up time by a number of rounds. With ``band`` (the SAME
    band of :func:`flyexplore.stats.verdict`), a speedup whose label is still AMBIGUOUS keeps
    the case going until its interval is within ``+-band/2`` (or the budget ends), so that
    AMBIGUOUS means "at a band edge", not "too few rounds".

    Stopping: after ``min_rounds`` rounds and then after each chunk of rounds, the
    order-statistic 95% interval of every backend's median round time and of every speedup
    against ``baseline`` (paired rounds) is checked; when all lie within ``+-target`` of their
    estimate (default 1%, nvbench's ``stdrel`` idea applied to intervals) the case has
    converged. Otherwise rounds continue until ``max_rounds`` or ``budget_s`` seconds after
    warm-up (default 10 s on GPU, 2 s on CPU), and ``converged`` is False.

    Modes: ``auto`` (CPU: ``cpu-thread`` -- ``cpu-wall`` when a custom ``clock`` is given --;
    GPU: ``event-gated``), ``cpu-thread``, ``cpu-wall``,
    ``event-gated`` (GPU: an event pair around each call, and at the start of each round a spin
    kernel (``torch.cuda._sleep``) holds the stream while the host enqueues the whole round, so
    the events see device time without host launch gaps -- what graph replay or the
    profiler's kernel time gives, nvbench's "blocking kernel" idea -- at the cost of events;
    then one profiled round lists each backend's kernels; the ungated per-call time of the
    warm-up is kept as ``per_call_ms``), ``event`` (ungated: includes launch gaps of short
    calls), ``kernel`` (device kernel time from ``torch.profiler`` in chunks of rounds: exact
    per-kernel attribution, several times the wall time). Graph replay is block-wise only
    (:class:`Timer`). ``sampler``: a :mod:`flyexplore.devstate` sampler read
    at the start and end and once per round (default: :func:`flyexplore.devstate.sampler_for`).
    ``clock`` (s) can be swapped for tests.

    Raises ``ValueError`` for an unknown or unsupported mode, an empty ``fns``, a
    ``baseline`` not in ``fns``, or non-positive counts, target or budget."""
    import torch

    if not fns:
        raise ValueError("measure_interleaved needs at least one callable")
    if mode not in INTERLEAVED_MODES:
        raise ValueError(f"timing mode {mode!r} cannot be interleaved (valid: "
                         f"{', '.join(INTERLEAVED_MODES)}; graph replay is block-wise only)")
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
    if not gpu and mode not in CPU_MODES:
        raise ValueError(f"timing mode {mode!r} needs a GPU; on CPU use 'cpu-thread' or 'cpu-wall'")
    if gpu and mode in ("cpu-wall", "cpu-thread"):
        raise ValueError(f"timing mode {mode!r} is for the CPU; on a GPU use event-gated/event/kernel")
    kind = "cuda" if gpu else "cpu"
    budget_s = CASE_BUDGET_S[kind] if budget_s is None else float(budget_s)
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s!r}")
    warmup_ms = WARMUP_MS[kind] if warmup_ms is None else float(warmup_ms)
    if sampler is None:
        from .devstate import sampler_for
        sampler = sampler_for(dev)
    if gpu:
        eff = "event-gated" if mode == "auto" else mode
    else:
        eff = ("cpu-thread" if mode in ("auto", "cpu-thread") and clock is time.perf_counter
               else "cpu-wall")
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
            per = _ranges_device_ms(prof, {f"flyexplore::{nm}": nm for nm in names})
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
    from .stats import verdict

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


def _ranges_device_ms(prof, labels: dict) -> dict:
    """Per name: (device ms of each ``record_function`` range, in order; kernel name -> its
    durations in ms), for the ranges named in ``labels`` (range name -> backend name). kineto
    also reports each range on the GPU timeline (gpu_user_annotation); only the CPU-side range
    counts, whose device time is the sum of the kernels launched inside it."""
    from torch.autograd import DeviceType

    out: dict = {}
    for evt in prof.events():
        nm = labels.get(evt.name)
        if nm is None or evt.device_type != DeviceType.CPU:
            continue
        samples, kern = out.setdefault(nm, ([], {}))
        samples.append(_device_us(evt) / 1e3)
        stack = list(evt.cpu_children)
        while stack:
            child = stack.pop()
            stack.extend(child.cpu_children)
            for k in getattr(child, "kernels", ()):
                kern.setdefault(k.name, []).append(float(k.duration) / 1e3)
    return out
