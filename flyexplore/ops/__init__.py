"""The operator catalogue: one folder per operator family (``<family>/operator.py``: catalogue,
backends, suites, published table; ``flydsl.py``: its FlyDSL path; ``xray.py``: its X-ray
builder), registered here.

>>> from flyexplore.ops import get_op
>>> gemm = get_op("gemm")
>>> gemm.case("8x4096x4096").label
'8x4096x4096'

``get_op`` raises :class:`~flyexplore.errors.UsageError` naming the valid operators.
"""
from __future__ import annotations

import importlib

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops.base import (Backend, Case, FlyDSLPath, KernelPattern, ModelCall, ModelHooks, Operator, PublishedSuite,
                                 RunContext, Suite)
from flyexplore.world import routes as _routes

__all__ = ["Backend", "Case", "FlyDSLPath", "KernelPattern", "ModelCall", "ModelHooks", "Operator", "PublishedSuite",
           "RunContext", "Suite", "builtin_ops", "flydsl_ops", "get_op", "list_ops", "model_families", "model_hooks",
           "register_op", "unregister_op"]

#: operator name -> (module, attribute). Modules import lazily.
_MODULES = {
    "gemm": ("gemm.operator", "GEMM"),
    "rmsnorm": ("rmsnorm.operator", "RMSNORM"),
    "topk": ("topk.operator", "TOPK"),
    "grouped_gemm": ("grouped_gemm.operator", "GROUPED_GEMM"),
    "scaled_gemm": ("scaled_gemm.operator", "SCALED_GEMM"),
    "attention": ("attention.operator", "ATTENTION"),
    "model": ("model.operator", "MODEL"),
}


#: operators registered at run time (:func:`register_op`): name -> Operator.
_REGISTERED: dict[str, Operator] = {}


def register_op(op: Operator, *, replace: bool = False) -> Operator:
    """Add ``op`` to the catalogue under ``op.name`` (a family defined outside this package,
    e.g. in a test or a user's module): sweeps, ``explain``, the switches table, trace
    classification and the figures then take it like a built-in family. Registering the same
    object again is a no-op; ``replace=True`` lets a new object take a registered name (a
    re-run notebook cell). Worker processes find it by ``"module:attribute"``
    (:func:`flyexplore.run.plan.op_ref`), so define it at module level. Returns ``op``.

    Raises ``ValueError`` naming the problem when the name is a built-in family's or is taken
    by another object (without ``replace``). A family registered only for its FlyDSL path
    (explain, switches, trace) needs no backend; a sweep of it checks what measuring needs."""
    if op.name in _MODULES:
        raise ValueError(f"operator {op.name!r} is a built-in family; choose another name")
    if _REGISTERED.get(op.name) is op:
        return op
    if op.name in _REGISTERED and not replace:
        raise ValueError(f"operator {op.name!r} is already registered (register_op(..., replace=True) "
                         "replaces it)")
    _REGISTERED[op.name] = op
    return op


def builtin_ops() -> tuple[str, ...]:
    """Names of the families that ship with flyexplore (the modules of this package)."""
    return tuple(_MODULES)


def unregister_op(name: str) -> None:
    """Remove an operator added by :func:`register_op` (no-op for unknown names)."""
    _REGISTERED.pop(name, None)


def list_ops() -> tuple[str, ...]:
    """Names of the operators in the catalogue (the built-in families, then registered ones)."""
    return tuple(_MODULES) + tuple(n for n in _REGISTERED if n not in _MODULES)


def get_op(name: str) -> Operator:
    """The :class:`Operator` called ``name``; :class:`UsageError` for an unknown name."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _MODULES:
        raise bad_choice("operator", name, list_ops())
    mod, attr = _MODULES[name]
    return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)


def flydsl_ops(route: str | None = None) -> tuple[str, ...]:
    """Names of the operators torch routes to FlyDSL (those with ``op.flydsl``), optionally only
    those of one ``route`` (``"eager"``, ``"compile"``, ``"aotriton"``); imports every family."""
    return tuple(n for n in list_ops() if (p := get_op(n).flydsl) is not None
                 and (route is None or p.route == route))


def route_table() -> list:
    """Every operator's FlyDSL route as the environment layer needs it
    (:class:`flyexplore.world.routes.Route`: name, route, eager module, aten symbols), in
    :func:`list_ops` order; operators registered at run time included. The public face hands
    this to :func:`flyexplore.world.routes.provide`."""
    out = []
    for n in list_ops():
        p = get_op(n).flydsl
        if p is not None:
            out.append(_routes.Route(n, p.route, p.module, tuple(p.aten_ops)))
    return out



def model_hooks(name: str | None):
    """The model hooks (:class:`ModelHooks`) of family ``name``; ``None`` for no name, an unknown
    family or one without hooks."""
    if not name:
        return None
    try:
        return get_op(name).model
    except UsageError:
        return None


def model_families() -> dict[str, Operator]:
    """The families with model hooks (``Operator.model``), built-in then registered:
    ``{family name: Operator}``. The capture asks each which ATen calls it claims
    (:attr:`ModelHooks.aten_ops`); a family registered with :func:`register_op` is read the
    same way, so it appears in ``fx.model`` with no change outside its own module."""
    out = {}
    for name in list_ops():
        op = get_op(name)
        if op.model is not None:
            out[name] = op
    return out
