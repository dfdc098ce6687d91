"""Verdicts that hold: intervals, labels, interleaved rounds with a seeded fake clock, the
stopping rule, device state, result schema 2 and its migration, compare labels."""
import json
import math
import sys
import types

import numpy as np
import pandas as pd
import pytest
import torch

from flyexplore.results import table as R
from flyexplore.measure import stats as S
from flyexplore.measure.devstate import THROTTLE_FRACTION, AmdSmiSampler, NvmlSampler, case_columns
from flyexplore.measure.interleaved import measure_interleaved
from flyexplore.measure.timing import Timer, rounds_from_json, samples_json


# -- statistics ------------------------------------------------------------------------------

def test_median_ci_is_order_statistics_and_covers():
    v = np.arange(1.0, 21.0)  # 1..20
    lo, hi = S.median_ci(v)
    assert lo in v and hi in v and lo < np.median(v) < hi
    # 95% binomial ranks for n=20 are the 6th and 15th values
    assert (lo, hi) == (6.0, 15.0)
    assert all(math.isnan(x) for x in S.median_ci([1.0, 2.0, 3.0, 4.0, 5.0]))  # too few for 95%
    rng = np.random.default_rng(1)
    cover = 0
    for _ in range(400):
        x = rng.lognormal(0.0, 0.3, size=25)  # true median 1.0
        a, b = S.median_ci(x)
        cover += a <= 1.0 <= b
    assert cover / 400 >= 0.93
    with pytest.raises(ValueError):
        S.median_ci(v, confidence=1.5)


def test_median_ci_ranks_are_scipy_quantile_tests():
    """The ranks come from the binomial CDF (fast); they are the ones quantile_test picks."""
    from scipy.stats import quantile_test

    S.median_ci_ranks.cache_clear()
    for conf in (0.95, 0.99, 0.9):
        for n in [*range(1, 400), 1000, 2047, 4096, 10007, 65536]:
            ci = quantile_test(np.arange(n, dtype=float), q=(n - 1) / 2, p=0.5).confidence_interval(conf)
            lo, hi = float(ci.low), float(ci.high)
            want = (int(lo) if math.isfinite(lo) else -1, int(hi) if math.isfinite(hi) else n)
            assert S.median_ci_ranks(n, conf) == want, (n, conf)


@pytest.mark.parametrize("lo,hi,label", [
    (0.995, 1.005, "SAME"), (0.99, 1.01, "SAME"), (1.02, 1.05, "FASTER"), (0.90, 0.98, "SLOWER"),
    (0.985, 1.002, "AMBIGUOUS"), (1.005, 1.03, "AMBIGUOUS"), (0.5, 2.0, "AMBIGUOUS"),
    (float("nan"), 1.0, "AMBIGUOUS")])
def test_verdict_labels(lo, hi, label):
    assert S.verdict(lo, hi) == label


def test_verdict_band_is_a_parameter():
    assert S.verdict(1.02, 1.04, band=0.05) == "SAME"
    assert S.verdict(1.02, 1.04, band=0.01) == "FASTER"


def test_verdicts_of_many_intervals_are_each_the_verdict_of_one():
    """The array form (what the speedup rules label thousands of pairs with) gives, row by row,
    what :func:`verdict` gives: at the band's edges, inside, outside, with missing bounds and
    per-row bands."""
    rng = np.random.default_rng(0)
    edge = [0.99, 1.01, 0.95, 1.05, 1.0]
    lo = np.concatenate([rng.uniform(0.8, 1.2, 400), edge, [np.nan, 1.0, -np.inf, 0.9]])
    hi = np.concatenate([lo[:400] * rng.uniform(1.0, 1.1, 400), edge, [1.0, np.nan, 1.0, np.inf]])
    band = np.concatenate([rng.choice([0.01, 0.05], 400), [0.01, 0.01, 0.05, 0.05, 0.0], [0.01] * 4])
    want = [S.verdict(a, b, c) for a, b, c in zip(lo.tolist(), hi.tolist(), band.tolist())]
    assert S.verdicts(lo, hi, band).tolist() == want
    assert S.verdicts(lo, hi).tolist() == [S.verdict(a, b) for a, b in zip(lo.tolist(), hi.tolist())]
    assert set(want) == {"SAME", "FASTER", "SLOWER", "AMBIGUOUS"}


def test_paired_ratio_cancels_a_shared_drift_unpaired_does_not():
    drift = np.linspace(1.0, 1.5, 30)
    base = [[1.1 * d] for d in drift]
    x = [[1.0 * d] for d in drift]
    est, lo, hi = S.paired_ratio(base, x)
    assert est == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    e2, lo2, hi2 = S.unpaired_ratio(S.round_values(base), S.round_values(x))
    assert lo2 < 1.0 < hi2  # the drift swamps a 10% difference when rounds are not paired
    assert S.verdict(lo, hi) == "FASTER" and S.verdict(lo2, hi2) == "AMBIGUOUS"
    with pytest.raises(ValueError):
        S.paired_ratio(base, x[:-1])


def test_geomean_ci_shrinks_with_cases_and_needs_intervals():
    est, lo, hi = S.geomean_ci([1.1] * 4, [1.05] * 4, [1.15] * 4)
    one = S.geomean_ci([1.1], [1.05], [1.15])
    assert est == pytest.approx(1.1)
    assert (hi - lo) == pytest.approx((one[2] - one[1]) / 2, rel=0.05)  # 1/sqrt(4)
    assert math.isnan(S.geomean_ci([1.1, 1.2], [1.0, float("nan")], [1.2, 1.3])[1])


def test_notch_ci_and_fmt():
    assert S.notch_ci(10.0, 2.0, 16) == pytest.approx((10 - 1.57 * 0.5, 10 + 1.57 * 0.5))
    assert S.fmt_interval(1.1, 1.05, 1.15, "FASTER") == "1.100x [1.050, 1.150] FASTER"
    assert S.fmt_interval(1.1, float("nan"), 1.2) == "1.100x [no interval]"


# -- interleaved rounds with a seeded fake clock ----------------------------------------------

class DriftClock:
    """A fake clock: each call advances it by its backend's base time, times a regime that
    drifts from 1.0 to ``1 + drift`` over ``span`` seconds (the GPU clock falling with load),
    times seeded log-normal noise."""

    def __init__(self, drift=0.5, span=0.5, sigma=0.0, seed=0):
        self.t, self.drift, self.span, self.sigma = 0.0, drift, span, sigma
        self.rng = np.random.default_rng(seed)

    def __call__(self):
        return self.t

    def fn(self, base_s):
        def call():
            regime = 1.0 + self.drift * min(self.t / self.span, 1.0)
            noise = float(self.rng.lognormal(0.0, self.sigma)) if self.sigma else 1.0
            self.t += base_s * regime * noise
        return call


def test_interleaved_reads_the_true_ratio_under_drift_block_order_does_not():
    c = DriftClock(drift=0.5, span=0.2)
    r = measure_interleaved({"a": c.fn(1.10e-3), "b": c.fn(1.00e-3)}, "cpu", baseline="a",
                            clock=c, min_rounds=10, budget_s=5.0)
    est, lo, hi = r.speedup("b")
    assert est == pytest.approx(1.10, rel=1e-6) and S.verdict(lo, hi) == "FASTER"
    assert r.measurements["a"].order == "interleaved" and r.rounds >= 10
    # block order on the same drifting clock: b is timed after a, in a slower regime
    c2 = DriftClock(drift=0.5, span=0.2)
    ma = Timer(c2.fn(1.10e-3), "cpu", warmup=2, rep=60, clock=c2).measure()
    mb = Timer(c2.fn(1.00e-3), "cpu", warmup=2, rep=60, clock=c2).measure()
    assert abs(ma.median / mb.median - 1.10) > 0.05


def test_a_vs_a_with_noise_reads_same_and_stops_when_tight():
    c = DriftClock(drift=0.3, span=1.0, sigma=0.02, seed=3)
    # a precision cap past the drift: the medians reach +-1% (the default cap ends this case
    # earlier, with the label decided: test_identical_callables_read_same_with_the_default_caps)
    r = measure_interleaved({"x": c.fn(1e-3), "y": c.fn(1e-3)}, "cpu", clock=c, budget_s=20.0,
                            precision_cap_s=20.0, band=0.01)
    est, lo, hi = r.speedup("y")
    assert r.converged and r.stop_reason == "target"
    assert lo <= 1.0 <= hi and S.verdict(lo, hi) == "SAME" and 0.99 <= lo and hi <= 1.01
    for m in r.measurements.values():
        mlo, mhi = S.median_ci(S.round_values(m.rounds))
        assert S.within(float(np.median(S.round_values(m.rounds))), mlo, mhi, 0.01)
    assert r.verdict_s is not None and r.verdict_s <= r.wall_s


def test_budget_ends_an_unconvergeable_case_flagged():
    c = DriftClock(drift=0.0, sigma=0.5, seed=5)  # very noisy: cannot reach +-0.1% in budget
    r = measure_interleaved({"x": c.fn(1e-3), "y": c.fn(1e-3)}, "cpu", clock=c, budget_s=0.5,
                            target=0.001)
    assert not r.converged
    assert r.wall_s < 0.5 + 0.2  # stops at the budget (plus the round in flight and warm-up)


def test_the_default_budget_is_read_where_the_interleaved_timer_lives(monkeypatch):
    import flyexplore.measure.interleaved as I
    import flyexplore.measure.timing as T

    monkeypatch.setattr(I, "CASE_BUDGET_S", {"cpu": 0.3, "cuda": 10.0})  # default CPU budget: 2 s
    c = DriftClock(drift=0.0, sigma=0.5, seed=5)  # very noisy: never converges, stops at the budget
    r = measure_interleaved({"x": c.fn(1e-3), "y": c.fn(1e-3)}, "cpu", clock=c, target=0.001)
    assert not r.converged and 0.3 <= r.wall_s < 0.3 + 0.2


def test_fixed_rounds_and_calls_per_round():
    c = DriftClock()
    r = measure_interleaved({"x": c.fn(1e-3), "y": c.fn(2e-3)}, "cpu", clock=c, min_rounds=7,
                            max_rounds=7, calls_per_round=3, warmup_rounds=1)
    m = r.measurements["y"]
    assert r.rounds == 7 and all(len(rr) == 3 for rr in m.rounds) and m.n == 21
    assert rounds_from_json(m.summary()["samples_ms"]) == tuple(tuple(float(f"{x:.6g}") for x in rr) for rr in m.rounds)


def test_rounds_rotate_the_backend_order():
    seen = []
    fns = {n: (lambda n=n: seen.append(n)) for n in "abc"}
    measure_interleaved(fns, "cpu", min_rounds=3, max_rounds=3, calls_per_round=1, warmup_rounds=0)
    firsts = [seen[i] for i in range(0, 9, 3)]
    assert firsts == ["a", "b", "c"]


def test_interleaved_argument_errors():
    with pytest.raises(ValueError, match="graph"):
        measure_interleaved({"a": lambda: None}, "cpu", mode="graph")
    with pytest.raises(ValueError, match="baseline"):
        measure_interleaved({"a": lambda: None}, "cpu", baseline="z")
    with pytest.raises(ValueError):
        measure_interleaved({}, "cpu")
    with pytest.raises(ValueError, match="GPU"):
        measure_interleaved({"a": lambda: None}, "cpu", mode="event-gated")


def test_samples_json_round_trip():
    r = ((0.123456789, 1.5), (2.0,))
    assert rounds_from_json(samples_json(r)) == ((0.123457, 1.5), (2.0,))
    assert rounds_from_json(None) == () and rounds_from_json(pd.NA) == ()


# -- device state (fakes of nvidia-ml-py and amdsmi) -------------------------------------------

def _fake_pynvml():
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_GPU = 1, 0
    m.nvmlClocksEventReasonSwPowerCap, m.nvmlClocksEventReasonHwThermalSlowdown = 0x4, 0x40
    state = {"clock": 1980}
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByUUID = lambda u: ("h", u)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetUUID = lambda h: b"GPU-1234"
    m.nvmlDeviceGetMaxClockInfo = lambda h, k: 1980
    m.nvmlDeviceGetClockInfo = lambda h, k: state["clock"]
    m.nvmlDeviceGetPowerUsage = lambda h: 650_000
    m.nvmlDeviceGetTemperature = lambda h, k: 61
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4 | 0x40
    return m, state


def test_nvml_sampler_with_fake_library(monkeypatch):
    m, state = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", m)
    s = NvmlSampler("1234")
    assert s.device_id == "GPU-1234" and s.max_clock_mhz == 1980
    st = s.sample()
    assert st == {"clock_mhz": 1980.0, "power_w": 650.0, "temp_c": 61.0, "reasons": "sw_power_cap,hw_thermal"}
    state["clock"] = 1400
    end = s.sample()
    cols = case_columns(st, end, [1900.0, 1500.0], s.max_clock_mhz, [0.2, 0.25])
    assert cols["clock_mhz_min"] == 1400.0 and cols["throttled"] is True  # 1400 < 0.8 * 1980
    assert cols["throttle_reasons"] == "hw_thermal,sw_power_cap"
    assert cols["time_cycles"] == pytest.approx(np.median([0.2e-3 * 1900e6, 0.25e-3 * 1500e6]))
    assert case_columns(st, st, [], 1980.0)["throttled"] is False
    assert 1980 * THROTTLE_FRACTION == pytest.approx(1584)


def test_amdsmi_sampler_with_fake_library(monkeypatch):
    a = types.ModuleType("amdsmi")
    a.AmdSmiClkType = types.SimpleNamespace(GFX="gfx")
    a.AmdSmiTemperatureType = types.SimpleNamespace(HOTSPOT="hot")
    a.AmdSmiTemperatureMetric = types.SimpleNamespace(CURRENT="cur")
    a.amdsmi_init = lambda: None
    a.amdsmi_get_processor_handles = lambda: ["h0", "h1"]
    a.amdsmi_get_gpu_device_bdf = lambda h: {"h0": "0000:05:00.0", "h1": "0000:75:00.0"}[h]
    a.amdsmi_get_clock_info = lambda h, k: {"clk": 2100, "max_clk": 2400, "min_clk": 500}
    a.amdsmi_get_power_info = lambda h: {"current_socket_power": 900, "average_socket_power": 880}
    a.amdsmi_get_temp_metric = lambda h, t, m: 70
    monkeypatch.setitem(sys.modules, "amdsmi", a)
    s = AmdSmiSampler("0000:75:00.0")
    assert s.device_id == "0000:75:00.0" and s.max_clock_mhz == 2400
    assert s.sample() == {"clock_mhz": 2100.0, "power_w": 900.0, "temp_c": 70.0}


# -- sweeps, schema 2, migration, compare ------------------------------------------------------

def test_interleaved_sweep_rows_keep_samples_intervals_and_verdicts(tmp_path):
    import flyexplore as fx

    out = tmp_path / "r.parquet"
    df = fx.sweep("rmsnorm", shapes="64x1024", dtypes="fp32", backends="aten,inductor", out=out,
                  progress=False, timer={"rep": 8, "warmup": 1})
    ok = df[df["status"] == "ok"]
    assert set(ok["backend"]) == {"aten", "inductor"}
    assert (ok["order"] == "interleaved").all() and (ok["rounds"] == 8).all()
    # rep=8 is a fixed number of rounds: each row says why its case stopped, and notes it when
    # that was before the target
    assert ok["stop_reason"].isin(["max_rounds", "target"]).all()
    for _, r in ok[ok["stop_reason"] == "max_rounds"].iterrows():
        assert r["converged"] == False and "unconverged after 8 rounds" in r["message"]  # noqa: E712
    for _, r in ok.iterrows():
        rr = rounds_from_json(r["samples_ms"])
        assert len(rr) == 8 and r["time_ci_lo_ms"] <= r["time_ms"] <= r["time_ci_hi_ms"]
        assert r["recheck_ok"] == True  # noqa: E712
    ind = ok[ok["backend"] == "inductor"].iloc[0]
    assert ind["baseline"] == "aten" and ind["verdict"] in S.LABELS
    assert ind["speedup_lo"] <= ind["speedup"] <= ind["speedup_hi"]
    back = R.load(out)
    assert back["samples_ms"].iloc[0] == df["samples_ms"].iloc[0] and (back["schema_version"] == 2).all()
    sp = R.speedup(back, "aten")
    assert sp.iloc[0]["interval"] == "paired" and sp.iloc[0]["speedup"] == pytest.approx(ind["speedup"])


def test_block_order_still_available_with_unpaired_intervals():
    import flyexplore as fx

    df = fx.sweep("rmsnorm", shapes="64x1024", dtypes="fp32", backends="aten,inductor",
                  progress=False, order="block", timer={"rep": 12, "warmup": 1})
    assert (df.loc[df["status"] == "ok", "order"] == "block").all()
    sp = R.speedup(df, "aten")
    assert sp.iloc[0]["interval"] == "unpaired" and sp.iloc[0]["verdict"] in S.LABELS


def test_bad_order_band_timer_refused_before_any_file(tmp_path):
    from flyexplore.errors import UsageError
    import flyexplore as fx

    out = tmp_path / "keep.csv"
    out.write_text("precious")
    for kw in ({"order": "zigzag"}, {"band": 0.0}, {"band": 2}, {"timer": {"nope": 1}},
               {"baseline": "triton"}):
        with pytest.raises(UsageError):
            fx.sweep("rmsnorm", shapes="64x1024", dtypes="fp32", backends="aten,inductor", out=out,
                     overwrite=True, progress=False, **kw)
    assert out.read_text() == "precious"


def test_a_stale_result_is_caught_by_the_recheck(monkeypatch):
    from flyexplore.ops import get_op
    from flyexplore.ops.base import Backend
    import flyexplore as fx

    op = get_op("rmsnorm")
    aten = op.get_backend("aten")

    def stale_build(case, dtype, inputs, ctx, _memo={}):
        real = aten.build(case, dtype, inputs, ctx)
        key = (case.label, dtype)
        if key not in _memo:
            _memo[key] = real().clone()  # computed once, returned for ever after
        return lambda: _memo[key]
    monkeypatch.setitem(op.backends, "stale", Backend("stale", stale_build, "returns its first result"))
    df = fx.sweep("rmsnorm", shapes="64x1024", dtypes="fp32", backends="aten,stale", progress=False,
                  timer={"rep": 6, "warmup": 1})
    st = df[df["backend"] == "stale"].iloc[0]
    assert st["status"] == "ok" and st["recheck_ok"] == False and st["accuracy_ok"] == False  # noqa: E712
    assert "fresh input" in st["message"]
    assert df[df["backend"] == "aten"].iloc[0]["recheck_ok"] == True  # noqa: E712


def test_schema1_files_load_report_and_compare(tmp_path):
    from pathlib import Path

    from flyexplore.results.compare import pair

    root = Path(__file__).resolve().parents[2]
    v1 = R.load(root / "data/h200/published_suites/results.parquet")
    assert (v1["schema_version"] == 2).all()
    ok = v1[v1["status"] == "ok"]
    assert (ok["ci_method"] == "notch").all() and (ok["order"] == "block").all()
    assert (ok["time_ci_lo_ms"] <= ok["time_ms"]).all() and (ok["time_ms"] <= ok["time_ci_hi_ms"]).all()
    sp = R.speedup(v1[v1["op"] == "gemm"], "aten")
    assert len(sp) and set(sp["interval"]) == {"notch"} and sp["verdict"].isin(S.LABELS).all()
    ab = pair(v1, v1, ("x", "y"))
    assert (ab.pairs["ratio"] == 1.0).all() and set(ab.pairs["verdict"].dropna()) <= {"SAME", "AMBIGUOUS"}
    assert ab.warnings == ()


@pytest.mark.slow
def test_two_identical_cpu_sweeps_never_read_a_difference(tmp_path):
    from flyexplore.results.compare import pair
    import flyexplore as fx

    kw = dict(shapes="128x128x128;256x256x256", dtypes="fp32", backends="aten,inductor", progress=False,
              timer={"budget_s": 1.0})
    a, b = fx.sweep("gemm", **kw), fx.sweep("gemm", **kw)
    ab = pair(a, b)
    assert ab.pairs["interval"].eq("unpaired+run").all()
    bad = ab.pairs[ab.pairs["verdict"].isin(["FASTER", "SLOWER"])
                   & ((ab.pairs["ratio_lo"] > 1.01 + 0.01) | (ab.pairs["ratio_hi"] < 0.99 - 0.01))]
    assert bad.empty, bad[["case", "backend", "ratio", "ratio_lo", "ratio_hi", "verdict"]]


def test_compare_says_when_environments_differ():
    from flyexplore.results.compare import env_warnings

    a = R.frame([{"op": "gemm", "case": "8x8x8", "dtype": "fp32", "backend": "aten", "status": "ok",
                  "source": "measured", "time_ms": 1.0, "device": "NVIDIA H200", "torch": "2.11.0",
                  "clock_mhz_start": 1980.0, "throttled": True}])
    b = a.assign(torch="2.15.0", clock_mhz_start=1500.0, device="NVIDIA H200")
    w = env_warnings(a, b, ("old", "new"))
    assert any("torch differs" in x for x in w) and any("SM clock differs" in x for x in w)
    assert any("throttled" in x for x in w)


def test_speedup_figure_draws_whiskers_and_labels():
    from flyexplore.views.plots import speedup_figure

    rows = []
    for case, (tb, tx) in {"8x8x8": (1.1, 1.0), "16x8x8": (1.0, 1.0)}.items():
        for be, t in (("aten", tb), ("triton", tx)):
            rounds = [[t * (1 + 0.001 * ((i * 7) % 5))] for i in range(12)]
            rows.append({"op": "gemm", "case": case, "dtype": "bf16", "backend": be, "status": "ok",
                         "source": "measured", "time_ms": t, "run_id": "r1", "order": "interleaved",
                         "samples_ms": json.dumps(rounds)})
    df = R.frame(rows)
    fig = speedup_figure(df, "aten")
    bar = fig.data[0]
    assert bar.error_y.array is not None and len(bar.error_y.array) == 2
    assert "FASTER" in bar.name and "SAME" in bar.name and "[" in bar.name


@pytest.mark.slow
def test_loading_scipy_does_not_eat_the_case_budget():
    # in a fresh process the first stopping check used to load scipy.stats (~1 s on the CI
    # machine) after the case's clock had started, so a 1 s CI budget got 24 rounds, all from
    # the machine's warm-up. Checked without timing anything real (a loaded machine must not
    # fail it): a fake clock that advances only by the calls' own (fake) time, and records
    # whether scipy.special (what the checks use: flyexplore.measure.stats.median_ci_ranks) was
    # already loaded each time the case reads it.
    import subprocess

    code = ("import sys\n"
            "from flyexplore.measure.interleaved import measure_interleaved\n"
            "assert 'scipy.special' not in sys.modules\n"
            "now, loaded = [0.0], []\n"
            "def clock():\n"
            "    loaded.append('scipy.special' in sys.modules)\n"
            "    return now[0]\n"
            "seq = [0]\n"
            "def busy():\n"
            "    seq[0] = (seq[0] * 1103515245 + 12345) % 2**31\n"
            "    now[0] += 2e-4 * (0.9 + 0.2 * seq[0] / 2**31)\n"
            "r = measure_interleaved({'x': busy, 'y': busy}, 'cpu', budget_s=1.0, target=1e-4,\n"
            "                        calls_per_round=5, clock=clock, precision_cap_s=5.0)\n"
            "print(all(loaded), len(loaded), r.rounds)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    every_read_after_scipy, reads, rounds = out.stdout.split()[-3:]
    assert int(reads) > 0 and every_read_after_scipy == "True", out.stdout
    # 2 backends x 5 calls x 0.2 ms (+-10%, never converging to the 0.01% target) = 2 ms of
    # fake time a round: the 1 s budget (below the 5 s caps) holds 500
    # rounds, and only rounds spend it (the stopping checks cost no fake time)
    assert 450 <= int(rounds) <= 500, out.stdout


def test_drift_measures_a_run_that_moved_and_widens_cross_run_intervals():
    steady = [1.0 + 0.01 * ((i * 7) % 3) for i in range(400)]
    moved = [1.0 if i < 200 else 1.6 for i in range(400)]
    assert S.drift(steady) == pytest.approx(0.0, abs=0.005)
    assert S.drift(moved) == pytest.approx(0.6) and S.drift([1.0, 2.0]) == 0.0
    rows = []
    for run, vals in (("r1", steady), ("r2", moved)):
        rows.append({"op": "gemm", "case": "8x8x8", "dtype": "fp32", "backend": "aten", "status": "ok",
                     "source": "measured", "time_ms": float(np.median(vals)), "run_id": run,
                     "platform": "cuda", "order": "interleaved",
                     "samples_ms": json.dumps([[v] for v in vals])})
    df = R.frame(rows)
    est, lo, hi, how = R.ratio_interval(df[df.run_id == "r1"], df[df.run_id == "r2"])
    assert how == "unpaired+run"
    # the GPU allowance is 2%, but r2 moved 60% within itself: the interval widens by that
    assert lo <= est / 1.6 * 1.001 and hi >= est * 1.6 * 0.999


# -- the sequential stopping rule (issue 24): labels decided, time caps ------------------------

class ScriptClock:
    """A fake clock advanced only by the fake calls: ``fn(times_ms)`` is a callable whose k-th
    call takes ``times_ms(k)`` ms (k counts warm-up calls too)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def fn(self, times_ms):
        k = iter(range(10 ** 9))

        def call():
            self.t += times_ms(next(k)) * 1e-3
        return call


def test_a_decided_label_stops_before_the_old_rule_would():
    """2x apart: FASTER is decided at the first look; the case stops as soon as the medians
    are within +-1%, while the speedup's interval is still wider than +-1% (the old rule went
    on until it was not)."""
    import flyexplore.measure.interleaved as I

    c = DriftClock(drift=0.0, sigma=0.05, seed=11)
    r = measure_interleaved({"a": c.fn(2e-3), "b": c.fn(1e-3)}, "cpu", clock=c, budget_s=20.0,
                            precision_cap_s=20.0)
    est, lo, hi = r.speedup("b")
    assert r.stop_reason == "target" and r.converged and S.verdict(lo, hi) == "FASTER"
    assert not S.within(est, lo, hi, r.target)  # the old rule would not have stopped here
    assert r.verdict_s is not None and r.verdict_s < r.wall_s / 3  # decided long before the end
    assert r.rounds < 1000
    assert I.STOP_REASONS[0] == "target"


def test_a_short_call_stops_at_the_time_cap_not_at_2000_rounds():
    """5 us and 10 us calls whose medians cannot reach +-0.2%: with the label decided, the case
    ends at the precision cap (0.2 s per backend on the CPU) after thousands of rounds."""
    import flyexplore.measure.interleaved as I

    c = DriftClock(drift=0.0, sigma=0.3, seed=2)
    r = measure_interleaved({"a": c.fn(10e-6), "b": c.fn(5e-6)}, "cpu", clock=c, target=0.002)
    cap = 2 * I.PRECISION_CAP_S["cpu"]
    assert r.stop_reason == "precision_cap" and not r.converged
    assert r.rounds > 2000  # the old round cap
    assert cap <= r.wall_s <= cap + 0.01  # at most a round past the cap (a round is 75 us)
    assert S.verdict(*r.speedup("b")[1:]) == "FASTER" and r.verdict_s < 0.1


def test_an_ambiguous_label_at_a_band_edge_goes_on_to_the_label_cap_not_past_it():
    """A speedup of exactly 1.01 (the band edge) with noisy calls stays AMBIGUOUS: the case goes
    on past the point where the same noise with a decided label stops, and ends at the label
    cap (0.6 s per backend on the CPU), flagged."""
    import flyexplore.measure.interleaved as I

    c = DriftClock(drift=0.0, sigma=0.1, seed=4)
    dec = measure_interleaved({"a": c.fn(2.0e-3), "b": c.fn(1.0e-3)}, "cpu", clock=c)
    c = DriftClock(drift=0.0, sigma=0.1, seed=4)
    amb = measure_interleaved({"a": c.fn(1.01e-3), "b": c.fn(1.0e-3)}, "cpu", clock=c)
    assert dec.stop_reason == "precision_cap" and dec.wall_s < 2 * I.PRECISION_CAP_S["cpu"] + 0.02
    label_cap = 2 * I.LABEL_CAP_S["cpu"]
    assert amb.stop_reason == "label_cap" and not amb.converged and amb.verdict_s is None
    assert dec.wall_s * 2 < amb.wall_s and label_cap <= amb.wall_s <= label_cap + 0.02
    assert S.verdict(*amb.speedup("b")[1:]) == "AMBIGUOUS"


def test_identical_callables_read_same_with_the_default_caps():
    c = DriftClock(drift=0.3, span=1.0, sigma=0.02, seed=3)
    f = c.fn(1e-3)
    r = measure_interleaved({"x": f, "y": f}, "cpu", clock=c)  # one kernel, two ways
    est, lo, hi = r.speedup("y")
    assert S.verdict(lo, hi) == "SAME" and 0.99 <= lo <= 1.0 <= hi <= 1.01
    assert r.stop_reason in ("target", "precision_cap") and r.verdict_s is not None


def test_the_stricter_look_confidence_is_what_decides(monkeypatch):
    """After 10 rounds the speedup's 95% interval is FASTER but its 99% one is not: the case
    goes on to the next look (13 rounds), where the 99% interval decides it. Looking at 95%
    would have stopped at 10."""
    import flyexplore.measure.interleaved as I

    ratios = [1.0, 1.02, 1.05, 1.05, 1.05, 1.08, 1.10, 1.05, 1.05, 1.05] + [1.05] * 100

    def run():
        c = ScriptClock()
        b_ms = lambda k: 1.05 / ratios[k - 1] if k else 1.0  # call 0 is the warm-up  # noqa: E731
        return measure_interleaved({"a": c.fn(lambda k: 1.05), "b": c.fn(b_ms)}, "cpu", clock=c,
                                   calls_per_round=1, warmup_rounds=1, target=0.05)

    r = run()
    first10 = [rr[:10] for rr in (r.measurements["a"].rounds, r.measurements["b"].rounds)]
    assert S.verdict(*S.paired_ratio(*first10)[1:]) == "FASTER"
    assert S.verdict(*S.paired_ratio(*first10, confidence=I.LOOK_CONFIDENCE)[1:]) == "AMBIGUOUS"
    assert r.rounds == 13 and r.stop_reason == "target"
    assert S.verdict(*S.paired_ratio(r.measurements["a"].rounds, r.measurements["b"].rounds,
                                     confidence=I.LOOK_CONFIDENCE)[1:]) == "FASTER"
    monkeypatch.setattr(I, "LOOK_CONFIDENCE", 0.95)
    assert run().rounds == 10


def test_one_backend_stops_at_its_target_or_the_precision_cap():
    import flyexplore.measure.interleaved as I

    c = DriftClock(drift=0.0, sigma=0.01, seed=1)
    r = measure_interleaved({"a": c.fn(1e-3)}, "cpu", clock=c)
    assert r.stop_reason == "target" and r.converged and r.verdict_s is None and r.rounds == 10
    c = DriftClock(drift=0.0, sigma=0.5, seed=1)
    r = measure_interleaved({"a": c.fn(1e-3)}, "cpu", clock=c, target=0.001)
    assert r.stop_reason == "precision_cap" and not r.converged
    assert I.PRECISION_CAP_S["cpu"] <= r.wall_s <= I.PRECISION_CAP_S["cpu"] + 0.01


def test_caps_are_seconds_of_the_case_and_checked():
    c = DriftClock(drift=0.0, sigma=0.3, seed=2)
    r = measure_interleaved({"a": c.fn(1e-3), "b": c.fn(0.5e-3)}, "cpu", clock=c, target=0.001,
                            precision_cap_s=0.15, max_rounds=None)
    assert r.stop_reason == "precision_cap" and 0.15 <= r.wall_s <= 0.16
    c = DriftClock(drift=0.0, sigma=0.3, seed=2)
    r = measure_interleaved({"a": c.fn(1e-3), "b": c.fn(1e-3)}, "cpu", clock=c, precision_cap_s=0.1,
                            label_cap_s=0.25)
    assert r.stop_reason == "label_cap" and 0.25 <= r.wall_s <= 0.26
    c = DriftClock(drift=0.0, sigma=0.3, seed=2)  # a label cap below the precision cap is raised to it
    r = measure_interleaved({"a": c.fn(1e-3), "b": c.fn(1e-3)}, "cpu", clock=c, precision_cap_s=0.3,
                            label_cap_s=0.25)
    assert r.stop_reason == "label_cap" and 0.3 <= r.wall_s <= 0.31
    for kw in ({"precision_cap_s": 0}, {"label_cap_s": -1.0}, {"band": 0.0}):
        with pytest.raises(ValueError):
            measure_interleaved({"a": lambda: None}, "cpu", **kw)


def test_the_caps_are_timer_options_of_a_sweep():
    from flyexplore.errors import UsageError
    from flyexplore.run.spec import check_timer, interleaved_kwargs

    t = check_timer({"precision_cap_s": 0.5, "label_cap_s": 1.5}, "interleaved")
    assert interleaved_kwargs(t) == {"precision_cap_s": 0.5, "label_cap_s": 1.5}
    for bad in ({"precision_cap_s": 0}, {"label_cap_s": float("inf")}):
        with pytest.raises(UsageError, match="_cap_s must be a finite number > 0"):
            check_timer(bad, "interleaved")
    with pytest.raises(UsageError):
        check_timer({"label_cap_s": 1.0}, "block")


def test_a_fixed_number_of_rounds_says_so():
    c = DriftClock(drift=0.0, sigma=0.3, seed=2)
    r = measure_interleaved({"a": c.fn(1e-3), "b": c.fn(1e-3)}, "cpu", clock=c, min_rounds=12,
                            max_rounds=12)
    assert r.rounds == 12 and r.stop_reason == "max_rounds" and not r.converged


def test_repeated_looks_need_the_stricter_confidence():
    """The figures behind LOOK_CONFIDENCE (benchmarks/evidence/sequential_looks.py), smaller: with looks
    LOOK_GROWTH apart up to 1,000 rounds, some 99% interval misses the true median about 6% of
    the time, some 95% one about 26%."""
    import importlib.util

    import flyexplore.measure.interleaved as I
    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("sequential_looks", ROOT / "benchmarks" / "evidence" / "sequential_looks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.miss_rates(I.MIN_ROUNDS, I.LOOK_GROWTH, 1000, (0.95, I.LOOK_CONFIDENCE), trials=4000, seed=0)
    assert got[0.95][0] > 0.15 and got[I.LOOK_CONFIDENCE][0] < 0.09


# -- how many pairs would decide it (issue 43, 3) ---------------------------------------------

def test_pairs_to_decide_by_hand():
    """Hand-checked with t quantiles from a table (two-sided 95%): t(1) 12.706, t(2) 4.303,
    t(3) 3.182, t(4) 2.776, t(5) 2.571."""
    # a change of 5%: the interval's width hi/lo - 1 at most 5%, half-width log(1.05)/2 = 0.02440;
    # sd 0.02: n=5 gives 2.776 * 0.02 / sqrt(5) = 0.02483 (too wide), n=6 2.571 * 0.02 / sqrt(6) = 0.02099
    assert S.pairs_to_decide(0.02, 0.05) == 6
    # the 2x slowdown read with 3 pairs as [0.234, 1.080]: sd = log(1.080/0.234)/2 * sqrt(3)/4.303
    # = 0.7647 * 1.732 / 4.303 = 0.3078; to clear 0.99 from 0.503 the half-width must be under
    # log(0.99/0.503) = 0.6772: n=3 gives 4.303 * 0.3078 / sqrt(3) = 0.7647 (the AMBIGUOUS read),
    # n=4 3.182 * 0.3078 / 2 = 0.4897
    sd = S.interval_spread(0.234, 1.080, 3)
    assert sd == pytest.approx(0.3078, abs=1e-4)
    assert S.pairs_to_decide(sd, estimate=0.503) == 4
    # an estimate inside the band: SAME once the interval clears the nearer edge. 1.002 with sd
    # 0.01: h = log(1.01/1.002) = 0.007952; n=2: 12.706 * 0.01 / 1.414 = 0.0898, ... the normal
    # floor is (1.96 * 0.01 / 0.007952)^2 = 6.07 -> 7: 2.447 * 0.01 / sqrt(7) = 0.00925 (too wide),
    # then 8: t(7) 2.365 -> 0.00836, 9: t(8) 2.306 -> 0.00769 <= 0.007952
    assert S.pairs_to_decide(0.01, estimate=1.002) == 9
    # no spread: the least that has an interval; unknown spread: None; on a band edge: never
    assert S.pairs_to_decide(0.0, 0.05) == 2
    assert S.pairs_to_decide(float("nan")) is None and S.pairs_to_decide(None) is None
    assert S.pairs_to_decide(-0.1) is None and S.pairs_to_decide(0.01, estimate=0.0) is None
    assert S.pairs_to_decide(0.01, estimate=1.01) == math.inf
    for bad in (0, -0.05, float("nan"), True):
        with pytest.raises(ValueError, match="band must be a fraction above 0, got"):
            S.pairs_to_decide(0.01, bad)
    # a width of 100% or more is a width (hi/lo <= 2: h = log(2)/2 = 0.3466; sd 0.3: n=5 gives
    # 2.776 * 0.3 / sqrt(5) = 0.3724, n=6 2.571 * 0.3 / sqrt(6) = 0.3149), but not a SAME band
    assert S.pairs_to_decide(0.3, 1.0) == 6
    with pytest.raises(ValueError, match="band must be a fraction above 0 and below 1, got 1.0"):
        S.pairs_to_decide(0.01, 1.0, estimate=0.5)


@pytest.mark.parametrize("sd,band", [(0.001, 0.01), (0.004, 0.01), (0.02, 0.05), (0.3, 0.05), (0.05, 0.002)])
def test_pairs_to_decide_is_the_smallest_n_whose_t_interval_is_narrow_enough(sd, band):
    """The rule itself, with scipy's t, and what it means for the interval flyexplore computes:
    n values with that spread give a between_process interval (of the mean) no wider than the
    band (hi/lo - 1 <= band); n - 1 values give a wider one."""
    from scipy.stats import t

    n = S.pairs_to_decide(sd, band)
    need = math.log1p(band) / 2

    def half(k):
        return t.ppf(0.975, k - 1) * sd / math.sqrt(k)

    assert half(n) <= need and (n == 2 or half(n - 1) > need)

    def width(k):   # k values whose log sample sd is exactly sd
        z = np.linspace(-1.0, 1.0, k)
        x = np.exp(0.01 + sd * (z - z.mean()) / z.std(ddof=1))
        _, lo, hi = S.between_process(x, prediction=False)
        return hi / lo - 1

    assert width(n) <= band * (1 + 1e-9)
    if n > 2:
        assert width(n - 1) > band


def test_pairs_to_decide_with_an_estimate_gives_the_first_decided_label():
    sd = 0.05
    for est in (0.8, 0.97, 0.995, 1.004, 1.03):
        n = S.pairs_to_decide(sd, estimate=est)

        def label(k):
            h = S.t_quantile(k - 1) * sd / math.sqrt(k)
            return S.verdict(est * math.exp(-h), est * math.exp(h))

        assert label(n) != "AMBIGUOUS" and (n == 2 or label(n - 1) == "AMBIGUOUS"), (est, n)


def test_the_spread_of_the_estimates_and_of_their_interval_agree():
    sp = [0.96, 1.01, 0.99, 1.03]
    ses = [0.001] * 4
    _, lo, hi = S.between_process(sp, ses, prediction=False)
    assert S.pair_spread(sp, ses) == pytest.approx(float(np.std(np.log(sp), ddof=1)))
    assert S.interval_spread(lo, hi, 4) == pytest.approx(S.pair_spread(sp, ses), rel=1e-12)
    # the within-pair error floors the spread, as it floors the interval
    same = [1.0, 1.0, 1.0]
    _, lo, hi = S.between_process(same, [0.01] * 3, prediction=False)
    assert S.pair_spread(same, [0.01] * 3) == pytest.approx(0.01)
    assert S.interval_spread(lo, hi, 3) == pytest.approx(0.01)
    assert math.isnan(S.pair_spread([1.0])) and math.isnan(S.interval_spread(0.9, 1.1, 1))
    assert math.isnan(S.interval_spread(float("nan"), 1.1, 3)) and math.isnan(S.interval_spread(1.1, 0.9, 3))
