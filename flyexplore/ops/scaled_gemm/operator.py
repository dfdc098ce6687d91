"""Scaled low-precision GEMM: ``out[M, N] (bf16) = dequant(A)[M, K] @ dequant(B)[N, K].T``, NT
layout (A and B both stored K-contiguous, as ``nn.Linear`` weights and every scaled-GEMM
library want them).

Formats (the dtype of a row): ``mxfp8`` (E4M3 data + one E8M0 scale per 32 elements along K),
``mxfp4`` (E2M1 data packed two per byte + E8M0 scales per 32), both quantized by
:mod:`flyexplore.ops.scaled_gemm.mx` from the OCP MX v1.0 rules; ``fp8_e4m3`` with an fp32 scale per tensor
(option ``scaling=tensor``) or per row of A and per column of the output (``scaling=row``).
MX formats use ``scaling=block`` (the default; the only choice for them). On MI300 (gfx94x)
``fp8_e4m3`` data is ``float8_e4m3fnuz`` (max 240), the encoding its hardware reads;
elsewhere ``float8_e4m3fn`` (max 448).

Inputs are seeded bf16 A [M, K] and B [N, K], quantized once outside the timed call. Errors:
``err_rel`` is against the unquantized product of the bf16 inputs (float64 on CPU, float32 on
GPU) -- the precision a format trades for speed, reported but not judged; ``err_rel_dequant``
is against the product of the dequantized inputs -- the kernel's own error.

Check (:func:`error`): the kernel is judged against the product of the *dequantized* operands
(what it is defined to compute): every bf16 output element within
:func:`flyexplore.ops.checks.gemm_bound` of it -- ``2(u_bf16 |ref| + (gamma_{K+4}(fp32) +
gamma_K(u_ref)) |A_dq||B_dq|)``; products of FP8/MX elements and power-of-two scales are exact
in fp32, so the K-term fp32 sum and the bf16 output rounding are the error, plus up to four
roundings for per-tensor/row scales (applied to the operands or to the output). A doubled
block scale of A changes a row of the output, one of B a column; either fails elementwise.
``err_row_max_rel`` is the worst row and ``err_block_max_rel`` the worst 32x32 output tile,
both against the dequantized product.

FLOPs 2*M*N*K. Bytes: (M*K + N*K) * element size (1 for FP8/MXFP8, 0.5 for MXFP4) + one E8M0
byte per 32 elements (MX), or 8 (per-tensor) / 4*(M+N) (per-row) bytes of fp32 scales, + 2*M*N
for the bf16 output.

Backends:

- ``aten``: eager native scaled GEMM -- ``torch._scaled_mm`` for FP8 per-tensor / per-row
  (cuBLASLt on H100/H200, hipBLASLt on MI300/MI350, a reference kernel on CPU);
  ``F.scaled_mm`` with ``ScalingType.BlockWise1x32`` for MX (hipBLASLt on gfx950 with
  ``NO_SWIZZLE`` scales, cuBLASLt on Blackwell with ``SWIZZLE_32_4_4`` scales). Where torch
  refuses, the row is unavailable with torch's own message from a 128x128x128 probe call.
- ``inductor``: ``torch.compile`` max-autotune with ``max_autotune_gemm_backends="ATEN,TRITON"``
  (Inductor without FlyDSL); GPU only.
- ``flydsl``: ``torch.compile`` max-autotune with ``max_autotune_gemm_backends="FLYDSL"``; MX
  only, ROCm torch >= 2.15 on gfx950, K % 128 == 0 (``torch/_inductor/kernel/mm.py::
  _get_rocm_mxfp_v2_format``).
- ``emulated``: dequantize both operands to fp32, fp32 matmul, cast to bf16. Runs everywhere;
  its rows have ``source="emulated"``: the time is that of the emulation, never the format's
  hardware speed.
"""
from __future__ import annotations

import csv

from flyexplore.errors import UsageError
from flyexplore.ops import checks
from flyexplore.ops.base import (DTYPE_BYTES, ERR_TOL, Operator, PublishedSuite, TensorSize, compile_context,
                                 relative_error)
from flyexplore.ops.scaled_gemm import mx
from flyexplore.ops.scaled_gemm.flydsl import FLYDSL as SCALED_GEMM_FLYDSL
from flyexplore.ops.scaled_gemm.model import MODEL as SCALED_GEMM_MODEL
from flyexplore.paths import published_dir

SCALED_GEMM = Operator(
    name="scaled_gemm",
    doc="scaled low-precision GEMM, NT layout, bf16 out (MXFP8/MXFP4 with 1x32 E8M0 block "
        "scales, FP8 E4M3 with per-tensor or per-row scales); shape MxNxK, option "
        "scaling=block/tensor/row",
    dims=("m", "n", "k"),
    options={"scaling": "block"},
    choices={"scaling": ("block", "tensor", "row")},
    dtypes=("mxfp8", "mxfp4", "fp8_e4m3"),
    flydsl=SCALED_GEMM_FLYDSL,
    model=SCALED_GEMM_MODEL,
)

MX_DTYPES = ("mxfp8", "mxfp4")


def _validate(p):
    if p["scaling"] == "block" and p["k"] % mx.BLOCK:
        raise UsageError(f"scaled_gemm K={p['k']} must be a multiple of {mx.BLOCK} for "
                         "1x32 block scaling")


SCALED_GEMM.validate = _validate


def combination_reason(case, dtype) -> str | None:
    """Why ``dtype`` and the case's ``scaling`` do not go together (None when they do)."""
    s = case["scaling"]
    if dtype in MX_DTYPES and s != "block":
        return (f"{dtype} uses 1x32 E8M0 block scales (scaling=block); scaling={s} applies "
                "to fp8_e4m3")
    if dtype == "fp8_e4m3" and s == "block":
        return ("fp8_e4m3 with 1x32 E8M0 block scales is MXFP8: use dtype mxfp8, or "
                "scaling=tensor / scaling=row for fp8_e4m3")
    return None


def fp8_torch_dtype(device):
    """float8_e4m3fnuz on MI300 (gfx94x, the FNUZ encoding its FP8 units read), else
    float8_e4m3fn (OCP E4M3: NVIDIA, gfx950, CPU)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and getattr(torch.version, "hip", None):
        arch = getattr(torch.cuda.get_device_properties(dev), "gcnArchName", "")
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def _inputs(case, dtype, device, seed):
    """bf16 A [M, K], B [N, K] plus their quantized forms: ``a_q``/``b_q`` (E4M3 tensors,
    or uint8 E2M1 pairs [.., K/2]) and ``a_s``/``b_s`` (E8M0 bytes [.., K/32]; fp32 [] or
    [rows, 1] for FP8)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    m, n, k = case["m"], case["n"], case["k"]
    a = torch.randn(m, k, generator=g, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, k, generator=g, device=device, dtype=torch.bfloat16)
    out = {"a_hp": a, "b_hp": b}
    if combination_reason(case, dtype):
        return out
    if dtype in MX_DTYPES:
        out["a_q"], out["a_s"] = mx.quantize_mx(a, dtype)
        out["b_q"], out["b_s"] = mx.quantize_mx(b, dtype)
    else:
        fdt = fp8_torch_dtype(device)
        out["a_q"], out["a_s"] = mx.quantize_fp8(a, case["scaling"], fdt)
        out["b_q"], out["b_s"] = mx.quantize_fp8(b, case["scaling"], fdt)
    return out


def dequantized(inputs, dtype, which: str, out_dtype=None):
    """Operand ``which`` ("a" or "b") of ``inputs`` dequantized to ``out_dtype`` (fp32)."""
    q, s = inputs[f"{which}_q"], inputs[f"{which}_s"]
    if dtype in MX_DTYPES:
        return mx.dequantize_mx(q, s, dtype, out_dtype)
    return mx.dequantize_fp8(q, s, out_dtype)


def _reference(case, dtype, inputs):
    """The unquantized product A @ B.T of the bf16 inputs in float64 (CPU) / float32 (GPU).
    The product of the dequantized operands is attached as ``.dequantized`` and
    ``|A_dq| @ |B_dq|.T`` as ``.dequantized_abs`` (same precision)."""
    import torch

    a = inputs["a_hp"]
    hi = torch.float64 if a.device.type == "cpu" else torch.float32
    ref = a.to(hi) @ inputs["b_hp"].to(hi).t()
    if "a_q" in inputs:
        ad, bd = dequantized(inputs, dtype, "a", hi), dequantized(inputs, dtype, "b", hi)
        ref.dequantized = ad @ bd.t()
        ref.dequantized_abs = ad.abs() @ bd.abs().t()
    return ref


def error(out, ref, case, dtype):
    """Error columns and ``accuracy_ok`` for a scaled GEMM output [M, N] (bf16): ``err_rel``,
    ``err_max_abs`` and ``err_tol`` against the unquantized product (reported, not judged);
    ``err_rel_dequant`` and the elementwise check (module docstring) against the dequantized
    product, which alone decides ``accuracy_ok``."""
    import torch

    cols = {**relative_error(out, ref), "err_tol": ERR_TOL[dtype]}
    dq = getattr(ref, "dequantized", None)
    if dq is None:
        return cols
    bound, rule = checks.gemm_bound(dq, ref.dequantized_abs, case["k"], out.dtype,
                                    torch.bfloat16, extra_terms=4)
    chk = checks.bounded(out, dq, bound, tile=32,
                         rule=rule.replace("|A||B|", "|A_dq||B_dq|") + " against the dequantized product")
    cols["err_rel_dequant"] = chk.pop("err_rel")
    chk.pop("err_max_abs")
    return {**cols, **chk}


def _bytes(case, dtype):
    m, n, k = case["m"], case["n"], case["k"]
    b = (m * k + n * k) * DTYPE_BYTES[dtype] + 2 * m * n
    if dtype in MX_DTYPES:
        b += (m * k + n * k) / mx.BLOCK
    elif case["scaling"] == "tensor":
        b += 8
    else:
        b += 4 * (m + n)
    return float(b)


def _tensors(case, dtype):
    """What :func:`_inputs` allocates and one call returns: bf16 A [M, K] and B [N, K]; unless the
    dtype and scaling do not go together (:func:`combination_reason`), their quantized forms --
    MXFP8 data [.., K] (1 byte), MXFP4 data [.., K/2] (uint8, two codes a byte) with E8M0 scales
    [.., K/32] (uint8); FP8 data [.., K] (1 byte) with an fp32 scale [] (tensor) or [rows, 1] (row)
    -- and the bf16 output [M, N]."""
    m, n, k = case["m"], case["n"], case["k"]
    out = [TensorSize("a_hp", "input", (m, k), 2), TensorSize("b_hp", "input", (n, k), 2)]
    if not combination_reason(case, dtype):
        for name, rows in (("a", m), ("b", n)):
            if dtype in MX_DTYPES:
                out += [TensorSize(f"{name}_q", "input", (rows, k // 2 if dtype == "mxfp4" else k), 1),
                        TensorSize(f"{name}_s", "input", (rows, k // mx.BLOCK), 1)]
            else:
                out += [TensorSize(f"{name}_q", "input", (rows, k), 1),
                        TensorSize(f"{name}_s", "input", () if case["scaling"] == "tensor" else (rows, 1), 4)]
    return (*out, TensorSize("out", "output", (m, n), 2))


SCALED_GEMM.make_inputs = _inputs
SCALED_GEMM.tensors = _tensors
SCALED_GEMM.reference = _reference
SCALED_GEMM.error = error
SCALED_GEMM.flops = lambda case: 2.0 * case["m"] * case["n"] * case["k"]
SCALED_GEMM.bytes = _bytes


# -- the native call --------------------------------------------------------------------------

def _swizzle_candidates(device):
    """Scale layouts to try, in order: cuBLASLt reads swizzled MX scales, hipBLASLt plain ones;
    on CPU both are tried so that the unavailable reason quotes torch on each."""
    import torch

    F = torch.nn.functional
    dev = torch.device(device)
    if dev.type == "cuda" and not getattr(torch.version, "hip", None):
        return (F.SwizzleType.SWIZZLE_32_4_4,)
    if dev.type == "cuda":
        return (F.SwizzleType.NO_SWIZZLE,)
    return (F.SwizzleType.NO_SWIZZLE, F.SwizzleType.SWIZZLE_32_4_4)


def native_fn(dtype, scaling, inputs, swizzle=None):
    """``(fn, args)``: the eager native scaled GEMM as a function of tensors (so that it can be
    compiled) and its arguments. FP8: ``torch._scaled_mm(a, b.t(), scale_a, scale_b)`` with
    scales [] / [] (tensor) or [M, 1] / [1, N] (row). MX: ``F.scaled_mm`` with BlockWise1x32
    on both sides and ``swizzle`` (``NO_SWIZZLE``: scales [rows, K/32]; ``SWIZZLE_32_4_4``:
    scales rearranged by :func:`flyexplore.ops.scaled_gemm.mx.to_blocked`)."""
    import torch

    a, b, sa, sb = inputs["a_q"], inputs["b_q"], inputs["a_s"], inputs["b_s"]
    if dtype not in MX_DTYPES:
        if scaling == "row":
            sb = sb.reshape(1, -1)

        def fp8(a, bt, sa, sb):
            return torch._scaled_mm(a, bt, sa, sb, out_dtype=torch.bfloat16)
        return fp8, (a, b.t(), sa, sb)
    F = torch.nn.functional
    if dtype == "mxfp4":
        a, b = a.view(torch.float4_e2m1fn_x2), b.view(torch.float4_e2m1fn_x2)
    if swizzle == F.SwizzleType.SWIZZLE_32_4_4:
        sa, sb = mx.to_blocked(sa), mx.to_blocked(sb)
    sa, sb = sa.view(torch.float8_e8m0fnu), sb.view(torch.float8_e8m0fnu)
    rec = F.ScalingType.BlockWise1x32

    def mxmm(a, bt, sa, sb):
        return F.scaled_mm(a, bt, sa, rec, sb, rec, swizzle_a=swizzle, swizzle_b=swizzle,
                           output_dtype=torch.bfloat16)
    return mxmm, (a, b.t(), sa, sb)


_PROBES: dict = {}


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def native_probe(device, dtype, scaling):
    """Run the native scaled GEMM once at 128x128x128 on ``device``; returns ``(swizzle,
    None)`` when torch accepts it, else ``(None, reason)`` quoting torch. Cached per process."""
    import torch

    key = (str(device), dtype, scaling, torch.__version__)
    if key in _PROBES:
        return _PROBES[key]
    F = torch.nn.functional
    case = SCALED_GEMM.make_case(m=128, n=128, k=128, scaling=scaling)
    inputs = _inputs(case, dtype, device, 0)
    if dtype in MX_DTYPES and not all(hasattr(F, a) for a in ("scaled_mm", "ScalingType", "SwizzleType")):
        res = (None, f"torch {torch.__version__} has no torch.nn.functional.scaled_mm with "
                     "ScalingType/SwizzleType (MX block scaling)")
    else:
        swz = _swizzle_candidates(device) if dtype in MX_DTYPES else (None,)
        fails = []
        res = None
        for sw in swz:
            try:
                fn, args = native_fn(dtype, scaling, inputs, sw)
                fn(*args)
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize(device)
                res = (sw, None)
                break
            except Exception as exc:  # torch's refusal is the reason we report
                tag = f"with {sw.name} scales: " if sw is not None and len(swz) > 1 else ""
                fails.append(tag + _first_line(exc))
        if res is None:
            what = {"mxfp8": "MXFP8 (BlockWise1x32)", "mxfp4": "MXFP4 (BlockWise1x32)"}.get(
                dtype, f"FP8 {scaling}-wise")
            res = (None, f"torch {torch.__version__} refuses {what} scaled GEMM on "
                         f"{_device_words(device)}: " + "; ".join(fails))
    _PROBES[key] = res
    return res


def _device_words(device) -> str:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return "CPU"
    p = torch.cuda.get_device_properties(dev)
    if getattr(torch.version, "hip", None):
        return f"{p.name} ({getattr(p, 'gcnArchName', '?').split(':')[0]})"
    return f"{p.name} (sm_{p.major}{p.minor})"


def _aten_available(ctx, case, dtype):
    why = combination_reason(case, dtype)
    if why:
        return why
    return native_probe(ctx.device, dtype, case["scaling"])[1]


def _inductor_available(ctx, case, dtype):
    why = combination_reason(case, dtype)
    if why:
        return why
    if not ctx.gpu:
        return ("GPU only: Inductor's scaled-GEMM choices are GPU kernels (ATen extern, Triton "
                "templates); on CPU the aten row measures the only kernel")
    return native_probe(ctx.device, dtype, case["scaling"])[1]


def flydsl_reasons(case, dtype) -> list[str]:
    """Why torch 2.15's FlyDSL MXFP scaled-GEMM template would refuse the case (rules from
    ``torch/_inductor/kernel/mm.py::_get_rocm_mxfp_v2_format``); empty when it passes them."""
    why = []
    if dtype not in MX_DTYPES:
        why.append(f"the FlyDSL scaled-GEMM template takes MXFP8/MXFP4 (BlockWise1x32) only, not {dtype}")
    if case["k"] % 128:
        why.append(f"FlyDSL MXFP GEMM needs K % 128 == 0 (K={case['k']})")
    return why


def _flydsl_available(ctx, case, dtype):
    why = combination_reason(case, dtype)
    if why:
        return why
    r = ctx.env.flydsl_compile
    reasons = [c.detail for c in r.failed] + flydsl_reasons(case, dtype)
    return "; ".join(reasons) or None


@SCALED_GEMM.backend("aten", "eager torch._scaled_mm (FP8) / F.scaled_mm BlockWise1x32 (MX): "
                     "cuBLASLt / hipBLASLt / CPU", baseline=True, available=_aten_available)
def _aten(case, dtype, inputs, ctx):
    sw, _ = native_probe(ctx.device, dtype, case["scaling"])
    fn, args = native_fn(dtype, case["scaling"], inputs, sw)
    return lambda: fn(*args)


INDUCTOR_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                    "triton.cudagraphs": False}
FLYDSL_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "FLYDSL",
                  "triton.cudagraphs": False}


def _compiled(options, case, dtype, inputs, ctx):
    import torch

    sw, _ = native_probe(ctx.device, dtype, case["scaling"])
    fn, args = native_fn(dtype, case["scaling"], inputs, sw)
    f = torch.compile(fn, dynamic=False, options=options)
    return lambda: f(*args)


@SCALED_GEMM.backend("inductor", "torch.compile max-autotune, ATEN,TRITON (no FlyDSL)",
                     available=_inductor_available, context=compile_context)
def _inductor(case, dtype, inputs, ctx):
    return _compiled(INDUCTOR_OPTIONS, case, dtype, inputs, ctx)


@SCALED_GEMM.backend("flydsl", "torch.compile max-autotune with max_autotune_gemm_backends=FLYDSL",
                     available=_flydsl_available, context=compile_context)
def _flydsl(case, dtype, inputs, ctx):
    return _compiled(FLYDSL_OPTIONS, case, dtype, inputs, ctx)


def _emulated_available(ctx, case, dtype):
    return combination_reason(case, dtype)


@SCALED_GEMM.backend("emulated", "dequantize both operands to fp32, fp32 matmul, bf16 out "
                     "(an emulation: its time is not the format's hardware speed)",
                     available=_emulated_available, source="emulated")
def _emulated(case, dtype, inputs, ctx):
    import torch

    def run():
        a = dequantized(inputs, dtype, "a", torch.float32)
        b = dequantized(inputs, dtype, "b", torch.float32)
        return (a @ b.t()).to(torch.bfloat16)
    return run


# -- suites -----------------------------------------------------------------------------------

def _published():
    with open(published_dir() / "mxfp_gemm.csv") as f:
        return [(f"{r['m']}x{r['n']}x{r['k']}", r["format"]) for r in csv.DictReader(f)]


SCALED_GEMM.add_suite(
    "published", _published(), ["mxfp8", "mxfp4"],
    "the 17 MXFP8 and 17 MXFP4 NT shapes published for MI355X (FlyDSL vs ATen)",
    "pytorch/pytorch PR 196719 benchmark comment (data/published/mxfp_gemm.csv)")
SCALED_GEMM.add_suite(
    "published-shapes-fp8",
    [(f"{s}:{sc}", "fp8_e4m3") for s in dict.fromkeys(s for s, _ in _published())
     for sc in ("tensor", "row")],
    ["fp8_e4m3"],
    "the 17 published MXFP shapes in FP8 E4M3 with per-tensor and per-row scales (no "
    "published FP8 figures: for H100/H200/MI300 measurements)",
    "shapes from pytorch/pytorch PR 196719 (data/published/mxfp_gemm.csv)")
SCALED_GEMM.add_suite(
    "cpu-small",
    [("128x128x128", "mxfp8"), ("128x128x128", "mxfp4"), ("256x128x256", "mxfp8"),
     ("256x128x256", "mxfp4"), ("128x256x128:tensor", "fp8_e4m3"), ("128x256x128:row", "fp8_e4m3")],
    ["mxfp8", "mxfp4", "fp8_e4m3"],
    "small scaled GEMMs for a 2-core CPU (MX rows: emulated; FP8 rows: torch's CPU kernel)",
    "flyexplore")


def _published_rows(suite, P) -> list[dict]:
    """Result rows of the published table ``suite`` (:class:`~flyexplore.ops.base.PublishedSuite`),
    made with the row builders ``P`` that the results layer hands over
    (:mod:`flyexplore.results.published`: ``read_table``, ``published_row``, ``throughput_rows``)."""

    op = SCALED_GEMM
    rows = []
    for r in P.read_table(suite):
        fmt = r["format"]
        case = op.case(f"{r['m']}x{r['n']}x{r['k']}")
        rows += P.throughput_rows(suite, "scaled_gemm", case, fmt, r, ("aten", "flydsl"),
                                 op.flops(case), op.bytes(case, fmt), "2*M*N*K")
    return rows


SCALED_GEMM.published = (PublishedSuite(
    "mxfp", "mxfp_gemm.csv", "scaled_gemm",
    "pytorch/pytorch PR 196719, benchmark comment",
    "MI355X gfx950, NT layout, FlyDSL vs ATen; output dtype and iteration counts "
    "not published",
    load=_published_rows),)
