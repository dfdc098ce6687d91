"""Kernel X-ray of the dense GEMM family (:mod:`flyexplore.insight.xray`): the Inductor template's own
steps -- ``torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs`` and
``is_gemm_config_valid_for_shape``, ``vendored_templates/flydsl/kernels::make_gemm_param_and_validate``,
then ``flyc.compile(gemm_gfx950 | gemm_mxfp_gfx950, ...)`` as ``kernel/templates/flydsl_mm.py.jinja``
does in its own compile-only precompile path -- called, never copied. The shape/layout/dtype rules
of ``get_flydsl_mm_template_kwargs`` are re-derived for contiguous inputs (each names its torch
function). ``mxfp8``/``mxfp4`` are the MXFP GEMMs ``scaled_gemm`` lowers to.

:func:`build` runs in the X-ray's worker process (``flyexplore/insight/_xray_worker.py``); :data:`XRAY`
is what :mod:`flyexplore.insight.xray` reads about the family.
"""
from __future__ import annotations

from flyexplore.ops.xray_kit import XRayVerdict, torch_dtype_named

MXFP = ("mxfp8", "mxfp4")


def explain_request(label: str, params: dict, dtype: str) -> tuple[str, str, str]:
    """The explainer's question for an X-ray GEMM request: an MXFP GEMM is judged as the
    ``scaled_gemm`` it lowers from (block scaling, NT), the others as ``gemm``."""
    if dtype in MXFP:
        return "scaled_gemm", f"{params['m']}x{params['n']}x{params['k']}", dtype
    return "gemm", label, dtype


#: The family's X-ray spec (keys described in :func:`flyexplore.insight.xray.xray_spec`).
XRAY = {"dtypes": ("bf16", "fp16", "fp32", *MXFP), "shape": "MxNxK[:NN|NT|TN|TT]",
        "explain": explain_request}

_MM = ("torch/_inductor/kernel/mm.py::get_flydsl_mm_template_kwargs + "
       "torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs")
_MXFP = "torch/_inductor/kernel/mm.py::get_flydsl_mxfp_template_kwargs"

LAYOUT_NOTE = ("assumes torch.compile(mode='max-autotune') with FLYDSL in max_autotune_gemm_backends "
               "(torch._inductor.utils.use_flydsl_gemm_template); autotuning then picks between this "
               "FlyDSL candidate and ATen/Triton on the GPU: eligible is not chosen")


def param_dict(param, names=("block_threads", "mma_m", "mma_n", "mma_k", "has_k_tail")) -> dict:
    """The FlyDSL GEMM param fields shown beside a config (threads per block, MFMA shape, K tail)."""
    return {nm: getattr(param, nm) for nm in names if hasattr(param, nm)}


def template_kwargs(K, c: dict, dtype_id, k: int, a_t: bool, b_t: bool) -> dict:
    """The vendored gemm_gfx950 module ``K``'s parameters for Inductor config ``c`` (``TILE_M``,
    ``TILE_N``, ``TILE_K``, ``STAGES``, ``M_WAVES``, ``N_WAVES``, ``GROUP_M``,
    ``USE_HALF_TILE_INTERLEAVED``), K and the operands' transposition; no bias. Shared with
    the grouped GEMM builder (:mod:`flyexplore.ops.grouped_gemm.xray`)."""
    return {"dtype_id": dtype_id, "tile_m": c["TILE_M"], "tile_n": c["TILE_N"], "tile_k": c["TILE_K"],
            "stages": c["STAGES"], "m_waves": c["M_WAVES"], "n_waves": c["N_WAVES"],
            "group_m": c["GROUP_M"], "use_half_tile_interleaved": c["USE_HALF_TILE_INTERLEAVED"],
            "a_is_transposed": a_t, "b_is_transposed": b_t, "has_bias": False,
            "has_k_tail": K.infer_has_k_tail(k, c["TILE_K"], c["STAGES"], c["USE_HALF_TILE_INTERLEAVED"])}


def build(p, dtype, torch_dtype, arch, autotune=False) -> XRayVerdict:
    """Inductor's verdict for GEMM ``p`` (``m``, ``n``, ``k``, ``layout``) in ``dtype`` (fp16/bf16,
    or ``mxfp8``/``mxfp4`` as scaled_mm lowers them) on ``arch`` and, when eligible, one build per
    FlyDSL config torch would benchmark (the baseline config, or every autotuning candidate)."""
    import torch
    from torch._inductor import config as icfg
    from torch._inductor.heuristics.template import flydsl as H
    from torch._inductor.kernel.mm_common import _fits_int32_buffer_span
    from torch._inductor.kernel.vendored_templates.flydsl import kernels as K

    m, n, k = p["m"], p["n"], p["k"]
    layout = p.get("layout", "NT")
    mxfp = dtype if dtype in MXFP else None
    pred = _MXFP if mxfp else _MM
    notes = [LAYOUT_NOTE]
    if arch != "gfx950":
        return XRayVerdict(False, f"target arch {arch}: FlyDSL GEMM templates are gfx950 only "
                       "(use_flydsl_gemm_template)", pred)
    if mxfp:
        if layout != "NT":
            notes.append(f"layout {layout} given: Inductor's scaled_mm_v2 constraint makes MXFP operands "
                         "A row-major / B column-major (NT) before lowering, so the NT kernel is shown")
            layout = "NT"
        if k % 128:
            return XRayVerdict(False, f"K={k}: FlyDSL MXFP GEMM needs K % 128 == 0", pred)
        if mxfp == "mxfp4" and k % 2:
            return XRayVerdict(False, f"K={k}: MXFP4 packs two values a byte, K must be even", pred)
        in_bytes = 1 if mxfp == "mxfp8" else 0.5
        out_dt = torch.bfloat16
        notes.append("MXFP output dtype taken as bf16 (fp16 builds the same tiles with fp16 stores)")
    else:
        dt = torch_dtype_named(torch_dtype)
        if dt not in (torch.float16, torch.bfloat16):
            return XRayVerdict(False, f"dtype {dtype}: FlyDSL GEMM templates take fp16/bf16 "
                           "(mxfp8/mxfp4 through scaled_mm)", pred)
        if k % 32:
            return XRayVerdict(False, f"K={k}: FlyDSL GEMM needs K % 32 == 0", pred)
        in_bytes = dt.itemsize
        out_dt = dt
    a_t, b_t = layout[0] == "T", layout[1] == "T"
    kk = k // 2 if mxfp == "mxfp4" else k          # K as stored (MXFP4: two values a byte)
    item = 1 if mxfp else in_bytes                   # bytes per stored element
    a_span = (kk, m, m) if a_t else (m, kk, kk)      # (rows, leading stride, cols) as stored
    b_span = (n, kk, kk) if b_t else (kk, n, n)      # B is the logical [K, N] operand
    if (a_span[1] * item) % 16 or (b_span[1] * item) % 16:
        return XRayVerdict(False, f"layout {layout}: a leading stride ({a_span[1]} or {b_span[1]} elements) "
                       "is not a multiple of 16 bytes; Inductor needs 16-byte aligned rows", pred)
    spans = ((*a_span, item), (*b_span, item), (m, n, n, out_dt.itemsize))
    if not all(_fits_int32_buffer_span(r, s, c, it) for r, s, c, it in spans):
        return XRayVerdict(False, f"{m}x{n}x{k} does not fit 32-bit AMD buffer descriptor spans", pred)

    if mxfp:
        dtype_id = K.GEMM_DTYPE_MXFP8 if mxfp == "mxfp8" else K.GEMM_DTYPE_MXFP4
        out_id = K.GEMM_DTYPE_BF16
        validity = {"out_dtype_id": out_id, "has_bias": False}
    else:
        dtype_id = K.GEMM_DTYPE_FP16 if out_dt == torch.float16 else K.GEMM_DTYPE_BF16
        out_id = None
        validity = {}
    icfg.flydsl_enable_autotuning = bool(autotune)
    configs = H.get_gemm_configs(m, n, k, mxfp)
    valid = [c for c in configs if H.is_gemm_config_valid_for_shape(
        m, n, k, dtype_id, c, a_is_transposed=a_t, b_is_transposed=b_t, **validity)]
    if not valid:
        which = "autotuning candidate" if autotune else "baseline config (autotuning off)"
        return XRayVerdict(False, f"no FlyDSL {which} is valid for {m}x{n}x{k} layout {layout} "
                       f"({len(configs)} considered; torch/_inductor/heuristics/template/flydsl.py::"
                       "is_gemm_config_valid_for_shape)", pred, notes=notes)
    if autotune:
        notes.append(f"FlyDSL autotuning on: {len(valid)} candidate configs; the GPU benchmark picks one")
    else:
        notes.append("FlyDSL autotuning off (default): the single baseline config is the FlyDSL candidate")

    builds = []
    for c in valid:
        kw = template_kwargs(K, c, dtype_id, k, a_t, b_t)
        if out_id is not None:
            kw["out_dtype_id"] = out_id
        param = K.make_gemm_param_and_validate(m, n, k, kw)
        cfg = {**c, **param_dict(param)}

        def compile_kernel(param=param):
            import flydsl.compiler as flyc

            if mxfp:
                from torch._inductor.kernel.vendored_templates.flydsl.kernels.gemm_gfx950 import (
                    gemm_mxfp_gfx950 as kernel,
                )
                u8 = torch.uint8
                a = torch.empty((m, kk), dtype=u8, device="meta")
                b = torch.empty((n, kk), dtype=u8, device="meta").t()
                sa = torch.empty((m, k // 32), dtype=u8, device="meta")
                sb = torch.empty((n, k // 32), dtype=u8, device="meta")
                out = torch.empty((m, n), dtype=out_dt, device="meta")
                tensors = (out, a, b, sa, sb, out)
            else:
                from torch._inductor.kernel.vendored_templates.flydsl.kernels.gemm_gfx950 import gemm_gfx950 as kernel
                a = (torch.empty((k, m), dtype=out_dt, device="meta").t() if a_t
                     else torch.empty((m, k), dtype=out_dt, device="meta"))
                b = (torch.empty((n, k), dtype=out_dt, device="meta").t() if b_t
                     else torch.empty((k, n), dtype=out_dt, device="meta"))
                out = torch.empty((m, n), dtype=out_dt, device="meta")
                tensors = (out, a, b)
            args = tuple(flyc.from_torch_tensor(t).mark_layout_dynamic() for t in tensors)
            flyc.compile(kernel, *args, param, 0)

        fam = f"mm {mxfp}" if mxfp else "mm"
        builds.append((fam, cfg, ("gemm", repr(param), arch), compile_kernel))
    reason = (f"FlyDSL {'MXFP ' if mxfp else ''}GEMM template applies to {m}x{n}x{k} {dtype} "
              f"layout {layout} on {arch}")
    return XRayVerdict(True, reason, pred, builds, notes)
