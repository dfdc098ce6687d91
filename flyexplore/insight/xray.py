"""Kernel X-ray: the FlyDSL kernel torch 2.15 would run on MI350 (gfx950), compiled and inspected
on any machine -- no GPU, no ROCm.

For one case (operator, shape, dtype) the X-ray asks the explainer
(:func:`flyexplore.insight.explain.explain_text` for gfx950) whether the case takes FlyDSL and, if it
does, calls torch's own kernel builders so that flydsl compiles that very kernel in its
compile-only mode (``COMPILE_ONLY=1``, ``FLYDSL_GPU_ARCH=gfx950``, ``FLYDSL_DUMP_IR=1``,
``FLYDSL_RUNTIME_ENABLE_CACHE=0``; ``ROCM_PATH`` points at an AMDGPU-capable ``ld.lld``); torch's
own dispatch predicates are asked too, and a disagreement is noted. It then reads the kernel's
resources from the final AMDGPU ISA (``.s``): VGPRs, AGPRs, SGPRs, spills, LDS bytes, workgroup
and wavefront size; computes the occupancy those allow on gfx950 (:func:`occupancy`, limits in
:data:`GFX950`); counts instructions by class (:func:`count_instructions`); and saves the ISA
text. ISA parsing and occupancy live in :mod:`flyexplore.insight.isa`.

>>> from flyexplore.insight.xray import xray
>>> x = xray("rmsnorm", "8192x4096", "bf16", out="xray-out")     # doctest: +SKIP
>>> print(x.to_text())                                            # doctest: +SKIP

Command line: ``flyexplore xray --op rmsnorm --shape 8192x4096 --dtype bf16 [--arch gfx950]
[--out DIR] [--json]``. ``flyexplore xray --coverage`` lists what is and is not covered.

Covered (torch 2.15 + flydsl 0.3), builders called, never copied: every operator family whose
``FlyDSLPath.xray`` names a builder (``flyexplore/ops/<family>_xray.py``: rmsnorm forward, topk
register and radix, gemm bf16/fp16 and ``mxfp8``/``mxfp4`` through scaled_mm, grouped_gemm
``GxMxNxK``); each module's docstring names the torch functions it calls, and its ``XRAY`` spec
what this module needs to know (:func:`xray_spec`, :func:`coverage_text`).

Not covered: see :data:`NOT_COVERED`. The Inductor gates that need a real compile graph
(``use_flydsl_gemm_template``: ROCm build, max-autotune, FLYDSL listed) are assumed met; the
shape/layout/dtype rules of ``get_flydsl_mm_template_kwargs`` are re-derived for contiguous
inputs (each rule names its torch function). Eligible is not chosen: for GEMMs Inductor's
autotuner then benchmarks the FlyDSL candidate against ATen/Triton on the GPU.

The compile runs in a subprocess (``flyexplore/insight/_xray_worker.py``): flydsl and torch read their
settings once per process, and a fresh process leaves the user's flydsl cache untouched. What it
returns for a case is kept in flyexplore's disk cache (:mod:`flyexplore.insight.xray_cache`, keyed
by torch, flydsl, the linker and the builder's source): the same X-ray again starts no worker.
Numbers are compiler output for gfx950 (``source = "compiled"``), never measurements.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from flyexplore import atomic as A
from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight import xray_cache as XC
from flyexplore.insight.explain import dtypes_for, explain_text, parse_options
from flyexplore.insight.isa import (
    ARCH_LIMITS,
    GFX950,
    INSTRUCTION_CLASSES,
    KernelResources,
    Occupancy,
    count_instructions,
    occupancy,
    parse_isa,
)
from flyexplore.ops import get_op, list_ops
from flyexplore.parsing import DTYPE_NAMES
from flyexplore.world import env as ENV
from flyexplore.world.env import find_amdgpu_lld, xray_readiness
from flyexplore.world.readiness import check_arch


class XRayUnavailable(RuntimeError):
    """The X-ray cannot run on this machine (see ``flyexplore env``: FlyDSL kernel X-ray)."""


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class XRayKernel:
    """One compiled kernel: which family and config torch picked, its resources, occupancy,
    instruction counts by class, the ISA file it was saved to (``isa_file``; ``None`` without an
    output folder) and flydsl's compile time in seconds (``compile_s``; ``reused`` when an earlier
    case in the same batch already compiled the same specialisation; ``cached`` when it was read
    from the X-ray's disk cache, :mod:`flyexplore.insight.xray_cache`: compiled by an earlier
    X-ray with the same torch, flydsl, linker and builder)."""

    name: str
    family: str
    config: dict[str, Any]
    resources: KernelResources
    occupancy: Occupancy
    instructions: dict[str, int]
    isa_file: str | None
    compile_s: float | None
    reused: bool = False
    isa_text: str = field(default="", repr=False, compare=False)
    cached: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class XRay:
    """The X-ray of one case. ``eligible`` says whether torch 2.15 would run FlyDSL for it on
    ``arch``, ``reason`` why (in words, naming torch's rule), ``verdict_source`` who said so
    (torch's predicate, or ``flyexplore.insight.explain``). ``kernels`` is empty when not eligible or
    when the build failed (``error``). ``source`` is always ``"compiled"``: compiler output for
    the target, nothing was run or measured."""

    op: str
    case: str
    params: dict[str, Any]
    dtype: str
    arch: str
    eligible: bool
    reason: str
    verdict_source: str
    kernels: tuple[XRayKernel, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    out_dir: str | None = None
    source: str = "compiled"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, kern in zip(d["kernels"], self.kernels):
            k.pop("isa_text", None)
            k["occupancy"]["fraction"] = kern.occupancy.fraction
        d["limits_sources"] = list(ARCH_LIMITS[self.arch].sources) if self.arch in ARCH_LIMITS else []
        return d

    def to_text(self) -> str:
        """A human-readable report (what ``flyexplore xray`` prints)."""
        head = f"X-ray: {self.op} {self.case} {self.dtype} for {self.arch} (compile-only; nothing was run)"
        lines = [head, f"FlyDSL: {'ELIGIBLE' if self.eligible else 'not eligible'} -- {self.reason}",
                 f"  verdict from: {self.verdict_source}"]
        for k in self.kernels:
            r, o, n = k.resources, k.occupancy, k.instructions
            cfg = ", ".join(f"{a}={b}" for a, b in k.config.items())
            lines.append(f"kernel {k.name} ({k.family}; {cfg})")
            pad = (f"; descriptor reserves {r.vgprs_descriptor}: LLVM pads up to what the occupancy allows anyway"
                   if r.vgprs_descriptor and r.vgprs_descriptor > r.vgprs_total else "")
            lines.append(f"  registers: {r.vgprs} VGPRs + {r.agprs} AGPRs = {r.vgprs_total} unified per lane "
                         f"(rounded to {o.vgpr_alloc} of {GFX950.vgprs_per_lane}{pad}), {r.sgprs} SGPRs per wave; "
                         f"spills: {r.vgpr_spills} VGPR, {r.sgpr_spills} SGPR; scratch {r.scratch_bytes} B/work-item")
            if r.vgpr_spills:
                need = -(-r.waves_per_workgroup // GFX950.simds_per_cu)   # waves per SIMD the workgroup needs
                cap = GFX950.vgprs_per_lane // need // GFX950.vgpr_granule * GFX950.vgpr_granule
                why = (f"a {r.workgroup_size}-work-item workgroup puts {need} waves on each SIMD, leaving at "
                       f"most {cap} VGPRs per lane (LLVM getMaxNumVGPRs)" if cap < 256 else
                       "a wave addresses at most 256 architectural VGPRs")
                lines.append(f"  WARNING: {r.vgpr_spills} VGPRs spill to scratch memory "
                             f"({r.scratch_bytes} B per work-item): {why}")
            if r.sgpr_spills:
                lines.append(f"  note: {r.sgpr_spills} SGPR spills (a wave addresses at most 102 SGPRs on GFX9, "
                             "LLVM getAddressableNumSGPRs); they go to VGPR lanes (v_writelane / v_readlane), "
                             f"to memory only when scratch is used ({r.scratch_bytes} B per work-item)")
            lines.append(f"  LDS: {r.lds_bytes} B per workgroup (allocated {o.lds_alloc} B); workgroup "
                         f"{r.workgroup_size} work-items = {r.waves_per_workgroup} waves of {r.wavefront_size}")
            lim = ", ".join(f"{a} {'-' if b is None else b}" for a, b in o.limits.items())
            lines.append(f"  occupancy: {o.waves_per_simd:g} of {o.max_waves_per_simd} waves per SIMD "
                         f"({o.fraction:.0%}), {o.workgroups_per_cu} workgroups per CU; limited by "
                         f"{', '.join(o.limited_by)} (workgroups per CU by resource: {lim})")
            ins = ", ".join(f"{c} {n[c]}" for c, _, _ in INSTRUCTION_CLASSES)
            lines.append(f"  instructions ({n['total']} static): {ins}")
            where = k.isa_file or "(not saved; pass out=)"
            took = "reused from an earlier case" if k.reused else (
                f"compiled in {k.compile_s:.1f} s" if k.compile_s is not None else "")
            if k.cached:
                took = (took + ", " if took else "") + "read from the X-ray cache"
            lines.append(f"  ISA: {where} ({took})")
        if self.error:
            lines.append(f"error: {self.error}")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.kernels and self.arch in ARCH_LIMITS:
            lines.append(f"limits: {self.arch}: {GFX950.max_waves_per_simd} waves/SIMD, {GFX950.simds_per_cu} "
                         f"SIMDs/CU, {GFX950.vgprs_per_lane} unified VGPRs/lane (granule {GFX950.vgpr_granule}), "
                         f"LDS {GFX950.lds_bytes_per_cu // 1024} KiB/CU (granule {GFX950.lds_granule_bytes} B), "
                         f"{GFX950.max_barrier_workgroups} barriers/CU -- sources in flyexplore.insight.xray.GFX950.sources")
        return "\n".join(lines)

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows for a DataFrame: one per kernel, or one row with the reason when there is
        no kernel. Columns are described in :func:`xray_frame`."""
        base = {"op": self.op, "case": self.case, "dtype": self.dtype, "arch": self.arch,
                **{k: v for k, v in self.params.items()}, "eligible": self.eligible,
                "reason": self.reason, "verdict_source": self.verdict_source, "error": self.error,
                "source": self.source, "torch": self.versions.get("torch", ""),
                "flydsl": self.versions.get("flydsl", "")}
        if not self.kernels:
            return [dict(base, family=None, kernel=None)]
        out = []
        for k in self.kernels:
            r, o = k.resources, k.occupancy
            row = dict(base, family=k.family, kernel=k.name, config=json.dumps(k.config, sort_keys=True),
                       vgprs=r.vgprs, agprs=r.agprs, vgprs_total=r.vgprs_total, vgpr_alloc=o.vgpr_alloc,
                       vgprs_descriptor=r.vgprs_descriptor,
                       sgprs=r.sgprs, vgpr_spills=r.vgpr_spills, sgpr_spills=r.sgpr_spills,
                       scratch_bytes=r.scratch_bytes, lds_bytes=r.lds_bytes, workgroup_size=r.workgroup_size,
                       wavefront_size=r.wavefront_size, waves_per_workgroup=r.waves_per_workgroup,
                       waves_per_simd=o.waves_per_simd, occupancy=o.fraction,
                       workgroups_per_cu=o.workgroups_per_cu, limited_by=",".join(o.limited_by),
                       isa_file=k.isa_file, compile_s=k.compile_s, reused=k.reused, cached=k.cached)
            row.update({f"inst_{c}": v for c, v in k.instructions.items()})
            out.append(row)
        return out


# ------------------------------------------------------------------------------ coverage
#: Operators with a FlyDSL (or FlyDSL-built) kernel in torch 2.15 that the X-ray does not
#: compile, and why.
NOT_COVERED = {
    "sdpa (AOTriton 'flyc' backend)": "AOTriton 0.14's FlyDSL attention kernels are compiled ahead of "
    "time when AOTriton is built and ship inside ROCm torch's libaotriton_v2.so; torch builds nothing "
    "at run time, so there is no builder to call (and the CUDA/CPU wheels carry no AOTriton)",
    "rmsnorm backward": "torch 2.15's FlyDSL RMSNorm override is forward only (aten::_fused_rms_norm); "
    "backward runs ATen",
    "mxfp8 grouped gemm": "torch 2.15 vendors mxfp8_grouped_gemm_gfx950.py, but no Inductor lowering "
    "dispatches to it",
    "addmm / bmm / mm with fused epilogue or bias": "no FlyDSL template in torch 2.15 (mm_flydsl takes a "
    "plain mm, no bias, no epilogue fusion)",
    "fp8 scaled_mm (tensor-wise, row-wise, 1x128 blocks)": "FlyDSL takes only the MX BlockWise1x32 recipe "
    "(mxfp8 / mxfp4)",
}

def xray_spec(op: str) -> dict[str, Any] | None:
    """What the X-ray knows of operator ``op``'s family, or ``None`` when the family registers
    no X-ray (``op.flydsl.xray`` unset, or no FlyDSL path). The spec is the ``XRAY`` dict of the
    module named by ``op.flydsl.xray`` (``"module:function"``, e.g.
    ``flyexplore.ops.rmsnorm.xray:build``), plus ``"builder"`` (that string). Its keys:

    - ``dtypes``: dtype names the builder takes (absent: no X-ray of its own, see ``request``);
    - ``shape``: the shape syntax, in words, for :func:`coverage_text`;
    - ``parse(shape) -> (label, params)``: default the catalogue's ``get_op(op).case``;
    - ``explain(label, params, dtype) -> (op, shape, dtype)``: the explainer's question for a
      request (default the request itself);
    - ``request(shape, dtype) -> (op, shape, dtype) | reason``: an explainer case as an X-ray
      request (default the case itself), or why there is none;
    - ``device_libs``: why the kernel links ROCm's device libraries, when it does.

    The builder runs in the worker process: ``build(params, dtype, torch_dtype, arch, autotune)``
    returns a ``flyexplore.ops.xray_kit.XRayVerdict``. Raises :class:`UsageError` for an unknown
    operator."""
    import importlib


    path = get_op(op).flydsl
    if path is None or not path.xray:
        return None
    spec = dict(getattr(importlib.import_module(path.xray.partition(":")[0]), "XRAY", {}))
    spec["builder"] = path.xray
    return spec


def xray_dtypes() -> dict[str, tuple[str, ...]]:
    """Operator -> the dtypes the X-ray compiles for it (those torch cannot run on FlyDSL get
    torch's reason): every registered family whose X-ray spec lists ``dtypes``."""

    return {op: tuple(spec["dtypes"]) for op in list_ops() if (spec := xray_spec(op)) and "dtypes" in spec}


def __getattr__(name: str):
    if name == "XRAY_DTYPES":  # read from the registry at each access (families may be registered later)
        return xray_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def coverage_text() -> str:
    """What the X-ray covers and what it does not, in words (``flyexplore xray --coverage``)."""
    lines = ["Covered (the kernel torch 2.15 builds, compiled for gfx950):"]
    for op, dts in xray_dtypes().items():
        lines.append(f"  {op:13s} shape {xray_spec(op).get('shape', '?'):28s} dtypes {', '.join(dts)}")
    lines.append("Not covered:")
    for op, why in NOT_COVERED.items():
        lines.append(f"  {op}: {why}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class _Request:
    op: str
    label: str
    params: dict[str, Any]
    dtype: str
    spec: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _request(op: str, shape: str, dtype: str) -> _Request:
    covered = xray_dtypes()
    if op not in covered:
        raise bad_choice("operator for xray", op, covered)
    if dtype not in covered[op]:
        raise bad_choice(f"dtype for {op} xray", dtype, covered[op])
    spec = xray_spec(op)
    if "parse" in spec:
        label, params = spec["parse"](shape)
    else:

        case = get_op(op).case(shape)
        label, params = case.label, dict(case.p)
    return _Request(op, label, params, dtype, spec)


def xray_shapes(op: str, text: str) -> list[str]:
    """``"8192x4096; 4096x16384"`` -> the X-ray's shape labels for ``op`` (``;`` or new lines
    between shapes), each parsed as :func:`xray` would. Raises :class:`UsageError` for an
    operator the X-ray does not cover, no shape or a malformed one."""
    shapes = [t.strip() for t in re.split(r"[;\n]", str(text)) if t.strip()]
    if not shapes:
        raise UsageError(f"no {op} shapes given")
    dtype = xray_dtypes().get(op, ("?",))[0]
    return [_request(op, t, dtype).label for t in shapes]


def _check_arch(arch: str) -> str:
    """``arch`` if it is a gfx name (:func:`flyexplore.world.readiness.check_arch`), else
    :class:`UsageError`."""

    if not isinstance(arch, str):
        raise UsageError(f"bad arch {arch!r} (expected a gfx name, e.g. gfx950)")
    check_arch(arch)
    return arch


def _check_out(out: str | os.PathLike | None) -> None:
    """Raise :class:`UsageError` unless ``out`` (the X-ray's folder) is ``None`` or a folder that
    exists or can be made: not a file, not under a file, its nearest existing folder writable.
    Checked before anything is compiled (a compile takes 0.2-60 s a kernel)."""
    if out is None:
        return
    p = os.path.abspath(os.fspath(out))
    if os.path.exists(p) and not os.path.isdir(p):
        raise UsageError(f"X-ray folder {str(out)!r} is a file, not a folder")
    d = p
    while not os.path.exists(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    if not os.path.isdir(d):
        raise UsageError(f"X-ray folder {str(out)!r} cannot be made: {d!r} is a file, not a folder")
    if not os.access(d, os.W_OK | os.X_OK):
        raise UsageError(f"X-ray folder {str(out)!r} cannot be written: {d!r} is not writable")


# ------------------------------------------------------------------------------ explainer
def _explainer_verdict(req: _Request, arch: str, autotune: bool = False) -> tuple[bool, str, str] | None:
    """The verdict of :func:`flyexplore.insight.explain.explain_text` for ``req`` on ``arch`` (judged as on a
    ROCm torch 2.15 with flydsl 0.3.x there, with this process's switches): ``(taken, reason,
    "flyexplore.insight.explain.explain_text")``. The question is the family's ``explain`` mapping of the
    request (an MXFP GEMM is asked as a ``scaled_gemm``), with the X-ray's ``autotune`` setting
    for families that take the explainer option ``autotuning``. ``None`` when the explainer
    cannot judge the request (its input checks refuse it): torch's own predicate decides then."""

    op, shape, dtype = req.spec.get("explain", lambda lb, p, d: (req.op, lb, d))(req.label, req.params, req.dtype)
    try:
        path = get_op(op).flydsl
        opts = {"autotuning": int(bool(autotune))} if path is not None and "autotuning" in path.options else {}
        ex = explain_text(op, shape, dtype, opts, arch=arch)
    except UsageError:
        return None
    return ex.taken, ex.reason, "flyexplore.insight.explain.explain_text"


# ------------------------------------------------------------------------------ running
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_xray_worker.py")


def _rocm_path_for(lld_path: str, scratch: str, device_libs: str | None = None) -> str:
    """A folder (under ``scratch``) whose ``llvm/bin/ld.lld`` links to ``lld_path`` and, when
    given, whose ``amdgcn/bitcode`` links to ``device_libs``: flydsl looks only under
    ``$ROCM_PATH`` for both."""
    root = os.path.join(scratch, "rocm")
    os.makedirs(os.path.join(root, "llvm", "bin"), exist_ok=True)
    os.symlink(os.path.abspath(lld_path), os.path.join(root, "llvm", "bin", "ld.lld"))
    if device_libs is not None:
        os.makedirs(os.path.join(root, "amdgcn"), exist_ok=True)
        os.symlink(os.path.abspath(device_libs), os.path.join(root, "amdgcn", "bitcode"))
    return root


def find_rocm_device_libs(environ: dict[str, str] | None = None) -> str | None:
    """A folder of ROCm device-library bitcode (``ockl.bc`` ...), or ``None``.

    Only the grouped GEMM kernel needs it (its persistent loop reads the grid size through
    ockl). Looks at ``$FLYEXPLORE_ROCM_DEVICE_LIBS``, ``$ROCM_PATH/amdgcn/bitcode``,
    ``/opt/rocm/amdgcn/bitcode`` and Debian's ``rocm-device-libs`` package
    (``/usr/lib/<triplet>/amdgcn/bitcode``).
    """
    import glob

    environ = dict(os.environ) if environ is None else environ
    cands = [environ.get("FLYEXPLORE_ROCM_DEVICE_LIBS", "")]
    if environ.get("ROCM_PATH"):
        cands.append(os.path.join(environ["ROCM_PATH"], "amdgcn", "bitcode"))
    cands += ["/opt/rocm/amdgcn/bitcode", *sorted(glob.glob("/usr/lib/*/amdgcn/bitcode")),
              "/usr/lib/amdgcn/bitcode"]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "ockl.bc")):
            return c
    return None


def _worker_env(arch: str, scratch: str, rocm: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLYDSL_", "HSA_OVERRIDE_GFX_VERSION", "TORCH_LOGS"))}
    env.update({
        "COMPILE_ONLY": "1", "FLYDSL_COMPILE_ONLY": "1", "FLYDSL_GPU_ARCH": arch,
        "FLYDSL_DUMP_IR": "1", "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        "FLYDSL_RUNTIME_CACHE_DIR": os.path.join(scratch, "flydsl-cache"),
        "FLYDSL_DUMP_DIR": os.path.join(scratch, "dump"), "ROCM_PATH": rocm,
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(scratch, "inductor-cache"),
        "CUDA_VISIBLE_DEVICES": "",  # never touch a local GPU: everything is metadata
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def _ensure_ready() -> None:

    r = xray_readiness()
    if not r.ready:
        msg = "; ".join(f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in r.failed)
        raise XRayUnavailable(f"the kernel X-ray cannot run here: {msg}")


def unavailable_reason() -> str | None:
    """Why the X-ray cannot run on this machine (every failed check of
    :func:`flyexplore.world.env.xray_readiness`, with its fix; as cached by
    :func:`flyexplore.world.env.collect`), or ``None`` when it can."""

    r = getattr(ENV.collect(), "flydsl_xray", None) or xray_readiness()
    if r.ready:
        return None
    return "; ".join(f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in r.failed)


def xray_request(op: str, shape: str, dtype: str | None = None,
                 options=None) -> tuple[tuple[str, str, str] | None, str]:
    """Can the X-ray show the kernel of this case (operator, shape and dtype as
    :func:`flyexplore.insight.explain.explain_text` takes them), and which request would it compile?

    Returns ``((op, shape, dtype), note)`` for :func:`xray` -- the family's ``request`` mapping
    (:func:`xray_spec`): MXFP8/MXFP4 ``scaled_gemm`` becomes ``gemm`` with dtype
    ``mxfp8``/``mxfp4`` (NT), ``grouped_gemm`` loses a leading ``g`` -- with ``note`` saying what
    the X-ray leaves out (explainer ``options`` such as strides and offsets: it compiles the
    contiguous case), or ``(None, reason)`` when it cannot:
    this machine cannot compile (:func:`unavailable_reason`), the case is not covered
    (:data:`NOT_COVERED`, :func:`xray_dtypes`), or the call does not qualify for FlyDSL on
    gfx950 (``flyexplore.insight.explain``; there is no kernel to compile). Raises
    :class:`~flyexplore.errors.UsageError` for input the explainer rejects."""

    dt = dtype or dtypes_for(op)[0]
    ex = explain_text(op, shape, dt, options, arch="gfx950")
    if not ex.call_ok:
        bad = [c.detail for c in ex.failed if c.kind in ("call", "config")]
        return None, "not eligible on gfx950, so there is no FlyDSL kernel to compile: " + "; ".join(bad)
    spec = xray_spec(op) or {}
    req = spec["request"](str(shape).strip(), dt) if "request" in spec else (op, str(shape).strip(), dt)
    if isinstance(req, str):
        return None, req
    covered = xray_dtypes()
    if req[0] not in covered or req[2] not in covered[req[0]]:
        listed = "; ".join(f"{o} {'/'.join(d)}" for o, d in covered.items())
        return None, f"{op} {dt} is not covered by the X-ray (covered: {listed}; see coverage_text())"
    why = unavailable_reason()
    if why:
        return None, f"the kernel X-ray cannot run here: {why}"
    opts = parse_options(options)
    note = (f"options {', '.join(f'{k}={v}' for k, v in opts.items())} are not part of the X-ray: it compiles "
            "the contiguous case" if opts else "")
    return req, note


def xray_batch(requests: Iterable[tuple[str, str, str]], arch: str = "gfx950", out: str | None = None,
               autotune: bool = False, keep_ir: bool = False, use_explainer: bool = True,
               timeout_s: float = 1800.0, cache: bool = True) -> list[XRay]:
    """X-ray several cases in one subprocess (torch is imported once; identical kernel
    specialisations are compiled once). ``requests`` are ``(op, shape, dtype)`` triples.

    ``out``: folder to save into (one sub-folder per case: each kernel's ``.s`` and an
    ``xray.json``; with ``keep_ir`` also every IR stage flydsl dumped). ``autotune``: GEMMs show
    every FlyDSL autotuning candidate torch would benchmark (``flydsl_enable_autotuning``)
    instead of the single baseline config. ``use_explainer``: the verdict is the explainer's
    (:func:`flyexplore.insight.explain.explain_text` for ``arch``; a refused case is not compiled, and
    torch's own predicate, still asked for an accepted one, is noted where it disagrees); without
    it, or where the explainer cannot judge the request, torch's predicate decides. ``cache``:
    read a case compiled before with the same torch, flydsl, linker and builder from the disk
    cache, and keep what is compiled here (:mod:`flyexplore.insight.xray_cache`; never with
    ``keep_ir``; ``FLYEXPLORE_CACHE=off`` turns it off everywhere); the worker starts only for the
    cases not found there. Raises
    :class:`~flyexplore.errors.UsageError` for bad input (``out`` a file included, before
    anything is compiled), :class:`XRayUnavailable` when this machine lacks torch >= 2.15, flydsl 0.3 or
    an AMDGPU-capable ld.lld, ``RuntimeError`` when the worker fails as a whole (a failed build of
    one case is that case's ``error``). Compile times: about 0.2 s per RMSNorm kernel, 0.5-1.5 s
    per GEMM, 2-4 s TopK register, 20-60 s TopK radix, plus about 3 s to start (2-core x86).
    """
    arch = _check_arch(arch)
    _check_out(out)
    reqs = [_request(op, shape, dtype) for op, shape, dtype in requests]
    if not reqs:
        raise UsageError("no cases to X-ray")
    verdicts = [(_explainer_verdict(r, arch, autotune) if use_explainer else None) for r in reqs]
    need_worker = any(v is None or v[0] for v in verdicts)
    worker_out: dict[str, Any] = {"results": [None] * len(reqs), "versions": {}}
    found: dict[int, tuple[dict, dict]] = {}   # job index -> (record, versions) read from the cache
    scratch = tempfile.mkdtemp(prefix="flyexplore-xray-")
    try:
        if need_worker:
            _ensure_ready()

            lld = find_amdgpu_lld()
            libs = find_rocm_device_libs()
            jobs = [{"op": r.op, "builder": r.spec["builder"], "params": r.params, "dtype": r.dtype,
                     "torch_dtype": DTYPE_NAMES[r.dtype], "autotune": bool(autotune),
                     "needs_device_libs": r.spec.get("device_libs"), "device_libs": libs is not None,
                     "verdict": None if v is None else {"eligible": v[0], "reason": v[1]}}
                    for r, v in zip(reqs, verdicts)]
            keys, found = _from_cache(jobs, verdicts, arch, lld.path, libs, scratch, cache and not keep_ir)
            for i, (res, _versions) in found.items():
                worker_out["results"][i] = res
            # the worker starts for the cases to compile that the cache lacks (and then, as always,
            # judges the others with torch's predicate too); none lacking: the verdicts as they are
            missing = [i for i, v in enumerate(verdicts) if (v is None or v[0]) and i not in found]
            todo = [i for i in range(len(jobs)) if i not in found] if missing else []
            need_worker = bool(todo)
        if need_worker:
            jobs_path = os.path.join(scratch, "jobs.json")
            res_path = os.path.join(scratch, "results.json")
            with open(jobs_path, "w") as f:  # the worker imports the builders from this process's sys.path
                json.dump({"arch": arch, "dump_root": os.path.join(scratch, "dump"), "jobs": [jobs[i] for i in todo],
                           "sys_path": [os.path.abspath(p) for p in sys.path]}, f)
            env = _worker_env(arch, scratch, _rocm_path_for(lld.path, scratch, libs))
            log_path = os.path.join(scratch, "worker.log")
            timed_out = False
            with open(log_path, "w") as log:
                try:
                    proc = subprocess.run([sys.executable, _WORKER, jobs_path, res_path], env=env, cwd=scratch,
                                          stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
                    rc = proc.returncode
                except subprocess.TimeoutExpired:
                    timed_out, rc = True, None
            if os.path.exists(res_path):
                with open(res_path) as f:
                    got = json.load(f)
                worker_out["versions"] = got.get("versions", {})
                for i, r in zip(todo, got.get("results", [])):
                    worker_out["results"][i] = r
                    if keys[i] is not None:
                        XC.store(keys[i], r, worker_out["versions"])
            with open(log_path) as f:
                tail = f.read()[-3000:]
            if rc not in (0, None) and not os.path.exists(res_path):
                raise RuntimeError(f"X-ray worker failed (exit {rc}):\n{tail}")
            why = (f"timed out after {timeout_s:g} s" if timed_out else
                   f"the X-ray worker stopped (exit {rc}) before this case; its log ends: {tail[-800:]}")
            for i, r in enumerate(worker_out["results"]):
                if r is None:
                    worker_out["results"][i] = {"eligible": False, "reason": None, "kernels": [], "notes": [],
                                                "error": why}
        return [_assemble(r, v, worker_out["results"][i], found[i][1] if i in found else worker_out["versions"],
                          arch, out, keep_ir, i)
                for i, (r, v) in enumerate(zip(reqs, verdicts))]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _from_cache(jobs, verdicts, arch: str, lld_path: str, libs: str | None, scratch: str,
                use: bool) -> tuple[list[str | None], dict[int, tuple[dict, dict]]]:
    """The cache key of each job the worker would compile (``None`` for the others, and for all
    when not ``use``) and the jobs found in the cache: ``{index: (record, versions)}``
    (:mod:`flyexplore.insight.xray_cache`)."""
    if not use:
        return [None] * len(jobs), {}
    tools = XC.toolchain(lld_path, libs)
    keys = [XC.entry_key(arch, job, tools) if v is None or v[0] else None for job, v in zip(jobs, verdicts)]
    found = {}
    for i, key in enumerate(keys):
        hit = None if key is None else XC.load(key, scratch)
        if hit is not None:
            found[i] = hit
    return keys, found


def _assemble(req: _Request, verdict, res, versions, arch, out, keep_ir, index) -> XRay:
    if res is None:  # decided by the explainer alone (not eligible): no compile needed
        return XRay(req.op, req.label, req.params, req.dtype, arch, verdict[0], verdict[1], verdict[2])
    vsrc = verdict[2] if verdict is not None else f"torch predicate {res.get('predicate', '?')}"
    case_dir = None
    if out is not None:
        case_dir = os.path.join(out, _safe(f"{req.op}_{req.label}_{req.dtype}_{arch}"))
        os.makedirs(case_dir, exist_ok=True)
    kernels, errors = [], [res["error"]] if res.get("error") else []
    if arch not in ARCH_LIMITS and res.get("kernels"):
        errors.append(f"no occupancy limits known for {arch} (known: {', '.join(ARCH_LIMITS)})")
        res = dict(res, kernels=[])
    for rec in res.get("kernels", []):
        if rec.get("error"):
            errors.append(f"{rec['family']}: {rec['error']}")
        for isa in rec.get("isa", []):
            with open(isa) as f:
                text = f.read()
            for kr in parse_isa(text):
                saved = None
                if case_dir is not None:
                    saved = os.path.join(case_dir, _safe(kr.name) + ".s")
                    A.write_text(saved, text)
                    if keep_ir:
                        shutil.copytree(os.path.dirname(isa), os.path.join(case_dir, _safe(kr.name) + "_ir"),
                                        dirs_exist_ok=True, copy_function=_copy_file)
                kernels.append(XRayKernel(kr.name, rec["family"], dict(rec.get("config", {})), kr,
                                          occupancy(kr, ARCH_LIMITS[arch]),
                                          count_instructions(text, kr.name), saved, rec.get("compile_s"),
                                          bool(rec.get("reused", False)), text, bool(rec.get("cached", False))))
    x = XRay(req.op, req.label, req.params, req.dtype, arch, bool(res.get("eligible")),
             res.get("reason") or "(no verdict)", vsrc, tuple(kernels), tuple(res.get("notes", [])),
             "; ".join(errors) or None, dict(versions), case_dir)
    if case_dir is not None:
        A.write_text(os.path.join(case_dir, "xray.json"), json.dumps(x.to_dict(), indent=2, default=str))
    return x


def _copy_file(src: str, dst: str) -> str:
    """``shutil.copytree``'s copy of one file, whole or not at all (:mod:`flyexplore.atomic`)."""
    A.write_file(dst, lambda t: shutil.copyfile(src, t))
    return dst


def xray(op: str, shape: str, dtype: str = "bf16", arch: str = "gfx950", out: str | None = None,
         autotune: bool = False, keep_ir: bool = False, use_explainer: bool = True,
         timeout_s: float = 1800.0, cache: bool = True) -> XRay:
    """X-ray one case: ``xray("rmsnorm", "8192x4096", "bf16")``. Shapes as elsewhere in
    flyexplore (rmsnorm ``MxN``, topk ``MxNxK[:deterministic=1]``, gemm ``MxNxK[:NT]``) plus
    grouped_gemm ``GxMxNxK``. Arguments and errors as in :func:`xray_batch`."""
    return xray_batch([(op, shape, dtype)], arch=arch, out=out, autotune=autotune, keep_ir=keep_ir,
                      use_explainer=use_explainer, timeout_s=timeout_s, cache=cache)[0]


def xray_frame(xrays: Sequence[XRay]):
    """A tidy DataFrame, one row per kernel (one row with the reason for a case without kernels).

    Columns: op, case, dtype, arch, the case parameters (m, n, k, ...), eligible, reason,
    verdict_source, error, source (``"compiled"``), torch, flydsl, family, kernel, config (JSON),
    vgprs, agprs, vgprs_total, vgpr_alloc, vgprs_descriptor, sgprs, vgpr_spills, sgpr_spills, scratch_bytes,
    lds_bytes, workgroup_size, wavefront_size, waves_per_workgroup, waves_per_simd, occupancy
    (0..1), workgroups_per_cu, limited_by, isa_file, compile_s (s), reused, cached (read from the
    X-ray cache), inst_<class>, inst_total.
    """
    import pandas as pd

    return pd.DataFrame([row for x in xrays for row in x.rows()])


def xray_sweep(op: str, shapes: Sequence[str], dtypes: Sequence[str] = ("bf16",), **kw):
    """X-ray every shape x dtype in one subprocess; returns :func:`xray_frame` of the results.
    Keyword arguments as in :func:`xray_batch`."""
    return xray_frame(xray_batch([(op, s, d) for s in shapes for d in dtypes], **kw))
