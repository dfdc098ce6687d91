"""The history (issue 46): steps found where they happened, none in steady series, the learned
allowance and compare's use of it, the gate on the newest step, build series, the exports, and
the command line (in process)."""
import json

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.results import history as H
from flyexplore.results import steps as ST
from flyexplore.results import table as R
from flyexplore.results.history_store import Store

H200_RUN = ROOT / "data/h200/reproducible/run1.parquet"
CPU_ROWS = ROOT / "data/bench/cpu_sweeps/topk.parquet"
TIME_COLS = ("time_ms", "time_ci_lo_ms", "time_ci_hi_ms", "time_p20_ms", "time_p80_ms", "time_min_ms", "time_mean_ms")


def scaled_runs(base: pd.DataFrame, n: int, step_at: int | None, step: float, sd: float, seed: int = 0,
                prefix: str = "run") -> list[pd.DataFrame]:
    """``n`` runs of ``base``'s rows, each row's times (and samples) scaled by a log-normal run
    factor of ``sd``, times ``1 + step`` from run ``step_at`` on."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        df = base.copy()
        f = np.exp(rng.normal(0, sd, len(df))) * (1 + step if step_at is not None and i >= step_at else 1.0)
        for c in TIME_COLS:
            if c in df:
                df[c] = df[c] * f
        if "samples_ms" in df:
            df["samples_ms"] = [None if pd.isna(t) else json.dumps([[v * ff for v in r] for r in json.loads(t)])
                                for t, ff in zip(df["samples_ms"], f)]
        df["run_id"] = f"{prefix}{i:03d}"
        df["timestamp"] = f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00+00:00"
        out.append(df)
    return out


@pytest.fixture(scope="module")
def gpu_base():
    d = R.load(H200_RUN)
    # one process a row, so the time is the samples' median (the file combined 3 processes)
    return d.assign(processes=pd.NA, process_estimates=pd.NA, samples_ms=pd.NA)


@pytest.mark.slow
def test_a_3pct_step_at_run_20_of_30_is_found_there_and_sized(tmp_path, gpu_base):
    st = Store(tmp_path / "s")
    st.add(scaled_runs(gpu_base, 30, 20, 0.03, 0.01))
    an = H.analyse(st.points())
    g = an.steps[an.steps["series"] == H.GEOMEAN]
    assert len(g) == 1 and abs(int(g["position"].iloc[0]) - 20) <= 1
    assert g["lo"].iloc[0] < 0.03 < g["hi"].iloc[0] and g["direction"].iloc[0] == "slower"
    cases = an.steps[an.steps["series"] != H.GEOMEAN]
    found = cases.groupby("series")["position"].apply(lambda p: any(abs(p - 20) <= 1))
    assert found.sum() >= 0.75 * 24   # most of the 24 cases find it themselves
    assert (cases["change"] > 0).all()


@pytest.mark.slow
def _same_points_new_times(points: pd.DataFrame, frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``points`` of a store holding runs like ``frames`` (same run ids and keys), with the times
    of ``frames``: what the store would give for them, without writing a store a seed (a run's
    add is a Parquet part and a SQLite transaction, fsynced: about 0.13 s)."""
    key = ["run_id", *H.SERIES_KEY]
    new = pd.concat(frames, ignore_index=True)[[*key, "time_ms", "time_ci_lo_ms", "time_ci_hi_ms"]]
    out = points.drop(columns=["time_ms", "time_ci_lo_ms", "time_ci_hi_ms"]).merge(
        new.astype({c: str for c in key}), on=key, how="left", validate="one_to_one")
    return out[points.columns]


@pytest.mark.slow
def test_steady_series_of_identical_runs_report_no_step(tmp_path, gpu_base):
    base = gpu_base.head(4)
    stored = [_points(tmp_path / f"s{seed}", scaled_runs(base, 10, None, 0.0, 0.01, seed=seed)) for seed in (0, 1)]
    # the shortcut gives what the store gives
    again = _same_points_new_times(stored[0], scaled_runs(base, 10, None, 0.0, 0.01, seed=1))
    pd.testing.assert_frame_equal(again.drop(columns="part"), stored[1].drop(columns="part"), check_dtype=False)
    found = 0
    for seed in range(20):
        pts = _same_points_new_times(stored[0], scaled_runs(base, 10, None, 0.0, 0.01, seed=seed))
        an = H.analyse(pts)
        found += len(an.steps)
    assert found <= 2   # 80 case series + 20 geomeans of 10 runs; the calibration allows 0.5% each


def _points(path, frames):
    st = Store(path)
    st.add(frames)
    return st.points()


def test_fit_of_identical_numbers_and_a_known_step():
    assert ST.fit(np.zeros(12)).starts == (0,)
    y = np.log(np.r_[np.ones(5), np.full(5, 1.2)])
    f = ST.fit(y, np.full(10, 0.01), between_runs=False)
    (s,) = ST.steps_of(f)
    assert s.at == 5 and s.change == pytest.approx(0.2) and s.lo < 0.2 < s.hi
    assert ST.fit(np.array([0.0, 0.5, 1.0])).starts == (0,)   # too few points to read their noise


def test_one_wild_run_is_no_level_but_the_newest_run_alone_is_a_step():
    rng = np.random.default_rng(5)
    y = rng.normal(0, 0.005, 25)
    wild = y.copy()
    wild[12] += 0.10   # one run 10% slow in the middle: no level of its own (out and back)
    assert ST.fit(wild, np.full(25, 0.002)).starts == (0,)
    newest = y.copy()
    newest[-1] += 0.10   # the run just added, 10% slow: a step at once (history show --recent 1)
    (s,) = ST.steps_of(ST.fit(newest, np.full(25, 0.002)))
    assert s.at == 24 and s.lo > 0.05
    build = np.log([1.0, 1.2, 1.0])   # a build series: one build may be a level of its own
    assert ST.fit(build, np.full(3, 0.01), between_runs=False).starts == (0, 1, 2)


def test_missing_runs_do_not_make_steps():
    y = np.array([0.0, np.nan, 0.0, 0.0, np.nan, 0.3, 0.3, np.nan, 0.3])
    f = ST.fit(y, np.full(9, 0.01), between_runs=False)
    assert f.starts == (0, 5)


def test_learned_allowance_needs_enough_identical_runs_and_compare_says_which_applied(tmp_path):
    base = R.load(CPU_ROWS)
    base = base[base["status"] == "ok"].reset_index(drop=True)
    runs = scaled_runs(base, 6, None, 0.0, 0.05)
    files = []
    for i, df in enumerate(runs):
        p = tmp_path / f"r{i}.parquet"
        R.save(df, p)
        files.append(p)
    st = Store(tmp_path / "st")
    st.add(files[:2])   # 2 runs: too few, the constant with its reason
    a = H.compare_allowance(runs[0], runs[1], st)
    assert a.source == "constant" and a.value == R.RUN_TO_RUN["cpu"] and "too few to learn one" in a.basis
    st.add(files[2:])
    a = H.compare_allowance(runs[0], runs[1], st)
    assert a.source == "learned" and 0 < a.value < 0.3 and a.pairs >= H.MIN_ALLOWANCE_PAIRS
    import flyexplore as fx

    off = fx.compare(files[0], files[1], history="off").pairs
    on = fx.compare(files[0], files[1], history=str(tmp_path / "st")).pairs
    assert (off["allowance"] == 0.5).all()
    assert (on["allowance"] < 0.5).all()
    learned = on["allowance"] == a.value
    assert learned.any() and on.loc[learned, "allowance_basis"].str.contains("learned").all()
    with pytest.raises(UsageError, match="no history store"):
        fx.compare(files[0], files[1], history=str(tmp_path / "none"))


def test_gate_reads_the_newest_step_and_recent(tmp_path, gpu_base):
    st = Store(tmp_path / "s")
    st.add(scaled_runs(gpu_base.head(6), 30, 20, 0.10, 0.005))
    an = H.analyse(st.points())
    failed, lines = H.gate_steps(an, "SLOWER:5%")
    assert failed and "FAILED" in lines[0]
    assert not H.gate_steps(an, "SLOWER:20%")[0]
    assert not H.gate_steps(an, "SLOWER:5%", recent=5)[0]   # the step is 10 runs old
    assert not H.gate_steps(an, "SLOWER:5%:warn")[0]
    with pytest.raises(UsageError, match="SLOWER"):
        H.gate_steps(an, "AMBIGUOUS:5%")


def test_build_series_says_between_which_builds(tmp_path, gpu_base):
    rows = []
    envs = ["0.11b", "0.13b", "0.14b", "0.15b"]
    for k, e in enumerate(envs):
        d = gpu_base.head(3).copy()
        f = 1.25 if k >= 2 else 1.0
        for c in ("time_ms", "time_ci_lo_ms", "time_ci_hi_ms"):
            d[c] = d[c] * f
        d["backend"] = d["backend"] + "@" + e
        d["env"] = e
        rows.append(d)
    df = pd.concat(rows, ignore_index=True).assign(run_id="ab1")
    st = Store(tmp_path / "s")
    st.add([df])
    an = H.analyse(st.points())
    assert len(an.builds) == 3
    assert set(an.builds["from_env"]) == {"0.13b"} and set(an.builds["to_env"]) == {"0.14b"}
    assert any("between 0.13b and 0.14b" in line for line in H.show_lines(an))


def test_exports_bmf_and_github_action_benchmark(tmp_path, gpu_base):
    st = Store(tmp_path / "s")
    st.add(scaled_runs(gpu_base.head(3), 2, None, 0.0, 0.01))
    pts = st.points()
    b = H.bmf(pts)
    assert len(b) == 3
    m = next(iter(b.values()))["latency"]
    assert m["lower_value"] < m["value"] < m["upper_value"]
    newest = pts[pts["run_id"] == "run001"]
    assert m["value"] == pytest.approx(newest["time_ms"].iloc[0] * 1e6)
    g = H.github_benchmark(pts, "run000")
    assert g[0]["unit"] == "ms" and g[0]["range"].startswith("95% interval ") and "run000" in g[0]["extra"]
    with pytest.raises(UsageError, match="--run"):
        H.bmf(pts, "nope")
    with pytest.raises(UsageError, match="--format"):
        H.export(pts, "csv")


def test_cli_add_show_export_and_gate(tmp_path, gpu_base, capsys):
    files = []
    for i, df in enumerate(scaled_runs(gpu_base.head(5), 24, 16, 0.08, 0.004)):
        p = tmp_path / f"r{i}.parquet"
        R.save(df, p)
        files.append(str(p))
    store = str(tmp_path / "store")
    assert main(["history", "add", *files, "--store", store]) == 0
    assert "24 new runs" in capsys.readouterr().out
    assert main(["history", "add", files[0], "--store", store]) == 0
    assert "already in the store" in capsys.readouterr().out
    assert main(["history", "show", "--store", store, "--fail-on", "SLOWER:3%"]) == 1
    out = capsys.readouterr().out
    assert "step: geomean: slower" in out and "FAILED" in out
    assert main(["history", "show", "--store", store, "--json", str(tmp_path / "h.json")]) == 0
    d = json.loads((tmp_path / "h.json").read_text())
    assert {"runs", "steps", "geomean", "allowances"} <= set(d) and len(d["runs"]) == 24
    assert main(["history", "export", "--store", store, "--format", "bmf", "--out", str(tmp_path / "b.json")]) == 0
    assert len(json.loads((tmp_path / "b.json").read_text())) == 5
    capsys.readouterr()
    for argv, what in ((["history", "show", "--store", str(tmp_path / "nope")], "no history store"),
                       (["history", "show", "--store", store, "--fail-on", "AMBIGUOUS"], "SLOWER"),
                       (["history", "export", "--store", store, "--format", "csv", "--out", "x"], "--format"),
                       (["history", "add", str(ROOT / "README.md"), "--store", store], "README.md")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert what in err and len(err.splitlines()) == 1


def test_a_slow_newest_run_of_a_short_history_is_a_step_and_leaves_the_allowance_alone(tmp_path, gpu_base):
    # 6 steady runs and a seventh 30% slower: the fit alone reads the whole series' scatter,
    # which that step inflates; the newest-runs test reads the noise of the runs before it
    runs = scaled_runs(gpu_base.head(4), 6, None, 0.0, 0.01) + scaled_runs(gpu_base.head(4), 1, 0, 0.30, 0.01,
                                                                            prefix="slow")
    runs[-1]["timestamp"] = "2026-12-01T00:00:00+00:00"
    st = Store(tmp_path / "s")
    st.add(runs)
    an = H.analyse(st.points())
    g = an.steps[an.steps["series"] == H.GEOMEAN]
    assert g["position"].tolist() == [6] and g["lo"].iloc[0] > 0.2
    assert H.gate_steps(an, "SLOWER:5%", recent=1)[0]
    a = H.learned_allowance(st.points(), device_id=str(st.points()["device_key"].iloc[0]))
    assert a.source == "learned" and a.value < 0.06   # the pairs across the step left out (else ~30%)


def test_history_gate_rules_are_read_with_the_history_wording(tmp_path, capsys):
    with pytest.raises(UsageError, match="only SLOWER gates it"):
        H.history_rules("SLOWR:5%")
    with pytest.raises(UsageError, match="history gate takes SLOWER"):
        H.history_rules("SLOWER:-5%")
    assert [r.threshold for r in H.history_rules("SLOWER:5%,SLOWER:10%:warn")] == [0.05, 0.10]
    assert main(["history", "show", "--store", str(tmp_path), "--recent", "1"]) == 2
    assert "--fail-on" in capsys.readouterr().err


def test_a_damaged_default_store_leaves_compare_the_constant_and_a_bad_history_is_refused_everywhere(
        tmp_path, monkeypatch):
    import flyexplore as fx

    base = R.load(CPU_ROWS)
    base = base[base["status"] == "ok"].reset_index(drop=True)
    a, b = scaled_runs(base, 2, None, 0.0, 0.01)
    bad = tmp_path / "default"
    bad.mkdir()
    (bad / "history.sqlite").write_bytes(b"not sqlite at all" * 100)
    monkeypatch.setenv("FLYEXPLORE_HISTORY", str(bad))
    pairs = fx.compare(a, b).pairs   # the default store, not named: the constant
    assert (pairs["allowance"] == R.RUN_TO_RUN["cpu"]).all()
    with pytest.raises(UsageError, match="damaged"):
        fx.compare(a, b, history=str(bad))   # named: its damage is said
    ab = R.load(ROOT / "data/h200/ab/aa.parquet")
    with pytest.raises(UsageError, match="--history"):
        fx.compare(ab, history=str(tmp_path / "nowhere"))   # one A/B file: --history still checked


def test_a_case_that_joins_later_makes_no_geomean_step_and_a_dropped_case_no_lone_level(tmp_path, gpu_base):
    runs = scaled_runs(gpu_base.head(6), 30, 20, 0.05, 0.003)
    series = gpu_base["case"] + " " + gpu_base["backend"]
    joined, dropped = series.iloc[0], series.iloc[5]
    for i, d in enumerate(runs):
        name = d["case"] + " " + d["backend"]
        keep = ~((name == joined) & (i < 13))   # one series only from run 13 on
        if i > 15:
            keep &= name != dropped                # another left out after run 15 ...
        if i == 15:
            hit = name == dropped                  # ... its last point 8% off
            d.loc[hit, ["time_ms", "time_ci_lo_ms", "time_ci_hi_ms"]] *= 1.08
        runs[i] = d[keep].reset_index(drop=True)
    st = Store(tmp_path / "s")
    st.add(runs)
    an = H.analyse(st.points())
    g = an.steps[an.steps["series"] == H.GEOMEAN]
    assert g["position"].tolist() == [20]     # the +5% only: no opposite step where the case joined
    d_steps = an.steps[an.steps["case"] + " " + an.steps["backend"] == dropped]
    assert not (d_steps["position"] == 15).any()   # a lone old point is no level of its own


def test_geomean_without_intervals_has_none_and_build_points_without_one_are_left_out(tmp_path, gpu_base):
    runs = scaled_runs(gpu_base.head(3), 6, None, 0.0, 0.005)
    for d in runs:
        d["time_ci_lo_ms"], d["time_ci_hi_ms"] = pd.NA, pd.NA
    st = Store(tmp_path / "s")
    st.add(runs)
    gm = H.analyse(st.points()).geomean
    assert gm["lo"].isna().all() and gm["hi"].isna().all()
    rows = []
    for k, e in enumerate(["a", "b", "c"]):
        d = gpu_base.head(2).copy()
        d["time_ms"] = d["time_ms"] * (1.001 if k == 2 else 1.0)
        d["time_ci_lo_ms"], d["time_ci_hi_ms"] = pd.NA, pd.NA     # no interval: nothing to weigh
        d["backend"] = d["backend"] + "@" + e
        d["env"] = e
        rows.append(d)
    st2 = Store(tmp_path / "s2")
    st2.add([pd.concat(rows, ignore_index=True).assign(run_id="ab")])
    an = H.analyse(st2.points())
    assert an.builds.empty and an.build_points.empty


def test_one_wild_run_followed_by_a_normal_one_is_no_step():
    rng = np.random.default_rng(7)
    for tail in ([0.26, 0.0], [0.0, 0.26, 0.0]):
        y = np.r_[rng.normal(0, 0.01, 12), tail]
        assert ST.fit(y, np.full(y.size, 0.003)).starts == (0,), tail


def test_run_effects_read_a_step_through_the_cases_runs_share():
    rng = np.random.default_rng(2)
    levels = rng.normal(0, 1, 82)
    y = levels[:, None] + rng.normal(0, 0.002, (82, 30))
    y[:, 20:] += np.log(1.03)
    y[2:41, 15:] = np.nan     # a suite change at run 15: only 2 cases shared across it ...
    y[41:, :15] = np.nan      # ... the others new
    eff, sets = H.run_effects(y)
    assert sets == 1
    assert np.expm1(np.median(eff[20:]) - np.median(eff[15:20])) == pytest.approx(0.03, abs=0.003)
    assert abs(np.median(eff[15:20]) - np.median(eff[:15])) < 0.003
    y2 = y.copy()
    y2[:2, 15:] = np.nan      # no case shared: two sets, each centred on its own
    assert H.run_effects(y2)[1] == 2
