"""Dense GEMM's FlyDSL path: the Inductor template ``mm_flydsl`` for ``aten.mm`` in torch 2.15.

Rules re-derived (not copied) from ``torch/_inductor/kernel/mm.py::get_flydsl_mm_template_kwargs``,
the config filter ``torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs`` +
``is_gemm_config_valid_for_shape`` (-> the vendored ``gemm_gfx950.py::make_gemm_param_and_validate``;
for torch 2.15's config lists: N % 8 == 0, and M % 8 == 0 when A is column-major), and input
alignment as Inductor decides it for graph inputs (``torch/_inductor/graph.py`` ``unaligned_buffers``).
Operands are judged as ``tuned_mm`` holds them after ``torch/_inductor/kernel/mm_common.py::mm_args``
(``realize_inputs`` -> ``torch/_inductor/ir.py::ExternKernel.require_stride1``): one with no unit
stride is a fresh contiguous copy (:func:`as_mm_args_leaves`).
Checked against torch's own functions in ``tests/ops/test_explain_agreement.py``. Registered as
``GEMM.flydsl`` (:mod:`flyexplore.ops.gemm.operator`).
"""
from __future__ import annotations

from flyexplore.ops.base import FlyDSLPath, KernelPattern
from flyexplore.parsing import parse_flag
from flyexplore.world.conditions import (
    GPU_ALIGN_BYTES,
    SRC_ALIGN,
    SRC_GATE,
    SRC_HEUR,
    SRC_MM,
    SRC_VALID,
    Condition,
    TensorDesc,
    aligned_input,
    as_dtype,
    cond,
    opt_offset,
    opt_stride,
    short_dtype,
    span_condition,
)


SRC_STRIDE1 = ("torch/_inductor/kernel/mm_common.py::mm_args -> torch/_inductor/select_algorithm.py::realize_inputs "
               "-> torch/_inductor/ir.py::ExternKernel.require_stride1")


def as_mm_args_leaves(t: TensorDesc) -> TensorDesc:
    """``t`` as Inductor's GEMM lowerings hold it after ``mm_args`` / ``grouped_mm_args``
    (``torch/_inductor/kernel/mm_common.py::mm_args``, ``torch/_inductor/kernel/mm_grouped.py::
    grouped_mm_args``): they realize each operand with ``realize_inputs``, which keeps a tensor
    that has some stride equal to 1 (or no dimensions) and otherwise copies it into a new buffer
    (``torch/_inductor/ir.py::ExternKernel.require_stride1`` -> ``copy_input``): row-major
    strides, storage offset 0, a buffer of Inductor's own (so aligned). ``t`` itself when kept."""
    t = TensorDesc.of(t)
    if t.ndim == 0 or 1 in t.stride:
        return t
    strides, acc = [], 1
    for size in reversed(t.shape):   # FlexibleLayout.contiguous_strides: products of the later sizes, 0 kept
        strides.append(acc)
        acc *= size
    return TensorDesc(t.shape, t.dtype, tuple(reversed(strides)), 0, t.device)


def stride1_condition(name: str, given: TensorDesc, held: TensorDesc, via: str = "mm_args",
                      source: str = SRC_STRIDE1) -> Condition:
    """The condition (always holding) that says operand ``name`` was copied by ``require_stride1``
    in ``via`` (``mm_args`` for mm, ``grouped_mm_args`` for grouped mm; ``source`` cites it), and
    what the later rules judge instead (``held``, from :func:`as_mm_args_leaves`)."""
    return cond(f"{name} copied (no unit stride)", True,
                f"{name} stride {given.stride}" + (f" offset {given.storage_offset}" if given.storage_offset else "")
                + f" has no stride equal to 1: Inductor's {via} copies it into a contiguous buffer "
                f"(stride {held.stride}, offset 0, aligned) before the FlyDSL check; judged on that copy",
                source)


def _mm_layout(t: TensorDesc, first_row: bool) -> str | None:
    """``"row"`` / ``"col"`` / ``None`` in the order get_flydsl_mm_template_kwargs tests them
    (A: stride[1]==1 first; B: stride[0]==1 first)."""
    if t.ndim != 2:
        return None
    order = (("row", 1), ("col", 0)) if first_row else (("col", 0), ("row", 1))
    for name, d in order:
        if t.stride[d] == 1:
            return name
    return None


def mm_rules(a, b, *, out_dtype=None, bias: bool = False, dynamic: bool = False,
             autotuning: bool = False, search_space: str = "DEFAULT",
             assume_aligned_inputs: bool = False) -> list[Condition]:
    """Call and config conditions of the FlyDSL dense GEMM template for ``aten.mm(a, b)``
    under torch.compile (``torch/_inductor/kernel/mm.py::tuned_mm`` -> ``get_flydsl_mm_template_kwargs``),
    ``a`` [M, K], ``b`` [K, N] as aten.mm receives them (``x @ w.T`` gives ``b`` = ``w.T``,
    column-major). An operand with no unit stride is judged as the contiguous copy ``mm_args``
    makes of it (:func:`as_mm_args_leaves`), with a condition saying so."""
    a, b = TensorDesc.of(a), TensorDesc.of(b)
    S = f"{SRC_MM}::get_flydsl_mm_template_kwargs"
    out = [cond("no bias", not bias, "no bias (aten.mm)" if not bias else
              "bias given: addmm / F.linear with bias has no FlyDSL template", f"{SRC_MM}::tuned_addmm"),
           cond("out_dtype", out_dtype is None, "no out_dtype" if out_dtype is None
              else "out_dtype given (aten.mm.dtype): FlyDSL only for plain mm", f"{SRC_MM}::tuned_mm"),
           cond("static", not dynamic, "static shapes" if not dynamic else "dynamic shapes: FlyDSL needs static shapes", S)]
    two_d = a.ndim == 2 and b.ndim == 2
    out.append(cond("2-D", two_d, "A and B 2-D" if two_d else f"A is {a.ndim}-D, B is {b.ndim}-D: aten.mm takes 2-D", S))
    if not two_d:
        return out
    for name, given in (("A", a), ("B", b)):
        held = as_mm_args_leaves(given)
        if held is not given:
            out.append(stride1_condition(name, given, held))
    a, b = as_mm_args_leaves(a), as_mm_args_leaves(b)
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    out.append(cond("K agrees", b.shape[0] == k, f"A [{m}, {k}] x B [{b.shape[0]}, {n}]"
                  + ("" if b.shape[0] == k else ": inner dims differ (aten.mm raises)"), "aten.mm"))
    out.append(cond("non-empty", m * n > 0, f"output [{m}, {n}] non-empty" if m * n else "empty output", f"{SRC_MM}::_is_static_problem"))
    dt = short_dtype(a.dtype)
    dt_ok = dt in ("fp16", "bf16")
    out.append(cond("dtype", dt_ok, f"dtype {dt}" + (" ok" if dt_ok else ": FlyDSL GEMM takes fp16/bf16"), SRC_GATE))
    out.append(cond("dtypes match", b.dtype == a.dtype, f"B dtype {short_dtype(b.dtype)}" + (" == A dtype" if b.dtype == a.dtype
               else f" differs from A ({dt})"), S))
    out.append(cond("GPU", a.device_type == "cuda", f"inputs on {a.device}", "torch/_inductor/utils.py::_use_template_for_gpu"))
    la, lb = _mm_layout(a, True), _mm_layout(b, False)
    out.append(cond("A layout", la is not None, f"A {'row' if la == 'row' else 'column'}-major" if la else
                  f"A stride {a.stride}: neither row- nor column-major", S))
    out.append(cond("B layout", lb is not None, f"B {'row' if lb == 'row' else 'column'}-major" + (" (NT: w.T of a row-major w)" if lb == "col" else "")
                  if lb else f"B stride {b.stride}: neither row- nor column-major", S))
    for name, t, lay in (("A", a, la), ("B", b, lb)):
        al = aligned_input(t, assume_aligned_inputs)
        out.append(cond(f"{name} origin aligned", al, f"{name} storage offset {t.storage_offset} x {t.itemsize} B"
                      + (" is 16-byte aligned" if al else " is not 16-byte aligned"), SRC_ALIGN))
        if lay is not None:
            ld = t.stride[0] if lay == "row" else t.stride[1]
            ok = (ld * t.itemsize) % GPU_ALIGN_BYTES == 0
            out.append(cond(f"{name} leading stride", ok, f"{name} leading stride {ld} x {t.itemsize} B"
                          + (" is a multiple of 16 B" if ok else " is not a multiple of 16 B"), S))
    out.append(cond("K % 32", k % 32 == 0, f"K={k} % 32 == 0" if k % 32 == 0 else f"K={k} is not a multiple of 32", S))
    if la is not None and lb is not None:
        ia = a.itemsize
        # (rows, leading stride, cols) per operand, as get_flydsl_mm_template_kwargs builds them.
        spans = [("A", (k, a.stride[1], m) if la == "col" else (m, a.stride[0], k), ia),
                 ("B", (n, b.stride[1], k) if lb == "col" else (k, b.stride[0], n), ia),
                 ("out", (m, n, n), ia)]
        for name, (r, st, c), isz in spans:
            out.append(span_condition(name, r, st, c, isz))
    out.append(cond("N % 8", n % 8 == 0, f"N={n} % 8 == 0 (16-byte output vectors)" if n % 8 == 0
                  else f"N={n} is not a multiple of 8: no FlyDSL config fits (16-byte output vectors)",
                  f"{SRC_HEUR}::is_gemm_config_valid_for_shape -> {SRC_VALID}", "config"))
    if la == "col":
        out.append(cond("M % 8 (A column-major)", m % 8 == 0, f"A column-major needs M % 8 == 0: M={m}",
                      SRC_VALID, "config"))
    return out



def judge(call: dict, f, common: dict):
    """``judge`` for ``aten.mm(a, b)`` under ``torch.compile``: pops ``a``, ``b``, ``out_dtype``,
    ``bias``. ``common``: the compile route's ``dynamic``, ``autotuning``, ``search_space``, ``assume_aligned_inputs``."""
    a, b = TensorDesc.of(call.pop("a")), TensorDesc.of(call.pop("b"))
    od, bias = call.pop("out_dtype", None), call.pop("bias", False)
    args = {"a": a.text(), "b": b.text(), "bias": bias, "out_dtype": od, **common}
    return args, mm_rules(a, b, out_dtype=od, bias=bias, **common), "mm_flydsl (gemm_gfx950 kernel)", []


def describe(case, dtype: str, opts: dict, device: str) -> dict:
    """The ``judge`` call for a catalogue case ``MxNxK[:NN|NT|TN|TT]`` (``T``: stored
    transposed); options ``a_stride``, ``b_stride``, ``a_offset``, ``b_offset``, ``bias``,
    ``out_dtype``."""
    p = case.p
    m, n, k, lay = p["m"], p["n"], p["k"], p["layout"]
    a = TensorDesc((m, k), dtype, opt_stride(opts, "a_stride", (k, 1) if lay[0] == "N" else (1, m)),
                   opt_offset(opts, "a_offset"), device)
    b = TensorDesc((k, n), dtype, opt_stride(opts, "b_stride", (n, 1) if lay[1] == "N" else (1, k)),
                   opt_offset(opts, "b_offset"), device)
    out = dict(a=a, b=b, bias=parse_flag(opts.pop("bias", False)))
    if "out_dtype" in opts:
        out["out_dtype"] = as_dtype(opts.pop("out_dtype"))
    return out


_GEMM_OPTIONS = ("a_stride", "b_stride", "a_offset", "b_offset", "bias", "out_dtype", "dynamic", "autotuning",
                 "search_space", "device")
FLYDSL = FlyDSLPath(
    route="compile",
    path="torch.compile (Inductor) template mm_flydsl for aten.mm",
    judge=judge,
    describe=describe,
    options=_GEMM_OPTIONS,
    example="16x28672x4096:NT",
    kernels=(KernelPattern(r"^gemm_gfx950_kernel(_\d+)?$", "FlyDSL GEMM (Inductor mm_flydsl, vendored gemm_gfx950.py)"),
             KernelPattern(r"^gemm_hti_gfx950_kernel(_\d+)?$", "FlyDSL GEMM half-tile-interleaved (Inductor mm_flydsl)")),
    xray="flyexplore.ops.gemm.xray:build",
)
