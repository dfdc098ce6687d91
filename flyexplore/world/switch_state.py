"""What torch has of FlyDSL's switches and what they are set to, read without changing
anything: ``torch.backends.python_native`` and its FlyDSL controller, which overrides and
templates exist, the eager filter sets, and a :class:`Snapshot` of every switch with
:func:`restore`. The switches themselves are :mod:`flyexplore.world.switches` (which re-exports these
names); this module imports nothing of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flyexplore.world import readiness as R
from flyexplore.world.routes import route_ops, routes

#: Inductor config keys a snapshot keeps (those present in the installed torch).
INDUCTOR_KEYS = ("max_autotune", "max_autotune_gemm", "max_autotune_gemm_backends",
                 "max_autotune_gemm_search_space", "flydsl_enable_autotuning")
#: SDPA backend names (``torch.backends.cuda.enable_<name>_sdp``) in torch's order.
SDPA_BACKENDS = ("flash", "mem_efficient", "cudnn", "math")
_DSL = "flydsl"


# -- which operators have a switch: the registry's FlyDSL paths ------------------------------

#: Table order of the routes (``FlyDSLPath.route``): the compiled GEMMs' one setting, SDPA, then
#: the eager overrides.
_ROUTE_ORDER = ("compile", "aotriton", "eager")


def switch_ops() -> tuple[str, ...]:
    """Operators with a FlyDSL switch, in table order: every catalogue operator with a
    :class:`~flyexplore.ops.FlyDSLPath` (:func:`flyexplore.ops.flydsl_ops`, operators
    registered at run time included), grouped by route (compile, aotriton, eager), catalogue
    order within a route. Also readable as ``switches.OPS``."""
    return tuple(o for r in _ROUTE_ORDER for o in route_ops(r))


def eager_ops() -> dict[str, tuple[str, ...]]:
    """Eager operators -> the aten op symbols their FlyDSL overrides register
    (``FlyDSLPath.aten_ops``; torch 2.15: ``_fused_rms_norm``, ``topk`` / ``topk.values``).
    Also readable as ``switches.EAGER_OPS``."""
    return {r.op: r.aten_ops for r in routes("eager")}


def eager_modules() -> dict[str, str | None]:
    """Eager operators -> the torch module holding their FlyDSL override
    (``FlyDSLPath.module``; absent before torch 2.15). Also ``switches.EAGER_MODULES``."""
    return {r.op: r.module for r in routes("eager")}


def compile_ops() -> tuple[str, ...]:
    """Operators served by the one Inductor FLYDSL setting (route ``"compile"``). Also
    ``switches.COMPILE_OPS``."""
    return route_ops("compile")


def sdpa_ops() -> tuple[str, ...]:
    """Operators whose FlyDSL kernels AOTriton picks (route ``"aotriton"``: attention)."""
    return route_ops("aotriton")


# -- what exists --------------------------------------------------------------------------

def python_native():
    """``torch.backends.python_native`` or ``None`` (torch < 2.13)."""
    try:
        import torch.backends.python_native as pn
    except ImportError:
        return None
    return pn


def flydsl_controller():
    """python_native's ``flydsl`` DSL controller (``torch.backends.python_native.flydsl``) or
    ``None`` where this torch has none (torch < 2.15)."""
    pn = python_native()
    if pn is None:
        return None
    try:
        return pn.flydsl if _DSL in pn.all_dsls else None
    except Exception:  # registry not importable
        return None


def eager_mechanism(op: str) -> str | None:
    """``None`` when the eager FlyDSL switch for ``op`` exists in this torch, else why not."""
    if python_native() is None:
        import torch
        return (f"torch {torch.__version__} has no torch.backends.python_native "
                "(first in torch 2.13; FlyDSL overrides first in 2.15)")
    if flydsl_controller() is None:
        return "torch.backends.python_native has no 'flydsl' DSL (needs torch >= 2.15)"
    module = eager_modules()[op]
    if not module or not R.has_module(module):
        return f"this torch has no FlyDSL {op} override ({module})"
    return None


def compile_mechanism() -> str | None:
    """``None`` when this torch has FlyDSL Inductor templates, else why not."""
    import torch
    from torch._inductor import config as ic

    if not hasattr(ic, "flydsl_enable_autotuning") or not R.has_module("torch._inductor.codegen.flydsl"):
        return (f"torch {torch.__version__} has no FlyDSL Inductor templates (first in 2.15); "
                "FLYDSL in max_autotune_gemm_backends would be ignored")
    return None


# -- snapshot / restore -------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """Every setting a switch can change, as found at one moment.

    ``native``: (disabled DSL names, disabled op symbols, disabled dispatch keys) of
    ``torch._native.registry``'s filter state, or ``None`` without python_native;
    ``aot``: ``torch._native.aot_enabled()`` or ``None``; ``inductor``: the
    :data:`INDUCTOR_KEYS` present; ``sdpa``: backend name -> enabled; ``sdpa_priority``:
    ``torch._C._get_sdp_priority_order()`` or ``None``; ``rocm_fa``: the preferred ROCm
    flash-attention library (a ``torch._C._ROCmFABackend``) or ``None``.
    """

    native: tuple[frozenset, frozenset, frozenset] | None
    aot: bool | None
    inductor: dict[str, Any] = field(default_factory=dict)
    sdpa: dict[str, bool] = field(default_factory=dict)
    sdpa_priority: tuple[int, ...] | None = None
    rocm_fa: Any = None

    def __eq__(self, other):  # the enum compares by value
        if not isinstance(other, Snapshot):
            return NotImplemented
        return (self.native, self.aot, self.inductor, self.sdpa, self.sdpa_priority,
                str(self.rocm_fa)) == (other.native, other.aot, other.inductor, other.sdpa,
                                       other.sdpa_priority, str(other.rocm_fa))

    __hash__ = None


def eager_filter_sets() -> tuple[frozenset, frozenset, frozenset] | None:
    """python_native's filter state as (disabled DSL names, disabled aten op symbols, disabled
    dispatch keys), or ``None`` without python_native (torch < 2.13). Read from
    ``torch.backends.python_native._get_filter_state()`` (torch 2.15 has no public getter)."""
    pn = python_native()
    if pn is None:
        return None
    try:
        fs = pn._get_filter_state()
    except Exception:
        return None
    return frozenset(fs._dsl_names), frozenset(fs._op_symbols), frozenset(fs._dispatch_keys)


def registered_overrides() -> tuple[str, ...] | None:
    """The aten op symbols FlyDSL registered overrides for in this process
    (``torch.backends.python_native.get_dsl_operations("flydsl")``), or ``None`` where this
    torch has no flydsl DSL or the registry cannot be read."""
    if flydsl_controller() is None:
        return None
    try:
        return tuple(python_native().get_dsl_operations(_DSL))
    except Exception:
        return None


def snapshot() -> Snapshot:
    """The current state of every switch (see :class:`Snapshot`)."""
    import torch
    from torch._inductor import config as ic

    aot = None
    try:
        import torch._native as native
        aot = bool(native.aot_enabled()) if hasattr(native, "aot_enabled") else None
    except Exception:
        aot = None
    sdpa = {}
    for name in SDPA_BACKENDS:
        getter = getattr(torch.backends.cuda, f"{name}_sdp_enabled", None)
        if getter is not None:
            sdpa[name] = bool(getter())
    prio = None
    if hasattr(torch._C, "_get_sdp_priority_order"):
        prio = tuple(int(x) for x in torch._C._get_sdp_priority_order())
    fa = None
    if hasattr(torch.backends.cuda, "preferred_rocm_fa_library"):
        try:
            fa = torch.backends.cuda.preferred_rocm_fa_library()
        except Exception:  # a build without the ROCm preference
            fa = None
    ind = {k: getattr(ic, k) for k in INDUCTOR_KEYS if hasattr(ic, k)}
    return Snapshot(eager_filter_sets(), aot, ind, sdpa, prio, fa)


def restore(snap: Snapshot) -> None:
    """Put every switch back to ``snap``. python_native changes go through its public calls
    (``enable_operations`` ...), so the dispatcher registrations follow the filter sets."""
    import torch
    from torch._inductor import config as ic

    pn = python_native()
    now = eager_filter_sets()
    if pn is not None and snap.native is not None and now is not None:
        was_dsl, was_ops, was_keys = snap.native
        cur_dsl, cur_ops, cur_keys = now
        for d in sorted(cur_dsl - was_dsl):
            getattr(pn, d).enable()
        for d in sorted(was_dsl - cur_dsl):
            getattr(pn, d).disable()
        if cur_ops - was_ops:
            pn.enable_operations(*sorted(cur_ops - was_ops))
        if was_ops - cur_ops:
            pn.disable_operations(*sorted(was_ops - cur_ops))
        if cur_keys - was_keys:
            pn.enable_dispatch_keys(*sorted(cur_keys - was_keys))
        if was_keys - cur_keys:
            pn.disable_dispatch_keys(*sorted(was_keys - cur_keys))
    if snap.aot is not None:
        import torch._native as native
        if bool(native.aot_enabled()) != snap.aot:
            native.set_aot_enabled(snap.aot)
    for k, v in snap.inductor.items():
        setattr(ic, k, v)
    for name, on in snap.sdpa.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)
    if snap.sdpa_priority is not None and hasattr(torch._C, "_set_sdp_priority_order"):
        if tuple(int(x) for x in torch._C._get_sdp_priority_order()) != snap.sdpa_priority:
            torch._C._set_sdp_priority_order(list(snap.sdpa_priority))
    if snap.rocm_fa is not None:
        torch.backends.cuda.preferred_rocm_fa_library(snap.rocm_fa)
