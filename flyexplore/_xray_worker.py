"""Subprocess side of the kernel X-ray (:mod:`flyexplore.xray`). Not a public module.

Run as ``python _xray_worker.py JOBS.json RESULTS.json`` by :func:`flyexplore.xray.xray_batch`,
in a fresh process whose environment already holds flydsl's compile-only switches
(``COMPILE_ONLY=1``, ``FLYDSL_GPU_ARCH``, ``FLYDSL_DUMP_IR=1``, ``FLYDSL_RUNTIME_ENABLE_CACHE=0``,
``ROCM_PATH``): torch's arch lookup and flydsl's settings are read once per process, so a fresh
process is the only way to get them right and to leave the user's caches alone.

For each job it asks torch 2.15's own dispatch predicates whether the case takes FlyDSL on the
target arch (under ``FakeTensorMode`` with ``device="cuda:0"`` tensors; no GPU is touched), and,
where it does, calls torch's own kernel builders with ``device="meta"`` tensors of the right
shapes, so flydsl compiles the very kernel torch would build and dumps its IR and ISA into a
folder per kernel (``FLYDSL_DUMP_DIR`` is set per build). Nothing here copies torch's code: it
imports and calls it. The file imports nothing from flyexplore so it runs by path.

Results are written after every job (atomically), so a timeout still leaves the finished ones.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time
import traceback

#: CU count that torch's TopK gate compares rows against (``_min_rows_for_full_wave`` reads it
#: from the device). MI355X and MI350X both have 256 CUs (ROCm "AMD GPU specifications" table).
GFX950_CUS = 256

_RMS = "torch/_native/ops/norm/flydsl_rmsnorm_impl.py::_fused_rms_norm_cond"
_TOPK = "torch/_native/ops/topk/flydsl_impl.py::_cond"
_MM = ("torch/_inductor/kernel/mm.py::get_flydsl_mm_template_kwargs + "
       "torch/_inductor/heuristics/template/flydsl.py::get_gemm_configs")
_MXFP = "torch/_inductor/kernel/mm.py::get_flydsl_mxfp_template_kwargs"
_GMM = ("torch/_inductor/kernel/mm_grouped.py::use_flydsl_grouped_mm_template + "
        "torch/_inductor/heuristics/template/flydsl.py::get_grouped_gemm_configs")


class Verdict:
    def __init__(self, eligible, reason, predicate, builds=(), notes=()):
        self.eligible = bool(eligible)
        self.reason = reason
        self.predicate = predicate
        self.builds = list(builds)      # [(family, config dict, spec key, build fn)]
        self.notes = list(notes)


def _dtype(name):
    import torch
    return getattr(torch, name)


def _fake_cuda():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _min_true(pred, lo=1, hi=(1 << 31) - 1):
    """Smallest x in [lo, hi] with pred(x) true for a predicate monotone in x; None if none."""
    if not pred(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


# ---------------------------------------------------------------------------------- RMSNorm
def _eps_value(eps) -> float:
    """The eps the kernel gets: ``eps``, or for None the fp32 machine epsilon, as torch's
    FlyDSL RMSNorm wrapper substitutes (``flydsl_rmsnorm_impl``, torch 2.15)."""
    import torch

    return float(torch.finfo(torch.float32).eps) if eps is None else float(eps)


def _rmsnorm(p, dtype, torch_dtype, arch):
    import torch
    from torch._native import flydsl_utils as fu
    from torch._native.ops.norm import flydsl_rmsnorm_impl as impl
    from torch._native.ops.norm.flydsl_rmsnorm_utils import SUPPORTED_DTYPES

    m, n, eps, has_w = p["m"], p["n"], p.get("eps", 1e-6), p.get("weight", True)
    dt = _dtype(torch_dtype)
    with _fake_cuda():
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
        need = _min_true(lambda mm: impl._fused_rms_norm_fwd_perf_wins(mm, n))
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
        return Verdict(False, reason, _RMS)

    def build():
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
    return Verdict(True, reason, _RMS, [("rmsnorm fwd", cfg, ("rmsnorm", n, torch_dtype, arch), build)],
                   ["the kernel is specialised on N and dtype only: every M with this N and dtype "
                    "runs the same kernel (M is a launch argument)"])


# ---------------------------------------------------------------------------------- TopK
def _topk(p, dtype, torch_dtype, arch):
    import torch
    from torch._native import flydsl_utils as fu
    from torch._native.ops.topk import flydsl_impl as impl

    impl._min_rows_for_full_wave = lambda device_index: GFX950_CUS
    m, n, k = p["m"], p["n"], p["k"]
    largest, sorted_, det = p.get("largest", True), p.get("sorted", True), p.get("deterministic", False)
    dt = _dtype(torch_dtype)
    with _fake_cuda():
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
    elif m < GFX950_CUS:
        reason = (f"M={m} rows is fewer than one row per CU ({GFX950_CUS} CUs on MI355X/MI350X): "
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
        return Verdict(False, reason, _TOPK)

    def build():
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
    return Verdict(True, reason, _TOPK, [(f"topk {family}", cfg, key, build)], notes)


# ---------------------------------------------------------------------------------- GEMM
_LAYOUT_NOTE = ("assumes torch.compile(mode='max-autotune') with FLYDSL in max_autotune_gemm_backends "
                "(torch._inductor.utils.use_flydsl_gemm_template); autotuning then picks between this "
                "FlyDSL candidate and ATen/Triton on the GPU: eligible is not chosen")


def _param_dict(param, names=("block_threads", "mma_m", "mma_n", "mma_k", "has_k_tail")):
    return {nm: getattr(param, nm) for nm in names if hasattr(param, nm)}


def _gemm(p, dtype, torch_dtype, arch, autotune):
    import torch
    from torch._inductor import config as icfg
    from torch._inductor.heuristics.template import flydsl as H
    from torch._inductor.kernel.mm_common import _fits_int32_buffer_span
    from torch._inductor.kernel.vendored_templates.flydsl import kernels as K

    m, n, k = p["m"], p["n"], p["k"]
    layout = p.get("layout", "NT")
    mxfp = dtype if dtype in ("mxfp8", "mxfp4") else None
    pred = _MXFP if mxfp else _MM
    notes = [_LAYOUT_NOTE]
    if arch != "gfx950":
        return Verdict(False, f"target arch {arch}: FlyDSL GEMM templates are gfx950 only "
                       "(use_flydsl_gemm_template)", pred)
    if mxfp:
        if layout != "NT":
            notes.append(f"layout {layout} given: Inductor's scaled_mm_v2 constraint makes MXFP operands "
                         "A row-major / B column-major (NT) before lowering, so the NT kernel is shown")
            layout = "NT"
        if k % 128:
            return Verdict(False, f"K={k}: FlyDSL MXFP GEMM needs K % 128 == 0", pred)
        if mxfp == "mxfp4" and k % 2:
            return Verdict(False, f"K={k}: MXFP4 packs two values a byte, K must be even", pred)
        in_bytes = 1 if mxfp == "mxfp8" else 0.5
        out_dt = torch.bfloat16
        notes.append("MXFP output dtype taken as bf16 (fp16 builds the same tiles with fp16 stores)")
    else:
        dt = _dtype(torch_dtype)
        if dt not in (torch.float16, torch.bfloat16):
            return Verdict(False, f"dtype {dtype}: FlyDSL GEMM templates take fp16/bf16 "
                           "(mxfp8/mxfp4 through scaled_mm)", pred)
        if k % 32:
            return Verdict(False, f"K={k}: FlyDSL GEMM needs K % 32 == 0", pred)
        in_bytes = dt.itemsize
        out_dt = dt
    a_t, b_t = layout[0] == "T", layout[1] == "T"
    kk = k // 2 if mxfp == "mxfp4" else k          # K as stored (MXFP4: two values a byte)
    item = 1 if mxfp else in_bytes                   # bytes per stored element
    a_span = (kk, m, m) if a_t else (m, kk, kk)      # (rows, leading stride, cols) as stored
    b_span = (n, kk, kk) if b_t else (kk, n, n)      # B is the logical [K, N] operand
    if (a_span[1] * item) % 16 or (b_span[1] * item) % 16:
        return Verdict(False, f"layout {layout}: a leading stride ({a_span[1]} or {b_span[1]} elements) "
                       "is not a multiple of 16 bytes; Inductor needs 16-byte aligned rows", pred)
    spans = ((*a_span, item), (*b_span, item), (m, n, n, out_dt.itemsize))
    if not all(_fits_int32_buffer_span(r, s, c, it) for r, s, c, it in spans):
        return Verdict(False, f"{m}x{n}x{k} does not fit 32-bit AMD buffer descriptor spans", pred)

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
        return Verdict(False, f"no FlyDSL {which} is valid for {m}x{n}x{k} layout {layout} "
                       f"({len(configs)} considered; torch/_inductor/heuristics/template/flydsl.py::"
                       "is_gemm_config_valid_for_shape)", pred, notes=notes)
    if autotune:
        notes.append(f"FlyDSL autotuning on: {len(valid)} candidate configs; the GPU benchmark picks one")
    else:
        notes.append("FlyDSL autotuning off (default): the single baseline config is the FlyDSL candidate")

    builds = []
    for c in valid:
        kw = {"dtype_id": dtype_id, "tile_m": c["TILE_M"], "tile_n": c["TILE_N"], "tile_k": c["TILE_K"],
              "stages": c["STAGES"], "m_waves": c["M_WAVES"], "n_waves": c["N_WAVES"],
              "group_m": c["GROUP_M"], "use_half_tile_interleaved": c["USE_HALF_TILE_INTERLEAVED"],
              "a_is_transposed": a_t, "b_is_transposed": b_t, "has_bias": False,
              "has_k_tail": K.infer_has_k_tail(k, c["TILE_K"], c["STAGES"], c["USE_HALF_TILE_INTERLEAVED"])}
        if out_id is not None:
            kw["out_dtype_id"] = out_id
        param = K.make_gemm_param_and_validate(m, n, k, kw)
        cfg = {**c, **_param_dict(param)}

        def build(param=param):
            import flydsl.compiler as flyc

            if mxfp:
                from torch._inductor.kernel.vendored_templates.flydsl.kernels.gemm_gfx950 import (
                    gemm_mxfp_gfx950 as kernel)
                u8 = torch.uint8
                a = torch.empty((m, kk), dtype=u8, device="meta")
                b = torch.empty((n, kk), dtype=u8, device="meta").t()
                sa = torch.empty((m, k // 32), dtype=u8, device="meta")
                sb = torch.empty((n, k // 32), dtype=u8, device="meta")
                out = torch.empty((m, n), dtype=out_dt, device="meta")
                tensors = (out, a, b, sa, sb, out)
            else:
                from torch._inductor.kernel.vendored_templates.flydsl.kernels.gemm_gfx950 import (
                    gemm_gfx950 as kernel)
                a = (torch.empty((k, m), dtype=out_dt, device="meta").t() if a_t
                     else torch.empty((m, k), dtype=out_dt, device="meta"))
                b = (torch.empty((n, k), dtype=out_dt, device="meta").t() if b_t
                     else torch.empty((k, n), dtype=out_dt, device="meta"))
                out = torch.empty((m, n), dtype=out_dt, device="meta")
                tensors = (out, a, b)
            args = tuple(flyc.from_torch_tensor(t).mark_layout_dynamic() for t in tensors)
            flyc.compile(kernel, *args, param, 0)

        fam = f"mm {mxfp}" if mxfp else "mm"
        builds.append((fam, cfg, ("gemm", repr(param), arch), build))
    reason = (f"FlyDSL {'MXFP ' if mxfp else ''}GEMM template applies to {m}x{n}x{k} {dtype} "
              f"layout {layout} on {arch}")
    return Verdict(True, reason, pred, builds, notes)


def _grouped(p, dtype, torch_dtype, arch, autotune):
    import torch
    from torch._inductor import config as icfg
    from torch._inductor.heuristics.template import flydsl as H
    from torch._inductor.kernel.mm_common import _fits_int32_buffer_span
    from torch._inductor.kernel.vendored_templates.flydsl import kernels as K

    g, mg, n, k = p["g"], p["m"], p["n"], p["k"]
    m = g * mg
    notes = [_LAYOUT_NOTE,
             f"A is [G*M, K] = [{m}, {k}] row-major with int32 offs, B is [G, K, N] row-major "
             "(F.grouped_mm 2-D x 3-D, unscaled, no bias); the kernel is persistent and reads the group "
             "offsets at run time, so one kernel serves every split of the rows"]
    if arch != "gfx950":
        return Verdict(False, f"target arch {arch}: FlyDSL grouped GEMM is gfx950 only", _GMM)
    dt = _dtype(torch_dtype)
    if dt not in (torch.float16, torch.bfloat16):
        return Verdict(False, f"dtype {dtype}: FlyDSL grouped GEMM takes fp16/bf16", _GMM)
    if n % 32 or k % 32:
        return Verdict(False, f"N={n}, K={k}: FlyDSL grouped GEMM needs N % 32 == 0 and K % 32 == 0", _GMM)
    spans = ((m, k, k), (g, k * n, k * n), (m, n, n))
    if not all(_fits_int32_buffer_span(r, s, c, dt.itemsize) for r, s, c in spans):
        return Verdict(False, "operands do not fit 32-bit AMD buffer descriptor spans", _GMM)
    dtype_id = K.GEMM_DTYPE_FP16 if dt == torch.float16 else K.GEMM_DTYPE_BF16
    icfg.flydsl_enable_autotuning = bool(autotune)
    configs = H.get_grouped_gemm_configs()
    valid = [c for c in configs if H.is_grouped_gemm_config_valid_for_shape(m, n, k, dtype_id, c)]
    if not valid:
        return Verdict(False, f"no FlyDSL grouped GEMM config is valid for M={m} (G={g} x {mg}), N={n}, "
                       f"K={k} ({len(configs)} considered; is_grouped_gemm_config_valid_for_shape)", _GMM,
                       notes=notes)
    builds = []
    for c in valid:
        kw = {"dtype_id": dtype_id, "tile_m": c["TILE_M"], "tile_n": c["TILE_N"], "tile_k": c["TILE_K"],
              "stages": c["STAGES"], "m_waves": c["M_WAVES"], "n_waves": c["N_WAVES"],
              "group_m": c["GROUP_M"], "use_half_tile_interleaved": c["USE_HALF_TILE_INTERLEAVED"],
              "a_is_transposed": False, "b_is_transposed": False, "has_bias": False,
              "has_k_tail": K.infer_has_k_tail(k, c["TILE_K"], c["STAGES"], c["USE_HALF_TILE_INTERLEAVED"])}
        param = K.make_gemm_param_and_validate(m, n, k, kw)
        cfg = {**c, **_param_dict(param)}

        def build(param=param):
            import flydsl.compiler as flyc
            import flydsl.expr as fx

            a = torch.empty((m, k), dtype=dt, device="meta")
            b = torch.empty((g, k, n), dtype=dt, device="meta")
            offs = torch.empty((g,), dtype=torch.int32, device="meta")
            out = torch.empty((m, n), dtype=dt, device="meta")
            args = tuple(flyc.from_torch_tensor(t).mark_layout_dynamic() for t in (out, a, b, offs))
            flyc.compile(K.launch_gemm_gfx950_grouped, *args, fx.Int32(g), fx.Int32(n), fx.Int32(k), 1,
                         param, 0)

        builds.append(("grouped mm", cfg, ("grouped", repr(param), arch), build))
    reason = f"FlyDSL grouped GEMM template applies to G={g} x {mg}x{n}x{k} {dtype} on {arch}"
    return Verdict(True, reason, _GMM, builds, notes)


# ---------------------------------------------------------------------------------- driver
def _verdict(job, arch):
    op, p, dtype, tdt = job["op"], job["params"], job["dtype"], job.get("torch_dtype")
    if op == "rmsnorm":
        return _rmsnorm(p, dtype, tdt, arch)
    if op == "topk":
        return _topk(p, dtype, tdt, arch)
    if op == "gemm":
        return _gemm(p, dtype, tdt, arch, job.get("autotune", False))
    if op == "grouped_gemm":
        return _grouped(p, dtype, tdt, arch, job.get("autotune", False))
    raise ValueError(f"unknown op {op!r}")


def _find_isa(folder):
    return sorted(glob.glob(os.path.join(folder, "*", "*_final_isa.s")))


def _run_job(i, job, arch, dump_root, done):
    v = _verdict(job, arch)
    res = {"eligible": v.eligible, "reason": v.reason, "predicate": v.predicate, "notes": v.notes,
           "kernels": []}
    forced = job.get("verdict")
    if forced is not None:
        res["torch_eligible"], res["torch_reason"] = v.eligible, v.reason
        res["eligible"], res["reason"] = bool(forced["eligible"]), forced["reason"]
        if bool(forced["eligible"]) != v.eligible:
            res["notes"].append(f"torch's own predicate ({v.predicate}) says "
                                f"{'eligible' if v.eligible else 'not eligible'}: {v.reason}")
    if not res["eligible"]:
        return res
    if not v.builds:
        res["error"] = f"no kernel to build: torch's own predicate ({v.predicate}) refuses this case"
        return res
    if job["op"] == "grouped_gemm" and not job.get("device_libs", True):
        res["error"] = ("the grouped GEMM kernel links ROCm's device libraries (ockl, for the grid size), "
                        "and none were found: apt-get install rocm-device-libs (Debian/Ubuntu), or set "
                        "FLYEXPLORE_ROCM_DEVICE_LIBS / ROCM_PATH to a ROCm install")
        return res
    for j, (family, cfg, key, build) in enumerate(v.builds):
        rec = {"family": family, "config": cfg}
        if key in done:
            rec.update(done[key], reused=True)
            res["kernels"].append(rec)
            continue
        folder = os.path.join(dump_root, f"job{i:04d}_{j:03d}")
        os.environ["FLYDSL_DUMP_DIR"] = folder
        t0 = time.perf_counter()
        try:
            build()
            rec["error"] = None
        except Exception as exc:  # a failed build is a result, not the end of the batch
            rec["error"] = f"{type(exc).__name__}: {exc}".strip()[:2000]
            rec["traceback"] = traceback.format_exc()[-4000:]
        rec["compile_s"] = time.perf_counter() - t0
        rec["isa"] = _find_isa(folder)
        rec["dump_dir"] = folder
        if not rec["isa"] and rec["error"] is None:
            rec["error"] = "flydsl wrote no final ISA (is the kernel cache disabled and FLYDSL_DUMP_IR set?)"
        done[key] = {k: rec[k] for k in ("compile_s", "isa", "dump_dir", "error")}
        res["kernels"].append(rec)
    return res


def _write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main(argv):
    jobs_path, results_path = argv
    with open(jobs_path) as f:
        spec = json.load(f)
    arch = spec["arch"]
    t0 = time.perf_counter()
    import torch  # noqa: F401  (import cost is reported separately from compile time)
    import flydsl
    out = {"versions": {"torch": torch.__version__, "flydsl": getattr(flydsl, "__version__", "?")},
           "import_s": time.perf_counter() - t0, "results": []}
    done = {}
    for i, job in enumerate(spec["jobs"]):
        try:
            res = _run_job(i, job, arch, spec["dump_root"], done)
        except Exception as exc:
            res = {"eligible": False, "reason": None, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-4000:], "kernels": [], "notes": []}
        out["results"].append(res)
        _write(results_path, out)
    _write(results_path, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
