"""RMSNorm in a captured model step: ``aten._fused_rms_norm``, and RMSNorm modules that never reach it.

The eager view decides it: FlyDSL's RMSNorm is an eager override of ``aten::_fused_rms_norm``
(``F.rms_norm``; torch 2.15 ``torch/_native/ops/norm/flydsl_rmsnorm_impl.py``). Under
``torch.compile`` Inductor decomposes ``_fused_rms_norm`` (``torch/_decomp/decompositions.py``)
and generates its own kernel. Hugging Face RMSNorm modules (``LlamaRMSNorm`` and kin) compute
pow / mean / rsqrt / mul and never call ``_fused_rms_norm``: such a module (a class whose name
ends in ``RMSNorm``) is kept as one call, :data:`DECOMPOSED`, so that it is judged (never
eligible) and advised on rather than scattered over pointwise rows.
"""
from __future__ import annotations

from flyexplore.ops.base import ModelCall, ModelHooks, rows_of

FUSED = "aten._fused_rms_norm.default"
#: The name a decomposed RMSNorm module is recorded under.
DECOMPOSED = "RMSNorm module (decomposed)"
#: Attributes a Hugging Face RMSNorm module keeps its epsilon in.
EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")


def _module_args(m, inputs, inner_ops):
    import torch

    x = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    eps = next((getattr(m, a) for a in EPS_ATTRS if isinstance(getattr(m, a, None), (int, float))), None)
    note = f"{type(m).__name__} computes RMSNorm from {', '.join(inner_ops)}: it never calls aten._fused_rms_norm"
    return (("input", x), ("weight", getattr(m, "weight", None)), ("eps", eps), ("ops", list(inner_ops))), note


def keep_module(m):
    """:attr:`ModelHooks.keep_module`: a module whose class name ends in ``RMSNorm``."""
    return (DECOMPOSED, _module_args) if type(m).__name__.endswith("RMSNorm") else None


def judge(c, view: str):
    """:attr:`ModelHooks.judge` (module docstring)."""
    if c.op == DECOMPOSED:
        return ModelCall(status="not eligible", category="rmsnorm: decomposed module",
                         reason=f"not eligible: {c.note}" + (" (and Inductor fuses the pieces into its own kernel)"
                                                             if view == "compiled" else ""))
    if view == "compiled":
        return ModelCall(status="not eligible", category="rmsnorm: decomposed by Inductor",
                         reason="not eligible under torch.compile: Inductor decomposes aten._fused_rms_norm "
                                "(torch/_decomp/decompositions.py) and generates its own kernel; the FlyDSL RMSNorm "
                                "is an eager override")
    ns = c.scalars.get("normalized_shape")
    x = c.arg("input")
    return ModelCall(args={"x": x, "normalized_shape": tuple(ns) if ns else (x.shape[-1],), "weight": c.arg("weight"),
                           "eps": c.scalars.get("eps")})


def dims(c):
    """``{"m", "n"}``: rows (every leading dim) and the normalized size."""
    x = c.arg("input")
    m = rows_of(x)
    return None if m is None else {"m": m, "n": x.shape[-1]}


def case(c, split=None):
    """``MxN[:eps=..]``; a decomposed module is measured as ``F.rms_norm``."""
    d = dims(c)
    if d is None:
        return None
    eps = c.scalars.get("eps")
    return (f"{d['m']}x{d['n']}" + (f":eps={eps:g}" if isinstance(eps, float) else ""),
            "a decomposed RMSNorm module, measured as F.rms_norm" if c.op == DECOMPOSED else "")


MODEL = ModelHooks(aten_ops=(FUSED,), view="eager", judge=judge, case=case, dims=dims, keep_module=keep_module)
