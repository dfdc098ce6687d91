"""The history's public face, figure and report (``fx.history``, :mod:`flyexplore.views.history`):
a store of ten synthetic H200 runs (the reproducible run's rows, scaled by run-to-run noise, a 3%
step from the seventh run on) -- the step is found at that run, the figure marks it there with its
size and interval, the report names it, the export is valid BMF, and bad arguments are refused in
one line with nothing written."""
import json
import re

import numpy as np
import pandas as pd
import pytest

import flyexplore as fx
from flyexplore.errors import UsageError
from flyexplore.paths import data_dir
from flyexplore.results import table as R
from flyexplore.views import history as VH

from tests.views.test_export_report import need_static
from tests.views.test_series import ab_rows

RUNS = 10
STEP_AT = 6          # position (0 = oldest) of the first run 3% slower
CASES = ("64x4096x4096", "1024x4096x4096", "4096x4096x4096")
TIME_COLS = ("time_ms", "time_ci_lo_ms", "time_ci_hi_ms", "time_p20_ms", "time_p80_ms", "time_min_ms", "time_mean_ms")


def synthetic_runs(runs=RUNS, step_at=STEP_AT, step=1.03, noise=0.004, seed=3):
    """``runs`` result sets of one H200 build: the reproducible run's rows of :data:`CASES` (3
    cases x 3 backends) as one-process rows, every time column scaled by log-normal run-to-run noise and by ``step``
    from run ``step_at`` on; run ids ``run00``.. and timestamps an hour apart."""
    base = R.load(data_dir() / "h200" / "reproducible" / "run1.parquet")
    base = base[base["case"].isin(CASES)].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(runs):
        df = base.copy()
        df.attrs = {}                      # (each column read deep-copies the attrs: slow)
        f = np.exp(rng.normal(0, noise, len(df))) * (step if i >= step_at else 1.0)
        for c in TIME_COLS:
            df[c] = df[c] * f
        df["samples_ms"] = pd.NA          # the samples would contradict the scaled times
        df["processes"] = pd.NA           # one process a row (the rows a learned allowance reads)
        df["process_estimates"] = pd.NA
        df["run_id"] = f"run{i:02d}"
        df["timestamp"] = f"2026-12-01T{i:02d}:00:00+00:00"
        out.append(df)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    paths = []
    for i, df in enumerate(synthetic_runs()):
        R.save(df, d / f"run{i:02d}.parquet")
        paths.append(d / f"run{i:02d}.parquet")
    return paths


@pytest.fixture(scope="module")
def hist(files, tmp_path_factory):
    return fx.history(tmp_path_factory.mktemp("h") / "store", add=files)


def test_fx_history_adds_the_files_and_finds_the_step_at_its_run(hist, files):
    assert fx.history is VH.history and isinstance(hist, fx.History)
    assert hist.runs["run_id"].tolist() == [f"run{i:02d}" for i in range(RUNS)]
    st = hist.steps
    gm = st[st["series"] == "geomean"]
    assert len(gm) == 1 and int(gm["position"].iloc[0]) == STEP_AT and gm["run_id"].iloc[0] == f"run{STEP_AT:02d}"
    assert gm["direction"].iloc[0] == "slower" and 0 < gm["lo"].iloc[0] < 0.03 < gm["hi"].iloc[0]
    assert gm["prev_run_id"].iloc[0] == f"run{STEP_AT - 1:02d}"
    cases = st[st["series"] != "geomean"]
    assert len(cases) >= 6 and (cases["position"] - STEP_AT).abs().max() <= 1
    # the same files again: nothing added, the analysis as it was
    again = hist.add(files[:2])
    assert again.rows_added == 0 and again.runs_added == 0 and len(again.lines) == 2
    assert hist.steps.equals(st)
    # the properties are copies: changing one leaves the next read alone
    st.loc[:, "change"] = 0.0
    assert (hist.steps["change"] != 0).all()
    lines = hist.show()
    assert any(line.startswith("  step: geomean: slower +") and f"run {STEP_AT + 1} of {RUNS}" in line
               for line in lines)
    assert repr(hist) == "\n".join(lines)
    d = hist.to_dict()
    json.dumps(d)
    assert [s["run_id"] for s in d["steps"] if s["series"] == "geomean"] == [f"run{STEP_AT:02d}"]


def test_a_new_run_is_seen_after_an_add(tmp_path):
    runs = synthetic_runs(runs=5, step_at=99)
    h = fx.history(tmp_path / "s", add=runs[:4])
    assert len(h.runs) == 4 and len(h.steps) == 0
    added = h.add(runs[4])           # one DataFrame
    assert added.runs_added == 1 and added.rows_added == 9
    assert len(h.runs) == 5 and h.analysis() is h.analysis()
    # another History of the same folder adds: this one reads the store again
    fx.history(tmp_path / "s", add=synthetic_runs(runs=6, step_at=99)[5:])
    assert len(h.runs) == 6


def test_the_geomean_figure_marks_the_step_at_its_run_with_size_and_interval(hist):
    fig = hist.figure()
    pts = [t for t in fig.data if t.meta and t.meta.get("kind") == "points"]
    lvl = [t for t in fig.data if t.meta and t.meta.get("kind") == "level"]
    assert len(pts) == len(lvl) == 1 and pts[0].meta["series"] == "geomean"
    assert list(pts[0].x) == list(range(1, RUNS + 1))            # run position, 1 = oldest
    assert pts[0].error_y.array is not None and (np.asarray(pts[0].error_y.array) > 0).all()
    level = np.asarray(lvl[0].y, dtype=float)
    assert lvl[0].line.shape == "hv" and len(set(level[:STEP_AT])) == 1 and len(set(level[STEP_AT:])) == 1
    assert level[STEP_AT] / level[0] == pytest.approx(1.03, abs=0.01)
    # hover: run id, timestamp, commit
    assert pts[0].customdata[STEP_AT][0] == f"run{STEP_AT:02d}"
    assert pts[0].customdata[STEP_AT][1].startswith("2026-12-01T06")
    assert "%{customdata[0]}" in pts[0].hovertemplate and "commit" in pts[0].hovertemplate
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 1 and lines[0].x0 == STEP_AT + 1 and lines[0].line.dash == "dot"
    marks = [a for a in fig.layout.annotations if a.name == "step"]
    assert len(marks) == 1 and marks[0].x == STEP_AT + 1
    assert re.fullmatch(r"\+[234]\.\d% \[\+\d\.\d, \+\d\.\d\]", marks[0].text), marks[0].text
    gm = hist.steps.query("series == 'geomean'").iloc[0]
    assert marks[0].text == VH.step_label(gm["change"], gm["lo"], gm["hi"])
    assert "NVIDIA H200 (cuda)" in [a.text for a in fig.layout.annotations]   # the panel's title


def test_the_cases_figure_draws_the_largest_steps_each_from_its_first_level(hist):
    fig = hist.figure("cases", top=3)
    pts = [t for t in fig.data if t.meta and t.meta.get("kind") == "points"]
    st = hist.steps.query("series != 'geomean'")
    biggest = st.assign(a=st["change"].abs()).sort_values("a", ascending=False)["series"].head(3).tolist()
    assert [t.meta["series"] for t in pts] == biggest
    for t in fig.data:
        if t.meta and t.meta.get("kind") == "level":
            assert t.y[0] == pytest.approx(1.0)                  # normalized to the first level
    marks = [a for a in fig.layout.annotations if a.name == "step"]
    assert len(marks) == 3 and all(a.x == STEP_AT + 1 for a in marks)
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == 1   # one line per run that stepped
    one = hist.figure("cases", cases="gemm 64x4096x4096 bf16 aten")
    assert [t.meta["series"] for t in one.data if t.meta and t.meta.get("kind") == "points"] == \
        ["gemm 64x4096x4096 bf16 aten"]
    by_case = hist.figure("cases", cases=["64x4096x4096"])
    assert len([t for t in by_case.data if t.meta and t.meta.get("kind") == "points"]) == 3


def test_bad_figure_arguments_are_refused_in_one_line(hist):
    for kw, word in (({"what": "bars"}, "geomean, cases, build"), ({"what": "cases", "cases": "9x9x9"}, "9x9x9"),
                     ({"what": "cases", "top": 0}, "top"), ({"what": "cases", "cases": []}, "no case"),
                     ({"what": "build"}, "no build series")):
        with pytest.raises(UsageError, match=re.escape(word)) as e:
            hist.figure(**kw)
        assert "\n" not in str(e.value)


def test_the_build_figure_marks_steps_between_builds(tmp_path):
    ab = ab_rows({("1x32x4096x4096x128", "flash"): [(0.91, 0.90, 0.92), (1.02, 1.015, 1.025)],
                  ("1x32x8192x8192x128", "flash"): [(1.0, 0.995, 1.005), (1.0, 0.995, 1.005)]})
    ab["timestamp"] = "2026-12-01T00:00:00+00:00"
    ab["time_ci_lo_ms"], ab["time_ci_hi_ms"] = ab["time_ms"] * 0.997, ab["time_ms"] * 1.003
    h = fx.history(tmp_path / "s", add=ab)
    fig = h.figure("build")
    pts = [t for t in fig.data if t.meta and t.meta.get("kind") == "points"]
    slow = [t for t in pts if t.meta["series"] == "attention 1x32x4096x4096x128 bf16 flash"][0]
    assert list(slow.x) == [0, 1, 2] and list(slow.y) == pytest.approx([1.0, 1 / 0.91, 1 / 1.02], rel=1e-6)
    assert list(fig.layout.xaxis.ticktext) == ["0.11.2b", "0.13b", "0.14.2b"]
    # both steps of the slowed case, each between its two builds; none in the steady one
    assert sorted(s.x0 for s in fig.layout.shapes if s.type == "line") == [0.5, 1.5]
    marks = sorted((a.x, a.text) for a in fig.layout.annotations if a.name == "step")
    assert [x for x, _ in marks] == [0.5, 1.5] and marks[0][1].startswith("+9.") and marks[1][1].startswith("-10.")
    with pytest.raises(UsageError, match="unknown case 'nope'"):
        h.figure("build", cases="nope")


def test_the_report_shows_the_step_its_tables_and_figure(hist, tmp_path):
    path = hist.report(tmp_path / "rep", static=False)
    assert path == tmp_path / "rep" / "report.html"
    html = path.read_text()
    assert f"History: {RUNS} runs on 1 device model" in html
    assert "fig-history_geomean" in html and "fig-history_cases" in html
    assert "geomean: slower +" in html and f"from run run{STEP_AT:02d}" in html
    steps = pd.read_csv(tmp_path / "rep" / "tables" / "history_steps.csv")
    assert steps["series"].iloc[0] == "geomean" and steps["run"].iloc[0] == STEP_AT + 1
    assert len(pd.read_csv(tmp_path / "rep" / "tables" / "history_runs.csv")) == RUNS
    assert not (tmp_path / "rep" / "figures").exists()
    with pytest.raises(UsageError, match="figure format 'gif'"):
        hist.report(tmp_path / "rep2", formats=["gif"])
    assert not (tmp_path / "rep2").exists()


def test_the_report_without_static_export_says_why(hist, tmp_path, monkeypatch):
    import flyexplore.views.export as X

    monkeypatch.setattr(X, "static_export_problem", lambda: "no Chromium/Chrome for kaleido (test)")
    html = hist.report(tmp_path / "rep", static=True).read_text()
    assert "Static images not written" in html and "no Chromium/Chrome for kaleido (test)" in html
    assert "fig-history_geomean" in html and not (tmp_path / "rep" / "figures").exists()


@pytest.mark.slow
def test_the_report_writes_the_figures_as_images(hist, tmp_path):
    need_static()
    VH.write_history_report(hist.analysis(), tmp_path / "rep", formats=["png"])
    assert (tmp_path / "rep" / "figures" / "history_geomean.png").stat().st_size > 1000


def test_export_writes_the_newest_run_as_bmf(hist, files, tmp_path):
    p = hist.export(tmp_path / "out" / "bmf.json")
    data = json.loads(p.read_text())
    newest = R.load(files[-1])
    assert len(data) == len(newest)
    for r in newest.itertuples():
        m = data[f"{r.op}/{r.case}/{r.dtype}/{r.backend}"]["latency"]
        assert m["value"] == pytest.approx(r.time_ms * 1e6)             # ns
        assert m["lower_value"] <= m["value"] <= m["upper_value"]
    first = json.loads(hist.export(tmp_path / "first.json", run="run00").read_text())
    assert first != data
    gab = json.loads(hist.export(tmp_path / "gab.json", format="github-action-benchmark").read_text())
    assert len(gab) == len(newest) and {g["unit"] for g in gab} == {"ms"}
    for kw, word in (({"format": "csv"}, "csv"), ({"run": "nope"}, "nope")):
        with pytest.raises(UsageError, match=word):
            hist.export(tmp_path / "bad.json", **kw)
        assert not (tmp_path / "bad.json").exists()
    with pytest.raises(UsageError, match="is a folder"):
        hist.export(tmp_path / "out")


def test_gate_and_allowance(hist):
    g = hist.gate("SLOWER:1%")
    assert g.failed and g.lines[0].startswith("gate SLOWER:1%: FAILED")
    assert not hist.gate("SLOWER:10%").failed
    assert not hist.gate("SLOWER:1%", recent=3).failed        # the step is 4 runs old
    with pytest.raises(UsageError, match="AMBIGUOUS"):
        hist.gate("AMBIGUOUS:5%")
    a = hist.allowance()
    # the pairs across the 3% step are a change, not how far identical runs move: left out
    assert a.source == "learned" and a.runs == RUNS and 0.002 < a.value < 0.03
    assert hist.allowance(device="NVIDIA H200").source == "learned"
    assert hist.allowance(device_id="GPU-nothing", platform="cuda").source == "constant"


def test_a_folder_without_a_store(tmp_path):
    h = fx.history(tmp_path / "none")
    assert "no store yet" in repr(h)
    with pytest.raises(UsageError, match="no history store"):
        h.steps
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        fx.history(tmp_path / "f")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(UsageError):
        fx.history(tmp_path / "s2", add=[bad])
    assert not (tmp_path / "s2" / "history.sqlite").exists()
