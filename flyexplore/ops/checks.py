"""Correctness checks shared by the operator modules: elementwise error bounds, NaN/Inf
matching, and the worst row / block beside the global error.

Every operator's ``error(out, ref, case, dtype)`` returns a dict of result columns that already
holds ``accuracy_ok`` (see :data:`CHECK_COLUMNS` for the columns added here). The rule each
family applies is stated in its module and in the row's ``accuracy_rule`` column.

Non-finite values: where the reference is NaN the output must be NaN, where it is +-inf the
output must be the same infinity; such elements count as ``nonfinite_matched``. A NaN or
infinity anywhere else (in the output where the reference is finite, or a finite output where
the reference is not) counts as ``nonfinite_mismatch`` and fails the check. Errors
(``err_rel``, maxima, bound ratios) are taken over the elements finite on both sides.

Bounds use the unit roundoff ``u`` of a format (half its machine epsilon: 2**-8 for bf16,
2**-11 for fp16, 2**-24 for fp32, 2**-53 for fp64) and ``gamma(n, u) = n*u / (1 - n*u)``, the
bound on the relative error of an n-term sum or dot product in any summation order (N. J.
Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002, Lemma 3.1 and
eq. 3.13: ``|fl(A B) - A B| <= gamma_K |A| |B|``). Each bound is multiplied by
:data:`SAFETY` (2): for rounding modes other than round-to-nearest and for the reference's own
rounding.
"""
from __future__ import annotations

import math

#: Factor on every stated bound (round-toward-zero or one extra rounding doubles an error).
SAFETY = 2.0

#: Columns the checks add, in order (after ``accuracy_ok`` in :data:`flyexplore.results.table.COLUMNS`).
CHECK_COLUMNS = ("err_bound_ratio", "err_row_max_rel", "err_block_max_rel", "err_fail_count",
                 "nonfinite_matched", "nonfinite_mismatch", "index_errors", "order_errors",
                 "tie_order_diffs", "accuracy_rule")


def unit_roundoff(dtype) -> float:
    """Unit roundoff u of a torch floating dtype: ``torch.finfo(dtype).eps / 2`` (round to
    nearest)."""
    import torch

    return float(torch.finfo(dtype).eps) / 2


def gamma(n: int, u: float) -> float:
    """``n*u / (1 - n*u)`` (Higham 2002, eq. 3.8); ``inf`` when ``n*u >= 1``."""
    nu = n * u
    return nu / (1 - nu) if nu < 1 else math.inf


def nonfinite_masks(out, ref):
    """``(matched, mismatch, finite)`` boolean tensors of the shape of ``out``/``ref``:
    non-finite in both and equal (NaN with NaN, the same infinity), non-finite on one side only
    or unequal, and finite on both sides."""
    import torch

    of, rf = ~torch.isfinite(out), ~torch.isfinite(ref)
    same = (torch.isnan(out) & torch.isnan(ref)) | (torch.isinf(out) & (out == ref))
    matched = of & rf & same
    return matched, (of | rf) & ~matched, ~of & ~rf


def _worst_rel(d2, r2) -> float:
    """Largest sqrt(d2 / r2) over units given their summed squared differences ``d2`` and
    squared references ``r2``; a unit whose reference is all zero reports sqrt(d2)."""
    import torch

    if d2.numel() == 0:
        return 0.0
    rel = torch.where(r2 > 0, (d2 / torch.where(r2 > 0, r2, torch.ones_like(r2))).sqrt(), d2.sqrt())
    return float(rel.max())


def bounded(out, ref, bound, *, row_len: int | None = None, row_blocks=None, tile: int | None = None,
            rule: str) -> dict:
    """The elementwise check ``|out - ref| <= bound`` (tensors of one shape; ``bound`` >= 0)
    with the error columns.

    Rows are consecutive runs of ``row_len`` elements (default: ``out``'s last dim). Blocks for
    ``err_block_max_rel``: ``row_blocks`` = ``(block id of each row, n_blocks)`` (groups,
    heads), or ``tile`` = t for t x t tiles of a 2-D output; neither: not reported.
    Returns ``err_rel`` and ``err_max_abs`` (over elements finite on both sides),
    ``err_bound_ratio`` (largest |out - ref| / bound; an element with bound 0 counts as 0 when
    exact, inf otherwise), ``err_row_max_rel``, ``err_block_max_rel``, ``err_fail_count``
    (elements over their bound plus non-finite mismatches), ``nonfinite_matched``,
    ``nonfinite_mismatch``, ``accuracy_ok`` (no failing element) and ``accuracy_rule``.
    """
    import torch

    o, r, b = out.double().reshape(-1), ref.double().reshape(-1), bound.double().reshape(-1)
    matched, mismatch, fin = nonfinite_masks(o, r)
    del o
    d = torch.where(fin, (out.double().reshape(-1) - r).abs(), 0.0)
    rz = torch.where(fin, r, 0.0)
    del r, fin
    ratio = torch.where(b > 0, d / torch.where(b > 0, b, 1.0),
                        torch.where(d > 0, math.inf, 0.0).to(d.dtype))
    over = int((ratio > 1).sum())
    n_mis = int(mismatch.sum())
    denom, dn = float(rz.norm()), float(d.norm())
    cols = {
        "err_rel": dn / denom if denom > 0 else dn,
        "err_max_abs": float(d.max()) if d.numel() else 0.0,
        "err_bound_ratio": float(ratio.max()) if ratio.numel() else 0.0,
        "err_fail_count": over + n_mis,
        "nonfinite_matched": int(matched.sum()),
        "nonfinite_mismatch": n_mis,
        "accuracy_ok": over == 0 and n_mis == 0,
        "accuracy_rule": rule,
    }
    del ratio, b
    L = row_len or (out.shape[-1] if out.dim() else 1)
    d2, r2 = (d * d).view(-1, L), (rz * rz).view(-1, L)
    rd, rr = d2.sum(-1), r2.sum(-1)
    cols["err_row_max_rel"] = _worst_rel(rd, rr)
    if row_blocks is not None:
        ids, n = row_blocks
        z = torch.zeros(n, dtype=torch.float64, device=d.device)
        cols["err_block_max_rel"] = _worst_rel(z.index_add(0, ids, rd), z.index_add(0, ids, rr))
    elif tile is not None and d2.numel():
        m, n = d2.shape
        pm, pn = -(-m // tile) * tile, -(-n // tile) * tile
        pad = torch.nn.functional.pad
        td = pad(d2, (0, pn - n, 0, pm - m)).view(pm // tile, tile, pn // tile, tile).sum((1, 3))
        tr = pad(r2, (0, pn - n, 0, pm - m)).view(pm // tile, tile, pn // tile, tile).sum((1, 3))
        cols["err_block_max_rel"] = _worst_rel(td, tr)
    return cols


def fmt_u(u: float) -> str:
    """``2**-8`` for a power of two, else ``%.3g``."""
    e = math.log2(u) if u > 0 else 0
    return f"2**{int(e)}" if u > 0 and e == int(e) else f"{u:.3g}"


#: Extra input rounding of fp32 GEMMs by ``torch.get_float32_matmul_precision()``: "high" lets
#: cuBLAS/hipBLASLt use TF32 (10 explicit mantissa bits, u = 2**-11), "medium" bf16 (u = 2**-8)
#: (torch.set_float32_matmul_precision documentation).
FP32_MATMUL_U = {"highest": 0.0, "high": 2.0 ** -11, "medium": 2.0 ** -8}


def matmul_input_u(dtype) -> float:
    """Relative rounding of each fp32 GEMM operand under the current float32 matmul precision
    (0 for other dtypes)."""
    import torch

    if dtype != torch.float32:
        return 0.0
    return FP32_MATMUL_U.get(torch.get_float32_matmul_precision(), 0.0)


def gemm_bound(ref, abs_product, k: int, out_dtype, in_dtype, extra_terms: int = 2):
    """Elementwise bound on ``|out - ref|`` for a GEMM of reduction length ``k`` whose output is
    rounded to ``out_dtype``:
    ``SAFETY * (u_out |ref| + (gamma(k + extra, u_acc) + gamma(k, u_ref) + 2 u_in) |A||B| + eta)``.

    ``abs_product`` is ``|A| @ |B|`` (in the reference's precision); ``u_acc`` is fp32's (the
    accumulator of fp16/bf16/fp32 GEMMs; fp64 for fp64), ``u_ref`` the reference's, ``u_in``
    the fp32 operand rounding of :func:`matmul_input_u` (TF32; counted again when the
    reference is itself a float32 GEMM); ``extra_terms`` counts scale
    multiplications and similar roundings beyond the k-term dot product; ``eta`` =
    (k + extra) * tiny(acc) + tiny(out), the underflow allowance (Higham 2002, section 2.1).
    Products of fp16/bf16/fp8/MX operands are exact in fp32, so the sum is the only error
    source besides the output rounding (Higham 2002, eq. 3.13)."""
    import torch

    acc = torch.float64 if in_dtype == torch.float64 else torch.float32
    u_out, u_acc, u_ref = unit_roundoff(out_dtype), unit_roundoff(acc), unit_roundoff(ref.dtype)
    u_in = matmul_input_u(in_dtype)
    if ref.dtype == torch.float32:        # a float32 reference (GPU) is rounded to TF32 as well
        u_in += matmul_input_u(torch.float32)
    c = gamma(k + extra_terms, u_acc) + gamma(k, u_ref) + 2 * u_in
    eta = (k + extra_terms) * float(torch.finfo(acc).tiny) + float(torch.finfo(out_dtype).tiny)
    bound = SAFETY * (u_out * ref.abs() + c * abs_product + eta)
    rule = (f"elementwise |out-ref| <= {SAFETY:g}*(u_out|ref| + (gamma_{{K+{extra_terms}}}(u_acc)"
            f" + gamma_K(u_ref){' + 2u_in' if u_in else ''})|A||B|), u_out={fmt_u(u_out)}, "
            f"u_acc={fmt_u(u_acc)}, u_ref={fmt_u(u_ref)}{f', u_in={fmt_u(u_in)}' if u_in else ''}, "
            f"K={k} (Higham 2002 eq. 3.13)")
    return bound, rule


def with_tol(cols: dict, tol: float) -> dict:
    """Add ``err_tol`` to ``cols`` and require ``err_rel <= err_tol`` as well (the global rule
    used before the elementwise checks; kept, so that nothing passes now that failed before)."""
    ok = cols["err_rel"] <= tol + 1e-12
    cols["accuracy_ok"] = bool(cols["accuracy_ok"] and ok)
    cols["err_tol"] = tol
    cols["accuracy_rule"] += f"; and err_rel <= {tol:g}"
    return cols
