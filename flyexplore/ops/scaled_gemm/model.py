"""Scaled GEMM in a captured model step: ``aten._scaled_mm`` and ``aten._scaled_mm_v2``.

Listed, not judged from a capture: whether FlyDSL's MXFP template takes a call depends on its
recipe and scales (``flyexplore explain --op scaled_gemm`` judges one call), which the capture of
a model built without its quantizer does not hold.
"""
from __future__ import annotations

from flyexplore.ops.base import ModelCall, ModelHooks, io_bytes

SCALED_MM, SCALED_MM_V2 = "aten._scaled_mm.default", "aten._scaled_mm_v2.default"


def judge(c, view: str):
    """:attr:`ModelHooks.judge`: ``unverified`` (module docstring)."""
    return ModelCall(status="unverified", category="scaled_gemm: not judged from a capture",
                     reason="listed, not judged: a captured scaled GEMM needs its recipe and scales "
                            "(flyexplore explain --op scaled_gemm judges one call)")


def cost(c):
    """A [M, K] x B [K, N] (MXFP4 packs two values a byte: K from the output's other operand):
    2MNK FLOPs; bytes: operands, scales and output once."""
    a, b = c.inputs[0], c.inputs[1]
    out = c.outputs[0] if c.outputs else None
    if out is None or a.ndim != 2 or out.ndim != 2:
        return 0.0, io_bytes(c)
    m, n = out.shape
    k = a.shape[1] * (2 if a.dtype == b.dtype and "float4" in str(a.dtype) else 1)
    return 2.0 * m * n * k, io_bytes(c)


MODEL = ModelHooks(aten_ops=(SCALED_MM, SCALED_MM_V2), view="compiled", judge=judge, cost=cost, matrix=True)
