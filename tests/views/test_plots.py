"""Figure content: the traces hold the numbers computed from the rows, and drawing never
changes the rows."""
import json
import math

import pandas as pd
import pytest

from flyexplore.views import plot_style as ST
from flyexplore.views import plots as F
from flyexplore.views import plots_compare as FC
from flyexplore.results import published as P
from flyexplore.results import table as R
from flyexplore.results.compare import pair
from flyexplore.errors import UsageError


def rows(times: dict, op="gemm", dtype="bf16", device="NVIDIA H200", run="r1", samples=False, **extra):
    """Result rows from {(case, backend): time_ms}; GEMM cases are 'MxNxK'. ``samples``: also
    12 interleaved rounds per row within +-0.1% of the time (so that intervals are tight)."""
    out = []
    for (case, backend), t in times.items():
        dims = [int(x) for x in case.split("x")]
        p = dict(zip(("m", "n", "k"), dims))
        if op == "gemm":
            p["layout"] = "NT"
        fl = 2.0 * dims[0] * dims[1] * dims[2] if op == "gemm" else 4.0 * dims[0] * dims[1]
        nb = 2.0 * (dims[0] * dims[2] + dims[1] * dims[2] + dims[0] * dims[1]) if op == "gemm" else 4.0 * dims[0] * dims[1]
        out.append({"run_id": run, "op": op, "case": case, "params": json.dumps(p), "dtype": dtype, "backend": backend,
                    "status": "ok", "source": "measured", "time_ms": t, "flops": fl, "bytes": nb,
                    "tflops": fl / (t / 1e3) / 1e12, "gbps": nb / (t / 1e3) / 1e9, "device": device,
                    "platform": "cuda", "torch": "2.11.0", **p, **extra})
        if samples:
            out[-1].update(order="interleaved", samples_ms=json.dumps(
                [[t * (1 + 0.0005 * ((i * 7) % 5 - 2))] for i in range(12)]))
    return R.frame(out)


@pytest.fixture
def gemm():
    return rows({("64x4096x4096", "aten"): 0.020, ("64x4096x4096", "triton"): 0.025, ("64x4096x4096", "flydsl"): 0.010,
                 ("128x4096x4096", "aten"): 0.030, ("128x4096x4096", "triton"): 0.015, ("128x4096x4096", "flydsl"): 0.0151,
                 ("256x4096x4096", "aten"): 0.040, ("256x4096x4096", "triton"): 0.050, ("256x4096x4096", "flydsl"): 0.050})


def _bars(fig):
    return [t for t in fig.data if t.type == "bar"]


def test_speedup_figure_traces_hold_the_speedups(gemm):
    before = gemm.copy()
    fig = F.speedup_figure(gemm, "aten")
    pd.testing.assert_frame_equal(gemm, before)  # drawing never changes the data
    bars = {b.legendgroup: b for b in _bars(fig)}
    assert set(bars) == {"triton", "flydsl"}
    fl = bars["flydsl"]
    assert list(fl.x) == ["64x4096x4096", "128x4096x4096", "256x4096x4096"]
    assert list(fl.y) == pytest.approx([2.0, 0.030 / 0.0151, 0.8])
    gm = (2.0 * (0.030 / 0.0151) * 0.8) ** (1 / 3)
    assert f"geomean {gm:.3f}x" in fl.name
    assert fl.marker.color == ST.BACKEND_COLORS["flydsl"] == bars["flydsl"].marker.color
    assert bars["triton"].marker.color == ST.BACKEND_COLORS["triton"]
    # baseline line at 1.0 (dashed) and the y axis from zero
    lines = [s for s in fig.layout.shapes if s.y0 == s.y1]
    assert any(s.y0 == 1.0 and s.line.dash == "dash" for s in lines)
    assert any(s.y0 == pytest.approx(gm) for s in lines)
    assert fig.layout.yaxis.rangemode == "tozero"


def test_speedup_against_the_faster_of_several_and_ties():
    gemm = rows({("64x4096x4096", "aten"): 0.020, ("64x4096x4096", "triton"): 0.025, ("64x4096x4096", "flydsl"): 0.010,
                 ("128x4096x4096", "aten"): 0.030, ("128x4096x4096", "triton"): 0.015, ("128x4096x4096", "flydsl"): 0.0151,
                 ("256x4096x4096", "aten"): 0.040, ("256x4096x4096", "triton"): 0.050, ("256x4096x4096", "flydsl"): 0.050},
                samples=True)
    fig = F.speedup_figure(gemm, ["aten", "triton"])
    (fl,) = _bars(fig)
    # per case the faster of aten/triton: 0.020, 0.015, 0.040
    assert list(fl.y) == pytest.approx([2.0, 0.015 / 0.0151, 0.8])
    # 0.993 with a tight interval is SAME (within +-1%): outlined; the others are not
    assert list(fl.marker.line.width) == [0, 2.5, 0]
    assert [c[4] for c in fl.customdata] == ["FASTER", "SAME", "SLOWER"]
    assert "(1 FASTER, 1 SAME, 1 SLOWER)" in fl.name
    assert len(fl.error_y.array) == 3 and max(fl.error_y.array) < 0.01
    assert "faster of aten, triton" in fig.layout.yaxis.title.text
    assert [c[2] for c in fl.customdata] == ["aten", "triton", "aten"]


def test_speedup_figure_many_cases_turns_horizontal():
    times = {}
    for m in range(1, 41):
        times[(f"{m * 16}x1024x1024", "aten")] = 0.01 * m
        times[(f"{m * 16}x1024x1024", "flydsl")] = 0.008 * m
    fig = F.speedup_figure(rows(times), "aten")
    (b,) = _bars(fig)
    assert b.orientation == "h" and len(b.y) == 40 and list(b.x) == pytest.approx([1.25] * 40)
    assert fig.layout.xaxis.rangemode == "tozero" and fig.layout.height > 560


def test_speedup_figure_errors(gemm):
    with pytest.raises(UsageError, match="no rows for baseline"):
        F.speedup_figure(gemm, "cudnn")


def test_sweep_figure(gemm):
    fig = F.sweep_figure(gemm, x="m", y="time_ms")
    tr = {t.name: t for t in fig.data}
    assert set(tr) == {"aten", "triton", "flydsl"}
    assert list(tr["aten"].x) == [64, 128, 256]
    assert list(tr["aten"].y) == pytest.approx([20.0, 30.0, 40.0])  # µs (all times < 1 ms)
    assert fig.layout.yaxis.title.text == "time (µs)" and fig.layout.xaxis.type == "log"
    assert tr["flydsl"].line.color == ST.BACKEND_COLORS["flydsl"]
    fig = F.sweep_figure(gemm, x="m", y="tflops")
    t = [d for d in fig.data if d.name == "flydsl"][0]
    assert t.y[0] == pytest.approx(2 * 64 * 4096 * 4096 / 10e-6 / 1e12)
    with pytest.raises(UsageError, match="unknown sweep dimension 'q'"):
        F.sweep_figure(gemm, x="q")
    with pytest.raises(UsageError, match="unknown sweep y"):
        F.sweep_figure(gemm, y="speed")


def test_sweep_figure_fixed_and_min_points():
    pub = P.load("mxfp")
    fig = F.sweep_figure(pub, x="m", y="tflops", fixed={"n": 4096, "k": 4096})
    names = {t.name for t in fig.data}
    assert names == {"aten mxfp8", "aten mxfp4", "flydsl mxfp8", "flydsl mxfp4"}
    t = [d for d in fig.data if d.name == "flydsl mxfp8"][0]
    assert list(t.x) == [32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert t.y[-1] == pytest.approx(2114.7)
    fig = F.sweep_figure(pub, x="k", y="tflops")  # single points of other series left out
    assert "not drawn" in fig.layout.title.text


def test_heatmap_eligibility_frame_from_the_explainer():
    elig = pd.DataFrame({"m": [2048, 2048, 8192, 8192], "n": [4096, 8192, 4096, 8192],
                         "value": [False, False, True, True],
                         "reason": ["4096<=N<8192 needs M>=8192", "8192<=N<16384 needs M>=4096", "ok", "ok"]})
    fig = F.heatmap_figure(elig)
    (h,) = fig.data
    assert list(h.x) == ["4096", "8192"] and list(h.y) == ["2048", "8192"]
    assert [list(r) for r in h.z] == [[0.0, 0.0], [1.0, 1.0]]
    assert "needs M>=8192" in h.customdata[0][0]
    assert list(h.colorbar.ticktext) == ["not taken", "taken"]


def test_heatmap_speedup_from_a_result_set():
    pub = P.load("rmsnorm")
    fig = F.heatmap_figure(pub, dtype="fp16")
    (h,) = fig.data
    x, y = list(h.x), list(h.y)
    i, j = y.index("8192"), x.index("4097")
    assert math.exp(h.z[i][j]) == pytest.approx(96.7 / 26.4)
    assert h.text[i][j] == "3.66x"
    assert h.zmid == 0  # diverging scale centred on 1.0x (log 1 = 0)
    assert h.z[y.index("2048")][x.index("4096")] is None  # no such case: blank
    with pytest.raises(UsageError, match="several dtypes"):
        F.heatmap_figure(pub)


def test_roofline_points_and_roofs():
    pub = P.load("dense")
    fig = F.roofline_figure(pub)
    roof = [t for t in fig.data if t.mode == "lines" and t.legendgroup == "roof"][0]
    assert max(roof.y) == pytest.approx(2500.0)           # MI355X bf16 datasheet
    assert roof.y[0] == pytest.approx(roof.x[0] * 8.0)    # 8 TB/s slope
    pts = {t.name: t for t in fig.data if t.mode == "markers" and t.legendgroup == "backends"}
    assert set(pts) == {"aten", "triton", "flydsl"}
    fl = pts["flydsl"]
    assert max(fl.y) == pytest.approx(1540.9)
    assert fl.marker.color == ST.BACKEND_COLORS["flydsl"]
    top = list(fl.y).index(max(fl.y))
    assert fl.x[top] == pytest.approx(2 * 8192 ** 3 / (3 * 8192 * 8192 * 2))
    assert fl.customdata[top][4] == pytest.approx(1540.9 / 2500 * 100)
    fig = F.roofline_figure(P.load("topk,dense"), kind="measured")
    assert "without a FLOP or byte count" in fig.layout.title.text
    with pytest.raises(UsageError, match="one device"):
        F.roofline_figure(pd.concat([pub, rows({("64x64x64", "aten"): 1.0})]))


def test_ab_figure():
    a = rows({("64x4096x4096", "aten"): 0.02, ("128x4096x4096", "aten"): 0.03, ("512x512x512", "aten"): 0.01},
             samples=True)
    b = rows({("64x4096x4096", "aten"): 0.01, ("128x4096x4096", "aten"): 0.0301, ("32x32x32", "aten"): 0.01},
             run="r2", samples=True)
    ab = pair(a, b, ("old", "new"))
    fig = FC.ab_figure(ab)
    bar = [t for t in fig.data if t.type == "bar"][0]
    assert list(bar.x) == ["64x4096x4096", "128x4096x4096"]
    assert list(bar.y) == pytest.approx([2.0, 0.03 / 0.0301])
    # two runs: unpaired intervals widened by the GPU run-to-run allowance (2%), so a 0.3%
    # difference is AMBIGUOUS, never SAME-outlined or FASTER
    assert list(ab.pairs["interval"]) == ["unpaired+run"] * 2
    assert list(ab.pairs["verdict"]) == ["FASTER", "AMBIGUOUS"]
    assert list(bar.marker.line.width) == [0, 0] and len(bar.error_y.array) == 2
    box = [t for t in fig.data if t.type == "box"][0]
    assert sorted(box.y) == pytest.approx(sorted(bar.y))
    assert "1 case(s) only in old, 1 only in new" in fig.layout.title.text
    assert "whiskers: 95% interval" in fig.layout.title.text and max(bar.error_y.array) > 0


def test_figures_promise_whiskers_only_where_they_draw_them():
    # issue 36: the synthetic A/B's chart promised whiskers its pairs could not have
    bare = {("64x4096x4096", "aten"): 0.02, ("64x4096x4096", "triton"): 0.01}
    for fig in (F.speedup_figure(rows(bare)), F.speedup_distribution_figure(rows(bare)),
                FC.ab_figure(pair(rows({("64x4096x4096", "aten"): 0.02}), rows({("64x4096x4096", "aten"): 0.01}, run="r2")))):
        t = fig.layout.title.text
        assert "whiskers" not in t.replace("no whiskers", "") and ST.NO_INTERVALS in t, t
    t = F.speedup_figure(rows(bare, samples=True)).layout.title.text
    assert "whiskers: 95% interval" in t and ST.NO_INTERVALS not in t


def test_published_vs_measured():
    meas = rows({("8x4096x4096", "aten"): 0.02, ("8x4096x4096", "triton"): 0.04, ("99x99x99", "aten"): 1.0,
                 ("99x99x99", "triton"): 1.0})
    fig = FC.published_vs_measured_figure(meas, P.load("dense"))
    tr = {t.name: t for t in fig.data if t.type == "bar"}
    assert set(tr) == {"triton measured", "triton published"}
    assert list(tr["triton measured"].x) == ["8x4096x4096"]
    assert tr["triton measured"].y[0] == pytest.approx(0.5)
    assert tr["triton published"].y[0] == pytest.approx(20.6 / 22.8)
    assert "PR 190903" in tr["triton published"].customdata[0][0]
    assert tr["triton published"].marker.color == tr["triton measured"].marker.color == ST.BACKEND_COLORS["triton"]
    fig = FC.published_vs_measured_figure(meas, P.load("dense"), metric="tflops")
    tr = {t.name: t for t in fig.data if t.type == "bar"}
    assert tr["triton published"].y[0] == pytest.approx(20.6)
    with pytest.raises(UsageError, match="no .* of the measured set"):
        FC.published_vs_measured_figure(rows({("7x7x7", "aten"): 1.0, ("7x7x7", "triton"): 1.0}), P.load("dense"))


def test_vllm_figure_published():
    v = P.vllm_published()
    fig = FC.vllm_figure(v)
    titles = [a.text for a in fig.layout.annotations]
    assert "whole request (bf16) [published]" in titles and "whole request (mxfp8) [published]" in titles
    llama = [t for t in fig.data if t.name == "Llama-3.1-8B-Instruct" and t.xaxis == "x"][0]
    assert list(llama.x) == ["8", "16", "32", "64", "128", "256"]
    assert llama.y[1] == pytest.approx(1.129)
    assert fig.layout.yaxis.rangemode == "tozero"
    assert any("noise floor" in (t.name or "") for t in fig.data)


def test_backend_colors_are_stable():
    assert ST.backend_color("aten") == "#636EFA"
    assert ST.backend_color("my-new-backend") == ST.backend_color("my-new-backend")


def test_speedup_figure_shows_the_geomean_of_a_lone_backend(gemm):
    one = gemm[gemm["backend"].isin(["aten", "flydsl"])]
    fig = F.speedup_figure(one, "aten")
    gm = (2.0 * (0.030 / 0.0151) * 0.8) ** (1 / 3)
    # plotly hides a one-entry legend unless told: the figure says showlegend, and the
    # subtitle carries the geomean too (visible wherever the legend is hidden or cut)
    assert fig.layout.showlegend is True
    (bar,) = _bars(fig)
    assert bar.name.startswith(f"flydsl: geomean {gm:.3f}x")
    assert f"flydsl geomean {gm:.3f}x" in fig.layout.title.text
    # several op/dtype series: each named in the subtitle, up to four of them
    two = pd.concat([one, rows({("64x4096x4096", "aten"): 0.02, ("64x4096x4096", "flydsl"): 0.04}, dtype="fp16")])
    fig = F.speedup_figure(two, "aten")
    assert "flydsl gemm fp16 geomean 0.500x" in fig.layout.title.text
    assert f"flydsl gemm bf16 geomean {gm:.3f}x" in fig.layout.title.text


def test_error_figure_dots_per_format_and_source():
    d = rows({("64x64x64", "aten"): 1.0, ("128x64x64", "aten"): 1.0}, dtype="fp8_e4m3",
             err_rel=0.037, err_tol=0.1, err_rel_dequant=0.001)
    e = rows({("64x64x64", "emulated"): 1.0}, dtype="mxfp4", err_rel=0.16, err_tol=0.3)
    e["source"] = "emulated"
    fig = F.error_figure(pd.concat([d, e]))
    pts = {t.name: t for t in fig.data if t.mode == "markers"}
    assert set(pts) == {"fp8_e4m3 aten (measured)", "mxfp4 emulated (emulated)"}
    assert list(pts["fp8_e4m3 aten (measured)"].y) == pytest.approx([0.037, 0.037])
    assert pts["mxfp4 emulated (emulated)"].marker.symbol.endswith("-open")  # not measured: open marker
    assert not pts["fp8_e4m3 aten (measured)"].marker.symbol.endswith("-open")
    tol = {s.y0 for s in fig.layout.shapes}
    assert tol == {0.1, 0.3} and fig.layout.yaxis.type == "log"
    fig = F.error_figure(pd.concat([d, e]), metric="err_rel_dequant")
    assert [t.name for t in fig.data] == ["fp8_e4m3 aten (measured)"] and not fig.layout.shapes
    with pytest.raises(UsageError, match="unknown error metric 'err'"):
        F.error_figure(d, metric="err")
    with pytest.raises(UsageError, match="no rows with err_rel"):
        F.error_figure(rows({("8x8x8", "aten"): 1.0}))


def test_range_figure_draws_only_the_published_ranges():
    rg = P.ranges()
    aot = rg[rg["what"].str.contains("AOTriton")]
    fig = F.range_figure(aot)
    (bar,) = _bars(fig)
    assert list(bar.base) == pytest.approx([0.92, 0.93])
    assert [b + x for b, x in zip(bar.base, bar.x)] == pytest.approx([2.34, 2.47])
    assert list(bar.text) == ["0.92x – 2.34x", "0.93x – 2.47x"]
    assert any(s.x0 == 1.0 for s in fig.layout.shapes)
    assert "no per-case values are public" in fig.layout.title.text
    assert len(_bars(F.range_figure())) == 2  # default: every published range, one trace per kind
    with pytest.raises(UsageError, match="needs rows with columns"):
        F.range_figure(rg.iloc[0:0])


def test_vllm_figure_tags_non_measured_sources():
    ab = pd.DataFrame({"model": ["m", "m"], "concurrency": [8, 32], "request_rate": ["inf", "inf"],
                       "metric": ["median_ttft_ms"] * 2, "label": ["TTFT median (ms)"] * 2, "a": ["off"] * 2,
                       "b": ["on"] * 2, "a_value": [10.0, 20.0], "b_value": [9.0, 19.0], "speedup": [10 / 9, 20 / 19],
                       "source": ["synthetic example"] * 2})
    titles = [a.text for a in FC.vllm_figure(ab).layout.annotations]
    assert titles == ["TTFT median [synthetic example]"]
    titles = [a.text for a in FC.vllm_figure(ab.assign(source="measured")).layout.annotations]
    assert titles == ["TTFT median"]


def test_default_titles_name_op_dtype_and_device(tmp_path):
    # issue 36: exported figures' titles lacked the op, dtype and device
    g = rows({("64x4096x4096", "aten"): 0.02, ("64x4096x4096", "triton"): 0.01,
              ("128x4096x4096", "aten"): 0.03, ("128x4096x4096", "triton"): 0.02,
              ("256x4096x4096", "aten"): 0.05, ("256x4096x4096", "triton"): 0.04}, samples=True, err_rel=1e-3)

    def head(fig):
        return fig.layout.title.text.split("<br>")[0]

    assert head(F.speedup_figure(g)) == "gemm bf16 on NVIDIA H200: speedup vs aten"
    assert head(F.speedup_overview_figure(g, ["aten"])) == "gemm bf16 on NVIDIA H200: speedup vs the faster of aten"
    assert head(F.speedup_distribution_figure(g)) == "gemm bf16 on NVIDIA H200: speedup vs aten"
    assert head(F.sweep_figure(g, x="m", y="tflops")) == "gemm bf16 on NVIDIA H200: TFLOP/s across m"
    assert head(F.error_figure(g)) == "gemm bf16 on NVIDIA H200: numerical error per case (err_rel)"
    assert head(F.roofline_figure(g)) == "gemm bf16 on H200 SXM: roofline"
    assert head(F.speedup_figure(g, title="mine")) == "mine"   # a given title is kept
    # several of each, a CPU, rows that did not run left out
    cpu = pd.concat([rows({("64x64x64", "aten"): 1.0, ("64x64x64", "inductor"): 0.5}, dtype="fp32", device="AMD EPYC",
                          platform="cpu"),
                     rows({("64x64", "aten"): 1.0, ("64x64", "inductor"): 0.5}, op="rmsnorm", dtype="fp32",
                          device="AMD EPYC", platform="cpu")])
    assert head(F.speedup_figure(cpu)) == "gemm/rmsnorm fp32 on AMD EPYC (CPU): speedup vs aten"
    assert ST.data_title(g.assign(op=["a", "b", "c", "d", "e", "f"]), "x") == "6 ops bf16 on NVIDIA H200: x"
    assert ST.data_title(g.iloc[0:0], "speedup vs aten") == "Speedup vs aten"
    # flyexplore export without --title
    from flyexplore.cli import main
    R.save(g, tmp_path / "g.parquet")
    assert main(["export", str(tmp_path / "g.parquet"), "--figure", "speedup", "--out", str(tmp_path / "g.html")]) == 0
    assert "gemm bf16 on NVIDIA H200: speedup vs aten" in (tmp_path / "g.html").read_text()
