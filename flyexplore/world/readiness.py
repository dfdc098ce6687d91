"""Is this environment ready for FlyDSL? One model for ``env``, ``explain``, the sweep and the X-ray.

The environment half of every FlyDSL verdict lives here, once:

- what is installed: :func:`has_module`, :func:`flydsl_version` (the metadata text torch reads,
  or :data:`NOT_INSTALLED` / :data:`NO_METADATA`), :func:`flydsl_built` (the ``_mlir`` runtime);
- the rules torch 2.15 applies to it, as :class:`RuleVerdict` s: :func:`flydsl_installed`,
  :func:`eager_flydsl_version` (``torch/_native/flydsl_utils.py::_version_is_ok``),
  :func:`compile_flydsl_runtime`
  (``torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason``),
  :func:`native_jit`, :func:`eager_arch` and :func:`compile_arch`;
- the one arch resolver, :func:`torch_eager_arch` (``_resolve_rocm_arch``), and the switch
  reading :func:`env_int_is_one` (``torch/_native/common_utils.py``).

:class:`EnvFacts` gathers what decides FlyDSL outside the call (torch build, flydsl version and
runtime, device arch and CU count, switches, Inductor settings); :func:`eager_environment` and
:func:`compile_environment` turn them into :class:`~flyexplore.world.conditions.Condition` lists for
the two routes torch 2.15 has (eager overrides of ``torch/_native``; Inductor templates), and
:mod:`flyexplore.world.env` turns the same verdicts into its report's checks (which also decide
whether the sweep's ``flydsl`` backends are available). Every rule is held against torch 2.15's
own functions in ``tests/ops/test_explain_agreement.py``; versions are read with ``packaging``, as
torch does (its vendored ``torch/_vendor/packaging``).
"""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from packaging.version import InvalidVersion, Version

from flyexplore.errors import UsageError
from flyexplore.world.conditions import SRC_GATE, SRC_NATIVE, Condition, cond
from flyexplore.world.routes import route_of

#: CUs of an MI355X (datasheet); TopK's row gate compares M with the device's CU count.
MI355X_CUS = 256
#: The one arch torch 2.15 dispatches FlyDSL on (``torch/_native/flydsl_utils.py::_is_supported_arch``
#: callers pass ``("gfx950",)``; ``torch/_inductor/utils.py::use_flydsl_gemm_template`` compares
#: with ``"gfx950"``).
FLYDSL_ARCH = "gfx950"
#: flydsl release series (major, minor) each torch release accepts, by torch "major.minor".
#: torch 2.15.0: ``torch/_native/flydsl_utils.py::_FLYDSL_SUPPORTED_RELEASES = ((0, 3),)`` and
#: ``torch/_inductor/codegen/flydsl/flydsl_utils.py::_FLYDSL_SUPPORTED_RELEASE = (0, 3)``.
ACCEPTED_FLYDSL_SERIES: dict[str, tuple[int, int]] = {"2.15": (0, 3)}
#: The series the rules below judge against (torch 2.15's).
FLYDSL_SERIES = ACCEPTED_FLYDSL_SERIES["2.15"]
#: :func:`flydsl_version` when ``import flydsl`` would fail (``find_spec`` finds nothing).
NOT_INSTALLED = "not installed"
#: :func:`flydsl_version` when flydsl is importable but has no distribution metadata (a source
#: checkout on ``PYTHONPATH``): torch reads its version as missing.
NO_METADATA = "installed, no version metadata"
#: The install line for the accepted series.
FLYDSL_FIX = "pip install 'flydsl==%d.%d.*'" % FLYDSL_SERIES
_SRC_INDUCTOR_RT = "torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason"


# -- what is installed ----------------------------------------------------------------------

def has_module(name: str) -> bool:
    """Whether ``importlib.util.find_spec(name)`` would find ``name``, without importing anything
    that is not imported yet. ``False`` where the lookup raises, as torch's
    ``torch/_native/common_utils.py::_unavailable_reason`` treats it.

    ``find_spec`` of a dotted name imports its parent packages: for
    ``torch._inductor.codegen.flydsl`` that is Inductor and Dynamo, 1.8 CPU-s in every process
    that reads the environment (each A/B worker at its start) and never runs a compile. So where
    the parent is not imported, its folders are searched (``importlib.machinery.PathFinder``,
    the finder of every module in a folder) one level at a time from the top-level package, which
    ``find_spec`` finds as it would. A parent imported already is asked as ``find_spec`` asks it."""
    top, _, rest = name.partition(".")
    try:
        if not rest:
            return importlib.util.find_spec(name) is not None
        parent = name.rpartition(".")[0]
        if parent in sys.modules:
            return importlib.util.find_spec(name) is not None
        spec = importlib.util.find_spec(top)
        prefix = top
        for part in rest.split("."):
            if spec is None or not spec.submodule_search_locations:
                return False
            prefix = f"{prefix}.{part}"
            mod = sys.modules.get(prefix)
            spec = (mod.__spec__ if mod is not None and getattr(mod, "__spec__", None) else
                    importlib.machinery.PathFinder.find_spec(prefix, list(spec.submodule_search_locations)))
        return spec is not None
    except (ImportError, ValueError):
        return False


def flydsl_version() -> str:
    """flydsl as torch sees it: :data:`NOT_INSTALLED` when ``find_spec("flydsl")`` finds nothing
    (``torch/_native/common_utils.py::_unavailable_reason``), else the ``Version`` of its
    distribution metadata (``importlib.metadata.version``, what
    ``torch/_native/common_utils.py::_available_version`` reads; may be invalid, see
    :func:`parse_version`), else :data:`NO_METADATA`."""
    if not has_module("flydsl"):
        return NOT_INSTALLED
    try:
        return importlib.metadata.version("flydsl") or NO_METADATA
    except importlib.metadata.PackageNotFoundError:
        return NO_METADATA


def parse_version(v: str | None) -> Version | None:
    """``packaging.version.Version(v)``, or ``None`` when ``v`` is ``None``, :data:`NOT_INSTALLED`,
    :data:`NO_METADATA` or not a PEP 440 version -- torch's ``_available_version`` returns
    ``None`` for missing and invalid metadata alike."""
    if not v:
        return None
    try:
        return Version(v)
    except InvalidVersion:
        return None


def version_tuple(v: str | None) -> tuple[int, ...] | None:
    """The (major, minor) release of version text ``v`` (``"0.3.4+g5a1b2c3"`` -> ``(0, 3)``),
    ``None`` when it does not parse (:func:`parse_version`)."""
    p = parse_version(v)
    return None if p is None else tuple(p.release[:2])


def is_prerelease(v: str | None) -> bool:
    """Whether ``v`` is a PEP 440 pre-release (``a``/``b``/``rc``/``c``/``pre``/``preview`` or
    ``.dev``): ``packaging``'s ``Version.is_prerelease``, which torch's eager version check
    refuses. ``False`` for text that does not parse."""
    p = parse_version(v)
    return bool(p is not None and p.is_prerelease)


def flydsl_built() -> bool:
    """flydsl's ``_mlir`` runtime is present: ``PathFinder.find_spec("_mlir")`` in the flydsl
    package's folders, found without importing flydsl, as
    ``torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason``
    looks for it. ``False`` when flydsl itself is not found."""
    try:
        spec = importlib.util.find_spec("flydsl")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.submodule_search_locations is None:
        return False
    from importlib.machinery import PathFinder
    try:
        return PathFinder.find_spec("_mlir", list(spec.submodule_search_locations)) is not None
    except (ImportError, ValueError):
        return False


def env_int_is_one(environ: Mapping[str, str], name: str) -> bool:
    """torch's reading of its switches, ``int(os.getenv(name, 0)) == 1``
    (``torch/_native/common_utils.py::check_native_jit_disabled`` /
    ``check_native_version_skip``): ``"1"``, ``" 1"``, ``"01"`` are on, ``"0"``, ``"2"`` off.
    Text ``int()`` refuses (``"true"``, ``""``) makes torch raise ``ValueError`` on first use;
    here it reads as off."""
    try:
        return int(environ.get(name, 0)) == 1
    except ValueError:
        return False


# -- the rules ------------------------------------------------------------------------------

class RuleVerdict(NamedTuple):
    """One environment rule, evaluated: ``ok``, why in words (``detail``) and the fix where
    there is one. :func:`eager_environment` / :func:`compile_environment` show it as a
    :class:`~flyexplore.world.conditions.Condition`, :mod:`flyexplore.world.env` as a ``Check``."""

    ok: bool
    detail: str
    fix: str | None = None


def is_installed(v: str | None) -> bool:
    """A flydsl version text that means installed (a version, or :data:`NO_METADATA`)."""
    return bool(v) and v != NOT_INSTALLED


def flydsl_installed(version: str | None) -> RuleVerdict:
    """flydsl importable (``version`` as :func:`flydsl_version` gives it; ``None`` = not
    installed): the first thing both routes ask (``find_spec("flydsl")``)."""
    if not is_installed(version):
        return RuleVerdict(False, "flydsl is not installed", FLYDSL_FIX)
    return RuleVerdict(True, "flydsl is importable" + ("" if version == NO_METADATA else f" ({version})"))


def _series(torch: str) -> tuple[str, RuleVerdict | None]:
    series = ACCEPTED_FLYDSL_SERIES.get(torch)
    if series is None:
        return "", RuleVerdict(False, f"torch {torch} has no FlyDSL integration (first in torch 2.15)",
                           "install torch >= 2.15 (a ROCm build)")
    return "%d.%d" % series, None


def eager_flydsl_version(version: str | None, environ: Mapping[str, str], torch: str = "2.15") -> RuleVerdict:
    """The eager overrides' version check on an importable flydsl (``version`` as
    :func:`flydsl_version` gives it), by torch 2.15's
    ``torch/_native/flydsl_utils.py::_version_is_ok``: ``TORCH_NATIVE_SKIP_VERSION_CHECK=1``
    (:func:`env_int_is_one`) accepts anything, missing metadata included; else the metadata
    must parse (``packaging``), be in the series ``torch`` ("major.minor") accepts
    (:data:`ACCEPTED_FLYDSL_SERIES`, ``release[:2]``) and not be a pre-release
    (``Version.is_prerelease``: ``.dev``, ``a``, ``b``, ``rc``, ``c``, ``pre``). Local
    versions (``0.3.4+g5a1b2c3``) and post releases pass."""
    want, bad = _series(torch)
    if bad:
        return bad
    if env_int_is_one(environ, "TORCH_NATIVE_SKIP_VERSION_CHECK"):
        return RuleVerdict(True, f"flydsl {version}: version check skipped by TORCH_NATIVE_SKIP_VERSION_CHECK=1")
    p = parse_version(version)
    fix = f"pip install 'flydsl=={want}.*'"
    if p is None:
        what = "without version metadata" if version in (None, NO_METADATA) else f"with invalid version {version!r}"
        return RuleVerdict(False, f"flydsl is installed {what}: torch {torch} refuses missing or invalid "
                       "FlyDSL version metadata", f"pip install --force-reinstall 'flydsl=={want}.*'")
    if p.release[:2] != tuple(int(x) for x in want.split(".")):
        return RuleVerdict(False, f"flydsl {version} installed but torch {torch} accepts {want}.x (stable releases)", fix)
    if p.is_prerelease:
        return RuleVerdict(False, f"flydsl {version} is a pre-release: torch {torch} accepts {want}.x stable "
                       "releases only", fix)
    return RuleVerdict(True, f"flydsl {version} (torch {torch} accepts {want}.x, stable releases)")


def compile_flydsl_runtime(version: str | None, built: bool, torch: str = "2.15") -> RuleVerdict:
    """The Inductor templates' runtime check, in torch 2.15's order
    (``torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason``):
    flydsl importable, its ``_mlir`` runtime present (``built``, :func:`flydsl_built`), the
    version metadata valid, in the series ``torch`` accepts. Pre-releases of that series pass
    (no ``is_prerelease`` test here) and ``TORCH_NATIVE_SKIP_VERSION_CHECK`` does not apply."""
    want, bad = _series(torch)
    if bad:
        return bad
    fix = f"pip install 'flydsl=={want}.*'"
    if not is_installed(version):
        return RuleVerdict(False, "flydsl is not installed", fix)
    if not built:
        return RuleVerdict(False, "flydsl's _mlir runtime is missing (runtime not built)", f"install a built wheel: {fix}")
    p = parse_version(version)
    if p is None:
        return RuleVerdict(False, "missing or invalid FlyDSL version metadata"
                       + ("" if version == NO_METADATA else f" ({version!r})"),
                       f"pip install --force-reinstall 'flydsl=={want}.*'")
    if p.release[:2] != tuple(int(x) for x in want.split(".")):
        return RuleVerdict(False, f"flydsl {version} refused: Inductor accepts {want}.x only "
                       "(TORCH_NATIVE_SKIP_VERSION_CHECK does not apply here)", fix)
    pre = " (a pre-release: Inductor takes it, the eager overrides do not)" if p.is_prerelease else ""
    return RuleVerdict(True, f"flydsl {version} runtime available{pre}")


def native_jit(environ: Mapping[str, str]) -> RuleVerdict:
    """``TORCH_DISABLE_NATIVE_JIT=1`` keeps every eager override from registering
    (``torch/_native/common_utils.py::check_native_jit_disabled``, read with :func:`env_int_is_one`)."""
    if env_int_is_one(environ, "TORCH_DISABLE_NATIVE_JIT"):
        return RuleVerdict(False, "TORCH_DISABLE_NATIVE_JIT=1: no override was registered", "unset TORCH_DISABLE_NATIVE_JIT")
    return RuleVerdict(True, "TORCH_DISABLE_NATIVE_JIT not set to 1")


def torch_eager_arch(environ: Mapping[str, str], device_arch: str | None) -> tuple[str | None, str]:
    """The arch torch's eager FlyDSL predicates compare with gfx950, and where it came from
    (``"FLYDSL_GPU_ARCH"``, ``"HSA_OVERRIDE_GFX_VERSION"``, ``"device gcnArchName"`` or
    ``"no ROCm device"``), by the rule of ``torch/_native/flydsl_utils.py::_resolve_rocm_arch``:
    a non-empty ``FLYDSL_GPU_ARCH`` wins as given up to the first ``:`` (no other
    normalisation: ``9.5.0`` stays ``9.5.0``); else a non-empty ``HSA_OVERRIDE_GFX_VERSION``
    starting ``gfx`` (up to ``:``), or of three dot-separated parts ``major.minor.stepping`` ->
    ``gfx{major}{minor}{stepping as hex}`` when the stepping is an integer; any other value is
    ignored; else ``device_arch`` (the device's gcnArchName up to ``:``, or ``None``). A variable
    that is set but ignored (empty, or an ``HSA_OVERRIDE_GFX_VERSION`` such as ``9.5``) is said
    in the source: ``"no ROCm device; HSA_OVERRIDE_GFX_VERSION='9.5' set but not used: ..."``."""
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
    ignored = [f"{k}={environ[k]!r} set but not used" for k in ("FLYDSL_GPU_ARCH", "HSA_OVERRIDE_GFX_VERSION")
               if k in environ]
    if hsa is not None:
        ignored[-1] += ": torch reads only gfxNNN or MAJOR.MINOR.STEPPING such as 9.5.0"
    why = "".join(f"; {x}" for x in ignored)
    if device_arch:
        return device_arch.split(":", 1)[0], "device gcnArchName" + why
    return None, "no ROCm device" + why


def eager_arch(environ: Mapping[str, str], device_arch: str | None) -> RuleVerdict:
    """The eager overrides' arch gate: :func:`torch_eager_arch` is gfx950
    (``_is_supported_arch(device, ("gfx950",))``)."""
    arch, src = torch_eager_arch(environ, device_arch)
    if arch == FLYDSL_ARCH:
        return RuleVerdict(True, f"arch {arch} (from {src})")
    what = (f"arch {arch} (from {src})" if arch else
            f"arch unknown ({src})" if ";" in src else
            "arch unknown (no ROCm device, FLYDSL_GPU_ARCH or HSA_OVERRIDE_GFX_VERSION)")
    return RuleVerdict(False, what + ": FlyDSL overrides need gfx950",
                   "FlyDSL paths in torch 2.15 need gfx950 (MI350X/MI355X); "
                   "FLYDSL_GPU_ARCH=gfx950 only helps compile-only use")


def compile_arch(device_arch: str | None, environ: Mapping[str, str]) -> RuleVerdict:
    """The Inductor templates' arch gate: the device's gcnArchName (up to ``:``) is gfx950
    (``torch/_inductor/codegen/flydsl/flydsl_scheduling.py::_get_flydsl_device_arch``);
    ``FLYDSL_GPU_ARCH`` and ``HSA_OVERRIDE_GFX_VERSION`` are not consulted."""
    arch = device_arch.split(":", 1)[0] if device_arch else None
    if arch == FLYDSL_ARCH:
        return RuleVerdict(True, f"device arch {arch} (gcnArchName)")
    detail = (f"device arch {arch} (gcnArchName)" if arch else "no ROCm device (Inductor reads the device's "
              "gcnArchName only)") + ": FlyDSL templates need gfx950"
    if environ.get("FLYDSL_GPU_ARCH") or environ.get("HSA_OVERRIDE_GFX_VERSION"):
        detail += " (FLYDSL_GPU_ARCH / HSA_OVERRIDE_GFX_VERSION are not consulted by this gate)"
    return RuleVerdict(False, detail, "FlyDSL GEMM templates in torch 2.15 need a gfx950 device (MI350X/MI355X)")


@dataclass(frozen=True)
class EnvFacts:
    """Everything outside the call that decides FlyDSL (see :func:`facts`).

    ``flydsl_version``: flydsl's version text as torch reads it (:func:`flydsl_version`;
    ``None`` = not installed, :data:`NO_METADATA` or invalid text = missing or invalid
    metadata); ``flydsl_built``: its ``_mlir`` runtime is present (:func:`flydsl_built`);
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


def eager_environment(f: EnvFacts, op: str) -> list[Condition]:
    """Environment and switch conditions of the eager FlyDSL override for ``op``."""
    path = route_of(op)
    out = []
    mod = path.module
    out.append(cond("override in torch", f.eager_modules.get(op, False),
                  f"torch {f.torch_version} has the FlyDSL {op} override" if f.eager_modules.get(op)
                  else f"torch {f.torch_version} has no FlyDSL {op} override (module {mod} not found)",
                  (mod or "?").replace(".", "/") + ".py", "environment"))
    out.append(cond("ROCm build", f.rocm, "ROCm build of torch (torch.version.hip set)" if f.rocm
                  else f"torch {f.torch_version} is not a ROCm build: FlyDSL overrides never register",
                  f"{SRC_NATIVE}::_check_runtime_available", "environment"))
    inst = flydsl_installed(f.flydsl_version)
    if not inst.ok:
        out.append(cond("flydsl installed", False, f"{inst.detail} ({inst.fix})",
                      f"{SRC_NATIVE}::_check_runtime_available", "environment"))
    else:
        v = eager_flydsl_version(f.flydsl_version, f.environ)
        why = v.detail if v.ok else v.detail + " (or set TORCH_NATIVE_SKIP_VERSION_CHECK=1)"
        out.append(cond("flydsl version", v.ok, why, f"{SRC_NATIVE}::_version_is_ok", "environment"))
    jit = native_jit(f.environ)
    out.append(cond("native JIT not disabled", jit.ok, jit.detail,
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
    arch = eager_arch(f.environ, f.device_arch)
    out.append(cond("arch gfx950", arch.ok, arch.detail,
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
    rt = compile_flydsl_runtime(f.flydsl_version, f.flydsl_built)
    out.append(cond("flydsl runtime", rt.ok, rt.detail, _SRC_INDUCTOR_RT, "environment"))
    arch = compile_arch(f.device_arch, f.environ)
    out.append(cond("device arch gfx950", arch.ok, arch.detail,
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
        raise UsageError(f"bad arch {arch!r} (expected a gfx name, e.g. {', '.join(ARCHES)})")
