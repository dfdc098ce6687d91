"""Kernel X-ray of the TopK family (:mod:`flyexplore.insight.xray`): torch 2.15's own predicate
``torch/_native/ops/topk/flydsl_impl.py::_cond`` and kernel choice ``_kernel_for``, and the
builders ``flydsl_kernels.py::_compile_register_topk`` / ``_compile_radix_select_topk``, called,
never copied.

:func:`build` runs in the X-ray's worker process (``flyexplore/insight/_xray_worker.py``); :data:`XRAY`
is what :mod:`flyexplore.insight.xray` reads about the family.
"""
from __future__ import annotations

from flyexplore.ops.xray_kit import XRayVerdict, fake_cuda, torch_dtype_named
from flyexplore.world.readiness import MI355X_CUS

#: The family's X-ray spec (keys described in :func:`flyexplore.insight.xray.xray_spec`).
XRAY = {"dtypes": ("fp32", "bf16", "fp16"), "shape": "MxNxK[:deterministic=1]"}

_TOPK = "torch/_native/ops/topk/flydsl_impl.py::_cond"


def build(p, dtype, torch_dtype, arch, autotune=False) -> XRayVerdict:
    """torch's verdict for TopK ``p`` (``m``, ``n``, ``k``, ``largest``, ``sorted``,
    ``deterministic``) in ``dtype`` on ``arch`` and, when eligible, the register or radix
    kernel's build. torch's row gate reads the device's CU count: taken as an MI355X's 256
    (:data:`flyexplore.world.readiness.MI355X_CUS`; MI350X has 256 too, ROCm "AMD GPU specifications")."""
    import torch
    from torch._native import flydsl_utils as fu
    from torch._native.ops.topk import flydsl_impl as impl

    impl._min_rows_for_full_wave = lambda device_index: MI355X_CUS
    m, n, k = p["m"], p["n"], p["k"]
    largest, sorted_, det = p.get("largest", True), p.get("sorted", True), p.get("deterministic", False)
    dt = torch_dtype_named(torch_dtype)
    with fake_cuda():
        x = torch.empty((m, n), dtype=dt, device="cuda:0")
        ok = bool(impl._cond(x, k, -1, largest, sorted_))
    family = impl._kernel_for(k, n)
    if ok:
        reason = (f"torch's FlyDSL TopK predicate accepts {m}x{n} k={k} {dtype} on {arch}: "
                  f"the {family} kernel runs")
    elif not fu._is_supported_arch(0, impl._SUPPORTED_ARCHES):
        reason = f"target arch {arch} is not one FlyDSL TopK supports ({', '.join(impl._SUPPORTED_ARCHES)})"
    elif dt != torch.float32:
        reason = f"dtype {dtype}: FlyDSL TopK takes fp32 only"
    elif not (largest and sorted_):
        reason = "FlyDSL TopK needs largest=True and sorted=True"
    elif not impl._fits_topk_buffer_span(m, n, k, dt.itemsize):
        reason = f"{m}x{n} k={k} does not fit a 32-bit AMD buffer descriptor span"
    elif m < MI355X_CUS:
        reason = (f"M={m} rows is fewer than one row per CU ({MI355X_CUS} CUs on MI355X/MI350X): "
                  "torch leaves small row counts to ATen (_min_rows_for_full_wave)")
    elif family is None:
        lo, hi = impl._REGISTER_N_BOUNDS
        bands = "; ".join(f"K {a}-{b}: N {c}..{d}" for (a, b), (c, d) in impl._RADIX_GATE_RANGES)
        reason = (f"no FlyDSL TopK kernel for K={k}, N={n}: the register kernel needs K in "
                  f"{{{', '.join(map(str, sorted(impl._REGISTER_KS)))}}} and N a power of two in "
                  f"{lo}..{hi}; the radix kernel covers {bands}")
    else:
        reason = "torch's FlyDSL TopK predicate refuses this case"
    if not ok:
        return XRayVerdict(False, reason, _TOPK)

    def compile_kernel():
        import flydsl.compiler as flyc
        from torch._native.ops.topk import flydsl_kernels as tk

        tk.clear_topk_cache()
        x = torch.empty((m, n), dtype=torch.float32, device="meta")
        v = torch.empty((m, k), dtype=torch.float32, device="meta")
        ix = torch.empty((m, k), dtype=torch.int64, device="meta")
        backend = flyc.compile_backend_name()
        if family == "register":
            tk._compile_register_topk(n, k, arch, backend, 0, compile_args=(x, v, ix, m, None))
        else:
            tk._compile_radix_select_topk(n, k, bool(det), arch, backend, 0, compile_args=(x, v, ix, m, None))

    cfg = {"N": n, "K": k}
    notes = ["the kernel is specialised on N and K: every M runs the same kernel"]
    if family == "radix":
        cfg["deterministic"] = bool(det)
        notes.append("radix kernel variant follows torch.use_deterministic_algorithms "
                     f"(deterministic={bool(det)})")
    key = ("topk", family, n, k, bool(det) if family == "radix" else None, arch)
    return XRayVerdict(True, reason, _TOPK, [(f"topk {family}", cfg, key, compile_kernel)], notes)
