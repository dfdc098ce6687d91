"""The operator catalogue: one module per operator family, backends registered beside it.

>>> from flyexplore.ops import get_op
>>> gemm = get_op("gemm")
>>> gemm.case("8x4096x4096").label
'8x4096x4096'

``get_op`` raises :class:`~flyexplore.errors.UsageError` naming the valid operators.
"""
from __future__ import annotations

import importlib

from ..errors import bad_choice
from .base import Backend, Case, Operator, RunContext, Suite  # noqa: F401

#: operator name -> (module, attribute). Modules import lazily.
_MODULES = {
    "gemm": ("gemm", "GEMM"),
    "rmsnorm": ("rmsnorm", "RMSNORM"),
    "topk": ("topk", "TOPK"),
    "grouped_gemm": ("grouped_gemm", "GROUPED_GEMM"),
    "scaled_gemm": ("scaled_gemm", "SCALED_GEMM"),
    "attention": ("attention", "ATTENTION"),
}


def list_ops() -> tuple[str, ...]:
    """Names of the operators in the catalogue."""
    return tuple(_MODULES)


def get_op(name: str) -> Operator:
    """The :class:`Operator` called ``name``; :class:`UsageError` for an unknown name."""
    if name not in _MODULES:
        raise bad_choice("operator", name, _MODULES)
    mod, attr = _MODULES[name]
    return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
