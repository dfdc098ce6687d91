"""GEMM in a captured model step: ``aten.mm`` / ``aten.addmm`` / ``aten.bmm`` / ``aten.baddbmm``.

The compiled view decides it: FlyDSL's dense GEMM is the Inductor template ``mm_flydsl``
offered by ``tuned_mm`` (torch 2.15 ``torch/_inductor/kernel/mm.py``), a candidate only under
``torch.compile`` with max-autotune and FLYDSL in ``max_autotune_gemm_backends``. ``addmm`` is
judged as a GEMM with a bias (the template takes none); ``bmm`` / ``baddbmm`` have no FlyDSL
template (``torch/_inductor/kernel/bmm.py::tuned_bmm`` offers none).
"""
from __future__ import annotations

from flyexplore.ops.base import ModelCall, ModelHooks, io_bytes

MM, ADDMM, BMM, BADDBMM = "aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"


def operands(c):
    """A [M, K] and B [K, N] of a captured ``mm`` / ``addmm`` (whose first argument is the bias),
    or of ``bmm`` / ``baddbmm`` ([B, M, K] x [B, K, N])."""
    if c.op in (ADDMM, BADDBMM):
        return c.arg("mat1") if c.op == ADDMM else c.arg("batch1"), c.arg("mat2") if c.op == ADDMM else c.arg("batch2")
    return c.arg("self"), c.arg("mat2")


def judge(c, view: str):
    """:attr:`ModelHooks.judge` (module docstring)."""
    if c.op in (BMM, BADDBMM):
        return ModelCall(status="no FlyDSL path", category="no FlyDSL path: bmm",
                         reason="no FlyDSL path: FlyDSL's dense template is for aten.mm; bmm/baddbmm have none "
                                "(torch 2.15: torch/_inductor/kernel/bmm.py::tuned_bmm offers no FlyDSL template)")
    if view != "compiled":
        return ModelCall(status="not eligible", category="gemm: eager (FlyDSL GEMMs need torch.compile)",
                         reason="not eligible in eager: FlyDSL's GEMM is an Inductor template, a candidate only under "
                                "torch.compile with max-autotune and FLYDSL in max_autotune_gemm_backends "
                                "(the compiled view judges it)")
    a, b = operands(c)
    return ModelCall(args={"a": a, "b": b, "bias": c.op == ADDMM})


def cost(c):
    """``mm`` [M, K] x [K, N]: 2MNK FLOPs; ``addmm`` adds MN (the bias); ``bmm`` [B, M, K] x
    [B, K, N]: 2BMNK. Bytes: each operand and the output once. Reads the operands by position
    (``addmm`` / ``baddbmm``: after the bias)."""
    a, b = (c.inputs[1], c.inputs[2]) if c.op in (ADDMM, BADDBMM) else (c.inputs[0], c.inputs[1])
    if c.op in (MM, ADDMM):
        m, k = a.shape
        return 2.0 * m * b.shape[1] * k + (m * b.shape[1] if c.op == ADDMM else 0), io_bytes(c)
    bb, m, k = a.shape
    return 2.0 * bb * m * b.shape[2] * k, io_bytes(c)


def layout(a, b) -> str | None:
    """The NN/NT/TN/TT layout of A and B from their strides (``x @ w.T`` is ``NT``), ``None``
    when an operand has neither a unit last nor a unit first stride."""
    la = "N" if a.stride[-1] == 1 else ("T" if a.stride[0] == 1 else None)
    lb = "N" if b.stride[-1] == 1 else ("T" if b.stride[0] == 1 else None)
    return la + lb if la and lb else None


def dims(c):
    """``{"m", "n", "k"}`` of an ``mm`` / ``addmm``; ``None`` for ``bmm``."""
    if c.op not in (MM, ADDMM):
        return None
    a, b = operands(c)
    return {"m": a.shape[0], "n": b.shape[1], "k": a.shape[1]}


def case(c, split=None):
    """``MxNxK:<layout>`` of an ``mm`` / ``addmm`` (the catalogue's shape text); ``None`` for
    ``bmm`` and for operands without a unit stride."""
    d = dims(c)
    if d is None:
        return None
    lay = layout(*operands(c))
    if lay is None:
        return None
    return f"{d['m']}x{d['n']}x{d['k']}:{lay}", ("the bias add of addmm is not measured" if c.op == ADDMM else "")


MODEL = ModelHooks(aten_ops=(MM, ADDMM, BMM, BADDBMM), view="compiled", judge=judge, cost=cost, case=case,
                   dims=dims, matrix=True)
