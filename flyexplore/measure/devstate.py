"""Device state beside every measurement: SM (GFX) clock, power, temperature, throttle reasons.

A GPU's clock moves with what ran before (on an H200 the SM clock was seen between 1500 and
1980 MHz under load, and one kernel's time moved from 294 to 343 µs with it), so each row
keeps the clock at the start and end of its case, the clock sampled in every round, and a
``throttled`` flag. Sources: NVML through ``nvidia-ml-py`` (``pynvml``) on NVIDIA, ``amdsmi``
on AMD (shipped with ROCm). On a CPU, or where neither library works, :func:`sampler_for`
returns a :class:`NullSampler` and the columns stay empty.

Samples are instantaneous readings (NVML/amdsmi report the current clock), not averages over a
round: ``time_cycles`` (time x clock) is an estimate, stated as such in the result schema.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

#: A case is flagged ``throttled`` when its lowest sampled SM clock fell below this fraction of
#: the device's maximum SM clock (an H200 under sustained load runs at 1500-1980 MHz of 1980;
#: below 80% the clock, not the kernel, dominates a comparison of absolute times).
THROTTLE_FRACTION = 0.80


def default_device():
    """The device a run uses when none is given: ``torch.device("cuda:0")`` when
    ``torch.cuda.is_available()`` (an NVIDIA or ROCm GPU), else ``torch.device("cpu")``.
    Shared by the sweep and the trace."""
    import torch
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


class NullSampler:
    """No device state available (CPU, or no NVML/amdsmi): every reading is ``None``."""

    source = "none"
    device_id = None
    max_clock_mhz = None

    def clock_mhz(self) -> float | None:
        return None

    def sample(self) -> dict[str, Any]:
        return {}


def _nvml_handle(pynvml, uuid, index: int, mig: bool = False):
    """The NVML handle of the GPU torch reports as ``uuid`` (``GPU-`` added where torch leaves it
    out; with ``mig``, a ``MIG-`` uuid is taken as it is), else of NVML index ``index``. NVML must
    be initialised."""
    if uuid:
        u = str(uuid)
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(
                u if u.startswith(("GPU-", "MIG-") if mig else "GPU-") else f"GPU-{u}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class NvmlSampler:
    """NVML readings for one NVIDIA GPU, found by UUID (so ``CUDA_VISIBLE_DEVICES`` cannot
    point it at another GPU). Raises whatever ``pynvml`` raises when NVML is unusable."""

    source = "nvml"

    def __init__(self, uuid: str | None, index: int = 0):
        import pynvml

        self._n = pynvml
        pynvml.nvmlInit()
        self._h = _nvml_handle(pynvml, uuid, index)
        uid = pynvml.nvmlDeviceGetUUID(self._h)
        self.device_id = uid.decode() if isinstance(uid, bytes) else str(uid)
        self.max_clock_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(self._h, pynvml.NVML_CLOCK_SM))

    def clock_mhz(self) -> float | None:
        return float(self._n.nvmlDeviceGetClockInfo(self._h, self._n.NVML_CLOCK_SM))

    def sample(self) -> dict[str, Any]:
        n, h = self._n, self._h
        out: dict[str, Any] = {"clock_mhz": self.clock_mhz()}
        try:
            out["power_w"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
        except n.NVMLError:
            pass
        try:
            out["temp_c"] = float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        except n.NVMLError:
            pass
        get = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if get is not None:
            try:
                out["reasons"] = _nvml_reasons(n, int(get(h)))
            except n.NVMLError:
                pass
        return out


def _nvml_reasons(n, mask: int) -> str:
    """NVML's clock-event (throttle) bitmask in words, e.g. ``"sw_power_cap,hw_thermal"``."""
    names = []
    for attr, word in (("SwPowerCap", "sw_power_cap"), ("HwSlowdown", "hw_slowdown"),
                       ("SwThermalSlowdown", "sw_thermal"), ("HwThermalSlowdown", "hw_thermal"),
                       ("HwPowerBrakeSlowdown", "hw_power_brake"), ("SyncBoost", "sync_boost"),
                       ("ApplicationsClocksSetting", "app_clocks"), ("GpuIdle", "idle")):
        bit = getattr(n, f"nvmlClocksEventReason{attr}", None)
        if bit is None:
            bit = getattr(n, f"nvmlClocksThrottleReason{attr}", None)
        if bit is not None and mask & int(bit):
            names.append(word)
    return ",".join(names)


class AmdSmiSampler:
    """amdsmi readings for one AMD GPU, found by PCI bus id (BDF) where torch reports it, else
    by index. Raises whatever ``amdsmi`` raises when it is unusable."""

    source = "amdsmi"

    def __init__(self, bdf: str | None, index: int = 0):
        import amdsmi

        self._a = amdsmi
        amdsmi.amdsmi_init()
        handles = amdsmi.amdsmi_get_processor_handles()
        h = None
        if bdf:
            for cand in handles:
                if str(amdsmi.amdsmi_get_gpu_device_bdf(cand)).lower() == bdf.lower():
                    h = cand
                    break
        self._h = h if h is not None else handles[index]
        self.device_id = str(amdsmi.amdsmi_get_gpu_device_bdf(self._h))
        info = amdsmi.amdsmi_get_clock_info(self._h, amdsmi.AmdSmiClkType.GFX)
        self.max_clock_mhz = float(info.get("max_clk")) if info.get("max_clk") else None

    def clock_mhz(self) -> float | None:
        info = self._a.amdsmi_get_clock_info(self._h, self._a.AmdSmiClkType.GFX)
        v = info.get("clk", info.get("cur_clk"))
        return float(v) if v not in (None, "N/A") else None

    def sample(self) -> dict[str, Any]:
        a, h = self._a, self._h
        out: dict[str, Any] = {"clock_mhz": self.clock_mhz()}
        try:
            p = a.amdsmi_get_power_info(h)
            w = p.get("current_socket_power", p.get("average_socket_power"))
            if w not in (None, "N/A"):
                out["power_w"] = float(w)
        except Exception:  # amdsmi raises its own AmdSmiException types
            pass
        try:
            out["temp_c"] = float(a.amdsmi_get_temp_metric(h, a.AmdSmiTemperatureType.HOTSPOT,
                                                           a.AmdSmiTemperatureMetric.CURRENT))
        except Exception:
            pass
        return out


def sampler_for(device) -> NullSampler | NvmlSampler | AmdSmiSampler:
    """The device-state sampler for a torch ``device``: NVML on CUDA builds, amdsmi on ROCm
    builds, :class:`NullSampler` on the CPU or when the library is missing or fails (never
    raises)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return NullSampler()
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    try:
        if getattr(torch.version, "hip", None):
            bdf = _bdf(props)
            return AmdSmiSampler(bdf, idx)
        uuid = getattr(props, "uuid", None)
        return NvmlSampler(str(uuid) if uuid is not None else None, idx)
    except Exception:
        return NullSampler()


def _bdf(props) -> str | None:
    dom, bus, dev = (getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if bus is None:
        return None
    return f"{int(dom or 0):04x}:{int(bus):02x}:{int(dev or 0):02x}.0"


def case_columns(start: dict, end: dict, round_clocks: list, max_clock: float | None,
                 round_ms: list | None = None) -> dict[str, Any]:
    """Row columns from the readings of one case: ``clock_mhz_start/end/min``,
    ``clock_mhz_max`` (the device's maximum), ``power_w_start/end``, ``temp_c_start/end``,
    ``throttle_reasons`` (start and end, joined), ``throttled`` (lowest clock <
    :data:`THROTTLE_FRACTION` x maximum) and, with ``round_ms`` (one headline time per round,
    ms, aligned with ``round_clocks``), ``time_cycles``: the median over rounds of time x clock,
    in SM clock cycles."""
    clocks = [c for c in [start.get("clock_mhz"), *round_clocks, end.get("clock_mhz")]
              if c is not None and math.isfinite(c)]
    out: dict[str, Any] = {
        "clock_mhz_start": start.get("clock_mhz"), "clock_mhz_end": end.get("clock_mhz"),
        "clock_mhz_min": min(clocks) if clocks else None, "clock_mhz_max": max_clock,
        "power_w_start": start.get("power_w"), "power_w_end": end.get("power_w"),
        "temp_c_start": start.get("temp_c"), "temp_c_end": end.get("temp_c"),
    }
    reasons = sorted({r for s in (start, end) for r in (s.get("reasons") or "").split(",") if r})
    out["throttle_reasons"] = ",".join(reasons) if (start or end) else None
    out["throttled"] = min(clocks) < THROTTLE_FRACTION * max_clock if clocks and max_clock else None
    if round_ms and round_clocks and len(round_ms) == len(round_clocks):
        cyc = [t * 1e-3 * c * 1e6 for t, c in zip(round_ms, round_clocks) if c is not None]
        if cyc:
            out["time_cycles"] = statistics.median(cyc)
    return out


# -- free memory (the sweep's memory check, flyexplore.run.cases.memory_refusals) ----------------

def free_memory(device) -> tuple[int | None, str]:
    """Free memory of ``device`` (a torch device or its text) in bytes, and where the number
    comes from: ``(bytes, source)``, or ``(None, why not)`` when it cannot be read. Never raises.

    - CPU: ``MemAvailable`` of ``/proc/meminfo`` (Linux: what can be allocated without
      swapping, page cache included), else ``psutil.virtual_memory().available`` where psutil is
      installed (macOS, Windows).
    - NVIDIA: NVML's free memory (``nvmlDeviceGetMemoryInfo``, ``nvidia-ml-py``) of the GPU found
      by the UUID torch reports (``torch.cuda.get_device_properties``), else by index. Neither
      creates a CUDA context, so asking costs the GPU nothing (seen on an H200, torch 2.11, driver
      580: NVML's used memory and process list unchanged after both, while
      ``torch.cuda.mem_get_info`` created a context of 0.5 GB).
    - ROCm: amdsmi (VRAM total less VRAM used) of the GPU found by PCI bus id, else
      ``torch.cuda.mem_get_info`` (which creates a HIP context in this process).
    """
    try:
        import torch

        dev = torch.device(device)
    except Exception as exc:  # noqa: BLE001 - a text torch cannot parse: nothing read
        return None, f"not read ({type(exc).__name__}: {exc})"
    if dev.type == "cpu":
        return cpu_free_memory()
    if dev.type != "cuda":
        return None, f"not read (no free-memory reader for device type {dev.type!r})"
    try:
        idx = dev.index if dev.index is not None else 0
        props = torch.cuda.get_device_properties(idx)
        if getattr(torch.version, "hip", None):
            return _rocm_free(torch, idx, _bdf(props))
        return _nvml_free(getattr(props, "uuid", None), idx)
    except Exception as exc:  # noqa: BLE001 - no GPU library: nothing read
        return None, f"not read ({type(exc).__name__}: {str(exc)[:200]})"


def cpu_free_memory(meminfo: str = "/proc/meminfo") -> tuple[int | None, str]:
    """The CPU side of :func:`free_memory`: ``MemAvailable`` from ``meminfo`` (kB, times 1024),
    else psutil's ``available``, else ``(None, why not)``. Never raises."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    scale = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
                    return int(parts[1]) * scale, "MemAvailable, /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available), "psutil.virtual_memory().available"
    except Exception:  # noqa: BLE001 - psutil missing or failing
        return None, "not read (no MemAvailable in /proc/meminfo and no psutil)"


def _nvml_free(uuid, index: int) -> tuple[int, str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = _nvml_handle(pynvml, uuid, index, mig=True)
        return int(pynvml.nvmlDeviceGetMemoryInfo(h).free), "NVML nvmlDeviceGetMemoryInfo"
    finally:
        pynvml.nvmlShutdown()


def _rocm_free(torch, index: int, bdf: str | None) -> tuple[int, str]:
    try:
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            h = next((c for c in handles if bdf and str(amdsmi.amdsmi_get_gpu_device_bdf(c)).lower() == bdf.lower()),
                     handles[index])
            vram = amdsmi.AmdSmiMemoryType.VRAM
            total = int(amdsmi.amdsmi_get_gpu_memory_total(h, vram))
            return total - int(amdsmi.amdsmi_get_gpu_memory_usage(h, vram)), "amdsmi VRAM total - used"
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception:  # noqa: BLE001 - no amdsmi: torch's own (creates a HIP context)
        return int(torch.cuda.mem_get_info(index)[0]), "torch.cuda.mem_get_info"
