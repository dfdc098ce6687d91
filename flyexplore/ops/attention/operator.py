"""Attention: ``torch.nn.functional.scaled_dot_product_attention`` (SDPA), forward or backward.

Shape ``BxHxSQxSKVxD``: batch, query heads, query length, key/value length, head dimension.
Options: ``hkv`` (key/value heads for grouped-query attention; 0 = H, plain multi-head; a value
equal to H is stored as 0 so labels stay canonical), ``causal`` (``is_causal=True``; needs
SQ == SKV, because SDPA aligns its causal mask to the top-left corner -- a decode step with
SQ=1 would see only the first key -- so decode-like shapes use causal=0), ``pass`` (``fwd``:
time the forward; ``bwd``: time ``torch.autograd.grad`` of the output for q, k, v after one
forward -- the backward alone, run on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``) so that the profiler attributes its GPU
kernels to the timed call). Inputs q [B, H, SQ, D], k and v [B, HKV, SKV, D], and for ``bwd``
a gradient dO [B, H, SQ, D], all seeded N(0, 1); GQA uses ``enable_gqa=True``.

FLOPs by the usual convention: forward 4*B*H*SQ*SKV*D, halved when causal; backward 2.5x
the forward. Bytes: forward (q + o) + (k + v) = 2*B*H*SQ*D + 2*B*HKV*SKV*D elements; backward
reads q, k, v, o, dO and writes dq, dk, dv: 4*B*H*SQ*D + 4*B*HKV*SKV*D elements (the
log-sum-exp is ignored).

Reference: softmax(q k^T / sqrt(D) + causal mask) v in float64 (CPU) or float32 (GPU), with
k and v repeated per query group; for ``bwd`` the gradients from the same float64/float32
graph, concatenated (dq, dk, dv) into one flat tensor. ``err_rel`` for ``bwd`` is the largest
of the three gradients' relative errors.

Check (:func:`error`): every element within a first-order running error bound (each operation
of the attention graph contributes its rounding times the same graph evaluated on absolute
values; J. H. Wilkinson's running error analysis, Higham 2002 section 3.3), times 2:

- forward: ``u_out |O| + (u_in + gamma_SKV(u_acc) + ds_i) (P |V|)``, where ``P |V|`` bounds
  every term of the output's sum, ``u_in`` covers P rounded to the input dtype before the
  second GEMM (FlashAttention-2, AOTriton), ``ds_i = 2 gamma_{D+2}(u_acc) max_j (|q_i||k_j|)/sqrt(D)``
  the error of the scores (exact products of fp16/bf16 inputs, fp32 sums) carried through
  the softmax;
- backward: ``u_out |dX| + (3 u_in + gamma_L(u_acc) + ds) |dX|_abs`` for dX in dq, dk, dv, with
  L = SQ + SKV + D and ``|dX|_abs`` the gradient graph on absolute values (dS_abs =
  P (|dO||V|^T + rowsum(|dO| P|V|)); dq_abs = dS_abs |K| / sqrt(D), dk_abs = dS_abs^T |Q| /
  sqrt(D), dv_abs = P^T |dO|, summed over the query heads of a GQA group).

u_acc is fp32's, u_in and u_out the input dtype's, and the reference's own rounding
(float32 on GPU) is added the same way. The backward bound is loose in bf16 (it allows about
1.5x the median gradient element): it catches gross errors (a zeroed, swapped or doubled
row) rather than small ones. ``err_row_max_rel`` is the worst row (one query, or one key for
dk/dv), ``err_block_max_rel`` the worst head.

Backends -- one per SDPA backend, each run with ``torch.nn.attention.sdpa_kernel`` restricted
to it, or recorded unavailable with torch's own reason:

- ``flash``: ``SDPBackend.FLASH_ATTENTION`` (FlashAttention-2 on NVIDIA; AOTriton on ROCm, with
  ``torch.backends.cuda.preferred_rocm_fa_library("aotriton")``; the CPU flash kernel on CPU).
- ``efficient``: ``SDPBackend.EFFICIENT_ATTENTION`` (memory-efficient attention on NVIDIA;
  AOTriton on ROCm; not on CPU).
- ``cudnn``: ``SDPBackend.CUDNN_ATTENTION`` (NVIDIA only).
- ``ck``: ``SDPBackend.FLASH_ATTENTION`` with ``preferred_rocm_fa_library("ck")`` (Composable
  Kernel; ROCm builds that include it).
- ``math``: ``SDPBackend.MATH`` (the unfused reference composition; everywhere).
- ``default``: no restriction: the backend SDPA picks by itself (what a model gets).

Reasons come from ``torch.backends.cuda.can_use_flash_attention`` / ``can_use_efficient_attention``
/ ``can_use_cudnn_attention`` (``debug=True``) on GPUs; they print their reasons through
c10's warning handler (stderr, not Python warnings), which :func:`explain` captures. On CPU
torch's dispatcher is asked with ``torch._fused_sdp_choice`` under the restriction.
Every row carries the AOTriton version (``aotriton`` column, from the environment fingerprint):
two result files of one suite, paired by case label, compare AOTriton releases.
"""
from __future__ import annotations

import contextlib
import math

from flyexplore.errors import UsageError
from flyexplore.ops import checks
from flyexplore.ops.attention.flydsl import FLYDSL as ATTENTION_FLYDSL
from flyexplore.ops.attention.model import MODEL as ATTENTION_MODEL
from flyexplore.ops.attention.sdpa import _SDP_NAMES, _rocm_library, explain, kv_heads
from flyexplore.ops.base import DTYPE_BYTES, ERR_TOL, Operator, TensorSize, relative_error, torch_dtype

ATTENTION = Operator(
    name="attention",
    doc="SDPA (F.scaled_dot_product_attention); shape BxHxSQxSKVxD, options hkv= (GQA kv "
        "heads), causal=0/1, fwd/bwd",
    dims=("b", "h", "sq", "skv", "d"),
    options={"hkv": 0, "causal": False, "pass": "fwd"},
    choices={"pass": ("fwd", "bwd")},
    dtypes=("bf16", "fp16", "fp32"),
    flydsl=ATTENTION_FLYDSL,
    model=ATTENTION_MODEL,
    trace_on_gpu=True,  # which AOTriton backend ran (Triton, aiter or FlyDSL) is known from the kernels only
)


def _validate(p):
    if p["hkv"] < 0:
        raise UsageError(f"attention hkv must be >= 0 (0 = same as h), got {p['hkv']}")
    if p["hkv"] == p["h"]:
        p["hkv"] = 0
    if p["hkv"] and p["h"] % p["hkv"]:
        raise UsageError(f"attention h={p['h']} must be a multiple of hkv={p['hkv']} (GQA groups)")
    if p["causal"] and p["sq"] != p["skv"]:
        raise UsageError(f"attention causal=1 needs sq == skv (got sq={p['sq']}, skv={p['skv']}): "
                         "SDPA's is_causal aligns the mask top-left; use causal=0 for decode shapes")


ATTENTION.validate = _validate


def _inputs(case, dtype, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(dtype)
    b, h, sq, skv, d, hk = case["b"], case["h"], case["sq"], case["skv"], case["d"], kv_heads(case)
    out = {"q": torch.randn(b, h, sq, d, generator=g, device=device, dtype=dt),
           "k": torch.randn(b, hk, skv, d, generator=g, device=device, dtype=dt),
           "v": torch.randn(b, hk, skv, d, generator=g, device=device, dtype=dt)}
    if case["pass"] == "bwd":
        out["do"] = torch.randn(b, h, sq, d, generator=g, device=device, dtype=dt)
    return out


def _math_attention(q, k, v, causal):
    import torch

    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _scores(q, k, causal):
    """(P, |S|_abs) of the attention graph: the softmax of q k^T / sqrt(D) (masked top-left
    when causal) and |q| |k|^T / sqrt(D), with k repeated per query group."""
    import torch

    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
    sc = 1 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * sc
    sabs = (q.abs() @ k.abs().transpose(-2, -1)) * sc
    if causal:
        mask = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        sabs = sabs.masked_fill(~mask, 0.0)
    return torch.softmax(s, dim=-1), sabs


def _reference(case, dtype, inputs):
    """Forward: the output [B, H, SQ, D]. Backward: dq, dk, dv flattened and concatenated.
    Attached for :func:`error`: ``.abs_scale`` (P|V| forward; dq_abs, dk_abs, dv_abs
    concatenated backward, see the module docstring) and ``.score_err`` (max over keys of
    |q||k|/sqrt(D): per query row [B, H, SQ, 1] forward, one number backward)."""
    import torch

    hi = torch.float64 if inputs["q"].device.type == "cpu" else torch.float32
    q, k, v = (inputs[n].to(hi) for n in ("q", "k", "v"))
    rep = q.shape[1] // k.shape[1]
    with torch.no_grad():
        p, sabs = _scores(q, k, case["causal"])
        vr = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        pv_abs = p @ vr.abs()
        smax = sabs.amax(dim=-1, keepdim=True)
    if case["pass"] == "fwd":
        ref = _math_attention(q, k, v, case["causal"])
        ref.abs_scale, ref.score_err = pv_abs, smax
        return ref
    with torch.enable_grad():
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = _math_attention(q, k, v, case["causal"])
        grads = torch.autograd.grad(o, (q, k, v), inputs["do"].to(hi))
    with torch.no_grad():
        do = inputs["do"].to(hi).abs()
        kr = k.detach().repeat_interleave(rep, dim=1) if rep > 1 else k.detach()
        sc = 1 / math.sqrt(q.shape[-1])
        ds_abs = p * (do @ vr.abs().transpose(-2, -1) + (do * pv_abs).sum(-1, keepdim=True))
        dq_abs = (ds_abs @ kr.abs()) * sc
        dk_abs = (ds_abs.transpose(-2, -1) @ q.detach().abs()) * sc
        dv_abs = p.transpose(-2, -1) @ do
        if rep > 1:
            b, h, skv, d = dk_abs.shape
            dk_abs = dk_abs.view(b, h // rep, rep, skv, d).sum(2)
            dv_abs = dv_abs.view(b, h // rep, rep, skv, d).sum(2)
    ref = torch.cat([g.reshape(-1) for g in grads])
    ref.abs_scale = torch.cat([t.reshape(-1) for t in (dq_abs, dk_abs, dv_abs)])
    ref.score_err = float(smax.max()) if smax.numel() else 0.0
    return ref


def error(out, ref, case, dtype):
    """Error columns and ``accuracy_ok`` for an SDPA output (forward: [B, H, SQ, D]; backward:
    the tuple dq, dk, dv): every element within the bound of the module docstring, NaN/Inf
    only where ``ref`` has them, and ``err_rel <= err_tol``."""
    import torch

    dt = torch_dtype(dtype)
    acc = torch.float64 if dt == torch.float64 else torch.float32
    u_in, u_acc, u_ref = (checks.unit_roundoff(t) for t in (dt, acc, ref.dtype))
    g = checks.gamma
    d, sq, skv = case["d"], case["sq"], case["skv"]
    ds_u = 2 * (g(d + 2, u_acc) + g(d + 2, u_ref))
    b, h, hk = case["b"], case["h"], kv_heads(case)
    if case["pass"] == "fwd":
        u_out = checks.unit_roundoff(out.dtype)
        c = u_in + g(skv, u_acc) + g(skv, u_ref) + ds_u * ref.score_err
        bound = checks.SAFETY * (u_out * ref.abs().nan_to_num(0.0, posinf=0.0) + c * ref.abs_scale
                                 + float(torch.finfo(out.dtype).tiny))
        heads = torch.arange(b * h, device=ref.device).repeat_interleave(sq)
        rule = (f"elementwise |O-ref| <= {checks.SAFETY:g}*(u_out|ref| + (u_in + gamma_SKV(u_acc) + "
                f"gamma_SKV(u_ref) + ds_i)(P|V|)), ds_i = 2(gamma_{{D+2}}(u_acc)+gamma_{{D+2}}(u_ref))"
                f"max_j|q_i||k_j|/sqrt(D), u_in=u_out={checks.fmt_u(u_in)}, u_acc={checks.fmt_u(u_acc)}, "
                f"u_ref={checks.fmt_u(u_ref)}, SKV={skv}, D={d} (running error bound)")
        cols = checks.bounded(out, ref, bound, row_blocks=(heads, b * h), rule=rule)
        return checks.with_tol(cols, ERR_TOL[dtype])
    flat = torch.cat([t.reshape(-1) for t in out])
    u_out = checks.unit_roundoff(out[0].dtype)
    L = sq + skv + d
    c = 3 * u_in + g(L, u_acc) + g(L, u_ref) + ds_u * ref.score_err
    bound = checks.SAFETY * (u_out * ref.abs().nan_to_num(0.0, posinf=0.0) + c * ref.abs_scale
                             + float(torch.finfo(out[0].dtype).tiny))
    heads = torch.cat([torch.arange(n, device=ref.device).repeat_interleave(s) + off
                       for n, s, off in ((b * h, sq, 0), (b * hk, skv, b * h), (b * hk, skv, b * h + b * hk))])
    rule = (f"elementwise |dX-ref| <= {checks.SAFETY:g}*(u_out|ref| + (3u_in + gamma_L(u_acc) + "
            f"gamma_L(u_ref) + ds)|dX|_abs) for dX in dq, dk, dv, L=SQ+SKV+D={L}, "
            f"u_in=u_out={checks.fmt_u(u_in)}, u_acc={checks.fmt_u(u_acc)}, u_ref={checks.fmt_u(u_ref)} "
            "(running error bound; loose in bf16)")
    cols = checks.bounded(flat, ref, bound, row_len=d, row_blocks=(heads, b * h + 2 * b * hk), rule=rule)
    sizes = [t.numel() for t in out]
    cols["err_rel"] = max(relative_error(o.reshape(-1), r)["err_rel"]
                          for o, r in zip(out, torch.split(ref, sizes)))
    return checks.with_tol(cols, ERR_TOL[dtype])


def flops(case) -> float:
    """4*B*H*SQ*SKV*D forward, halved when causal; x2.5 for the backward."""
    f = 4.0 * case["b"] * case["h"] * case["sq"] * case["skv"] * case["d"]
    if case["causal"]:
        f /= 2
    return f * 2.5 if case["pass"] == "bwd" else f


def _bytes(case, dtype):
    q = case["b"] * case["h"] * case["sq"] * case["d"]
    kv = case["b"] * kv_heads(case) * case["skv"] * case["d"]
    n = 2 * q + 2 * kv if case["pass"] == "fwd" else 4 * q + 4 * kv
    return float(n * DTYPE_BYTES[dtype])


def _tensors(case, dtype):
    """What :func:`_inputs` allocates and one call returns, all in ``dtype``: q [B, H, SQ, D],
    k and v [B, HKV, SKV, D] (and dO [B, H, SQ, D] for ``bwd``); the output O [B, H, SQ, D], or for
    ``bwd`` the forward's O (held by the built backend) and dq, dk, dv; and one ``work`` tensor,
    the scores [B, H, SQ, SKV] that :func:`_reference` builds (in float64 on the CPU, float32 on a
    GPU, several at once: P, |S|; autograd's for ``bwd``) and the math backend too: the term of
    an attention case's memory that grows with SQ x SKV (the memory estimate,
    :mod:`flyexplore.run.memory`, measures its factor)."""
    b, h, sq, skv, d, hk = case["b"], case["h"], case["sq"], case["skv"], case["d"], kv_heads(case)
    it = int(DTYPE_BYTES[dtype])
    qs, ks = (b, h, sq, d), (b, hk, skv, d)
    out = [TensorSize("q", "input", qs, it), TensorSize("k", "input", ks, it), TensorSize("v", "input", ks, it)]
    scores = TensorSize("scores", "work", (b, h, sq, skv), it)
    if case["pass"] == "fwd":
        return (*out, TensorSize("o", "output", qs, it), scores)
    return (*out, TensorSize("do", "input", qs, it), TensorSize("o", "output", qs, it),
            TensorSize("dq", "output", qs, it), TensorSize("dk", "output", ks, it), TensorSize("dv", "output", ks, it),
            scores)


def _memory_dims(case):
    """What a memory probe scales (:mod:`flyexplore.run.memory`): SQ and SKV (together when
    causal, which needs SQ == SKV), with B = 1 (every tensor is linear in B); H, HKV, D and the
    options stay the case's (they pick the kernels and the GQA repeat)."""
    return ((("sq", "skv"),) if case["causal"] else (("sq",), ("skv",))), {"b": 1}


ATTENTION.make_inputs = _inputs
ATTENTION.tensors = _tensors
ATTENTION.memory_dims = _memory_dims
ATTENTION.reference = _reference
ATTENTION.error = error
ATTENTION.flops = flops
ATTENTION.bytes = _bytes


# -- reasons ----------------------------------------------------------------------------------



# -- backends ---------------------------------------------------------------------------------

def _available(name):
    def check(ctx, case, dtype):
        return explain(name, case, dtype, ctx.device, ctx.env.platform)
    return check


def _context(name):
    """SDPA restricted to backend ``name`` (none for ``default``); for ``bwd`` cases also
    ``torch.autograd.set_multithreading_enabled(False)``, so that the backward runs on the
    calling thread instead of the engine's per-device worker thread and the profiler
    (kernel timing mode) attributes its kernels to the timed call."""
    @contextlib.contextmanager
    def ctx_mgr(ctx, case):
        import torch

        with contextlib.ExitStack() as stack:
            if case["pass"] == "bwd":
                stack.enter_context(torch.autograd.set_multithreading_enabled(False))
            if name != "default":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                stack.enter_context(_rocm_library(name, ctx.env.platform))
                stack.enter_context(sdpa_kernel([getattr(SDPBackend, _SDP_NAMES[name])]))
            yield
    return ctx_mgr


def _sdpa(q, k, v, causal, gqa):
    import torch

    kw = {"enable_gqa": True} if gqa else {}
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)


def _build(case, dtype, inputs, ctx):
    import torch

    causal, gqa = case["causal"], kv_heads(case) != case["h"]
    if case["pass"] == "fwd":
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        return lambda: _sdpa(q, k, v, causal, gqa)
    q, k, v = (inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    do = inputs["do"]
    with torch.enable_grad():
        o = _sdpa(q, k, v, causal, gqa)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


_DOCS = {
    "flash": "SDPBackend.FLASH_ATTENTION (FlashAttention-2 on NVIDIA, AOTriton on ROCm, CPU flash kernel)",
    "efficient": "SDPBackend.EFFICIENT_ATTENTION (mem-efficient on NVIDIA, AOTriton on ROCm)",
    "cudnn": "SDPBackend.CUDNN_ATTENTION (cuDNN, NVIDIA only)",
    "ck": "SDPBackend.FLASH_ATTENTION with preferred_rocm_fa_library('ck') (Composable Kernel, ROCm)",
    "math": "SDPBackend.MATH (unfused composition of matmul, softmax, matmul)",
    "default": "F.scaled_dot_product_attention unrestricted: the backend SDPA picks",
}
for _name, _doc in _DOCS.items():
    ATTENTION.backend(_name, _doc, available=_available(_name), context=_context(_name))(_build)


# -- suites -----------------------------------------------------------------------------------

#: (model, query heads, kv heads, head dim): head dims 64, 128 and 256 from real models.
MODELS = (("Llama-3.2-1B", 32, 8, 64), ("Llama-3.1-8B", 32, 8, 128), ("Gemma-2-9B", 16, 8, 256))


def _llm_cases():
    out = []
    for _, h, hk, d in MODELS:
        out += [f"1x{h}x4096x4096x{d}:causal=1,hkv={hk}",             # prefill, causal
                f"1x{h}x4096x4096x{d}:hkv={hk}",                      # same, no mask
                f"1x{h}x4096x4096x{d}:causal=1,hkv={hk},bwd",         # training step
                f"1x{h}x4096x4096x{d}:hkv={hk},bwd",
                f"32x{h}x1x4096x{d}:hkv={hk}"]                        # decode: 32 sequences
    # multi-head (no GQA), which every fused SDPA backend takes: Llama-2-7B, 32 heads of 128
    out += ["1x32x4096x4096x128:causal=1", "1x32x4096x4096x128:causal=1,bwd"]
    return out


ATTENTION.add_suite(
    "llm", _llm_cases(), ["bf16"],
    "head dims 64/128/256 from Llama-3.2-1B (32 q / 8 kv heads, d64), Llama-3.1-8B (32/8, d128) "
    "and Gemma-2-9B (16/8, d256): 4096-token prefill causal and not, forward and backward, and "
    "a decode step (32 sequences, 1 query over 4096 keys); plus multi-head Llama-2-7B (32 heads, "
    "d128) causal prefill forward and backward, for backends without GQA",
    "model configs: num_attention_heads, num_key_value_heads, head_dim")
ATTENTION.add_suite(
    "cpu-small",
    [("1x4x128x128x64:causal=1", "fp32"), ("1x8x256x256x64:hkv=2", "fp32"),
     ("1x4x128x128x64:causal=1,bwd", "fp32"), ("2x8x1x512x128:hkv=2", "fp32"),
     ("1x4x128x128x64:causal=1", "bf16")],
    ["fp32", "bf16"], "small SDPA cases (MHA, GQA, backward, decode) for a 2-core CPU", "flyexplore")
