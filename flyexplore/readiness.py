"""Is this environment ready for FlyDSL? One model for ``env``, ``explain``, the sweep and the X-ray.

:class:`EnvFacts` gathers what decides FlyDSL outside the call (torch build, flydsl version and
runtime, device arch and CU count, switches, Inductor settings); :func:`eager_environment` and
:func:`compile_environment` turn them into :class:`~flyexplore.conditions.Condition` lists for
the two routes torch 2.15 has (eager overrides of ``torch/_native``; Inductor templates), and
:func:`torch_eager_arch` is the arch resolver of the eager route. Every rule is held against
torch 2.15's own functions in ``tests/test_explain_agreement.py``.
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .conditions import SRC_GATE, SRC_NATIVE, Condition, cond

#: CUs of an MI355X (datasheet); TopK's row gate compares M with the device's CU count.
MI355X_CUS = 256
#: The one arch torch 2.15 dispatches FlyDSL on (``torch/_native/flydsl_utils.py::_is_supported_arch``).
FLYDSL_ARCH = "gfx950"


# -- the environment ----------------------------------------------------------------------

def version_tuple(v: str | None):
    if not v:
        return None
    m = re.match(r"^\s*(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_prerelease(v: str) -> bool:
    return re.search(r"\d(a|b|rc|dev|alpha|beta)\d*", v.lower()) is not None


def env_int_is_one(environ: Mapping[str, str], name: str) -> bool:
    """torch's ``int(os.getenv(name, 0)) == 1`` (``torch/_native/common_utils.py``)."""
    try:
        return int(environ.get(name, 0)) == 1
    except ValueError:
        return False


def torch_eager_arch(environ: Mapping[str, str], device_arch: str | None) -> tuple[str | None, str]:
    """The arch torch's eager FlyDSL predicates compare with gfx950, and where it came from:
    ``FLYDSL_GPU_ARCH`` (text before ``:``), else ``HSA_OVERRIDE_GFX_VERSION`` (``gfx...`` or
    ``major.minor.stepping`` -> ``gfx{major}{minor}{stepping:x}``), else the device's
    gcnArchName (``torch/_native/flydsl_utils.py::_resolve_rocm_arch``)."""
    env = environ.get("FLYDSL_GPU_ARCH")
    if env:
        return env.split(":", 1)[0], "FLYDSL_GPU_ARCH"
    hsa = environ.get("HSA_OVERRIDE_GFX_VERSION")
    if hsa:
        if hsa.startswith("gfx"):
            return hsa.split(":", 1)[0], "HSA_OVERRIDE_GFX_VERSION"
        if hsa.count(".") == 2:
            major, minor, step = hsa.split(".")
            try:
                return f"gfx{major}{minor}{int(step):x}", "HSA_OVERRIDE_GFX_VERSION"
            except ValueError:
                pass
    return device_arch, "device gcnArchName" if device_arch else "no ROCm device"


def flydsl_built() -> bool:
    """flydsl's ``_mlir`` runtime is present (found without importing flydsl, as torch's
    ``torch/_inductor/codegen/flydsl/flydsl_utils.py`` does)."""
    try:
        spec = importlib.util.find_spec("flydsl")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    from importlib.machinery import PathFinder
    try:
        return PathFinder.find_spec("_mlir", list(spec.submodule_search_locations)) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class EnvFacts:
    """Everything outside the call that decides FlyDSL (see :func:`facts`).

    ``device_arch``: the device's gcnArchName (the compile gate reads only this);
    ``environ``: the environment variables the rules read; ``eager_switch``: op ->
    (flydsl DSL enabled, disabled op symbols, CUDA dispatch key disabled) or ``None`` without
    python_native; ``registered``: op symbols FlyDSL registered in this process (``None`` =
    unknown / assumed); ``inductor``: the Inductor settings a compile would use.
    """

    torch_version: str
    rocm: bool
    flydsl_version: str | None
    flydsl_built: bool
    eager_modules: dict[str, bool]
    has_templates: bool
    device_arch: str | None
    cu_count: int
    cu_source: str
    environ: dict[str, str]
    eager_switch: dict[str, tuple] | None
    registered: tuple[str, ...] | None
    inductor: dict[str, Any]
    assumed: str | None = None


_ENV_KEYS = ("FLYDSL_GPU_ARCH", "HSA_OVERRIDE_GFX_VERSION", "TORCH_DISABLE_NATIVE_JIT",
             "TORCH_NATIVE_SKIP_VERSION_CHECK")


def facts(*, arch: str | None = None, cu: int | None = None, assume_rocm: bool = False,
          compile_options: Mapping[str, Any] | None = None,
          environ: Mapping[str, str] | None = None) -> EnvFacts:
    """Collect the :class:`EnvFacts` of this process.

    ``arch``: take this as the device's gcnArchName (a what-if; eager env overrides still
    apply). ``cu``: CU count for TopK's row gate (default: the ROCm device's, else 256 =
    MI355X). ``assume_rocm``: assume a ROCm torch 2.15 with flydsl 0.3.x, the overrides
    registered, on ``arch`` (default gfx950). ``compile_options``: Inductor options as given
    to ``torch.compile(options=...)`` on top of the current ``torch._inductor.config``.
    """
    import torch
    from torch._inductor import config as ic

    from . import switches as S
    from .env import collect

    from .ops import flydsl_ops, get_op

    eager = flydsl_ops("eager")
    environ = dict(os.environ if environ is None else environ)
    env = collect()
    ind = {k: getattr(ic, k, None) for k in ("max_autotune", "max_autotune_gemm", "max_autotune_gemm_backends",
                                             "max_autotune_gemm_search_space", "flydsl_enable_autotuning",
                                             "assume_aligned_inputs")}
    for k, v in (compile_options or {}).items():
        if k == "mode":
            if v in ("max-autotune", "max-autotune-no-cudagraphs"):
                ind["max_autotune"] = True
            continue
        ind[k] = v
    rocm = env.platform == "rocm" or bool(getattr(torch.version, "hip", None))
    dev_arch = env.device.arch if env.platform == "rocm" else None
    if arch:
        dev_arch = arch
    if cu is not None:
        cus, cu_src = int(cu), "given"
    elif env.platform == "rocm":
        cus, cu_src = env.device.compute_units, f"{env.device.name}"
    else:
        cus, cu_src = MI355X_CUS, "assumed MI355X"
    fly_v = env.versions.get("flydsl")
    fly_v = None if fly_v in (None, "", "not installed") else fly_v
    eager_mods = {op: S.eager_mechanism(op) is None for op in eager}
    eager_sw = None
    if S._pn() is not None and S._filter_sets() is not None:
        dsl, syms, keys = S._filter_sets()
        eager_sw = {op: ("flydsl" not in dsl, tuple(s for s in get_op(op).flydsl.aten_ops if s in syms), "CUDA" in keys)
                    for op in eager}
    registered = None
    if S._fly_controller() is not None:
        try:
            registered = tuple(S._pn().get_dsl_operations("flydsl"))
        except Exception:
            registered = None
    assumed = None
    if assume_rocm:
        dev_arch = arch or FLYDSL_ARCH
        assumed = (f"a ROCm build of torch 2.15 with flydsl 0.3.x, overrides registered, device "
                   f"{dev_arch} with {cus} CUs ({cu_src}); switches and settings as in this process")
        return EnvFacts("2.15 (assumed)", True, "0.3 (assumed)", True, {op: True for op in eager}, True,
                        dev_arch, cus, cu_src, {k: environ[k] for k in _ENV_KEYS if k in environ},
                        eager_sw or {op: (True, (), False) for op in eager}, None, ind, assumed)
    return EnvFacts(torch.__version__, rocm, fly_v, flydsl_built(), eager_mods, S.compile_mechanism() is None,
                    dev_arch, cus, cu_src, {k: environ[k] for k in _ENV_KEYS if k in environ},
                    eager_sw, registered, ind, None)


def eager_environment(f: EnvFacts, op: str) -> list[Condition]:
    """Environment and switch conditions of the eager FlyDSL override for ``op``."""
    from .ops import get_op

    path = get_op(op).flydsl
    out = []
    mod = path.module
    out.append(cond("override in torch", f.eager_modules.get(op, False),
                  f"torch {f.torch_version} has the FlyDSL {op} override" if f.eager_modules.get(op)
                  else f"torch {f.torch_version} has no FlyDSL {op} override (first in torch 2.15)",
                  mod.replace(".", "/") + ".py", "environment"))
    out.append(cond("ROCm build", f.rocm, "ROCm build of torch (torch.version.hip set)" if f.rocm
                  else f"torch {f.torch_version} is not a ROCm build: FlyDSL overrides never register",
                  f"{SRC_NATIVE}::_check_runtime_available", "environment"))
    skip = env_int_is_one(f.environ, "TORCH_NATIVE_SKIP_VERSION_CHECK")
    if f.flydsl_version is None:
        out.append(cond("flydsl installed", False, "flydsl is not installed (pip install 'flydsl==0.3.*')",
                      f"{SRC_NATIVE}::_check_runtime_available", "environment"))
    else:
        vt = version_tuple(f.flydsl_version)
        ok = (vt == (0, 3) and not is_prerelease(f.flydsl_version)) or skip
        why = (f"flydsl {f.flydsl_version} accepted (stable 0.3.x)" if ok and not skip else
               f"flydsl {f.flydsl_version}: version check skipped by TORCH_NATIVE_SKIP_VERSION_CHECK=1" if ok else
               f"flydsl {f.flydsl_version} refused: torch 2.15 accepts stable 0.3.x only "
               "(or set TORCH_NATIVE_SKIP_VERSION_CHECK=1)")
        out.append(cond("flydsl version", ok, why, f"{SRC_NATIVE}::_version_is_ok", "environment"))
    jit_off = env_int_is_one(f.environ, "TORCH_DISABLE_NATIVE_JIT")
    out.append(cond("native JIT not disabled", not jit_off,
                  "TORCH_DISABLE_NATIVE_JIT=1: no override was registered" if jit_off
                  else "TORCH_DISABLE_NATIVE_JIT not set to 1",
                  "torch/_native/common_utils.py::check_native_jit_disabled", "environment"))
    prereq = all(c.ok for c in out)
    if prereq and f.registered is not None:
        sym = path.aten_ops[0]
        out.append(cond("override registered", sym in f.registered,
                      f"FlyDSL override of aten::{sym} registered in this process" if sym in f.registered
                      else f"no FlyDSL override of aten::{sym} registered in this process "
                      f"(torch.backends.python_native.get_dsl_operations('flydsl') = {list(f.registered)})",
                      "torch.backends.python_native.get_dsl_operations", "environment"))
    if f.eager_switch is None:
        out.append(cond("python_native", False, f"torch {f.torch_version} has no torch.backends.python_native",
                      "torch/backends/python_native/__init__.py", "switch"))
    else:
        dsl_on, off_syms, key_off = f.eager_switch[op]
        out.append(cond("flydsl DSL enabled", dsl_on, "FlyDSL overrides enabled (python_native.flydsl.enabled)"
                      if dsl_on else "FlyDSL overrides disabled (python_native.flydsl.disable() or a switch)",
                      "torch/backends/python_native/__init__.py::DSLController", "switch"))
        out.append(cond("op enabled", not off_syms, f"aten::{path.aten_ops[0]} not disabled" if not off_syms
                      else f"disabled by python_native.disable_operations({', '.join(map(repr, off_syms))})",
                      "torch/backends/python_native/__init__.py::disable_operations", "switch"))
        if key_off:
            out.append(cond("CUDA key", False, "the CUDA dispatch key is disabled for python_native overrides",
                          "torch/backends/python_native/__init__.py::disable_dispatch_keys", "switch"))
    arch, src = torch_eager_arch(f.environ, f.device_arch)
    out.append(cond("arch gfx950", arch == FLYDSL_ARCH,
                  (f"arch {arch} (from {src})" if arch else "no ROCm device and no FLYDSL_GPU_ARCH: arch unknown")
                  + ("" if arch == FLYDSL_ARCH else ": FlyDSL overrides need gfx950"),
                  f"{SRC_NATIVE}::_resolve_rocm_arch / _is_supported_arch", "environment"))
    return out


def compile_environment(f: EnvFacts) -> list[Condition]:
    """Environment and switch conditions of every FlyDSL Inductor template
    (``torch/_inductor/utils.py::use_flydsl_gemm_template``)."""
    out = [cond("templates in torch", f.has_templates,
              f"torch {f.torch_version} has FlyDSL Inductor templates" if f.has_templates
              else f"torch {f.torch_version} has no FlyDSL Inductor templates (first in torch 2.15)",
              "torch/_inductor/codegen/flydsl", "environment")]
    backends = str(f.inductor.get("max_autotune_gemm_backends") or "")
    listed = "FLYDSL" in [x.strip().upper() for x in backends.split(",")]
    out.append(cond("FLYDSL listed", listed, f"max_autotune_gemm_backends={backends!r} "
                  + ("lists FLYDSL" if listed else "does not list FLYDSL"), SRC_GATE, "switch"))
    ma = bool(f.inductor.get("max_autotune") or f.inductor.get("max_autotune_gemm"))
    out.append(cond("max-autotune", ma, "max-autotune on" if ma else
                  "max-autotune off (compile with mode='max-autotune' or max_autotune_gemm=True)", SRC_GATE, "switch"))
    out.append(cond("ROCm build", f.rocm, "ROCm build of torch" if f.rocm
                  else f"torch {f.torch_version} is not a ROCm build", SRC_GATE, "environment"))
    if f.flydsl_version is None:
        ok, why = False, "flydsl is not installed"
    elif not f.flydsl_built:
        ok, why = False, "flydsl's _mlir runtime is missing (runtime not built)"
    elif version_tuple(f.flydsl_version) != (0, 3):
        ok, why = False, (f"flydsl {f.flydsl_version} refused: Inductor accepts 0.3.x only "
                          "(TORCH_NATIVE_SKIP_VERSION_CHECK does not apply here)")
    else:
        ok, why = True, f"flydsl {f.flydsl_version} runtime available"
    out.append(cond("flydsl runtime", ok, why,
                  "torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason",
                  "environment"))
    arch_ok = f.device_arch == FLYDSL_ARCH
    detail = (f"device arch {f.device_arch} (gcnArchName)" if f.device_arch else "no ROCm device")
    if not arch_ok:
        detail += ": FlyDSL templates need gfx950"
        if f.environ.get("FLYDSL_GPU_ARCH"):
            detail += " (FLYDSL_GPU_ARCH is not consulted by this gate)"
    out.append(cond("device arch gfx950", arch_ok, detail,
                  "torch/_inductor/codegen/flydsl/flydsl_scheduling.py::_get_flydsl_device_arch", "environment"))
    return out


#: Architectures the inspector offers to judge against (gcnArchName -> devices). torch 2.15
#: dispatches FlyDSL on gfx950 only; the others show which rule says no.
ARCHES = {"gfx950": "MI350X / MI355X", "gfx942": "MI300X / MI325X", "gfx90a": "MI200",
          "gfx1201": "Radeon RX 9070"}


def check_arch(arch: str | None) -> None:
    """Raise :class:`~flyexplore.errors.UsageError` unless ``arch`` is None or a gfx name
    (``gfx950``, ``gfx90a``, ``gfx1201``)."""
    if arch is not None and not re.fullmatch(r"gfx\d{2,3}[0-9a-f]?", str(arch)):
        from .errors import UsageError
        raise UsageError(f"bad arch {arch!r} (expected a gfx name, e.g. {', '.join(ARCHES)})")
