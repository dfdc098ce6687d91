"""Kernel X-ray of the RMSNorm family (:mod:`flyexplore.insight.xray`): torch 2.15's own predicate
``torch/_native/ops/norm/flydsl_rmsnorm_impl.py::_fused_rms_norm_cond`` and its builder
``flydsl_rmsnorm_fwd.py::_compile_rmsnorm_fwd`` (forward), called, never copied.

:func:`build` runs in the X-ray's worker process (``flyexplore/insight/_xray_worker.py``) with flydsl's
compile-only switches set; :data:`XRAY` is what :mod:`flyexplore.insight.xray` reads about the family.
"""
from __future__ import annotations

from flyexplore.ops.xray_kit import XRayVerdict, fake_cuda, min_true, torch_dtype_named

#: The family's X-ray spec (keys described in :func:`flyexplore.insight.xray.xray_spec`).
XRAY = {"dtypes": ("bf16", "fp16", "fp32"), "shape": "MxN"}

_RMS = "torch/_native/ops/norm/flydsl_rmsnorm_impl.py::_fused_rms_norm_cond"


def _eps_value(eps) -> float:
    """The eps the kernel gets: ``eps``, or for None the fp32 machine epsilon, as torch's
    FlyDSL RMSNorm wrapper substitutes (``flydsl_rmsnorm_impl``, torch 2.15)."""
    import torch

    return float(torch.finfo(torch.float32).eps) if eps is None else float(eps)


def build(p, dtype, torch_dtype, arch, autotune=False) -> XRayVerdict:
    """torch's verdict for RMSNorm ``p`` (``m``, ``n``, ``eps``, ``weight``) in ``dtype`` on
    ``arch`` and, when eligible, the forward kernel's build (specialised on N and dtype)."""
    import torch
    from torch._native import flydsl_utils as fu
    from torch._native.ops.norm import flydsl_rmsnorm_impl as impl
    from torch._native.ops.norm.flydsl_rmsnorm_utils import SUPPORTED_DTYPES

    m, n, eps, has_w = p["m"], p["n"], p.get("eps", 1e-6), p.get("weight", True)
    dt = torch_dtype_named(torch_dtype)
    with fake_cuda():
        x = torch.empty((m, n), dtype=dt, device="cuda:0")
        w = torch.empty((n,), dtype=dt, device="cuda:0") if has_w else None
        ok = bool(impl._fused_rms_norm_cond(x, [n], w, eps))
    if ok:
        reason = (f"torch's FlyDSL RMSNorm predicate accepts {m}x{n} {dtype} on {arch}: "
                  "aten::_fused_rms_norm (forward) runs the FlyDSL kernel")
    elif not fu._is_supported_arch(0, impl._SUPPORTED_ARCHES):
        reason = f"target arch {arch} is not one FlyDSL RMSNorm supports ({', '.join(impl._SUPPORTED_ARCHES)})"
    elif dt not in SUPPORTED_DTYPES:
        reason = (f"dtype {dtype} is not one FlyDSL RMSNorm takes "
                  f"({', '.join(str(d).replace('torch.', '') for d in SUPPORTED_DTYPES)})")
    elif not has_w:
        reason = "no weight: the FlyDSL RMSNorm kernel needs an explicit weight of shape (N,)"
    elif eps is not None and not eps >= 0:
        reason = f"eps={eps} is negative"
    elif not fu._fits_int32_buffer_span(m, n, dt.itemsize):
        reason = f"{m}x{n} {dtype} does not fit a 32-bit AMD buffer descriptor span"
    elif not impl._fused_rms_norm_fwd_perf_wins(m, n):
        need = min_true(lambda mm: impl._fused_rms_norm_fwd_perf_wins(mm, n))
        if need is None:
            reason = (f"N={n} is outside the N range where torch tuned FlyDSL RMSNorm to beat ATen on "
                      "MI355 (no row count M makes it eligible)")
        else:
            reason = (f"outside torch's tuned region: at N={n} FlyDSL RMSNorm needs M >= {need} rows "
                      f"(got M={m}); below that ATen is faster on MI355")
        reason += " (torch/_native/ops/norm/flydsl_rmsnorm_impl.py::_fused_rms_norm_fwd_perf_wins)"
    else:
        reason = "torch's FlyDSL RMSNorm predicate refuses this case"
    if not ok:
        return XRayVerdict(False, reason, _RMS)

    def compile_kernel():
        import flydsl.compiler as flyc
        from torch._native.ops.norm import flydsl_rmsnorm_fwd as fwd

        fwd.clear_rmsnorm_caches()
        x = torch.empty((m, n), dtype=dt, device="meta")
        wt = torch.empty((n,), dtype=dt, device="meta")
        out = torch.empty((m, n), dtype=dt, device="meta")
        rstd = torch.empty((m,), dtype=torch.float32, device="meta")
        fwd._compile_rmsnorm_fwd(n, SUPPORTED_DTYPES[dt], arch, flyc.compile_backend_name(), 0,
                                 compile_args=(x, wt, out, rstd, m, _eps_value(eps), None))

    cfg = {"N": n, "dtype": SUPPORTED_DTYPES[dt]}
    return XRayVerdict(True, reason, _RMS, [("rmsnorm fwd", cfg, ("rmsnorm", n, torch_dtype, arch), compile_kernel)],
                   ["the kernel is specialised on N and dtype only: every M with this N and dtype "
                    "runs the same kernel (M is a launch argument)"])
