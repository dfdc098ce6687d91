import pytest
import torch

from flyexplore.errors import UsageError
from flyexplore.ops import get_op, list_ops


def test_catalogue_lists_core_operators():
    assert {"gemm", "rmsnorm", "topk"} <= set(list_ops())
    with pytest.raises(UsageError, match=r"unknown operator 'conv'.*gemm"):
        get_op("conv")


@pytest.mark.parametrize("text,label,params", [
    ("8x4096x4096", "8x4096x4096", {"m": 8, "n": 4096, "k": 4096, "layout": "NT"}),
    ("8x4096x4096:nn", "8x4096x4096:NN", {"layout": "NN"}),
    (" 16x32x64:TT ", "16x32x64:TT", {"layout": "TT"}),
])
def test_gemm_case_parsing(text, label, params):
    c = get_op("gemm").case(text)
    assert c.label == label
    assert params.items() <= c.p.items()


@pytest.mark.parametrize("text,msg", [
    ("8x4096", "malformed gemm shape '8x4096'"),
    ("8x0x4096", "non-positive gemm n=0"),
    ("axbxc", "malformed"),
    ("8x8x8:XY", "unknown gemm option 'XY'"),
    ("-8x8x8", "malformed"),
])
def test_gemm_bad_shapes(text, msg):
    with pytest.raises(UsageError, match=msg):
        get_op("gemm").case(text)


def test_rmsnorm_and_topk_options():
    r = get_op("rmsnorm").case("2048x16384:eps=1e-5,weight=0")
    assert r["eps"] == 1e-5 and r["weight"] is False and r.label == "2048x16384:eps=1e-05,weight=0"
    with pytest.raises(UsageError, match="eps must be None or a finite number >= 0"):
        get_op("rmsnorm").case("8x8:eps=-1")
    with pytest.raises(UsageError, match="bad value 'x'"):
        get_op("rmsnorm").case("8x8:eps=x")
    with pytest.raises(UsageError, match="larger than the row width"):
        get_op("topk").case("4x8x16")


@pytest.mark.parametrize("text,label", [
    # `flyexplore explain --help` shows causal=1,bwd: the choice word alone, or as a flag
    ("1x32x4096x4096x128:causal=1,bwd", "1x32x4096x4096x128:causal=1,bwd"),
    ("1x32x4096x4096x128:causal=1,bwd=1", "1x32x4096x4096x128:causal=1,bwd"),
    ("1x32x4096x4096x128:causal=1,bwd=true", "1x32x4096x4096x128:causal=1,bwd"),
    ("1x32x4096x4096x128:causal=1,bwd=0", "1x32x4096x4096x128:causal=1"),
    ("1x32x4096x4096x128:fwd=0", "1x32x4096x4096x128:bwd"),
    ("1x32x4096x4096x128:pass=bwd", "1x32x4096x4096x128:bwd"),
    # a boolean key alone is that key set
    ("1x32x4096x4096x128:causal,bwd", "1x32x4096x4096x128:causal=1,bwd"),
    ("1x32x4096x4096x128:causal=off", "1x32x4096x4096x128"),
])
def test_attention_flags_by_word_or_value(text, label):
    assert get_op("attention").case(text).label == label


def test_other_boolean_keys_and_choice_flags():
    assert get_op("topk").case("8x64x2:deterministic").label == "8x64x2:deterministic=1"
    assert get_op("topk").case("8x64x2:largest=no").label == "8x64x2:largest=0"
    assert get_op("rmsnorm").case("8x8:weight=off").label == "8x8:weight=0"
    assert get_op("gemm").case("8x8x8:NN=1").label == "8x8x8:NN"


@pytest.mark.parametrize("op,text,msg", [
    ("attention", "1x4x8x8x64:bwd=2", r"^bad value '2' for attention option bwd \(expected 1/0/true/false"),
    ("attention", "1x4x8x8x64:causal=maybe", r"^bad value 'maybe' for attention option causal"),
    ("attention", "1x4x8x8x64:bwdd", r"^unknown attention option 'bwdd' \(valid: fwd, bwd, causal\)$"),
    ("attention", "1x4x8x8x64:bwdd=1", r"^unknown attention option 'bwdd' \(valid: hkv, causal, pass, fwd, bwd\)$"),
    ("gemm", "8x8x8:NN=0", r"^gemm option 'NN=0' does not say which layout to take"),
])
def test_bad_flag_values_are_one_line_naming_the_value(op, text, msg):
    with pytest.raises(UsageError, match=msg) as e:
        get_op(op).case(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_gemm_layouts_inputs_and_reference(layout):
    op = get_op("gemm")
    c = op.case(f"24x40x56:{layout}")
    x = op.make_inputs(c, "fp32", torch.device("cpu"), 0)
    a, b = x["a"], x["b"]
    assert a.shape == (24, 56) and b.shape == (56, 40)
    assert a.is_contiguous() == (layout[0] == "N") and b.is_contiguous() == (layout[1] == "N")
    assert a.abs().sum() > 0 and b.abs().sum() > 0  # random, never all zeros
    y = op.make_inputs(c, "fp32", torch.device("cpu"), 0)
    assert torch.equal(a, y["a"])  # seeded
    z = op.make_inputs(c, "fp32", torch.device("cpu"), 1)
    assert not torch.equal(a, z["a"])
    ref = op.reference(c, "fp32", x)
    err = op.error(torch.mm(a, b), ref, c, "fp32")
    assert err["err_rel"] < 1e-6
    assert op.error(torch.mm(a, b) * 1.01, ref, c, "fp32")["err_rel"] == pytest.approx(0.01, rel=1e-3)
    assert op.flops(c) == 2 * 24 * 40 * 56
    assert op.bytes(c, "bf16") == (24 * 56 + 56 * 40 + 24 * 40) * 2


def test_rmsnorm_reference_matches_torch():
    op = get_op("rmsnorm")
    c = op.case("16x256")
    x = op.make_inputs(c, "fp32", torch.device("cpu"), 0)
    out = torch.nn.functional.rms_norm(x["x"], (256,), x["w"], 1e-6)
    assert op.error(out, op.reference(c, "fp32", x), c, "fp32")["err_rel"] < 1e-6
    assert op.bytes(c, "bf16") == 2 * 16 * 256 * 2 + 256 * 2


def test_topk_error_ignores_index_order_and_catches_wrong_values():
    op = get_op("topk")
    c = op.case("8x64x4:sorted=0")
    x = op.make_inputs(c, "fp32", torch.device("cpu"), 0)
    ref = op.reference(c, "fp32", x)
    out = torch.topk(x["x"], 4, sorted=False)
    assert op.error(out, ref, c, "fp32")["err_max_abs"] == 0
    wrong = torch.topk(x["x"], 4, largest=False)
    assert op.error(wrong, ref, c, "fp32")["err_max_abs"] > 0


def test_published_suites_have_published_sizes():
    assert len(get_op("gemm").get_suite("published-bf16").pairs()) == 15
    rms = get_op("rmsnorm").get_suite("published").pairs()
    assert len(rms) == 22 and {d for _, d in rms} == {"fp16", "bf16", "fp32"}
    assert len(get_op("topk").get_suite("published").pairs()) == 33
    with pytest.raises(UsageError, match="unknown suite for gemm 'nope'"):
        get_op("gemm").get_suite("nope")


def test_unavailable_backends_say_why_on_cpu():
    from flyexplore.world.env import collect
    from flyexplore.ops.base import RunContext

    ctx = RunContext(torch.device("cpu"), collect())
    gemm = get_op("gemm")
    c = gemm.case("8x8x8")
    assert "need a CUDA or ROCm GPU" in gemm.get_backend("triton").available(ctx, c, "bf16")
    why = gemm.get_backend("flydsl").available(ctx, c, "bf16")
    assert "not ROCm" in why
    assert get_op("rmsnorm").get_backend("flydsl").available(ctx, get_op("rmsnorm").case("8x8"), "bf16")
    assert gemm.get_backend("aten").available(ctx, c, "bf16") is None
