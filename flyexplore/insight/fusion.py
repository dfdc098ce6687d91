"""Inductor's post-grad ``add(mm(a, b), inp) -> addmm(inp, a, b)`` fusion, applied as the compiled view is recorded.

torch 2.15 ``torch/_inductor/fx_passes/post_grad.py`` (``addmm`` with ``is_valid_addmm_fusion``)
fuses an ``aten.add`` whose operand is the very output of an ``aten.mm`` (no view between) and
whose other operand broadcasts to the output's shape into the ``aten.addmm`` Inductor lowers
(``addmm`` has no FlyDSL template). On a GPU a bias-like other operand (a broadcast row) is left
unfused while every user of the sum is pointwise or a view (``should_prefer_unfused_addmm``), and
fused once a user is not; on the CPU it fuses. The fused call's note says which case it is
(:data:`RESIDUAL_NOTE`: the other operand has the output's full shape, as a residual stream has;
:data:`BIAS_NOTE`: a broadcast bias), and :func:`fused_reason` says why it has no FlyDSL template.

In the eager view the same rule marks the ``aten.mm`` calls a compiled run would fuse
(``Call.fused == "addmm"``, the eager calls themselves unchanged), so that the ``torch.compile``
what-if (:func:`flyexplore.insight.coverage.what_if`) counts what the compiled view shows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from flyexplore.insight.calls import _VIEW_OPS

if TYPE_CHECKING:
    from flyexplore.insight.capture import _Recorder


#: ``aten.add`` overloads the compiled view fuses with an ``aten.mm`` operand into ``aten.addmm``
#: (module docstring).
_ADDS = ("aten.add.Tensor", "aten.add_.Tensor")


def _expandable(shape, to) -> bool:
    """``shape`` broadcasts to ``to`` (torch's ``is_expandable_to``: right-aligned, each dim equal
    or 1)."""
    if len(shape) > len(to):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(to)))


def _bias_like(inp, out) -> bool:
    """``inp`` broadcasts over ``out`` rather than matching it (another rank, a 1 against a larger
    dim, or a zero stride): torch 2.15 ``post_grad.py::_is_bias_like_addmm_input``, re-derived."""
    if inp.dim() != out.dim():
        return True
    if tuple(inp.shape) != tuple(out.shape):
        return any(a == 1 and b != 1 for a, b in zip(inp.shape, out.shape))
    return any(st == 0 for st in inp.stride())


def _fuse_addmm(rec: _Recorder, func, args, kwargs, out) -> str | None:
    """In the compiled view, record ``add(mm(a, b), inp)`` as the ``aten.addmm(inp, a, b)``
    Inductor's post-grad pass makes of it (module docstring). Returns ``"fused"``, ``"pending"``
    (a bias-like ``inp`` on a GPU: fused only if a later user of the sum is not pointwise,
    :func:`_use_of_pending`) or ``None``."""
    import torch

    if rec.mm_out is None or kwargs.get("alpha", 1) != 1 or len(args) < 2:
        return None
    x, y = args[0], args[1]
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return None
    got = rec.mm_out.get(x)
    mm_t, inp = (x, y) if got is not None else (y, x)
    got = got if got is not None else rec.mm_out.get(y)
    if got is None:
        return None
    idx, m1, m2 = got
    if inp.dtype != mm_t.dtype or m1.dtype != inp.dtype or m2.dtype != inp.dtype or inp.device != mm_t.device:
        return None
    if not _expandable(tuple(inp.shape), tuple(mm_t.shape)):
        return None
    rec.mm_out.pop(mm_t, None)
    if mm_t.device.type != "cpu" and _bias_like(inp, mm_t):
        # on a GPU Inductor keeps a bias add apart when every user of the sum is pointwise
        # (post_grad.py::should_prefer_unfused_addmm): decided by the sum's users
        rec.pending_bias[out] = (idx, inp, m1, m2)
        return "pending"
    _record_addmm(rec, idx, inp, m1, m2, out)
    return "fused"


#: The notes of a fused ``aten.addmm`` (compiled view), by what the add brought: the other operand
#: has the ``mm`` output's full shape (a residual stream, another expert's output) or broadcasts
#: over it (a bias row). Both say "post-grad", which the compiled view's assumption counts.
RESIDUAL_NOTE = ("residual add fused into addmm by Inductor's post-grad pass "
                 "(torch/_inductor/fx_passes/post_grad.py::addmm)")
BIAS_NOTE = "bias add fused into addmm by Inductor's post-grad pass (torch/_inductor/fx_passes/post_grad.py::addmm)"
#: The note of an eager ``aten.mm`` that a ``torch.compile`` run fuses with its add (``Call.fused``).
EAGER_NOTE = ("under torch.compile this mm and the add of its output are one aten.addmm (Inductor's post-grad "
              "addmm fusion, torch/_inductor/fx_passes/post_grad.py::addmm)")
#: Why a fused addmm has no FlyDSL template, by note: the verdict's reason in place of "bias given".
FUSED_REASONS = {
    RESIDUAL_NOTE: "residual add fused into addmm (Inductor post-grad addmm fusion): addmm has no FlyDSL template",
    BIAS_NOTE: "bias add fused into addmm (Inductor post-grad addmm fusion): addmm has no FlyDSL template",
}


def fused_reason(note: str) -> str | None:
    """Why a GEMM made by the post-grad addmm fusion has no FlyDSL template, from a call's note
    (:data:`FUSED_REASONS`; an eager mm noted :data:`EAGER_NOTE`, by the add its note names);
    ``None`` for any other call."""
    for k, why in FUSED_REASONS.items():
        if k in note:
            return why
    if EAGER_NOTE in note:
        return FUSED_REASONS[BIAS_NOTE if "(bias add)" in note else RESIDUAL_NOTE]
    return None


def _record_addmm(rec: _Recorder, idx: int, inp, m1, m2, out) -> None:
    """Record the fused ``aten.addmm(inp, m1, m2)`` under the module that made the ``mm`` (row
    ``idx``), which loses that call (a row whose calls are all fused is dropped). In the eager
    view (``rec.mark_fusion``) nothing is fused: the ``mm`` is recorded again as itself, marked
    ``fused="addmm"`` with :data:`EAGER_NOTE` (a residual or bias add said in its note), so that
    the ``torch.compile`` what-if judges it as the compiled view does."""
    mm_call = rec.calls[idx]
    rec.counts[idx] -= 1
    rec.stack.append((mm_call.module, mm_call.module_type))
    bias = _bias_like(inp, out)
    try:
        if rec.mark_fusion:
            rec.add("aten.mm.default", [("self", m1), ("mat2", m2)], out,
                    note=f"{EAGER_NOTE} ({'bias' if bias else 'residual'} add)", fused="addmm")
        else:
            rec.add("aten.addmm.default", [("self", inp), ("mat1", m1), ("mat2", m2)], out,
                    note=BIAS_NOTE if bias else RESIDUAL_NOTE)
    finally:
        rec.stack.pop()


#: Casts that are no-ops when the dtype does not change (Inductor's post-grad ``remove_noop_ops``
#: drops them): a pending bias add's sum is followed through them (:func:`_follow_noop_cast`).
_NOOP_CASTS = frozenset({"aten.to.dtype", "aten._to_copy.default", "prims.convert_element_type.default",
                         "aten.to.dtype_layout"})


def _follow_noop_cast(rec: _Recorder, name: str, args, out) -> None:
    """The output of a same-dtype cast of a pending bias add's sum stands for the sum."""
    import torch

    if not rec.pending_bias or name not in _NOOP_CASTS or not args or not isinstance(out, torch.Tensor):
        return
    src = args[0]
    if isinstance(src, torch.Tensor) and src in rec.pending_bias and src.dtype == out.dtype:
        rec.pending_bias[out] = rec.pending_bias[src]
        if id(src) in rec.add_index:
            rec.add_index[id(out)] = rec.add_index[id(src)]


def _use_of_pending(rec: _Recorder, func, args) -> None:
    """A call using the sum of a pending bias add (:func:`_fuse_addmm`): a user that is neither
    pointwise (``torch.Tag.pointwise``) nor a view makes Inductor fuse it after all: the ``mm``
    becomes ``addmm`` and the add's row loses that call."""
    import torch

    if not rec.pending_bias:
        return
    if str(func) in _NOOP_CASTS:   # a cast to the same dtype (Inductor removes it as a no-op): see through it
        return
    pointwise = torch.Tag.pointwise in getattr(func, "tags", ()) or str(func) in _VIEW_OPS
    for a in args:
        if isinstance(a, torch.Tensor) and a in rec.pending_bias and not pointwise:
            entry = rec.pending_bias.pop(a)
            for other in [k for k, v in rec.pending_bias.items() if v is entry]:   # its no-op casts
                del rec.pending_bias[other]
            idx, inp, m1, m2 = entry
            add_idx = rec.add_index.pop(id(a), None)
            _record_addmm(rec, idx, inp, m1, m2, a)
            if add_idx is not None and not rec.mark_fusion:
                rec.counts[add_idx] -= 1
