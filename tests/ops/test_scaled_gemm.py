"""Scaled GEMM (MXFP8, MXFP4, FP8): cases, suites, inputs, reference and errors, counts, the
native call's layouts, and the reasons rows are unavailable."""
import csv
from types import SimpleNamespace

import pytest
import torch

from flyexplore.ops.scaled_gemm import mx
from flyexplore.world.env import Check, Readiness, collect
from flyexplore.errors import UsageError
from flyexplore.ops import get_op
from flyexplore.ops.scaled_gemm import operator as sg
from flyexplore.ops.base import RunContext
from flyexplore.paths import published_dir

OP = get_op("scaled_gemm")
CPU = torch.device("cpu")
F = torch.nn.functional


def _ctx(platform="cpu", ready=False, device=CPU):
    env = SimpleNamespace(platform=platform, flydsl_compile=Readiness(
        "compile templates", (Check("target arch gfx950", ready, "gfx950" if ready else "none"),)))
    return RunContext(device, env)


def test_labels_and_dtype_scaling_combinations():
    assert OP.case("4096x4096x4096").label == "4096x4096x4096"
    assert OP.case("128x256x128:row").label == "128x256x128:row"
    with pytest.raises(UsageError, match="multiple of 32"):
        OP.case("128x128x100")
    blk, row = OP.case("128x128x128"), OP.case("128x128x128:row")
    assert sg.combination_reason(blk, "mxfp4") is None and sg.combination_reason(row, "fp8_e4m3") is None
    assert "is MXFP8" in sg.combination_reason(blk, "fp8_e4m3")
    assert "applies to fp8_e4m3" in sg.combination_reason(row, "mxfp8")
    for b in OP.backends.values():                       # every backend reports the mismatch
        assert "applies to fp8_e4m3" in b.available(_ctx(), row, "mxfp8")


def test_published_suites():
    with open(published_dir() / "mxfp_gemm.csv") as f:
        rows = list(csv.DictReader(f))
    pairs = OP.get_suite("published").pairs()
    assert len(pairs) == 34 and len(OP.get_suite("published").cases) == 17
    assert [(c.label, d) for c, d in pairs] == [(f"{r['m']}x{r['n']}x{r['k']}", r["format"]) for r in rows]
    fp8 = OP.get_suite("published-shapes-fp8").pairs()
    assert len(fp8) == 34 and {c["scaling"] for c, _ in fp8} == {"tensor", "row"}
    assert all(d == "fp8_e4m3" for _, d in fp8)


def test_flops_and_bytes():
    c = OP.case("8192x8192x8192")
    assert OP.flops(c) == 2.0 * 8192 ** 3
    mk = 2 * 8192 * 8192
    assert OP.bytes(c, "mxfp4") == mk * 0.5 + mk / 32 + 2 * 8192 * 8192      # data + e8m0 + bf16 out
    assert OP.bytes(c, "mxfp8") == mk * 1 + mk / 32 + 2 * 8192 * 8192
    assert OP.bytes(OP.case("8192x8192x8192:tensor"), "fp8_e4m3") == mk + 8 + 2 * 8192 * 8192
    assert OP.bytes(OP.case("8192x8192x8192:row"), "fp8_e4m3") == mk + 4 * 16384 + 2 * 8192 * 8192


def test_inputs_are_quantized_bf16():
    c = OP.case("128x64x256")
    inp = OP.make_inputs(c, "mxfp4", CPU, 0)
    assert inp["a_hp"].dtype == torch.bfloat16
    assert inp["a_q"].shape == (128, 128) and inp["a_s"].shape == (128, 8)
    assert inp["b_q"].shape == (64, 128) and inp["b_s"].dtype == torch.uint8
    d, s = mx.quantize_mx(inp["a_hp"], "mxfp4")
    assert torch.equal(d, inp["a_q"]) and torch.equal(s, inp["a_s"])
    inp = OP.make_inputs(OP.case("128x64x256:row"), "fp8_e4m3", CPU, 0)
    assert inp["a_q"].dtype == torch.float8_e4m3fn and inp["a_s"].shape == (128, 1)
    assert "a_q" not in OP.make_inputs(OP.case("128x64x256:row"), "mxfp8", CPU, 0)


def test_errors_against_bf16_and_against_dequantized():
    """The emulated result is exact up to bf16 output rounding against the dequantized
    product; against the bf16 inputs' product it shows the format's precision:
    MXFP4 loses far more than MXFP8, and FP8 with per-row scales about as much as MXFP8."""
    errs = {}
    for shape, dt in (("256x128x256", "mxfp8"), ("256x128x256", "mxfp4"),
                      ("256x128x256:row", "fp8_e4m3"), ("256x128x256:tensor", "fp8_e4m3")):
        c = OP.case(shape)
        inp = OP.make_inputs(c, dt, CPU, 0)
        ref = OP.reference(c, dt, inp)
        hp = inp["a_hp"].double() @ inp["b_hp"].double().t()
        assert torch.equal(ref, hp)
        out = OP.get_backend("emulated").build(c, dt, inp, _ctx())()
        assert out.dtype == torch.bfloat16
        e = OP.error(out, ref, c, dt)
        assert e["err_rel_dequant"] < 4e-3                  # bf16 rounding of the output
        assert e["err_rel"] <= e["err_tol"]
        errs[(dt, c["scaling"])] = e["err_rel"]
    assert 0.02 < errs[("mxfp8", "block")] < 0.06
    assert 0.10 < errs[("mxfp4", "block")] < 0.25
    assert errs[("mxfp4", "block")] > 3 * errs[("mxfp8", "block")]
    assert 0.02 < errs[("fp8_e4m3", "row")] < 0.06


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_fp8_native_runs_on_cpu(scaling):
    """torch 2.15 runs FP8 torch._scaled_mm on CPU: the aten row is measured, and it agrees
    with the dequantized product."""
    c = OP.case(f"128x256x128:{scaling}")
    assert OP.get_backend("aten").available(_ctx(), c, "fp8_e4m3") is None
    inp = OP.make_inputs(c, "fp8_e4m3", CPU, 0)
    out = OP.get_backend("aten").build(c, "fp8_e4m3", inp, _ctx())()
    e = OP.error(out, OP.reference(c, "fp8_e4m3", inp), c, "fp8_e4m3")
    assert out.shape == (128, 256) and e["err_rel_dequant"] < 4e-3


def test_mx_native_refusal_quotes_torch_on_cpu():
    why = OP.get_backend("aten").available(_ctx(), OP.case("128x128x128"), "mxfp8")
    assert why.startswith(f"torch {torch.__version__} refuses MXFP8 (BlockWise1x32)")
    assert "with NO_SWIZZLE scales" in why and "with SWIZZLE_32_4_4 scales" in why
    assert "CPU does not support swizzle" in why                 # torch's own words
    assert "GPU only" in OP.get_backend("inductor").available(_ctx(), OP.case("128x128x128"), "mxfp8")


def test_flydsl_reasons():
    real = RunContext(CPU, collect())                            # this machine: CUDA wheel, no GPU
    assert "not ROCm" in OP.get_backend("flydsl").available(real, OP.case("128x128x128"), "mxfp8")
    ready = _ctx("rocm", ready=True)
    assert OP.get_backend("flydsl").available(ready, OP.case("128x128x128"), "mxfp4") is None
    assert "K % 128" in OP.get_backend("flydsl").available(ready, OP.case("128x128x96"), "mxfp8")
    assert "MXFP8/MXFP4" in OP.get_backend("flydsl").available(ready, OP.case("128x128x128:row"), "fp8_e4m3")


def test_platform_layout_rules(monkeypatch):
    """GPU-only logic, checked on CPU: which scale layout each platform gets, the MI300 FP8
    encoding, and the arguments handed to F.scaled_mm with swizzled scales."""
    monkeypatch.setattr(torch.version, "hip", None)
    assert sg._swizzle_candidates(torch.device("cuda:0")) == (F.SwizzleType.SWIZZLE_32_4_4,)
    assert sg._swizzle_candidates(CPU) == (F.SwizzleType.NO_SWIZZLE, F.SwizzleType.SWIZZLE_32_4_4)
    monkeypatch.setattr(torch.version, "hip", "7.2")
    assert sg._swizzle_candidates(torch.device("cuda:0")) == (F.SwizzleType.NO_SWIZZLE,)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-"))
    assert sg.fp8_torch_dtype("cuda:0") == torch.float8_e4m3fnuz
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(gcnArchName="gfx950"))
    assert sg.fp8_torch_dtype("cuda:0") == torch.float8_e4m3fn
    c = OP.case("200x128x256")
    inp = OP.make_inputs(c, "mxfp4", CPU, 0)
    fn, (a, bt, sa, sb) = sg.native_fn("mxfp4", "block", inp, F.SwizzleType.SWIZZLE_32_4_4)
    assert a.dtype == torch.float4_e2m1fn_x2 and a.shape == (200, 128) and bt.shape == (128, 128)
    assert bt.stride(0) == 1                                     # B^T column-major (NT)
    assert sa.dtype == torch.float8_e8m0fnu and sa.numel() == 256 * 8 and sb.numel() == 128 * 8
    fn, (a, bt, sa, sb) = sg.native_fn("mxfp8", "block", OP.make_inputs(c, "mxfp8", CPU, 0),
                                       F.SwizzleType.NO_SWIZZLE)
    assert sa.shape == (200, 8) and sb.shape == (128, 8)
    fn, (a, bt, sa, sb) = sg.native_fn("fp8_e4m3", "row", OP.make_inputs(OP.case("200x128x256:row"),
                                       "fp8_e4m3", CPU, 0))
    assert sa.shape == (200, 1) and sb.shape == (1, 128)
