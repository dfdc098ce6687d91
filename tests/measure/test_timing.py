import math

import pytest
import torch

from flyexplore.measure.timing import (HOST_BOUND_RATIO, NOISY_IQR_FRACTION, Measurement, Timer,
                               summarize)


def test_statistics_of_known_samples():
    m = Measurement(tuple(float(x) for x in range(1, 11)), "cpu-wall")  # 1..10 ms
    assert m.n == 10
    assert m.median == pytest.approx(5.5)
    assert m.min == 1.0 and m.max == 10.0
    assert m.iqr == pytest.approx(7.75 - 3.25)  # numpy linear percentiles
    assert m.p20 == pytest.approx(2.8) and m.p80 == pytest.approx(8.2)
    assert m.mean == pytest.approx(5.5)
    assert m.noisy  # IQR 4.5 / median 5.5 > 10%


def test_noise_flag_threshold():
    quiet = Measurement((1.0, 1.0, 1.01, 1.02, 1.0), "event")
    assert not quiet.noisy
    spread = 1.0 + 2 * NOISY_IQR_FRACTION
    noisy = Measurement((1.0, 1.0, spread, spread, 1.0, spread), "event")
    assert noisy.noisy
    assert "noisy" in repr(noisy)


def test_host_bound_needs_per_call_and_kernel_mode():
    k = Measurement((10e-3,) * 5, "kernel", per_call_ms=10e-3 * (HOST_BOUND_RATIO + 0.1))
    assert k.host_bound is True
    k2 = Measurement((10e-3,) * 5, "kernel", per_call_ms=10e-3 * 1.05)
    assert k2.host_bound is False
    assert Measurement((1.0,), "cpu-wall").host_bound is None


def test_measurement_rejects_bad_samples():
    with pytest.raises(ValueError):
        Measurement((), "cpu-wall")
    with pytest.raises(ValueError):
        Measurement((1.0, float("nan")), "cpu-wall")
    with pytest.raises(ValueError):
        Measurement((-1.0,), "cpu-wall")


class FakeClock:
    """A clock the timed function advances by a scripted duration per call (seconds)."""

    def __init__(self, durations):
        self.t = 0.0
        self.durations = list(durations)
        self.calls = 0

    def __call__(self):
        return self.t

    def fn(self):
        self.t += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_timer_with_fake_clock_counts_and_samples():
    clock = FakeClock([1e-3, 2e-3, 3e-3, 4e-3])
    m = Timer(clock.fn, "cpu", warmup=2, rep=8, clock=clock).measure()
    assert m.mode == "cpu-wall"
    assert m.n == 8 and m.warmup == 2
    # after 2 warm-up calls the samples cycle 3,4,1,2,... ms
    assert list(m.samples_ms) == pytest.approx([3, 4, 1, 2, 3, 4, 1, 2])
    assert m.median == pytest.approx(2.5)
    assert clock.calls == 10


def test_timer_time_budget_sets_repetitions():
    clock = FakeClock([2e-3])  # 2 ms per call
    m = Timer(clock.fn, "cpu", rep_ms=40, warmup_ms=10, clock=clock, min_reps=3).measure()
    assert m.n == 20  # 40 ms / 2 ms
    assert m.warmup == 5  # 10 ms / 2 ms
    assert m.median == pytest.approx(2.0)


def test_timer_min_reps_for_slow_calls():
    clock = FakeClock([1.0])  # 1 s per call, far over the budget
    m = Timer(clock.fn, "cpu", rep_ms=10, clock=clock, min_reps=5).measure()
    assert m.n == 5


def test_timer_real_cpu_call_and_summary_columns():
    a = torch.randn(64, 64)
    m = Timer(lambda: a @ a, "cpu", rep=20, warmup=2).measure()
    s = m.summary()
    assert s["timing_mode"] == "cpu-thread" and s["n_samples"] == 20
    assert 0 < s["time_min_ms"] <= s["time_ms"] <= s["time_p80_ms"]
    assert s["host_bound"] is None


def test_timer_rejects_gpu_modes_on_cpu_and_unknown_modes():
    with pytest.raises(ValueError, match="needs a GPU"):
        Timer(lambda: None, "cpu", mode="kernel")
    with pytest.raises(ValueError, match="unknown timing mode"):
        Timer(lambda: None, "cpu", mode="fast")


def test_summarize_matches_measurement():
    s = summarize([1, 2, 3])
    assert s["time_ms"] == 2 and s["n_samples"] == 3 and math.isclose(s["time_iqr_ms"], 1.0)


def test_profiler_attribution_on_cpu_gives_no_device_time():
    """kernel mode needs device kernels; on CPU the profiler attributes none (so auto uses
    cpu-wall there). This exercises the real profiler parsing path."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from flyexplore.measure.timing import kernel_times_from_profile

    a = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("flyexplore::call"):
                a @ a
    samples, kernels = kernel_times_from_profile(prof, 3, "flyexplore::call")
    assert len(samples) == 3 and all(s == 0 for s in samples) and kernels == ()


def test_the_interleaved_timer_builds_on_timing_not_the_reverse():
    """flyexplore.measure.interleaved imports flyexplore.measure.timing (Measurement, clocks); timing never
    imports interleaved, so either may be imported first and there is no cycle."""
    import subprocess
    import sys

    from conftest import ROOT
    code = ("import sys, flyexplore.measure.timing as T; assert 'flyexplore.measure.interleaved' not in sys.modules; "
            "import flyexplore.measure.interleaved as I; assert I.Measurement is T.Measurement")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
