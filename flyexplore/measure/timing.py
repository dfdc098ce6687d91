"""Honest timing: a :class:`Timer` measures, an immutable :class:`Measurement` holds the raw
samples and the statistics.

Timing modes (``Measurement.mode``): the one table is :data:`flyexplore.measure.modes.TABLE`
(name, device, the timers that take it, its meaning); :class:`Timer` takes the ``block`` modes.
What the table's lines leave out:

``cpu-thread``
    ``time.thread_time`` around each call, with :data:`CPU_TIMING_THREADS` intra-op thread(s)
    (on a loaded 2-core machine a 256^3 matmul read a 5.4 ms worst call by wall clock, 0.95 ms
    by thread time).
``cpu-wall``
    ``time.perf_counter`` around each call; also what ``cpu-thread`` and ``auto`` become when a
    custom ``clock`` is given (:func:`flyexplore.measure.modes.effective`).
``event``
    A device event pair around each call, with the cache flushed before each call, as
    ``triton.testing.do_bench`` does. Includes host launch overhead when a call is short.
``graph``
    At most :data:`GRAPH_MAX_CALLS` calls per capture (large captures have crashed on MI350).
    No flush between calls inside a graph (warm cache).
``kernel``
    Each call inside a ``record_function`` range and preceded by a cache flush.
``auto`` (default)
    CPU: ``cpu-thread`` (``cpu-wall`` with a custom ``clock``). GPU: ``kernel`` as the headline,
    with the ``event`` per-call median kept in ``per_call_ms``, so that short, launch-bound calls
    get the right verdict (on an H200, 16x28672x4096 bf16: events say Triton is 0.79x of ATen,
    kernel time says 1.05x; a lent-GPU probe, torch 2.11; ``data/h200/trace/`` holds
    this shape's kernels). Falls back to ``graph`` then
    ``event`` if the profiler gives no device time, with a note saying so.

All times are milliseconds (``*_ms``). The noise and host-bound thresholds are named constants.

Several backends of one case timed round by round: :mod:`flyexplore.measure.interleaved`
(:func:`~flyexplore.measure.interleaved.measure_interleaved`, :class:`~flyexplore.measure.interleaved.Interleaved`
and their defaults), built on this module's :class:`Measurement` and clocks; this module never
imports it.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from flyexplore.measure import modes
from flyexplore.measure.stats import CONFIDENCE, median_ci, round_values

#: A measurement is flagged noisy when IQR / median exceeds this (torch.utils.benchmark's 10%).
NOISY_IQR_FRACTION = 0.10
#: A GPU call is flagged host-bound when per-call event time / kernel time exceeds this.
HOST_BOUND_RATIO = 1.25
#: Largest number of calls captured in one graph for ``graph`` mode.
GRAPH_MAX_CALLS = 16
#: The profiler's (Kineto's) log level that keeps its harmless lines off stderr: its start-up
#: noise and the ``USDT: ... profiler_start`` / ``profiler_stop`` lines of each profiled call, which
#: it logs at its top severity (USDT = 5, above ERROR = 4), so only the level past it silences
#: them (issue 45). Read when the profiler first starts.
KINETO_QUIET_LEVEL = "6"


def quiet_profiler_log(environ=None) -> None:
    """Set ``KINETO_LOG_LEVEL`` to :data:`KINETO_QUIET_LEVEL` in ``environ`` (default
    ``os.environ``) unless it is set already: the command line (on a machine without a GPU, and for
    ``model --measure`` on the CPU) and every environment A/B worker call it."""
    (os.environ if environ is None else environ).setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)


#: Smallest cache flush on a GPU (``triton.testing.do_bench`` uses 256 MB).
MIN_FLUSH_BYTES = 256 * 2**20
#: Last-level caches that ``torch.cuda.get_device_properties`` does not report (bytes).
#: AMD Infinity Cache: MI300X (gfx942) and MI350X/MI355X (gfx950) have 256 MiB.
EXTRA_LLC_BYTES = {"gfx942": 256 * 2**20, "gfx950": 256 * 2**20}


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
        (:func:`flyexplore.measure.stats.median_ci` over the round medians, or over the samples)."""
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

    ``mode``: one of :func:`flyexplore.measure.modes.names` ``("block")`` (default ``auto``,
    :data:`flyexplore.measure.modes.AUTO`). Raises :class:`~flyexplore.errors.UsageError` (a
    ``ValueError``) for a mode the table does not give this timer, or one for the other device
    (:func:`flyexplore.measure.modes.check`).
    """

    def __init__(self, fn: Callable[[], object], device="cpu", *, mode: str = "auto",
                 warmup: int | None = None, rep: int | None = None,
                 warmup_ms: float | None = None, rep_ms: float | None = None,
                 min_reps: int = 5, max_reps: int = 1000, flush: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        import torch

        self.fn = fn
        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        self.mode = modes.check(mode, "block", self.gpu)
        self.warmup, self.rep = warmup, rep
        self.warmup_ms = warmup_ms if warmup_ms is not None else (25.0 if self.gpu else 20.0)
        self.rep_ms = rep_ms if rep_ms is not None else (100.0 if self.gpu else 100.0)
        self.min_reps, self.max_reps = min_reps, max_reps
        self.flush = self.gpu if flush is None else flush
        self.clock = clock
        # the CPU's default: thread CPU time, unless a clock was given (taken as a wall clock)
        self._cpu_mode = (modes.effective(mode, "block", False, clock is not time.perf_counter)
                          if not self.gpu else None)
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
    samples, per_kernel = ranges_device_ms(prof, {label: label}).get(label, ([], {}))
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


def ranges_device_ms(prof, labels: dict) -> dict:
    """Per name: (device ms of each ``record_function`` range, in order; kernel name -> its
    durations in ms), for the ranges named in ``labels`` (range name -> backend name). kineto
    also reports each range on the GPU timeline (gpu_user_annotation); only the CPU-side range
    counts, whose device time is the sum of the kernels launched inside it. ``prof``: a finished
    ``torch.profiler.profile``. Used by :func:`kernel_times_from_profile` and
    :func:`flyexplore.measure.interleaved.measure_interleaved`."""
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
