"""Peak throughput of the GPUs flyexplore reports on, and "% of peak" columns.

Datasheet peaks are dense (no 2:4 sparsity) matrix throughput in TFLOP/s per dtype class and
HBM bandwidth in TB/s (1 TB/s = 1000 GB/s). Measured peaks are what a real device reached
(a large matmul, a device-to-device copy); they are closer to what a kernel can get. Every
entry names its source. Rounded datasheet values ("about 2.5 PFLOP/s") are kept as rounded.

dtype classes (:data:`DTYPE_CLASS`): ``bf16`` (bf16, fp16), ``fp8`` (fp8_e4m3, fp8_e5m2,
mxfp8), ``fp4`` (mxfp4), ``fp32`` (FP32 vector/matrix, no TF32).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from flyexplore.errors import bad_choice

#: dtype name in result rows -> peak class.
DTYPE_CLASS = {"bf16": "bf16", "fp16": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
               "mxfp8": "fp8", "mxfp4": "fp4", "fp32": "fp32"}


@dataclass(frozen=True)
class DevicePeaks:
    """Peaks of one device. ``tflops``: dtype class -> dense TFLOP/s; ``hbm_tbps``: TB/s;
    ``measured_tflops`` / ``measured_tbps``: measured values (empty / None if none);
    ``source`` and ``measured_source`` say where the numbers come from. ``match`` are
    substrings of ``torch.cuda.get_device_name()`` that identify the device; names containing
    any of ``exclude`` (other variants with other peaks, e.g. PCIe/NVL) do not match."""

    name: str
    match: tuple[str, ...]
    tflops: dict[str, float]
    hbm_tbps: float
    source: str
    measured_tflops: dict[str, float] = field(default_factory=dict)
    measured_tbps: float | None = None
    measured_source: str = ""
    exclude: tuple[str, ...] = ()

    def peak(self, dtype: str, kind: str = "datasheet") -> tuple[float, float]:
        """(TFLOP/s, GB/s) peak for a result-row dtype; ``kind`` ``datasheet`` or ``measured``
        (falls back to the datasheet value where nothing was measured). NaN when unknown."""
        cls = DTYPE_CLASS.get(dtype)
        tf = self.tflops.get(cls, math.nan) if cls else math.nan
        bw = self.hbm_tbps * 1e3
        if kind == "measured":
            tf = self.measured_tflops.get(cls, tf) if cls else tf
            bw = self.measured_tbps * 1e3 if self.measured_tbps else bw
        elif kind != "datasheet":
            raise bad_choice("peak kind", kind, ("datasheet", "measured"))
        return tf, bw


_REF = "AMD Instinct MI350 series / NVIDIA H200 datasheets"

#: The devices with known peaks.
DEVICES: dict[str, DevicePeaks] = {d.name: d for d in (
    DevicePeaks("MI355X", ("MI355X", "MI355"), {"bf16": 2500.0, "fp8": 5000.0, "fp4": 10100.0, "fp32": 157.3},
                8.0, f"{_REF}; FP32 vector 157.3 TFLOP/s: AMD Instinct MI355X datasheet",
                measured_tflops={"fp8": 4970.0},
                measured_source="MXFP8: measured scaled-MFMA instruction roof 4970 TFLOP/s "
                                "(pytorch/pytorch PR 193527 description); bandwidth not measured"),
    DevicePeaks("MI350X", ("MI350X", "MI350"), {"bf16": 2300.0, "fp8": 4600.0, "fp4": 9200.0, "fp32": 144.2},
                8.0, f"{_REF}; FP32 vector 144.2 TFLOP/s: AMD Instinct MI350X datasheet"),
    DevicePeaks("MI300X", ("MI300X",), {"bf16": 1307.4, "fp8": 2614.9, "fp32": 163.4}, 5.3,
                "AMD Instinct MI300X datasheet (dense matrix BF16 1307.4, FP8 2614.9, FP32 163.4 "
                "TFLOP/s; HBM3 5.3 TB/s)"),
    DevicePeaks("H100 SXM", ("H100",), {"bf16": 989.4, "fp8": 1978.9, "fp32": 66.9}, 3.35,
                "NVIDIA H100 Tensor Core GPU datasheet, SXM5 (dense: half the with-sparsity "
                "figures; FP32 67 TFLOP/s; HBM3 3.35 TB/s)", exclude=("PCIe", "NVL")),
    DevicePeaks("H200 SXM", ("H200",), {"bf16": 989.0, "fp8": 1979.0, "fp32": 67.0}, 4.8,
                f"{_REF}; FP32: NVIDIA H200 datasheet", exclude=("NVL",),
                measured_tflops={"bf16": 790.0}, measured_tbps=4.3,
                measured_source="one H200 (torch 2.11): bf16 8192^3 matmul about 790 TFLOP/s "
                                "(769-798 over lent-GPU probes, not kept under data/; data/h200/"
                                "published_suites reads 701 under sweep timing); device-to-device "
                                "copy about 4.3 TB/s counting read + write (the GPU lender's notes)"),
)}


def find_device(name: str | None, required: bool = False) -> DevicePeaks | None:
    """The :class:`DevicePeaks` for a device name as torch reports it ("AMD Instinct MI355X",
    "NVIDIA H200") or a short name ("MI355X", "H200 SXM"). ``None`` when unknown, or a
    :class:`~flyexplore.errors.UsageError` naming the known devices when ``required``."""
    if name:
        if name in DEVICES:
            return DEVICES[name]
        up = name.upper()
        for d in DEVICES.values():
            if any(m.upper() in up for m in d.match) and not any(x.upper() in up for x in d.exclude):
                return d
    if required:
        raise bad_choice("device for peaks", name, DEVICES)
    return None


def table() -> pd.DataFrame:
    """All peaks as a table: device, dtype class, datasheet and measured TFLOP/s, HBM and
    measured TB/s, sources."""
    rows = []
    for d in DEVICES.values():
        for cls in ("bf16", "fp8", "fp4", "fp32"):
            rows.append({"device": d.name, "class": cls, "tflops": d.tflops.get(cls, math.nan),
                         "measured_tflops": d.measured_tflops.get(cls, math.nan),
                         "hbm_tbps": d.hbm_tbps, "measured_tbps": d.measured_tbps or math.nan,
                         "source": d.source, "measured_source": d.measured_source})
    return pd.DataFrame(rows)


def percent_of_peak(df: pd.DataFrame, device: str | None = None, kind: str = "datasheet") -> pd.DataFrame:
    """A copy of result set ``df`` with ``peak_device``, ``peak_tflops``, ``peak_gbps``,
    ``pct_peak_tflops`` and ``pct_peak_gbps`` (percent, 0-100+) per row.

    The device is ``device`` for every row, else each row's ``device`` column; rows on a device
    without known peaks (CPU, unknown GPU) get NaN. ``kind`` is ``datasheet`` or ``measured``
    (measured where known, else datasheet). Raises ``UsageError`` for an unknown ``device`` or
    ``kind``."""
    fixed = find_device(device, required=True) if device else None
    out = df.copy()
    names, tf, bw = [], [], []
    for dev, dt in zip(out["device"] if "device" in out else [None] * len(out), out["dtype"]):
        d = fixed or find_device(None if pd.isna(dev) else str(dev))
        p = d.peak(str(dt), kind) if d else (math.nan, math.nan)
        names.append(d.name if d else None)
        tf.append(p[0])
        bw.append(p[1])
    out["peak_device"] = names
    out["peak_tflops"] = pd.array(tf, dtype="Float64")
    out["peak_gbps"] = pd.array(bw, dtype="Float64")
    t = pd.to_numeric(out["tflops"], errors="coerce").astype("Float64") if "tflops" in out else pd.NA
    g = pd.to_numeric(out["gbps"], errors="coerce").astype("Float64") if "gbps" in out else pd.NA
    out["pct_peak_tflops"] = 100.0 * t / out["peak_tflops"]
    out["pct_peak_gbps"] = 100.0 * g / out["peak_gbps"]
    return out


# -- the fraction of the datasheet peak a kernel class achieves ------------------------------------

@dataclass(frozen=True)
class Achieved:
    """The fraction of a device's datasheet peak one kernel class achieves: ``flops`` (of the
    matrix or vector FLOP/s peak), ``bandwidth`` (of the HBM peak), each 0..1 (1.0: the datasheet
    peak, nothing known); ``source`` says where each number comes from, ``assumed`` when no
    measurement stands behind it."""

    flops: float
    bandwidth: float
    source: str
    assumed: bool = False


#: Kernel classes of the modelled time (:func:`flyexplore.results.model.kernel_class`): GEMMs
#: (dense, grouped, scaled), SDPA by the kernel it takes (flash: no ``attn_mask`` and causal or
#: none; memory-efficient: an explicit mask; math: neither fused kernel), Inductor's fused
#: pointwise/reduction kernels (``fused``: compiled view), and everything else (``unfused``: ATen's
#: own elementwise and reduction kernels, one per call).
KERNEL_CLASSES = ("gemm", "sdpa_flash", "sdpa_efficient", "sdpa_math", "fused", "unfused")

_H200_RUN = "data/h200/model_measure (Llama-3.1-8B bf16, torch 2.11, one H200, 2026-12-04; its README)"
#: The H200's fractions, from the kernels measured in one model step there (:data:`_H200_RUN`),
#: each the captured work at the datasheet peak over the measured kernel time. GEMM: 760 TFLOP/s of
#: 989 in the prefill's GEMMs (M = 2048: README "GEMM share"); bandwidth: the decode's GEMMs
#: (M = 32, weight-bound) moved their captured 15.19 GB in 4.566 ms (3.33 TB/s of 4.8). flash:
#: ``pytorch_flash::flash_fwd_kernel`` ran the 32 causal prefill SDPA calls (1x32x2048x128, 8 KV
#: heads; 1.10 TFLOP counting the causal half) in 5.675 ms: 194 TFLOP/s. memory-efficient:
#: CUTLASS's ``fmha_cutlassF_bf16_aligned_64x128_rf_sm80`` ran the same calls with an explicit
#: causal mask (every score computed: 2.20 TFLOP) in 19.26 ms: 114 TFLOP/s. fused: Inductor's
#: RMSNorm (residual add included) and SwiGLU kernels of the compiled prefill, 10.50 GB at the bytes
#: :mod:`flyexplore.results.fusion` gives them (2.19 ms at 4.8 TB/s), measured 3.24 ms (compile)
#: and 2.87 ms (max-autotune): 0.676 and 0.762, their mean. unfused: ATen's kernels of the eager
#: prefill's RMSNorm, 19.63 GB at their decomposed calls' bytes (4.09 ms at 4.8 TB/s), measured
#: 8.02 ms. Fitted on one run: the same run's shares agree with them by construction; another
#: model, step or torch is the test.
_H200 = {
    "gemm": Achieved(760.0 / 989.0, 3.33 / 4.8, f"GEMM: {_H200_RUN}: prefill 760 TFLOP/s, decode weights at 3.33 TB/s"),
    "sdpa_flash": Achieved(194.0 / 989.0, 1.0, f"flash_fwd_kernel: {_H200_RUN}: causal prefill 194 TFLOP/s; "
                                               "bandwidth not measured (datasheet)"),
    "sdpa_efficient": Achieved(114.0 / 989.0, 1.0, f"fmha_cutlassF (masked): {_H200_RUN}: 114 TFLOP/s counting "
                                                   "every score; bandwidth not measured (datasheet)"),
    "sdpa_math": Achieved(114.0 / 989.0 / 4, 1.0, "math SDPA: assumed a quarter of the memory-efficient kernel's "
                                                  "(bmm + softmax + bmm through memory)", assumed=True),
    "fused": Achieved(1.0, 0.72, f"Inductor pointwise/reduction kernels: {_H200_RUN}: the compiled prefill's "
                                 "RMSNorm and SwiGLU kernels at 72% of the HBM peak (67.6% compile, 76.2% "
                                 "max-autotune)"),
    "unfused": Achieved(1.0, 0.51, f"ATen elementwise/reduction kernels: {_H200_RUN}: the eager prefill's RMSNorm "
                                   "kernels at 51% of the HBM peak"),
}

#: Per device: kernel class -> :class:`Achieved`. The H100 SXM takes the H200's (same SMs and
#: clocks; HBM differs, and a fraction of it is what carries over), marked assumed: no H100
#: measurement stands behind them (the lent H100's prefill shares agreed with them within 1.0
#: point: ``data/h100/model_measure/``). MI355X
#: and MI300X: GEMM from the published MI355X dense suite (``data/published``: ATen 4096x4096x4096
#: bf16, 1379 TFLOP/s of 2500; SOURCES.md names the publication), the rest assumed as on the H200.
ACHIEVED: dict[str, dict[str, Achieved]] = {
    "H200 SXM": _H200,
    "H100 SXM": {k: Achieved(a.flops, a.bandwidth, "assumed as on the H200 (same SMs and clocks; no H100 "
                             "measurement behind it): " + a.source, True)
                 for k, a in _H200.items()},
    **{d: {**{k: Achieved(a.flops, a.bandwidth, "assumed as on the H200: " + a.source, True)
              for k, a in _H200.items()},
           "gemm": Achieved(1379.2 / 2500.0, 3.33 / 4.8,
                            "GEMM: published MI355X dense suite, ATen 4096x4096x4096 bf16 1379 TFLOP/s "
                            "(data/published/SOURCES.md); bandwidth assumed as on the H200")}
       for d in ("MI355X", "MI350X", "MI300X")},
}


def roofline_us(flops: float, nbytes: float, tflops: float, gbps: float, achieved: Achieved | None = None) -> float:
    """``max(flops / (peak FLOP/s x fraction), bytes / (bandwidth x fraction))`` in µs: ``tflops``
    in TFLOP/s, ``gbps`` in GB/s, the fractions of ``achieved`` (:class:`Achieved`; ``None``: the
    datasheet peaks themselves). NaN when a cost is unknown."""
    if not (flops == flops and nbytes == nbytes):
        return math.nan
    fc, fb = (achieved.flops, achieved.bandwidth) if achieved is not None else (1.0, 1.0)
    return max(flops / (tflops * 1e12 * fc), nbytes / (gbps * 1e9 * fb)) * 1e6


def achieved(device: str, kernel_class: str) -> Achieved:
    """The :class:`Achieved` fractions of ``kernel_class`` (:data:`KERNEL_CLASSES`) on
    ``device`` (a :data:`DEVICES` name); the datasheet peak itself (1.0, 1.0) where
    :data:`ACHIEVED` has no entry. Raises :class:`~flyexplore.errors.UsageError` for an unknown
    kernel class."""
    if kernel_class not in KERNEL_CLASSES:
        raise bad_choice("kernel class", kernel_class, KERNEL_CLASSES)
    got = ACHIEVED.get(device, {}).get(kernel_class)
    return got or Achieved(1.0, 1.0, f"no achieved fraction known for {kernel_class} on {device}: the datasheet peak",
                           assumed=True)


def achieved_text(device: str) -> str:
    """One line naming the achieved-fraction table used for ``device``: each class's percent of
    the FLOP/s and bandwidth peaks, ``assumed`` where no measurement stands behind it."""
    parts = []
    for k in KERNEL_CLASSES:
        a = achieved(device, k)
        parts.append(f"{k} {100 * a.flops:.0f}%/{100 * a.bandwidth:.0f}%" + (" (assumed)" if a.assumed else ""))
    return f"achieved fractions of peak FLOP/s / bandwidth on {device}: " + ", ".join(parts)
