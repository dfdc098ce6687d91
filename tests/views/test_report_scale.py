"""Reports of many rows: the paged results table (first page as HTML, every row embedded
gzip+base64, the cap), table files bounded (CSV only past a row limit), the distribution figure
that replaces per-case bars past a case count, WebGL past a point count, and the vectorized
table text agreeing with the rules it replaced."""
import base64
import gzip
import json
import math
import re

import numpy as np
import pandas as pd
import pytest

import flyexplore as fx
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.results.compare import pair
from flyexplore.views import export as X
from flyexplore.views import plot_style as ST
from flyexplore.views import plots as F
from flyexplore.views import plots_compare as FC
from flyexplore.views import tables as T
from flyexplore.views.report import summary_table, write_compare_report, write_report

WHY = "flydsl is not installed: FlyDSL needs a ROCm build of torch"


def many(ncases: int, ops=("gemm",), dtypes=("bf16",), backends=("aten", "triton"), run="r1", seed=0,
         unavailable: bool = False) -> pd.DataFrame:
    """Result rows of ``ncases`` cases per (op, dtype): the first backend is the baseline;
    the others carry the speedup, its 95% interval and label their sweep stored (as a sweep
    writes them). Times spread over six decades, so text order and number order differ."""
    rng = np.random.default_rng(seed)
    out = []
    for op in ops:
        for dtype in dtypes:
            for i in range(ncases):
                m = 16 * (i + 1)
                case = f"{m}x256x512"
                p = {"m": m, "n": 256, "k": 512}
                t0 = float(10 ** rng.uniform(-5, 1))   # 0.01 µs to 10 ms: "0.01235" and "0.1235" both
                for j, be in enumerate(backends):
                    t = t0 if j == 0 else t0 / float(rng.uniform(0.5, 2.0))
                    r = {"run_id": run, "op": op, "case": case, "params": json.dumps(p), "dtype": dtype,
                         "backend": be, "status": "ok", "source": "measured", "time_ms": t,
                         "time_ci_lo_ms": t * 0.99, "time_ci_hi_ms": t * 1.01, "device": "NVIDIA H200",
                         "platform": "cuda", "order": "interleaved", "flops": 2.0 * m * 256 * 512,
                         "bytes": 2.0 * (m * 512 + 256 * 512 + m * 256), **p}
                    r["tflops"] = r["flops"] / (t / 1e3) / 1e12
                    if j:
                        sp = t0 / t
                        lo, hi = sp * float(rng.uniform(0.97, 0.999)), sp * float(rng.uniform(1.001, 1.03))
                        r.update(baseline=backends[0], speedup=sp, speedup_lo=lo, speedup_hi=hi,
                                 verdict=S.verdict(lo, hi))
                    out.append(r)
                if unavailable:
                    out.append({"run_id": run, "op": op, "case": case, "params": json.dumps(p), "dtype": dtype,
                                "backend": "flydsl", "status": "unavailable", "source": "measured",
                                "message": WHY, "device": "NVIDIA H200", "platform": "cuda", **p})
    return R.frame(out)


def payloads(html: str) -> dict[str, list[list[str]]]:
    """The rows each paged table embeds, by table id: base64, then gzip, then JSON."""
    out = {}
    for m in re.finditer(r"<div class='fx-paged' id='([^']+)'.*?<script type='application/octet-stream' "
                         r"class='fx-rows' data-encoding='gzip\+base64'>([^<]*)</script>", html, re.S):
        out[m.group(1)] = json.loads(gzip.decompress(base64.b64decode(m.group(2))).decode("utf-8"))
    return out


def first_page(html: str, table_id: str) -> list[list[str]]:
    """The body rows of a paged table's server-side first page, as cell texts."""
    box = html[html.index(f"id='{table_id}'"):]
    body = box[box.index("<tbody>") + 7:box.index("</tbody>")]
    import html as H

    return [[H.unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


# -- table text -------------------------------------------------------------------------------
def _fmt_reference(v) -> str:
    """fmt_num's rule as it was written value by value."""
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 1e-3:
        return f"{v:.{3 - math.floor(math.log10(a))}f}"
    return f"{v:.3g}"


def test_fmt_nums_is_fmt_num_for_every_value():
    rng = np.random.default_rng(3)
    v = np.concatenate([10 ** rng.uniform(-12, 9, 5000) * rng.choice([-1, 1], 5000),
                        [0.0, -0.0, 1e-3, 999.96, 1000.0, 0.00099999, 12.345, 31980.4, np.inf, -np.inf]])
    got = T.fmt_nums(v)
    assert list(got) == [_fmt_reference(x) for x in v]
    assert list(got) == [T.fmt_num(float(x)) for x in v]
    assert list(T.fmt_nums([np.nan, 1.0])) == ["", "1.000"]


def test_cell_text_by_column_kind():
    df = pd.DataFrame({"f": [1.5, np.nan, 31980.4], "i": [1, 2, 3], "b": [True, False, True],
                       "s": ["a", None, "c"], "o": [1.5, "x", None],
                       "F": pd.array([0.0123456, None, 2.0], dtype="Float64"),
                       "B": pd.array([True, None, False], dtype="boolean")})
    t = T.text_frame(df)
    assert t.to_dict("list") == {"f": ["1.500", "", "31980"], "i": ["1", "2", "3"], "b": ["True", "False", "True"],
                                 "s": ["a", "", "c"], "o": ["1.500", "x", ""], "F": ["0.01235", "", "2.000"],
                                 "B": ["True", "", "False"]}
    assert list(T.cell_text(df["f"], "{:.1f}")) == ["1.5", "", "31980.4"]


def test_summary_table_text_is_the_row_by_row_rule():
    df = many(30, unavailable=True)
    df.loc[4, "speedup_lo"] = np.nan            # an interval lost: "[no interval]"
    df.loc[5, ["time_ci_lo_ms", "time_ci_hi_ms"]] = np.nan
    t = summary_table(df)
    for i, r in df.iterrows():  # the rule as it was written, one row at a time
        sp = "" if pd.isna(r["speedup"]) else (
            S.fmt_interval(r["speedup"], float(r["speedup_lo"]) if pd.notna(r["speedup_lo"]) else math.nan,
                           float(r["speedup_hi"]) if pd.notna(r["speedup_hi"]) else math.nan) + f" vs {r['baseline']}")
        ci = ("" if pd.isna(r["time_ci_lo_ms"]) or pd.isna(r["time_ci_hi_ms"])
              else f"[{T.fmt_num(r['time_ci_lo_ms'] * 1e3)}, {T.fmt_num(r['time_ci_hi_ms'] * 1e3)}]")
        assert t.loc[i, "speedup"] == sp and t.loc[i, "time_ci_us"] == ci
    assert "x [no interval] vs aten" in t.loc[4, "speedup"]
    d, caption, notes = T.scan_table(t)
    assert notes == [f"[1] {WHY}"] and set(d["note"]) == {"", "[1]"}
    assert "device: NVIDIA H200" in caption and "source: measured" in caption


# -- the paged table ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_report(tmp_path_factory):
    df = many(90, dtypes=("bf16", "fp32"), unavailable=True)   # 90 cases x 2 dtypes x 3 rows: 540 rows
    out = tmp_path_factory.mktemp("rep") / "r"
    path = write_report(df, out, static=False)
    return df, out, path.read_text(encoding="utf-8")


@pytest.mark.slow   # a report of 540 rows: ~2 s here
def test_results_table_is_paged_with_every_row_embedded(big_report):
    df, out, html = big_report
    expected, caption, notes = T.scan_table(summary_table(R.normalize(df)))
    rows = payloads(html)["tbl-results"]
    assert rows == expected.to_numpy().tolist()                        # exactly the scan table's rows
    assert first_page(html, "tbl-results") == rows[:T.PAGE_ROWS]        # page 1 as a real HTML table
    box = html[html.index("id='tbl-results'"):]
    head = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", box[:box.index("</thead>")])
    assert head == list(expected.columns)
    assert f"Rows 1–100 of {len(df)} are shown here" in box and "every row is in tables/results.csv" in box
    assert "only the first" not in box                                # no cap at 540 rows
    assert f"<li value='1'>{WHY}</li>" in html and "All rows: device: NVIDIA H200" in html  # notes and caption kept
    assert html.count("<script>\n(function () {") == 1                   # the pager script, once
    assert len(pd.read_csv(out / "tables" / "results.csv")) == len(df)


def test_embedded_rows_are_capped_and_the_page_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "MAX_EMBEDDED_ROWS", 150)
    df = many(100)   # 200 rows
    html = write_report(df, tmp_path / "r", static=False).read_text(encoding="utf-8")
    rows = payloads(html)["tbl-results"]
    assert len(rows) == 150
    assert "This table has 200 rows; only the first 150 are in this page" in html
    assert "every row is in tables/results.csv" in html
    assert len(pd.read_csv(tmp_path / "r" / "tables" / "results.csv")) == 200
    d = T.text_frame(pd.DataFrame({"a": range(7)}))
    h = T.paged_table(d, "t", page_rows=2, max_rows=5)
    assert "This table has 7 rows; only the first 5 are in this page" in h and "the others are not in this report" in h
    assert len(first_page(h, "t")) == 2
    with pytest.raises(ValueError, match="page_rows and max_rows must be >= 1"):
        T.paged_table(d, "t", max_rows=0)


def test_small_tables_are_plain_html_and_marks_survive_paging():
    d = T.text_frame(pd.DataFrame({"a": range(250)}))
    h = T.paged_table(d, "m", marked=[0, 150, 400])
    box = h[h.index("data-marked="):]
    assert box.startswith("data-marked='[0, 150]'")       # rows past the embedded ones dropped
    assert first_page(h, "m")[0] == ["0"] and "<tr class='diff'><td>0</td>" in h
    s = T.static_table(T.text_frame(pd.DataFrame({"a": [1.5, None], "b": ["x<y", None]})), {1})
    assert "<td>x&lt;y</td>" in s and "<tr class='diff'><td></td><td></td></tr>" in s and "None" not in s


@pytest.mark.slow   # pairing 120 cases: ~3 s here
def test_compare_pairs_table_is_paged(tmp_path):
    a = many(120)
    b = a.assign(time_ms=a["time_ms"] * 1.1, run_id="r2")
    path = write_compare_report(a, b, tmp_path / "c", ("old", "new"), static=False)
    html = path.read_text(encoding="utf-8")
    ab = pair(R.normalize(a), R.normalize(b), ("old", "new"))
    rows = payloads(html)["tbl-pairs"]
    assert rows == T.text_frame(ab.pairs).to_numpy().tolist()
    assert "every row is in tables/pairs.csv" in html
    assert len(pd.read_csv(tmp_path / "c" / "tables" / "pairs.csv")) == len(ab.pairs) == 240  # 120 cases x 2 backends
    assert '"type":"scattergl"' in html    # the A/B figure past BAR_MAX_CASES: a rank curve


# -- table files --------------------------------------------------------------------------------
def test_table_files_past_the_row_limit_are_csv_only(tmp_path):
    big = pd.DataFrame({"a": range(X.TEXT_TABLE_MAX_ROWS + 1)})
    small = pd.DataFrame({"a": range(3)})
    paths = X.save_tables({"big": big, "small": small}, tmp_path, ["csv", "md", "tex"])
    assert sorted(p.name for p in paths) == ["big.csv", "small.csv", "small.md", "small.tex"]
    assert len(pd.read_csv(tmp_path / "big.csv")) == X.TEXT_TABLE_MAX_ROWS + 1
    only_md = X.save_tables({"big": big}, tmp_path / "m", ["md"])
    assert [p.name for p in only_md] == ["big.csv"]   # never dropped: CSV instead
    assert len(X.save_tables({"big": big}, tmp_path / "n", ["md"], text_max_rows=None)) == 1
    with pytest.raises(UsageError, match="unknown table format 'xlsx'"):
        X.save_tables({"big": big}, tmp_path, ["xlsx"])


def test_report_of_many_rows_writes_results_as_csv_only(tmp_path, monkeypatch):
    monkeypatch.setattr(X, "TEXT_TABLE_MAX_ROWS", 100)
    df = many(60)   # 120 rows
    html = write_report(df, tmp_path / "r", static=False, table_formats=("csv", "md", "tex")).read_text()
    names = {p.name for p in (tmp_path / "r" / "tables").iterdir()}
    assert "results.csv" in names and "results.md" not in names and "results.tex" not in names
    assert "environments.md" in names
    assert "Tables over 100 rows are written as CSV only" in html and "results (120 rows)" in html


# -- figures ------------------------------------------------------------------------------------
def test_speedup_distribution_figure():
    df = many(50, ops=("gemm", "rmsnorm"), dtypes=("bf16", "fp32"), backends=("aten", "triton", "flydsl"))
    before = df.copy()
    fig = F.speedup_distribution_figure(df, "aten")
    pd.testing.assert_frame_equal(df, before)   # drawing never changes the data
    pts = [t for t in fig.data if t.type == "scattergl" and t.mode == "markers"]
    assert pts and all(t.type == "scattergl" for t in fig.data if t.mode == "markers" and t.x is not None
                       and len(t.x) > 0 and t.x[0] is not None)
    assert all(t.error_y.array is not None for t in pts)     # whiskers: 95% intervals
    # one panel per (op, dtype): four x axes carry the curves, titled by facet
    assert len({t.xaxis for t in pts}) == 4
    titles = [a.text for a in fig.layout.annotations]
    assert {f"{op} {dt}: 50 cases x 2 backends" for op in ("gemm", "rmsnorm") for dt in ("bf16", "fp32")} <= set(titles)
    # every case is in the hover of every backend, sorted ascending within a backend's curve
    sp = R.speedup(df, "aten")
    cases = {str(t).split(" · ")[0] for tr in pts for t in tr.text}
    assert cases == set(df["case"])
    curve = sorted((x, y) for tr in pts if tr.xaxis == "x" and tr.legendgroup == "triton" for x, y in zip(tr.x, tr.y))
    assert [y for _, y in curve] == sorted(y for _, y in curve)
    g = sp[(sp["op"] == "gemm") & (sp["dtype"] == "bf16") & (sp["backend"] == "triton")]
    assert sorted(y for _, y in curve) == pytest.approx(sorted(g["speedup"]))
    # geometric means: those of geomean_speedup, in the legend with the label counts
    gm = R.geomean_speedup(df, "aten").set_index(["op", "dtype", "backend"])
    lines = [t for t in fig.data if t.meta and "geomean" in t.meta]
    assert len(lines) == len(gm) == 8
    for t in lines:
        row = gm.loc[(t.meta["op"], t.meta["dtype"], t.meta["backend"])]
        assert t.meta["geomean"] == row["geomean"] and t.meta["geomean_lo"] == row["geomean_lo"]
        assert t.meta["geomean_hi"] == row["geomean_hi"] and list(t.y) == [row["geomean"]] * 2
        assert f"geomean {row['geomean']:.3f}x [{row['geomean_lo']:.3f}, {row['geomean_hi']:.3f}]" in t.name
        for k in S.LABELS:
            assert (f"{int(row[k])} {k}" in t.name) == bool(row[k])
    assert any(t.name == "1.0x (baseline)" for t in fig.data)
    assert fx.figure("distribution", df, backends=["flydsl"]).data  # reachable as fx.figure
    with pytest.raises(UsageError, match="no case has both"):
        F.speedup_distribution_figure(df, "aten", backends=["nope"])


def test_report_draws_bars_up_to_the_case_limit_and_the_distribution_past_it(tmp_path):
    few = write_report(many(ST.BAR_MAX_CASES), tmp_path / "few", static=False).read_text()
    lots = write_report(many(ST.BAR_MAX_CASES + 1), tmp_path / "lots", static=False).read_text()
    fig_few = few[few.index('id="fig-00_gemm_speedup"'):]
    fig_lots = lots[lots.index('id="fig-00_gemm_speedup"'):]
    assert '"type":"bar"' in fig_few[:fig_few.index("</script>")]
    assert '"type":"scattergl"' in fig_lots[:fig_lots.index("</script>")]
    assert f"{ST.BAR_MAX_CASES + 1} cases" in lots


def test_ab_figure_past_the_case_limit_is_a_rank_curve():
    a = many(ST.BAR_MAX_CASES + 20)
    b = a.assign(time_ms=a["time_ms"] * 0.9, run_id="r2")
    ab = pair(R.normalize(a), R.normalize(b), ("old", "new"))
    fig = FC.ab_figure(ab)
    assert not [t for t in fig.data if t.type == "bar"]
    gl = [t for t in fig.data if t.type == "scattergl" and t.mode == "markers"]
    assert {str(t).split(" · ")[0] for tr in gl for t in tr.text} == set(ab.pairs["case"])  # the case in the hover
    assert sorted(y for tr in gl for y in tr.y) == pytest.approx(sorted(ab.pairs["ratio"]))
    assert all(t.boxpoints is False for t in fig.data if t.type == "box")


def test_scatter_figures_switch_to_webgl_past_the_point_limit(monkeypatch):
    from flyexplore.results import published as P

    pub = P.load("dense")
    assert {t.type for t in F.roofline_figure(pub).data if t.legendgroup == "backends"} == {"scatter"}
    monkeypatch.setattr(ST, "WEBGL_POINTS", 5)
    fig = F.roofline_figure(pub)
    assert {t.type for t in fig.data if t.legendgroup == "backends"} == {"scattergl"}
    df = many(12)
    assert {t.type for t in F.sweep_figure(df, x="m", y="tflops").data} == {"scattergl"}
    monkeypatch.setattr(ST, "WEBGL_POINTS", 10_000)
    assert {t.type for t in F.sweep_figure(df, x="m", y="tflops").data} == {"scatter"}


def test_rank_curve_of_many_points_shades_the_intervals():
    df = many(ST.BAND_POINTS + 1)
    fig = F.speedup_distribution_figure(df, "aten")
    band = [t for t in fig.data if t.type == "scattergl" and t.fill == "toself"]
    pts = [t for t in fig.data if t.type == "scattergl" and t.mode == "markers"]
    assert len(band) == 1 and all(t.error_y.array is None for t in pts)
    sp = R.speedup(df, "aten")
    n = len(sp)
    order = np.argsort(sp["speedup"].to_numpy(), kind="stable")
    assert list(band[0].y[:n]) == pytest.approx(list(sp["speedup_lo"].to_numpy()[order]))      # lower ends
    assert list(band[0].y[n:]) == pytest.approx(list(sp["speedup_hi"].to_numpy()[order][::-1]))  # upper ends back


def test_a_rank_curve_of_more_cases_than_its_limit_is_drawn_through_that_many(monkeypatch):
    """Bounded figures: past CURVE_MAX_POINTS cases a curve is drawn through that many, evenly
    spaced by rank with the first and the last case, at their exact ranks and values; the
    geometric mean and the case count still come from every case."""
    monkeypatch.setattr(ST, "CURVE_MAX_POINTS", 50)
    monkeypatch.setattr(F, "CURVE_MAX_POINTS", 50)
    df = many(400)
    fig = F.speedup_distribution_figure(df, "aten")
    pts = [t for t in fig.data if t.type == "scattergl" and t.mode == "markers"]
    drawn = sorted((x, y) for t in pts for x, y in zip(t.x, t.y))
    assert len(drawn) == 50
    sp = R.speedup(df, "aten")
    ys = np.sort(sp["speedup"].to_numpy())
    xs = ST.rank_positions(400)
    assert drawn[0] == (pytest.approx(xs[0]), pytest.approx(ys[0]))
    assert drawn[-1] == (pytest.approx(xs[-1]), pytest.approx(ys[-1]))
    for x, y in drawn:   # every point drawn is a case at its own rank
        k = int(round(x / 100 * 400 - 0.5))
        assert y == pytest.approx(ys[k])
    line = next(t for t in fig.data if t.meta and "geomean" in t.meta)
    gm = R.geomean_speedup(df, "aten").iloc[0]
    assert line.meta["cases"] == 400 and line.meta["geomean"] == gm["geomean"]
    assert "400 cases (curves through 50, evenly by rank)" in [a.text for a in fig.layout.annotations][0]
    small = F.speedup_distribution_figure(many(40), "aten")
    assert "evenly" not in small.layout.annotations[0].text


def test_an_image_kaleido_could_not_render_is_not_called_written(tmp_path):
    """kaleido "writes" 3 bytes and no error for a figure too tall for the browser (a bar per
    case of thousands of cases): such a file is no image, so the export says why and writes
    HTML instead of reporting a PNG."""
    for fmt, good in (("png", b"\x89PNG\r\n\x1a\n" + b"\0" * 20), ("pdf", b"%PDF-1.4\n"),
                      ("svg", b'<svg xmlns="http://www.w3.org/2000/svg"></svg>')):
        p = tmp_path / f"ok.{fmt}"
        p.write_bytes(good)
        bad = tmp_path / f"bad.{fmt}"
        bad.write_bytes(b"\x00\x00\x00")
        assert X._is_image(p, fmt) and not X._is_image(bad, fmt)


@pytest.mark.slow
def test_a_figure_too_tall_to_render_falls_back_to_html_with_the_reason(tmp_path):
    if X.static_export_problem():
        pytest.skip(f"no static export here: {X.static_export_problem()}")
    fig = F.speedup_figure(many(3000), "aten")   # one bar per case: about 54,000 px tall
    path, note = X.export_figure(fig, tmp_path / "bars.png")
    assert path.suffix == ".html" and not (tmp_path / "bars.png").exists()
    assert "no valid PNG" in note and "too large" in note


def test_export_of_a_speedup_figure_past_the_case_limit_draws_the_distribution(tmp_path):
    from flyexplore.cli import main

    f = tmp_path / "many.parquet"
    R.save(many(ST.BAR_MAX_CASES + 1), f)
    out = tmp_path / "fig.html"
    assert main(["export", str(f), "--figure", "speedup", "--out", str(out)]) == 0
    page = out.read_text()
    assert '"type":"scattergl"' in page and f"{ST.BAR_MAX_CASES + 1} cases" in page
    few = tmp_path / "few.parquet"
    R.save(many(ST.BAR_MAX_CASES), few)
    assert main(["export", str(few), "--figure", "speedup", "--out", str(tmp_path / "bars.html")]) == 0
    assert '"type":"bar"' in (tmp_path / "bars.html").read_text()
    assert main(["export", str(few), "--figure", "distribution", "--out", str(tmp_path / "d.html")]) == 0
    assert '"type":"scattergl"' in (tmp_path / "d.html").read_text()
