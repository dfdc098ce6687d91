"""The ``model`` family: one forward step of a whole model, each variant a backend.

A case is a model and a phase: ``BATCHxSEQ:model=<name or config.json>[,decode][,layers=N]``
(``1x2048:model=llama-3.1-8b`` is a prefill of one 2,048-token sequence; ``32x2048:model=
llama-3.1-8b,decode`` one new token for each of 32 sequences whose KV cache holds 2,048). The
model is a transformers causal LM built from its config (:mod:`flyexplore.ops.model.hf`: a
built-in name or a ``config.json``) with **random weights on the device** (transformers' own
initialisation, seeded; nothing is downloaded), or an ``nn.Module`` registered in this process
with its inputs (:func:`register_module`, ``model=module:<name>``). ``layers=N`` builds the first
N decoder layers only (``num_hidden_layers`` and per-layer lists cut to N).

The step (:func:`step_fn`):

- ``prefill``: ``model(input_ids [batch, seq], use_cache=False, logits_to_keep=1)``;
- ``decode``: one token per sequence at position ``seq`` against a **static KV cache**
  (transformers' ``StaticCache``, ``max_cache_len = seq + 1``) filled by one unrecorded prefill
  of the context; every call writes the same slot, so calls repeat exactly.

CUDA graphs are not used by any variant (eager launches every kernel; the compiled variants set
``triton.cudagraphs=False``): rows say so (:data:`CUDA_GRAPHS`).

Variants (backends, :data:`VARIANTS`):

- ``eager``: eager ATen, FlyDSL eager overrides off (the baseline);
- ``eager_flydsl``: eager with torch 2.15's FlyDSL overrides on (RMSNorm, TopK; gfx950 only);
- ``compile``: ``torch.compile`` default;
- ``max_autotune``: max-autotune, ``max_autotune_gemm_backends="ATEN,TRITON"`` (Triton templates);
- ``max_autotune_flydsl``: max-autotune with ``"ATEN,TRITON,FLYDSL"`` (gfx950, torch >= 2.15);
- ``eager_ck`` (ROCm only): eager with SDPA on Composable Kernel
  (``preferred_rocm_fa_library("ck")``) instead of AOTriton -- the attention backend choice.

A variant that cannot run here is an ``unavailable`` row with the reason. The check is the
logits of the last position against the eager variant's in the same dtype (:data:`LOGIT_TOL`).
A row's FLOPs and bytes are estimated from the config's dims (:func:`model_dims`), as is the
memory a case needs (:func:`memory_terms`: weights, KV cache, activations), checked before the
model is allocated.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
from typing import Any, Mapping

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops.base import (
    DTYPE_BYTES,
    Operator,
    TensorSize,
    compile_context,
    relative_error,
    torch_dtype,
)
from flyexplore.ops.gemm import operator as GEMM_OP
from flyexplore.ops.model import hf as H
from flyexplore.world.switches import flydsl_eager

#: The phases a case takes.
PHASES = H.PHASES
#: The variants (backends) and what each is, in the order rows show them.
VARIANTS = {
    "eager": "eager ATen, FlyDSL eager overrides off",
    "eager_flydsl": "eager with torch's FlyDSL eager overrides on (RMSNorm, TopK; gfx950)",
    "compile": "torch.compile default (Inductor)",
    "max_autotune": "torch.compile max-autotune, GEMM backends ATEN,TRITON (Triton templates)",
    "max_autotune_flydsl": "torch.compile max-autotune, GEMM backends ATEN,TRITON,FLYDSL (gfx950)",
    "eager_ck": "eager with SDPA on Composable Kernel instead of AOTriton (ROCm: the attention backend choice)",
}
#: Inductor options of the compiled variants (``triton.cudagraphs`` off: no variant uses CUDA graphs).
COMPILE_OPTIONS = {
    "compile": {"triton.cudagraphs": False},
    "max_autotune": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON", "triton.cudagraphs": False},
    "max_autotune_flydsl": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON,FLYDSL",
                            "triton.cudagraphs": False},
}
#: What every row says of CUDA/HIP graphs.
CUDA_GRAPHS = "CUDA graphs: not used (eager launches; compiled variants with triton.cudagraphs=False)"
#: The eager overrides the ``eager_flydsl`` variant turns on (torch 2.15's FlyDSL eager routes).
EAGER_OPS = ("rmsnorm", "topk")
#: Tolerance on the relative L2 error of the last position's logits against the eager variant's,
#: per dtype: a whole step's rounding (compiled kernels fuse and reorder reductions; through N
#: layers of random weights the difference grows). A wrong kernel gives errors near 1.
LOGIT_TOL = {"fp32": 1e-3, "fp16": 5e-2, "bf16": 1e-1}

#: Modules registered in this process: ``name -> (module, args, kwargs)`` (:func:`register_module`).
_MODULES: dict[str, tuple[Any, tuple, dict]] = {}


def register_module(name: str, module, inputs=(), kwargs: Mapping | None = None) -> str:
    """Register ``module`` called as ``module(*inputs, **kwargs)`` under ``name`` for this
    process, and return the case's model value ``"module:<name>"``. A registered module is measured
    with its own weights and inputs (``batch`` and ``seq`` of its case are labels only) and only
    in this process (a sweep of it runs in-process). Raises :class:`UsageError` for a name with
    ``,`` or ``:`` (they separate case options)."""
    if not name or any(c in name for c in ",:"):
        raise UsageError(f"module name {name!r} must be non-empty without ',' or ':'")
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    _MODULES[name] = (module, tuple(inputs), dict(kwargs or {}))
    return f"module:{name}"


def _module_key(value: str) -> str | None:
    return value[len("module:"):] if str(value).startswith("module:") else None


def describe(value: str) -> dict:
    """The config description (:func:`flyexplore.ops.model.hf.load_config`) of a case's ``model``
    value: a built-in name or a ``config.json`` path. Raises :class:`UsageError` naming it."""
    if not value:
        raise UsageError("a model case needs model=<built-in name or config.json path>, e.g. "
                         "1x2048:model=llama-3.1-8b")
    if str(value).strip().lower() in H.builtin_models():
        return H.load_config(hf=value)
    if os.path.isfile(value):
        return H.load_config(config=value)
    raise bad_choice("model (a built-in name or a config.json path)", value, H.builtin_models())


def config_of(case) -> dict:
    """The case's config dict (a copy), its depth cut to ``layers`` where that is set
    (``num_hidden_layers``, and every per-layer list of the config cut to the same length)."""
    cfg = dict(describe(case["model"])["config"])
    n = case["layers"]
    if n:
        key, full = H._first(cfg, H._LAYER_KEYS)
        full = full or n
        cfg[key] = min(n, full)
        for k, v in list(cfg.items()):
            if isinstance(v, list) and len(v) == full and k not in ("architectures",):
                cfg[k] = v[: cfg[key]]
    return cfg


def model_dims(cfg: Mapping) -> dict:
    """The dims of a decoder-only transformer config that size its step, read from the config
    (Llama-style names; GPT-2's ``n_embd``/``n_layer``/``n_head`` too): ``hidden``, ``layers``,
    ``heads``, ``kv_heads``, ``head_dim``, ``inter`` (dense MLP), ``experts``, ``top_k``,
    ``moe_inter``, ``shared_inter``, ``vocab``; ``params`` (all weights: attention, MLP or every
    expert, router, embeddings and LM head) and ``active`` (the weights one token's GEMMs read:
    top-k experts). An estimate for sizing and FLOP counts, not a parameter count of the built
    module (norms and biases are left out; a Mamba or hybrid layer is counted as attention + MLP)."""
    g = lambda *ks, d=None: next((cfg[k] for k in ks if cfg.get(k) is not None), d)  # noqa: E731
    hidden = int(g("hidden_size", "n_embd", "d_model", d=1))
    layers = int(g(*H._LAYER_KEYS, d=1))
    heads = int(g(*H._HEAD_KEYS, d=1))
    kv = int(g("num_key_value_heads", d=heads))
    hd = int(g("head_dim", d=max(1, hidden // max(1, heads))))
    inter = int(g("intermediate_size", "n_inner", d=4 * hidden))
    experts = int(g(*H._EXPERT_KEYS, d=0))
    top_k = int(g("num_experts_per_tok", "experts_per_token", d=1 if experts else 0))
    moe_inter = int(g("moe_intermediate_size", d=inter))
    shared = int(g("shared_expert_intermediate_size", d=0))
    vocab = int(g("vocab_size", d=32000))
    attn = hidden * hd * (2 * heads + 2 * kv)
    if experts:
        mlp_all = experts * 3 * hidden * moe_inter + 3 * hidden * shared + hidden * experts
        mlp_act = top_k * 3 * hidden * moe_inter + 3 * hidden * shared + hidden * experts
    else:
        mlp_all = mlp_act = 3 * hidden * inter
    emb = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv, "head_dim": hd, "inter": inter,
            "experts": experts, "top_k": top_k, "moe_inter": moe_inter, "shared_inter": shared, "vocab": vocab,
            "params": layers * (attn + mlp_all) + emb, "active": layers * (attn + mlp_act) + vocab * hidden}


def _tokens(case) -> tuple[int, int]:
    """(query tokens per sequence, keys per sequence) of the step."""
    return (1, case["seq"] + 1) if case["phase"] == "decode" else (case["seq"], case["seq"])


def flops(case) -> float:
    """FLOPs of one step, estimated from the config (:func:`model_dims`): 2 x the weights each
    token's GEMMs read (LM head for the last position only, ``logits_to_keep=1``) x tokens, plus
    attention's 4 x batch x heads x head_dim x queries x keys (halved in prefill: causal). 0 for a
    registered module (its dims are not known)."""
    if _module_key(case["model"]) is not None:
        return 0.0
    d = model_dims(config_of(case))
    q, kv = _tokens(case)
    b = case["batch"]
    body = 2.0 * (d["active"] - d["vocab"] * d["hidden"]) * b * q + 2.0 * d["vocab"] * d["hidden"] * b
    attn = 4.0 * b * d["layers"] * d["heads"] * d["head_dim"] * q * kv * (0.5 if case["phase"] == "prefill" else 1.0)
    return body + attn


def memory_terms(case, dtype: str) -> dict:
    """Bytes one case needs, estimated from the config before anything is allocated:
    ``weights`` (every parameter, :func:`model_dims`), ``kv_cache`` (decode: keys and values of
    ``seq + 1`` positions, every layer, batch, KV head), ``activations`` (the largest live set of
    one layer's step: hidden states, the MLP or routed experts' intermediate, the QKV projection,
    the fp32 logits of the kept position, x 2 for the reference and a compiled variant's buffers
    side by side), and ``total``. 0 for a registered module."""
    if _module_key(case["model"]) is not None:
        return {"weights": 0, "kv_cache": 0, "activations": 0, "total": 0}
    d = model_dims(config_of(case))
    it = DTYPE_BYTES[dtype]
    b = case["batch"]
    q, kv = _tokens(case)
    weights = d["params"] * it
    cache = 2 * d["layers"] * b * d["kv_heads"] * kv * d["head_dim"] * it if case["phase"] == "decode" else 0
    rows = b * q
    inter = max(d["inter"], d["top_k"] * d["moe_inter"] + d["shared_inter"]) if d["experts"] else d["inter"]
    per_row = 4 * d["hidden"] + 3 * inter + d["head_dim"] * (d["heads"] + 2 * d["kv_heads"])
    acts = 2 * (rows * per_row * it) + b * d["vocab"] * 4
    if case["phase"] == "decode":
        acts += rows * d["heads"] * kv * 4  # the attention scores of the new tokens (SDPA's math path on CPU)
    return {"weights": int(weights), "kv_cache": int(cache), "activations": int(acts),
            "total": int(weights + cache + acts)}


def _memory(case, dtype) -> tuple[int, str]:
    """:attr:`Operator.memory`: :func:`memory_terms`' total and its terms in words."""
    t = memory_terms(case, dtype)
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    return t["total"], (f"weights {gb(t['weights'])} + KV cache {gb(t['kv_cache'])} + activations "
                        f"{gb(t['activations'])}, estimated from the config's dims")


def _tensors(case, dtype):
    """:attr:`Operator.tensors`: the weights and KV cache (held for the case) and the activations."""
    t = memory_terms(case, dtype)
    return tuple(TensorSize(n, role, (max(1, t[n]),), 1) for n, role in
                 (("weights", "input"), ("kv_cache", "input"), ("activations", "work")) if t[n])


def _validate(p):
    if p["model"] is None or p["model"] == "":
        raise UsageError("a model case needs model=<built-in name or config.json path>, e.g. "
                         "1x2048:model=llama-3.1-8b")
    if not isinstance(p["layers"], int) or p["layers"] < 0:
        raise UsageError(f"model layers must be a non-negative integer (0: all), got {p['layers']!r}")
    key = _module_key(p["model"])
    if key is not None:
        if key not in _MODULES:
            raise UsageError(f"model {p['model']!r} is not registered in this process "
                             "(flyexplore.ops.model.operator.register_module)")
        return
    desc = describe(p["model"])
    cfg = desc["config"]
    mp = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    H.check_phase(p["phase"], p["batch"], p["seq"], max_positions=mp)
    full = H._first(cfg, H._LAYER_KEYS)[1]
    if p["layers"] and full and p["layers"] > full:
        raise UsageError(f"layers={p['layers']} is past the {full} layers of {desc['where']}")


# -- building ----------------------------------------------------------------------------------

def build_model(case, dtype: str, device, seed: int = 0):
    """The case's model with random weights on ``device``: transformers'
    ``AutoModelForCausalLM.from_config`` under ``torch.device(device)`` (weights made where they
    live, initialised by transformers' ``_init_weights`` after ``torch.manual_seed(seed)``), in
    ``dtype``, eval mode, SDPA attention where the model supports it. Raises :class:`UsageError`
    for a model outside what flyexplore builds (:func:`flyexplore.ops.model.hf.model_scope`)."""
    import copy

    import torch

    tr = H._transformers()
    desc = dict(describe(case["model"]))
    desc["config"] = config_of(case)
    scope = H.model_scope(desc)
    if scope["kind"] != "decoder":
        raise UsageError(f"{desc['where']}: measuring a step takes a decoder-only causal LM; this is a "
                         f"{scope['kind']} model")
    torch.manual_seed(seed)
    dt = torch_dtype(dtype)
    with torch.device(device), H.quiet_transformers():
        last = None
        for attn in ("sdpa", "eager"):
            try:
                m = tr.AutoModelForCausalLM.from_config(copy.deepcopy(scope["config"]), dtype=dt,
                                                        attn_implementation=attn)
                break
            except ValueError as exc:  # the model has no SDPA path (gpt-oss)
                last = exc
        else:
            raise UsageError(f"transformers cannot build {desc['title']}: {str(last).splitlines()[0][:200]}")
    return m.eval()


def _forward_kw(model) -> tuple[dict, str]:
    fwd = inspect.signature(model.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in fwd else {}
    return extra, ("cache" if "cache" in fwd else "past_key_values")


def _inputs(case, dtype, device, seed):
    """:attr:`Operator.make_inputs`: ``{"model", "args", "kwargs"}``, the step's call."""
    import torch

    key = _module_key(case["model"])
    if key is not None:
        module, args, kw = _MODULES[key]
        return {"model": module, "args": args, "kwargs": kw}
    model = build_model(case, dtype, device, seed)
    extra, cache_name = _forward_kw(model)
    b, s = case["batch"], case["seq"]
    g = torch.Generator(device="cpu").manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size if hasattr(model.config, "get_text_config") else model.config.vocab_size
    ids = torch.randint(0, vocab, (b, s), generator=g).to(device)
    if case["phase"] == "prefill":
        return {"model": model, "args": (), "kwargs": {"input_ids": ids, "use_cache": False, **extra}}
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=s + 1)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{cache_name: cache}, **extra)  # fills positions 0..s-1
    new = torch.randint(0, vocab, (b, 1), generator=g).to(device)
    kw = {"input_ids": new, "position_ids": torch.full((b, 1), s, dtype=torch.long, device=device),
          "cache_position": torch.tensor([s], dtype=torch.long, device=device),
          "use_cache": True, cache_name: cache, **extra}
    return {"model": model, "args": (), "kwargs": kw, "rewind": _rewind(cache, s, device)}


def _rewind(cache, seq: int, device):
    """A callable that puts the static cache's write position back to ``seq`` before each decode
    call, so that every call writes the same slot and attends to the same ``seq + 1`` keys: from
    transformers 5.2x a ``StaticLayer`` keeps its position in a ``cumulative_length`` tensor (one
    ``torch._foreach_copy_`` resets every layer's in one launch); before, the step's
    ``cache_position`` says where to write and nothing is to be reset (``None``)."""
    import torch

    lens = [layer.cumulative_length for layer in getattr(cache, "layers", ())
            if torch.is_tensor(getattr(layer, "cumulative_length", None))]
    if not lens:
        return None
    src = [torch.full_like(lens[0], seq)] * len(lens)
    return lambda: torch._foreach_copy_(lens, src)


def step_fn(fn, inputs):
    """A zero-argument step: ``fn(*args, **kwargs)`` under ``torch.no_grad()`` (a decode step first
    puts its static cache back to the context length: :func:`_rewind`)."""
    import torch

    args, kw, rewind = inputs["args"], inputs["kwargs"], inputs.get("rewind")

    def step():
        with torch.no_grad():
            if rewind is not None:
                rewind()
            return fn(*args, **kw)
    return step


def logits(out):
    """The logits of a step's output (a transformers output, a tuple's first item, or a tensor)."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def _reference(case, dtype, inputs):
    """:attr:`Operator.reference`: the eager variant's logits (float32), FlyDSL overrides off."""
    with flydsl_eager(False, EAGER_OPS):
        return logits(step_fn(inputs["model"], inputs)()).detach().float().clone()


def error(out, ref, case, dtype) -> dict:
    """:attr:`Operator.error`: relative L2 error of the logits against the eager variant's
    (:func:`flyexplore.ops.base.relative_error`), judged against :data:`LOGIT_TOL`."""
    got = logits(out).detach().float()
    if got.shape != ref.shape:
        return {"err_rel": math.inf, "err_tol": LOGIT_TOL.get(dtype, 0.1), "accuracy_ok": False}
    e = relative_error(got, ref)
    tol = LOGIT_TOL.get(dtype, 0.1)
    return {**e, "err_tol": tol, "accuracy_ok": e["err_rel"] <= tol}


# -- variants ----------------------------------------------------------------------------------

def _flydsl_eager_available(ctx, case, dtype):
    r = ctx.env.flydsl_eager
    return None if r.ready else "; ".join(c.detail for c in r.failed)


# the GEMM family's own checks: whether Triton GEMM templates and FlyDSL's GEMM template can run
_needs_gpu = GEMM_OP._needs_gpu
_flydsl_compile_available = GEMM_OP._flydsl_available


def _rocm_only(ctx, case, dtype):
    if ctx.env.platform != "rocm":
        return (f"the SDPA library choice (AOTriton or CK) exists on ROCm torch only; this is {ctx.env.platform}")
    return None


def _eager_build(case, dtype, inputs, ctx):
    return step_fn(inputs["model"], inputs)


def _compiled_build(name):
    def build(case, dtype, inputs, ctx):
        import torch

        return step_fn(torch.compile(inputs["model"], dynamic=False, options=dict(COMPILE_OPTIONS[name])), inputs)
    return build


@contextlib.contextmanager
def _ck(ctx, case):
    import torch

    with flydsl_eager(False, EAGER_OPS):
        prev = torch.backends.cuda.preferred_rocm_fa_library()
        torch.backends.cuda.preferred_rocm_fa_library("ck")
        try:
            yield
        finally:
            torch.backends.cuda.preferred_rocm_fa_library(prev)


def breakdown_kwargs(backend: str, inputs: Mapping) -> dict:
    """:attr:`Operator.breakdown`: the keywords of :func:`flyexplore.insight.breakdown.profile_step`
    for a variant: the module, for its norm layers' ranges, on eager variants (a compiled one
    would recompile with hooks added)."""
    return {"module": inputs["model"]} if backend.startswith("eager") else {}


MODEL = Operator(
    name="model",
    doc="one forward step of a whole model (prefill or decode), each variant a backend",
    dims=("batch", "seq"),
    options={"model": "", "phase": "prefill", "layers": 0},
    choices={"phase": PHASES},
    dtypes=("bf16", "fp16", "fp32"),
    breakdown=breakdown_kwargs,
    timing_mode="event",    # a step's time includes its launch gaps (flyexplore.measure.modes: event)
    fresh_recheck=False,    # the inputs are a model: the check runs once, on the first call
    memory=_memory,
    check_output=logits,    # across environments the logits are compared, never the KV cache object
)
MODEL.validate = _validate
MODEL.make_inputs = _inputs
MODEL.reference = _reference
MODEL.error = error
MODEL.flops = flops
MODEL.bytes = lambda case, dtype: float(memory_terms(case, dtype)["weights"] + memory_terms(case, dtype)["kv_cache"])
MODEL.tensors = _tensors

MODEL.backend("eager", VARIANTS["eager"], baseline=True,
              context=lambda ctx, case: flydsl_eager(False, EAGER_OPS))(_eager_build)
MODEL.backend("eager_flydsl", VARIANTS["eager_flydsl"], available=_flydsl_eager_available,
              context=lambda ctx, case: flydsl_eager(True, EAGER_OPS))(_eager_build)
MODEL.backend("compile", VARIANTS["compile"], context=compile_context)(_compiled_build("compile"))
MODEL.backend("max_autotune", VARIANTS["max_autotune"], available=_needs_gpu,
              context=compile_context)(_compiled_build("max_autotune"))
MODEL.backend("max_autotune_flydsl", VARIANTS["max_autotune_flydsl"], available=_flydsl_compile_available,
              context=compile_context)(_compiled_build("max_autotune_flydsl"))
MODEL.backend("eager_ck", VARIANTS["eager_ck"], available=_rocm_only, context=_ck)(_eager_build)
