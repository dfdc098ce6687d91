"""Kernel X-ray: the FlyDSL kernel torch 2.15 would run on MI350 (gfx950), compiled and inspected
on any machine -- no GPU, no ROCm.

For one case (operator, shape, dtype) the X-ray asks torch's own dispatch predicates whether the
case takes FlyDSL on gfx950 and, if it does, calls torch's own kernel builders so that flydsl
compiles that very kernel in its compile-only mode (``COMPILE_ONLY=1``, ``FLYDSL_GPU_ARCH=gfx950``,
``FLYDSL_DUMP_IR=1``, ``FLYDSL_RUNTIME_ENABLE_CACHE=0``; ``ROCM_PATH`` points at an
AMDGPU-capable ``ld.lld``). It then reads the kernel's resources from the final AMDGPU ISA
(``.s``): VGPRs, AGPRs, SGPRs, spills, LDS bytes, workgroup and wavefront size; computes the
occupancy those allow on gfx950 (:func:`occupancy`, limits in :data:`GFX950`); counts
instructions by class (:func:`count_instructions`); and saves the ISA text.

>>> from flyexplore.xray import xray
>>> x = xray("rmsnorm", "8192x4096", "bf16", out="xray-out")     # doctest: +SKIP
>>> print(x.to_text())                                            # doctest: +SKIP

Command line: ``flyexplore xray --op rmsnorm --shape 8192x4096 --dtype bf16 [--arch gfx950]
[--out DIR] [--json]``. ``flyexplore xray --coverage`` lists what is and is not covered.

Covered (torch 2.15 + flydsl 0.3), builders called, never copied:

- ``rmsnorm``: ``torch/_native/ops/norm/flydsl_rmsnorm_fwd.py::_compile_rmsnorm_fwd`` (forward).
- ``topk``: ``torch/_native/ops/topk/flydsl_kernels.py::_compile_register_topk`` and
  ``_compile_radix_select_topk`` (picked by torch's ``flydsl_impl._kernel_for``).
- ``gemm`` (bf16/fp16, layouts NN/NT/TN/TT; ``mxfp8``/``mxfp4`` through scaled_mm): the Inductor
  template's own steps -- ``heuristics/template/flydsl.py::get_gemm_configs`` and
  ``is_gemm_config_valid_for_shape``, ``vendored_templates/flydsl/kernels::make_gemm_param_and_validate``,
  then ``flyc.compile(gemm_gfx950 | gemm_mxfp_gfx950, ...)`` as ``kernel/templates/flydsl_mm.py.jinja``
  does in its own compile-only precompile path.
- ``grouped_gemm`` (bf16/fp16, shape ``GxMxNxK``: G groups of M rows): ``get_grouped_gemm_configs``,
  ``is_grouped_gemm_config_valid_for_shape``, ``launch_gemm_gfx950_grouped`` as in
  ``flydsl_grouped_mm.py.jinja``.

Not covered: see :data:`NOT_COVERED`. The Inductor gates that need a real compile graph
(``use_flydsl_gemm_template``: ROCm build, max-autotune, FLYDSL listed) are assumed met; the
shape/layout/dtype rules of ``get_flydsl_mm_template_kwargs`` are re-derived for contiguous
inputs (each rule names its torch function). Eligible is not chosen: for GEMMs Inductor's
autotuner then benchmarks the FlyDSL candidate against ATen/Triton on the GPU.

The compile runs in a subprocess (``flyexplore/_xray_worker.py``): flydsl and torch read their
settings once per process, and a fresh process leaves the user's flydsl cache untouched.
Numbers are compiler output for gfx950 (``source = "compiled"``), never measurements.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .errors import UsageError, bad_choice


class XRayUnavailable(RuntimeError):
    """The X-ray cannot run on this machine (see ``flyexplore env``: FlyDSL kernel X-ray)."""


# ------------------------------------------------------------------------------ arch limits
@dataclass(frozen=True)
class ArchLimits:
    """Per-CU and per-SIMD limits of one AMD GPU architecture, for :func:`occupancy`.

    ``vgprs_per_lane`` is the unified VGPR file (arch VGPRs + AGPRs) per lane of one SIMD,
    allocated in blocks of ``vgpr_granule``; ``sgpr_waves`` maps a wave's SGPR count to the waves
    per SIMD it allows (``(max_sgprs, waves)`` pairs, ascending, last entry for anything above);
    ``lds_bytes_per_cu`` is the LDS one CU shares among its workgroups, allocated per workgroup
    in blocks of ``lds_granule_bytes``; a CU holds at most ``max_barrier_workgroups`` multi-wave
    workgroups (one hardware barrier each). ``sources`` say where each number comes from.
    """

    arch: str
    wave_size: int
    simds_per_cu: int
    max_waves_per_simd: int
    vgprs_per_lane: int
    vgpr_granule: int
    sgpr_waves: tuple[tuple[int, int], ...]
    lds_bytes_per_cu: int
    lds_granule_bytes: int
    max_barrier_workgroups: int
    compute_units: int
    sources: tuple[str, ...]


#: gfx950 (MI350X / MI355X, CDNA4). gfx950 extends LLVM's gfx940 feature set, so it has the
#: GFX90A register model (LLVM PR #116307, ``FeatureISAVersion9_5_Common``).
GFX950 = ArchLimits(
    arch="gfx950",
    wave_size=64,
    simds_per_cu=4,
    max_waves_per_simd=8,
    vgprs_per_lane=512,
    vgpr_granule=8,
    sgpr_waves=((80, 10), (88, 9), (100, 8), (10**9, 7)),
    lds_bytes_per_cu=160 * 1024,
    lds_granule_bytes=320 * 4,
    max_barrier_workgroups=16,
    compute_units=256,
    sources=(
        "LLVM llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp (IsaInfo): getMaxWavesPerEU = 8 for "
        "GFX90A-class targets (gfx90a, gfx94x, gfx950); getEUsPerCU = 4 SIMDs; getTotalNumVGPRs = 512 "
        "(unified VGPR+AGPR) and getVGPRAllocGranule = 8 with FeatureGFX90AInsts; "
        "getNumWavesPerEUWithNumVGPRs = min(max waves, 512 / alignTo(VGPRs, 8)); "
        "getOccupancyWithNumSGPRs (GFX8-9 table: <=80 -> 10, <=88 -> 9, <=100 -> 8, else 7 waves); "
        "getMaxWorkGroupsPerCU = min(max waves per CU / waves per workgroup, 16 barriers)",
        "LLVM AMDGPUUsage.rst, COMPUTE_PGM_RSRC2 GRANULATED_LDS_SIZE: GFX950 allocates LDS in blocks "
        "of 320 dwords (1280 bytes); AMDGPU.td FeatureAddressableLocalMemorySize163840 for gfx950",
        "ROCm 'AMD GPU specifications' (rocm.docs.amd.com/en/7.13.0-preview/reference/gpu-specs.html): "
        "MI350X/MI355X gfx950, 256 CUs, wavefront 64, LDS 160 KiB per CU, VGPR file 512 KiB per CU",
        "unified VGPR count on GFX90A-class targets = alignTo(arch VGPRs, 4) + AGPRs "
        "(.amdhsa_accum_offset, .amdhsa_next_free_vgpr; LLVM test CodeGen/AMDGPU kernel_32_agprs: "
        "9 VGPRs + 32 AGPRs -> 44, occupancy 8)",
    ),
)

#: Architectures whose limits are known here. torch 2.15 dispatches FlyDSL on gfx950 only.
ARCH_LIMITS = {"gfx950": GFX950}


# ------------------------------------------------------------------------------ ISA parsing
@dataclass(frozen=True)
class KernelResources:
    """Resources of one kernel as the compiler recorded them in the AMDGPU ISA (``.s``).

    Register counts are per lane (work-item): ``vgprs`` architectural VGPRs, ``agprs``
    accumulation VGPRs, ``vgprs_total`` the unified count the code uses (metadata ``.vgpr_count``
    = alignTo(VGPRs, 4) + AGPRs on GFX90A-class targets), ``vgprs_descriptor`` what the kernel
    descriptor asks the hardware to allocate (``.amdhsa_next_free_vgpr``; LLVM raises it up to
    the count that keeps the occupancy other limits already impose -- AMDGPUAsmPrinter's
    NumVGPRsForWavesPerEU -- so it never lowers occupancy), ``sgprs`` per wave including
    VCC/flat-scratch/XNACK (metadata ``.sgpr_count``). Spills are registers spilled to scratch; ``scratch_bytes`` is
    private memory per work-item; ``lds_bytes`` LDS per workgroup (``.group_segment_fixed_size``);
    ``workgroup_size`` work-items (``.reqd_workgroup_size`` product, else
    ``.max_flat_workgroup_size``).
    """

    name: str
    vgprs: int
    agprs: int
    vgprs_total: int
    sgprs: int
    vgpr_spills: int
    sgpr_spills: int
    scratch_bytes: int
    lds_bytes: int
    workgroup_size: int
    wavefront_size: int
    vgprs_descriptor: int | None = None
    kernarg_bytes: int | None = None
    target: str | None = None

    @property
    def waves_per_workgroup(self) -> int:
        return -(-self.workgroup_size // self.wavefront_size)


def _split_metadata_kernels(text: str) -> list[dict[str, Any]]:
    """Kernel-level keys of the ``.amdgpu_metadata`` YAML block (one dict per kernel).

    Only what the X-ray needs: scalar ``.key: value`` pairs at the kernel's own indentation and
    lists of scalars under them (``.reqd_workgroup_size``); nested ``.args`` are skipped.
    """
    m = re.search(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", text, re.M | re.S)
    if not m:
        return []
    kernels: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    key_indent = None
    list_key = None
    in_kernels = False
    for raw in m.group(1).splitlines():
        if not raw.strip() or raw.strip() in ("---", "..."):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        if indent == 0:
            in_kernels = line.startswith("amdhsa.kernels:")
            cur = None
            continue
        if not in_kernels:
            continue
        if line.startswith("- ") and (key_indent is None or indent < key_indent):
            cur = {}
            kernels.append(cur)
            key_indent = indent + 2
            line = line[2:].strip()
            indent = key_indent
            list_key = None
        if cur is None:
            continue
        if indent == key_indent:
            kv = re.match(r"(\.[\w.]+):\s*(.*)$", line)
            list_key = None
            if kv:
                k, v = kv.group(1)[1:], kv.group(2).strip()
                if v == "":
                    cur[k] = []
                    list_key = k
                else:
                    cur[k] = _scalar(v)
        elif indent > key_indent and list_key is not None:
            item = re.match(r"-\s+(\S+)$", line)
            if item and isinstance(cur.get(list_key), list):
                cur[list_key].append(_scalar(item.group(1)))
            else:
                list_key = None if not item else list_key
    return kernels


def _scalar(v: str) -> Any:
    v = v.strip().strip("'\"")
    if re.fullmatch(r"-?\d+", v):
        return int(v)
    if re.fullmatch(r"0x[0-9a-fA-F]+", v):
        return int(v, 16)
    if v in ("true", "false"):
        return v == "true"
    return v


def _directives(text: str, name: str) -> dict[str, int]:
    """``.amdhsa_*`` values of ``name``'s kernel descriptor block and its ``.set .L<name>.*``."""
    out: dict[str, int] = {}
    m = re.search(r"^\s*\.amdhsa_kernel\s+" + re.escape(name) + r"\s*$(.*?)^\s*\.end_amdhsa_kernel",
                  text, re.M | re.S)
    if m:
        for k, v in re.findall(r"^\s*\.(amdhsa_\w+)\s+(-?\d+)\s*$", m.group(1), re.M):
            out[k] = int(v)
    for k, v in re.findall(r"^\s*\.set\s+\.?L?" + re.escape(name) + r"\.(\w+),\s*(-?\d+)\s*$", text, re.M):
        out[k] = int(v)
    return out


def parse_isa(text: str) -> list[KernelResources]:
    """Every kernel's :class:`KernelResources` from AMDGPU assembly text (an LLVM ``.s`` file with
    an ``.amdgpu_metadata`` block, code object v4+).

    Values come from the metadata (``.vgpr_count``, ``.agpr_count``, ``.sgpr_count``,
    ``.vgpr_spill_count``, ``.sgpr_spill_count``, ``.group_segment_fixed_size``,
    ``.private_segment_fixed_size``, ``.reqd_workgroup_size`` / ``.max_flat_workgroup_size``,
    ``.wavefront_size``) and, where present, the kernel descriptor (``.amdhsa_next_free_vgpr``)
    and ``.set .L<kernel>.num_vgpr / num_agpr``. Raises ``ValueError``
    when the text holds no kernel metadata.
    """
    target = re.search(r'^\s*\.amdgcn_target\s+"([^"]+)"', text, re.M)
    kernels = _split_metadata_kernels(text)
    if not kernels:
        raise ValueError("no .amdgpu_metadata kernel records in this ISA text")
    out = []
    for md in kernels:
        name = str(md.get("name") or md.get("symbol", "?")).removesuffix(".kd")
        d = _directives(text, name)
        agprs = int(md.get("agpr_count", d.get("num_agpr", 0)))
        vgprs = int(d.get("num_vgpr", md.get("vgpr_count", 0)))
        if "vgpr_count" in md:
            total = int(md["vgpr_count"])
        elif agprs:
            total = -(-vgprs // 4) * 4 + agprs
        else:
            total = vgprs
        reqd = md.get("reqd_workgroup_size")
        if isinstance(reqd, list) and reqd and all(isinstance(x, int) for x in reqd):
            wg = math.prod(reqd)
        else:
            wg = int(md.get("max_flat_workgroup_size", 1024))
        out.append(KernelResources(
            name=name, vgprs=vgprs, agprs=agprs, vgprs_total=int(total),
            sgprs=int(md.get("sgpr_count", d.get("amdhsa_next_free_sgpr", 0))),
            vgpr_spills=int(md.get("vgpr_spill_count", 0)), sgpr_spills=int(md.get("sgpr_spill_count", 0)),
            scratch_bytes=int(md.get("private_segment_fixed_size", d.get("amdhsa_private_segment_fixed_size", 0))),
            lds_bytes=int(md.get("group_segment_fixed_size", d.get("amdhsa_group_segment_fixed_size", 0))),
            workgroup_size=wg, wavefront_size=int(md.get("wavefront_size", 64)),
            vgprs_descriptor=d.get("amdhsa_next_free_vgpr"), kernarg_bytes=md.get("kernarg_segment_size"), target=target.group(1) if target else None))
    return out


#: Instruction classes counted by :func:`count_instructions`, in the order they are tested
#: (first match wins), with the mnemonic prefixes that select them.
INSTRUCTION_CLASSES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("mfma", "matrix core (MFMA / SMFMAC)", ("v_mfma", "v_smfmac")),
    ("valu", "vector ALU (other v_*)", ("v_",)),
    ("vmem", "global / buffer / flat memory", ("global_", "buffer_", "flat_", "tbuffer_")),
    ("scratch", "scratch (private) memory, e.g. spills", ("scratch_",)),
    ("lds", "LDS (ds_*)", ("ds_",)),
    ("smem", "scalar memory", ("s_load", "s_buffer_load", "s_store", "s_buffer_store", "s_dcache",
                               "s_scratch_", "s_memtime", "s_memrealtime", "s_atc_probe")),
    ("branch", "branches and calls", ("s_branch", "s_cbranch", "s_setpc", "s_swappc", "s_call")),
    ("other", "waits, barriers, nops, end (s_waitcnt, s_barrier, s_nop, s_endpgm, ...)",
     ("s_waitcnt", "s_barrier", "s_nop", "s_endpgm", "s_sleep", "s_setprio", "s_sendmsg", "s_trap",
      "s_sethalt", "s_icache", "s_ttrace", "s_wait_", "s_sched_")),
    ("salu", "scalar ALU (other s_*)", ("s_",)),
)


def _classify(mnemonic: str) -> str:
    for cls, _, prefixes in INSTRUCTION_CLASSES:
        if mnemonic.startswith(prefixes):
            return cls
    return "other"


def _kernel_body(text: str, name: str | None) -> list[str]:
    if name is None:
        m = re.search(r"^\s*\.type\s+([\w.$]+),\s*@function", text, re.M)
        if not m:
            return text.splitlines()
        name = m.group(1)
    start = re.search(r"^" + re.escape(name) + r":\s*(;.*)?$", text, re.M)
    if not start:
        raise ValueError(f"kernel {name!r} has no label in this ISA text")
    rest = text[start.end():]
    end = re.search(r"^\.Lfunc_end\d+:|^\s*\.size\s+" + re.escape(name) + r"\b|^\s*\.section\s", rest, re.M)
    return rest[: end.start() if end else len(rest)].splitlines()


def count_instructions(text: str, kernel: str | None = None) -> dict[str, int]:
    """Instructions of one kernel in AMDGPU assembly ``text``, counted by class
    (:data:`INSTRUCTION_CLASSES`; keys ``mfma, valu, vmem, scratch, lds, smem, branch, other,
    salu`` and ``total``). Static counts (each instruction once, loops not unrolled); labels,
    directives and comments are skipped. ``kernel`` defaults to the first function in the text.
    """
    counts = {cls: 0 for cls, _, _ in INSTRUCTION_CLASSES}
    for line in _kernel_body(text, kernel):
        s = line.split(";", 1)[0].split("//", 1)[0].strip()
        if not s or s.startswith(".") or s.endswith(":"):
            continue
        counts[_classify(s.split()[0])] += 1
    counts["total"] = sum(counts.values())
    return counts


# ------------------------------------------------------------------------------ occupancy
@dataclass(frozen=True)
class Occupancy:
    """What a kernel's resources allow on one CU when it runs alone.

    ``waves_per_simd`` is the average number of resident waves per SIMD (of
    ``max_waves_per_simd``), ``workgroups_per_cu`` the resident workgroups per CU;
    ``limits`` gives the workgroups per CU each resource allows on its own (``None`` = no limit:
    ``waves`` hardware wave slots, ``vgprs``, ``sgprs``, ``lds``, ``barriers``);
    ``limited_by`` names the binding ones. ``vgpr_alloc`` is the VGPR count after rounding to the
    allocation granule; ``lds_alloc`` likewise for LDS bytes.
    """

    arch: str
    waves_per_simd: float
    max_waves_per_simd: int
    workgroups_per_cu: int
    waves_per_workgroup: int
    vgpr_waves_per_simd: int
    sgpr_waves_per_simd: int
    vgpr_alloc: int
    lds_alloc: int
    limits: dict[str, int | None]
    limited_by: tuple[str, ...]

    @property
    def fraction(self) -> float:
        """``waves_per_simd / max_waves_per_simd`` (0..1)."""
        return self.waves_per_simd / self.max_waves_per_simd


def occupancy(res: KernelResources, limits: ArchLimits = GFX950) -> Occupancy:
    """Occupancy on ``limits.arch`` allowed by ``res`` (LLVM's rules; see :data:`GFX950`).

    Per SIMD: VGPR-limited waves = min(max waves, VGPRs per lane / alignTo(unified VGPRs,
    granule)); SGPR-limited waves from the SGPR table. Per CU (``S`` SIMDs, ``W`` waves per
    workgroup): workgroups = min(floor(S * waves / W) for the hardware, VGPR and SGPR limits,
    floor(LDS per CU / alignTo(LDS bytes, granule)), 16 barriers when W > 1). Resident waves per
    SIMD = workgroups * W / S. A kernel needing more than a CU offers gets 0 workgroups.
    """
    L = limits
    w = res.waves_per_workgroup
    if res.wavefront_size != L.wave_size:
        raise ValueError(f"{res.name}: wavefront {res.wavefront_size}, {L.arch} runs wave{L.wave_size}")
    vt = max(res.vgprs_total, 1)
    valloc = -(-vt // L.vgpr_granule) * L.vgpr_granule
    vw = 0 if valloc > L.vgprs_per_lane else min(L.max_waves_per_simd, L.vgprs_per_lane // valloc)
    sw = next(waves for top, waves in L.sgpr_waves if res.sgprs <= top)
    sw = min(sw, L.max_waves_per_simd)
    lalloc = -(-res.lds_bytes // L.lds_granule_bytes) * L.lds_granule_bytes
    per_cu = {
        "waves": L.simds_per_cu * L.max_waves_per_simd // w,
        "vgprs": L.simds_per_cu * vw // w,
        "sgprs": L.simds_per_cu * sw // w,
        "lds": (L.lds_bytes_per_cu // lalloc) if lalloc else None,
        "barriers": L.max_barrier_workgroups if w > 1 else None,
    }
    wg = min(v for v in per_cu.values() if v is not None)
    binding = tuple(k for k, v in per_cu.items() if v is not None and v == wg)
    if "waves" in binding:  # at the hardware maximum: other resources that also allow it do not limit
        binding = ("waves",)
    return Occupancy(L.arch, wg * w / L.simds_per_cu, L.max_waves_per_simd, wg, w, vw, sw, valloc, lalloc,
                     per_cu, binding)


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class XRayKernel:
    """One compiled kernel: which family and config torch picked, its resources, occupancy,
    instruction counts by class, the ISA file it was saved to (``isa_file``; ``None`` without an
    output folder) and flydsl's compile time in seconds (``compile_s``; ``reused`` when an earlier
    case in the same batch already compiled the same specialisation)."""

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


@dataclass(frozen=True)
class XRay:
    """The X-ray of one case. ``eligible`` says whether torch 2.15 would run FlyDSL for it on
    ``arch``, ``reason`` why (in words, naming torch's rule), ``verdict_source`` who said so
    (torch's predicate, or ``flyexplore.explain``). ``kernels`` is empty when not eligible or
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
            lines.append(f"  ISA: {where} ({took})")
        if self.error:
            lines.append(f"error: {self.error}")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.kernels and self.arch in ARCH_LIMITS:
            lines.append(f"limits: {self.arch}: {GFX950.max_waves_per_simd} waves/SIMD, {GFX950.simds_per_cu} "
                         f"SIMDs/CU, {GFX950.vgprs_per_lane} unified VGPRs/lane (granule {GFX950.vgpr_granule}), "
                         f"LDS {GFX950.lds_bytes_per_cu // 1024} KiB/CU (granule {GFX950.lds_granule_bytes} B), "
                         f"{GFX950.max_barrier_workgroups} barriers/CU -- sources in flyexplore.xray.GFX950.sources")
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
                       isa_file=k.isa_file, compile_s=k.compile_s, reused=k.reused)
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

#: dtypes the X-ray accepts per operator (those torch cannot run on FlyDSL get the reason).
XRAY_DTYPES = {
    "rmsnorm": ("bf16", "fp16", "fp32"),
    "topk": ("fp32", "bf16", "fp16"),
    "gemm": ("bf16", "fp16", "fp32", "mxfp8", "mxfp4"),
    "grouped_gemm": ("bf16", "fp16", "fp32"),
}
_TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                 "mxfp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn_x2"}


def coverage_text() -> str:
    """What the X-ray covers and what it does not, in words (``flyexplore xray --coverage``)."""
    lines = ["Covered (the kernel torch 2.15 builds, compiled for gfx950):"]
    shapes = {"rmsnorm": "MxN", "topk": "MxNxK[:deterministic=1]", "gemm": "MxNxK[:NN|NT|TN|TT]",
              "grouped_gemm": "GxMxNxK (G groups of M rows)"}
    for op, dts in XRAY_DTYPES.items():
        lines.append(f"  {op:13s} shape {shapes[op]:28s} dtypes {', '.join(dts)}")
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


def _parse_grouped(text: str) -> tuple[str, dict[str, Any]]:
    t = text.strip().lower()
    m = re.fullmatch(r"g?(\d+)x(\d+)x(\d+)x(\d+)", t)
    if not m:
        raise UsageError(f"malformed grouped_gemm shape {text!r} (expected GxMxNxK, e.g. 8x512x4096x4096)")
    g, mm, n, k = (int(x) for x in m.groups())
    if min(g, mm, n, k) <= 0:
        raise UsageError(f"non-positive dimension in grouped_gemm shape {text!r}")
    return f"{g}x{mm}x{n}x{k}", {"g": g, "m": mm, "n": n, "k": k}


def _request(op: str, shape: str, dtype: str) -> _Request:
    if op not in XRAY_DTYPES:
        raise bad_choice("operator for xray", op, XRAY_DTYPES)
    if dtype not in XRAY_DTYPES[op]:
        raise bad_choice(f"dtype for {op} xray", dtype, XRAY_DTYPES[op])
    if op == "grouped_gemm":
        label, params = _parse_grouped(shape)
    else:
        from .ops import get_op

        case = get_op(op).case(shape)
        label, params = case.label, dict(case.p)
    return _Request(op, label, params, dtype)


def _check_arch(arch: str) -> str:
    if not isinstance(arch, str) or not re.fullmatch(r"gfx\d{2,3}[0-9a-f]?", arch):
        raise UsageError(f"bad arch {arch!r} (expected a gfx name, e.g. gfx950)")
    return arch


# ------------------------------------------------------------------------------ explainer hook
def _explainer_verdict(req: _Request, arch: str) -> tuple[bool, str, str] | None:
    """The verdict of ``flyexplore.explain`` for ``req`` on ``arch``, if that module exists and
    can be asked about a target arch; else ``None`` (torch's own predicate is used).

    Looks for a callable ``flydsl_verdict``, ``verdict`` or ``explain`` taking the operator name,
    the shape text and the dtype, plus ``arch=`` or ``target_arch=``; reads a bool from the
    result's ``eligible`` / ``taken`` / ``flydsl`` / ``ok`` and the words from ``reason`` / ``why``
    / ``summary`` / ``text`` (attributes or mapping keys). Anything else: ``None``.
    """
    try:
        from . import explain as ex  # noqa: F401  (another module of this package, optional)
    except ImportError:
        return None
    for fname in ("flydsl_verdict", "verdict", "explain"):
        fn = getattr(ex, fname, None)
        if callable(fn):
            break
    else:
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    arch_kw = next((k for k in ("arch", "target_arch") if k in params), None)
    if arch_kw is None:
        return None
    try:
        res = fn(req.op, req.label, req.dtype, **{arch_kw: arch})
    except Exception:
        return None

    def get(obj, names):
        for nm in names:
            if isinstance(obj, dict) and nm in obj:
                return obj[nm]
            if hasattr(obj, nm):
                return getattr(obj, nm)
        return None

    ok = get(res, ("eligible", "taken", "flydsl", "ok"))
    why = get(res, ("reason", "why", "summary", "text"))
    if not isinstance(ok, bool) or not isinstance(why, str):
        return None
    return ok, why, f"flyexplore.explain.{fname}"


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
    from .env import xray_readiness

    r = xray_readiness()
    if not r.ready:
        msg = "; ".join(f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in r.failed)
        raise XRayUnavailable(f"the kernel X-ray cannot run here: {msg}")


def unavailable_reason() -> str | None:
    """Why the X-ray cannot run on this machine (every failed check of
    :func:`flyexplore.env.xray_readiness`, with its fix; as cached by
    :func:`flyexplore.env.collect`), or ``None`` when it can."""
    from .env import collect, xray_readiness

    r = getattr(collect(), "flydsl_xray", None) or xray_readiness()
    if r.ready:
        return None
    return "; ".join(f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in r.failed)


def xray_request(op: str, shape: str, dtype: str | None = None,
                 options=None) -> tuple[tuple[str, str, str] | None, str]:
    """Can the X-ray show the kernel of this case (operator, shape and dtype as
    :func:`flyexplore.explain.explain_text` takes them), and which request would it compile?

    Returns ``((op, shape, dtype), note)`` for :func:`xray` -- MXFP8/MXFP4 ``scaled_gemm``
    becomes ``gemm`` with dtype ``mxfp8``/``mxfp4`` (NT), ``grouped_gemm`` loses a leading
    ``g`` -- with ``note`` saying what the X-ray leaves out (explainer ``options`` such as
    strides and offsets: it compiles the contiguous case), or ``(None, reason)`` when it cannot:
    this machine cannot compile (:func:`unavailable_reason`), the case is not covered
    (:data:`NOT_COVERED`, :data:`XRAY_DTYPES`), or the call does not qualify for FlyDSL on
    gfx950 (``flyexplore.explain``; there is no kernel to compile). Raises
    :class:`~flyexplore.errors.UsageError` for input the explainer rejects."""
    from .explain import dtypes_for, explain_text, parse_options

    dt = dtype or dtypes_for(op)[0]
    ex = explain_text(op, shape, dt, options, arch="gfx950")
    if not ex.call_ok:
        bad = [c.detail for c in ex.failed if c.kind in ("call", "config")]
        return None, "not eligible on gfx950, so there is no FlyDSL kernel to compile: " + "; ".join(bad)
    text = str(shape).strip()
    if op == "scaled_gemm":
        if dt not in ("mxfp8", "mxfp4"):
            return None, f"{dt} scaled GEMM is not covered: {NOT_COVERED['fp8 scaled_mm (tensor-wise, row-wise, 1x128 blocks)']}"
        from .ops import get_op
        p = get_op("scaled_gemm").case(text).p
        req = ("gemm", f"{p['m']}x{p['n']}x{p['k']}", dt)
    elif op == "grouped_gemm":
        head = text.split(":", 1)[0].strip().lower()
        req = ("grouped_gemm", head[1:] if head.startswith("g") else head, dt)
    else:
        req = (op, text, dt)
    if req[0] not in XRAY_DTYPES or req[2] not in XRAY_DTYPES[req[0]]:
        covered = "; ".join(f"{o} {'/'.join(d)}" for o, d in XRAY_DTYPES.items())
        return None, f"{op} {dt} is not covered by the X-ray (covered: {covered}; see coverage_text())"
    why = unavailable_reason()
    if why:
        return None, f"the kernel X-ray cannot run here: {why}"
    opts = parse_options(options)
    note = (f"options {', '.join(f'{k}={v}' for k, v in opts.items())} are not part of the X-ray: it compiles "
            "the contiguous case" if opts else "")
    return req, note


def xray_batch(requests: Iterable[tuple[str, str, str]], arch: str = "gfx950", out: str | None = None,
               autotune: bool = False, keep_ir: bool = False, use_explainer: bool = True,
               timeout_s: float = 1800.0) -> list[XRay]:
    """X-ray several cases in one subprocess (torch is imported once; identical kernel
    specialisations are compiled once). ``requests`` are ``(op, shape, dtype)`` triples.

    ``out``: folder to save into (one sub-folder per case: each kernel's ``.s`` and an
    ``xray.json``; with ``keep_ir`` also every IR stage flydsl dumped). ``autotune``: GEMMs show
    every FlyDSL autotuning candidate torch would benchmark (``flydsl_enable_autotuning``)
    instead of the single baseline config. ``use_explainer``: ask ``flyexplore.explain`` first
    when it exists (torch's predicate otherwise). Raises :class:`~flyexplore.errors.UsageError`
    for bad input, :class:`XRayUnavailable` when this machine lacks torch >= 2.15, flydsl 0.3 or
    an AMDGPU-capable ld.lld, ``RuntimeError`` when the worker fails as a whole (a failed build of
    one case is that case's ``error``). Compile times: about 0.2 s per RMSNorm kernel, 0.5-1.5 s
    per GEMM, 2-4 s TopK register, 20-60 s TopK radix, plus about 3 s to start (2-core x86).
    """
    arch = _check_arch(arch)
    reqs = [_request(op, shape, dtype) for op, shape, dtype in requests]
    if not reqs:
        raise UsageError("no cases to X-ray")
    verdicts = [(_explainer_verdict(r, arch) if use_explainer else None) for r in reqs]
    need_worker = any(v is None or v[0] for v in verdicts)
    worker_out: dict[str, Any] = {"results": [None] * len(reqs), "versions": {}}
    scratch = tempfile.mkdtemp(prefix="flyexplore-xray-")
    try:
        if need_worker:
            _ensure_ready()
            from .env import find_amdgpu_lld

            lld = find_amdgpu_lld()
            libs = find_rocm_device_libs()
            jobs = [{"op": r.op, "params": r.params, "dtype": r.dtype, "torch_dtype": _TORCH_DTYPES[r.dtype],
                     "autotune": bool(autotune), "device_libs": libs is not None,
                     "verdict": None if v is None else {"eligible": v[0], "reason": v[1]}}
                    for r, v in zip(reqs, verdicts)]
            jobs_path = os.path.join(scratch, "jobs.json")
            res_path = os.path.join(scratch, "results.json")
            with open(jobs_path, "w") as f:
                json.dump({"arch": arch, "dump_root": os.path.join(scratch, "dump"), "jobs": jobs}, f)
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
                for i, r in enumerate(got.get("results", [])):
                    worker_out["results"][i] = r
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
        return [_assemble(r, v, worker_out["results"][i], worker_out["versions"], arch, out, keep_ir, i)
                for i, (r, v) in enumerate(zip(reqs, verdicts))]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
                    with open(saved, "w") as f:
                        f.write(text)
                    if keep_ir:
                        shutil.copytree(os.path.dirname(isa), os.path.join(case_dir, _safe(kr.name) + "_ir"),
                                        dirs_exist_ok=True)
                kernels.append(XRayKernel(kr.name, rec["family"], dict(rec.get("config", {})), kr,
                                          occupancy(kr, ARCH_LIMITS[arch]),
                                          count_instructions(text, kr.name), saved, rec.get("compile_s"),
                                          bool(rec.get("reused", False)), text))
    x = XRay(req.op, req.label, req.params, req.dtype, arch, bool(res.get("eligible")),
             res.get("reason") or "(no verdict)", vsrc, tuple(kernels), tuple(res.get("notes", [])),
             "; ".join(errors) or None, dict(versions), case_dir)
    if case_dir is not None:
        with open(os.path.join(case_dir, "xray.json"), "w") as f:
            json.dump(x.to_dict(), f, indent=2, default=str)
    return x


def xray(op: str, shape: str, dtype: str = "bf16", arch: str = "gfx950", out: str | None = None,
         autotune: bool = False, keep_ir: bool = False, use_explainer: bool = True,
         timeout_s: float = 1800.0) -> XRay:
    """X-ray one case: ``xray("rmsnorm", "8192x4096", "bf16")``. Shapes as elsewhere in
    flyexplore (rmsnorm ``MxN``, topk ``MxNxK[:deterministic=1]``, gemm ``MxNxK[:NT]``) plus
    grouped_gemm ``GxMxNxK``. Arguments and errors as in :func:`xray_batch`."""
    return xray_batch([(op, shape, dtype)], arch=arch, out=out, autotune=autotune, keep_ir=keep_ir,
                      use_explainer=use_explainer, timeout_s=timeout_s)[0]


def xray_frame(xrays: Sequence[XRay]):
    """A tidy DataFrame, one row per kernel (one row with the reason for a case without kernels).

    Columns: op, case, dtype, arch, the case parameters (m, n, k, ...), eligible, reason,
    verdict_source, error, source (``"compiled"``), torch, flydsl, family, kernel, config (JSON),
    vgprs, agprs, vgprs_total, vgpr_alloc, vgprs_descriptor, sgprs, vgpr_spills, sgpr_spills, scratch_bytes,
    lds_bytes, workgroup_size, wavefront_size, waves_per_workgroup, waves_per_simd, occupancy
    (0..1), workgroups_per_cu, limited_by, isa_file, compile_s (s), reused, inst_<class>, inst_total.
    """
    import pandas as pd

    return pd.DataFrame([row for x in xrays for row in x.rows()])


def xray_sweep(op: str, shapes: Sequence[str], dtypes: Sequence[str] = ("bf16",), **kw):
    """X-ray every shape x dtype in one subprocess; returns :func:`xray_frame` of the results.
    Keyword arguments as in :func:`xray_batch`."""
    return xray_frame(xray_batch([(op, s, d) for s in shapes for d in dtypes], **kw))


# ------------------------------------------------------------------------------ figure
_METRICS = (("vgprs_total", "unified VGPRs per lane"), ("spills", "spilled registers (VGPR + SGPR)"),
            ("lds_bytes", "LDS bytes per workgroup"), ("waves_per_simd", "waves per SIMD (occupancy)"))
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "triangle-down")


def resources_figure(data, x: str | None = None, color: str | None = None, title: str | None = None):
    """Kernel resources across a sweep: stacked panels of unified VGPRs, spilled registers
    (VGPR spills go to scratch memory, SGPR spills to VGPR lanes), LDS bytes and the resulting occupancy (waves per SIMD, of 8 on
    gfx950), one line per ``color`` group.

    ``data``: a :func:`xray_frame` DataFrame or a list of :class:`XRay`. ``x`` defaults to ``n``
    when the sweep varies N, else ``case``; ``color`` defaults to ``dtype`` when several dtypes
    are present, else ``family``. Cases without a kernel (not eligible) are listed in the title,
    not plotted. Returns a plotly ``Figure`` (``fig.write_html``, or ``fig.write_image`` once
    kaleido and a Chromium are installed). Raises ``UsageError`` when nothing was compiled or
    ``x`` / ``color`` is not a column.
    """
    import pandas as pd
    from plotly.subplots import make_subplots

    df = data if isinstance(data, pd.DataFrame) else xray_frame(list(data))
    if "kernel" not in df or df["kernel"].isna().all():
        raise UsageError("no compiled kernel to plot (every case was not eligible or failed)")
    have = df[df["kernel"].notna()].copy()
    have["spills"] = have["vgpr_spills"] + have["sgpr_spills"]
    if x is None:
        x = "n" if "n" in have and have["n"].nunique() > 1 else "case"
    if color is None:
        color = "dtype" if have["dtype"].nunique() > 1 else "family"
    for col in (x, color):
        if col not in have:
            raise UsageError(f"unknown column {col!r} (valid: {', '.join(map(str, have.columns))})")
    skipped = df[df["kernel"].isna()]
    fig = make_subplots(rows=len(_METRICS), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[t for _, t in _METRICS])
    palette = ["#AB63FA", "#636EFA", "#EF553B", "#00CC96", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880"]
    if x != "case":
        have = have.sort_values(x)
    for gi, (key, g) in enumerate(have.groupby(color, sort=True)):
        c = palette[gi % len(palette)]
        hover = [f"{r.op} {r.case} {r.dtype}<br>{r.kernel} ({r.family})<br>limited by {r.limited_by}"
                 for r in g.itertuples()]
        for row, (metric, _) in enumerate(_METRICS, start=1):
            fig.add_scatter(x=g[x], y=g[metric], mode="lines+markers", name=f"{color}={key}",
                            legendgroup=str(key), showlegend=row == 1, line_color=c, row=row, col=1,
                            marker_symbol=_SYMBOLS[gi % len(_SYMBOLS)], marker_size=9 - 2 * (gi % 3),
                            hovertext=hover, hovertemplate="%{hovertext}<br>%{y}<extra></extra>")
    arch = have["arch"].iloc[0]
    if arch in ARCH_LIMITS:
        fig.add_hline(y=ARCH_LIMITS[arch].max_waves_per_simd, line_dash="dash", line_color="gray",
                      row=len(_METRICS), col=1)
    ops = ", ".join(sorted(have["op"].unique()))
    ttl = title or f"FlyDSL kernel resources for {arch} ({ops}; compiled, not run)"
    if len(skipped):
        ttl += f"<br><sup>not eligible / no kernel: {', '.join(skipped['case'] + ' ' + skipped['dtype'])}</sup>"
    fig.update_layout(title=ttl, template="plotly_white", legend_title=color, height=900)
    fig.update_xaxes(title_text=x, row=len(_METRICS), col=1)
    if x == "n":
        fig.update_xaxes(type="log")
    for row in range(1, len(_METRICS) + 1):
        fig.update_yaxes(rangemode="tozero", row=row, col=1)
    return fig
