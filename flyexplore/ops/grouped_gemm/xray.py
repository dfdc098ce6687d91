"""Kernel X-ray of the grouped GEMM family (:mod:`flyexplore.insight.xray`): Inductor's
``get_grouped_gemm_configs``, ``is_grouped_gemm_config_valid_for_shape`` and
``launch_gemm_gfx950_grouped`` as in ``flydsl_grouped_mm.py.jinja``, called, never copied.

:func:`build` runs in the X-ray's worker process (``flyexplore/insight/_xray_worker.py``); :data:`XRAY`
is what :mod:`flyexplore.insight.xray` reads about the family.
"""
from __future__ import annotations

from flyexplore.ops.gemm.xray import LAYOUT_NOTE, param_dict, template_kwargs
from flyexplore.ops.grouped_gemm.operator import GROUPED_GEMM
from flyexplore.ops.xray_kit import XRayVerdict, torch_dtype_named


def parse(text: str) -> tuple[str, dict]:
    """``"8x512x4096x4096"`` or ``"g8x512x4096x4096"`` -> (label, ``{g, m, n, k}``): G groups of
    M rows, parsed by the catalogue (:meth:`flyexplore.ops.base.Operator.case`; options after
    ``:`` are dropped: the X-ray compiles the contiguous NN case). Raises :class:`UsageError`
    naming a malformed or non-positive shape."""

    p = GROUPED_GEMM.case(str(text).split(":", 1)[0]).p
    dims = {d: p[d] for d in ("g", "m", "n", "k")}
    return "x".join(str(v) for v in dims.values()), dims


def request(shape: str, dtype: str) -> tuple[str, str, str]:
    """An explainer case (``g8x512x4096x4096:layout=NN``) as an X-ray request: the X-ray
    compiles the contiguous NN case, so options go and a leading ``g`` too."""
    head = str(shape).split(":", 1)[0].strip().lower()
    return "grouped_gemm", head.removeprefix("g"), dtype


#: The family's X-ray spec (keys described in :func:`flyexplore.insight.xray.xray_spec`).
XRAY = {"dtypes": ("bf16", "fp16", "fp32"), "shape": "GxMxNxK (G groups of M rows)", "parse": parse,
        "request": request,
        "device_libs": "the grouped GEMM kernel links ROCm's device libraries (ockl, for the grid size)"}

_GMM = ("torch/_inductor/kernel/mm_grouped.py::use_flydsl_grouped_mm_template + "
        "torch/_inductor/heuristics/template/flydsl.py::get_grouped_gemm_configs")


def build(p, dtype, torch_dtype, arch, autotune=False) -> XRayVerdict:
    """Inductor's verdict for grouped GEMM ``p`` (``g``, ``m``, ``n``, ``k``: G groups of M rows)
    in ``dtype`` on ``arch`` and, when eligible, one build per FlyDSL config torch would
    benchmark."""
    import torch
    from torch._inductor import config as icfg
    from torch._inductor.heuristics.template import flydsl as H
    from torch._inductor.kernel.mm_common import _fits_int32_buffer_span
    from torch._inductor.kernel.vendored_templates.flydsl import kernels as K

    g, mg, n, k = p["g"], p["m"], p["n"], p["k"]
    m = g * mg
    notes = [LAYOUT_NOTE,
             f"A is [G*M, K] = [{m}, {k}] row-major with int32 offs, B is [G, K, N] row-major "
             "(F.grouped_mm 2-D x 3-D, unscaled, no bias); the kernel is persistent and reads the group "
             "offsets at run time, so one kernel serves every split of the rows"]
    if arch != "gfx950":
        return XRayVerdict(False, f"target arch {arch}: FlyDSL grouped GEMM is gfx950 only", _GMM)
    dt = torch_dtype_named(torch_dtype)
    if dt not in (torch.float16, torch.bfloat16):
        return XRayVerdict(False, f"dtype {dtype}: FlyDSL grouped GEMM takes fp16/bf16", _GMM)
    if n % 32 or k % 32:
        return XRayVerdict(False, f"N={n}, K={k}: FlyDSL grouped GEMM needs N % 32 == 0 and K % 32 == 0", _GMM)
    spans = ((m, k, k), (g, k * n, k * n), (m, n, n))
    if not all(_fits_int32_buffer_span(r, s, c, dt.itemsize) for r, s, c in spans):
        return XRayVerdict(False, "operands do not fit 32-bit AMD buffer descriptor spans", _GMM)
    dtype_id = K.GEMM_DTYPE_FP16 if dt == torch.float16 else K.GEMM_DTYPE_BF16
    icfg.flydsl_enable_autotuning = bool(autotune)
    configs = H.get_grouped_gemm_configs()
    valid = [c for c in configs if H.is_grouped_gemm_config_valid_for_shape(m, n, k, dtype_id, c)]
    if not valid:
        return XRayVerdict(False, f"no FlyDSL grouped GEMM config is valid for M={m} (G={g} x {mg}), N={n}, "
                       f"K={k} ({len(configs)} considered; is_grouped_gemm_config_valid_for_shape)", _GMM,
                       notes=notes)
    builds = []
    for c in valid:
        kw = template_kwargs(K, c, dtype_id, k, False, False)
        param = K.make_gemm_param_and_validate(m, n, k, kw)
        cfg = {**c, **param_dict(param)}

        def compile_kernel(param=param):
            import flydsl.compiler as flyc
            import flydsl.expr as fx

            a = torch.empty((m, k), dtype=dt, device="meta")
            b = torch.empty((g, k, n), dtype=dt, device="meta")
            offs = torch.empty((g,), dtype=torch.int32, device="meta")
            out = torch.empty((m, n), dtype=dt, device="meta")
            args = tuple(flyc.from_torch_tensor(t).mark_layout_dynamic() for t in (out, a, b, offs))
            flyc.compile(K.launch_gemm_gfx950_grouped, *args, fx.Int32(g), fx.Int32(n), fx.Int32(k), 1,
                         param, 0)

        builds.append(("grouped mm", cfg, ("grouped", repr(param), arch), compile_kernel))
    reason = f"FlyDSL grouped GEMM template applies to G={g} x {mg}x{n}x{k} {dtype} on {arch}"
    return XRayVerdict(True, reason, _GMM, builds, notes)
