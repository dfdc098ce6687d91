"""Environment report: platform, devices, versions and FlyDSL readiness.

``collect()`` returns an :class:`Environment` (frozen); ``flyexplore env [--json]`` prints it.
Every result row carries :meth:`Environment.fingerprint` so a number always says where it came
from, and :meth:`Environment.code_columns` (flyexplore's version and git commit) so it also says
which code measured it. :func:`provenance` is the same for a benchmark's output folder: the
commit, whether the tree had changes, flyexplore's version and the machine (no host name).

Which commit: :func:`git_commit` and :func:`git_dirty` read the git work tree the package lives in;
a copy without ``.git`` (the lent GPU machine receives one) is told by ``FLYEXPLORE_COMMIT`` and
``FLYEXPLORE_DIRTY``, which whoever starts the run there sets from the checkout it copied.

The FlyDSL readiness verdicts (which also decide whether the sweep's ``flydsl`` backends are
available) are :mod:`flyexplore.world.readiness`'s rules, the ones ``explain`` uses, shown as
:class:`Check` s with their fix (read from the torch 2.15.0 wheel's ``torch/_native`` and
``torch/_inductor`` modules):

- FlyDSL eager overrides (RMSNorm, TopK) register only on a ROCm build of torch
  (``torch.version.hip``) with flydsl importable, its version metadata a stable release of the
  series torch accepts (``torch/_native/flydsl_utils.py::_version_is_ok``; pre-releases and
  missing metadata refused unless ``TORCH_NATIVE_SKIP_VERSION_CHECK=1``), unless
  ``TORCH_DISABLE_NATIVE_JIT=1``, on gfx950 as :func:`resolve_target_arch` finds it.
- FlyDSL Inductor templates (mm, grouped mm, MXFP scaled mm) need a ROCm build, flydsl's
  ``_mlir`` runtime and valid version metadata in the accepted series (pre-releases pass:
  ``torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason``) and a
  gfx950 device (gcnArchName only); the switch half of
  ``torch._inductor.utils.use_flydsl_gemm_template`` is :mod:`flyexplore.world.switches`'.
- The target arch is ``FLYDSL_GPU_ARCH``, else ``HSA_OVERRIDE_GFX_VERSION``, else the device's
  ``gcnArchName`` (:func:`flyexplore.world.readiness.torch_eager_arch`).
- torch 2.15 accepts flydsl 0.3.x only; AOTriton's version is only in the file name of the
  bundled ``torch/lib/libaotriton_v2.so.X.Y.Z``.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform as _platform
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flyexplore._version import __version__
from flyexplore.atomic import write_text
from flyexplore.world import readiness as R
from flyexplore.world.readiness import ACCEPTED_FLYDSL_SERIES
from flyexplore.world.routes import routes

#: Environment variables that change which path torch takes; reported verbatim.
RELEVANT_ENV_VARS = (
    "FLYDSL_GPU_ARCH",
    "HSA_OVERRIDE_GFX_VERSION",
    "TORCH_DISABLE_NATIVE_JIT",
    "TORCH_NATIVE_SKIP_VERSION_CHECK",
    "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS",
    "FLYDSL_ENABLE_AUTOTUNING",
    "TORCH_ROCM_FA_PREFER_CK",
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
    "COMPILE_ONLY",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "TORCH_BLAS_PREFER_CUBLASLT",
    "PYTORCH_TUNABLEOP_ENABLED",
    "PYTORCH_TUNABLEOP_TUNING",
    "PYTORCH_TUNABLEOP_FILENAME",
)


@dataclass(frozen=True)
class Device:
    """One accelerator (or the host CPU when there is none).

    ``arch`` is the gcnArchName base (``gfx950``) on ROCm, ``sm_90`` style on CUDA and the
    machine string (``x86_64``) on CPU. ``memory_bytes`` and ``l2_bytes`` are bytes;
    ``compute_units`` is CUs (ROCm), SMs (CUDA) or logical cores (CPU).
    """

    index: int
    name: str
    arch: str
    compute_units: int
    memory_bytes: int
    l2_bytes: int | None = None


@dataclass(frozen=True)
class Check:
    """One condition of a readiness verdict, in words, with the fix where there is one."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Readiness:
    """Whether one FlyDSL path (``eager overrides`` or ``compile templates``) can be taken."""

    path: str
    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)


@dataclass(frozen=True)
class Environment:
    """What this process runs on. Build with :func:`collect`.

    ``platform`` is ``"rocm"``, ``"cuda"`` or ``"cpu"``; ``versions`` maps package names to
    version strings (``"not installed"`` / ``"not present"`` where absent).
    """

    platform: str
    devices: tuple[Device, ...]
    versions: dict[str, str]
    target_arch: str | None
    target_arch_source: str
    flydsl_eager: Readiness
    flydsl_compile: Readiness
    env_vars: dict[str, str] = field(default_factory=dict)
    host: str = ""
    #: Can ``flyexplore xray`` compile FlyDSL kernels for gfx950 here (no GPU needed)?
    flydsl_xray: Readiness | None = None
    #: flyexplore's git commit (:func:`git_commit`; ``""``: unknown).
    flyexplore_commit: str = ""
    #: ``"dirty"`` (tracked files changed since the commit), ``"clean"`` or ``""`` (unknown):
    #: :func:`git_dirty`.
    flyexplore_dirty: str = ""

    @property
    def device(self) -> Device:
        """The device results are measured on (index 0)."""
        return self.devices[0]

    def fingerprint(self) -> dict[str, str]:
        """Columns every result row carries: device, arch, platform and versions, torch's git
        version, the BLAS library torch prefers for GEMMs and TunableOp's state (on ROCm the two
        decide which kernel ATen's baseline runs: :func:`blas_state`).

        ``env_id`` is a short hash of the rest, so rows from one environment group together.
        """
        d = self.device
        fp = {
            "platform": self.platform,
            "device": d.name,
            "arch": d.arch,
            "torch": self.versions.get("torch", ""),
            "triton": self.versions.get("triton", ""),
            "flydsl": self.versions.get("flydsl", ""),
            "aotriton": self.versions.get("aotriton", ""),
            "gpu_runtime": self.versions.get("hip") or self.versions.get("cuda") or "",
            "python": self.versions.get("python", ""),
            "host": self.host,
            "torch_git": self.versions.get("torch_git", ""),
            "blas_library": self.versions.get("blas", ""),
            "tunableop": self.versions.get("tunableop", ""),
        }
        fp["env_id"] = hashlib.sha1(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]
        return fp

    def code_columns(self) -> dict[str, str]:
        """The result row's columns that name the code which measured it: ``flyexplore`` (the
        version) and ``flyexplore_commit`` (:func:`commit_label`: the commit, ``-dirty`` after it
        when tracked files had changed, ``-dirty?`` when that is unknown; ``""`` when the commit
        is unknown). Not part of :meth:`fingerprint`: ``env_id`` names the environment, not
        the code."""
        return {"flyexplore": self.versions.get("flyexplore", ""),
                "flyexplore_commit": commit_label(self.flyexplore_commit, self.flyexplore_dirty)}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["flydsl_eager"]["ready"] = self.flydsl_eager.ready
        out["flydsl_compile"]["ready"] = self.flydsl_compile.ready
        if self.flydsl_xray is not None:
            out["flydsl_xray"]["ready"] = self.flydsl_xray.ready
        out["fingerprint"] = self.fingerprint()
        return out

    def to_text(self) -> str:
        """A human-readable report (what ``flyexplore env`` prints)."""
        lines = [f"platform: {self.platform}"]
        for d in self.devices:
            mem = f"{d.memory_bytes / 2**30:.1f} GiB" if d.memory_bytes else "?"
            unit = {"rocm": "CUs", "cuda": "SMs"}.get(self.platform, "cores")
            lines.append(f"device {d.index}: {d.name} ({d.arch}), {d.compute_units} {unit}, {mem}")
        lines.append("versions:")
        for k, v in self.versions.items():
            lines.append(f"  {k}: {v}")
        lines.append(f"flyexplore commit: {commit_text(self.flyexplore_commit, self.flyexplore_dirty)}")
        tgt = self.target_arch or "none"
        lines.append(f"FlyDSL target arch: {tgt} (from {self.target_arch_source})")
        for r in (self.flydsl_eager, self.flydsl_compile, self.flydsl_xray):
            if r is None:
                continue
            lines.append(f"FlyDSL {r.path}: {'READY' if r.ready else 'not available'}")
            for c in r.checks:
                mark = "ok " if c.ok else "NO "
                lines.append(f"  [{mark}] {c.name}: {c.detail}")
                if not c.ok and c.fix:
                    lines.append(f"         fix: {c.fix}")
        if self.env_vars:
            lines.append("environment variables:")
            for k, v in self.env_vars.items():
                lines.append(f"  {k}={v}")
        return "\n".join(lines)


def _pkg_version(*names: str) -> str:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def aotriton_version(torch_dir: str | None = None) -> str:
    """AOTriton version (``"0.14.2"`` for release 0.14.2b) from the bundled
    ``<torch>/lib/libaotriton_v2.so.X.Y.Z`` file name; when only an unversioned
    ``libaotriton_v2.so`` is there, from the ``libaotriton_v2.so.X.Y.Z`` soname written inside it
    (AOTriton's CMake sets the library ``VERSION`` to X.Y.Z and no ``SOVERSION``, so the soname
    carries the full version: ``v3src/CMakeLists.txt`` at tag 0.13b).

    Returns ``"not present"`` when torch ships no AOTriton (CUDA and CPU builds) and
    ``"present, version unknown"`` when neither name tells. No Python API reports it
    (torch 2.15's ``torch.version`` has no AOTriton field). ``torch_dir``: the torch package folder
    (default: the installed torch's).
    """
    if torch_dir is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return "not present"
        torch_dir = os.path.dirname(spec.origin)
    best = None
    bare = []
    for path in sorted(glob.glob(os.path.join(torch_dir, "lib", "libaotriton*.so*"))):
        m = re.search(r"\.so\.(\d+(?:\.\d+)*)$", path)
        if m and (best is None or len(m.group(1)) > len(best)):
            best = m.group(1)
        elif not m and path.endswith(".so"):
            bare.append(path)
    if best:
        return best
    for path in bare:
        v = _soname_version(path)
        if v:
            return v
    return "present, version unknown" if bare else "not present"


_SONAME = re.compile(rb"libaotriton\w*?_v2\.so\.(\d+\.\d+\.\d+)")


def _soname_version(path: str) -> str | None:
    """The X.Y.Z of the first ``libaotriton*_v2.so.X.Y.Z`` string in the file (its soname)."""
    import mmap

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            m = _SONAME.search(mm)
            return m.group(1).decode() if m else None
    except (OSError, ValueError):  # unreadable, or empty (mmap of 0 bytes)
        return None


def resolve_target_arch(devices: tuple[Device, ...], platform: str,
                        environ: dict[str, str] | None = None) -> tuple[str | None, str]:
    """FlyDSL's target arch and where it came from, by torch's rule
    (:func:`flyexplore.world.readiness.torch_eager_arch`, ``torch/_native/flydsl_utils.py::
    _resolve_rocm_arch``): ``FLYDSL_GPU_ARCH``, then ``HSA_OVERRIDE_GFX_VERSION``, then the
    gcnArchName of ``devices[0]`` on ROCm; ``(None, "no ROCm device")`` when none applies.
    """
    environ = os.environ if environ is None else environ
    return R.torch_eager_arch(environ, devices[0].arch if platform == "rocm" and devices else None)


def blas_state(torch, platform: str) -> dict[str, str]:
    """What decides ATen's GEMM kernel besides the shape: ``blas``, the library torch prefers
    (``torch.backends.cuda.preferred_blas_library()``: ``cublas``, ``cublaslt``, ``hipblaslt``,
    ``ck``; set by ``TORCH_BLAS_PREFER_CUBLASLT`` / ``TORCH_BLAS_PREFER_HIPBLASLT`` when torch
    starts, or by that function) -- on the CPU the CPU BLAS torch was built with (``cpu: mkl`` or
    ``cpu: other``) -- and ``tunableop``: ``off``, or ``on`` with ``tuning`` / ``no tuning`` (TunableOp,
    ``PYTORCH_TUNABLEOP_ENABLED``, ``torch.cuda.tunable``: it picks among the BLAS library's
    solutions per shape, torch/cuda/tunable.py). Reading them creates no GPU context; a build
    without them reads ``unknown``."""
    out = {"blas": "unknown", "tunableop": "unknown"}
    try:
        if platform == "cpu":
            out["blas"] = "cpu: mkl" if torch.backends.mkl.is_available() else "cpu: other"
        else:
            out["blas"] = str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()
    except Exception:  # noqa: BLE001 - an older or partial build
        pass
    try:
        import torch.cuda.tunable as tunable

        out["tunableop"] = (("on, tuning" if tunable.tuning_is_enabled() else "on, no tuning")
                            if tunable.is_enabled() else "off")
    except Exception:  # noqa: BLE001
        pass
    return out


def _torch_series(torch_version: str) -> str:
    return ".".join(torch_version.split("+")[0].split(".")[:2])


def flydsl_version_check(torch_version: str, flydsl_version: str,
                         environ: dict[str, str] | None = None) -> Check:
    """Would this torch accept the installed flydsl for its eager overrides? ``flydsl_version``
    as :func:`flyexplore.world.readiness.flydsl_version` reports it (``"not installed"``, the metadata
    text, or ``readiness.NO_METADATA``). The rule is
    :func:`flyexplore.world.readiness.eager_flydsl_version` (torch 2.15: stable 0.3.x; pre-releases and
    missing or invalid metadata refused); ``environ`` (default: none) may carry
    ``TORCH_NATIVE_SKIP_VERSION_CHECK=1``."""
    tv = _torch_series(torch_version)
    inst = R.flydsl_installed(flydsl_version)
    if not inst.ok:
        want = ACCEPTED_FLYDSL_SERIES.get(tv)
        return Check("flydsl installed", False, inst.detail,
                     "pip install 'flydsl==%d.%d.*'" % want if want else "pip install flydsl")
    v = R.eager_flydsl_version(flydsl_version, environ or {}, tv)
    return Check("flydsl version accepted", v.ok, v.detail, None if v.ok else v.fix)


def _check(name: str, v: R.RuleVerdict) -> Check:
    return Check(name, v.ok, v.detail, None if v.ok else v.fix)


def _readiness(platform: str, versions: dict[str, str], environ: dict[str, str],
               device_arch: str | None, flydsl_built: bool) -> tuple[Readiness, Readiness]:
    tv = versions["torch"]
    fv = versions.get("flydsl", R.NOT_INSTALLED)
    rocm = Check("ROCm build of torch", platform == "rocm" or bool(versions.get("hip")),
                 "torch.version.hip is set" if versions.get("hip") else
                 f"torch {tv} is a {'CUDA' if versions.get('cuda') else 'CPU'} build, not ROCm",
                 "install a ROCm build of torch >= 2.15")
    mods = {r.op: r.module for r in routes("eager")}
    have = [op for op, m in mods.items() if m and R.has_module(m)]
    lack = [f"{op} ({m})" for op, m in mods.items() if op not in have]
    eager_code = Check("torch has FlyDSL eager overrides", bool(have),
                       (f"torch._native FlyDSL overrides present ({', '.join(have)})" if have
                        else f"torch {tv} has no torch._native FlyDSL ops")
                       + (f"; missing: {', '.join(lack)}" if have and lack else ""), "install torch >= 2.15")
    ver = flydsl_version_check(tv, fv, environ)
    arch = _check("target arch gfx950", R.eager_arch(environ, device_arch))
    jit = _check("native overrides not disabled", R.native_jit(environ))
    eager_checks = (eager_code, rocm, ver, arch, jit)
    comp_mod = R.has_module("torch._inductor.codegen.flydsl")
    comp_code = Check("torch has FlyDSL Inductor templates", comp_mod,
                      "torch._inductor.codegen.flydsl present" if comp_mod
                      else f"torch {tv} has no FlyDSL Inductor templates", "install torch >= 2.15")
    runtime = _check("flydsl runtime available",
                     R.compile_flydsl_runtime(fv, flydsl_built, _torch_series(tv)))
    # Inductor's gate reads the device's gcnArchName only
    # (torch/_inductor/codegen/flydsl/flydsl_scheduling.py::_get_flydsl_device_arch):
    # FLYDSL_GPU_ARCH and HSA_OVERRIDE_GFX_VERSION do not apply to the compile templates.
    dev_arch = _check("device arch gfx950", R.compile_arch(device_arch, environ))
    compile_checks = (comp_code, rocm, runtime, dev_arch)
    return Readiness("eager overrides", eager_checks), Readiness("compile templates", compile_checks)


#: Oldest LLD taken as able to link FlyDSL's gfx950 code objects. flydsl 0.3 emits AMDGPU code
#: object v6 (``.amdhsa_code_object_version 6`` in its ISA), which arrived with LLVM 19's generic
#: targets; only two versions were tried: Debian's lld-22 works, Debian's default lld 14 fails
#: ("unknown abi version"), tried on this project's Debian CI machine.
MIN_LLD_MAJOR = 19


@dataclass(frozen=True)
class Lld:
    """An ``ld.lld`` found on this machine: ``path``, ``major`` version (0 if unreadable),
    the ``version`` line it printed and where it was found (``source``)."""

    path: str
    major: int
    version: str
    source: str

    @property
    def amdgpu_capable(self) -> bool:
        return self.major >= MIN_LLD_MAJOR


def _lld_version(path: str) -> tuple[int, str]:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0, "did not run"
    line = (out.stdout or out.stderr).strip().splitlines()
    line = line[0] if line else ""
    m = re.search(r"LLD (\d+)", line)
    return (int(m.group(1)) if m else 0), line


def _lld_candidates(environ: dict[str, str]) -> list[tuple[str, str]]:
    cands = []
    if environ.get("FLYEXPLORE_LD_LLD"):
        cands.append((environ["FLYEXPLORE_LD_LLD"], "FLYEXPLORE_LD_LLD"))
    if environ.get("ROCM_PATH"):
        cands.append((os.path.join(environ["ROCM_PATH"], "llvm", "bin", "ld.lld"), "$ROCM_PATH/llvm/bin"))
    cands.append(("/opt/rocm/llvm/bin/ld.lld", "/opt/rocm"))
    versioned = []
    for d in glob.glob("/usr/lib/llvm-*/bin/ld.lld"):
        m = re.search(r"llvm-(\d+)", d)
        versioned.append((int(m.group(1)) if m else 0, d))
    cands += [(d, "Debian/Ubuntu lld package") for _, d in sorted(versioned, reverse=True)]
    on_path = shutil.which("ld.lld", path=environ.get("PATH"))
    if on_path:
        cands.append((on_path, "PATH"))
    return cands


def find_amdgpu_lld(environ: dict[str, str] | None = None) -> Lld | None:
    """The ``ld.lld`` FlyDSL should link gfx950 code objects with, or ``None`` if there is none.

    Looks at ``$FLYEXPLORE_LD_LLD``, ``$ROCM_PATH/llvm/bin``, ``/opt/rocm/llvm/bin``,
    ``/usr/lib/llvm-*/bin`` (newest first) and ``PATH``; returns the first one new enough
    (LLD >= :data:`MIN_LLD_MAJOR`), else the newest too-old one found (so the report can name
    it), else ``None``. FlyDSL itself looks only at ``$ROCM_PATH/llvm/bin/ld.lld``; the X-ray
    points ``ROCM_PATH`` at a folder linking to the one found here.
    """
    environ = dict(os.environ) if environ is None else environ
    found: list[Lld] = []
    seen = set()
    for path, source in _lld_candidates(environ):
        real = os.path.realpath(path)
        if real in seen or not (os.path.isfile(real) and os.access(real, os.X_OK)):
            continue
        seen.add(real)
        major, line = _lld_version(path)
        lld = Lld(path, major, line, source)
        if lld.amdgpu_capable:
            return lld
        found.append(lld)
    return max(found, key=lambda x: x.major) if found else None


#: torch files whose builders the X-ray calls (checked without importing torch).
_XRAY_BUILDERS = ("_native/ops/norm/flydsl_rmsnorm_fwd.py", "_native/ops/topk/flydsl_kernels.py",
                  "_inductor/kernel/vendored_templates/flydsl/kernels/gemm_gfx950.py")


def _torch_files_present(paths: tuple[str, ...]) -> bool:
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    root = os.path.dirname(spec.origin)
    return all(os.path.isfile(os.path.join(root, *p.split("/"))) for p in paths)


def _torch_at_least(version: str, want: tuple[int, int]) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= want


def xray_readiness(versions: dict[str, str] | None = None,
                   environ: dict[str, str] | None = None) -> Readiness:
    """Can the kernel X-ray (``flyexplore xray``) compile FlyDSL kernels for gfx950 here?

    Needs no GPU and no ROCm: torch >= 2.15 (whose ``torch._native`` / Inductor code builds the
    kernels), flydsl in the series that torch accepts (0.3.x stable for torch 2.15, the rule of
    :func:`flydsl_version_check`) with its ``_mlir`` runtime built (probed on the installed flydsl,
    :func:`flyexplore.world.readiness.flydsl_built`) and an AMDGPU-capable ``ld.lld`` (LLD >=
    :data:`MIN_LLD_MAJOR`; Debian: ``apt-get install lld-22``). ``versions`` as in
    :attr:`Environment.versions` (read from the installed packages if not given).
    """
    environ = dict(os.environ) if environ is None else environ
    if versions is None:
        versions = {"torch": _pkg_version("torch"), "flydsl": R.flydsl_version()}
    tv = versions.get("torch", "not installed")
    builders = _torch_files_present(_XRAY_BUILDERS)
    torch_ok = _torch_at_least(tv, (2, 15)) and builders
    torch_check = Check("torch >= 2.15 with FlyDSL kernel builders", torch_ok,
                        f"torch {tv}" + (" has torch._native FlyDSL ops and Inductor FlyDSL templates"
                                         if torch_ok else " has no FlyDSL kernel builders (first in 2.15)"),
                        None if torch_ok else "pip install 'torch>=2.15'")
    fv = versions.get("flydsl", R.NOT_INSTALLED)
    checks = [torch_check, flydsl_version_check(tv, fv)]
    if R.flydsl_installed(fv).ok:
        built = R.flydsl_built()
        checks.append(Check("flydsl runtime built", built, "flydsl's _mlir runtime present" if built
                            else "flydsl's _mlir runtime is missing (runtime not built)",
                            None if built else "install a built flydsl wheel: " + R.FLYDSL_FIX))
    lld = find_amdgpu_lld(environ)
    if lld is None:
        lld_check = Check("AMDGPU-capable ld.lld", False, "no ld.lld found",
                          "apt-get install lld-22 (Debian/Ubuntu), or set FLYEXPLORE_LD_LLD / ROCM_PATH")
    elif not lld.amdgpu_capable:
        lld_check = Check("AMDGPU-capable ld.lld", False,
                          f"{lld.path} is {lld.version or 'of unknown version'}; LLD >= {MIN_LLD_MAJOR} "
                          "is needed for FlyDSL's code object v6",
                          "apt-get install lld-22 (Debian/Ubuntu), or set FLYEXPLORE_LD_LLD")
    else:
        lld_check = Check("AMDGPU-capable ld.lld", True, f"{lld.path} ({lld.version}; from {lld.source})")
    return Readiness("kernel X-ray (compile-only, gfx950)", (*checks, lld_check))


def _devices(torch) -> tuple[str, tuple[Device, ...]]:
    if torch.cuda.is_available():
        plat = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        devs = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            if plat == "rocm":
                # the gcnArchName up to ":" (gfx950:sramecc+:xnack- -> gfx950), as torch reads it
                # (torch/_native/flydsl_utils.py::_get_flydsl_device_arch)
                arch = (getattr(p, "gcnArchName", "") or "unknown").split(":", 1)[0]
            else:
                arch = f"sm_{p.major}{p.minor}"
            devs.append(Device(i, p.name, arch, int(p.multi_processor_count), int(p.total_memory),
                               int(getattr(p, "L2_cache_size", 0)) or None))
        return plat, tuple(devs)
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = 0
    return "cpu", (Device(0, cpu_name(), _platform.machine(), os.cpu_count() or 1, mem, None),)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``; elsewhere
    ``platform.processor()`` or the machine string)."""
    name = _platform.processor() or _platform.machine() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


@functools.lru_cache(maxsize=1)
def _collect_cached() -> Environment:
    return collect(refresh=True)


def collect(refresh: bool = False, environ: dict[str, str] | None = None) -> Environment:
    """Detect platform, devices, versions and FlyDSL readiness.

    Cached per process unless ``refresh`` (or a custom ``environ``) is given. Importing torch
    is the only expensive step; no GPU kernel is launched.
    """
    if not refresh and environ is None:
        return _collect_cached()
    import torch

    environ = dict(os.environ) if environ is None else environ
    plat, devs = _devices(torch)
    versions = {
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "triton": _pkg_version("triton", "pytorch-triton-rocm", "triton-rocm"),
        "flydsl": R.flydsl_version(),
        "aotriton": aotriton_version(),
        "hip": getattr(torch.version, "hip", None) or "",
        "cuda": getattr(torch.version, "cuda", None) or "",
        "torch_git": str(getattr(torch.version, "git_version", "") or ""),
        **blas_state(torch, plat),
    }
    versions["flyexplore"] = __version__
    arch, src = resolve_target_arch(devs, plat, environ)
    eager, comp = _readiness(plat, versions, environ, devs[0].arch if plat == "rocm" and devs else None,
                             R.flydsl_built())
    env_vars = {k: environ[k] for k in RELEVANT_ENV_VARS if k in environ}
    xray = xray_readiness(versions, environ)
    return Environment(plat, devs, versions, arch, src, eager, comp, env_vars, _platform.node(), xray,
                       git_commit(environ=environ), git_dirty(environ=environ))


# -- which code: flyexplore's git commit, and a benchmark output's provenance -------------------------

#: Set where the code was copied without ``.git`` (the lent GPU machine): the commit the copy was
#: made from (``git rev-parse HEAD`` of the checkout), read by :func:`git_commit` instead of git.
COMMIT_ENV = "FLYEXPLORE_COMMIT"
#: With :data:`COMMIT_ENV`: whether the copied tree had changes since that commit (``1``/``true``/
#: ``yes``/``dirty`` or ``0``/``false``/``no``/``clean``), read by :func:`git_dirty`.
DIRTY_ENV = "FLYEXPLORE_DIRTY"
_YES = frozenset({"1", "true", "yes", "dirty"})
_NO = frozenset({"0", "false", "no", "clean"})


def package_root() -> str:
    """The folder that holds the ``flyexplore`` package (a checkout's top, or site-packages)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=16)
def _git_state(root: str) -> tuple[str, str]:
    """``(commit, "dirty" | "clean" | "")`` of the git work tree whose top is ``root``;
    ``("", "")`` when git is missing, fails or takes over 10 s, or ``root`` is not the top of a
    work tree with a commit (an installed copy inside some other repository reads nothing).
    Two git calls, a few ms; cached per ``root`` (``_git_state.cache_clear()`` forgets)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_OPTIONAL_LOCKS"] = "0"   # status must not write the index (another git may hold it)

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10,
                              env=env, stdin=subprocess.DEVNULL, check=False)

    try:
        head = git("rev-parse", "--show-toplevel", "HEAD")
        got = head.stdout.splitlines()
        if head.returncode != 0 or len(got) != 2 or os.path.realpath(got[0]) != os.path.realpath(root):
            return "", ""
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "", ""
    dirty = "" if status.returncode != 0 else "dirty" if status.stdout.strip() else "clean"
    return got[1].strip(), dirty


def git_commit(repo: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> str:
    """flyexplore's git commit: ``$FLYEXPLORE_COMMIT`` when set (a copy without ``.git``), else
    the full hash of ``HEAD`` of the git work tree whose top is ``repo`` (default:
    :func:`package_root`, the checkout this flyexplore runs from). ``""`` when unknown: no git,
    no repository there, or the package installed inside another repository's folder. Never
    raises; cached (see :func:`_git_state`). ``environ``: default ``os.environ``."""
    environ = os.environ if environ is None else environ
    given = (environ.get(COMMIT_ENV) or "").strip()
    if given:
        return given
    return _git_state(os.fspath(repo) if repo is not None else package_root())[0]


def git_dirty(repo: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Whether tracked files differ from the commit :func:`git_commit` names: ``"dirty"``,
    ``"clean"`` or ``""`` (unknown). ``$FLYEXPLORE_DIRTY`` when set (``1``/``true``/``yes``/``dirty``
    or ``0``/``false``/``no``/``clean``; any other value: unknown); else, when
    ``$FLYEXPLORE_COMMIT`` is set, unknown (the commit did not come from this tree); else ``git
    status --porcelain --untracked-files=no`` of ``repo``'s work tree (untracked files, such as
    outputs, do not count). Never raises."""
    environ = os.environ if environ is None else environ
    flag = (environ.get(DIRTY_ENV) or "").strip().lower()
    if flag:
        return "dirty" if flag in _YES else "clean" if flag in _NO else ""
    if (environ.get(COMMIT_ENV) or "").strip():
        return ""
    return _git_state(os.fspath(repo) if repo is not None else package_root())[1]


def commit_label(commit: str, dirty: str) -> str:
    """One text for a commit and its tree's state, as result rows carry it (column
    ``flyexplore_commit``): ``<commit>``, ``<commit>-dirty`` (tracked files had changed),
    ``<commit>-dirty?`` (unknown whether they had); ``""`` when the commit is unknown."""
    if not commit:
        return ""
    return commit + {"clean": "", "dirty": "-dirty"}.get(dirty, "-dirty?")


def commit_text(commit: str, dirty: str) -> str:
    """The commit and its tree's state in words (``flyexplore env``'s line)."""
    if not commit:
        return (f"unknown (not a git checkout, or no git here; set {COMMIT_ENV} and {DIRTY_ENV} "
                "where the code is a copy)")
    state = {"clean": "no changes to tracked files", "dirty": "tracked files changed since"}.get(
        dirty, "unknown whether files changed since")
    return f"{commit} ({state})"


def provenance(script: str = "", env: Environment | None = None,
               environ: Mapping[str, str] | None = None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where a benchmark's output came from, to write beside it (``provenance.json``, a key of its
    ``env.json``, or one header line of a text output: :func:`provenance_line`).

    Keys: ``script`` (as given: the benchmark's path from the repository root), ``flyexplore``
    (version), ``flyexplore_commit`` and ``flyexplore_dirty`` (:func:`git_commit`,
    :func:`git_dirty`; ``""``: unknown), ``commit_from`` (``"git"``, ``"FLYEXPLORE_COMMIT"`` or
    ``""``), ``utc`` (ISO 8601, seconds), and the machine without its host name: ``platform``
    (``cpu``/``cuda``/``rocm``), ``device`` and ``arch`` (device 0; the CPU's model on a CPU),
    ``device_count`` (accelerators; 0 on a CPU), ``device_memory_gib`` (device 0's, GiB),
    ``cpu`` (model name), ``cpu_count`` (logical CPUs, ``os.cpu_count()``), ``os``
    (``platform.system()`` and release), ``python``, ``torch``, ``gpu_runtime`` (HIP or CUDA
    version) and ``flydsl``.

    ``env``: the :class:`Environment` the run measured in (default: :func:`collect`'s, which
    imports torch). The commit is read for this call, so ``environ`` (default ``os.environ``)
    may carry :data:`COMMIT_ENV` / :data:`DIRTY_ENV`. ``extra``: the script's own keys (a part,
    a command line), added last. Never raises for a missing git."""
    env = collect() if env is None else env
    environ = os.environ if environ is None else environ
    commit, dirty = git_commit(environ=environ), git_dirty(environ=environ)
    d = env.device
    gpu = env.platform in ("cuda", "rocm")
    return {
        "script": script,
        "flyexplore": env.versions.get("flyexplore", __version__),
        "flyexplore_commit": commit,
        "flyexplore_dirty": dirty,
        "commit_from": ("FLYEXPLORE_COMMIT" if (environ.get(COMMIT_ENV) or "").strip() else "git") if commit else "",
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "platform": env.platform,
        "device": d.name,
        "arch": d.arch,
        "device_count": len(env.devices) if gpu else 0,
        "device_memory_gib": round(d.memory_bytes / 2**30, 1) if d.memory_bytes else None,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "os": f"{_platform.system()} {_platform.release()}".strip(),
        "python": env.versions.get("python", _platform.python_version()),
        "torch": env.versions.get("torch", ""),
        "gpu_runtime": env.versions.get("hip") or env.versions.get("cuda") or "",
        "flydsl": env.versions.get("flydsl", ""),
        **(extra or {}),
    }


def provenance_line(prov: dict[str, Any]) -> str:
    """:func:`provenance` as one line, ``provenance: {json}``, for the head of a text output
    (prefix it with the file's comment mark)."""
    return "provenance: " + json.dumps(prov, default=str)


def write_provenance(folder: str | os.PathLike, script: str, env: Environment | None = None,
                     name: str = "provenance.json", extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write :func:`provenance` (``extra``: the script's own keys) as ``folder/name`` (JSON, created
    with the folder, replaced atomically); returns it. Raises :class:`flyexplore.errors.WriteError`
    when the write fails."""
    prov = provenance(script, env, extra=extra)
    os.makedirs(folder, exist_ok=True)
    write_text(os.path.join(folder, name), json.dumps(prov, indent=1) + "\n")
    return prov


def env_json(script: str, env: Environment | None = None) -> str:
    """``flyexplore env --json``'s text with :func:`provenance` under the key ``provenance``: what
    a benchmark writes as its folder's ``env.json``."""
    env = collect() if env is None else env
    return json.dumps({**env.to_dict(), "provenance": provenance(script, env)}, indent=2, default=str) + "\n"
