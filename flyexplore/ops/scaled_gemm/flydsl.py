"""MXFP scaled GEMM's FlyDSL path: the Inductor template ``mm_flydsl`` (MXFP) for ``aten._scaled_mm_v2``.

Rules re-derived (not copied) from ``torch/_inductor/kernel/mm.py::_get_rocm_mxfp_v2_format``,
``get_flydsl_mxfp_template_kwargs`` and the stride constraint ``scaled_mm_v2_constraint``.
MXFP8: e4m3 data, e8m0 scales per 32 elements along K; MXFP4: e2m1 pairs. Checked against
torch's own functions in ``tests/ops/test_explain_agreement.py``. Registered as ``SCALED_GEMM.flydsl``.
"""
from __future__ import annotations

from typing import Sequence

from flyexplore.errors import bad_choice
from flyexplore.ops.base import FlyDSLPath
from flyexplore.parsing import parse_flag
from flyexplore.world.conditions import (
    GPU_ALIGN_BYTES,
    INT32_MAX,
    SRC_ALIGN,
    SRC_HEUR,
    SRC_MM,
    SRC_VALID,
    Condition,
    TensorDesc,
    aligned_input,
    as_dtype,
    cond,
    desc_or_none,
    fits_inductor,
    opt_offset,
    opt_stride,
    short_dtype,
    span_condition,
)

RECIPES = {"tensorwise": 0, "rowwise": 1, "blockwise1x16": 2, "blockwise1x32": 3, "blockwise1x128": 4,
           "blockwise128x128": 5}
SWIZZLES = {"none": 0, "swizzle_32_4_4": 1, "swizzle_32_8": 2}


def scaled_mm_rules(a, b, scale_a, scale_b, *, recipe_a: str = "blockwise1x32", recipe_b: str = "blockwise1x32",
                    swizzle_a: str = "none", swizzle_b: str = "none", out_dtype="bf16", bias=None,
                    use_fast_accum: bool = False, contraction_dim: Sequence[int] | None = None,
                    scale_levels: int = 1, dynamic: bool = False, autotuning: bool = False,
                    search_space: str = "DEFAULT", assume_aligned_inputs: bool = False) -> list[Condition]:
    """Call and config conditions of the FlyDSL MXFP template for
    ``F.scaled_mm`` / ``aten._scaled_mm_v2(a, b, [scale_a], recipe, swizzle, ...)`` under
    torch.compile: ``a`` [M, K_storage], ``b`` [K_storage, N], e8m0 scales [M, K/32] and
    [N, K/32]; K = K_storage for MXFP8, 2 * K_storage for MXFP4 (two values a byte)."""
    import torch

    a, b = TensorDesc.of(a), TensorDesc.of(b)
    sa, sb = TensorDesc.of(scale_a), TensorDesc.of(scale_b)
    bias = desc_or_none(bias)
    F = f"{SRC_MM}::_get_rocm_mxfp_v2_format"
    T = f"{SRC_MM}::get_flydsl_mxfp_template_kwargs"
    od = as_dtype(out_dtype) if out_dtype is not None else None
    out = [cond("one scale level", scale_levels == 1, "single-level scales" if scale_levels == 1
              else f"{scale_levels}-level scales (e.g. NVFP4): not MXFP", F)]
    for side, r in (("A", recipe_a), ("B", recipe_b)):
        out.append(cond(f"recipe {side}", r == "blockwise1x32", f"{side} recipe {r}" + (" (MX: 1x32 blocks)" if r == "blockwise1x32"
                      else ": FlyDSL MXFP needs BlockWise1x32"), F))
    for side, s in (("A", swizzle_a), ("B", swizzle_b)):
        out.append(cond(f"swizzle {side}", s == "none", f"{side} scales {'not swizzled' if s == 'none' else 'swizzled ' + s}"
                      + ("" if s == "none" else ": FlyDSL needs NO_SWIZZLE"), F))
    for side, s in (("A", sa), ("B", sb)):
        ok = s.dtype == torch.float8_e8m0fnu
        out.append(cond(f"scale {side} dtype", ok, f"scale_{side.lower()} {short_dtype(s.dtype)}" + ("" if ok else ": needs float8_e8m0fnu"), F))
    od_ok = od in (torch.bfloat16, torch.float16)
    out.append(cond("out dtype", od_ok, f"out_dtype {short_dtype(od) if od is not None else 'None'}"
                  + (" ok" if od_ok else ": needs bf16 or fp16"), F))
    if bias is not None:
        n_ = b.shape[-1] if b.ndim == 2 else None
        ok = bias.ndim == 1 and bias.device == b.device and bias.dtype == od and bias.shape[0] == n_
        out.append(cond("bias", ok, f"bias {bias.text()}" + (" ok (1-D, length N, output dtype)" if ok
                      else ": must be 1-D of length N in the output dtype on B's device"), f"{SRC_MM}::_flydsl_mxfp_bias_supported"))
    out.append(cond("contraction_dim", not contraction_dim, "no contraction_dim" if not contraction_dim
                  else "contraction_dim given: not supported", F))
    out.append(cond("fast accum", not use_fast_accum, "use_fast_accum=False" if not use_fast_accum
                  else "use_fast_accum=True: FlyDSL MXFP does exact accumulation only", F))
    fmt = {"float8_e4m3fn": "mxfp8", "float4_e2m1fn_x2": "mxfp4"}.get(str(a.dtype).replace("torch.", ""))
    same = a.dtype == b.dtype
    out.append(cond("operand dtype", same and fmt is not None, f"A {short_dtype(a.dtype)}, B {short_dtype(b.dtype)}"
                  + (f" ({fmt})" if same and fmt else ": both float8_e4m3fn (MXFP8) or both float4_e2m1fn_x2 (MXFP4)"), F))
    out.append(cond("static", not dynamic, "static shapes" if not dynamic else "dynamic shapes: FlyDSL needs static shapes", T))
    two_d = all(t.ndim == 2 for t in (a, b, sa, sb))
    out.append(cond("2-D", two_d, "operands and scales 2-D" if two_d else "operands and scales must be 2-D", T))
    dev_ok = all(t.device == a.device for t in (b, sa, sb)) and a.device_type == "cuda"
    out.append(cond("device", dev_ok, f"all on {a.device}" if dev_ok else "operands and scales must be on the output's GPU", T))
    if not two_d:
        return out
    for side, s in (("A", sa), ("B", sb)):
        al = aligned_input(s, assume_aligned_inputs)
        out.append(cond(f"scale {side} aligned", al, f"scale_{side.lower()} storage offset {s.storage_offset} B"
                      + (" 16-byte aligned" if al else " not 16-byte aligned"), SRC_ALIGN))
    epb = 2 if fmt == "mxfp4" else 1
    m, ks = a.shape
    kb, n = b.shape
    k = ks * epb
    out.append(cond("K agrees", kb == ks, f"A's K {ks} == B's K {kb} (storage)" if kb == ks else f"A's K {ks} != B's K {kb}", T))
    out.append(cond("non-empty", min(m, n, ks) > 0, f"M={m}, N={n}, K={k} positive" if min(m, n, ks) > 0 else "an empty dimension", T))
    out.append(cond("K % 128", k % 128 == 0 and k <= INT32_MAX, f"K={k} % 128 == 0" if k % 128 == 0 else
                  f"K={k} is not a multiple of 128", T))
    for side, s, rows in (("A", sa, m), ("B", sb, n)):
        ok = s.shape == (rows, k // 32)
        out.append(cond(f"scale {side} shape", ok, f"scale_{side.lower()} shape {s.shape}" + (f" == [{rows}, K/32]" if ok
                      else f" must be [{rows}, {k // 32}]"), T))
        fits = fits_inductor(rows, k // 32, k // 32, 1)
        out.append(cond(f"scale {side} span", fits, f"scale_{side.lower()} {rows * (k // 32)} B"
                      + (" fits" if fits else " exceeds the 32-bit buffer span"), T))
    notes = []
    # scaled_mm_v2_constraint: A kept when stride[1]==1 else copied row-major; B kept when
    # stride[0]==1 else copied column-major.
    a_kept, b_kept = a.stride[1] == 1, b.stride[0] == 1
    lda = a.stride[0] if a_kept else ks
    ldb = b.stride[1] if b_kept else ks
    for name, t, kept, ld in (("A", a, a_kept, lda), ("B", b, b_kept, ldb)):
        if kept:
            al = aligned_input(t, assume_aligned_inputs)
            out.append(cond(f"{name} origin aligned", al, f"{name} storage offset {t.storage_offset} B"
                          + (" 16-byte aligned" if al else " not 16-byte aligned"), SRC_ALIGN))
            ok = ld % GPU_ALIGN_BYTES == 0
            out.append(cond(f"{name} leading stride", ok, f"{name} leading stride {ld} B" + (" multiple of 16" if ok
                          else " not a multiple of 16"), f"{SRC_MM}::get_flydsl_mm_template_kwargs"))
        else:
            notes.append(f"{name} has stride {t.stride}: Inductor copies it to "
                         f"{'row' if name == 'A' else 'column'}-major first (scaled_mm_v2_constraint)")
    for name, (r, st, c, isz) in (("A", (m, lda, ks, 1)), ("B", (n, ldb, ks, 1)), ("out", (m, n, n, 2))):
        out.append(span_condition(name, r, st, c, isz))
    out.append(cond("N % 8", n % 8 == 0, f"N={n} % 8 == 0 (16-byte output vectors)" if n % 8 == 0
                  else f"N={n} is not a multiple of 8: no FlyDSL config fits",
                  f"{SRC_HEUR}::get_gemm_configs / is_gemm_config_valid_for_shape -> {SRC_VALID}", "config"))
    out += [Condition("stride fix-up", True, text, f"{SRC_MM}::scaled_mm_v2_constraint", "call") for text in notes]
    return out



_SCALED_KEYS = ("recipe_a", "recipe_b", "swizzle_a", "swizzle_b", "out_dtype", "bias", "use_fast_accum",
                "contraction_dim", "scale_levels")


def judge(call: dict, f, common: dict):
    """``judge`` for ``aten._scaled_mm_v2(a, b, scale_a, scale_b, ...)`` under ``torch.compile``:
    pops ``a``, ``b``, ``scale_a``, ``scale_b`` and the keywords of :func:`scaled_mm_rules`.
    ``common``: the compile route's ``dynamic``, ``autotuning``, ``search_space``, ``assume_aligned_inputs``."""
    a, b = TensorDesc.of(call.pop("a")), TensorDesc.of(call.pop("b"))
    sa, sb = TensorDesc.of(call.pop("scale_a")), TensorDesc.of(call.pop("scale_b"))
    kw = {k: call.pop(k) for k in _SCALED_KEYS if k in call}
    args = {"a": a.text(), "b": b.text(), "scale_a": sa.text(), "scale_b": sb.text(),
            **{k: (v.text() if isinstance(v, TensorDesc) else v) for k, v in kw.items()}, **common}
    return (args, scaled_mm_rules(a, b, sa, sb, **kw, **common), "mm_flydsl MXFP (gemm_gfx950 MXFP kernel)",
            ["eager F.scaled_mm never takes FlyDSL (hipBLASLt); only torch.compile max-autotune does, "
             "with FlyDSL competing against ATen in autotuning"])


#: The catalogue's ``scaling`` option -> the scale recipe it means.
_SCALING_RECIPE = {"block": "blockwise1x32", "tensor": "tensorwise", "row": "rowwise"}


def describe(case, dtype: str, opts: dict, device: str) -> dict:
    """The ``judge`` call for a catalogue case ``MxNxK[:scaling=block|tensor|row]`` in ``mxfp8``,
    ``mxfp4`` (K counted in elements; A [M, K/2] packed pairs) or ``fp8_e4m3``; B is [K, N]
    column-major (NT), scales e8m0 [M, K/32] and [N, K/32]. Options ``a_stride``, ``b_stride``,
    ``a_offset``, ``b_offset``, ``scale_a_offset``, ``scale_b_offset``, ``bias``, ``out_dtype``,
    ``recipe`` (default: the case's ``scaling``), ``swizzle``, ``fast_accum``, ``scale_levels``."""
    import torch

    if dtype not in ("mxfp8", "mxfp4", "fp8_e4m3"):
        raise bad_choice("dtype for scaled_gemm", dtype, ("mxfp8", "mxfp4", "fp8_e4m3"))
    p = case.p
    m, n, k = p["m"], p["n"], p["k"]
    ks = k // (2 if dtype == "mxfp4" else 1)
    a = TensorDesc((m, ks), dtype, opt_stride(opts, "a_stride", None), opt_offset(opts, "a_offset"), device)
    b = TensorDesc((ks, n), dtype, opt_stride(opts, "b_stride", (1, ks)), opt_offset(opts, "b_offset"), device)
    sa = TensorDesc((m, k // 32), torch.float8_e8m0fnu, None, opt_offset(opts, "scale_a_offset"), device)
    sb = TensorDesc((n, k // 32), torch.float8_e8m0fnu, None, opt_offset(opts, "scale_b_offset"), device)
    od = as_dtype(opts.pop("out_dtype", "bf16"))
    recipe = str(opts.pop("recipe", _SCALING_RECIPE.get(p.get("scaling", "block"), "blockwise1x32"))).lower()
    if recipe not in RECIPES:
        raise bad_choice("recipe", recipe, RECIPES)
    sw = str(opts.pop("swizzle", "none")).lower()
    if sw not in SWIZZLES:
        raise bad_choice("swizzle", sw, SWIZZLES)
    bias = TensorDesc((n,), od, None, 0, device) if parse_flag(opts.pop("bias", False)) else None
    return dict(a=a, b=b, scale_a=sa, scale_b=sb, recipe_a=recipe, recipe_b=recipe, swizzle_a=sw, swizzle_b=sw,
                out_dtype=od, bias=bias, use_fast_accum=parse_flag(opts.pop("fast_accum", False)),
                scale_levels=int(opts.pop("scale_levels", 1)))


FLYDSL = FlyDSLPath(
    route="compile",
    path="torch.compile (Inductor) template mm_flydsl (MXFP) for aten._scaled_mm_v2",
    judge=judge,
    describe=describe,
    options=("a_stride", "b_stride", "a_offset", "b_offset", "scale_a_offset", "scale_b_offset", "bias",
             "out_dtype", "recipe", "swizzle", "fast_accum", "scale_levels", "dynamic", "autotuning",
             "search_space", "device"),
    example="32x4096x4096",
    # the MXFP template runs the dense GEMM kernels (gemm_gfx950 with MXFP operands)
    kernels=(),
    xray="flyexplore.ops.scaled_gemm.xray:build",
)
