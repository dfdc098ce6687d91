"""Issue 21: a model's coverage as tables -- shares that add up, a modelled time that is a
roofline of the target's peaks, a projection that is Amdahl's law with its interval and labelled
as a projection, and shapes exported in the catalogue's syntax that a sweep reads back."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

pytest.importorskip("transformers")

from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.insight import coverage as CV  # noqa: E402
from flyexplore.insight import hf as HF  # noqa: E402
from flyexplore.ops import get_op  # noqa: E402
from flyexplore.results import model as RM  # noqa: E402
from flyexplore.results import peaks as PK  # noqa: E402
from flyexplore.run.plan import shapes_file_plan  # noqa: E402
from flyexplore.run.spec import SweepSpec  # noqa: E402
from tests.cli.test_model_cli import QWEN_MOE  # noqa: E402


@pytest.fixture(scope="module")
def judged():
    envs = CV.Envs("gfx950")
    caps = HF.capture_phases(config=QWEN_MOE, phases=[("prefill", 1, 128), ("decode", 4, 256)])
    return [CV.judge_capture(c, envs) for c in caps]


def test_shares_add_up_and_say_what_they_are(judged):
    t = RM.coverage_table(judged)
    assert list(t.columns) == list(RM.COLUMNS)
    for _, g in t.groupby(["model", "step", "view"]):
        for c in ("flops_share", "bytes_share", "modelled_share"):
            assert g[c].sum() == pytest.approx(1.0)
    assert t.attrs["kind"]["flops_share"] == "captured" and t.attrs["kind"]["modelled_share"] == "modelled"
    assert t.attrs["peaks"].startswith("MI355X")
    sh = RM.shares(t, "category")
    for _, g in sh.groupby(["model", "step", "view"]):
        assert g["modelled_share"].sum() == pytest.approx(1.0) and g["modelled_share"].is_monotonic_decreasing
    with pytest.raises(UsageError, match="unknown share grouping"):
        RM.shares(t, "colour")
    s = RM.summary(t)
    comp = s[(s["step"] == "prefill 1x128") & (s["view"] == "compiled")].iloc[0]
    eager = s[(s["step"] == "prefill 1x128") & (s["view"] == "eager")].iloc[0]
    assert 0 < comp["eligible_flops_share"] < 1 and eager["eligible_flops_share"] == 0


def test_modelled_time_is_the_roofline_of_the_datasheet_peaks(judged):
    dev = PK.find_device("MI355X")
    ach = PK.achieved("MI355X", "gemm")
    assert 0.5 < ach.flops < 0.6 and "published" in ach.source   # ATen 4096^3 at 1379 of 2500 TFLOP/s
    for c, n, v in judged[1].rows:   # prefill, compiled
        t = RM.modelled_us(c)
        if c.op == "aten.mm.default":
            tf, bw = dev.peak("bf16")
            assert RM.kernel_class(c) == "gemm"
            assert t == pytest.approx(max(c.flops / (tf * 1e12 * ach.flops), c.bytes / (bw * 1e9 * ach.bandwidth)) * 1e6)
            m, k = c.arg("self").shape
            assert c.flops == 2 * m * k * c.arg("mat2").shape[1]
        if c.op == "aten._grouped_mm.default":
            a, b = c.arg("self"), c.arg("mat2")
            assert c.flops == 2 * a.shape[0] * a.shape[1] * b.shape[2]


def test_projection_is_amdahl_with_an_interval_and_labelled(judged):
    calls, summ = RM.projection(judged, "published")
    assert summ.attrs["kind"] == "projection" and "not a measurement" in summ.attrs["assumptions"]
    assert set(summ["kind"]) == {"projection"}
    for r in summ.itertuples():
        assert r.speedup_lo <= r.speedup <= r.speedup_hi
        if r.view == "eager":
            assert r.covered_share == 0 and r.speedup == pytest.approx(1.0)
    comp = summ[(summ["view"] == "compiled") & (summ["step"] == "prefill 1x128")].iloc[0]
    c = calls[(calls["view"] == "compiled") & (calls["step"] == "prefill 1x128")]
    # Amdahl: base / (sum t_i / s_i over covered + the rest)
    covered = c["modelled_total_us"].sum()
    new = (c["modelled_total_us"] / c["speedup"]).sum() + (comp["modelled_us"] - covered)
    assert comp["speedup"] == pytest.approx(comp["modelled_us"] / new)
    assert comp["covered_share"] == pytest.approx(covered / comp["modelled_us"])
    assert set(c["op"]) == {"aten.mm.default"}    # the NT expert GEMMs are not eligible: no speedup for them
    with pytest.raises(UsageError, match="unknown projection source"):
        RM.projection(judged, "vibes")
    with pytest.raises(UsageError, match="needs a result file"):
        RM.projection(judged, "results")


def test_projection_from_measured_results_takes_the_exact_case_and_its_interval(judged):
    rows = []
    for case, s in (("128x256x256", 1.5), ("128x128x256", 1.2)):
        for b, t in (("aten", 1.0), ("flydsl", 1.0 / s)):
            rows.append({"op": "gemm", "case": case, "dtype": "bf16", "backend": b, "status": "ok", "time_ms": t,
                         "source": "measured"})
    res = pd.DataFrame(rows)
    calls, summ = RM.projection(judged[:2], "results", results=res)
    q = calls[calls["module"] == "model.layers.*.self_attn.q_proj"].iloc[0]
    assert q["matched"] == "128x256x256" and q["distance"] == 0 and q["speedup"] == pytest.approx(1.5)
    assert summ["source"].iloc[0] == "measured"


def test_exported_shapes_are_catalogue_cases_a_sweep_reads_back(judged, tmp_path):
    s = RM.export_shapes(judged)
    assert list(s.columns) == list(RM.SHAPE_COLUMNS)
    for r in s.itertuples():
        get_op(r.op).case(r.shape)                       # every shape parses
    g = s[(s["op"] == "grouped_gemm") & (s["variant"].fillna("") == "")]
    # uniform routing: prefill 128 tokens x top-2 over 8 experts = 32 rows each; decode 4 x 2 = 8 -> 1
    assert set(g["shape"]) == {"8x32x256x256:layout=NT", "8x32x256x128:layout=NT", "8x1x256x256:layout=NT",
                               "8x1x256x128:layout=NT"}
    # the what-if of [G, K, N] expert weights is exported beside each, standing for it
    v = s[s["variant"] == "expert_weights_gkn"]
    assert dict(zip(v["replaces"], v["shape"])) == {x: x.split(":")[0] for x in g["shape"]}
    assert (v["status"] == "what-if").all() and list(v["count"]) == list(g["count"])
    p = tmp_path / "s.csv"
    s.to_csv(p, index=False)
    plan = shapes_file_plan(get_op("grouped_gemm"), p, None, ["aten"])
    assert len(plan.pairs) == 8 and all(d == "bf16" for _, d in plan.pairs)
    meta = plan.meta[(plan.pairs[0][0].label, "bf16")]
    assert meta["model"] == "qwen3_moe" and meta["model_count"] == 2
    assert json.loads(meta["model_uses"])[0]["phase"] == "prefill"
    plan32 = shapes_file_plan(get_op("gemm"), p, ["fp32"], None)
    assert {d for _, d in plan32.pairs} == {"fp32"}
    spec = SweepSpec("gemm", shapes_from=p, dtypes="fp32", backends="aten", device="cpu", out=tmp_path / "r.csv")
    assert spec.plan.meta and spec.to_dict()["shapes_from"] == str(p)


@pytest.mark.parametrize("content,msg", [
    (None, "does not exist"),
    ("a,b\n1,2\n", "lacks column(s) op, shape, dtype, count"),
    ("op,shape,dtype,count\nrmsnorm,64x64,fp32,1\n", "has no gemm rows (it has: rmsnorm)"),
    ("op,shape,dtype,count\ngemm,64x64x64,fp32,two\n", "line 2: count 'two' is not an integer"),
    ("op,shape,dtype,count\ngemm,64x64,fp32,1\n", "64x64"),
])
def test_a_bad_shapes_file_is_one_line(tmp_path, content, msg):
    p = tmp_path / "s.csv"
    if content is not None:
        p.write_text(content)
    with pytest.raises(UsageError, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
        SweepSpec("gemm", shapes_from=p, device="cpu", out=tmp_path / "r.csv")
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="give one of"):
        SweepSpec("gemm", shapes_from=p, shapes="8x8x8", device="cpu", out=tmp_path / "r.csv")


def test_a_header_only_shapes_file_says_it_has_no_rows(tmp_path):
    """Issue 33, 9a: a shapes file with its columns but no rows was told it "lacks column(s) op,
    shape, dtype, count"; now it is told it has them and no rows, naming the file. An empty
    file says it has no header."""
    p = tmp_path / "s.csv"
    p.write_text("op,shape,dtype,count,model\n")
    with pytest.raises(UsageError) as e:
        SweepSpec("gemm", shapes_from=p, device="cpu", out=tmp_path / "r.csv")
    assert str(e.value) == (f"shapes file {str(p)!r} has its columns (op, shape, dtype, count, model) but no "
                            "rows: no shape to measure")
    p.write_text("")
    with pytest.raises(UsageError, match=f"shapes file {str(p)!r} is empty: no header row"):
        SweepSpec("gemm", shapes_from=p, device="cpu", out=tmp_path / "r.csv")


def test_weighted_estimate_needs_model_rows():
    with pytest.raises(UsageError, match="no model_uses column"):
        RM.weighted_estimate(pd.DataFrame({"op": ["gemm"]}))


@pytest.mark.slow
def test_llama_shares_match_the_prototype():
    """Full-depth Llama-3.1-8B prefill 1x2048: the compiled view's eligible GEMMs carry ~93% of
    FLOPs (attention the rest, unverified away from the GPU); eager: none."""
    envs = CV.Envs("gfx950")
    caps = HF.capture_model(hf="llama-3.1-8b", phase="prefill", batch=1, seq=2048)
    t = RM.coverage_table([CV.judge_capture(c, envs) for c in caps])
    s = RM.summary(t).set_index("view")
    assert 0.90 < s.loc["compiled", "eligible_flops_share"] < 0.97
    assert s.loc["eager", "eligible_flops_share"] == 0
    mm = t[(t["view"] == "compiled") & (t["op"] == "aten.mm.default")]
    assert mm["count"].sum() == 32 * 7 + 1 and (mm["status"] == "eligible").all()
    assert not math.isnan(t["modelled_total_us"].sum())


def test_a_skewed_routing_gives_ragged_expert_shapes(judged):
    s = RM.export_shapes(judged, routing="zipf:1.0")
    g = s[(s["op"] == "grouped_gemm") & (s["step"] == "prefill 1x128")]
    for shape in g["shape"]:
        case = get_op("grouped_gemm").case(shape)
        ms = [int(x) for x in case["ms"].split("/")]
        assert sum(ms) == 128 * 2 and ms == sorted(ms, reverse=True) and ms[0] > ms[-1]
        assert case["m"] == ms[0]
    assert RM.split_rows(10, 4) == [3, 3, 2, 2] and sum(RM.split_rows(1000, 7, "zipf:1.3")) == 1000


def _swept(rows):
    """Result rows of a sweep of exported shapes: (case, backend, time_ms, uses)."""
    out = []
    for case, backend, t, uses in rows:
        out.append({"op": "grouped_gemm", "case": case, "dtype": "bf16", "backend": backend, "status": "ok",
                    "time_ms": t, "source": "measured", "model": "m", "model_uses": json.dumps(uses)})
    return pd.DataFrame(out)


def test_measured_weights_keep_not_eligible_calls_at_the_baseline_and_measure_the_what_if():
    nt = get_op("grouped_gemm").case("8x32x256x256:layout=NT").label
    nn = get_op("grouped_gemm").case("8x32x256x256").label
    as_is = [{"phase": "prefill", "step": "prefill 1x128", "module": "e", "count": 2, "status": "not eligible"}]
    what_if = [{"phase": "prefill", "step": "prefill 1x128", "module": "e", "count": 2, "status": "what-if",
                "variant": "expert_weights_gkn", "replaces": "8x32x256x256:layout=NT"}]
    df = _swept([(nt, "aten", 2.0, as_is), (nt, "flydsl", 1.0, as_is),
                 (nn, "aten", 1.8, what_if), (nn, "flydsl", 0.5, what_if)])
    w = RM.weighted_estimate(df, backend="flydsl")
    # the NT call does not take FlyDSL on MI350 (the coverage said so): its flydsl row is not credited
    assert len(w) == 1 and w["speedup"].iloc[0] == pytest.approx(1.0) and w["calls_kept_at_baseline"].iloc[0] == 2
    v = RM.variant_estimate(df)
    # today: aten on the NT call (2 x 2.0 ms); the what-if: flydsl on the [G, K, N] call (2 x 0.5 ms)
    assert v["as_is_ms"].iloc[0] == pytest.approx(4.0) and v["what_if_ms"].iloc[0] == pytest.approx(1.0)
    assert v["speedup"].iloc[0] == pytest.approx(4.0) and v["variant"].iloc[0] == "expert_weights_gkn"


def test_any_module_is_judged_on_a_fake_cuda_device_and_bad_targets_are_refused():
    import torch

    import flyexplore as fx

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(256, 512, bias=False)

        def forward(self, x):
            return torch.topk(self.proj(x).float(), 8)

    net = Net().to(torch.bfloat16)                     # a CPU module with real weights
    x = torch.empty(1024, 256, dtype=torch.bfloat16)
    cap = fx.capture(net, x)
    assert cap.device == "cuda:0" and all(t.device == "cuda:0" for c in cap.kernel_calls() for t in c.inputs if t)
    cov = fx.model(net, x)
    t = cov.table
    assert t.loc[(t["view"] == "compiled") & (t["op"] == "aten.mm.default"), "status"].tolist() == ["eligible"]
    assert repr(fx.model(fx.capture(net, x, view="both"))) == repr(cov)
    json.dumps(cov.to_dict(), allow_nan=False, default=str)     # strict JSON: no NaN
    with pytest.raises(UsageError, match="unknown target arch 'gfx9999'"):
        fx.capture(net, x, arch="gfx9999")
    with pytest.raises(UsageError, match="takes its inputs"):
        fx.model(net, phase="decode")
    with pytest.raises(UsageError, match="not both"):
        fx.model("llama-3.1-8b", phases=[("prefill", 1, 64)], seq=128)
