"""Build series (an environment A/B of three or more environments): the table holds each case's
speedup against the first environment with the A/B's own intervals, the figure draws them in the
run's order of the environments, the report adds the section, and rows that are not an A/B are
refused in one line naming the missing column."""
import json
import math

import numpy as np
import pandas as pd
import pytest

import flyexplore as fx
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import series as SR
from flyexplore.results import table as R
from flyexplore.views import plot_style as P
from flyexplore.views import series as V
from flyexplore.views.report import write_report

from tests.views.test_export_report import _check_png, _check_svg, need_static

ENVS = ["0.11.2b", "0.13b", "0.14.2b"]


def ab_rows(values: dict, envs=ENVS, op="attention", dtype="bf16", run="r1", record=True, rows_order=None):
    """An environment A/B's rows from ``{(case, backend): [(speedup, lo, hi) per environment after the
    first]}``: the first environment's arm takes 0.1 ms, each other arm 0.1 / speedup ms, and carries the
    speedup against the same backend in the first environment (as the A/B driver writes it).
    ``rows_order``: the environments in the order their rows appear (default ``envs``); the sweep
    record lists ``envs`` (the run's order) unless ``record`` is false."""
    out = []
    first = envs[0]
    for (case, backend), series in values.items():
        per_env = {first: None, **dict(zip(envs[1:], series))}
        for e in rows_order or envs:
            row = {"run_id": run, "op": op, "case": case, "dtype": dtype, "backend": f"{backend}@{e}", "env": e,
                   "status": "ok", "source": "measured", "band": 0.01, "baseline": f"{backend}@{first}",
                   "device": "AMD Instinct MI355X", "platform": "rocm"}
            if per_env[e] is None:
                row["time_ms"] = 0.1
            else:
                sp, lo, hi = per_env[e]
                row.update(time_ms=0.1 / sp, speedup=sp, speedup_lo=lo, speedup_hi=hi)
            out.append(row)
    df = R.frame(out)
    if record:
        df.attrs["sweeps"] = [{"run_id": run, "spec": {"envs": list(envs)},
                               "plan": {"envs": [{"name": e, "python": None, "changes": {}} for e in envs]}}]
    return df


@pytest.fixture
def series():
    # 0.13b is 9% to 25% slower on two cases (the public MI350X report), 0.14.2b recovers one
    return ab_rows({("1x32x4096x4096x128", "flash"): [(0.91, 0.90, 0.92), (1.02, 1.015, 1.025)],
                    ("1x32x8192x8192x128", "flash"): [(0.75, 0.74, 0.76), (0.80, 0.79, 0.81)],
                    ("1x8x1024x1024x64", "flash"): [(1.001, 0.995, 1.006), (0.99, 0.95, 1.03)]})


def _case_traces(fig):
    return [t for t in fig.data if t.meta and "case" in t.meta]


def test_the_table_holds_each_speedup_against_the_first_environment(series):
    t = SR.series_table(series)
    assert t.attrs["envs"] == ENVS and list(t.columns) == list(SR.COLUMNS)
    one = t[t["case"] == "1x32x8192x8192x128"]
    assert list(one["env"]) == ENVS and list(one["position"]) == [0, 1, 2]
    assert list(one["arm"]) == ["flash@0.11.2b", "flash@0.13b", "flash@0.14.2b"]
    assert set(one["reference"]) == {"flash@0.11.2b"} and set(one["backend"]) == {"flash"}
    assert list(one["speedup"]) == pytest.approx([1.0, 0.75, 0.80])
    assert list(one["speedup_lo"].iloc[1:]) == pytest.approx([0.74, 0.79])
    assert list(one["speedup_hi"].iloc[1:]) == pytest.approx([0.76, 0.81])
    assert math.isnan(one["speedup_lo"].iloc[0]) and pd.isna(one["verdict"].iloc[0])
    assert list(one["interval"]) == ["reference", "paired", "paired"]   # the A/B's own numbers
    assert list(one["time_ms"]) == pytest.approx([0.1, 0.1 / 0.75, 0.1 / 0.80])
    # labels by the band: outside +-1% SLOWER/FASTER, inside SAME, across an edge AMBIGUOUS
    lab = dict(zip(zip(t["case"], t["env"]), t["verdict"]))
    assert lab[("1x32x4096x4096x128", "0.13b")] == "SLOWER" and lab[("1x32x4096x4096x128", "0.14.2b")] == "FASTER"
    assert lab[("1x8x1024x1024x64", "0.13b")] == "SAME" and lab[("1x8x1024x1024x64", "0.14.2b")] == "AMBIGUOUS"


def test_the_run_order_comes_from_the_sweep_record_not_the_rows(series):
    # rows written 0.14.2b first (a resumed file), the record says the run's order
    shuffled = ab_rows({("c1", "flash"): [(0.9, 0.89, 0.91), (1.1, 1.09, 1.11)]},
                       rows_order=["0.14.2b", "0.11.2b", "0.13b"])
    assert R.ab_envs(shuffled) == ["0.14.2b", "0.11.2b", "0.13b"]
    assert SR.run_order(shuffled) == ENVS
    tr = _case_traces(fx.figure("series", shuffled))
    assert list(tr[0].x) == ENVS and list(tr[0].y) == pytest.approx([1.0, 0.9, 1.1])
    # without a record: the order the rows first name them
    bare = shuffled.copy()
    bare.attrs = {}
    assert SR.run_order(bare) == ["0.14.2b", "0.11.2b", "0.13b"]
    # the spec's --env text is read where the plan lists none
    spec_only = shuffled.copy()
    spec_only.attrs = {"sweeps": [{"spec": {"envs": ["0.11.2b=/opt/a/bin/python", "0.13b:X=1", "0.14.2b"]}}]}
    assert SR.run_order(spec_only) == ENVS


def test_the_figure_draws_the_environments_in_run_order_with_intervals_and_labels(series):
    before = series.copy()
    fig = fx.figure("series", series)
    pd.testing.assert_frame_equal(series, before)   # drawing never changes the data
    tr = {t.meta["case"]: t for t in _case_traces(fig)}
    assert list(tr) == ["1x32x4096x4096x128", "1x32x8192x8192x128", "1x8x1024x1024x64"]
    for t in tr.values():
        assert list(t.x) == ENVS and t.meta["reference"] == "flash@0.11.2b"
    t = tr["1x32x8192x8192x128"]
    assert list(t.y) == pytest.approx([1.0, 0.75, 0.80])
    # whiskers reach the interval bounds; none on the reference
    assert list(t.error_y.array) == pytest.approx([0.0, 0.01, 0.01])
    assert list(t.error_y.arrayminus) == pytest.approx([0.0, 0.01, 0.01])
    assert list(t.marker.symbol) == [V.REFERENCE_SYMBOL, P.LABEL_SYMBOLS["SLOWER"], P.LABEL_SYMBOLS["SLOWER"]]
    assert list(tr["1x8x1024x1024x64"].marker.symbol)[1:] == [P.LABEL_SYMBOLS["SAME"], P.LABEL_SYMBOLS["AMBIGUOUS"]]
    assert "0.749" not in t.customdata[1][0] and "0.750x [0.740, 0.760] SLOWER" in t.customdata[1][0]
    # the legend says what each marker means, the axis keeps the run's order
    names = {d.name for d in fig.data}
    assert {"0.11.2b: the reference", "FASTER", "SAME", "SLOWER", "AMBIGUOUS"} <= names
    assert list(fig.layout.xaxis.categoryarray) == ENVS
    assert "speedup vs 0.11.2b" in fig.layout.title.text and "run order" in fig.layout.title.text
    # the SAME band is shaded at +-band, the 1.0x line dashed
    rect = [s for s in fig.layout.shapes if s.type == "rect"]
    assert rect and (rect[0].y0, rect[0].y1) == pytest.approx((0.99, 1.01))


def test_envs_pick_and_reorder_the_environments(series):
    fig = fx.figure("series", series, envs=["0.13b", "0.14.2b"])
    t = {tr.meta["case"]: tr for tr in _case_traces(fig)}["1x32x8192x8192x128"]
    assert list(t.x) == ["0.13b", "0.14.2b"] and t.meta["reference"] == "flash@0.13b"
    # no stored speedup against 0.13b: the ratio of the median times
    assert list(t.y) == pytest.approx([1.0, 0.80 / 0.75])
    tab = SR.series_table(series, envs="0.14.2b,0.11.2b")
    assert tab.attrs["envs"] == ["0.14.2b", "0.11.2b"]
    # 0.11.2b against 0.14.2b: the inverse of 0.14.2b against 0.11.2b
    assert list(tab.loc[tab["case"] == "1x32x8192x8192x128", "speedup"]) == pytest.approx([1.0, 1 / 0.80])
    with pytest.raises(UsageError, match=r"unknown environment '0.12b' \(valid: 0.11.2b, 0.13b, 0.14.2b\)"):
        fx.figure("series", series, envs=["0.11.2b", "0.12b"])
    with pytest.raises(UsageError, match="environment '0.13b' named twice"):
        SR.series_table(series, envs=["0.13b", "0.13b"])
    with pytest.raises(UsageError, match="two or more environments, got 1"):
        SR.series_table(series, envs=["0.13b"])


def test_an_interval_against_another_first_environment_keeps_the_spread_between_pairs():
    # three pairs of workers; the arms' per-pair times: b and c are the same build, their ratio
    # moves from pair to pair, so the interval must hold that spread (between-pair), not the
    # narrow within-pair one their pooled rounds would give
    times = {"a": [0.050, 0.052, 0.049], "b": [0.047, 0.053, 0.050], "c": [0.049, 0.051, 0.052]}
    rounds = {e: [[t * (1 + 0.001 * ((i * 7) % 5 - 2))] for t in ts for i in range(20)] for e, ts in times.items()}
    rows = []
    for e, ts in times.items():
        est = [{"time_ms": t, "time_se": 0.002} for t in ts]
        row = {"run_id": "r1", "op": "rmsnorm", "case": "256x256", "dtype": "fp32", "backend": f"aten@{e}", "env": e,
               "status": "ok", "source": "measured", "time_ms": float(np.exp(np.mean(np.log(ts)))), "processes": 3,
               "process_estimates": json.dumps(est), "order": "interleaved", "samples_ms": json.dumps(rounds[e]),
               "baseline": "aten@a", "platform": "cpu"}
        rows.append(row)
    df = R.frame(rows)
    t = SR.series_table(df, envs=["b", "c"])
    c = t[t["env"] == "c"].iloc[0]
    r = np.asarray(times["b"]) / np.asarray(times["c"])
    est, lo, hi = S.between_process(r, np.full(3, math.sqrt(2) * 0.002), prediction=False)
    assert c["interval"] == "between-pair"
    assert (c["speedup"], c["speedup_lo"], c["speedup_hi"]) == pytest.approx((est, lo, hi))
    assert c["verdict"] == "AMBIGUOUS"


def test_rows_that_are_not_an_ab_are_refused_naming_the_column(series):
    plain = series.drop(columns=["env"]).assign(backend=lambda d: d["backend"].str.split("@").str[0] + "x")
    with pytest.raises(UsageError,
                       match="build series needs column 'env', which the rows lack: not an environment A/B"):
        fx.figure("series", plain)
    with pytest.raises(UsageError, match="column 'time_ms'"):
        SR.series_table(series.drop(columns=["time_ms"]))
    with pytest.raises(UsageError, match="column 'env' is empty"):
        fx.figure("series", series.assign(env=pd.NA))
    with pytest.raises(UsageError, match=r"two or more environments, the rows hold one \(0.13b\)"):
        fx.figure("series", series[series["env"] == "0.13b"])
    with pytest.raises(UsageError, match=r"unknown series layout 'grid' \(valid: auto, lines, facets, geomean\)"):
        fx.figure("series", series, layout="grid")
    with pytest.raises(UsageError, match="unknown option 'baseline' for figure 'series'"):
        fx.figure("series", series, baseline="flash@0.13b")


def test_a_case_without_its_reference_is_left_out_and_said():
    df = ab_rows({("c1", "flash"): [(0.9, 0.89, 0.91), (1.1, 1.09, 1.11)],
                  ("c2", "flash"): [(0.8, 0.79, 0.81), (0.7, 0.69, 0.71)]})
    df.loc[(df["case"] == "c2") & (df["env"] == "0.11.2b"), ["status", "time_ms"]] = ["crashed", np.nan]
    t = SR.series_table(df)
    assert set(t["case"]) == {"c1"}
    assert t.attrs["notes"] == ["flash: 1 case(s) without an ok flash@0.11.2b row, left out"]
    # a crashed arm in a later environment: no point there, and the line breaks (no made-up value between)
    df2 = ab_rows({("c1", "flash"): [(0.9, 0.89, 0.91), (1.1, 1.09, 1.11)]})
    df2.loc[df2["env"] == "0.13b", ["status", "time_ms", "speedup"]] = ["crashed", np.nan, np.nan]
    assert list(SR.series_table(df2)["env"]) == ["0.11.2b", "0.14.2b"]
    fig = fx.figure("series", df2)
    (tr,) = _case_traces(fig)
    assert list(tr.x) == ENVS and tr.y[0] == 1.0 and math.isnan(tr.y[1]) and tr.y[2] == pytest.approx(1.1)
    assert not tr.connectgaps and "0.13b: no number" in tr.customdata[1][0]
    assert "no label" not in {d.name for d in fig.data}


def test_several_backends_each_against_their_own_arm_in_the_first_environment():
    df = ab_rows({("c1", "flash"): [(0.9, 0.89, 0.91), (1.1, 1.09, 1.11)],
                  ("c1", "efficient"): [(1.2, 1.19, 1.21), (1.3, 1.29, 1.31)]})
    tr = {t.meta["backend"]: t for t in _case_traces(fx.figure("series", df))}
    assert tr["efficient"].meta["reference"] == "efficient@0.11.2b"
    assert list(tr["efficient"].y) == pytest.approx([1.0, 1.2, 1.3])
    assert list(tr["flash"].y) == pytest.approx([1.0, 0.9, 1.1])
    assert tr["efficient"].name == "c1 efficient"   # the backend named where several are drawn


def test_the_layout_follows_the_number_of_cases():
    def cases(n):
        return ab_rows({(f"c{i}", "flash"): [(1 + 0.01 * i, 1 + 0.01 * i - 0.005, 1 + 0.01 * i + 0.005),
                                              (1 - 0.01 * i, 1 - 0.01 * i - 0.005, 1 - 0.01 * i + 0.005)]
                        for i in range(n)})

    few = fx.figure("series", cases(V.LINES_MAX))
    assert len(_case_traces(few)) == V.LINES_MAX and "xaxis2" not in few.to_plotly_json()["layout"]   # one panel
    assert few.layout.scattermode == "group"   # the cases' points side by side at each environment
    many = fx.figure("series", cases(V.LINES_MAX + 1))
    assert len(_case_traces(many)) == V.LINES_MAX + 1
    assert f"xaxis{V.LINES_MAX + 1}" in many.to_plotly_json()["layout"]   # a panel per case
    assert {t.xaxis for t in _case_traces(many)} == {"x"} | {f"x{i}" for i in range(2, V.LINES_MAX + 2)}
    assert [a.text for a in many.layout.annotations][:2] == ["c0", "c1"]
    lot = cases(V.FACETS_MAX + 1)
    fig = fx.figure("series", lot)
    assert not _case_traces(fig)
    (gm,) = [t for t in fig.data if t.meta and t.meta.get("geomean")]
    assert list(gm.x) == ENVS
    sp = SR.series_table(lot)
    for k, env in enumerate(ENVS[1:], start=1):
        g = sp[sp["env"] == env]
        est, lo, hi = S.geomean_ci(g["speedup"], g["speedup_lo"], g["speedup_hi"])
        assert gm.y[k] == pytest.approx(est)
        assert gm.error_y.array[k] == pytest.approx(hi - est) and gm.error_y.arrayminus[k] == pytest.approx(est - lo)
    assert gm.y[0] == 1.0
    # several backends: a panel of geometric means each (their labels would overlap in one)
    two = ab_rows({(f"c{i}", b): [(1.1, 1.09, 1.11), (0.9, 0.89, 0.91)] for i in range(V.FACETS_MAX // 2 + 1)
                   for b in ("flash", "efficient")})
    gms = {t.meta["backend"]: t for t in fx.figure("series", two).data if t.meta and t.meta.get("geomean")}
    assert {t.xaxis for t in gms.values()} == {"x", "x2"}
    assert list(gms["efficient"].y) == pytest.approx([1.0, 1.1, 0.9])
    assert [a.text for a in fx.figure("series", two).layout.annotations] == ["attention bf16 flash",
                                                                           "attention bf16 efficient"]
    # any layout on request
    assert len(_case_traces(fx.figure("series", cases(3), layout="facets"))) == 3


def test_the_report_of_three_environments_has_the_series_section(tmp_path, series):
    path = write_report(series, tmp_path / "rep", static=False)
    html = path.read_text()
    assert "Build series: 3 environments in run order" in html and 'id="fig-series"' in html
    assert "0.11.2b → 0.13b → 0.14.2b" in html and "B C A, C A B" in html
    assert "0.13b vs 0.11.2b: attention bf16 flash, 3 case(s): 1 SAME, 2 SLOWER" in html
    back = pd.read_csv(tmp_path / "rep" / "tables" / "series.csv")
    one = back[back["case"] == "1x32x8192x8192x128"]
    assert list(one["env"]) == ENVS and list(one["speedup"]) == pytest.approx([1.0, 0.75, 0.80])
    # two environments: an ordinary A/B, no series section
    two = write_report(series[series["env"] != "0.14.2b"], tmp_path / "rep2", static=False).read_text()
    assert "Build series" not in two


@pytest.mark.slow
def test_the_series_figure_exports_as_an_image(tmp_path, series):
    need_static()
    got = fx.export(fx.figure("series", series, title="series export"), tmp_path / "s.png")
    assert list(got["status"]) == ["written"]
    _check_png(tmp_path / "s.png", 2200)
    got = fx.export({"series": fx.figure("series", series)}, tmp_path / "figs", formats="svg")
    _check_svg(tmp_path / "figs" / "series.svg", "0.14.2b")


@pytest.mark.slow
def test_a_real_three_environment_cpu_ab(tmp_path):
    out = tmp_path / "series.parquet"
    df = fx.sweep("rmsnorm", shapes="256x256", backends="aten", pairs=1, out=out,
                  envs=["a:OMP_NUM_THREADS=1", "b:OMP_NUM_THREADS=1", "c:OMP_NUM_THREADS=1"])
    assert sorted(df["env"]) == ["a", "b", "c"]
    back = fx.load(out)
    assert SR.run_order(back) == ["a", "b", "c"]
    (tr,) = _case_traces(fx.figure("series", out))
    assert list(tr.x) == ["a", "b", "c"] and tr.meta["reference"] == "aten@a"
    rows = back.set_index("env")
    assert list(tr.y) == pytest.approx([1.0, rows.loc["b", "speedup"], rows.loc["c", "speedup"]])
    assert list(tr.error_y.array[1:]) == pytest.approx(
        [rows.loc[e, "speedup_hi"] - rows.loc[e, "speedup"] for e in ("b", "c")])
    html = write_report(back, tmp_path / "rep", static=False).read_text()
    assert "Build series: 3 environments in run order" in html and "a → b → c" in html
