"""Grouped GEMM: cases, published suite, inputs, reference, counts, backends and their reasons."""
import csv
from types import SimpleNamespace

import pytest
import torch

from flyexplore.world.env import Check, Readiness, collect
from flyexplore.errors import UsageError
from flyexplore.ops import get_op
from flyexplore.ops.base import RunContext
from flyexplore.ops.grouped_gemm.operator import group_sizes, offsets, published_case_label
from flyexplore.paths import published_dir

OP = get_op("grouped_gemm")
CPU = torch.device("cpu")


def _ctx(platform="cpu", ready=False, device=CPU):
    env = SimpleNamespace(platform=platform, flydsl_compile=Readiness(
        "compile templates", (Check("target arch gfx950", ready, "gfx950" if ready else "none"),)))
    return RunContext(device, env)


def test_labels_and_ragged_validation():
    assert OP.case("8x512x4096x4096").label == "8x512x4096x4096"
    c = OP.case("4x96x128x256:ms=0/96/32/64")
    assert c.label == "4x96x128x256:ms=0/96/32/64" and group_sizes(c) == [0, 96, 32, 64]
    assert OP.case("4x64x128x128:ms=64/64/64/64").label == "4x64x128x128"   # uniform: canonical
    assert OP.make_case(g=2, m=5, n=32, k=32, ms=[5, 0]).label == "2x5x32x32:ms=5/0"
    assert OP.case("8x32x256x128:NT")["layout"] == "NT"
    for bad, msg in (("4x64x128x128:ms=1/2", "lists 2 groups"),
                     ("4x64x128x128:ms=1/2/3/4", "largest group"),
                     ("4x64x128x128:ms=a/b/c/d", "row counts"),
                     ("4x64x128x128:ms=-1/64/0/0", "negative"),
                     ("4x64x128x128:TN", "TN")):
        with pytest.raises(UsageError, match=msg):
            OP.case(bad)


def test_published_suite_maps_every_row():
    with open(published_dir() / "grouped_gemm_bf16.csv") as f:
        rows = list(csv.DictReader(f))
    s = OP.get_suite("published")
    assert len(rows) == 24 and len(s.cases) == 24 and s.dtypes == ("bf16",)
    labels = [published_case_label(r["suite"], r["case"]) for r in rows]
    assert labels == [c.label for c in s.cases]
    assert published_case_label("kn_variants", "K14336 x N4096 (MoE down)") == "8x512x4096x14336"
    assert published_case_label("ragged_m", "[1,3,7,15,31,63,127,255]") == \
        "8x255x4096x4096:ms=1/3/7/15/31/63/127/255"
    with pytest.raises(UsageError):
        published_case_label("other", "x")
    c = OP.case(labels[2])                              # g8x512x4096x4096
    assert OP.flops(c) == 2.0 * 8 * 512 * 4096 * 4096
    # ragged with empty groups: FLOPs from the rows present, B bytes only for used groups
    c = OP.case(published_case_label("ragged_m", "[0,1024,0,512,2048,128,0,896]"))
    assert OP.flops(c) == 2.0 * 4608 * 4096 * 4096
    assert OP.bytes(c, "bf16") == (4608 * 4096 + 5 * 4096 * 4096 + 4608 * 4096) * 2 + 32


def test_moe_suites_come_from_model_configs():
    mix = OP.get_suite("mixtral-8x7b")
    assert {(c["g"], c["n"], c["k"]) for c in mix.cases} == {(8, 28672, 4096), (8, 4096, 14336)}
    assert any(c["ms"] for c in mix.cases) and all(sum(group_sizes(c)) in (1024, 8192) for c in mix.cases)
    qwen = OP.get_suite("qwen3-30b-a3b")
    assert {(c["g"], c["n"], c["k"]) for c in qwen.cases} == {(128, 1536, 2048), (128, 2048, 768)}


def test_inputs_offsets_and_layouts():
    c = OP.case("4x96x128x256:ms=0/96/32/64")
    inp = OP.make_inputs(c, "fp32", CPU, 0)
    assert inp["offs"].dtype == torch.int32
    assert inp["offs"].tolist() == offsets([0, 96, 32, 64]) == [0, 96, 128, 192]
    assert inp["a"].shape == (192, 256) and inp["b"].shape == (4, 256, 128)
    assert inp["b"].stride(-1) == 1                                 # NN: row-major [G, K, N]
    nt = OP.make_inputs(OP.case("8x32x256x128:NT"), "fp32", CPU, 0)["b"]
    assert nt.shape == (8, 128, 256) and nt.stride(-2) == 1         # NT: column-major per group
    again = OP.make_inputs(c, "fp32", CPU, 0)
    assert torch.equal(inp["a"], again["a"]) and torch.equal(inp["b"], again["b"])   # seeded


@pytest.mark.parametrize("shape", ["4x96x128x256:ms=0/96/32/64", "8x32x256x128:NT"])
def test_reference_against_torch_grouped_mm(shape):
    c = OP.case(shape)
    inp = OP.make_inputs(c, "fp32", CPU, 3)
    ref = OP.reference(c, "fp32", inp)
    # independent: each group's rows times its B, in float64
    rows = torch.repeat_interleave(torch.arange(c["g"]), torch.tensor(group_sizes(c)))
    want = torch.einsum("mk,mkn->mn", inp["a"].double(), inp["b"].double()[rows])
    assert torch.allclose(ref, want, rtol=1e-12, atol=1e-10)
    ctx = _ctx()
    for name in ("aten", "reference"):
        out = OP.get_backend(name).build(c, "fp32", inp, ctx)()
        err = OP.error(out, ref, c, "fp32")
        assert out.shape == ref.shape and err["err_rel"] < 1e-5


def test_backend_reasons():
    c = OP.case("4x64x128x128")
    assert OP.get_backend("aten").available(_ctx(), c, "bf16") is None
    assert "GPU" in OP.get_backend("triton").available(_ctx(), c, "bf16")
    why = OP.get_backend("flydsl").available(_ctx(), c, "fp32")
    assert "fp16/bf16 only, not fp32" in why
    # a FlyDSL-ready environment: only the case's own rules remain
    ready = _ctx("rocm", ready=True)
    assert OP.get_backend("flydsl").available(ready, c, "bf16") is None
    assert "N % 32" in OP.get_backend("flydsl").available(ready, OP.case("4x64x100x128"), "bf16")
    assert "layout NN" in OP.get_backend("flydsl").available(ready, OP.case("4x64x128x128:NT"), "bf16")
    # the real environment of this machine says why FlyDSL compile templates are not ready
    real = RunContext(CPU, collect())
    assert "not ROCm" in OP.get_backend("flydsl").available(real, c, "bf16")


def test_unaligned_strides_are_unavailable_as_torch_says():
    c = OP.case("3x2x5x8")                                       # N=5 fp32: 20-byte rows
    why = OP.get_backend("aten").available(_ctx(), c, "fp32")
    assert "N=5" in why and "K=" not in why
    inp = OP.make_inputs(c, "fp32", CPU, 0)
    with pytest.raises(RuntimeError, match="strides should be multiple of 16 bytes"):
        OP.get_backend("aten").build(c, "fp32", inp, _ctx())()    # torch's own check agrees
    assert OP.get_backend("reference").available(_ctx(), c, "fp32") is None
    assert OP.get_backend("aten").available(_ctx(), OP.case("3x2x8x8"), "bf16") is None


def test_triton_needs_sm90_on_nvidia(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    why = OP.get_backend("triton").available(_ctx("cuda", device=torch.device("cuda:0")),
                                             OP.case("4x64x128x128"), "bf16")
    assert "sm_90+" in why and "sm_80" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert OP.get_backend("triton").available(_ctx("cuda", device=torch.device("cuda:0")),
                                              OP.case("4x64x128x128"), "bf16") is None
