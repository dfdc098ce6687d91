"""Will a call take FlyDSL, and if not, why not? The eligibility explainer.

:func:`explain` takes an operator and concrete arguments (tensors) or a description of them
(:class:`TensorDesc`: shape, dtype, strides, storage offset, device) and returns an
:class:`Explanation`: every condition torch 2.15 applies, each evaluated and phrased in words
with the torch module and function it comes from, and the verdict.

The rules are re-derived (not copied) from the torch 2.15.0 wheel:

- RMSNorm: ``torch/_native/ops/norm/flydsl_rmsnorm_impl.py::_fused_rms_norm_cond`` (with
  ``_common_supported``, ``_fused_rms_norm_fwd_perf_wins`` and
  ``torch/_native/flydsl_utils.py::_fits_int32_buffer_span``).
- TopK: ``torch/_native/ops/topk/flydsl_impl.py::_eligible`` / ``_kernel_for`` and
  ``torch/_native/ops/topk/_common.py::last_dim_row_major_ok``.
- dense mm: ``torch/_inductor/kernel/mm.py::get_flydsl_mm_template_kwargs``, the config filter
  ``torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs`` +
  ``is_gemm_config_valid_for_shape`` (-> the vendored
  ``gemm_gfx950.py::make_gemm_param_and_validate``), input alignment as Inductor decides it
  for graph inputs (``torch/_inductor/graph.py`` ``unaligned_buffers`` via
  ``torch/_inductor/utils.py::should_assume_input_aligned``, read by ``ir.py::is_unaligned``).
- grouped mm: ``torch/_inductor/kernel/mm_grouped.py::use_flydsl_grouped_mm_template`` and
  ``get_flydsl_grouped_mm_template_kwargs`` (config filter
  ``heuristics/template/flydsl.py::is_grouped_gemm_config_valid_for_shape``).
- MXFP scaled mm: ``torch/_inductor/kernel/mm.py::_get_rocm_mxfp_v2_format``,
  ``get_flydsl_mxfp_template_kwargs`` and the stride constraint ``scaled_mm_v2_constraint``.
- the gate of every template: ``torch/_inductor/utils.py::use_flydsl_gemm_template``; the
  eager side's registration: ``torch/_native/flydsl_utils.py``.

The config filter is stated in closed form. For the torch 2.15 config lists it reduces to:
dense and MXFP -- N % 8 == 0, and M % 8 == 0 when A is column-major (every search space);
grouped -- N % 128 == 0 with FlyDSL autotuning off (the one baseline config has TILE_N 128),
N % 64 == 0 with it on (smallest TILE_N in the default and exhaustive lists). The test suite
checks every rule here against torch's own functions (``tests/test_explain_agreement.py``).

Environment conditions (ROCm build, flydsl version, arch, switches, TORCH_DISABLE_NATIVE_JIT)
come from :class:`EnvFacts`, built from :func:`flyexplore.env.collect` and
:mod:`flyexplore.switches`, or assumed (``assume_rocm=True``: a ROCm torch 2.15 with flydsl
0.3.x on the given arch) for what-if questions on other machines.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from .errors import UsageError, bad_choice

INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
#: Byte alignment Inductor requires of GPU buffer origins (``torch/_inductor/utils.py::GPU_ALIGN_BYTES``).
GPU_ALIGN_BYTES = 16
#: CUs of an MI355X (datasheet); TopK's row gate compares M with the device's CU count.
MI355X_CUS = 256
FLYDSL_ARCH = "gfx950"

# -- where each rule comes from -------------------------------------------------------------
_RMS = "torch/_native/ops/norm/flydsl_rmsnorm_impl.py"
_TOPK = "torch/_native/ops/topk/flydsl_impl.py"
_MM = "torch/_inductor/kernel/mm.py"
_GMM = "torch/_inductor/kernel/mm_grouped.py"
_HEUR = "torch/_inductor/heuristics/template/flydsl.py"
_VALID = "torch/_inductor/kernel/vendored_templates/flydsl/kernels/gemm_gfx950.py::make_gemm_param_and_validate"
_GATE = "torch/_inductor/utils.py::use_flydsl_gemm_template"
_NATIVE = "torch/_native/flydsl_utils.py"
_ALIGN = ("torch/_inductor/graph.py (unaligned_buffers, from "
          "torch/_inductor/utils.py::should_assume_input_aligned) + torch/_inductor/ir.py::is_unaligned")
_SPAN_IND = "torch/_inductor/kernel/mm_common.py::_fits_int32_buffer_span"

#: Explainable operators and the torch path each takes.
OPS = {
    "rmsnorm": "eager override of aten::_fused_rms_norm (F.rms_norm)",
    "topk": "eager override of aten::topk",
    "gemm": "torch.compile (Inductor) template mm_flydsl for aten.mm",
    "grouped_gemm": "torch.compile (Inductor) template grouped_gemm_flydsl for aten._grouped_mm",
    "scaled_gemm": "torch.compile (Inductor) template mm_flydsl (MXFP) for aten._scaled_mm_v2",
}
EAGER = ("rmsnorm", "topk")


# -- descriptions of tensors ----------------------------------------------------------------

def _dtype(d):
    import torch

    if isinstance(d, torch.dtype):
        return d
    from .ops.base import DTYPE_NAMES
    name = DTYPE_NAMES.get(str(d), str(d))
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise bad_choice("dtype", d, list(DTYPE_NAMES))
    return dt


def _short(dtype) -> str:
    names = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
             "float8_e4m3fn": "fp8_e4m3", "float4_e2m1fn_x2": "fp4_e2m1_x2",
             "float8_e8m0fnu": "e8m0", "int32": "int32", "int64": "int64"}
    s = str(dtype).replace("torch.", "")
    return names.get(s, s)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (as ``torch.empty(shape).stride()``)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


@dataclass(frozen=True)
class TensorDesc:
    """What the rules read from a tensor: ``shape``, ``dtype`` (``torch.dtype``), ``stride``
    (elements; row-major when not given), ``storage_offset`` (elements) and ``device``
    (``"cuda"`` means ``"cuda:0"``, as a real tensor always has an index)."""

    shape: tuple[int, ...]
    dtype: Any
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0
    device: str = "cuda:0"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", _dtype(self.dtype))
        st = contiguous_strides(self.shape) if self.stride is None else tuple(int(s) for s in self.stride)
        if len(st) != len(self.shape):
            raise UsageError(f"stride {st} does not match shape {self.shape} (need {len(self.shape)} values)")
        object.__setattr__(self, "stride", st)
        dev = str(self.device)
        if dev == "cuda":
            dev = "cuda:0"
        object.__setattr__(self, "device", dev)

    @classmethod
    def of(cls, t) -> "TensorDesc":
        """Describe a tensor (real, fake or meta) without reading its data."""
        if isinstance(t, TensorDesc):
            return t
        dev = t.device
        return cls(tuple(t.shape), t.dtype, tuple(t.stride()), int(t.storage_offset()),
                   f"{dev.type}:{dev.index}" if dev.index is not None else dev.type)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def device_index(self) -> int | None:
        parts = self.device.split(":")
        return int(parts[1]) if len(parts) > 1 else None

    def is_contiguous(self) -> bool:
        """``torch.Tensor.is_contiguous()``: empty tensors are contiguous and size-1 dims'
        strides do not count."""
        if self.numel == 0:
            return True
        expected = 1
        for size, st in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1:
                if st != expected:
                    return False
                expected *= size
        return True

    def text(self) -> str:
        s = f"{_short(self.dtype)}[{', '.join(map(str, self.shape))}]"
        if self.stride != contiguous_strides(self.shape):
            s += f" stride ({', '.join(map(str, self.stride))})"
        if self.storage_offset:
            s += f" offset {self.storage_offset}"
        return s


def _desc(t) -> TensorDesc | None:
    return None if t is None else TensorDesc.of(t)


# -- conditions and explanations -------------------------------------------------------------

@dataclass(frozen=True)
class Condition:
    """One rule, evaluated. ``ok`` is ``None`` when it could not be evaluated because an
    earlier rule failed (for example strides of a tensor with the wrong rank). ``kind`` is
    ``"environment"``, ``"switch"``, ``"call"`` (the arguments) or ``"config"`` (whether a
    FlyDSL kernel configuration fits the shape)."""

    name: str
    ok: bool | None
    detail: str
    source: str
    kind: str = "call"


@dataclass(frozen=True)
class Explanation:
    """The answer for one call. ``taken``: FlyDSL would run (every condition holds);
    ``call_ok``: the arguments qualify (call and config conditions), whatever the
    environment; ``kernel``: which FlyDSL kernel family would run (TopK: register or a radix
    band; GEMMs: the template)."""

    op: str
    path: str
    arguments: dict
    conditions: tuple[Condition, ...]
    kernel: str | None = None
    notes: tuple[str, ...] = ()
    assumed: str | None = None

    @property
    def taken(self) -> bool:
        return all(c.ok is True for c in self.conditions)

    @property
    def call_ok(self) -> bool:
        return all(c.ok is True for c in self.conditions if c.kind in ("call", "config"))

    @property
    def environment_ok(self) -> bool:
        return all(c.ok is True for c in self.conditions if c.kind in ("environment", "switch"))

    @property
    def failed(self) -> tuple[Condition, ...]:
        return tuple(c for c in self.conditions if c.ok is False)

    @property
    def reason(self) -> str:
        """One line: ``"FlyDSL taken (<kernel>)"`` or ``"not taken: <failed conditions>"``."""
        if self.taken:
            return f"FlyDSL taken ({self.kernel})" if self.kernel else "FlyDSL taken"
        return "not taken: " + "; ".join(c.detail for c in self.failed)

    def to_dict(self) -> dict:
        return {"op": self.op, "path": self.path, "taken": self.taken, "call_ok": self.call_ok,
                "environment_ok": self.environment_ok, "kernel": self.kernel,
                "reason": self.reason, "assumed": self.assumed, "arguments": self.arguments,
                "conditions": [asdict(c) for c in self.conditions], "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_text(self) -> str:
        verdict = "YES" if self.taken else "NO"
        lines = [f"{self.op}: FlyDSL {verdict} -- {self.path}"]
        if self.assumed:
            lines.append(f"assumed: {self.assumed}")
        lines.append("arguments: " + ", ".join(f"{k}={v}" for k, v in self.arguments.items()))
        if self.kernel:
            lines.append(f"kernel: {self.kernel}" if self.taken else
                         f"kernel if the environment allowed: {self.kernel}")
        if not self.taken:
            lines.append(f"the call itself {'qualifies' if self.call_ok else 'does not qualify'}; "
                         f"the environment {'qualifies' if self.environment_ok else 'does not qualify'}")
        for kind in ("environment", "switch", "call", "config"):
            cs = [c for c in self.conditions if c.kind == kind]
            if not cs:
                continue
            lines.append(f"{kind}:")
            for c in cs:
                mark = {True: "ok ", False: "NO ", None: " - "}[c.ok]
                lines.append(f"  [{mark}] {c.detail}")
                lines.append(f"         ({c.source})")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _c(name, ok, detail, source, kind="call") -> Condition:
    return Condition(name, None if ok is None else bool(ok), detail, source, kind)


# -- the environment ----------------------------------------------------------------------

def _version_tuple(v: str | None):
    if not v:
        return None
    m = re.match(r"^\s*(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _is_prerelease(v: str) -> bool:
    return re.search(r"\d(a|b|rc|dev|alpha|beta)\d*", v.lower()) is not None


def _env_int_is_one(environ: Mapping[str, str], name: str) -> bool:
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


def _flydsl_built() -> bool:
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
    eager_mods = {op: S.eager_mechanism(op) is None for op in EAGER}
    eager_sw = None
    if S._pn() is not None and S._filter_sets() is not None:
        dsl, syms, keys = S._filter_sets()
        eager_sw = {op: ("flydsl" not in dsl, tuple(s for s in S.EAGER_OPS[op] if s in syms), "CUDA" in keys)
                    for op in EAGER}
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
        return EnvFacts("2.15 (assumed)", True, "0.3 (assumed)", True, {op: True for op in EAGER}, True,
                        dev_arch, cus, cu_src, {k: environ[k] for k in _ENV_KEYS if k in environ},
                        eager_sw or {op: (True, (), False) for op in EAGER}, None, ind, assumed)
    return EnvFacts(torch.__version__, rocm, fly_v, _flydsl_built(), eager_mods, S.compile_mechanism() is None,
                    dev_arch, cus, cu_src, {k: environ[k] for k in _ENV_KEYS if k in environ},
                    eager_sw, registered, ind, None)


def eager_environment(f: EnvFacts, op: str) -> list[Condition]:
    """Environment and switch conditions of the eager FlyDSL override for ``op``."""
    from .switches import EAGER_MODULES, EAGER_OPS

    out = []
    mod = EAGER_MODULES[op]
    out.append(_c("override in torch", f.eager_modules.get(op, False),
                  f"torch {f.torch_version} has the FlyDSL {op} override" if f.eager_modules.get(op)
                  else f"torch {f.torch_version} has no FlyDSL {op} override (first in torch 2.15)",
                  mod.replace(".", "/") + ".py", "environment"))
    out.append(_c("ROCm build", f.rocm, "ROCm build of torch (torch.version.hip set)" if f.rocm
                  else f"torch {f.torch_version} is not a ROCm build: FlyDSL overrides never register",
                  f"{_NATIVE}::_check_runtime_available", "environment"))
    skip = _env_int_is_one(f.environ, "TORCH_NATIVE_SKIP_VERSION_CHECK")
    if f.flydsl_version is None:
        out.append(_c("flydsl installed", False, "flydsl is not installed (pip install 'flydsl==0.3.*')",
                      f"{_NATIVE}::_check_runtime_available", "environment"))
    else:
        vt = _version_tuple(f.flydsl_version)
        ok = (vt == (0, 3) and not _is_prerelease(f.flydsl_version)) or skip
        why = (f"flydsl {f.flydsl_version} accepted (stable 0.3.x)" if ok and not skip else
               f"flydsl {f.flydsl_version}: version check skipped by TORCH_NATIVE_SKIP_VERSION_CHECK=1" if ok else
               f"flydsl {f.flydsl_version} refused: torch 2.15 accepts stable 0.3.x only "
               "(or set TORCH_NATIVE_SKIP_VERSION_CHECK=1)")
        out.append(_c("flydsl version", ok, why, f"{_NATIVE}::_version_is_ok", "environment"))
    jit_off = _env_int_is_one(f.environ, "TORCH_DISABLE_NATIVE_JIT")
    out.append(_c("native JIT not disabled", not jit_off,
                  "TORCH_DISABLE_NATIVE_JIT=1: no override was registered" if jit_off
                  else "TORCH_DISABLE_NATIVE_JIT not set to 1",
                  "torch/_native/common_utils.py::check_native_jit_disabled", "environment"))
    prereq = all(c.ok for c in out)
    if prereq and f.registered is not None:
        sym = EAGER_OPS[op][0]
        out.append(_c("override registered", sym in f.registered,
                      f"FlyDSL override of aten::{sym} registered in this process" if sym in f.registered
                      else f"no FlyDSL override of aten::{sym} registered in this process "
                      f"(torch.backends.python_native.get_dsl_operations('flydsl') = {list(f.registered)})",
                      "torch.backends.python_native.get_dsl_operations", "environment"))
    if f.eager_switch is None:
        out.append(_c("python_native", False, f"torch {f.torch_version} has no torch.backends.python_native",
                      "torch/backends/python_native/__init__.py", "switch"))
    else:
        dsl_on, off_syms, key_off = f.eager_switch[op]
        out.append(_c("flydsl DSL enabled", dsl_on, "FlyDSL overrides enabled (python_native.flydsl.enabled)"
                      if dsl_on else "FlyDSL overrides disabled (python_native.flydsl.disable() or a switch)",
                      "torch/backends/python_native/__init__.py::DSLController", "switch"))
        out.append(_c("op enabled", not off_syms, f"aten::{EAGER_OPS[op][0]} not disabled" if not off_syms
                      else f"disabled by python_native.disable_operations({', '.join(map(repr, off_syms))})",
                      "torch/backends/python_native/__init__.py::disable_operations", "switch"))
        if key_off:
            out.append(_c("CUDA key", False, "the CUDA dispatch key is disabled for python_native overrides",
                          "torch/backends/python_native/__init__.py::disable_dispatch_keys", "switch"))
    arch, src = torch_eager_arch(f.environ, f.device_arch)
    out.append(_c("arch gfx950", arch == FLYDSL_ARCH,
                  (f"arch {arch} (from {src})" if arch else "no ROCm device and no FLYDSL_GPU_ARCH: arch unknown")
                  + ("" if arch == FLYDSL_ARCH else ": FlyDSL overrides need gfx950"),
                  f"{_NATIVE}::_resolve_rocm_arch / _is_supported_arch", "environment"))
    return out


def compile_environment(f: EnvFacts) -> list[Condition]:
    """Environment and switch conditions of every FlyDSL Inductor template
    (``torch/_inductor/utils.py::use_flydsl_gemm_template``)."""
    out = [_c("templates in torch", f.has_templates,
              f"torch {f.torch_version} has FlyDSL Inductor templates" if f.has_templates
              else f"torch {f.torch_version} has no FlyDSL Inductor templates (first in torch 2.15)",
              "torch/_inductor/codegen/flydsl", "environment")]
    backends = str(f.inductor.get("max_autotune_gemm_backends") or "")
    listed = "FLYDSL" in [x.strip().upper() for x in backends.split(",")]
    out.append(_c("FLYDSL listed", listed, f"max_autotune_gemm_backends={backends!r} "
                  + ("lists FLYDSL" if listed else "does not list FLYDSL"), _GATE, "switch"))
    ma = bool(f.inductor.get("max_autotune") or f.inductor.get("max_autotune_gemm"))
    out.append(_c("max-autotune", ma, "max-autotune on" if ma else
                  "max-autotune off (compile with mode='max-autotune' or max_autotune_gemm=True)", _GATE, "switch"))
    out.append(_c("ROCm build", f.rocm, "ROCm build of torch" if f.rocm
                  else f"torch {f.torch_version} is not a ROCm build", _GATE, "environment"))
    if f.flydsl_version is None:
        ok, why = False, "flydsl is not installed"
    elif not f.flydsl_built:
        ok, why = False, "flydsl's _mlir runtime is missing (runtime not built)"
    elif _version_tuple(f.flydsl_version) != (0, 3):
        ok, why = False, (f"flydsl {f.flydsl_version} refused: Inductor accepts 0.3.x only "
                          "(TORCH_NATIVE_SKIP_VERSION_CHECK does not apply here)")
    else:
        ok, why = True, f"flydsl {f.flydsl_version} runtime available"
    out.append(_c("flydsl runtime", ok, why,
                  "torch/_inductor/codegen/flydsl/flydsl_utils.py::_flydsl_runtime_unavailable_reason",
                  "environment"))
    arch_ok = f.device_arch == FLYDSL_ARCH
    detail = (f"device arch {f.device_arch} (gcnArchName)" if f.device_arch else "no ROCm device")
    if not arch_ok:
        detail += ": FlyDSL templates need gfx950"
        if f.environ.get("FLYDSL_GPU_ARCH"):
            detail += " (FLYDSL_GPU_ARCH is not consulted by this gate)"
    out.append(_c("device arch gfx950", arch_ok, detail,
                  "torch/_inductor/codegen/flydsl/flydsl_scheduling.py::_get_flydsl_device_arch", "environment"))
    return out


# -- shared rule helpers ------------------------------------------------------------------

def _fits_native(rows: int, n: int, itemsize: int) -> bool:
    return 0 < rows <= INT32_MAX and 0 < n <= INT32_MAX and rows * n * itemsize <= UINT32_MAX


def _fits_inductor(rows: int, stride: int | None, cols: int, itemsize: int) -> bool:
    return (0 < rows <= INT32_MAX and 0 < cols <= INT32_MAX and stride is not None
            and 0 <= stride <= INT32_MAX and ((rows - 1) * stride + cols) * itemsize <= UINT32_MAX)


def _aligned_input(t: TensorDesc, assume_aligned: bool) -> bool:
    """Inductor's view of a graph input: aligned when its storage offset in bytes is a
    multiple of 16 (or ``assume_aligned_inputs``) and the tensor is on a GPU."""
    if t.device_type != "cuda":
        return False
    return bool(assume_aligned) or (t.storage_offset * t.itemsize) % GPU_ALIGN_BYTES == 0


def _autotune_mode(f: EnvFacts, autotuning: bool | None, search_space: str | None) -> tuple[bool, str]:
    at = bool(f.inductor.get("flydsl_enable_autotuning")) if autotuning is None else bool(autotuning)
    ss = str(f.inductor.get("max_autotune_gemm_search_space") or "DEFAULT") if search_space is None else search_space
    return at, ss.upper()


# -- RMSNorm ------------------------------------------------------------------------------

def _normalized_n(normalized_shape) -> int | None:
    if isinstance(normalized_shape, int):
        return normalized_shape
    try:
        if len(normalized_shape) != 1:
            return None
        return int(normalized_shape[0])
    except (TypeError, ValueError):
        return None


#: RMSNorm's tuned region on gfx950: (N low, N high inclusive, min M)
#: (``flydsl_rmsnorm_impl.py::_fused_rms_norm_fwd_perf_wins``).
RMSNORM_REGION = ((4096, 8191, 8192), (8192, 16383, 4096), (16384, 114688, 2048))


def rmsnorm_rules(x, normalized_shape, weight=None, eps: float | None = 1e-6) -> list[Condition]:
    """Call conditions of the FlyDSL RMSNorm override
    (``_fused_rms_norm_cond(input, normalized_shape, weight, eps)``)."""
    x, w = TensorDesc.of(x), _desc(weight)
    S = f"{_RMS}::_fused_rms_norm_cond"
    C = f"{_RMS}::_common_supported"
    out = []
    n = _normalized_n(normalized_shape)
    shown = normalized_shape if isinstance(normalized_shape, int) else list(normalized_shape)
    out.append(_c("normalized_shape 1-D", n is not None, f"normalized_shape {shown} "
                  + ("is one dimension" if n is not None
                     else "must be one dimension (normalize over the last dim only)"),
                  "torch/_native/ops/norm/flydsl_rmsnorm_utils.py::normalized_shape_1d"))
    eps_ok = eps is None or eps >= 0.0
    out.append(_c("eps", eps_ok, f"eps={eps} " + ("ok" if eps_ok else "must be None or >= 0"), S))
    gpu = x.device_type == "cuda"
    out.append(_c("device", gpu, f"input on {x.device}" + ("" if gpu else ": needs a GPU tensor"), C))
    dt_ok = _short(x.dtype) in ("fp32", "fp16", "bf16")
    out.append(_c("dtype", dt_ok, f"dtype {_short(x.dtype)}" + (" supported" if dt_ok else ": needs fp16, bf16 or fp32"),
                  "torch/_native/ops/norm/flydsl_rmsnorm_utils.py::SUPPORTED_DTYPES"))
    last_ok = x.ndim >= 1 and n is not None and x.shape[-1] == n
    out.append(_c("last dim", last_ok if n is not None else None,
                  f"last dim {x.shape[-1] if x.ndim else '-'} == N={n}" if last_ok else
                  f"input's last dim ({x.shape[-1] if x.ndim else 'none'}) must equal N={n}", C))
    out.append(_c("non-empty", x.numel != 0, "input non-empty" if x.numel else "input is empty", C))
    out.append(_c("contiguous", x.is_contiguous(), "input contiguous" if x.is_contiguous()
                  else f"input not contiguous (stride {x.stride}); FlyDSL reads rows in place", C))
    out.append(_c("weight given", w is not None, "weight given" if w is not None
                  else "no weight: the FlyDSL kernel needs an explicit weight", C))
    if w is not None:
        shape_ok = n is not None and w.shape == (n,)
        out.append(_c("weight shape", shape_ok if n is not None else None, f"weight shape {w.shape}"
                      + (" == (N,)" if shape_ok else f" must be ({n},)"), C))
        out.append(_c("weight dtype", w.dtype == x.dtype, f"weight dtype {_short(w.dtype)}"
                      + (" matches input" if w.dtype == x.dtype else f" must equal input dtype {_short(x.dtype)}"), C))
        out.append(_c("weight device", w.device == x.device, f"weight on {w.device}"
                      + ("" if w.device == x.device else f", input on {x.device}: must match"), C))
        out.append(_c("weight contiguous", w.is_contiguous(), "weight contiguous" if w.is_contiguous()
                      else "weight not contiguous", C))
    if n is not None and n > 0 and x.numel:
        m = x.numel // n
        fits = _fits_native(m, n, x.itemsize)
        out.append(_c("buffer span", fits, f"M*N*{x.itemsize} = {m * n * x.itemsize} bytes"
                      + (" fits 32-bit buffer descriptors" if fits else " exceeds the 32-bit buffer span (4 GiB) or M/N > int32"),
                      f"{_NATIVE}::_fits_int32_buffer_span"))
        band = next((b for b in RMSNORM_REGION if b[0] <= n <= b[1]), None)
        if band is None:
            ok, detail = False, (f"N={n} is outside the tuned region 4096 <= N <= 114688 "
                                 "(ATen is faster there on MI355X)")
        else:
            ok = m >= band[2]
            detail = (f"N={n} in band {band[0]}..{band[1]} needs M >= {band[2]}: M={m}"
                      + ("" if ok else " (ATen is faster below)"))
        out.append(_c("tuned region", ok, detail, f"{_RMS}::_fused_rms_norm_fwd_perf_wins"))
    else:
        out.append(_c("tuned region", None, "not evaluated (N or the input is empty / invalid)",
                      f"{_RMS}::_fused_rms_norm_fwd_perf_wins"))
    return out


# -- TopK ---------------------------------------------------------------------------------

#: TopK kernel bands on gfx950 (``flydsl_impl.py``): register K set and N range; radix
#: (K low, K high, N low, N high), all inclusive.
TOPK_REGISTER_KS = (2, 4, 8, 16)
TOPK_REGISTER_N = (1024, 8192)
TOPK_RADIX_BANDS = ((64, 256, 8192, 32768), (257, 383, 16384, 32768),
                    (384, 831, 32768, 131072), (832, 1024, 32768, 262144))


def topk_kernel(k: int, n: int) -> str | None:
    """Which FlyDSL TopK kernel (K, N) selects: ``"register"``,
    ``"radix K a-b, N c-d"`` or ``None`` (``flydsl_impl.py::_kernel_for``)."""
    if k in TOPK_REGISTER_KS and n > 0 and n & (n - 1) == 0 and TOPK_REGISTER_N[0] <= n <= TOPK_REGISTER_N[1]:
        return "register"
    for k0, k1, n0, n1 in TOPK_RADIX_BANDS:
        if k0 <= k <= k1:
            return f"radix K {k0}-{k1}, N {n0}-{n1}" if n0 <= n <= n1 else None
    return None


def topk_rules(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True,
               cu_count: int = MI355X_CUS, cu_source: str = "assumed MI355X") -> tuple[list[Condition], str | None]:
    """Call conditions of the FlyDSL TopK override (``_cond(self, k, dim, largest, sorted)``)
    and the kernel family it would pick."""
    x = TensorDesc.of(x)
    E = f"{_TOPK}::_eligible"
    k, dim = int(k), int(dim)
    out = [_c("device", x.device_type == "cuda" and x.device_index is not None,
              f"input on {x.device}" + ("" if x.device_type == "cuda" else ": needs a GPU tensor"), E),
           _c("dtype", _short(x.dtype) == "fp32", f"dtype {_short(x.dtype)}" + (" ok" if _short(x.dtype) == "fp32"
              else ": the FlyDSL TopK kernels take fp32 only"), E),
           _c("largest", bool(largest), "largest=True" if largest else "largest=False: FlyDSL TopK selects the largest only", E),
           _c("sorted", bool(sorted), "sorted=True" if sorted else "sorted=False: FlyDSL TopK returns sorted values only", E)]
    nd = -1 if x.ndim == 0 or dim < -x.ndim or dim >= x.ndim else dim % x.ndim
    last = x.ndim > 0 and nd == x.ndim - 1
    out.append(_c("last dim", last, f"dim={dim} is the last dim" if last else
                  f"dim={dim} is not the last dim of a {x.ndim}-D input", "torch/_native/ops/topk/_common.py::last_dim_row_major_ok"))
    out.append(_c("contiguous", x.is_contiguous(), "input contiguous" if x.is_contiguous()
                  else f"input not contiguous (stride {x.stride})", "torch/_native/ops/topk/_common.py::last_dim_row_major_ok"))
    out.append(_c("non-empty", x.numel != 0, "input non-empty" if x.numel else "input is empty", E))
    kernel = None
    if x.ndim >= 1 and x.numel:
        n = x.shape[-1]
        m = x.numel // n
        fits = _fits_native(m, n, x.itemsize) and m * k * 8 <= UINT32_MAX
        out.append(_c("buffer span", fits, f"input {m * n * x.itemsize} B and indices {m * k * 8} B"
                      + (" fit 32-bit buffer descriptors" if fits else ": exceed the 32-bit buffer span"),
                      f"{_TOPK}::_fits_topk_buffer_span"))
        rows = m >= cu_count
        out.append(_c("rows", rows, f"M={m} rows " + (">=" if rows else "<") + f" {cu_count} CUs ({cu_source})"
                      + ("" if rows else ": fewer rows than CUs leave the GPU idle, ATen is used"),
                      f"{_TOPK}::_min_rows_for_full_wave"))
        kernel = topk_kernel(k, n)
        if kernel:
            detail = f"K={k}, N={n}: {kernel} kernel"
        elif k in TOPK_REGISTER_KS:
            detail = (f"K={k}, N={n}: the register kernel needs N a power of two in "
                      f"{TOPK_REGISTER_N[0]}..{TOPK_REGISTER_N[1]}")
        else:
            band = next((b for b in TOPK_RADIX_BANDS if b[0] <= k <= b[1]), None)
            detail = (f"K={k}, N={n}: radix band K {band[0]}-{band[1]} needs N in {band[2]}..{band[3]}" if band
                      else f"K={k} has no FlyDSL kernel (register: K in {{2,4,8,16}}; radix: K 64..1024)")
        out.append(_c("kernel band", kernel is not None, detail, f"{_TOPK}::_kernel_for"))
    return out, kernel


# -- dense mm -----------------------------------------------------------------------------

def _mm_layout(t: TensorDesc, first_row: bool) -> str | None:
    """``"row"`` / ``"col"`` / ``None`` in the order get_flydsl_mm_template_kwargs tests them
    (A: stride[1]==1 first; B: stride[0]==1 first)."""
    if t.ndim != 2:
        return None
    order = (("row", 1), ("col", 0)) if first_row else (("col", 0), ("row", 1))
    for name, d in order:
        if t.stride[d] == 1:
            return name
    return None


def mm_rules(a, b, *, out_dtype=None, bias: bool = False, dynamic: bool = False,
             autotuning: bool = False, search_space: str = "DEFAULT",
             assume_aligned_inputs: bool = False) -> list[Condition]:
    """Call and config conditions of the FlyDSL dense GEMM template for ``aten.mm(a, b)``
    under torch.compile (``get_flydsl_mm_template_kwargs``), ``a`` [M, K], ``b`` [K, N] as
    aten.mm receives them (``x @ w.T`` gives ``b`` = ``w.T``, column-major)."""
    a, b = TensorDesc.of(a), TensorDesc.of(b)
    S = f"{_MM}::get_flydsl_mm_template_kwargs"
    out = [_c("no bias", not bias, "no bias (aten.mm)" if not bias else
              "bias given: addmm / F.linear with bias has no FlyDSL template", f"{_MM}::tuned_addmm"),
           _c("out_dtype", out_dtype is None, "no out_dtype" if out_dtype is None
              else "out_dtype given (aten.mm.dtype): FlyDSL only for plain mm", f"{_MM}::tuned_mm"),
           _c("static", not dynamic, "static shapes" if not dynamic else "dynamic shapes: FlyDSL needs static shapes", S)]
    two_d = a.ndim == 2 and b.ndim == 2
    out.append(_c("2-D", two_d, "A and B 2-D" if two_d else f"A is {a.ndim}-D, B is {b.ndim}-D: aten.mm takes 2-D", S))
    if not two_d:
        return out
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    out.append(_c("K agrees", b.shape[0] == k, f"A [{m}, {k}] x B [{b.shape[0]}, {n}]"
                  + ("" if b.shape[0] == k else ": inner dims differ (aten.mm raises)"), "aten.mm"))
    out.append(_c("non-empty", m * n > 0, f"output [{m}, {n}] non-empty" if m * n else "empty output", f"{_MM}::_is_static_problem"))
    dt = _short(a.dtype)
    dt_ok = dt in ("fp16", "bf16")
    out.append(_c("dtype", dt_ok, f"dtype {dt}" + (" ok" if dt_ok else ": FlyDSL GEMM takes fp16/bf16"), _GATE))
    out.append(_c("dtypes match", b.dtype == a.dtype, f"B dtype {_short(b.dtype)}" + (" == A dtype" if b.dtype == a.dtype
               else f" differs from A ({dt})"), S))
    out.append(_c("GPU", a.device_type == "cuda", f"inputs on {a.device}", "torch/_inductor/utils.py::_use_template_for_gpu"))
    la, lb = _mm_layout(a, True), _mm_layout(b, False)
    out.append(_c("A layout", la is not None, f"A {'row' if la == 'row' else 'column'}-major" if la else
                  f"A stride {a.stride}: neither row- nor column-major", S))
    out.append(_c("B layout", lb is not None, f"B {'row' if lb == 'row' else 'column'}-major" + (" (NT: w.T of a row-major w)" if lb == "col" else "")
                  if lb else f"B stride {b.stride}: neither row- nor column-major", S))
    for name, t, lay in (("A", a, la), ("B", b, lb)):
        al = _aligned_input(t, assume_aligned_inputs)
        out.append(_c(f"{name} origin aligned", al, f"{name} storage offset {t.storage_offset} x {t.itemsize} B"
                      + (" is 16-byte aligned" if al else " is not 16-byte aligned"), _ALIGN))
        if lay is not None:
            ld = t.stride[0] if lay == "row" else t.stride[1]
            ok = (ld * t.itemsize) % GPU_ALIGN_BYTES == 0
            out.append(_c(f"{name} leading stride", ok, f"{name} leading stride {ld} x {t.itemsize} B"
                          + (" is a multiple of 16 B" if ok else " is not a multiple of 16 B"), S))
    out.append(_c("K % 32", k % 32 == 0, f"K={k} % 32 == 0" if k % 32 == 0 else f"K={k} is not a multiple of 32", S))
    if la is not None and lb is not None:
        ia = a.itemsize
        # (rows, leading stride, cols) per operand, as get_flydsl_mm_template_kwargs builds them.
        spans = [("A", (k, a.stride[1], m) if la == "col" else (m, a.stride[0], k), ia),
                 ("B", (n, b.stride[1], k) if lb == "col" else (k, b.stride[0], n), ia),
                 ("out", (m, n, n), ia)]
        for name, (r, st, c), isz in spans:
            ok = _fits_inductor(r, st, c, isz)
            out.append(_c(f"{name} span", ok, f"{name} spans {((r - 1) * st + c) * isz} B"
                          + (" (fits 32-bit buffer)" if ok else ": exceeds the 32-bit buffer span or int32 limits"), _SPAN_IND))
    out.append(_c("N % 8", n % 8 == 0, f"N={n} % 8 == 0 (16-byte output vectors)" if n % 8 == 0
                  else f"N={n} is not a multiple of 8: no FlyDSL config fits (16-byte output vectors)",
                  f"{_HEUR}::is_gemm_config_valid_for_shape -> {_VALID}", "config"))
    if la == "col":
        out.append(_c("M % 8 (A column-major)", m % 8 == 0, f"A column-major needs M % 8 == 0: M={m}",
                      _VALID, "config"))
    return out


# -- grouped mm ---------------------------------------------------------------------------

def grouped_mm_rules(a, b, offs=True, *, bias: bool = False, scaled: bool = False, out_dtype=None,
                     dynamic: bool = False, autotuning: bool = False, search_space: str = "DEFAULT",
                     assume_aligned_inputs: bool = False) -> list[Condition]:
    """Call and config conditions of the FlyDSL grouped GEMM template for
    ``aten._grouped_mm(a, b, offs)`` under torch.compile: ``a`` [total_M, K], ``b`` [G, K, N],
    ``offs`` int32 [G] cumulative row ends (``use_flydsl_grouped_mm_template`` +
    ``get_flydsl_grouped_mm_template_kwargs``)."""
    a, b = TensorDesc.of(a), TensorDesc.of(b)
    S = f"{_GMM}::use_flydsl_grouped_mm_template"
    out = [_c("not scaled", not scaled, "unscaled" if not scaled else "scaled grouped mm has no FlyDSL template", S),
           _c("static", not dynamic, "static shapes" if not dynamic else "dynamic shapes: FlyDSL needs static shapes",
              f"{_GMM}::get_flydsl_grouped_mm_template_kwargs")]
    shape_ok = a.ndim == 2 and b.ndim == 3 and offs is not None and offs is not False
    got = f"A {a.ndim}-D, B {b.ndim}-D, offs {'given' if offs is not None and offs is not False else 'none'}"
    out.append(_c("2-D A, 3-D B, offs", shape_ok, "A 2-D [total_M, K], B 3-D [G, K, N], offs given" if shape_ok
                  else f"needs A 2-D, B 3-D and offs (got {got})", S))
    out.append(_c("no bias", not bias, "no bias" if not bias else "bias given: FlyDSL grouped GEMM takes none", S))
    if not shape_ok:
        return out
    m, k = a.shape
    g, kb, n = b.shape
    out.append(_c("K agrees", kb == k, f"K {k} == B's K {kb}" if kb == k else f"A's K {k} != B's K {kb}", "aten._grouped_mm"))
    out.append(_c("non-empty", m * n > 0, f"output [{m}, {n}] non-empty" if m * n else "empty output", f"{_MM}::_is_static_problem"))
    od = _dtype(out_dtype) if out_dtype is not None else a.dtype
    dt = _short(a.dtype)
    ok = a.dtype == b.dtype == od and dt in ("fp16", "bf16")
    out.append(_c("dtype", ok, f"A {dt}, B {_short(b.dtype)}, out {_short(od)}" + (" ok" if ok else
                  ": all three must be the same, fp16 or bf16"), S))
    out.append(_c("GPU", a.device_type == "cuda", f"inputs on {a.device}", "torch/_inductor/utils.py::_use_template_for_gpu"))
    a_ok = a.stride[-1] == 1 and a.stride[-2] == k
    out.append(_c("A contiguous", a_ok, "A row-major [M, K] with stride (K, 1)" if a_ok
                  else f"A stride {a.stride} must be ({k}, 1)", S))
    b_ok = b.stride[-1] == 1 and b.stride[-2] == n and b.stride[-3] == k * n
    out.append(_c("B contiguous", b_ok, "B contiguous [G, K, N]" if b_ok
                  else f"B stride {b.stride} must be ({k * n}, {n}, 1) (row-major [G, K, N])", S))
    for name, t in (("A", a), ("B", b)):
        al = _aligned_input(t, assume_aligned_inputs)
        out.append(_c(f"{name} origin aligned", al, f"{name} storage offset {t.storage_offset} x {t.itemsize} B"
                      + (" is 16-byte aligned" if al else " is not 16-byte aligned"), _ALIGN))
    out.append(_c("N % 32", n % 32 == 0, f"N={n} % 32 == 0" if n % 32 == 0 else f"N={n} is not a multiple of 32", S))
    out.append(_c("K % 32", k % 32 == 0, f"K={k} % 32 == 0" if k % 32 == 0 else f"K={k} is not a multiple of 32", S))
    isz = a.itemsize
    for name, (r, st, c) in (("A", (m, k, k)), ("B", (g, k * n, k * n)), ("out", (m, n, n))):
        ok = _fits_inductor(r, st, c, isz)
        out.append(_c(f"{name} span", ok, f"{name} spans {((r - 1) * st + c) * isz} B"
                      + (" (fits 32-bit buffer)" if ok else ": exceeds the 32-bit buffer span or int32 limits"), _SPAN_IND))
    tile = 64 if autotuning else 128
    why = ("FlyDSL autotuning on: smallest TILE_N of the candidate configs is 64" if autotuning
           else "FlyDSL autotuning off: the one baseline config has TILE_N 128")
    out.append(_c(f"N % {tile}", n % tile == 0, f"N={n} % {tile} == 0 ({why})" if n % tile == 0
                  else f"N={n} is not a multiple of {tile}: no FlyDSL grouped config fits ({why})",
                  f"{_HEUR}::get_grouped_gemm_configs / is_grouped_gemm_config_valid_for_shape", "config"))
    return out


# -- MXFP scaled mm -----------------------------------------------------------------------

RECIPES = {"tensorwise": 0, "rowwise": 1, "blockwise1x16": 2, "blockwise1x32": 3, "blockwise1x128": 4,
           "blockwise128x128": 5}
SWIZZLES = {"none": 0, "swizzle_32_4_4": 1, "swizzle_32_8": 2}


def scaled_mm_rules(a, b, scale_a, scale_b, *, recipe_a: str = "blockwise1x32", recipe_b: str = "blockwise1x32",
                    swizzle_a: str = "none", swizzle_b: str = "none", out_dtype="bf16", bias=None,
                    use_fast_accum: bool = False, contraction_dim: Sequence[int] | None = None,
                    scale_levels: int = 1, dynamic: bool = False, autotuning: bool = False,
                    search_space: str = "DEFAULT", assume_aligned_inputs: bool = False) -> list[Condition]:
    """Call and config conditions of the FlyDSL MXFP template for
    ``F.scaled_mm`` / ``aten._scaled_mm_v2(a, b, [scale_a], recipe, swizzle, ...)`` under
    torch.compile: ``a`` [M, K_storage], ``b`` [K_storage, N], e8m0 scales [M, K/32] and
    [N, K/32]; K = K_storage for MXFP8, 2 * K_storage for MXFP4 (two values a byte)."""
    import torch

    a, b = TensorDesc.of(a), TensorDesc.of(b)
    sa, sb = TensorDesc.of(scale_a), TensorDesc.of(scale_b)
    bias = _desc(bias)
    F = f"{_MM}::_get_rocm_mxfp_v2_format"
    T = f"{_MM}::get_flydsl_mxfp_template_kwargs"
    od = _dtype(out_dtype) if out_dtype is not None else None
    out = [_c("one scale level", scale_levels == 1, "single-level scales" if scale_levels == 1
              else f"{scale_levels}-level scales (e.g. NVFP4): not MXFP", F)]
    for side, r in (("A", recipe_a), ("B", recipe_b)):
        out.append(_c(f"recipe {side}", r == "blockwise1x32", f"{side} recipe {r}" + (" (MX: 1x32 blocks)" if r == "blockwise1x32"
                      else ": FlyDSL MXFP needs BlockWise1x32"), F))
    for side, s in (("A", swizzle_a), ("B", swizzle_b)):
        out.append(_c(f"swizzle {side}", s == "none", f"{side} scales {'not swizzled' if s == 'none' else 'swizzled ' + s}"
                      + ("" if s == "none" else ": FlyDSL needs NO_SWIZZLE"), F))
    for side, s in (("A", sa), ("B", sb)):
        ok = s.dtype == torch.float8_e8m0fnu
        out.append(_c(f"scale {side} dtype", ok, f"scale_{side.lower()} {_short(s.dtype)}" + ("" if ok else ": needs float8_e8m0fnu"), F))
    od_ok = od in (torch.bfloat16, torch.float16)
    out.append(_c("out dtype", od_ok, f"out_dtype {_short(od) if od is not None else 'None'}"
                  + (" ok" if od_ok else ": needs bf16 or fp16"), F))
    if bias is not None:
        n_ = b.shape[-1] if b.ndim == 2 else None
        ok = bias.ndim == 1 and bias.device == b.device and bias.dtype == od and bias.shape[0] == n_
        out.append(_c("bias", ok, f"bias {bias.text()}" + (" ok (1-D, length N, output dtype)" if ok
                      else ": must be 1-D of length N in the output dtype on B's device"), f"{_MM}::_flydsl_mxfp_bias_supported"))
    out.append(_c("contraction_dim", not contraction_dim, "no contraction_dim" if not contraction_dim
                  else "contraction_dim given: not supported", F))
    out.append(_c("fast accum", not use_fast_accum, "use_fast_accum=False" if not use_fast_accum
                  else "use_fast_accum=True: FlyDSL MXFP does exact accumulation only", F))
    fmt = {"float8_e4m3fn": "mxfp8", "float4_e2m1fn_x2": "mxfp4"}.get(str(a.dtype).replace("torch.", ""))
    same = a.dtype == b.dtype
    out.append(_c("operand dtype", same and fmt is not None, f"A {_short(a.dtype)}, B {_short(b.dtype)}"
                  + (f" ({fmt})" if same and fmt else ": both float8_e4m3fn (MXFP8) or both float4_e2m1fn_x2 (MXFP4)"), F))
    out.append(_c("static", not dynamic, "static shapes" if not dynamic else "dynamic shapes: FlyDSL needs static shapes", T))
    two_d = all(t.ndim == 2 for t in (a, b, sa, sb))
    out.append(_c("2-D", two_d, "operands and scales 2-D" if two_d else "operands and scales must be 2-D", T))
    dev_ok = all(t.device == a.device for t in (b, sa, sb)) and a.device_type == "cuda"
    out.append(_c("device", dev_ok, f"all on {a.device}" if dev_ok else "operands and scales must be on the output's GPU", T))
    if not two_d:
        return out
    for side, s in (("A", sa), ("B", sb)):
        al = _aligned_input(s, assume_aligned_inputs)
        out.append(_c(f"scale {side} aligned", al, f"scale_{side.lower()} storage offset {s.storage_offset} B"
                      + (" 16-byte aligned" if al else " not 16-byte aligned"), _ALIGN))
    epb = 2 if fmt == "mxfp4" else 1
    m, ks = a.shape
    kb, n = b.shape
    k = ks * epb
    out.append(_c("K agrees", kb == ks, f"A's K {ks} == B's K {kb} (storage)" if kb == ks else f"A's K {ks} != B's K {kb}", T))
    out.append(_c("non-empty", min(m, n, ks) > 0, f"M={m}, N={n}, K={k} positive" if min(m, n, ks) > 0 else "an empty dimension", T))
    out.append(_c("K % 128", k % 128 == 0 and k <= INT32_MAX, f"K={k} % 128 == 0" if k % 128 == 0 else
                  f"K={k} is not a multiple of 128", T))
    for side, s, rows in (("A", sa, m), ("B", sb, n)):
        ok = s.shape == (rows, k // 32)
        out.append(_c(f"scale {side} shape", ok, f"scale_{side.lower()} shape {s.shape}" + (f" == [{rows}, K/32]" if ok
                      else f" must be [{rows}, {k // 32}]"), T))
        fits = _fits_inductor(rows, k // 32, k // 32, 1)
        out.append(_c(f"scale {side} span", fits, f"scale_{side.lower()} {rows * (k // 32)} B"
                      + (" fits" if fits else " exceeds the 32-bit buffer span"), T))
    notes = []
    # scaled_mm_v2_constraint: A kept when stride[1]==1 else copied row-major; B kept when
    # stride[0]==1 else copied column-major.
    a_kept, b_kept = a.stride[1] == 1, b.stride[0] == 1
    lda = a.stride[0] if a_kept else ks
    ldb = b.stride[1] if b_kept else ks
    for name, t, kept, ld in (("A", a, a_kept, lda), ("B", b, b_kept, ldb)):
        if kept:
            al = _aligned_input(t, assume_aligned_inputs)
            out.append(_c(f"{name} origin aligned", al, f"{name} storage offset {t.storage_offset} B"
                          + (" 16-byte aligned" if al else " not 16-byte aligned"), _ALIGN))
            ok = ld % GPU_ALIGN_BYTES == 0
            out.append(_c(f"{name} leading stride", ok, f"{name} leading stride {ld} B" + (" multiple of 16" if ok
                          else " not a multiple of 16"), f"{_MM}::get_flydsl_mm_template_kwargs"))
        else:
            notes.append(f"{name} has stride {t.stride}: Inductor copies it to "
                         f"{'row' if name == 'A' else 'column'}-major first (scaled_mm_v2_constraint)")
    for name, (r, st, c, isz) in (("A", (m, lda, ks, 1)), ("B", (n, ldb, ks, 1)), ("out", (m, n, n, 2))):
        ok = _fits_inductor(r, st, c, isz)
        out.append(_c(f"{name} span", ok, f"{name} spans {((r - 1) * st + c) * isz} B"
                      + (" (fits 32-bit buffer)" if ok else ": exceeds the 32-bit buffer span"), _SPAN_IND))
    out.append(_c("N % 8", n % 8 == 0, f"N={n} % 8 == 0 (16-byte output vectors)" if n % 8 == 0
                  else f"N={n} is not a multiple of 8: no FlyDSL config fits",
                  f"{_HEUR}::get_gemm_configs / is_gemm_config_valid_for_shape -> {_VALID}", "config"))
    out += [Condition("stride fix-up", True, text, f"{_MM}::scaled_mm_v2_constraint", "call") for text in notes]
    return out


# -- the front door -----------------------------------------------------------------------

def explain(op: str, *, env: EnvFacts | None = None, **call) -> Explanation:
    """Explain whether ``op`` with the given arguments takes FlyDSL.

    ``op``: one of :data:`OPS`. Keyword arguments (tensors or :class:`TensorDesc`):

    - rmsnorm: ``x, normalized_shape, weight=None, eps=1e-6``
    - topk: ``x, k, dim=-1, largest=True, sorted=True, deterministic=False``
    - gemm: ``a, b, out_dtype=None, bias=False, dynamic=False, autotuning=None, search_space=None``
    - grouped_gemm: ``a, b, offs=True, bias=False, scaled=False, out_dtype=None, dynamic=False, ...``
    - scaled_gemm: ``a, b, scale_a, scale_b, recipe_a/b, swizzle_a/b, out_dtype, bias, use_fast_accum,
      contraction_dim, scale_levels, dynamic, ...``

    ``env``: the :class:`EnvFacts` to judge against (default: :func:`facts` of this process).
    Raises :class:`UsageError` for an unknown operator or argument.
    """
    if op not in OPS:
        raise bad_choice("operator for explain", op, OPS)
    f = env or facts()
    notes: list[str] = []
    kernel = None
    try:
        if op == "rmsnorm":
            x = TensorDesc.of(call.pop("x"))
            ns = call.pop("normalized_shape", (x.shape[-1],) if x.ndim else ())
            w, eps = _desc(call.pop("weight", None)), call.pop("eps", 1e-6)
            args = {"x": x.text(), "normalized_shape": list(ns) if not isinstance(ns, int) else ns,
                    "weight": w.text() if w else None, "eps": eps}
            conds = eager_environment(f, op) + rmsnorm_rules(x, ns, w, eps)
            kernel = "rmsnorm_kernel (FlyDSL RMSNorm forward)"
            notes.append("forward only: the backward of F.rms_norm stays on ATen")
        elif op == "topk":
            x = TensorDesc.of(call.pop("x"))
            k = int(call.pop("k"))
            dim, largest, sorted_ = call.pop("dim", -1), call.pop("largest", True), call.pop("sorted", True)
            det = call.pop("deterministic", False)
            args = {"x": x.text(), "k": k, "dim": dim, "largest": largest, "sorted": sorted_, "deterministic": det}
            rules, kernel = topk_rules(x, k, dim, largest, sorted_, f.cu_count, f.cu_source)
            conds = eager_environment(f, op) + rules
            if kernel and kernel.startswith("radix"):
                notes.append("deterministic mode " + ("on: the radix kernel gathers in input order (matches ATen)"
                             if det else "off: radix indices on ties may vary between runs"))
            elif kernel == "register":
                notes.append("the register kernel is reproducible; deterministic mode does not change it")
        else:
            at, ss = _autotune_mode(f, call.pop("autotuning", None), call.pop("search_space", None))
            aa = bool(f.inductor.get("assume_aligned_inputs"))
            common = dict(dynamic=call.pop("dynamic", False), autotuning=at, search_space=ss, assume_aligned_inputs=aa)
            if op == "gemm":
                a, b = TensorDesc.of(call.pop("a")), TensorDesc.of(call.pop("b"))
                od, bias = call.pop("out_dtype", None), call.pop("bias", False)
                args = {"a": a.text(), "b": b.text(), "bias": bias, "out_dtype": od, **common}
                conds = compile_environment(f) + mm_rules(a, b, out_dtype=od, bias=bias, **common)
                kernel = "mm_flydsl (gemm_gfx950 kernel)"
            elif op == "grouped_gemm":
                a, b = TensorDesc.of(call.pop("a")), TensorDesc.of(call.pop("b"))
                offs = call.pop("offs", True)
                kw = dict(bias=call.pop("bias", False), scaled=call.pop("scaled", False), out_dtype=call.pop("out_dtype", None))
                args = {"a": a.text(), "b": b.text(), "offs": TensorDesc.of(offs).text() if hasattr(offs, "shape") else offs,
                        **kw, **common}
                conds = compile_environment(f) + grouped_mm_rules(a, b, offs, **kw, **common)
                kernel = "grouped_gemm_flydsl (grouped gemm_gfx950 kernel)"
            else:
                a, b = TensorDesc.of(call.pop("a")), TensorDesc.of(call.pop("b"))
                sa, sb = TensorDesc.of(call.pop("scale_a")), TensorDesc.of(call.pop("scale_b"))
                kw = {k: call.pop(k) for k in ("recipe_a", "recipe_b", "swizzle_a", "swizzle_b", "out_dtype", "bias",
                                               "use_fast_accum", "contraction_dim", "scale_levels") if k in call}
                args = {"a": a.text(), "b": b.text(), "scale_a": sa.text(), "scale_b": sb.text(),
                        **{k: (v.text() if isinstance(v, TensorDesc) else v) for k, v in kw.items()}, **common}
                conds = compile_environment(f) + scaled_mm_rules(a, b, sa, sb, **kw, **common)
                kernel = "mm_flydsl MXFP (gemm_gfx950 MXFP kernel)"
                notes.append("eager F.scaled_mm never takes FlyDSL (hipBLASLt); only torch.compile max-autotune does, "
                             "with FlyDSL competing against ATen in autotuning")
            notes.append("eligible means FlyDSL is a candidate: max-autotune benchmarks it against the other "
                         "backends and the fastest wins; see flyexplore.trace for the autotune decision")
            notes.append("Inductor's pad_mm pass (config.shape_padding) may pad unaligned dimensions before "
                         "lowering; the rules above judge the call as given")
    except KeyError as exc:
        raise UsageError(f"explain {op} needs argument {exc.args[0]!r}") from None
    if call:
        raise UsageError(f"unknown argument(s) for explain {op}: {', '.join(sorted(call))}")
    if f.assumed is None and f.environ.get("FLYDSL_GPU_ARCH") and op in EAGER:
        notes.append("torch caches the arch per process at the first FlyDSL call: set FLYDSL_GPU_ARCH before it")
    args = {k: (_short(v) if hasattr(v, "is_floating_point") else v) for k, v in args.items()}
    return Explanation(op, OPS[op], args, tuple(conds), kernel if all(c.ok for c in conds if c.kind in ("call", "config")) else None,
                       tuple(notes), f.assumed)


# -- from the operator catalogue / command line ------------------------------------------------

#: Per-operator ``key=value`` options of ``flyexplore explain --opt`` (besides the shape text).
EXPLAIN_OPTIONS = {
    "rmsnorm": ("x_shape", "x_stride", "x_offset", "normalized_dims", "weight_dtype", "weight_contiguous", "device"),
    "topk": ("x_stride", "dim", "cu", "device"),
    "gemm": ("a_stride", "b_stride", "a_offset", "b_offset", "bias", "out_dtype", "dynamic", "autotuning",
             "search_space", "device"),
    "grouped_gemm": ("a_stride", "b_stride", "a_offset", "b_offset", "bias", "scaled", "out_dtype", "offs",
                     "dynamic", "autotuning", "search_space", "device"),
    "scaled_gemm": ("a_stride", "b_stride", "a_offset", "b_offset", "scale_a_offset", "scale_b_offset", "bias",
                    "out_dtype", "recipe", "swizzle", "fast_accum", "scale_levels", "dynamic", "autotuning",
                    "search_space", "device"),
}

_SHAPES = {"grouped_gemm": ("g", "m", "n", "k"), "scaled_gemm": ("m", "n", "k")}


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in re.split(r"[x,]", str(text).strip().strip("()[]")) if v.strip() != "")
    except ValueError:
        raise UsageError(f"malformed {what} {text!r} (expected integers, e.g. 4096,1)") from None
    if not vals:
        raise UsageError(f"malformed {what} {text!r} (expected integers, e.g. 4096,1)")
    return vals


def _flag(v) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"bad boolean {v!r} (use 1/0, true/false)")


def _parse_dims(op: str, text: str) -> dict:
    dims = _SHAPES[op]
    shape, _, opts = text.strip().partition(":")
    s = shape.strip().lower()
    if op == "grouped_gemm" and s.startswith("g"):
        s = s[1:]
    want = "x".join(d.upper() for d in dims)
    if not re.fullmatch(r"\d+(x\d+)*", s) or len(s.split("x")) != len(dims):
        raise UsageError(f"malformed {op} shape {text!r} (expected {want}, positive integers"
                         + (", M rows per group, e.g. g8x512x4096x4096)" if op == "grouped_gemm" else ", e.g. 32x4096x4096)"))
    vals = dict(zip(dims, (int(v) for v in s.split("x"))))
    for d, v in vals.items():
        if v <= 0:
            raise UsageError(f"non-positive {op} {d}={v} in shape {text!r}")
    out = dict(vals)
    for tok in filter(None, (t.strip() for t in opts.split(","))):
        k, eq, v = tok.partition("=")
        if not eq:
            raise UsageError(f"malformed option {tok!r} in shape {text!r} (expected key=value)")
        out[k.strip()] = v.strip()
    return out


def describe(op: str, shape: str, dtype: str | None = None, opts: Mapping[str, Any] | None = None) -> dict:
    """Keyword arguments for :func:`explain` from a shape text (the operator catalogue's
    syntax for gemm/rmsnorm/topk: ``MxNxK:NT``, ``MxN:eps=1e-5``, ``MxNxK``; ``GxMxNxK``
    (M rows per group) for grouped_gemm, ``MxNxK`` for scaled_gemm), a dtype name and the
    :data:`EXPLAIN_OPTIONS`. Raises :class:`UsageError` for bad input."""
    import torch

    if op not in OPS:
        raise bad_choice("operator for explain", op, OPS)
    opts = dict(opts or {})
    for k in opts:
        if k not in EXPLAIN_OPTIONS[op]:
            raise bad_choice(f"explain option for {op}", k, EXPLAIN_OPTIONS[op])
    dev = str(opts.pop("device", "cuda:0"))
    common = {}
    for k in ("dynamic",):
        if k in opts:
            common[k] = _flag(opts.pop(k))
    if "autotuning" in opts:
        common["autotuning"] = _flag(opts.pop("autotuning"))
    if "search_space" in opts:
        ss = str(opts.pop("search_space")).upper()
        if ss not in ("DEFAULT", "EXHAUSTIVE"):
            raise bad_choice("search_space", ss, ("DEFAULT", "EXHAUSTIVE"))
        common["search_space"] = ss

    def stride(key, default):
        return _ints(opts.pop(key), key) if key in opts else default

    def offset(key):
        return _ints(opts.pop(key), key)[0] if key in opts else 0

    if op in ("gemm", "rmsnorm", "topk"):
        from .ops import get_op
        cat = get_op(op)
        case = cat.case(shape)
        dt = cat.check_dtype(dtype or cat.dtypes[0])
        p = case.p
        if op == "gemm":
            m, n, k, lay = p["m"], p["n"], p["k"], p["layout"]
            a = TensorDesc((m, k), dt, stride("a_stride", (k, 1) if lay[0] == "N" else (1, m)), offset("a_offset"), dev)
            b = TensorDesc((k, n), dt, stride("b_stride", (n, 1) if lay[1] == "N" else (1, k)), offset("b_offset"), dev)
            out = dict(a=a, b=b, bias=_flag(opts.pop("bias", False)), **common)
            if "out_dtype" in opts:
                out["out_dtype"] = _dtype(opts.pop("out_dtype"))
            return out
        if op == "rmsnorm":
            m, n = p["m"], p["n"]
            xs = _ints(opts.pop("x_shape"), "x_shape") if "x_shape" in opts else (m, n)
            x = TensorDesc(xs, dt, stride("x_stride", None), offset("x_offset"), dev)
            nd = int(opts.pop("normalized_dims", 1))
            ns = tuple(xs[-nd:]) if nd > 0 else ()
            w = None
            if p["weight"]:
                wdt = _dtype(opts.pop("weight_dtype")) if "weight_dtype" in opts else dt
                wc = _flag(opts.pop("weight_contiguous", True))
                w = TensorDesc(ns or (n,), wdt, None if wc or len(ns or (n,)) != 1 else (2,), 0, dev)
            return dict(x=x, normalized_shape=ns, weight=w, eps=p["eps"])
        m, n, k = p["m"], p["n"], p["k"]
        x = TensorDesc((m, n), dt, stride("x_stride", None), 0, dev)
        out = dict(x=x, k=k, dim=int(opts.pop("dim", -1)), largest=p["largest"], sorted=p["sorted"],
                   deterministic=p["deterministic"])
        if "cu" in opts:
            out["_cu"] = int(opts.pop("cu"))
        return out
    vals = _parse_dims(op, shape)
    inline = {k: v for k, v in vals.items() if k not in _SHAPES[op]}
    for k, v in inline.items():
        if k not in EXPLAIN_OPTIONS[op]:
            raise bad_choice(f"explain option for {op}", k, EXPLAIN_OPTIONS[op])
        opts.setdefault(k, v)
    if op == "grouped_gemm":
        dt = dtype or "bf16"
        g, m, n, k = vals["g"], vals["m"], vals["n"], vals["k"]
        tm = g * m
        a = TensorDesc((tm, k), dt, stride("a_stride", None), offset("a_offset"), dev)
        b = TensorDesc((g, k, n), dt, stride("b_stride", None), offset("b_offset"), dev)
        offs = TensorDesc((g,), torch.int32, None, 0, dev) if _flag(opts.pop("offs", True)) else None
        out = dict(a=a, b=b, offs=offs, bias=_flag(opts.pop("bias", False)), scaled=_flag(opts.pop("scaled", False)), **common)
        if "out_dtype" in opts:
            out["out_dtype"] = _dtype(opts.pop("out_dtype"))
        return out
    dt = dtype or "mxfp8"
    if dt not in ("mxfp8", "mxfp4", "fp8_e4m3"):
        raise bad_choice("dtype for scaled_gemm", dt, ("mxfp8", "mxfp4"))
    m, n, k = vals["m"], vals["n"], vals["k"]
    epb = 2 if dt == "mxfp4" else 1
    ks = k // epb
    a = TensorDesc((m, ks), dt, stride("a_stride", None), offset("a_offset"), dev)
    b = TensorDesc((ks, n), dt, stride("b_stride", (1, ks)), offset("b_offset"), dev)
    sa = TensorDesc((m, k // 32), torch.float8_e8m0fnu, None, offset("scale_a_offset"), dev)
    sb = TensorDesc((n, k // 32), torch.float8_e8m0fnu, None, offset("scale_b_offset"), dev)
    od = _dtype(opts.pop("out_dtype", "bf16"))
    recipe = str(opts.pop("recipe", "blockwise1x32")).lower()
    if recipe not in RECIPES:
        raise bad_choice("recipe", recipe, RECIPES)
    sw = str(opts.pop("swizzle", "none")).lower()
    if sw not in SWIZZLES:
        raise bad_choice("swizzle", sw, SWIZZLES)
    bias = TensorDesc((n,), od, None, 0, dev) if _flag(opts.pop("bias", False)) else None
    return dict(a=a, b=b, scale_a=sa, scale_b=sb, recipe_a=recipe, recipe_b=recipe, swizzle_a=sw, swizzle_b=sw,
                out_dtype=od, bias=bias, use_fast_accum=_flag(opts.pop("fast_accum", False)),
                scale_levels=int(opts.pop("scale_levels", 1)), **common)


def explain_shape(op: str, shape: str, dtype: str | None = None, opts: Mapping[str, Any] | None = None, *,
                  arch: str | None = None, cu: int | None = None, assume_rocm: bool = False,
                  compile_options: Mapping[str, Any] | None = None) -> Explanation:
    """:func:`explain` from a shape text, dtype name and options (what ``flyexplore explain``
    runs). ``arch`` / ``cu`` / ``assume_rocm`` / ``compile_options`` go to :func:`facts`."""
    call = describe(op, shape, dtype, opts)
    cu = call.pop("_cu", cu)
    f = facts(arch=arch, cu=cu, assume_rocm=assume_rocm,
              compile_options=compile_options if op not in EAGER else None)
    return explain(op, env=f, **call)


def explain_case(op_name: str, case, dtype: str, env: EnvFacts | None = None,
                 compile_options: Mapping[str, Any] | None = None) -> Explanation | None:
    """The explanation for one catalogue case (:class:`~flyexplore.ops.base.Case`) run with
    FlyDSL, or ``None`` for an operator the explainer does not cover. ``compile_options``
    are the options the flydsl backend compiles with."""
    if op_name not in OPS:
        return None
    if op_name in ("gemm", "rmsnorm", "topk"):
        call = describe(op_name, case.label, dtype)
    else:
        p = case.p
        dims = _SHAPES[op_name]
        if not all(d in p for d in dims):
            return None
        call = describe(op_name, "x".join(str(p[d]) for d in dims), dtype)
    call.pop("_cu", None)
    f = env or facts(compile_options=compile_options if op_name not in EAGER else None)
    return explain(op_name, env=f, **call)


# -- the dispatch inspector's front door and the eligibility grid ---------------------------------

#: An example shape per explainable operator, in the operator catalogue's syntax.
EXAMPLES = {"rmsnorm": "8192x4096", "topk": "4096x2048x8", "gemm": "16x28672x4096:NT",
            "grouped_gemm": "8x512x4096x4096", "scaled_gemm": "32x4096x4096"}

#: Architectures the inspector offers to judge against (gcnArchName -> devices). torch 2.15
#: dispatches FlyDSL on gfx950 only; the others show which rule says no.
ARCHES = {"gfx950": "MI350X / MI355X", "gfx942": "MI300X / MI325X", "gfx90a": "MI200",
          "gfx1201": "Radeon RX 9070"}


def dtypes_for(op: str) -> tuple[str, ...]:
    """The dtype names an explainable operator takes (its catalogue's, first = default).
    Raises :class:`UsageError` for an operator the explainer does not cover."""
    if op not in OPS:
        raise bad_choice("operator for explain", op, OPS)
    from .ops import get_op
    return tuple(get_op(op).dtypes)


def parse_options(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``"a_offset=3; bias=1"`` (``;`` or new lines between ``key=value`` pairs; values may hold
    commas, e.g. ``a_stride=1,4096``) -> ``{"a_offset": "3", "bias": "1"}``. A mapping is
    copied; ``None`` or blank text gives ``{}``. Raises :class:`UsageError` for a pair without
    ``=`` or an empty key (names are checked by :func:`describe`)."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    out: dict[str, Any] = {}
    for tok in filter(None, (t.strip() for t in re.split(r"[;\n]", str(text)))):
        k, eq, v = tok.partition("=")
        if not eq or not k.strip():
            raise UsageError(f"malformed option {tok!r} (expected key=value, pairs separated by ';')")
        out[k.strip()] = v.strip()
    return out


def _catalogue_to_explain(op: str, shape: str, opts: dict) -> tuple[str, list[str]]:
    """grouped_gemm / scaled_gemm shapes in the catalogue's syntax (``GxMxNxK:layout=NT``,
    ``MxNxK:scaling=row``) -> the explainer's shape text, with the catalogue options turned
    into explainer options where they change a rule, and notes for what is not modelled."""
    from .ops import get_op

    text = shape.strip()
    if op == "grouped_gemm" and text[:1].lower() == "g":
        text = text[1:]
    head, _, tail = text.partition(":")
    if not tail.strip():
        return head, []  # bare dimensions: the explainer judges them itself (no catalogue rules first)
    if any(k.split("=")[0].strip() in EXPLAIN_OPTIONS[op] for k in tail.split(",") if k.strip()):
        return shape, []  # explainer options written inline (explain's own syntax)
    p = get_op(op).case(text).p
    notes = []
    if op == "grouped_gemm":
        g, m, n, k = p["g"], p["m"], p["n"], p["k"]
        if p.get("layout") == "NT":
            opts.setdefault("b_stride", f"{k * n},1,{k}")   # B = w.transpose(-2, -1) of a [G, N, K] w
        if p.get("ms"):
            notes.append(f"ragged groups ms={p['ms']}: judged with G x M = {g * m} rows of A "
                         "(the rules read only shapes and strides, not the group sizes)")
        return f"{g}x{m}x{n}x{k}", notes
    scaling = p.get("scaling", "block")
    if scaling != "block":
        opts.setdefault("recipe", {"tensor": "tensorwise", "row": "rowwise"}.get(scaling, scaling))
    return f"{p['m']}x{p['n']}x{p['k']}", notes


def explain_text(op: str, shape: str, dtype: str | None = None,
                 options: str | Mapping[str, Any] | None = None, *, arch: str | None = FLYDSL_ARCH,
                 cu: int | None = None, compile_options: Mapping[str, Any] | None = None) -> Explanation:
    """The dispatch inspector's question, from text: would ``op`` on ``shape`` (the operator
    catalogue's syntax -- ``8192x4096``, ``4096x2048x8``, ``16x28672x4096:NT``,
    ``8x512x4096x4096[:layout=NT]``, ``32x4096x4096[:scaling=row]`` -- or :func:`describe`'s)
    in ``dtype`` take FlyDSL, and why (not)?

    ``options``: more of the call as ``"key=value; key=value"`` text or a mapping
    (:data:`EXPLAIN_OPTIONS`). ``arch``: a gcnArchName (default gfx950): judged as on a ROCm
    torch 2.15 with flydsl 0.3.x on that arch (:func:`facts` with ``assume_rocm``), with this
    process's switches; ``None``: this process's real environment. ``cu``: CU count for TopK's
    row gate (default 256, an MI355X). ``compile_options`` (GEMMs): the ``torch.compile``
    options to judge under; default FLYDSL added to this process's
    ``max_autotune_gemm_backends`` with max-autotune, i.e. what the catalogue's ``flydsl``
    backend compiles with (as ``flyexplore explain`` does). Raises :class:`UsageError` for bad
    input (the message names the bad value and the valid choices)."""
    if op not in OPS:
        raise bad_choice("operator for explain", op, OPS)
    if not str(shape or "").strip():
        raise UsageError(f"no {op} shape given (e.g. {EXAMPLES[op]})")
    _check_arch(arch)
    opts = parse_options(options)
    notes: list[str] = []
    if op in ("grouped_gemm", "scaled_gemm"):
        shape, notes = _catalogue_to_explain(op, str(shape), opts)
    comp = _compile_options_for(op, compile_options)
    ex = explain_shape(op, str(shape), dtype, opts, arch=arch, cu=cu, assume_rocm=arch is not None,
                       compile_options=comp)
    if notes:
        from dataclasses import replace
        ex = replace(ex, notes=ex.notes + tuple(notes))
    return ex


def _check_arch(arch: str | None) -> None:
    """Raise :class:`UsageError` unless ``arch`` is None or a gfx name (``gfx950``)."""
    if arch is not None and not re.fullmatch(r"gfx\d{2,3}[0-9a-f]?", str(arch)):
        raise UsageError(f"bad arch {arch!r} (expected a gfx name, e.g. {', '.join(ARCHES)})")


def _compile_options_for(op: str, compile_options: Mapping[str, Any] | None):
    """Inductor options to judge a compiled op with: the given ones, else this process's GEMM
    backends with FLYDSL added (``switches.compile_options``); None for eager ops."""
    if op in EAGER:
        return None
    if compile_options is not None:
        return dict(compile_options)
    from torch._inductor import config as ic

    from .switches import compile_options as flydsl_options
    return flydsl_options(True, backends=ic.max_autotune_gemm_backends)


def eligibility_grid(op: str, ms: Sequence[int] | int | None = None, ns: Sequence[int] | int | None = None,
                     dtype: str | None = None, *, dims: Mapping[str, Sequence[int] | int] | None = None,
                     options: str | Mapping[str, Any] | None = None, arch: str | None = FLYDSL_ARCH,
                     cu: int | None = None, compile_options: Mapping[str, Any] | None = None):
    """Where in the shape space FlyDSL is taken: :func:`explain` at every combination of the
    given dimension values, as a tidy ``pandas.DataFrame`` for
    :func:`flyexplore.plots.heatmap_figure` (``kind="eligibility"``).

    ``ms`` / ``ns``: M and N values (a list sweeps a dimension, an int fixes it); ``dims``: the
    operator's other dimensions the same way (topk ``k``, gemm/scaled_gemm ``k``, grouped_gemm
    ``g`` and ``k``; or ``m`` / ``n`` instead of ``ms`` / ``ns``). Every dimension of the
    operator (:func:`flyexplore.ops.get_op` ``.dims``) must be given. ``dtype``, ``options``,
    ``arch``, ``cu`` and ``compile_options`` as in :func:`explain_text` (default: judged for
    gfx950 with this process's switches; GEMMs with FLYDSL on).

    Columns: the operator's dimensions (ints), ``dtype``, ``value`` (bool: FlyDSL taken),
    ``call_ok`` (the call qualifies, whatever the environment), ``kernel`` (the FlyDSL kernel
    family, e.g. TopK ``register`` or ``radix K 64-256, N 8192-32768``; ``None`` when the call
    does not qualify) and ``reason`` (one line: the failed conditions, or the kernel). One row
    per combination, the operator's first dimension varying slowest. Raises :class:`UsageError` for an
    unknown operator, a missing or unknown dimension or a non-positive value."""
    import itertools

    import pandas as pd

    from .ops import get_op

    if op not in OPS:
        raise bad_choice("operator for explain", op, OPS)
    order = get_op(op).dims
    given: dict[str, Any] = {}
    if ms is not None:
        given["m"] = ms
    if ns is not None:
        given["n"] = ns
    for k, v in (dims or {}).items():
        if k in given:
            raise UsageError(f"dimension {k!r} given twice")
        given[k] = v
    for k in given:
        if k not in order:
            raise bad_choice(f"dimension of {op}", k, order)
    missing = [d for d in order if d not in given]
    if missing:
        raise UsageError(f"eligibility_grid {op} needs values for {', '.join(missing)} "
                         f"(dimensions {'x'.join(order)})")
    axes = []
    for d in order:
        v = given[d]
        vals = [int(v)] if isinstance(v, (int, float)) else [int(x) for x in v]
        if not vals or min(vals) <= 0:
            raise UsageError(f"{op} {d} values must be positive integers, got {v!r}")
        axes.append(vals)
    opts = parse_options(options)
    _check_arch(arch)
    comp = _compile_options_for(op, compile_options)
    f = facts(arch=arch, cu=cu, assume_rocm=arch is not None, compile_options=comp)
    dt = dtype or dtypes_for(op)[0]
    rows = []
    for combo in itertools.product(*axes):
        shape = "x".join(map(str, combo))
        call = describe(op, shape, dt, dict(opts))
        call.pop("_cu", None)
        ex = explain(op, env=f, **call)
        rows.append({**dict(zip(order, combo)), "dtype": dt, "value": ex.taken, "call_ok": ex.call_ok,
                     "kernel": ex.kernel, "reason": ex.reason})
    return pd.DataFrame(rows, columns=[*order, "dtype", "value", "call_ok", "kernel", "reason"])


def topk_bands():
    """TopK's FlyDSL kernel families on gfx950 and the (K, N) band each covers, as a
    ``pandas.DataFrame`` (columns ``kernel, k, n``; ``torch/_native/ops/topk/flydsl_impl.py``
    ``_kernel_for``). Rows outside every band run ATen."""
    import pandas as pd

    rows = [{"kernel": "register", "k": ", ".join(map(str, TOPK_REGISTER_KS)),
             "n": f"power of two in {TOPK_REGISTER_N[0]}..{TOPK_REGISTER_N[1]}"}]
    for k0, k1, n0, n1 in TOPK_RADIX_BANDS:
        rows.append({"kernel": f"radix K {k0}-{k1}, N {n0}-{n1}", "k": f"{k0}..{k1}", "n": f"{n0}..{n1}"})
    return pd.DataFrame(rows, columns=["kernel", "k", "n"])


# -- attention: SDPA on ROCm, AOTriton and its FlyDSL ("flyc") backend -----------------------------

#: The path an SDPA call takes to FlyDSL.
ATTENTION_PATH = ("F.scaled_dot_product_attention -> SDPA flash / efficient -> AOTriton (ROCm) -> "
                  "AOTriton's tuning table picks Triton, aiter or FlyDSL (flyc)")
#: ``key=value`` options of ``flyexplore explain --op attention --opt``.
ATTENTION_OPTIONS = ("backend", "fa_library", "device")
_FA_LIBRARIES = ("aotriton", "ck", "default")
_SDPA_BY_INDEX = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
_AOT = "ROCm/aotriton (see flyexplore/aotriton.py for tags and files)"


@dataclass(frozen=True)
class AttentionExplanation(Explanation):
    """The answer for one SDPA call: can AOTriton's FlyDSL kernels run it? (:func:`explain_attention`).

    ``verdict``: ``"eligible"`` (every condition holds: AOTriton would be called and builds a
    FlyDSL kernel for the call -- whether it runs is AOTriton's tuning table's choice, which
    nothing outside AOTriton can read), ``"not eligible"`` (a condition fails) or
    ``"unverified"`` (nothing fails, but a condition could not be evaluated here, typically
    torch's SDPA checks away from the ROCm GPU). ``taken`` is True exactly when eligible.
    ``sdpa``: what torch said on the device (``choice``, ``priority``, ``reasons`` per
    backend), ``None`` when not asked."""

    sdpa: dict | None = None

    @property
    def verdict(self) -> str:
        if any(c.ok is False for c in self.conditions):
            return "not eligible"
        return "eligible" if all(c.ok is True for c in self.conditions) else "unverified"

    @property
    def reason(self) -> str:
        v = self.verdict
        if v == "eligible":
            return f"FlyDSL eligible ({self.kernel}); AOTriton's tuning table decides whether it runs"
        if v == "not eligible":
            return "not eligible: " + "; ".join(c.detail for c in self.failed)
        return "unverified: " + "; ".join(c.detail for c in self.conditions if c.ok is None)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verdict": self.verdict, "sdpa": self.sdpa}

    def to_text(self) -> str:
        lines = [f"{self.op}: AOTriton FlyDSL {self.verdict.upper()} -- {self.path}"]
        if self.assumed:
            lines.append(f"assumed: {self.assumed}")
        lines.append("arguments: " + ", ".join(f"{k}={v}" for k, v in self.arguments.items()))
        if self.kernel:
            lines.append(f"FlyDSL kernels for this call: {self.kernel}")
        for kind in ("environment", "switch", "call"):
            cs = [c for c in self.conditions if c.kind == kind]
            if cs:
                lines.append(f"{kind}:")
            for c in cs:
                mark = {True: "ok ", False: "NO ", None: " ? "}[c.ok]
                lines.append(f"  [{mark}] {c.detail}")
                lines.append(f"         ({c.source})")
        lines.append(f"verdict: {self.reason}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def _sdpa_on_device(case, dtype: str, backend: str, device) -> dict:
    """torch's own answer on this GPU: the backend ``torch._fused_sdp_choice`` picks for the
    call (under ``backend``'s restriction, the flash-attention library pinned as the catalogue
    backend pins it) and the refusal reasons of flash / efficient
    (:func:`flyexplore.ops.attention.explain`: ``can_use_*_attention(debug=True)``)."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .ops import attention as OA

    q, k, v = OA._probe_tensors(case, dtype, device)
    gqa = OA.kv_heads(case) != case["h"]
    with contextlib.ExitStack() as st:
        if backend != "default":
            st.enter_context(OA._rocm_library(backend, "rocm"))
            st.enter_context(sdpa_kernel([getattr(SDPBackend, OA._SDP_NAMES[backend])]))
        try:
            choice = _SDPA_BY_INDEX.get(int(torch._fused_sdp_choice(
                q, k, v, attn_mask=None, dropout_p=0.0, is_causal=case["causal"], enable_gqa=gqa)), "?")
        except RuntimeError as exc:
            choice = f"none ({str(exc).strip().splitlines()[0]})"
    reasons = {b: OA.explain(b, case, dtype, device, "rocm") for b in ("flash", "efficient")}
    prio = getattr(torch._C, "_get_sdp_priority_order", None)
    order = [_SDPA_BY_INDEX.get(int(i), str(i)) for i in prio()] if prio else None
    return {"choice": choice, "priority": order, "reasons": reasons}


def explain_attention(shape: str, dtype: str | None = None, *, backend: str = "default",
                      fa_library: str | None = None, arch: str | None = None, aotriton: str | None = None,
                      assume_rocm: bool = False, device: str | None = None) -> AttentionExplanation:
    """What can be said before running about an SDPA call and AOTriton's FlyDSL kernels.

    ``shape``: the attention catalogue's text, ``BxHxSQxSKVxD[:causal=1,hkv=N,bwd]``; ``dtype``:
    bf16 (default), fp16 or fp32; ``backend``: the catalogue's SDPA backend (``default`` = no
    restriction, ``flash``, ``efficient``, ``ck``, ``math``, ``cudnn``); ``fa_library``: a
    what-if for ``torch.backends.cuda.preferred_rocm_fa_library`` (``aotriton``, ``ck``,
    ``default``; default: this process's).

    Judged against this process (a ROCm torch on its GPU: torch's own SDPA checks are run on the
    device), or as a what-if when ``arch`` or ``assume_rocm`` is given: a ROCm build of torch
    on ``arch`` (default gfx950) with AOTriton ``aotriton`` (``0.14.2``, ``0.13b``, ...; default
    the bundled version, else 0.14.2, which torch main pins); torch's SDPA checks then stay
    unevaluated (they need the device), so the verdict is at best ``unverified``.

    Conditions (each with its source): ROCm build; AOTriton bundled and its version; the version
    has the flyc backend (0.14 and later); the arch is one AOTriton builds FlyDSL for (gfx950,
    gfx1201); the SDPA backend reaches AOTriton (flash / efficient / default, not ck / math /
    cudnn) and the flash-attention library is AOTriton, not CK; torch's SDPA pick on the
    device; dtype fp16 / bf16; the head dim's rung (AOTriton rounds it up to its compiled head
    dims) has a FlyDSL kernel for the pass (:mod:`flyexplore.aotriton`). The notes say plainly
    that the final choice is AOTriton's tuning table, and what 0.13b would run. Raises
    :class:`UsageError` for a bad shape, dtype, backend, library, arch or version."""
    from . import aotriton as A
    from .env import collect
    from .ops import get_op

    op = get_op("attention")
    case = op.case(shape)
    dt = op.check_dtype(dtype or op.dtypes[0])
    if backend not in op.backends:
        raise bad_choice("attention backend", backend, list(op.backends))
    if fa_library is not None and fa_library not in _FA_LIBRARIES:
        raise bad_choice("ROCm flash-attention library", fa_library, _FA_LIBRARIES)
    _check_arch(arch)
    if aotriton is not None and A.parse_version(aotriton) is None:
        raise UsageError(f"bad AOTriton version {aotriton!r} (expected e.g. 0.14.2, 0.14.2b or 0.13b)")
    env = collect()
    p = case.p
    pas, d = p["pass"], p["d"]
    what_if = assume_rocm or arch is not None
    bundled = env.versions.get("aotriton")
    bundled = bundled if A.parse_version(bundled) else None
    if what_if:
        rocm, dev_arch = True, arch or FLYDSL_ARCH
        ver = aotriton or bundled or A.PINNED_BY_TORCH_MAIN
        src = "given" if aotriton else ("bundled with this torch" if bundled else "the version torch main pins")
        assumed = (f"a ROCm build of torch on {dev_arch} with AOTriton {A.release_name(ver)} ({src}); "
                   "torch's SDPA checks not run (they need the device)")
    else:
        rocm = env.platform == "rocm"
        dev_arch = env.device.arch if rocm else None
        ver = aotriton or env.versions.get("aotriton") or "not present"
        assumed = f"AOTriton {A.release_name(ver)} (given)" if aotriton else None
    rel = A.release_name(ver)
    conds: list[Condition] = []
    conds.append(_c("ROCm build", rocm, "ROCm build of torch: SDPA's flash and efficient backends call AOTriton" if rocm
                    else f"torch {env.versions.get('torch')} is not a ROCm build ({env.platform}): SDPA never calls "
                         "AOTriton (ask a what-if with --arch gfx950)",
                    "torch.version.hip; shared/reference/pytorch-flydsl.md (Attention)", "environment"))
    present = A.parse_version(ver) is not None
    conds.append(_c("AOTriton bundled", present, f"AOTriton {rel} (libaotriton_v2.so.{'.'.join(map(str, A.parse_version(ver)))})"
                    if present else f"no AOTriton version found ({ver})",
                    "flyexplore.env.aotriton_version: the bundled torch/lib/libaotriton_v2.so.X.Y.Z", "environment"))
    flyc = A.has_flyc(ver)
    conds.append(_c("AOTriton has flyc", flyc if present else None,
                    f"AOTriton {rel} has the FlyDSL (flyc) backend" if flyc else
                    (f"AOTriton {rel} has no FlyDSL backend: 0.13b has Triton and aiter only; flyc is new in 0.14b"
                     if present else "AOTriton version unknown"),
                    f"{_AOT}: tag 0.13b modules/flash/aot/__init__.py; PR 230 (flyc = op_attn_fwd backend 2, "
                    "op_attn_bwd backend 3); pytorch/pytorch PR 197747", "environment"))
    arch_ok = None if not dev_arch else (dev_arch, pas) in A.FLYC_HEAD_DIMS
    conds.append(_c("arch", arch_ok, f"{dev_arch} is an arch AOTriton builds FlyDSL kernels for" if arch_ok else
                    (f"AOTriton builds FlyDSL kernels for gfx950 and gfx1201 only, not {dev_arch}" if dev_arch
                     else "no ROCm device: arch unknown"),
                    "modules/flash/aot/flyc_attn_fwd.py::_FLYC_FWD_LADDERS (0.14 cycle)", "environment"))
    reaches = backend in ("default", "flash", "efficient")
    conds.append(_c("SDPA backend", reaches, f"SDPA backend {backend}: " + (
        "flash and efficient are AOTriton on ROCm" if reaches else
        {"ck": "Composable Kernel, not AOTriton", "math": "the unfused composition, no AOTriton",
         "cudnn": "cuDNN (NVIDIA only), no AOTriton"}.get(backend, "not AOTriton")),
        "torch.nn.attention.sdpa_kernel; flyexplore.ops.attention", "switch"))
    if backend in ("flash", "efficient"):
        lib, lib_src = "aotriton", "pinned by flyexplore's flash/efficient backends"
    else:
        from .switches import rocm_fa_library
        lib = fa_library or (rocm_fa_library() if rocm and not what_if else None) or "default"
        lib_src = "given" if fa_library else "this process's preference"
    lib_ok = None if backend not in ("default", "flash", "efficient") else lib != "ck"
    conds.append(_c("flash-attention library", lib_ok,
                    f"preferred_rocm_fa_library {lib!r} ({lib_src}): " +
                    ("CK runs flash and efficient, not AOTriton" if lib == "ck" else "AOTriton runs flash and efficient"),
                    "torch.backends.cuda.preferred_rocm_fa_library (TORCH_ROCM_FA_PREFER_CK=1 sets 'ck')", "switch"))
    sdpa = None
    if rocm and not what_if and backend in ("default", "flash", "efficient"):
        try:
            sdpa = _sdpa_on_device(case, dt, backend, device or "cuda:0")
            pick = sdpa["choice"]
            ok = pick in ("flash", "efficient")
            why = "; ".join(f"{b}: {r}" for b, r in sdpa["reasons"].items() if r)
            detail = (f"torch picks SDPA backend {pick} on this GPU" + (" (AOTriton, unless CK is preferred)" if ok else
                      ", not AOTriton" + (f" -- {why}" if why else "")))
        except Exception as exc:  # no device or an old torch: say so, never guess
            ok, detail = None, f"torch's SDPA choice could not be asked on this device ({type(exc).__name__}: {exc})"
    elif not reaches:
        ok, detail = None, "torch's SDPA choice not asked: the backend is not AOTriton"
    else:
        import torch
        prio = getattr(torch._C, "_get_sdp_priority_order", None)
        order = ", ".join(_SDPA_BY_INDEX.get(int(i), str(i)) for i in prio()) if prio else "flash, efficient, math"
        ok, detail = None, ("not evaluated here: torch's can_use_flash_attention / can_use_efficient_attention judge "
                            f"tensors on the ROCm GPU (SDPA tries its backends in the order {order})")
    conds.append(_c("SDPA picks AOTriton", ok, detail,
                    "torch._fused_sdp_choice; torch.backends.cuda.can_use_flash_attention / "
                    "can_use_efficient_attention(debug=True); torch._C._get_sdp_priority_order", "call"))
    conds.append(_c("dtype", dt in A.FLYC_DTYPES, f"dtype {dt}: " + ("AOTriton's FlyDSL kernels take fp16/bf16"
                    if dt in A.FLYC_DTYPES else "AOTriton's FlyDSL kernels take fp16/bf16 only (fp32 stays on Triton)"),
                    "modules/flash/aot/flyc_attn_fwd.py (f16/bf16); PR 239 (flyc only for non-fp32)", "call"))
    rung = A.head_dim_rung(d, dev_arch, pas) if dev_arch else A.head_dim_rung(d, None, pas)
    what = "forward" if pas == "fwd" else "backward"
    if rung is None:
        hd_ok, hd = False, f"head dim {d} > 512: AOTriton has no kernel for it"
    elif not arch_ok:
        hd_ok, hd = None, f"head dim {d} -> rung {rung}; the FlyDSL head dims depend on the arch"
    else:
        ladder = A.FLYC_HEAD_DIMS[(dev_arch, pas)]
        hd_ok = rung in ladder
        hd = (f"head dim {d} -> rung {rung}" + ("" if rung == d else " (padded)") +
              (f": AOTriton builds a FlyDSL {what} kernel for it on {dev_arch}" if hd_ok else
               f": no FlyDSL {what} kernel on {dev_arch} (FlyDSL rungs {', '.join(map(str, sorted(ladder)))})"))
    conds.append(_c("head dim", hd_ok, hd, "include/aotriton/_internal/util.h::round_value + attn_fwd.cc / attn_bwd.cc "
                    "(gfx950 fixes); flyc_attn_fwd.py / flyc_bwd_dkdv.py / flyc_bwd_dq.py head-dim ladders", "call"))
    notes = ["the final choice is AOTriton's: its operator tuning table (lookup_optimal in "
             "modules/flash/csrc/attn_fwd.cc) picks Triton, aiter or FlyDSL per arch, dtype, head-dim rung, causal "
             "and binned sequence lengths; torch has no switch for it (attn_options.force_backend_index is not "
             "reachable from SDPA); in the shipped 0.14 schedule short sequences fall back to Triton "
             "(flyc_attn_fwd.py)"]
    if dev_arch:
        ai, ai_why = A.aiter_support(dev_arch, dt, d, pas)
        notes.append("AOTriton 0.13b (no flyc) runs its Triton kernels here" +
                     (f", or aiter ({ai_why})" if ai else "") + "; a 0.13b vs 0.14.2b A/B shows the difference "
                     "(flyexplore.aotriton.ab_view)")
    if pas == "bwd":
        notes.append("the FlyDSL backward is a metro: Triton bwd_preprocess, then flyc_bwd_dkdv and flyc_bwd_dq "
                     "(flyc_bwd_dkdv.py), so a trace shows AOTriton[FlyDSL] and AOTriton[Triton]")
    notes.append("what really ran: `flyexplore trace --op attention --shape ... --backend default` on the ROCm "
                 "machine; its observed column shows AOTriton[FlyDSL], AOTriton[Triton] or AOTriton[aiter]")
    args = {"shape": case.label, "dtype": dt, "pass": pas, "head_dim": d, "rung": rung, "arch": dev_arch,
            "aotriton": rel, "backend": backend}
    call_ok = all(c.ok is True for c in conds if c.name in ("AOTriton has flyc", "arch", "dtype", "head dim"))
    return AttentionExplanation("attention", ATTENTION_PATH, args, tuple(conds),
                                A.FLYC_KERNELS[pas] if call_ok else None, tuple(notes), assumed, sdpa)


def explain_attention_options(shape: str, dtype: str | None = None, options: Mapping[str, Any] | None = None,
                              **kw) -> AttentionExplanation:
    """:func:`explain_attention` with ``--opt`` style options (:data:`ATTENTION_OPTIONS`: ``backend``,
    ``fa_library``, ``device``). Raises :class:`UsageError` for an unknown option."""
    opts = dict(options or {})
    for k in opts:
        if k not in ATTENTION_OPTIONS:
            raise bad_choice("explain option for attention", k, ATTENTION_OPTIONS)
    return explain_attention(shape, dtype, **{k: str(v) for k, v in opts.items()}, **kw)
