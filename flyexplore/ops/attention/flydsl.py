"""Attention's FlyDSL path: SDPA on ROCm -> AOTriton, whose tuning table picks Triton, aiter or
FlyDSL ("flyc", first in AOTriton 0.14). What can be said before running an SDPA call
(:func:`explain_attention`); what really ran is read from the trace
(:mod:`flyexplore.ops.attention.aotriton`). Registered as ``ATTENTION.flydsl`` (:mod:`flyexplore.ops.attention.operator`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import get_op
from flyexplore.ops.attention import aotriton as A
from flyexplore.ops.attention import sdpa as OA
from flyexplore.ops.attention.aotriton import aotriton_trace_columns
from flyexplore.ops.base import FlyDSLPath
from flyexplore.world import env as ENV
from flyexplore.world.conditions import Condition, Explanation, cond
from flyexplore.world.readiness import FLYDSL_ARCH, check_arch
from flyexplore.world.switches import rocm_fa_library

#: The path an SDPA call takes to FlyDSL.
ATTENTION_PATH = ("F.scaled_dot_product_attention -> SDPA flash / efficient -> AOTriton (ROCm) -> "
                  "AOTriton's tuning table picks Triton, aiter or FlyDSL (flyc)")
#: ``key=value`` options of ``flyexplore explain --op attention --opt``.
ATTENTION_OPTIONS = ("backend", "fa_library", "device")
_FA_LIBRARIES = ("aotriton", "ck", "default")
_SDPA_BY_INDEX = {-1: "error", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
_AOT = "ROCm/aotriton (see flyexplore/ops/attention/aotriton.py for tags and files)"


@dataclass(frozen=True)
class AttentionExplanation(Explanation):
    """The answer for one SDPA call: can AOTriton's FlyDSL kernels run it? (:func:`explain_attention`).

    ``verdict``: ``"eligible"`` (every condition holds: AOTriton would be called and builds a
    FlyDSL kernel for the call -- whether it runs is AOTriton's tuning table's choice, which
    nothing outside AOTriton can read), ``"not eligible"`` (a condition fails) or
    ``"unverified"`` (nothing fails, but a condition could not be evaluated here, typically
    torch's SDPA checks away from the ROCm GPU). ``taken`` is True exactly when eligible.
    ``sdpa``: what torch said on the device (``choice``, ``priority``, ``reasons`` per
    backend), ``None`` when not asked."""

    sdpa: dict | None = None

    @property
    def verdict(self) -> str:
        if any(c.ok is False for c in self.conditions):
            return "not eligible"
        return "eligible" if all(c.ok is True for c in self.conditions) else "unverified"

    @property
    def reason(self) -> str:
        v = self.verdict
        if v == "eligible":
            return f"FlyDSL eligible ({self.kernel}); AOTriton's tuning table decides whether it runs"
        if v == "not eligible":
            return "not eligible: " + "; ".join(c.detail for c in self.failed)
        return "unverified: " + "; ".join(c.detail for c in self.conditions if c.ok is None)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verdict": self.verdict, "sdpa": self.sdpa}

    def to_text(self) -> str:
        lines = [f"{self.op}: AOTriton FlyDSL {self.verdict.upper()} -- {self.path}"]
        if self.assumed:
            lines.append(f"assumed: {self.assumed}")
        lines.append("arguments: " + ", ".join(f"{k}={v}" for k, v in self.arguments.items()))
        if self.kernel:
            lines.append(f"FlyDSL kernels for this call: {self.kernel}")
        for kind in ("environment", "switch", "call"):
            cs = [c for c in self.conditions if c.kind == kind]
            if cs:
                lines.append(f"{kind}:")
            for c in cs:
                mark = {True: "ok ", False: "NO ", None: " ? "}[c.ok]
                lines.append(f"  [{mark}] {c.detail}")
                lines.append(f"         ({c.source})")
        lines.append(f"verdict: {self.reason}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def _sdpa_on_device(case, dtype: str, backend: str, device) -> dict:
    """torch's own answer on this GPU: the backend ``torch._fused_sdp_choice`` picks for the
    call (under ``backend``'s restriction, the flash-attention library pinned as the catalogue
    backend pins it) and the refusal reasons of flash / efficient
    (:func:`flyexplore.ops.attention.operator.explain`: ``can_use_*_attention(debug=True)``)."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel


    q, k, v = OA._probe_tensors(case, dtype, device)
    gqa = OA.kv_heads(case) != case["h"]
    with contextlib.ExitStack() as st:
        if backend != "default":
            st.enter_context(OA._rocm_library(backend, "rocm"))
            st.enter_context(sdpa_kernel([getattr(SDPBackend, OA._SDP_NAMES[backend])]))
        try:
            choice = _SDPA_BY_INDEX.get(int(torch._fused_sdp_choice(
                q, k, v, attn_mask=None, dropout_p=0.0, is_causal=case["causal"], enable_gqa=gqa)), "?")
        except RuntimeError as exc:
            choice = f"none ({str(exc).strip().splitlines()[0]})"
    reasons = {b: OA.explain(b, case, dtype, device, "rocm") for b in ("flash", "efficient")}
    prio = getattr(torch._C, "_get_sdp_priority_order", None)
    order = [_SDPA_BY_INDEX.get(int(i), str(i)) for i in prio()] if prio else None
    return {"choice": choice, "priority": order, "reasons": reasons}


def explain_attention(shape: str, dtype: str | None = None, *, backend: str = "default",
                      fa_library: str | None = None, arch: str | None = None, aotriton: str | None = None,
                      assume_rocm: bool = False, device: str | None = None) -> AttentionExplanation:
    """What can be said before running about an SDPA call and AOTriton's FlyDSL kernels.

    ``shape``: the attention catalogue's text, ``BxHxSQxSKVxD[:causal=1,hkv=N,bwd]``; ``dtype``:
    bf16 (default), fp16 or fp32; ``backend``: the catalogue's SDPA backend (``default`` = no
    restriction, ``flash``, ``efficient``, ``ck``, ``math``, ``cudnn``); ``fa_library``: a
    what-if for ``torch.backends.cuda.preferred_rocm_fa_library`` (``aotriton``, ``ck``,
    ``default``; default: this process's).

    Judged against this process (a ROCm torch on its GPU: torch's own SDPA checks are run on the
    device), or as a what-if when ``arch`` or ``assume_rocm`` is given: a ROCm build of torch
    on ``arch`` (default gfx950) with AOTriton ``aotriton`` (``0.14.2``, ``0.13b``, ...; default
    the bundled version, else 0.14.2, which torch main pins); torch's SDPA checks then stay
    unevaluated (they need the device), so the verdict is at best ``unverified``.

    Conditions (each with its source): ROCm build; AOTriton bundled and its version; the version
    has the flyc backend (0.14 and later); the arch is one AOTriton builds FlyDSL for (gfx950,
    gfx1201); the SDPA backend reaches AOTriton (flash / efficient / default, not ck / math /
    cudnn) and the flash-attention library is AOTriton, not CK; torch's SDPA pick on the
    device; dtype fp16 / bf16; the head dim's rung (AOTriton rounds it up to its compiled head
    dims) has a FlyDSL kernel for the pass (:mod:`flyexplore.ops.attention.aotriton`). The notes say plainly
    that the final choice is AOTriton's tuning table, and what 0.13b would run. Raises
    :class:`UsageError` for a bad shape, dtype, backend, library, arch or version."""

    op = get_op("attention")
    case = op.case(shape)
    dt = op.check_dtype(dtype or op.dtypes[0])
    if backend not in op.backends:
        raise bad_choice("attention backend", backend, list(op.backends))
    if fa_library is not None and fa_library not in _FA_LIBRARIES:
        raise bad_choice("ROCm flash-attention library", fa_library, _FA_LIBRARIES)
    check_arch(arch)
    if aotriton is not None and A.parse_version(aotriton) is None:
        raise UsageError(f"bad AOTriton version {aotriton!r} (expected e.g. 0.14.2, 0.14.2b or 0.13b)")
    env = ENV.collect()
    p = case.p
    pas, d = p["pass"], p["d"]
    what_if = assume_rocm or arch is not None
    bundled = env.versions.get("aotriton")
    bundled = bundled if A.parse_version(bundled) else None
    if what_if:
        rocm, dev_arch = True, arch or FLYDSL_ARCH
        ver = aotriton or bundled or A.PINNED_BY_TORCH_MAIN
        src = "given" if aotriton else ("bundled with this torch" if bundled else "the version torch main pins")
        assumed = (f"a ROCm build of torch on {dev_arch} with AOTriton {A.release_name(ver)} ({src}); "
                   "torch's SDPA checks not run (they need the device)")
    else:
        rocm = env.platform == "rocm"
        dev_arch = env.device.arch if rocm else None
        ver = aotriton or env.versions.get("aotriton") or "not present"
        assumed = f"AOTriton {A.release_name(ver)} (given)" if aotriton else None
    rel = A.release_name(ver)
    conds: list[Condition] = []
    conds.append(cond("ROCm build", rocm, "ROCm build of torch: SDPA's flash and efficient backends call AOTriton" if rocm
                    else f"torch {env.versions.get('torch')} is not a ROCm build ({env.platform}): SDPA never calls "
                         "AOTriton (ask a what-if with --arch gfx950)",
                    "torch.version.hip; torch.backends.cuda.preferred_rocm_fa_library (AOTriton by default)", "environment"))
    present = A.parse_version(ver) is not None
    conds.append(cond("AOTriton bundled", present, f"AOTriton {rel} (libaotriton_v2.so.{'.'.join(map(str, A.parse_version(ver)))})"
                    if present else f"no AOTriton version found ({ver})",
                    "flyexplore.world.env.aotriton_version: the bundled torch/lib/libaotriton_v2.so.X.Y.Z", "environment"))
    flyc = A.has_flyc(ver)
    conds.append(cond("AOTriton has flyc", flyc if present else None,
                    f"AOTriton {rel} has the FlyDSL (flyc) backend" if flyc else
                    (f"AOTriton {rel} has no FlyDSL backend: 0.13b has Triton and aiter only; flyc is new in 0.14b"
                     if present else "AOTriton version unknown"),
                    f"{_AOT}: tag 0.13b modules/flash/aot/__init__.py; PR 230 (flyc = op_attn_fwd backend 2, "
                    "op_attn_bwd backend 3); pytorch/pytorch PR 197747", "environment"))
    arch_ok = None if not dev_arch else (dev_arch, pas) in A.FLYC_HEAD_DIMS
    conds.append(cond("arch", arch_ok, f"{dev_arch} is an arch AOTriton builds FlyDSL kernels for" if arch_ok else
                    (f"AOTriton builds FlyDSL kernels for gfx950 and gfx1201 only, not {dev_arch}" if dev_arch
                     else "no ROCm device: arch unknown"),
                    "modules/flash/aot/flyc_attn_fwd.py::_FLYC_FWD_LADDERS (0.14 cycle)", "environment"))
    reaches = backend in ("default", "flash", "efficient")
    conds.append(cond("SDPA backend", reaches, f"SDPA backend {backend}: " + (
        "flash and efficient are AOTriton on ROCm" if reaches else
        {"ck": "Composable Kernel, not AOTriton", "math": "the unfused composition, no AOTriton",
         "cudnn": "cuDNN (NVIDIA only), no AOTriton"}.get(backend, "not AOTriton")),
        "torch.nn.attention.sdpa_kernel; flyexplore.ops.attention.operator", "switch"))
    if backend in ("flash", "efficient"):
        lib, lib_src = "aotriton", "pinned by flyexplore's flash/efficient backends"
    else:
        lib = fa_library or (rocm_fa_library() if rocm and not what_if else None) or "default"
        lib_src = "given" if fa_library else "this process's preference"
    lib_ok = None if backend not in ("default", "flash", "efficient") else lib != "ck"
    conds.append(cond("flash-attention library", lib_ok,
                    f"preferred_rocm_fa_library {lib!r} ({lib_src}): " +
                    ("CK runs flash and efficient, not AOTriton" if lib == "ck" else "AOTriton runs flash and efficient"),
                    "torch.backends.cuda.preferred_rocm_fa_library (TORCH_ROCM_FA_PREFER_CK=1 sets 'ck')", "switch"))
    sdpa = None
    if rocm and not what_if and backend in ("default", "flash", "efficient"):
        try:
            sdpa = _sdpa_on_device(case, dt, backend, device or "cuda:0")
            pick = sdpa["choice"]
            ok = pick in ("flash", "efficient")
            why = "; ".join(f"{b}: {r}" for b, r in sdpa["reasons"].items() if r)
            detail = (f"torch picks SDPA backend {pick} on this GPU" + (" (AOTriton, unless CK is preferred)" if ok else
                      ", not AOTriton" + (f" -- {why}" if why else "")))
        except Exception as exc:  # no device or an old torch: say so, never guess
            ok, detail = None, f"torch's SDPA choice could not be asked on this device ({type(exc).__name__}: {exc})"
    elif not reaches:
        ok, detail = None, "torch's SDPA choice not asked: the backend is not AOTriton"
    else:
        import torch
        prio = getattr(torch._C, "_get_sdp_priority_order", None)
        order = ", ".join(_SDPA_BY_INDEX.get(int(i), str(i)) for i in prio()) if prio else "flash, efficient, math"
        ok, detail = None, ("not evaluated here: torch's can_use_flash_attention / can_use_efficient_attention judge "
                            f"tensors on the ROCm GPU (SDPA tries its backends in the order {order})")
    conds.append(cond("SDPA picks AOTriton", ok, detail,
                    "torch._fused_sdp_choice; torch.backends.cuda.can_use_flash_attention / "
                    "can_use_efficient_attention(debug=True); torch._C._get_sdp_priority_order", "call"))
    conds.append(cond("dtype", dt in A.FLYC_DTYPES, f"dtype {dt}: " + ("AOTriton's FlyDSL kernels take fp16/bf16"
                    if dt in A.FLYC_DTYPES else "AOTriton's FlyDSL kernels take fp16/bf16 only (fp32 stays on Triton)"),
                    "modules/flash/aot/flyc_attn_fwd.py (f16/bf16); PR 239 (flyc only for non-fp32)", "call"))
    rung = A.head_dim_rung(d, dev_arch, pas) if dev_arch else A.head_dim_rung(d, None, pas)
    what = "forward" if pas == "fwd" else "backward"
    if rung is None:
        hd_ok, hd = False, f"head dim {d} > 512: AOTriton has no kernel for it"
    elif not arch_ok:
        hd_ok, hd = None, f"head dim {d} -> rung {rung}; the FlyDSL head dims depend on the arch"
    else:
        ladder = A.FLYC_HEAD_DIMS[(dev_arch, pas)]
        hd_ok = rung in ladder
        hd = (f"head dim {d} -> rung {rung}" + ("" if rung == d else " (padded)") +
              (f": AOTriton builds a FlyDSL {what} kernel for it on {dev_arch}" if hd_ok else
               f": no FlyDSL {what} kernel on {dev_arch} (FlyDSL rungs {', '.join(map(str, sorted(ladder)))})"))
    conds.append(cond("head dim", hd_ok, hd, "include/aotriton/_internal/util.h::round_value + attn_fwd.cc / attn_bwd.cc "
                    "(gfx950 fixes); flyc_attn_fwd.py / flyc_bwd_dkdv.py / flyc_bwd_dq.py head-dim ladders", "call"))
    notes = ["the final choice is AOTriton's: its operator tuning table (lookup_optimal in "
             "modules/flash/csrc/attn_fwd.cc) picks Triton, aiter or FlyDSL per arch, dtype, head-dim rung, causal "
             "and binned sequence lengths; torch has no switch for it (attn_options.force_backend_index is not "
             "reachable from SDPA); in the shipped 0.14 schedule short sequences fall back to Triton "
             "(flyc_attn_fwd.py)"]
    if dev_arch:
        ai, ai_why = A.aiter_support(dev_arch, dt, d, pas)
        notes.append("AOTriton 0.13b (no flyc) runs its Triton kernels here" +
                     (f", or aiter ({ai_why})" if ai else "") + "; a 0.13b vs 0.14.2b A/B shows the difference "
                     "(flyexplore.results.aotriton_ab.ab_view; fx.aotriton_ab in a notebook)")
    if pas == "bwd":
        notes.append("the FlyDSL backward is a metro: Triton bwd_preprocess, then flyc_bwd_dkdv and flyc_bwd_dq "
                     "(flyc_bwd_dkdv.py), so a trace shows AOTriton[FlyDSL] and AOTriton[Triton]")
    notes.append("what really ran: `flyexplore trace --op attention --shape ... --backend default` on the ROCm "
                 "machine; its observed column shows AOTriton[FlyDSL], AOTriton[Triton] or AOTriton[aiter]")
    args = {"shape": case.label, "dtype": dt, "pass": pas, "head_dim": d, "rung": rung, "arch": dev_arch,
            "aotriton": rel, "backend": backend}
    call_ok = all(c.ok is True for c in conds if c.name in ("AOTriton has flyc", "arch", "dtype", "head dim"))
    return AttentionExplanation("attention", ATTENTION_PATH, args, tuple(conds),
                                A.FLYC_KERNELS[pas] if call_ok else None, tuple(notes), assumed, sdpa)


def explain_attention_options(shape: str, dtype: str | None = None, options: Mapping[str, Any] | None = None,
                              **kw) -> AttentionExplanation:
    """:func:`explain_attention` with ``--opt`` style options (:data:`ATTENTION_OPTIONS`: ``backend``,
    ``fa_library``, ``device``). Raises :class:`UsageError` for an unknown option."""
    opts = dict(options or {})
    for k in opts:
        if k not in ATTENTION_OPTIONS:
            raise bad_choice("explain option for attention", k, ATTENTION_OPTIONS)
    return explain_attention(shape, dtype, **{k: str(v) for k, v in opts.items()}, **kw)


def trace_columns(tr, case, dtype: str) -> dict:
    """``flydsl_taken`` / ``flydsl_reason`` of a traced attention row: what AOTriton ran
    (:func:`flyexplore.ops.attention.aotriton.aotriton_trace_columns`)."""
    return aotriton_trace_columns(tr, case, dtype)


FLYDSL = FlyDSLPath(
    route="aotriton",
    path=ATTENTION_PATH,
    options=ATTENTION_OPTIONS,
    example="1x16x4096x4096x128:causal=1",
    explain_text=explain_attention_options,
    trace_columns=trace_columns,
    kernel_table=A.flyc_table,
)
