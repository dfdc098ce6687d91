"""FlyDSL switches per operator: one API over the three mechanisms torch has.

================  ==========================================================================
operator          torch mechanism (read from the torch 2.15.0 wheel)
================  ==========================================================================
``rmsnorm``       eager override of ``aten::_fused_rms_norm`` -- ``torch.backends.python_native``:
                  the ``flydsl`` DSL must be enabled and the op symbol not disabled
                  (``pn.disable_operations("_fused_rms_norm")``) nor the ``CUDA`` dispatch key.
``topk``          eager overrides of ``aten::topk`` and ``aten::topk.values`` (same controller).
``gemm``,         torch.compile templates ``mm_flydsl``, ``grouped_gemm_flydsl`` and the MXFP
``grouped_gemm``, ``mm_flydsl`` variant: ``torch._inductor.config.max_autotune_gemm_backends`` must
``scaled_gemm``   list ``FLYDSL`` and max-autotune must be on (``max_autotune`` or
                  ``max_autotune_gemm``); ``flydsl_enable_autotuning`` and
                  ``max_autotune_gemm_search_space`` set FlyDSL's search space
                  (``torch/_inductor/utils.py::use_flydsl_gemm_template``,
                  ``torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs``).
                  **One setting serves all three**: torch has no per-operator FlyDSL switch for
                  compiled GEMMs, so switching one switches the others, and the table says so.
``attention``     SDPA: ``torch.backends.cuda.enable_{flash,mem_efficient,cudnn,math}_sdp``
                  (what ``torch.nn.attention.sdpa_kernel`` sets) and
                  ``torch.backends.cuda.preferred_rocm_fa_library`` (AOTriton or CK). FlyDSL
                  attention kernels live *inside* AOTriton >= 0.14 (its "flyc" backend) and
                  AOTriton picks them itself; torch can only allow or avoid AOTriton. "on" =
                  FLASH and EFFICIENT allowed with AOTriton preferred; "off" = CK preferred
                  (torch still uses AOTriton where CK has no kernel; use
                  :func:`sdpa` with ``["math"]`` to rule AOTriton out completely).
================  ==========================================================================

The operators and their route, aten op symbols and torch module come from the catalogue's
registry (each family's :class:`~flyexplore.ops.FlyDSLPath`, :func:`switch_ops`), so an
operator registered with a FlyDSL path gets a row and a switch like the built-in ones.

Use as plain calls (:func:`enable`, :func:`disable`) or as a context manager
(:func:`flydsl`, :func:`sdpa`). A context restores on exit exactly the state it found on entry
(python_native filter sets and AOT flag, the Inductor settings above, the SDPA flags and the
ROCm FA preference), also after an exception and when nested. :func:`table` /
:func:`text` show every switch (a pandas DataFrame / plain text).

Where the installed torch lacks a mechanism (torch 2.11: no ``torch.backends.python_native``
and no FlyDSL Inductor templates) or it cannot have any effect (a CUDA or CPU build), the
table says so; turning such a switch *on* changes nothing, warns
(:class:`SwitchUnavailableWarning`) and, with ``strict=True``, raises
:class:`SwitchUnavailable`. Turning it *off* is always true and never warns.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.world import env as ENV
from flyexplore.world import readiness as R
from flyexplore.world.env import aotriton_version
from flyexplore.world.routes import route_ops, routes

# -- reading the switches (nothing here changes them) ---------------------------------------

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
    :data:`INDUCTOR_KEYS` present, or ``None`` for a snapshot that left Inductor unimported
    (``snapshot(inductor=False)`` in a process that had not imported it: its settings were
    still the values its import gives); ``sdpa``: backend name -> enabled; ``sdpa_priority``:
    ``torch._C._get_sdp_priority_order()`` or ``None``; ``rocm_fa``: the preferred ROCm
    flash-attention library (a ``torch._C._ROCmFABackend``) or ``None``.
    """

    native: tuple[frozenset, frozenset, frozenset] | None
    aot: bool | None
    inductor: dict[str, Any] | None = field(default_factory=dict)
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


def snapshot(inductor: bool = True) -> Snapshot:
    """The current state of every switch (see :class:`Snapshot`). ``inductor=False``: Inductor's
    settings only where this process has imported Inductor already (``Snapshot.inductor`` is
    ``None`` otherwise): its import (with Dynamo's) costs a fresh process 1.7 CPU-s on the 2-core
    machine, which an eager case in a sweep worker never needs."""
    import torch

    ic = _inductor_config() if inductor or "torch._inductor.config" in sys.modules else None

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
    ind = None if ic is None else {k: getattr(ic, k) for k in INDUCTOR_KEYS if hasattr(ic, k)}
    return Snapshot(eager_filter_sets(), aot, ind, sdpa, prio, fa)


def _inductor_config():
    """``torch._inductor.config`` (imports Inductor and Dynamo where they are not imported yet)."""
    from torch._inductor import config as ic

    return ic


def restore(snap: Snapshot) -> None:
    """Put every switch back to ``snap``. python_native changes go through its public calls
    (``enable_operations`` ...), so the dispatcher registrations follow the filter sets.
    Inductor's settings are put back where ``snap`` has them (``snap.inductor`` not ``None``)."""
    import torch

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
    if snap.inductor is not None:
        ic = _inductor_config()
        for k, v in snap.inductor.items():
            setattr(ic, k, v)
    for name, on in snap.sdpa.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)
    if snap.sdpa_priority is not None and hasattr(torch._C, "_set_sdp_priority_order"):
        if tuple(int(x) for x in torch._C._get_sdp_priority_order()) != snap.sdpa_priority:
            torch._C._set_sdp_priority_order(list(snap.sdpa_priority))
    if snap.rocm_fa is not None:
        torch.backends.cuda.preferred_rocm_fa_library(snap.rocm_fa)


# -- setting the switches -------------------------------------------------------------------

_SDPA_ALIASES = {"flash": "flash", "flash_attention": "flash", "efficient": "mem_efficient",
                 "mem_efficient": "mem_efficient", "efficient_attention": "mem_efficient",
                 "cudnn": "cudnn", "cudnn_attention": "cudnn", "math": "math"}


_TABLES = {"OPS": switch_ops, "EAGER_OPS": eager_ops, "EAGER_MODULES": eager_modules, "COMPILE_OPS": compile_ops}


def __getattr__(name: str):
    """``OPS``, ``EAGER_OPS``, ``EAGER_MODULES`` and ``COMPILE_OPS``, computed from the registry
    on each read (so an operator registered later is in them)."""
    if name in _TABLES:
        return _TABLES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class SwitchUnavailable(UsageError):
    """A switch was turned on (``strict=True``) where the installed torch cannot honour it."""


class SwitchUnavailableWarning(UserWarning):
    """A switch was turned on where the installed torch cannot honour it; nothing changed."""


# -- the per-operator state ---------------------------------------------------------------

def _check_ops(ops: Iterable[str]) -> tuple[str, ...]:
    out = []
    known = switch_ops()
    for o in ops:
        if o not in known:
            raise bad_choice("FlyDSL switch", o, known)
        if o not in out:
            out.append(o)
    return tuple(out)


def _backends_list(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def eager_on(op: str) -> bool:
    """Whether python_native lets the FlyDSL ``op`` override run (DSL enabled, op symbols
    and the CUDA dispatch key not disabled). ``False`` where the mechanism does not exist."""
    if eager_mechanism(op) is not None:
        return False
    dsl, syms, keys = eager_filter_sets()
    return _DSL not in dsl and not (set(eager_ops()[op]) & syms) and "CUDA" not in keys


def compile_on() -> bool:
    """Whether Inductor would consider FlyDSL GEMM templates: FLYDSL listed in
    ``max_autotune_gemm_backends`` and max-autotune on (``max_autotune`` or
    ``max_autotune_gemm``), in a torch that has the templates."""
    from torch._inductor import config as ic

    if compile_mechanism() is not None:
        return False
    listed = "FLYDSL" in [b.upper() for b in _backends_list(ic.max_autotune_gemm_backends)]
    return listed and bool(ic.max_autotune or ic.max_autotune_gemm)


def _fa_name(v) -> str:
    s = str(v).split(".")[-1].lower()
    return {"default": "default", "aotriton": "aotriton", "ck": "ck"}.get(s, s)


@dataclass(frozen=True)
class SwitchState:
    """One row of the switch table.

    ``flydsl``: ``"on"``, ``"off"``, ``"possible"`` (attention: AOTriton allowed; whether it
    runs its FlyDSL kernels is AOTriton's choice) or ``"n/a"`` (mechanism missing).
    ``exists``: the mechanism exists in this torch; ``effective``: it can change what runs
    here (ROCm build, flydsl accepted, gfx950 -- from :func:`flyexplore.world.env.collect`).
    """

    op: str
    mechanism: str
    setting: str
    flydsl: str
    exists: bool
    effective: bool
    note: str


def _env():
    return ENV.collect()


def _effective(path: str) -> tuple[bool, str]:
    env = _env()
    r = env.flydsl_eager if path == "eager" else env.flydsl_compile
    if r.ready:
        return True, ""
    return False, "; ".join(c.detail for c in r.failed)


def states() -> tuple[SwitchState, ...]:
    """The state of every switch, one :class:`SwitchState` per operator of :func:`switch_ops`."""
    import torch
    from torch._inductor import config as ic

    rows = []
    comp_missing = compile_mechanism()
    comp_eff, comp_why = _effective("compile")
    comp_ops, eager = compile_ops(), eager_ops()
    for op in switch_ops():
        if op in comp_ops:
            setting = (f"max_autotune_gemm_backends={ic.max_autotune_gemm_backends!r}, "
                       f"max_autotune={ic.max_autotune}, max_autotune_gemm={ic.max_autotune_gemm}")
            if hasattr(ic, "flydsl_enable_autotuning"):
                setting += (f", flydsl_enable_autotuning={ic.flydsl_enable_autotuning}, "
                            f"search_space={ic.max_autotune_gemm_search_space}")
            others = ", ".join(o for o in comp_ops if o != op)
            note = f"one torch setting for {_and(comp_ops)}" + (f" (switching {op} switches {others})"
                                                                 if others else "")
            if comp_missing:
                rows.append(SwitchState(op, "torch.compile GEMM backends", setting, "n/a", False, False,
                                        comp_missing))
                continue
            on = compile_on()
            if not comp_eff:
                note += f"; no effect here: {comp_why}"
            rows.append(SwitchState(op, "torch.compile GEMM backends", setting, "on" if on else "off",
                                    True, comp_eff, note))
        elif op in eager:
            missing = eager_mechanism(op)
            if missing:
                rows.append(SwitchState(op, "eager override (torch.backends.python_native)",
                                        "-", "n/a", False, False, missing))
                continue
            dsl, syms, keys = eager_filter_sets()
            setting = (f"flydsl DSL {'disabled' if _DSL in dsl else 'enabled'}; "
                       + ", ".join(f"{s} {'disabled' if s in syms else 'enabled'}" for s in eager[op])
                       + ("; CUDA dispatch key disabled" if "CUDA" in keys else ""))
            eff, why = _effective("eager")
            regs = registered_overrides()
            registered = ("" if regs is None or not eager[op] else
                          "registered" if eager[op][0] in regs else "not registered in this process")
            note = f"override {registered}" if registered else ""
            if not eff:
                note = (note + "; " if note else "") + f"no effect here: {why}"
            rows.append(SwitchState(op, "eager override (torch.backends.python_native)", setting,
                                    "on" if eager_on(op) else "off", True, eff, note))
        else:  # SDPA through AOTriton (attention)
            snap = snapshot()
            allowed = [n for n in ("flash", "mem_efficient") if snap.sdpa.get(n)]
            fa = _fa_name(snap.rocm_fa) if snap.rocm_fa is not None else "n/a"
            setting = ("SDPA enabled: " + ",".join(n for n, v in snap.sdpa.items() if v)
                       + f"; preferred_rocm_fa_library={fa}")
            rocm = bool(getattr(torch.version, "hip", None))
            aot = aotriton_version()
            if not rocm:
                rows.append(SwitchState(op, "SDPA backends (torch.backends.cuda)", setting, "n/a", True, False,
                                        "FlyDSL attention kernels exist only inside ROCm builds' AOTriton "
                                        "(>= 0.14 'flyc'); this build is not ROCm"))
                continue
            possible = bool(allowed) and fa != "ck"
            note = ("AOTriton decides per call whether to run its FlyDSL ('flyc') kernels; "
                    f"bundled AOTriton: {aot}")
            rows.append(SwitchState(op, "SDPA backends (torch.backends.cuda)", setting,
                                    "possible" if possible else "off", True, True, note))
    return tuple(rows)


def table():
    """The switch table as a ``pandas.DataFrame`` (columns of :class:`SwitchState`)."""
    import pandas as pd

    return pd.DataFrame([s.__dict__ for s in states()],
                        columns=["op", "mechanism", "setting", "flydsl", "exists", "effective", "note"])


def text() -> str:
    """The switch table as plain text (what ``flyexplore switches`` prints)."""
    lines = []
    for s in states():
        flag = s.flydsl.upper() if s.flydsl in ("on", "off") else s.flydsl
        eff = "" if s.effective else "  (no effect here)" if s.exists else "  (not in this torch)"
        lines.append(f"{s.op:13s} FlyDSL {flag:8s} via {s.mechanism}{eff}")
        lines.append(f"{'':13s} {s.setting}")
        if s.note:
            lines.append(f"{'':13s} {s.note}")
    return "\n".join(lines)


# -- changing switches --------------------------------------------------------------------

def _unavailable(op: str, why: str, strict: bool, warn: bool) -> None:
    msg = f"cannot turn FlyDSL on for {op}: {why}"
    if strict:
        raise SwitchUnavailable(msg)
    if warn:
        warnings.warn(msg, SwitchUnavailableWarning, stacklevel=4)


def _set_eager(ops: Sequence[str], on: bool, strict: bool, warn: bool) -> None:
    pn = python_native()
    eager = eager_ops()
    todo = []
    for op in ops:
        missing = eager_mechanism(op)
        if missing:
            if on:
                _unavailable(op, missing, strict, warn)
            continue
        todo.append(op)
    if not todo:
        return
    syms = [s for op in todo for s in eager[op]]
    if not on:
        pn.disable_operations(*syms)
        return
    dsl, disabled_syms, keys = eager_filter_sets()
    # Keep the other eager ops as they are when the DSL-wide or key-wide switch must open.
    keep_off = [o for o in eager if o not in todo and eager_mechanism(o) is None and not eager_on(o)]
    if _DSL in dsl:
        pn.flydsl.enable()
    if "CUDA" in keys:
        if warn:
            warnings.warn("the CUDA dispatch key was disabled for all python_native overrides; "
                          "re-enabling it re-enables every DSL's CUDA overrides", SwitchUnavailableWarning,
                          stacklevel=4)
        pn.enable_dispatch_keys("CUDA")
    if keep_off:
        pn.disable_operations(*[s for o in keep_off for s in eager[o]])
    pn.enable_operations(*syms)


def _set_compile(on: bool, autotuning: bool | None, search_space: str | None,
                 strict: bool, warn: bool, ops: Sequence[str]) -> None:
    from torch._inductor import config as ic

    missing = compile_mechanism()
    if missing:
        if on:
            _unavailable("/".join(ops), missing, strict, warn)
        return
    cur = _backends_list(ic.max_autotune_gemm_backends)
    rest = [b for b in cur if b.upper() != "FLYDSL"]
    if on:
        ic.max_autotune_gemm_backends = ",".join(rest + ["FLYDSL"])
        if not (ic.max_autotune or ic.max_autotune_gemm):
            ic.max_autotune_gemm = True
        if autotuning is not None:
            ic.flydsl_enable_autotuning = bool(autotuning)
        if search_space is not None:
            ic.max_autotune_gemm_search_space = search_space.upper()
    elif len(rest) != len(cur):
        ic.max_autotune_gemm_backends = ",".join(rest) or "ATEN"


def _set_attention(on: bool, strict: bool, warn: bool, name: str = "attention") -> None:
    import torch

    if not getattr(torch.version, "hip", None):
        if on:
            _unavailable(name, "FlyDSL attention kernels exist only inside ROCm builds' AOTriton; "
                         "this torch is not a ROCm build", strict, warn)
        return
    if on:
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)
        torch.backends.cuda.preferred_rocm_fa_library("aotriton")
    else:
        torch.backends.cuda.preferred_rocm_fa_library("ck")


def set_flydsl(ops: Iterable[str] | str | None, enabled: bool, *, autotuning: bool | None = None,
               search_space: str | None = None, strict: bool = False, warn: bool = True) -> None:
    """Turn FlyDSL on or off for ``ops`` (names from :func:`switch_ops`; ``None`` = all).

    ``autotuning`` / ``search_space`` (``"DEFAULT"`` or ``"EXHAUSTIVE"``) set
    ``flydsl_enable_autotuning`` / ``max_autotune_gemm_search_space`` when a compiled GEMM is
    switched on. Turning on also sets ``max_autotune_gemm=True`` if max-autotune is off
    (the FlyDSL templates are only considered under max-autotune). Turning the compiled
    GEMMs off removes FLYDSL from ``max_autotune_gemm_backends`` (``"ATEN"`` if nothing
    would be left). Raises :class:`UsageError` for an unknown operator and
    :class:`SwitchUnavailable` (``strict=True``) when a switch cannot be turned on here.
    """
    if isinstance(ops, str):
        ops = (ops,)
    ops = _check_ops(switch_ops() if ops is None else ops)
    if search_space is not None and str(search_space).upper() not in ("DEFAULT", "EXHAUSTIVE"):
        raise bad_choice("search space", search_space, ("DEFAULT", "EXHAUSTIVE"))
    eager_names, comp_names = eager_ops(), compile_ops()
    eager = [o for o in ops if o in eager_names]
    comp = [o for o in ops if o in comp_names]
    if eager:
        _set_eager(eager, enabled, strict, warn)
    if comp:
        _set_compile(enabled, autotuning, search_space, strict, warn, comp)
    sdpa_names = [o for o in ops if o in sdpa_ops()]
    if sdpa_names:
        _set_attention(enabled, strict, warn, "/".join(sdpa_names))


def enable(*ops: str, autotuning: bool | None = None, search_space: str | None = None,
           strict: bool = False) -> None:
    """Turn FlyDSL on for ``ops`` (all when none are named). See :func:`set_flydsl`."""
    set_flydsl(ops or None, True, autotuning=autotuning, search_space=search_space, strict=strict)


def disable(*ops: str) -> None:
    """Turn FlyDSL off for ``ops`` (all when none are named). See :func:`set_flydsl`."""
    set_flydsl(ops or None, False)


@contextlib.contextmanager
def flydsl(*ops: str, enabled: bool = True, autotuning: bool | None = None,
           search_space: str | None = None, strict: bool = False, warn: bool = True,
           native_aot: bool | None = None) -> Iterator[Snapshot]:
    """Context manager: FlyDSL ``enabled`` (or not) for ``ops`` (all when none are named)
    inside the block; on exit every switch is back to the state found on entry (also after
    an exception, and when nested). Yields the entry :class:`Snapshot`.

    ``native_aot``: also set ``torch._native.set_aot_enabled`` (kernels AOT-compiled from DSLs
    and embedded in aten; in torch 2.15 CuTeDSL TopK for sm90/sm100, none FlyDSL) -- ``False``
    gives stock ATen, as ``python_native.flydsl.disabled()`` does. ``None`` leaves it.

    Inductor's settings are among the switches put back where ``ops`` name a compiled operator
    (:func:`compile_ops`; all operators when none are named) or Inductor was imported on entry;
    a block of eager operators (``flydsl("topk")``, what an eager sweep case runs in) entered
    before anything imported Inductor leaves it unimported (:func:`snapshot`).

    >>> with flydsl("rmsnorm", "topk", enabled=False):   # doctest: +SKIP
    ...     y = torch.nn.functional.rms_norm(x, (n,), w)   # ATen, whatever the switches were
    """
    snap = snapshot(inductor=not ops or any(o in compile_ops() for o in ops))
    try:
        set_flydsl(ops or None, enabled, autotuning=autotuning, search_space=search_space,
                   strict=strict, warn=warn)
        if native_aot is not None and snap.aot is not None:
            import torch._native as native
            native.set_aot_enabled(bool(native_aot))
        yield snap
    finally:
        restore(snap)


#: ROCm flash-attention libraries ``torch.backends.cuda.preferred_rocm_fa_library`` accepts.
ROCM_FA_LIBRARIES = ("aotriton", "ck", "default")


def _sdpa_names(backends: Iterable[str] | str) -> set[str]:
    want = set()
    for b in ([backends] if isinstance(backends, str) else backends):
        key = str(b).split(".")[-1].lower()
        if key not in _SDPA_ALIASES:
            raise bad_choice("SDPA backend", b, ("flash", "efficient", "cudnn", "math"))
        want.add(_SDPA_ALIASES[key])
    return want


def set_sdpa(backends: Iterable[str] | str | None = None, rocm_fa_library: str | None = None) -> None:
    """Plain-call twin of :func:`sdpa`: enable only ``backends`` (flash, efficient /
    mem_efficient, cudnn, math; ``None`` leaves them) through
    ``torch.backends.cuda.enable_<name>_sdp``, and prefer ``rocm_fa_library`` (``"aotriton"``,
    ``"ck"``, ``"default"``; ``None`` leaves it) through
    ``torch.backends.cuda.preferred_rocm_fa_library``. Nothing is restored afterwards. Raises
    :class:`UsageError` for an unknown name (before changing anything)."""
    import torch

    want = None if backends is None else _sdpa_names(backends)
    if rocm_fa_library is not None and rocm_fa_library not in ROCM_FA_LIBRARIES:
        raise bad_choice("ROCm flash-attention library", rocm_fa_library, ROCM_FA_LIBRARIES)
    if want is not None:
        for name in SDPA_BACKENDS:
            fn = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
            if fn is not None:
                fn(name in want)
    if rocm_fa_library is not None:
        torch.backends.cuda.preferred_rocm_fa_library(rocm_fa_library)


@contextlib.contextmanager
def sdpa(backends: Iterable[str] | None = None, rocm_fa_library: str | None = None) -> Iterator[Snapshot]:
    """Context manager over SDPA: only ``backends`` enabled (names: flash, efficient /
    mem_efficient, cudnn, math; ``None`` leaves them) and, on ROCm, ``rocm_fa_library``
    (``"aotriton"``, ``"ck"`` or ``"default"``) preferred. Restores everything on exit, like
    :func:`flydsl`. Raises :class:`UsageError` for an unknown name."""
    if backends is not None:
        _sdpa_names(backends)
    if rocm_fa_library is not None and rocm_fa_library not in ROCM_FA_LIBRARIES:
        raise bad_choice("ROCm flash-attention library", rocm_fa_library, ROCM_FA_LIBRARIES)
    snap = snapshot()
    try:
        set_sdpa(backends, rocm_fa_library)
        yield snap
    finally:
        restore(snap)


def compile_options(enabled: bool = True, *, autotuning: bool | None = None,
                    search_space: str | None = None, backends: str = "FLYDSL") -> dict:
    """``torch.compile(options=...)`` for one compiled GEMM with FlyDSL on (``backends``
    listed with FLYDSL, max-autotune, no CUDA graphs) or off (FLYDSL removed). Options given
    to ``torch.compile`` override the global switches for that compile only."""
    names = [b for b in _backends_list(backends) if b.upper() != "FLYDSL"]
    opts: dict[str, Any] = {"max_autotune": True, "triton.cudagraphs": False,
                            "max_autotune_gemm_backends": ",".join(names + (["FLYDSL"] if enabled else []))
                            or "ATEN"}
    if autotuning is not None:
        opts["flydsl_enable_autotuning"] = bool(autotuning)
    if search_space is not None:
        opts["max_autotune_gemm_search_space"] = search_space.upper()
    return opts


# -- a whole choice of switches (what a switch panel holds) --------------------------------

def unavailable() -> dict[str, str]:
    """Every switch that cannot be turned on in this process, with the reason in words.

    Keys: operator names of :func:`switch_ops` (eager: no python_native / no FlyDSL override in this
    torch; compiled GEMMs: no FlyDSL Inductor templates; attention: not a ROCm build),
    ``"compile_settings"`` (``flydsl_enable_autotuning`` and the search space: no FlyDSL
    templates) and ``"rocm_fa_library"`` (not a ROCm build: the preference exists but selects
    nothing). A switch that exists but cannot change what runs here (a CUDA build of torch 2.15)
    is not in this dict: :func:`table` says "no effect here" for it."""
    import torch

    out: dict[str, str] = {}
    comp = compile_mechanism()
    rocm = bool(getattr(torch.version, "hip", None))
    eager, comp_ops = eager_ops(), compile_ops()
    for op in switch_ops():
        if op in eager:
            why = eager_mechanism(op)
        elif op in comp_ops:
            why = comp
        else:
            why = None if rocm else ("FlyDSL attention kernels exist only inside ROCm builds' AOTriton "
                                     "(>= 0.14 'flyc'); this torch is not a ROCm build")
        if why:
            out[op] = why
    if comp:
        out["compile_settings"] = comp
    if not rocm:
        out["rocm_fa_library"] = (f"torch {torch.__version__} is not a ROCm build: "
                                  "preferred_rocm_fa_library chooses between AOTriton and CK on ROCm only")
    return out


@dataclass(frozen=True)
class SwitchSettings:
    """A complete choice of switches, as :class:`flyexplore.ui.widgets.SwitchPanel` holds it.

    ``flydsl``: operator -> FlyDSL on/off, for the operators whose switch exists here (an
    operator left out is left as it is; ``gemm``, ``grouped_gemm`` and ``scaled_gemm`` share one
    torch setting and must agree; ``attention`` on = AOTriton allowed and preferred, off = CK
    preferred); ``autotuning``: ``flydsl_enable_autotuning``; ``search_space``:
    ``max_autotune_gemm_search_space`` (``"DEFAULT"`` / ``"EXHAUSTIVE"``); ``sdpa_backends``:
    the SDPA backends left enabled (names of :data:`SDPA_BACKENDS`); ``rocm_fa_library``:
    ``"aotriton"``, ``"ck"`` or ``"default"`` (ROCm builds). ``None`` leaves a setting as it is.
    """

    flydsl: dict[str, bool] = field(default_factory=dict)
    autotuning: bool | None = None
    search_space: str | None = None
    sdpa_backends: tuple[str, ...] | None = None
    rocm_fa_library: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"flydsl": dict(self.flydsl), "autotuning": self.autotuning, "search_space": self.search_space,
                "sdpa_backends": None if self.sdpa_backends is None else list(self.sdpa_backends),
                "rocm_fa_library": self.rocm_fa_library}


def settings() -> SwitchSettings:
    """The switches as they are now, as :class:`SwitchSettings` (switches that cannot be turned on
    here -- :func:`unavailable` -- are left out, so applying the result changes nothing)."""
    from torch._inductor import config as ic

    missing = unavailable()
    snap = snapshot()
    fly: dict[str, bool] = {}
    for st in states():
        if st.op not in missing:
            fly[st.op] = st.flydsl in ("on", "possible")
    comp = "compile_settings" not in missing
    return SwitchSettings(fly,
                    bool(ic.flydsl_enable_autotuning) if comp else None,
                    str(ic.max_autotune_gemm_search_space).upper() if comp else None,
                    tuple(n for n in SDPA_BACKENDS if snap.sdpa.get(n)) if snap.sdpa else None,
                    _fa_name(snap.rocm_fa) if "rocm_fa_library" not in missing and snap.rocm_fa is not None
                    else None)


def rocm_fa_library() -> str | None:
    """``torch.backends.cuda.preferred_rocm_fa_library()`` as a name (``"aotriton"``, ``"ck"``,
    ``"default"``), or ``None`` where this torch has no such preference. A CUDA build answers
    too (``"default"``), though the preference selects nothing there."""
    snap = snapshot()
    return None if snap.rocm_fa is None else _fa_name(snap.rocm_fa)


def _check_settings(s: SwitchSettings) -> None:
    for op in s.flydsl:
        _check_ops([op])
    comp_ops = compile_ops()
    comp = {s.flydsl[o] for o in comp_ops if o in s.flydsl}
    if len(comp) > 1:
        raise UsageError(f"{_and(comp_ops)} share one torch setting "
                         "(max_autotune_gemm_backends): give them the same value, got "
                         + ", ".join(f"{o}={s.flydsl[o]}" for o in comp_ops if o in s.flydsl))
    if s.search_space is not None and str(s.search_space).upper() not in ("DEFAULT", "EXHAUSTIVE"):
        raise bad_choice("search space", s.search_space, ("DEFAULT", "EXHAUSTIVE"))
    if s.sdpa_backends is not None:
        _sdpa_names(s.sdpa_backends)
    if s.rocm_fa_library is not None and s.rocm_fa_library not in ROCM_FA_LIBRARIES:
        raise bad_choice("ROCm flash-attention library", s.rocm_fa_library, ROCM_FA_LIBRARIES)


def set_compile_settings(autotuning: bool | None = None, search_space: str | None = None,
                         strict: bool = False) -> None:
    """Set FlyDSL's search space for compiled GEMMs without switching FlyDSL on or off:
    ``torch._inductor.config.flydsl_enable_autotuning`` (``autotuning``; off = one baseline
    config per shape) and ``max_autotune_gemm_search_space`` (``"DEFAULT"`` / ``"EXHAUSTIVE"``;
    exhaustive with autotuning on = the exhaustive config list,
    ``torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs``). ``None`` leaves a value.
    Where this torch has no FlyDSL templates nothing changes; ``strict=True`` raises
    :class:`SwitchUnavailable` then. Raises :class:`UsageError` for a bad search space."""
    from torch._inductor import config as ic

    if search_space is not None and str(search_space).upper() not in ("DEFAULT", "EXHAUSTIVE"):
        raise bad_choice("search space", search_space, ("DEFAULT", "EXHAUSTIVE"))
    if autotuning is None and search_space is None:
        return
    missing = compile_mechanism()
    if missing:
        if strict:
            raise SwitchUnavailable(f"cannot set FlyDSL's search space: {missing}")
        return
    if autotuning is not None:
        ic.flydsl_enable_autotuning = bool(autotuning)
    if search_space is not None:
        ic.max_autotune_gemm_search_space = str(search_space).upper()


def apply_settings(s: SwitchSettings, *, strict: bool = False, warn: bool = True) -> None:
    """Put every switch to ``s`` (checked first: :class:`UsageError` for unknown names,
    disagreeing compiled GEMMs, a bad search space or SDPA name; nothing changed then). FlyDSL
    on/off per operator first (attention before the SDPA settings, so that explicit SDPA
    settings win), then the compile settings, then SDPA. Turning on what
    :func:`unavailable` lists warns (:class:`SwitchUnavailableWarning`) or, with ``strict``,
    raises :class:`SwitchUnavailable`."""
    _check_settings(s)
    missing = unavailable()
    on = [o for o, v in s.flydsl.items() if v]
    off = [o for o, v in s.flydsl.items() if not v]
    if off:
        set_flydsl(off, False, strict=strict, warn=warn)
    if on:
        set_flydsl(on, True, strict=strict, warn=warn)
    set_compile_settings(s.autotuning, s.search_space, strict=strict)
    fa = s.rocm_fa_library if "rocm_fa_library" not in missing else None
    set_sdpa(s.sdpa_backends, fa)


@contextlib.contextmanager
def using(s: SwitchSettings, *, strict: bool = False, warn: bool = False) -> Iterator[Snapshot]:
    """Context manager: every switch as in ``s`` inside the block (:func:`apply_settings`);
    on exit exactly the state found on entry (also after an exception). Yields the entry
    :class:`Snapshot`. What :class:`flyexplore.ui.widgets.SwitchPanel` gives a sweep."""
    _check_settings(s)
    snap = snapshot()
    try:
        apply_settings(s, strict=strict, warn=warn)
        yield snap
    finally:
        restore(snap)


def flydsl_eager(enabled: bool, ops: Iterable[str]):
    """Context manager turning torch's FlyDSL eager overrides for ``ops`` on or off, through
    :func:`flydsl` (which restores every switch on exit). Where the
    installed torch has no ``torch.backends.python_native`` (torch < 2.13) "off" is already
    true and "on" cannot happen: both are silent no-ops here (backends check availability
    first; :mod:`flyexplore.world.switches` itself warns). Off also turns torch's embedded native-AOT
    kernels off, as ``python_native.flydsl.disabled()`` does, so "off" is stock ATen."""
    return flydsl(*ops, enabled=enabled, warn=False, native_aot=None if enabled else False)
