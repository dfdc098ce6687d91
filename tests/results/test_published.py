"""The published MI355X figures: loading, schema, labels, provenance, and the headline numbers
recomputed with flyexplore's own speedup/geomean helpers."""
import csv
import json

import pandas as pd
import pytest

from flyexplore.results import published as P
from flyexplore.results import table as R
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.ops import get_op
from flyexplore.paths import published_dir


@pytest.fixture(scope="module")
def pub():
    return P.load()


def _suite(df, name):
    return df[df["run_id"] == f"published:{name}"]


def test_schema_source_status_and_provenance(pub):
    R.validate(pub)
    assert set(pub["status"]) == {"published"} and set(pub["source"]) == {"published"}
    assert set(pub["device"]) == {"AMD Instinct MI355X"} and set(pub["arch"]) == {"gfx950"}
    assert pub["provenance"].str.contains("PR 19").all()
    assert pub["message"].str.contains("not measured by flyexplore").all()
    # rows per suite = cases x backends (x 2 determinism settings for topk)
    counts = pub.groupby("run_id").size().to_dict()
    assert counts == {"published:dense": 45, "published:mxfp": 68, "published:grouped": 72,
                      "published:rmsnorm": 44, "published:topk": 132}
    assert set(pub["backend"]) == {"aten", "triton", "flydsl"}


def test_case_labels_match_the_operator_modules(pub):
    gemm, rms, topk = get_op("gemm"), get_op("rmsnorm"), get_op("topk")
    d = _suite(pub, "dense")
    assert "8x4096x4096" in set(d["case"])
    assert set(d["case"]) == {c.label for c in gemm.suites["published-bf16"].cases}
    r = _suite(pub, "rmsnorm")
    assert "8192x4096" in set(r["case"])
    assert set(zip(r["case"], r["dtype"])) == {(c.label, dt) for c, dt in rms.suites["published"].pairs()}
    t = _suite(pub, "topk")
    assert {"256x1024x8", "256x1024x8:deterministic=1"} <= set(t["case"])
    assert topk.case("256x1024x8:deterministic=1").label == "256x1024x8:deterministic=1"
    assert set(t.loc[~t["deterministic"].astype(bool), "case"]) == {c.label for c in topk.suites["published"].cases}
    # params JSON is the operator's own parameter dict
    row = d[d["case"] == "8x4096x4096"].iloc[0]
    assert json.loads(row["params"]) == gemm.case("8x4096x4096").p
    # grouped GEMM: the operator's labels, the printed label kept beside them
    grouped, scaled = get_op("grouped_gemm"), get_op("scaled_gemm")
    g = _suite(pub, "grouped")
    assert set(g["case"]) == {c.label for c in grouped.suites["published"].cases}
    with open(published_dir() / "grouped_gemm_bf16.csv") as f:
        assert set(g["published_label"]) == {r["case"] for r in csv.DictReader(f)}
    row = g[g["published_label"] == "[0,1024,0,512,2048,128,0,896]"].iloc[0]
    assert row["case"] == "8x2048x4096x4096:ms=0/1024/0/512/2048/128/0/896" and row["subset"] == "ragged_m"
    assert g[g["published_label"] == "K4096 x N14336 (MoE up)"]["case"].iloc[0] == "8x512x14336x4096"
    m = _suite(pub, "mxfp")
    assert set(m["dtype"]) == {"mxfp8", "mxfp4"}
    assert set(zip(m["case"], m["dtype"])) == {(c.label, dt) for c, dt in scaled.suites["published"].pairs()}
    assert json.loads(m["params"].iloc[0]) == scaled.case(m["case"].iloc[0]).p


def test_times_are_derived_from_published_throughput_and_vice_versa(pub):
    d = _suite(pub, "dense")
    row = d[(d["case"] == "8x4096x4096") & (d["backend"] == "flydsl")].iloc[0]
    assert row["tflops"] == pytest.approx(22.9)           # the published number survives
    assert row["time_ms"] == pytest.approx(2 * 8 * 4096 * 4096 / 22.9e12 * 1e3)
    assert "time_ms derived" in row["message"]
    g = _suite(pub, "grouped")
    row = g[(g["published_label"] == "[1,3,7,15,31,63,127,255]") & (g["backend"] == "triton")].iloc[0]
    assert row["total_m"] == 502 and row["tflops"] == pytest.approx(160.0)
    assert row["time_ms"] == pytest.approx(2 * 502 * 4096 * 4096 / 160.0e12 * 1e3)
    r = _suite(pub, "rmsnorm")
    row = r[(r["case"] == "8192x4097") & (r["dtype"] == "fp16") & (r["backend"] == "aten")].iloc[0]
    assert row["time_ms"] == pytest.approx(0.0967)
    assert row["gbps"] == pytest.approx((2 * 8192 * 4097 * 2 + 4097 * 2) / 96.7e-6 / 1e9)
    t = _suite(pub, "topk")
    assert t["tflops"].isna().all()  # TopK has no FLOP count


def test_headline_numbers_recomputed_with_our_helpers(pub):
    # dense: faster of ATen/Triton per shape; ties (ratio in [0.99, 1.01]) count in the mean
    s = R.speedup(_suite(pub, "dense"), ["aten", "triton"])
    assert list(s["backend"].unique()) == ["flydsl"] and len(s) == 15
    assert R.geomean(s["speedup"]) == pytest.approx(1.1027, abs=5e-5)
    assert int(s["tie"].sum()) == 3 and int((s["speedup"] < 0.99).sum()) == 2
    assert set(s.loc[s["tie"], "case"]) == {"8x4096x4096", "4096x4096x4096", "16x28672x4096"}
    # the faster baseline is chosen per case
    assert s.set_index("case").loc["2048x4096x4096", "baseline"] == "triton"
    assert s.set_index("case").loc["8x4096x4096", "baseline"] == "aten"
    m = R.speedup(_suite(pub, "mxfp"), "aten")
    assert R.geomean(m.loc[m["dtype"] == "mxfp8", "speedup"]) == pytest.approx(1.5755, abs=5e-5)
    assert R.geomean(m.loc[m["dtype"] == "mxfp4", "speedup"]) == pytest.approx(1.6804, abs=5e-5)
    g = _suite(pub, "grouped")
    gt = R.speedup(g[g["backend"] != "aten"], "triton")
    ga = R.speedup(g[g["backend"] != "triton"], "aten")
    assert len(gt) == len(ga) == 24
    assert R.geomean(gt["speedup"]) == pytest.approx(1.2000, abs=5e-5)
    assert R.geomean(ga["speedup"]) == pytest.approx(1.9505, abs=5e-5)
    r = R.speedup(_suite(pub, "rmsnorm"), "aten")
    assert round(r["speedup"].min(), 2) == 1.17 and round(r["speedup"].max(), 2) == 3.66
    top = r.loc[r["speedup"].idxmax()]
    assert (top["dtype"], top["case"]) == ("fp16", "8192x4097")
    t = _suite(pub, "topk")
    reg = t[(t["family"] == "register") & ~t["deterministic"].astype(bool)]
    assert R.geomean(R.speedup(reg, "aten")["speedup"]) == pytest.approx(4.8157, abs=5e-5)
    reg_det = t[(t["family"] == "register") & t["deterministic"].astype(bool)]
    assert round(R.geomean(R.speedup(reg_det, "aten")["speedup"]), 2) == 4.02
    v = P.vllm_published()
    bf = v[v["precision"] == "bf16"].sort_values("speedup").iloc[-1]
    mx = v[v["precision"] == "mxfp8"].sort_values("speedup").iloc[-1]
    assert round(bf["speedup"], 2) == 1.13 and (bf["model"], bf["concurrency"]) == ("Llama-3.1-8B-Instruct", 16)
    assert round(mx["speedup"], 2) == 2.04 and (mx["model"], mx["concurrency"]) == ("Llama-3.3-70B-Instruct", 64)


def test_headlines_table_agrees_with_the_printed_values(pub):
    h = P.headlines(pub)
    for _, r in h.iterrows():
        printed = r["printed"].split(" ")[0].rstrip("x")
        digits = len(printed.split(".")[1])
        assert round(r["value"], digits) == pytest.approx(float(printed)), r["headline"]


def test_ranges_are_marked_as_ranges_only():
    rg = P.ranges()
    assert set(rg["kind"]) == {"range only"}
    aot = rg[rg["what"].str.contains("AOTriton")]
    assert set(zip(aot["low"], aot["high"])) == {(0.92, 2.34), (0.93, 2.47)}
    mx4 = rg[rg["what"].str.contains("MXFP4")]
    assert len(mx4) == 3 and (mx4["low"] < mx4["high"]).all()


def test_load_by_suite_and_bad_names():
    assert set(P.load("rmsnorm,topk")["op"]) == {"rmsnorm", "topk"}
    assert set(P.load(["dense"])["op"]) == {"gemm"}
    with pytest.raises(UsageError, match="unknown published suite 'nope'.*dense"):
        P.load("nope")
    with pytest.raises(UsageError, match="unknown published suite 'vllm'"):
        P.load("vllm")


def test_cli_published(tmp_path, capsys):
    assert main(["published"]) == 0
    out = capsys.readouterr().out
    assert "1.1027" in out and "4.8157" in out and "range" in out.lower()
    f = tmp_path / "pub.parquet"
    assert main(["published", "--suite", "dense,rmsnorm", "--out", str(f)]) == 0
    back = R.load(f)
    assert len(back) == 45 + 44 and set(back["source"]) == {"published"}
    assert "provenance" in back.columns
    v = tmp_path / "vllm.csv"
    assert main(["published", "--suite", "vllm", "--out", str(v)]) == 0
    assert len(pd.read_csv(v)) == 36
    assert main(["published", "--suite", "vllm,dense"]) == 2
    assert main(["published", "--suite", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown published suite 'bogus'" in err
