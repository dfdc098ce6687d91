"""MX (OCP Microscaling v1.0) and FP8 quantization against values computed by hand from the
specification's rules, and against torchao's implementation where the two should agree."""
import math

import pytest
import torch

from flyexplore.ops.scaled_gemm import mx
from flyexplore.errors import UsageError


def _block(values, fill=0.0):
    """One 32-element block (float32) starting with ``values``."""
    x = torch.full((1, 32), fill, dtype=torch.float32)
    x[0, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def _e4m3_bits(data):
    return data.view(torch.uint8)[0].tolist()


def test_e8m0_decoding():
    b = torch.tensor([0, 1, 119, 127, 128, 254, 255], dtype=torch.uint8)
    v = mx.e8m0_to_float(b).tolist()
    assert v[:6] == [2.0 ** -127, 2.0 ** -126, 2.0 ** -8, 1.0, 2.0, 2.0 ** 127]
    assert math.isnan(v[6])


def test_mxfp8_scale_is_floor_log2_amax_minus_8():
    # amax 1.0: floor(log2 1) - emax(E4M3)=8 -> X = 2^-8, byte 127-8 = 119; elements V/X.
    data, s = mx.quantize_mx(_block([1.0, 0.5, -0.25]), "mxfp8")
    assert s.tolist() == [[119]]
    # 256 = 2^8 -> E4M3 exponent field 15, mantissa 0 -> 0x78; 128 -> 0x70; -64 -> 0x80|0x68
    assert _e4m3_bits(data)[:4] == [0x78, 0x70, 0xE8, 0x00]
    # amax 300 -> floor(log2 300) = 8 -> X = 1 (byte 127)
    _, s = mx.quantize_mx(_block([300.0]), "mxfp8")
    assert s.tolist() == [[127]]
    # largest bf16/fp32 exponent: 1.5 * 2^127 -> shared exponent 127 - 8 = 119 -> byte 246
    d, s = mx.quantize_mx(_block([1.5 * 2.0 ** 127]), "mxfp8")
    assert s.tolist() == [[246]] and d.float()[0, 0].item() == 384.0


def test_mxfp8_rounding_is_nearest_even():
    # X = 1 (amax 300). E4M3 near 1: spacing 1/8, so 1.0625 and 1.1875 are ties.
    vals = [300.0, 1.0625, 1.1875, 3 * 2.0 ** -10, 2.0 ** -10, 1.0 + 2.0 ** -5]
    d, _ = mx.quantize_mx(_block(vals), "mxfp8")
    got = d.float()[0, :6].tolist()
    # 300 -> 288 (spacing 32 above 256); 1.0625 -> 1.0 (even); 1.1875 -> 1.25 (even);
    # 1.5 * 2^-9 (subnormal tie) -> 2^-8 (even); 2^-10 (half the smallest subnormal) -> 0;
    # 1.03125 -> 1.0 (below the tie)
    assert got == [288.0, 1.0, 1.25, 2.0 ** -8, 0.0, 1.0]
    assert _e4m3_bits(d)[:5] == [0x79, 0x38, 0x3A, 0x02, 0x00]


def test_mxfp8_saturates_instead_of_overflowing():
    # amax 500 and 511 have floor(log2) = 8, so X = 1 and V/X exceeds 448: clamp to 448 (0x7E)
    d, s = mx.quantize_mx(_block([500.0, -511.0, 479.0]), "mxfp8")
    assert s.tolist() == [[127]]
    assert d.float()[0, :3].tolist() == [448.0, -448.0, 448.0]
    assert _e4m3_bits(d)[0] == 0x7E


def test_scale_clamps_at_e8m0_minimum_and_zero_blocks():
    # 2^-130 (an fp32 subnormal): shared exponent -130 - 8 = -138 -> clamped to -127 (byte 0);
    # the element is 2^-130 / 2^-127 = 0.125, exact, so the block decodes without loss
    x = _block([2.0 ** -130])
    d, s = mx.quantize_mx(x, "mxfp8")
    assert s.tolist() == [[0]] and d.float()[0, 0].item() == 0.125
    assert mx.dequantize_mx(d, s, "mxfp8", torch.float64)[0, 0].item() == 2.0 ** -130
    d, s = mx.quantize_mx(torch.zeros(2, 64), "mxfp8")
    assert s.tolist() == [[0, 0], [0, 0]] and not d.float().any()


def test_nan_or_inf_makes_the_block_scale_nan():
    x = torch.ones(1, 96)
    x[0, 3] = float("nan")
    x[0, 40] = float("inf")
    for fmt in ("mxfp8", "mxfp4"):
        d, s = mx.quantize_mx(x, fmt)
        assert s.tolist() == [[255, 255, 125 if fmt == "mxfp4" else 119]]
        back = mx.dequantize_mx(d, s, fmt)
        assert torch.isnan(back[0, :64]).all()          # a NaN scale: the whole block is NaN
        assert (back[0, 64:] == 1.0).all()               # the next block is untouched


def test_mxfp4_values_rounding_saturation_and_packing():
    # amax 7.9: floor(log2 7.9) = 2 = emax(E2M1) -> X = 1 (byte 127); 7.9 saturates to 6
    vals = [7.9, 5.0, 3.5, 2.5, 1.25, 0.75, 0.25, -4.5, 0.1, 1.75, -0.0, 3.2]
    d, s = mx.quantize_mx(_block(vals), "mxfp4")
    assert s.tolist() == [[127]] and d.shape == (1, 16) and d.dtype == torch.uint8
    codes = mx.unpack_fp4(d)[0, : len(vals)].tolist()
    # ties go to the even code: 5 -> 4 (110), 3.5 -> 4, 2.5 -> 2 (100), 1.25 -> 1 (010),
    # 0.75 -> 1 (010), 0.25 -> 0, 1.75 -> 2 (100); -4.5 -> -4 (1110); -0 keeps its sign
    assert codes == [7, 6, 6, 4, 2, 2, 0, 14, 0, 4, 8, 5]
    assert mx.e2m1_decode(torch.tensor(codes)).tolist()[:10] == [6, 4, 4, 2, 1, 1, 0, -4, 0, 2]
    assert d[0, 0].item() == 0x67                       # element 0 low nibble, element 1 high
    # amax 1.0: shared exponent 0 - 2 = -2 -> byte 125; 1.0 / 0.25 = 4 (code 6); 0.3 -> 1.2 -> 1
    d, s = mx.quantize_mx(_block([1.0, 0.3]), "mxfp4")
    assert s.tolist() == [[125]]
    assert mx.dequantize_mx(d, s, "mxfp4")[0, :2].tolist() == [1.0, 0.25]


def test_quantize_rejects_bad_input():
    with pytest.raises(UsageError, match="multiple of 32"):
        mx.quantize_mx(torch.ones(2, 48), "mxfp8")
    with pytest.raises(UsageError, match="mxfp6"):
        mx.quantize_mx(torch.ones(2, 64), "mxfp6")
    with pytest.raises(UsageError, match="block"):
        mx.quantize_fp8(torch.ones(2, 64), "block")


def test_roundtrip_error_matches_the_element_precision():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g)
    for fmt, lo, hi in (("mxfp8", 0.01, 0.05), ("mxfp4", 0.08, 0.2)):
        d, s = mx.quantize_mx(x, fmt)
        err = float((mx.dequantize_mx(d, s, fmt) - x).norm() / x.norm())
        assert lo < err < hi, (fmt, err)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_matches_torchao_floor_mode(dtype, fmt):
    """torchao's ScaleCalculationMode.FLOOR is the specification's rule: same bytes."""
    mxt = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 64).unsqueeze(1)).to(dtype)
    x[4, :32] = 0
    elem = torch.float8_e4m3fn if fmt == "mxfp8" else torch.float4_e2m1fn_x2
    s_ao, d_ao = mxt.to_mx(x, elem, 32)
    d, s = mx.quantize_mx(x, fmt)
    assert torch.equal(s_ao.view(torch.uint8), s)
    assert torch.equal(d_ao.view(torch.uint8), d.view(torch.uint8))


def test_torchao_differs_for_tiny_blocks():
    """Why flyexplore does not delegate to torchao: with X = 2^-127 torchao divides by
    2^-126, so the block decodes at half its value; ours is exact."""
    mxt = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    x = _block([2.0 ** -120])
    s_ao, d_ao = mxt.to_mx(x, torch.float8_e4m3fn, 32)
    d, s = mx.quantize_mx(x, "mxfp8")
    assert s_ao.view(torch.uint8).tolist() == s.tolist() == [[0]]
    assert d_ao.float()[0, 0].item() == 64.0 and d.float()[0, 0].item() == 128.0
    assert mx.dequantize_mx(d, s, "mxfp8", torch.float64)[0, 0].item() == 2.0 ** -120


def test_to_blocked_layout():
    s = torch.arange(130 * 5, dtype=torch.int32).remainder(251).to(torch.uint8).view(130, 5)
    out = mx.to_blocked(s)
    assert out.numel() == 256 * 8                       # padded to 128-row, 4-column tiles
    # (r, c) -> tile (r // 128) * (cols / 4) + c // 4, then (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4
    assert out[(33 % 32) * 16 + 1 * 4 + 1] == s[33, 1]
    assert out[3 * 512 + (129 % 32) * 16 + 0 * 4 + 0] == s[129, 4]
    assert out[2 * 512 + (129 % 32) * 16 + 0 * 4 + 3] == s[129, 3]
    assert int(out.sum()) == int(s.to(torch.int64).sum())   # padding is zeros, nothing lost
    ut = pytest.importorskip("torchao.prototype.mx_formats.utils")
    assert torch.equal(ut.to_blocked(s).view(torch.uint8), out)


def test_fp8_per_tensor_and_per_row():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g) * torch.arange(1, 9).unsqueeze(1)
    q, s = mx.quantize_fp8(x, "tensor")
    assert s.shape == () and s.item() == pytest.approx(float(x.abs().max()) / 448)
    assert q.float().abs().max().item() == 448.0
    q, s = mx.quantize_fp8(x, "row")
    assert s.shape == (8, 1)
    assert (q.float().abs().amax(dim=1) == 448.0).all()   # every row's max maps to 448
    err = (mx.dequantize_fp8(q, s) - x).abs() / x.abs().amax(dim=1, keepdim=True)
    assert float(err.max()) <= 16 / 448                   # half an E4M3 step (32) in [256, 448]
    q, _ = mx.quantize_fp8(torch.zeros(2, 32), "row")     # all-zero rows do not divide by zero
    assert not q.float().any()


def test_block_table_lists_each_block_scale_and_error():
    x = torch.cat([_block([1.0, 0.5]), _block([300.0, -2.0]), _block([float("nan")])], dim=1)  # 1 row, 3 blocks
    t = mx.block_table(x, "mxfp8")
    assert list(t["block"]) == [0, 1, 2] and list(t["row"]) == [0, 0, 0]
    assert list(t["scale_byte"]) == [119, 127, 255]                 # 2^-8, 2^0, NaN
    assert list(t["scale_exp"][:2]) == [-8.0, 0.0] and math.isnan(t["scale_exp"][2])
    assert list(t["amax"][:2]) == [1.0, 300.0]
    assert t["err_rel"][0] == 0.0                                    # 1.0 and 0.5 are exact in E4M3
    assert t["err_max_abs"][1] == pytest.approx(12.0)  # 300 -> 288: E4M3 steps by 32 in [256, 512)
    t4 = mx.block_table(torch.randn(4, 64), "mxfp4")
    assert len(t4) == 8 and (t4["err_rel"] > 0).all() and (t4["err_rel"] < 0.3).all()
    with pytest.raises(UsageError, match="multiple of 32"):
        mx.block_table(torch.ones(2, 48), "mxfp8")


def test_format_errors_per_tensor_scale_flushes_small_rows():
    # rows of 1e-3 and 1e3: one per-tensor scale (set by the large row) flushes the small row to
    # zero (relative error 1), per-row and per-block scales keep it
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 64, generator=g) * torch.tensor([[1e-3], [1e3]])).to(torch.bfloat16)
    t = mx.format_errors(x).set_index("format")
    assert list(t.index) == ["fp8_e4m3 per-tensor", "fp8_e4m3 per-row", "mxfp8", "mxfp4"]
    assert t.loc["fp8_e4m3 per-tensor", "err_rel_worst_row"] == pytest.approx(1.0)
    assert t.loc["fp8_e4m3 per-row", "err_rel_worst_row"] < 0.05
    assert t.loc["mxfp8", "err_rel_worst_row"] < 0.05 and t.loc["mxfp4", "err_rel_worst_row"] < 0.3
    assert t.loc["mxfp4", "err_rel"] > 2 * t.loc["mxfp8", "err_rel"]
    assert list(t["bits_per_value"]) == pytest.approx([8 + 32 / 128, 8 + 32 / 64, 8.25, 4.25])
    # the overall figure is the decoded tensor's relative error
    q, s = mx.quantize_fp8(x, "row")
    d = mx.dequantize_fp8(q, s).double() - x.double()
    assert t.loc["fp8_e4m3 per-row", "err_rel"] == pytest.approx(float(d.norm() / x.double().norm()))
    with pytest.raises(UsageError, match="2-D tensor"):
        mx.format_errors(x[0])
    with pytest.raises(UsageError, match="unknown format dtype 'int8'"):
        mx.format_errors(x, [("int8", "int8", None)])
