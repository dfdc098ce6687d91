"""AOTriton: versions, head-dim rungs and the FlyDSL ("flyc") set (facts from ROCm/aotriton at
tag 0.13b and the 0.14 development files; sources in flyexplore/ops/attention/aotriton.py), and the 0.13b vs
0.14.2b A/B view on the two synthetic example files in data/examples/aotriton/ (made-up
numbers, marked as such), with its figure and report section."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

pytest.importorskip("torch")

from flyexplore.ops.attention import aotriton as A  # noqa: E402
from flyexplore.results import aotriton_ab as AB  # noqa: E402
from flyexplore.views import aotriton as AV  # noqa: E402
from flyexplore.results import compare  # noqa: E402
from flyexplore.results import table as R  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.paths import data_dir  # noqa: E402
from flyexplore.views.report import write_compare_report  # noqa: E402


def test_versions_and_release_names():
    assert A.parse_version("0.14.2") == (0, 14, 2) and A.parse_version("0.14.2b") == (0, 14, 2)
    assert A.parse_version("0.13b") == (0, 13, 0) and A.parse_version("0.13.0") == (0, 13, 0)
    assert A.parse_version("not present") is None and A.parse_version("") is None and A.parse_version(None) is None
    assert A.release_name("0.14.2") == "0.14.2b" and A.release_name("0.13.0") == "0.13b"
    assert A.release_name("not present") == "not present"
    assert (A.has_flyc("0.13.0"), A.has_flyc("0.14.0"), A.has_flyc("0.14.2b"), A.has_flyc("not present")) == \
        (False, True, True, None)


def test_head_dim_rungs_follow_aotriton_rounding():
    """The smallest compiled head dim >= d (round_value), then gfx950's fixes: forward 16 -> 32,
    backward 48 -> 64 and 80 -> 96 (attn_fwd.cc / attn_bwd.cc at 0.13b)."""
    assert [A.head_dim_rung(d) for d in (1, 16, 17, 64, 65, 100, 129, 257, 512)] == \
        [16, 16, 32, 64, 80, 128, 160, 512, 512]
    assert A.head_dim_rung(513) is None
    assert A.head_dim_rung(16, "gfx950", "fwd") == 32 and A.head_dim_rung(16, "gfx950", "bwd") == 16
    assert A.head_dim_rung(40, "gfx950", "bwd") == 64 and A.head_dim_rung(40, "gfx950", "fwd") == 48
    assert A.head_dim_rung(72, "gfx950", "bwd") == 96 and A.head_dim_rung(72, "gfx950", "fwd") == 80
    assert A.head_dim_rung(72, "gfx942", "bwd") == 80
    with pytest.raises(UsageError, match="unknown attention pass 'both'"):
        A.head_dim_rung(64, "gfx950", "both")


@pytest.mark.parametrize("d,pas,ok", [
    (128, "fwd", True), (64, "fwd", True), (96, "fwd", True), (256, "fwd", True), (512, "fwd", True),
    (100, "fwd", True),          # padded to the 128 rung
    (16, "fwd", True),           # gfx950 runs the forward's 16 on the 32 rung
    (48, "fwd", False), (40, "fwd", False), (80, "fwd", False), (72, "fwd", False),   # rungs 48 / 80: no flyc
    (48, "bwd", True), (80, "bwd", True),   # gfx950 backward moves 48 -> 64, 80 -> 96: both FlyDSL rungs
    (600, "fwd", False),
])
def test_flyc_head_dims_on_gfx950(d, pas, ok):
    got, why = A.flyc_support("gfx950", "bf16", d, pas, "0.14.2")
    assert got is ok, why
    assert ("builds a FlyDSL" in why) is ok


def test_flyc_needs_0_14_gfx950_or_gfx1201_and_fp16_or_bf16():
    assert A.flyc_support("gfx950", "bf16", 128, "fwd", "0.13.0") == \
        (False, "AOTriton 0.13b has no FlyDSL backend (flyc is new in 0.14b; 0.13b has Triton and aiter only)")
    assert A.flyc_support("gfx942", "bf16", 128, "fwd", "0.14.2")[0] is False
    assert A.flyc_support("gfx1201", "fp16", 80, "fwd", "0.14.2")[0] is True   # gfx1201 compiles 16/48/80 too
    no, why = A.flyc_support("gfx950", "fp32", 128, "fwd", "0.14.2")
    assert no is False and "fp32" in why
    assert A.flyc_support("gfx950", "bf16", 128, "fwd", "not present")[0] is None
    assert A.flyc_support(None, "bf16", 128, "fwd", "0.14.2")[0] is None


def test_aiter_as_aotriton_declares_it():
    assert A.aiter_support("gfx950", "bf16", 128, "fwd")[0] is True
    assert A.aiter_support("gfx950", "bf16", 256, "fwd")[0] is False        # fwd rungs 128 and 192 only
    assert A.aiter_support("gfx950", "bf16", 96, "bwd")[0] is True          # bwd rungs 64..192
    assert A.aiter_support("gfx950", "fp32", 128, "fwd")[0] is False
    assert A.aiter_support("gfx1201", "bf16", 128, "fwd")[0] is False


@pytest.fixture(scope="module")
def sides():
    pa, pb = AB.example_paths()
    return R.load(pa), R.load(pb)


@pytest.fixture(scope="module")
def example():
    return AB.compare_files(*AB.example_paths())


def test_example_files_are_labelled_synthetic(sides):
    for path, d in zip(AB.example_paths(), sides):
        assert "synthetic" in path.name
        R.validate(d)
        assert d[AB.SYNTHETIC_FIELD].str.startswith("SYNTHETIC EXAMPLE, not a measurement").all()
        assert d["message"].str.startswith("SYNTHETIC EXAMPLE").all()
        assert d["source"].isna().all()                 # never claims to be measured
        assert set(d["host"]) == {"synthetic-example"}
    assert set(sides[0]["aotriton"]) == {"0.13.0"} and set(sides[1]["aotriton"]) == {"0.14.2"}
    readme = (data_dir() / "examples" / "README.md").read_text()
    assert "aotriton/" in readme and "aotriton_0.14.2b_synthetic.jsonl" in readme


def test_ab_view_says_which_backend_ran_on_each_side(example, sides):
    ab, v = example
    assert ab.names == ("AOTriton 0.13b", "AOTriton 0.14.2b")
    assert list(ab.only_b["case"]) == ["1x32x4096x4096x192:causal=1"]   # listed, never dropped silently
    assert len(v) == 10 and (v["source"] == "synthetic example").all() and v["published_setup"].all()
    # synthetic rows keep no samples: no interval, hence no label (never a made-up verdict)
    assert v["label"].isna().all() and v["speedup_lo"].isna().all()
    assert set(v["aotriton_a"]) == {"0.13b"} and set(v["aotriton_b"]) == {"0.14.2b"}
    by = v.set_index("case")
    assert by.loc["1x32x4096x4096x128:causal=1", ["ran_a", "ran_b"]].tolist() == ["aiter", "FlyDSL"]
    assert by.loc["1x32x4096x4096x128", ["ran_a", "ran_b"]].tolist() == ["Triton", "FlyDSL"]
    assert by.loc["1x32x4096x4096x128:causal=1,bwd", "ran_b"] == "FlyDSL + Triton bwd_preprocess"
    # head dim 80: rung 80 has no FlyDSL forward kernel on gfx950, so Triton on both sides
    assert by.loc["1x32x4096x4096x80", "ran_b"] == "Triton" and not by.loc["1x32x4096x4096x80", "flyc_b"]
    # short sequence: a FlyDSL kernel exists, AOTriton's schedule still ran Triton
    assert by.loc["4x32x256x256x128:causal=1", "flyc_b"] and by.loc["4x32x256x256x128:causal=1", "ran_b"] == "Triton"
    a, b = (d.set_index("case") for d in sides)
    c = "1x32x4096x4096x128"
    assert by.loc[c, "speedup"] == pytest.approx(a.loc[c, "time_ms"] / b.loc[c, "time_ms"])
    assert set(v.loc[v["pass"] == "fwd", "published_range"]) == {"0.92x-2.34x"}
    assert set(v.loc[v["pass"] == "bwd", "published_range"]) == {"0.93x-2.47x"}
    lo = v["pass"].map({"fwd": 0.92, "bwd": 0.93})
    hi = v["pass"].map({"fwd": 2.34, "bwd": 2.47})
    assert (v["in_published_range"] == ((v["speedup"] >= lo) & (v["speedup"] <= hi))).all()


def test_ab_view_shows_the_verdicts_and_intervals_of_the_pairs(example, sides):
    ab, _ = example
    labels = ["SAME" if abs(r - 1) < 0.05 else ("FASTER" if r > 1 else "SLOWER") for r in ab.pairs["ratio"]]
    pairs = ab.pairs.assign(verdict=labels, ratio_lo=ab.pairs["ratio"] * 0.99, ratio_hi=ab.pairs["ratio"] * 1.01)
    v = AB.ab_view(dataclasses.replace(ab, pairs=pairs), *sides)
    assert list(v["label"]) == labels
    assert list(v["speedup_lo"]) == pytest.approx(list(v["speedup"] * 0.99))
    assert set(v.set_index("case").loc[["1x32x4096x4096x80", "4x32x256x256x128:causal=1"], "label"]) == {"SAME"}
    fig = AV.aotriton_ab_figure(v)
    bars = [tr for tr in fig.data if tr.type == "bar"]
    texts = [t for tr in bars for t in tr.text]
    assert sorted(t.split(" ", 1)[1] for t in texts) == sorted(labels)
    assert all(tr.error_y.array is not None for tr in bars)


def test_ab_view_pairs_one_backend_against_another_and_skips_other_ops(sides):
    a, b = sides
    ab = compare.pair(a, b, ("x", "y"), a_backend="flash", b_backend="flash")
    v = AB.ab_view(ab, a, b)
    assert len(v) == 10 and v["ran_b"].str.startswith("FlyDSL").sum() == 7
    gemm = R.frame([{"schema_version": 1, "run_id": "g", "op": "gemm", "case": "8x8x8", "dtype": "bf16",
                     "backend": "aten", "status": "ok", "source": "measured", "time_ms": 1.0}])
    empty = AB.ab_view(compare.pair(gemm, gemm), gemm, gemm)
    assert empty.empty and "ran_b" in empty.columns


def test_ab_figure(example):
    _, v = example
    fig = AV.aotriton_ab_figure(v)
    title = fig.layout.title.text
    assert title.startswith("SYNTHETIC EXAMPLE (made-up numbers): AOTriton A/B: AOTriton 0.14.2b vs AOTriton 0.13b")
    assert [a.text for a in fig.layout.annotations][:2] == ["forward", "backward"]
    bands = sorted((s.y0, s.y1) for s in fig.layout.shapes if s.type == "rect")
    assert bands == [(0.92, 2.34), (0.93, 2.47)]
    fly = [tr for tr in fig.data if tr.type == "bar" and tr.name.endswith("ran FlyDSL")]
    assert fly and fly[0].marker.color == "#2CA02C"
    assert sum(len(tr.y) for tr in fig.data if tr.type == "bar") == 10
    with pytest.raises(UsageError, match="non-empty"):
        AV.aotriton_ab_figure(v.iloc[:0])


def test_compare_files_bad_input(tmp_path):
    with pytest.raises(UsageError, match="result file not found"):
        AB.compare_files(tmp_path / "nope.jsonl", AB.example_paths()[1])
    g = tmp_path / "g.csv"
    R.save(R.frame([{"schema_version": 1, "run_id": "g", "op": "gemm", "case": "8x8x8", "dtype": "bf16",
                     "backend": "aten", "status": "ok", "source": "measured", "time_ms": 1.0}]), g)
    with pytest.raises(UsageError, match="no attention rows"):
        AB.compare_files(g, AB.example_paths()[1])
    with pytest.raises(UsageError, match="no attention rows for backend 'ck'"):
        AB.compare_files(*AB.example_paths(), backend="ck")


def test_compare_report_has_the_aotriton_section(tmp_path, sides):
    out = write_compare_report(*sides, tmp_path / "ab", names=("AOTriton 0.13b", "AOTriton 0.14.2b"),
                               static=False, table_formats=("csv",))
    html = out.read_text()
    assert "Attention: which AOTriton backend ran" in html and "SYNTHETIC EXAMPLE" in html
    tab = pd.read_csv(tmp_path / "ab" / "tables" / "aotriton_backends.csv")
    assert len(tab) == 10 and set(tab["ran_a"]) == {"aiter", "Triton"}
    gemm = R.frame([{"schema_version": 1, "run_id": "g", "op": "gemm", "case": "8x8x8", "dtype": "bf16",
                     "backend": "aten", "status": "ok", "source": "measured", "time_ms": 1.0}])
    html2 = write_compare_report(gemm, gemm, tmp_path / "g", static=False, table_formats=()).read_text()
    assert "AOTriton backend ran" not in html2


def test_cli_compare_on_the_example_files(cli, tmp_path):
    pa, pb = AB.example_paths()
    p = cli("compare", str(pa), str(pb), "--names", "AOTriton 0.13b,AOTriton 0.14.2b", "--out", str(tmp_path / "c"),
            "--no-images")
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "c" / "report.html").read_text()
    assert "Attention: which AOTriton backend ran" in html and "FlyDSL + Triton bwd_preprocess" in html
    ran_b = pd.read_csv(tmp_path / "c" / "tables" / "aotriton_backends.csv")["ran_b"].tolist()
    assert ran_b.count("FlyDSL") == 4 and ran_b.count("Triton") == 3


def test_flyc_table_lists_every_head_dim_and_pass():
    t = A.flyc_table("gfx950", "bf16", [16, 48, 64, 80, 128])
    assert list(t.columns) == ["head_dim", "pass", "rung", "flyc", "reason"] and len(t) == 10
    fwd = t[t["pass"] == "fwd"].set_index("head_dim")
    bwd = t[t["pass"] == "bwd"].set_index("head_dim")
    assert fwd["flyc"].to_dict() == {16: True, 48: False, 64: True, 80: False, 128: True}
    # backward: 16 stays on rung 16 (no FlyDSL), 48 -> 64 and 80 -> 96 (FlyDSL)
    assert bwd["flyc"].to_dict() == {16: False, 48: True, 64: True, 80: True, 128: True} and bwd.loc[80, "rung"] == 96
    assert not A.flyc_table(version="0.13.0")["flyc"].any()
    with pytest.raises(UsageError, match="positive"):
        A.flyc_table(head_dims=[0])


def test_published_range_only_for_two_aotriton_versions_on_gfx950(tmp_path):
    """A flash-vs-flash A/B on an H200 (sm_90, no AOTriton; data/h200/layers_smoke) once read
    ``in_published_range True`` against 0.92x-2.34x; the range is NA there, and the report
    says why in one line."""
    h200 = data_dir() / "h200" / "layers_smoke" / "attention.parquet"
    sd = compare.sides(str(h200), str(h200))
    v = AB.ab_view(sd.ab, sd.a, sd.b)
    assert len(v) == 8 and set(v["arch_a"]) == {"sm_90"} and (v["speedup"] == 1.0).all()
    assert v["published_range"].isna().all() and v["in_published_range"].isna().all()
    note = AB.range_note(v)
    assert note.startswith("published AOTriton range") and "not shown: arch sm_90 on both sides, not gfx950" in note
    assert "no AOTriton version recorded on either side" in note
    fig = AV.aotriton_ab_figure(v)   # no published band drawn for it
    assert not [s for s in fig.layout.shapes if s.type == "rect"] and "grey band" not in fig.layout.title.text
    assert AB.summary_notes(sd) == [note]   # flyexplore compare's summary says it too
    html = write_compare_report(sd.a, sd.b, tmp_path / "r", static=False, table_formats=()).read_text()
    assert "not shown: arch sm_90 on both sides, not gfx950" in html
    # the rule, case by case: both gfx950 (any gfx950 variant), both versions known and different
    assert AB.range_why_not("gfx950", "gfx950:sramecc+:xnack-", "0.13.0", "0.14.2b") is None
    assert AB.range_why_not("gfx950", "gfx950", "0.14.2", "0.14.2b") == "the same AOTriton (0.14.2b) on both sides"
    assert AB.range_why_not("gfx950", "gfx942", "0.13.0", "0.14.2") == "arch gfx950 vs gfx942, not gfx950"
    assert AB.range_why_not("gfx950", "gfx950", "0.13.0", "not present") == "no AOTriton version recorded on side B"
    assert AB.range_why_not(None, "gfx950", None, "0.14.2") == \
        "arch unknown vs gfx950, not gfx950; no AOTriton version recorded on side A"


def test_published_range_is_na_for_one_aotriton_version_on_gfx950(sides):
    a, b = sides
    same = b.assign(aotriton="0.13.0")
    v = AB.ab_view(compare.pair(a, same), a, same)
    assert len(v) == 10 and v["published_range"].isna().all() and v["in_published_range"].isna().all()
    assert AB.range_note(v).endswith("not shown: the same AOTriton (0.13b) on both sides")
    # the synthetic example itself: 0.13b vs 0.14.2b on gfx950, the range shown for every pair
    ex = AB.ab_view(compare.pair(a, b), a, b)
    assert ex["published_range"].notna().all() and AB.range_note(ex).endswith("attention pairs within it")
