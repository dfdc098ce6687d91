"""Grouped GEMM in a captured model step: ``aten._grouped_mm`` (and ``aten._scaled_grouped_mm``).

The compiled view decides it: FlyDSL's grouped GEMM is the Inductor template
``grouped_gemm_flydsl`` (torch 2.15 ``torch/_inductor/kernel/mm_grouped.py``), offered under
max-autotune with FLYDSL in ``max_autotune_gemm_backends``. The scaled grouped GEMM has no FlyDSL
template. transformers' MoE experts call ``torch._grouped_mm`` with all routed rows and
cumulative offsets, so the captured shapes do not depend on the routing; the per-expert M of an
exported case does (``case``'s ``split``).
"""
from __future__ import annotations

from flyexplore.ops.base import ModelCall, ModelHooks, io_bytes

GROUPED, SCALED_GROUPED = "aten._grouped_mm.default", "aten._scaled_grouped_mm.default"


def nt_expert_weight(b) -> bool:
    """B of ``_grouped_mm`` passed as ``w.transpose(-2, -1)`` of a contiguous [G, N, K] ``w``
    (transformers' experts store [G, N, K] unless ``is_transposed``)."""
    if b is None or b.ndim != 3:
        return False
    g, k, n = b.shape
    return b.stride == (k * n, 1, k)


def judge(c, view: str):
    """:attr:`ModelHooks.judge` (module docstring)."""
    if c.op != GROUPED:
        return ModelCall(status="no FlyDSL path", category="no FlyDSL path: scaled grouped mm",
                         reason="no FlyDSL path: scaled grouped mm has no FlyDSL template")
    if view != "compiled":
        return ModelCall(status="not eligible", category="grouped_gemm: eager (FlyDSL GEMMs need torch.compile)",
                         reason="not eligible in eager: FlyDSL's grouped GEMM is an Inductor template "
                                "(the compiled view judges it)")
    offs = c.arg("offs")
    return ModelCall(args={"a": c.arg("self"), "b": c.arg("mat2"), "offs": offs if offs is not None else None,
                           "bias": c.arg("bias") is not None})


def cost(c):
    """A [total_M, K] x B [G, K, N]: 2 x total_M x N x K FLOPs (the routing does not change it);
    3-D x 3-D: 2 x G x M x N x K. Bytes: A, B and the output once."""
    a, b = c.inputs[0], c.inputs[1]
    if a.ndim == 2 and b.ndim == 3:
        return 2.0 * a.shape[0] * b.shape[2] * a.shape[1], io_bytes(c)
    if a.ndim == 3 and b.ndim == 3:
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[2] * a.shape[2], io_bytes(c)
    out = c.outputs[0] if c.outputs else None
    n = 1
    for s in (out.shape if out is not None else ()):
        n *= s
    return (2.0 * n * a.shape[-1] if out is not None else 0.0), io_bytes(c)


def dims(c):
    """``{"g", "m", "n", "k"}`` with M the mean rows per group (uniform routing)."""
    if c.op != GROUPED:
        return None
    a, b = c.arg("self"), c.arg("mat2")
    if a is None or b is None or a.ndim != 2 or b.ndim != 3:
        return None
    g = b.shape[0]
    return {"g": g, "m": max(1, round(a.shape[0] / g)), "n": b.shape[2], "k": b.shape[1]}


def case(c, split):
    """``GxMxNxK[:layout=NT][,ms=..]`` with M the largest group's rows: ``split(rows, G)`` gives
    the rows per expert under the routing assumption (``ms=`` lists them when uneven)."""
    a, b = c.arg("self"), c.arg("mat2")
    if c.op != GROUPED or a is None or b is None or a.ndim != 2 or b.ndim != 3:
        return None
    g, k, n = b.shape
    rows = a.shape[0]
    opts = ["layout=NT"] if nt_expert_weight(b) else []
    ms = split(rows, g)
    if len(set(ms)) > 1:
        opts.append("ms=" + "/".join(map(str, ms)))
    return (f"{g}x{max(ms)}x{n}x{k}" + (":" + ",".join(opts) if opts else ""),
            f"{rows} routed rows over {g} experts")


MODEL = ModelHooks(aten_ops=(GROUPED, SCALED_GROUPED), view="compiled", judge=judge, cost=cost, case=case,
                   dims=dims, matrix=True)
