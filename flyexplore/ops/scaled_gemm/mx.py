"""Quantization for scaled GEMMs: MXFP8 and MXFP4 (OCP Microscaling Formats v1.0) and FP8 with
per-tensor or per-row scales.

MX formats (OCP Microscaling Formats (MX) Specification v1.0, September 2023; the conversion
rule is its section 6.3, "Conversion from vector of scalar"):

- A block is :data:`BLOCK` = 32 consecutive elements along the last dimension (K of a GEMM
  operand), sharing one scale X stored as **E8M0**: an unsigned 8-bit biased exponent
  (bias 127), X = 2**(byte - 127); byte 0 is 2**-127, byte 254 is 2**127, byte 0xFF is NaN.
  E8M0 has no zero, no sign and no infinity.
- MXFP8 elements are **FP8 E4M3** (bias 7, largest normal 448, smallest subnormal 2**-9, one
  NaN encoding, no infinity); MXFP4 elements are **FP4 E2M1** (bias 1, values 0, 0.5, 1, 1.5,
  2, 3, 4, 6 and their negatives, no NaN or infinity), stored two per byte: element 2i in the low
  nibble, element 2i+1 in the high nibble (the order ``torch.float4_e2m1fn_x2`` consumers such
  as cuBLASLt and hipBLASLt read; the specification leaves the packing open).
- Conversion of a block V (section 6.3):
  ``shared_exp = floor(log2(max_i |V_i|)) - emax_elem`` (emax_elem = 8 for E4M3, 2 for
  E2M1), clamped to the E8M0 range [-127, 127]; X = 2**shared_exp;
  P_i = V_i / X rounded to nearest, ties to even, and **saturated** to the largest normal
  (448 or 6) instead of overflowing.
- Special values: a NaN scale makes every element of the block NaN on decode (the
  specification's rule for X = NaN); flyexplore sets the scale to NaN (0xFF) when the block
  holds a NaN or an infinity, since neither element type can carry an infinity. An all-zero
  block gets the smallest scale, 2**-127 (log2(0) = -inf, clamped), and zero elements.

Why our own code and not torchao: ``torchao.prototype.mx_formats`` (checked: torchao 0.18.0
installs and imports with torch 2.15.0; its ``ScaleCalculationMode.FLOOR`` is the
specification's rule and agrees with :func:`quantize_mx` byte for byte on ordinary data, which
``tests/ops/test_mx.py`` checks) is a prototype namespace without a stable API, it is not installed
on the H200 image (torch 2.11, no network) where the emulation must run, and it divides by
max(X, 2**-126) when X = 2**-127 (a workaround for Triton's subnormal handling), so a block
whose largest magnitude is below about 2**-118 (E4M3) decodes at half its value; it also gives a
block holding an infinity a finite scale (2**120 for E4M3) and saturates the infinity to 448,
where flyexplore marks the block NaN. The
conversion is about 100 lines of tensor arithmetic, written here from the specification.

Shapes: ``x`` is ``[..., K]`` with K a multiple of 32. MXFP8 data is ``[..., K]`` float8_e4m3fn,
MXFP4 data ``[..., K/2]`` uint8 (view it as ``torch.float4_e2m1fn_x2`` for torch's scaled
GEMM), scales ``[..., K/32]`` uint8 (view as ``torch.float8_e8m0fnu``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flyexplore.errors import UsageError, bad_choice

#: Elements per MX block (OCP MX v1.0: k = 32 for every concrete MX format).
BLOCK = 32
#: E8M0 exponent bias and NaN encoding (OCP MX v1.0, scale data type E8M0).
E8M0_BIAS = 127
E8M0_NAN = 0xFF


@dataclass(frozen=True)
class ElementFormat:
    """An MX element type: ``emax`` is emax_elem (the exponent of the largest normal),
    ``max_normal`` the largest finite magnitude, ``bits`` the storage width."""

    name: str
    emax: int
    max_normal: float
    bits: int


#: OCP MX v1.0 table 1/2: E4M3 (MXFP8) and E2M1 (MXFP4).
E4M3 = ElementFormat("e4m3", emax=8, max_normal=448.0, bits=8)
E2M1 = ElementFormat("e2m1", emax=2, max_normal=6.0, bits=4)
#: dtype name (flyexplore.parsing.DTYPE_NAMES) -> element format.
MX_FORMATS = {"mxfp8": E4M3, "mxfp4": E2M1}

#: FP4 E2M1 magnitudes by 3-bit code (sign is bit 3).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: Midpoints between neighbouring E2M1 magnitudes (rounding boundaries).
_E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _fmt(fmt: str | ElementFormat) -> ElementFormat:
    if isinstance(fmt, ElementFormat):
        return fmt
    if fmt not in MX_FORMATS:
        raise bad_choice("MX format", fmt, MX_FORMATS)
    return MX_FORMATS[fmt]


def e8m0_to_float(scales):
    """E8M0 bytes (uint8 or float8_e8m0fnu tensor) -> float64 values 2**(byte-127), NaN for 0xFF.
    Decoded through a 256-entry table so the result does not depend on torch's own cast."""
    import torch

    lut = torch.tensor([2.0 ** (i - E8M0_BIAS) for i in range(255)] + [math.nan],
                       dtype=torch.float64, device=scales.device)
    return lut[scales.view(torch.uint8).long()]


def shared_exponents(x, fmt: str | ElementFormat):
    """Per-block E8M0 scale bytes for ``x`` [..., K] (K % 32 == 0): ``[..., K/32]`` uint8.

    ``floor(log2(amax)) - emax_elem`` clamped to [-127, 127] and biased by 127; 0xFF (NaN) for
    a block holding NaN or +-inf; 0 (2**-127) for an all-zero block. ``floor(log2 amax)`` is
    taken exactly with ``torch.frexp`` (amax = m * 2**e, m in [0.5, 1) -> e - 1), which is
    also exact for subnormal inputs.
    """
    import torch

    f = _fmt(fmt)
    k = x.shape[-1]
    if k % BLOCK:
        raise UsageError(f"MX quantization needs the last dimension to be a multiple of {BLOCK}, got {k}")
    blocks = x.float().reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    bad = ~torch.isfinite(blocks).all(dim=-1)
    amax = blocks.abs().nan_to_num(0.0, posinf=0.0).amax(dim=-1)
    _, e = torch.frexp(amax)
    exp = (e.to(torch.int32) - 1 - f.emax).clamp(-E8M0_BIAS, E8M0_BIAS)
    exp = torch.where(amax == 0, torch.full_like(exp, -E8M0_BIAS), exp)
    byte = (exp + E8M0_BIAS).to(torch.uint8)
    return torch.where(bad, torch.full_like(byte, E8M0_NAN), byte)


def e2m1_encode(v):
    """Round float values to FP4 E2M1 codes (uint8, 0..15; bit 3 = sign), nearest with ties to
    even code, saturating at 6. NaN becomes code 0 (the block's NaN scale carries it)."""
    import torch

    a = v.float().abs()
    mids = torch.tensor(_E2M1_MIDS, dtype=torch.float32, device=v.device)
    idx = torch.bucketize(a, mids, right=False)      # ties go to the lower code ...
    at = mids[idx.clamp(max=len(_E2M1_MIDS) - 1)]
    tie_odd = (a == at) & (idx % 2 == 1)              # ... unless it is odd: then the even one
    idx = torch.where(tie_odd, idx + 1, idx).clamp(max=7)
    idx = torch.where(torch.isnan(a), torch.zeros_like(idx), idx)
    sign = torch.signbit(v.float()) & ~torch.isnan(v.float())
    return (idx | (sign.to(idx.dtype) << 3)).to(torch.uint8)


def e2m1_decode(codes):
    """FP4 E2M1 codes (uint8 0..15) -> float32 values."""
    import torch

    lut = torch.tensor(list(E2M1_VALUES) + [-x for x in E2M1_VALUES], dtype=torch.float32,
                       device=codes.device)
    return lut[codes.long()]


def pack_fp4(codes):
    """[..., K] E2M1 codes -> [..., K/2] bytes, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed):
    """[..., K/2] bytes -> [..., K] E2M1 codes (inverse of :func:`pack_fp4`)."""
    import torch

    p = packed.view(torch.uint8)
    return torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


def quantize_mx(x, fmt: str | ElementFormat):
    """Quantize ``x`` ([..., K], bf16/fp16/fp32, K % 32 == 0) to MX along the last dimension.

    Returns ``(data, scales)``: MXFP8 data ``[..., K]`` float8_e4m3fn, MXFP4 data ``[..., K/2]``
    uint8 (two E2M1 codes a byte), and scales ``[..., K/32]`` uint8 E8M0 bytes. The division by X
    is exact: V/X is formed in float64 (X is a power of two) and is representable in float32
    whenever it can round to a non-zero element. Raises :class:`UsageError` for a bad format
    or K.
    """
    import torch

    f = _fmt(fmt)
    scales = shared_exponents(x, f)
    k = x.shape[-1]
    xs = e8m0_to_float(scales).repeat_interleave(BLOCK, dim=-1)          # float64 X per element
    v = (x.double() / torch.where(torch.isnan(xs), torch.ones_like(xs), xs)).float()
    v = v.clamp(-f.max_normal, f.max_normal)                           # saturate (NaN stays NaN)
    if f is E4M3:
        data = v.to(torch.float8_e4m3fn)
    else:
        data = pack_fp4(e2m1_encode(v))
    assert data.shape[-1] in (k, k // 2)
    return data, scales


def dequantize_mx(data, scales, fmt: str | ElementFormat, dtype=None):
    """MX data and E8M0 scales (as from :func:`quantize_mx`) -> values ``[..., K]`` (default
    float32): element value times its block's scale; a NaN scale gives NaN for the whole block.
    """
    import torch

    f = _fmt(fmt)
    dtype = dtype or torch.float32
    if f is E4M3:
        p = data.view(torch.float8_e4m3fn).to(torch.float64)
    else:
        p = e2m1_decode(unpack_fp4(data)).to(torch.float64)
    xs = e8m0_to_float(scales).repeat_interleave(BLOCK, dim=-1)
    return (p * xs).to(dtype)


def to_blocked(scales):
    """Rearrange E8M0 scales ``[rows, cols]`` into the swizzled layout cuBLASLt reads for 1x32
    block scaling (``torch.nn.functional.SwizzleType.SWIZZLE_32_4_4``; cuBLAS documentation,
    "1D block scaling factors layout"): the matrix is zero-padded to rows a multiple of 128 and
    cols a multiple of 4, cut into 128x4 tiles stored one after another in row-block-major
    order, and inside a tile element (r, c) sits at (r % 32) * 16 + (r // 32) * 4 + c.
    Returns a flat uint8 tensor of padded_rows * padded_cols bytes.
    """
    import torch

    s = scales.view(torch.uint8)
    rows, cols = s.shape
    pr, pc = -(-rows // 128) * 128, -(-cols // 4) * 4
    padded = torch.zeros(pr, pc, dtype=torch.uint8, device=s.device)
    padded[:rows, :cols] = s
    r = torch.arange(pr, device=s.device).view(-1, 1)
    c = torch.arange(pc, device=s.device).view(1, -1)
    tile = (r // 128) * (pc // 4) + (c // 4)
    rr = r % 128
    offset = tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + (c % 4)
    out = torch.empty(pr * pc, dtype=torch.uint8, device=s.device)
    out[offset.reshape(-1)] = padded.reshape(-1)
    return out


def quantize_fp8(x, scaling: str, fp8_dtype=None, nonfinite: str = "raise"):
    """FP8 quantization with an fp32 scale per tensor (``scaling="tensor"``, scale shape ``[]``)
    or per row (``"row"``, scale ``[rows, 1]``): scale = amax / fp8_max (amax floored at 1e-12),
    q = saturate(x / scale) rounded to nearest even. ``x`` is 2-D. Returns ``(q, scale)``
    with ``x ~= q * scale`` (the decoding scale ``torch._scaled_mm`` takes). ``fp8_dtype``
    defaults to float8_e4m3fn (max 448; MI300's float8_e4m3fnuz has max 240).

    Non-finite input: one NaN or infinity would make amax non-finite and so the whole row
    (or tensor) NaN or zero on decode. ``nonfinite="raise"`` (default) refuses such input with
    a :class:`UsageError` that counts the values and names the first; ``"mark"`` takes amax over
    the finite values only and stores each non-finite element as the FP8 NaN encoding (E4M3 has
    no infinity), so it alone decodes to NaN -- the element-wise form of the MX rule that marks
    a block holding NaN/Inf with a NaN scale. Raises :class:`UsageError` for another
    ``scaling`` or ``nonfinite``.
    """
    import torch


    if scaling not in ("tensor", "row"):
        raise bad_choice("FP8 scaling", scaling, ("tensor", "row"))
    if nonfinite not in ("raise", "mark"):
        raise bad_choice("nonfinite mode", nonfinite, ("raise", "mark"))
    fp8_dtype = fp8_dtype or torch.float8_e4m3fn
    fmax = float(torch.finfo(fp8_dtype).max)
    xf = x.float()
    bad = ~torch.isfinite(xf)
    nbad = int(bad.sum())
    if nbad and nonfinite == "raise":
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise UsageError(f"quantize_fp8: {nbad} non-finite value(s) in x (first {float(xf[first])} at "
                         f"{list(first)}); a {scaling} scale from amax would turn the whole "
                         f"{'row' if scaling == 'row' else 'tensor'} into NaN/zero; replace them, or "
                         "pass nonfinite='mark' to keep them as NaN elements")
    fin = xf.nan_to_num(0.0, posinf=0.0, neginf=0.0) if nbad else xf
    amax = fin.abs().amax() if scaling == "tensor" else fin.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp(min=1e-12) / fmax
    q = (fin / scale).clamp(-fmax, fmax)
    if nbad:
        q = torch.where(bad, torch.full_like(q, float("nan")), q)
    return q.to(fp8_dtype), scale.float()


def dequantize_fp8(q, scale, dtype=None):
    """``q * scale`` in ``dtype`` (default float32); inverse of :func:`quantize_fp8`."""
    import torch

    return (q.to(torch.float32) * scale).to(dtype or torch.float32)


# -- tables for walkthroughs ------------------------------------------------------------------

#: What :func:`format_errors` compares by default: (name, dtype, FP8 scaling or None).
ERROR_FORMATS = (("fp8_e4m3 per-tensor", "fp8_e4m3", "tensor"), ("fp8_e4m3 per-row", "fp8_e4m3", "row"),
                 ("mxfp8", "mxfp8", None), ("mxfp4", "mxfp4", None))


def _rel(dq, x) -> tuple[float, float, float]:
    """(relative error over all of x, worst relative error of one row, max absolute error)."""
    import torch

    d = dq.double() - x.double()
    n = float(x.double().norm())
    nr, dr = x.double().norm(dim=-1), d.norm(dim=-1)
    rows = torch.where(nr > 0, dr / torch.where(nr > 0, nr, torch.ones_like(nr)), dr)
    return ((float(d.norm()) / n if n > 0 else float(d.norm())), float(rows.max()),
            (float(d.abs().max()) if d.numel() else 0.0))


def block_table(x, fmt: str | ElementFormat):
    """One row per MX block of ``x`` ([rows, K] or [K], K % 32 == 0): ``row``, ``block``
    (index along K), ``amax`` (largest magnitude in the block), ``scale_byte`` (E8M0),
    ``scale_exp`` (byte - 127, NaN for the NaN scale), ``scale`` (2**scale_exp), ``err_rel``
    (||dequant - x|| / ||x|| over the block) and ``err_max_abs``, from :func:`quantize_mx` and
    :func:`dequantize_mx`. A pandas DataFrame; raises :class:`UsageError` for a bad format or
    K."""
    import pandas as pd
    import torch

    f = _fmt(fmt)
    x2 = x.reshape(1, -1) if x.dim() == 1 else x.reshape(-1, x.shape[-1])
    data, scales = quantize_mx(x2, f)
    dq = dequantize_mx(data, scales, f, torch.float64)
    xb = x2.double().reshape(x2.shape[0], -1, BLOCK)
    db = dq.reshape(x2.shape[0], -1, BLOCK) - xb
    nx = xb.norm(dim=-1)
    nd = db.norm(dim=-1)
    rel = torch.where(nx > 0, nd / torch.where(nx > 0, nx, torch.ones_like(nx)), nd)
    byte = scales.view(torch.uint8).long()
    exp = torch.where(byte == E8M0_NAN, torch.full_like(byte, 0), byte - E8M0_BIAS).double()
    exp = torch.where(byte == E8M0_NAN, torch.full_like(exp, math.nan), exp)
    rows, blocks = torch.meshgrid(torch.arange(x2.shape[0]), torch.arange(scales.shape[-1]), indexing="ij")
    return pd.DataFrame({
        "row": rows.reshape(-1).numpy(), "block": blocks.reshape(-1).numpy(),
        "amax": xb.abs().amax(dim=-1).reshape(-1).numpy(), "scale_byte": byte.reshape(-1).numpy(),
        "scale_exp": exp.reshape(-1).numpy(), "scale": e8m0_to_float(scales).reshape(-1).numpy(),
        "err_rel": rel.reshape(-1).numpy(), "err_max_abs": db.abs().amax(dim=-1).reshape(-1).numpy(),
    })


def format_errors(x, formats=ERROR_FORMATS):
    """Quantize ``x`` (2-D [rows, K], K % 32 == 0; typically bf16) to each format and back, and
    return one row per format: ``format``, ``dtype``, ``elements`` (element encoding),
    ``scales`` (what carries a scale and its encoding), ``bits_per_value`` (element bits plus
    the scale bits spread over the values they cover: MXFP8 8 + 8/32 = 8.25, MXFP4 4.25, FP8
    per-tensor 8 + 32/numel, per-row 8 + 32/K), ``err_rel`` (||dequant(quant(x)) - x|| / ||x||),
    ``err_rel_worst_row`` (the same per row, the largest: a per-tensor scale set by large rows
    flushes small rows to zero, which the overall figure hides) and ``err_max_abs``, all against
    ``x`` itself (the bf16 values). ``formats``: (name, dtype,
    FP8 scaling) triples (:data:`ERROR_FORMATS`). A pandas DataFrame; raises
    :class:`UsageError` for a bad shape, dtype or scaling, and for NaN/Inf in ``x`` with an FP8
    format (:func:`quantize_fp8` refuses them; MX formats mark their block NaN)."""
    import pandas as pd


    if x.dim() != 2:
        raise UsageError(f"format_errors needs a 2-D tensor [rows, K], got shape {tuple(x.shape)}")
    rows, k = x.shape
    out = []
    for name, dtype, scaling in formats:
        if dtype in MX_FORMATS:
            f = MX_FORMATS[dtype]
            data, scales = quantize_mx(x, f)
            dq = dequantize_mx(data, scales, f)
            elem, sc, bits = f.name.upper(), f"E8M0 per {BLOCK} values along K", f.bits + 8 / BLOCK
        elif dtype == "fp8_e4m3":
            q, scale = quantize_fp8(x, scaling)
            dq = dequantize_fp8(q, scale)
            elem = "E4M3"
            sc = {"tensor": "fp32 per tensor", "row": "fp32 per row"}[scaling]
            bits = 8 + (32 / (rows * k) if scaling == "tensor" else 32 / k)
        else:
            raise bad_choice("format dtype", dtype, (*MX_FORMATS, "fp8_e4m3"))
        err, worst, mabs = _rel(dq, x)
        out.append({"format": name, "dtype": dtype, "elements": elem, "scales": sc,
                    "bits_per_value": bits, "err_rel": err, "err_rel_worst_row": worst,
                    "err_max_abs": mabs})
    return pd.DataFrame(out)
