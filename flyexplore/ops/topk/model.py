"""TopK in a captured model step: ``aten.topk``.

The eager view decides it: FlyDSL's TopK is an eager override of ``aten::topk`` (torch 2.15
``torch/_native/ops/topk/flydsl_impl.py``). Under ``torch.compile`` Inductor calls ``aten.topk``
as a fallback kernel (``config.triton.decompose_sort_ops`` off, its default), so the same
override decides; with ``decompose_sort_ops`` on, Inductor lowers it as a sort.
"""
from __future__ import annotations

from flyexplore.ops.base import ModelCall, ModelHooks, rows_of

TOPK, TOPK_VALUES = "aten.topk.default", "aten.topk.values"


def judge(c, view: str):
    """:attr:`ModelHooks.judge` (module docstring)."""
    notes = ()
    if view == "compiled":
        from torch._inductor import config as ic

        if getattr(ic.triton, "decompose_sort_ops", False):
            return ModelCall(status="not eligible", category="topk: decomposed by Inductor",
                             reason="not eligible: config.triton.decompose_sort_ops makes Inductor lower topk as a sort")
        notes = ("under torch.compile Inductor calls aten.topk as a fallback kernel, so the eager override decides",)
    g = c.scalars
    return ModelCall(args={"x": c.arg("self"), "k": int(g.get("k")), "dim": int(g.get("dim", -1)),
                           "largest": bool(g.get("largest", True)), "sorted": bool(g.get("sorted", True))},
                     notes=notes)


def dims(c):
    """``{"m", "n", "k"}``: rows (every leading dim), the row length and k."""
    x = c.arg("self")
    m = rows_of(x)
    return None if m is None else {"m": m, "n": x.shape[-1], "k": int(c.scalars.get("k"))}


def case(c, split=None):
    """``MxNxK``."""
    d = dims(c)
    return (f"{d['m']}x{d['n']}x{d['k']}", "") if d else None


MODEL = ModelHooks(aten_ops=(TOPK, TOPK_VALUES), view="eager", judge=judge, case=case, dims=dims)
