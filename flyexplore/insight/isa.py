"""AMDGPU ISA of one compiled kernel: its resources (registers, spills, LDS, workgroup), its
instructions counted by class, and the occupancy those resources allow (LLVM's rules, with
gfx950's limits in :data:`GFX950`). Pure text processing of an LLVM ``.s`` file: no GPU, no ROCm.

Split from :mod:`flyexplore.insight.xray`, which re-exports every name here (``xray.parse_isa``,
``xray.occupancy``, ``xray.GFX950`` ...).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


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
