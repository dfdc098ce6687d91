"""RMSNorm's FlyDSL path: the eager override of ``aten::_fused_rms_norm`` in torch 2.15.

Rules re-derived (not copied) from ``torch/_native/ops/norm/flydsl_rmsnorm_impl.py::
_fused_rms_norm_cond`` (with ``_common_supported``, ``_fused_rms_norm_fwd_perf_wins`` and
``torch/_native/flydsl_utils.py::_fits_int32_buffer_span``); checked against torch's own
functions in ``tests/ops/test_explain_agreement.py``. Registered on :data:`flyexplore.ops.rmsnorm.operator.RMSNORM`
as ``RMSNORM.flydsl``.
"""
from __future__ import annotations

from flyexplore.ops.base import FlyDSLPath, KernelPattern
from flyexplore.parsing import parse_flag
from flyexplore.world.conditions import (
    SRC_NATIVE,
    Condition,
    TensorDesc,
    as_dtype,
    cond,
    desc_or_none,
    fits_native,
    opt_offset,
    opt_stride,
    parse_ints,
    short_dtype,
)

_RMS = "torch/_native/ops/norm/flydsl_rmsnorm_impl.py"


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
    x, w = TensorDesc.of(x), desc_or_none(weight)
    S = f"{_RMS}::_fused_rms_norm_cond"
    C = f"{_RMS}::_common_supported"
    out = []
    n = _normalized_n(normalized_shape)
    shown = normalized_shape if isinstance(normalized_shape, int) else list(normalized_shape)
    out.append(cond("normalized_shape 1-D", n is not None, f"normalized_shape {shown} "
                  + ("is one dimension" if n is not None
                     else "must be one dimension (normalize over the last dim only)"),
                  "torch/_native/ops/norm/flydsl_rmsnorm_utils.py::normalized_shape_1d"))
    eps_ok = eps is None or eps >= 0.0
    out.append(cond("eps", eps_ok, f"eps={eps} " + ("ok" if eps_ok else "must be None or >= 0"), S))
    gpu = x.device_type == "cuda"
    out.append(cond("device", gpu, f"input on {x.device}" + ("" if gpu else ": needs a GPU tensor"), C))
    dt_ok = short_dtype(x.dtype) in ("fp32", "fp16", "bf16")
    out.append(cond("dtype", dt_ok, f"dtype {short_dtype(x.dtype)}" + (" supported" if dt_ok else ": needs fp16, bf16 or fp32"),
                  "torch/_native/ops/norm/flydsl_rmsnorm_utils.py::SUPPORTED_DTYPES"))
    last_ok = x.ndim >= 1 and n is not None and x.shape[-1] == n
    out.append(cond("last dim", last_ok if n is not None else None,
                  f"last dim {x.shape[-1] if x.ndim else '-'} == N={n}" if last_ok else
                  f"input's last dim ({x.shape[-1] if x.ndim else 'none'}) must equal N={n}", C))
    out.append(cond("non-empty", x.numel != 0, "input non-empty" if x.numel else "input is empty", C))
    out.append(cond("contiguous", x.is_contiguous(), "input contiguous" if x.is_contiguous()
                  else f"input not contiguous (stride {x.stride}); FlyDSL reads rows in place", C))
    out.append(cond("weight given", w is not None, "weight given" if w is not None
                  else "no weight: the FlyDSL kernel needs an explicit weight", C))
    if w is not None:
        shape_ok = n is not None and w.shape == (n,)
        out.append(cond("weight shape", shape_ok if n is not None else None, f"weight shape {w.shape}"
                      + (" == (N,)" if shape_ok else f" must be ({n},)"), C))
        out.append(cond("weight dtype", w.dtype == x.dtype, f"weight dtype {short_dtype(w.dtype)}"
                      + (" matches input" if w.dtype == x.dtype else f" must equal input dtype {short_dtype(x.dtype)}"), C))
        out.append(cond("weight device", w.device == x.device, f"weight on {w.device}"
                      + ("" if w.device == x.device else f", input on {x.device}: must match"), C))
        out.append(cond("weight contiguous", w.is_contiguous(), "weight contiguous" if w.is_contiguous()
                      else "weight not contiguous", C))
    if n is not None and n > 0 and x.numel:
        m = x.numel // n
        fits = fits_native(m, n, x.itemsize)
        out.append(cond("buffer span", fits, f"M*N*{x.itemsize} = {m * n * x.itemsize} bytes"
                      + (" fits 32-bit buffer descriptors" if fits else " exceeds the 32-bit buffer span (4 GiB) or M/N > int32"),
                      f"{SRC_NATIVE}::_fits_int32_buffer_span"))
        band = next((b for b in RMSNORM_REGION if b[0] <= n <= b[1]), None)
        if band is None:
            ok, detail = False, (f"N={n} is outside the tuned region 4096 <= N <= 114688 "
                                 "(ATen is faster there on MI355X)")
        else:
            ok = m >= band[2]
            detail = (f"N={n} in band {band[0]}..{band[1]} needs M >= {band[2]}: M={m}"
                      + ("" if ok else " (ATen is faster below)"))
        out.append(cond("tuned region", ok, detail, f"{_RMS}::_fused_rms_norm_fwd_perf_wins"))
    else:
        out.append(cond("tuned region", None, "not evaluated (N or the input is empty / invalid)",
                      f"{_RMS}::_fused_rms_norm_fwd_perf_wins"))
    return out



def judge(call: dict, f, common: dict):
    """:class:`~flyexplore.ops.base.FlyDSLPath` ``judge`` for ``F.rms_norm(x, normalized_shape,
    weight=None, eps=1e-6)``: pops ``x``, ``normalized_shape``, ``weight``, ``eps``."""
    x = TensorDesc.of(call.pop("x"))
    ns = call.pop("normalized_shape", (x.shape[-1],) if x.ndim else ())
    w, eps = desc_or_none(call.pop("weight", None)), call.pop("eps", 1e-6)
    args = {"x": x.text(), "normalized_shape": list(ns) if not isinstance(ns, int) else ns,
            "weight": w.text() if w else None, "eps": eps}
    return (args, rmsnorm_rules(x, ns, w, eps), "rmsnorm_kernel (FlyDSL RMSNorm forward)",
            ["forward only: the backward of F.rms_norm stays on ATen"])


def describe(case, dtype: str, opts: dict, device: str) -> dict:
    """The ``judge`` call for a catalogue case ``MxN[:eps=..,weight=..]``; options ``x_shape``,
    ``x_stride``, ``x_offset``, ``normalized_dims``, ``weight_dtype``, ``weight_contiguous``."""
    p = case.p
    m, n = p["m"], p["n"]
    xs = parse_ints(opts.pop("x_shape"), "x_shape") if "x_shape" in opts else (m, n)
    x = TensorDesc(xs, dtype, opt_stride(opts, "x_stride", None), opt_offset(opts, "x_offset"), device)
    nd = int(opts.pop("normalized_dims", 1))
    ns = tuple(xs[-nd:]) if nd > 0 else ()
    w = None
    if p["weight"]:
        wdt = as_dtype(opts.pop("weight_dtype")) if "weight_dtype" in opts else dtype
        wc = parse_flag(opts.pop("weight_contiguous", True))
        w = TensorDesc(ns or (n,), wdt, None if wc or len(ns or (n,)) != 1 else (2,), 0, device)
    return dict(x=x, normalized_shape=ns, weight=w, eps=p["eps"])


FLYDSL = FlyDSLPath(
    route="eager",
    path="eager override of aten::_fused_rms_norm (F.rms_norm)",
    judge=judge,
    describe=describe,
    options=("x_shape", "x_stride", "x_offset", "normalized_dims", "weight_dtype", "weight_contiguous", "device"),
    example="8192x4096",
    kernels=(KernelPattern(r"^rmsnorm_kernel(_\d+)?$",
                           "FlyDSL RMSNorm (torch/_native/ops/norm/flydsl_rmsnorm_fwd.py)"),),
    aten_ops=("_fused_rms_norm",),
    module="torch._native.ops.norm.flydsl_rmsnorm_impl",
    xray="flyexplore.ops.rmsnorm.xray:build",
)
