"""Grouped GEMM's FlyDSL path: the Inductor template ``grouped_gemm_flydsl`` for ``aten._grouped_mm``.

Rules re-derived (not copied) from ``torch/_inductor/kernel/mm_grouped.py::
use_flydsl_grouped_mm_template`` and ``get_flydsl_grouped_mm_template_kwargs`` (config filter
``heuristics/template/flydsl.py::is_grouped_gemm_config_valid_for_shape``: N % 128 == 0 with
FlyDSL autotuning off, N % 64 == 0 with it on). Operands are judged as ``_tuned_grouped_mm_common``
holds them after ``grouped_mm_args`` (``realize_inputs`` -> ``torch/_inductor/ir.py::
ExternKernel.require_stride1``: one with no unit stride becomes a contiguous copy, as for dense
mm: :func:`flyexplore.ops.gemm.flydsl.as_mm_args_leaves`). Checked against torch's own functions in
``tests/ops/test_explain_agreement.py``. Registered as ``GROUPED_GEMM.flydsl``.

Also here: a catalogue case's groups (:func:`parse_ms`, :func:`group_sizes`, :func:`total_rows`),
which the operator's ``make_inputs`` and :func:`describe` both read, so that the explainer judges
the A the sweep passes ([total_M, K]); the operator module imports this one, so they live here.
"""
from __future__ import annotations

from flyexplore.errors import UsageError
from flyexplore.ops.base import FlyDSLPath, KernelPattern
from flyexplore.ops.gemm.flydsl import as_mm_args_leaves, stride1_condition
from flyexplore.parsing import parse_flag
from flyexplore.world.conditions import (
    SRC_ALIGN,
    SRC_GMM,
    SRC_HEUR,
    SRC_MM,
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

# -- a catalogue case's groups (here, where both the operator and describe read them) ------------

def parse_ms(text: str) -> list[int]:
    """``ms=r0/r1/...`` -> the row counts ``[r0, r1, ...]``. Raises :class:`UsageError` naming
    the text for a non-integer or negative count."""
    parts = [p.strip() for p in str(text).split("/")]
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"grouped_gemm ms={text!r} must be '/'-separated row counts, "
                         "e.g. ms=1024/0/512/2048") from None
    if any(v < 0 for v in vals):
        raise UsageError(f"grouped_gemm ms={text!r} has a negative row count")
    return vals


def group_sizes(case) -> list[int]:
    """Rows of each group: ``ms`` when given, else G times M."""
    return parse_ms(case["ms"]) if case["ms"] else [case["m"]] * case["g"]


def total_rows(case) -> int:
    """Rows of A as the sweep passes it (total_M): the sum of :func:`group_sizes`."""
    return sum(group_sizes(case))


# -- the rules --------------------------------------------------------------------------------------

SRC_STRIDE1_GROUPED = ("torch/_inductor/kernel/mm_grouped.py::grouped_mm_args -> "
                       "torch/_inductor/select_algorithm.py::realize_inputs -> "
                       "torch/_inductor/ir.py::ExternKernel.require_stride1")

def grouped_mm_rules(a, b, offs=True, *, bias: bool = False, scaled: bool = False, out_dtype=None,
                     dynamic: bool = False, autotuning: bool = False, search_space: str = "DEFAULT",
                     assume_aligned_inputs: bool = False) -> list[Condition]:
    """Call and config conditions of the FlyDSL grouped GEMM template for
    ``aten._grouped_mm(a, b, offs)`` under torch.compile: ``a`` [total_M, K], ``b`` [G, K, N],
    ``offs`` int32 [G] cumulative row ends (``torch/_inductor/kernel/mm_grouped.py::tuned_grouped_mm``
    -> ``use_flydsl_grouped_mm_template`` + ``get_flydsl_grouped_mm_template_kwargs``). An
    operand with no unit stride is judged as the contiguous copy ``grouped_mm_args`` makes of it
    (``torch/_inductor/kernel/mm_grouped.py::grouped_mm_args`` -> ``realize_inputs`` ->
    ``torch/_inductor/ir.py::ExternKernel.require_stride1``), with a condition saying so."""
    given = TensorDesc.of(a), TensorDesc.of(b)
    a, b = (as_mm_args_leaves(t) for t in given)
    copied = [stride1_condition(name, g, h, "grouped_mm_args", SRC_STRIDE1_GROUPED)
              for name, g, h in zip("AB", given, (a, b)) if h is not g]
    S = f"{SRC_GMM}::use_flydsl_grouped_mm_template"
    out = [cond("not scaled", not scaled, "unscaled" if not scaled else "scaled grouped mm has no FlyDSL template", S),
           cond("static", not dynamic, "static shapes" if not dynamic else "dynamic shapes: FlyDSL needs static shapes",
              f"{SRC_GMM}::get_flydsl_grouped_mm_template_kwargs")]
    shape_ok = a.ndim == 2 and b.ndim == 3 and offs is not None and offs is not False
    got = f"A {a.ndim}-D, B {b.ndim}-D, offs {'given' if offs is not None and offs is not False else 'none'}"
    out.append(cond("2-D A, 3-D B, offs", shape_ok, "A 2-D [total_M, K], B 3-D [G, K, N], offs given" if shape_ok
                  else f"needs A 2-D, B 3-D and offs (got {got})", S))
    out.append(cond("no bias", not bias, "no bias" if not bias else "bias given: FlyDSL grouped GEMM takes none", S))
    if not shape_ok:
        return out
    out += copied
    m, k = a.shape
    g, kb, n = b.shape
    out.append(cond("K agrees", kb == k, f"K {k} == B's K {kb}" if kb == k else f"A's K {k} != B's K {kb}", "aten._grouped_mm"))
    out.append(cond("non-empty", m * n > 0, f"output [{m}, {n}] non-empty" if m * n else "empty output", f"{SRC_MM}::_is_static_problem"))
    od = as_dtype(out_dtype) if out_dtype is not None else a.dtype
    dt = short_dtype(a.dtype)
    ok = a.dtype == b.dtype == od and dt in ("fp16", "bf16")
    out.append(cond("dtype", ok, f"A {dt}, B {short_dtype(b.dtype)}, out {short_dtype(od)}" + (" ok" if ok else
                  ": all three must be the same, fp16 or bf16"), S))
    out.append(cond("GPU", a.device_type == "cuda", f"inputs on {a.device}", "torch/_inductor/utils.py::_use_template_for_gpu"))
    a_ok = a.stride[-1] == 1 and a.stride[-2] == k
    out.append(cond("A contiguous", a_ok, "A row-major [M, K] with stride (K, 1)" if a_ok
                  else f"A stride {a.stride} must be ({k}, 1)", S))
    b_ok = b.stride[-1] == 1 and b.stride[-2] == n and b.stride[-3] == k * n
    out.append(cond("B contiguous", b_ok, "B contiguous [G, K, N]" if b_ok
                  else f"B stride {b.stride} must be ({k * n}, {n}, 1) (row-major [G, K, N])", S))
    for name, t in (("A", a), ("B", b)):
        al = aligned_input(t, assume_aligned_inputs)
        out.append(cond(f"{name} origin aligned", al, f"{name} storage offset {t.storage_offset} x {t.itemsize} B"
                      + (" is 16-byte aligned" if al else " is not 16-byte aligned"), SRC_ALIGN))
    out.append(cond("N % 32", n % 32 == 0, f"N={n} % 32 == 0" if n % 32 == 0 else f"N={n} is not a multiple of 32", S))
    out.append(cond("K % 32", k % 32 == 0, f"K={k} % 32 == 0" if k % 32 == 0 else f"K={k} is not a multiple of 32", S))
    isz = a.itemsize
    for name, (r, st, c) in (("A", (m, k, k)), ("B", (g, k * n, k * n)), ("out", (m, n, n))):
        out.append(span_condition(name, r, st, c, isz))
    tile = 64 if autotuning else 128
    why = ("FlyDSL autotuning on: smallest TILE_N of the candidate configs is 64" if autotuning
           else "FlyDSL autotuning off: the one baseline config has TILE_N 128")
    out.append(cond(f"N % {tile}", n % tile == 0, f"N={n} % {tile} == 0 ({why})" if n % tile == 0
                  else f"N={n} is not a multiple of {tile}: no FlyDSL grouped config fits ({why})",
                  f"{SRC_HEUR}::get_grouped_gemm_configs / is_grouped_gemm_config_valid_for_shape", "config"))
    return out



def judge(call: dict, f, common: dict):
    """``judge`` for ``aten._grouped_mm(a, b, offs)`` under ``torch.compile``: pops ``a``,
    ``b``, ``offs``, ``bias``, ``scaled``, ``out_dtype``. ``common``: the compile route's ``dynamic``, ``autotuning``, ``search_space``, ``assume_aligned_inputs``."""
    a, b = TensorDesc.of(call.pop("a")), TensorDesc.of(call.pop("b"))
    offs = call.pop("offs", True)
    kw = dict(bias=call.pop("bias", False), scaled=call.pop("scaled", False), out_dtype=call.pop("out_dtype", None))
    args = {"a": a.text(), "b": b.text(), "offs": TensorDesc.of(offs).text() if hasattr(offs, "shape") else offs,
            **kw, **common}
    return (args, grouped_mm_rules(a, b, offs, **kw, **common),
            "grouped_gemm_flydsl (grouped gemm_gfx950 kernel)", [])


def describe(case, dtype: str, opts: dict, device: str) -> dict:
    """The ``judge`` call for a catalogue case ``GxMxNxK[:layout=NT,ms=..]``, with the tensors the
    sweep passes (``flyexplore.ops.grouped_gemm.operator``'s ``make_inputs``): A [total_M, K]
    row-major, total_M the sum of the group sizes (G x M, or the sum of a ragged ``ms``); B
    [G, K, N] (``NT``: ``w.transpose(-2, -1)`` of a [G, N, K] w, strides (N*K, 1, K)); int32
    offs [G]. Options ``a_stride``, ``b_stride``, ``a_offset``, ``b_offset``, ``bias``,
    ``scaled``, ``out_dtype``, ``offs``."""
    import torch

    p = case.p
    g, n, k = p["g"], p["n"], p["k"]
    b_default = (k * n, 1, k) if p.get("layout") == "NT" else None
    a = TensorDesc((total_rows(case), k), dtype, opt_stride(opts, "a_stride", None), opt_offset(opts, "a_offset"), device)
    b = TensorDesc((g, k, n), dtype, opt_stride(opts, "b_stride", b_default), opt_offset(opts, "b_offset"), device)
    offs = TensorDesc((g,), torch.int32, None, 0, device) if parse_flag(opts.pop("offs", True)) else None
    out = dict(a=a, b=b, offs=offs, bias=parse_flag(opts.pop("bias", False)),
               scaled=parse_flag(opts.pop("scaled", False)))
    if "out_dtype" in opts:
        out["out_dtype"] = as_dtype(opts.pop("out_dtype"))
    return out


def case_notes(case) -> list[str]:
    """What of a grouped case the rules do not read: the ragged group sizes. One note for a
    ragged case (``ms``), naming the A it is judged on (:func:`describe`), none otherwise."""

    p = case.p
    if not p.get("ms"):
        return []
    sizes = group_sizes(case)
    total = sum(sizes)
    return [(f"ragged groups ms={p['ms']}: judged on A [{total}, {p['k']}], the total_M = sum(ms) rows the "
             f"sweep passes ({sum(1 for s in sizes if s)} of {p['g']} groups non-empty); the rules read only "
             "shapes and strides, not the group sizes")]


FLYDSL = FlyDSLPath(
    route="compile",
    path="torch.compile (Inductor) template grouped_gemm_flydsl for aten._grouped_mm",
    judge=judge,
    describe=describe,
    options=("a_stride", "b_stride", "a_offset", "b_offset", "bias", "scaled", "out_dtype", "offs",
             "dynamic", "autotuning", "search_space", "device"),
    example="8x512x4096x4096",
    kernels=(KernelPattern(r"^gemm_gfx950_grouped_kernel(_\d+)?$", "FlyDSL grouped GEMM (Inductor grouped_gemm_flydsl)"),
             KernelPattern(r"^gemm_hti_gfx950_grouped_kernel(_\d+)?$", "FlyDSL grouped GEMM half-tile-interleaved")),
    xray="flyexplore.ops.grouped_gemm.xray:build",
    case_notes=case_notes,
)
