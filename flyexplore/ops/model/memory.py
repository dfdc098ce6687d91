"""What one step of the ``model`` family needs in memory: weights, KV cache (or recurrent state),
activations -- estimated before anything is allocated.

- **Weights** (:func:`weight_bytes`): the parameters and buffers of the model transformers builds
  from the case's config (``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``: no
  memory), parameters in the case's dtype, buffers in their own (a rotary ``inv_freq`` stays fp32).
  A registered module (``model=module:NAME``) counts its own parameters and buffers.
- **KV cache and state** (:func:`cache_bytes`, decode only): the tensors of transformers'
  ``StaticCache(config, max_cache_len=seq + 1)`` -- the cache the decode step uses -- after a
  prefill run on the ``meta`` device, so every cache layer (``StaticLayer``, sliding-window
  layers, the conv and SSM states of linear-attention / Mamba layers) initialises itself lazily
  with the shapes and dtypes the model hands it (``transformers/cache_utils.py`` at 5.25:
  ``StaticLayer.lazy_initialization``, ``LinearAttentionLayer.lazy_initialization``).
- **Activations** (:func:`memory_terms`): the largest live set of one layer's step, from the
  config's dims (:func:`model_dims`).

Where transformers cannot build the model (or run the prefill) on ``meta``, the config-dims
formula (:func:`model_dims`) stands in and the terms' text says so.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from flyexplore.ops.base import DTYPE_BYTES, TensorSize, torch_dtype
from flyexplore.ops.model import hf as H

#: Model types whose MLP is ungated (up and down projections: 2 matrices, not gate/up/down's 3),
#: from each model's ``modeling_*.py`` in transformers 5.25 (``GPT2MLP``, ``GPTNeoXMLP``,
#: ``Starcoder2MLP``, ``NemotronMLP``: ``up_proj`` and ``down_proj`` only, ...).
UNGATED_MLP = frozenset({"gpt2", "gpt_neox", "gpt_bigcode", "gpt_neo", "gptj", "starcoder2", "nemotron", "falcon",
                         "opt", "bloom", "phi", "codegen", "mpt", "persimmon", "biogpt", "xglm", "bert", "roberta"})
#: Model types with a learned position table (``max_position_embeddings x hidden`` weights:
#: ``wpe`` of ``transformers/models/gpt2/modeling_gpt2.py``, OPT's ``embed_positions``, ...).
LEARNED_POSITIONS = frozenset({"gpt2", "gpt_bigcode", "gpt_neo", "opt", "biogpt", "bert", "roberta"})
#: Model types whose every layer is a Mamba mixer (no attention, no MLP).
MAMBA_ONLY = frozenset({"mamba", "mamba2", "falcon_mamba"})
#: Prefill tokens of the meta-device run that sizes a decode cache: every cache layer's shape is
#: fixed by ``max_cache_len`` (or its sliding window, or its conv kernel), not by the prefill.
META_PREFILL = 8


# -- dims from the config ---------------------------------------------------------------------------

def _reader(cfg: Mapping):
    """A getter over the transformers config object of ``cfg`` (its names normalised:
    ``attribute_map``, defaults per config class), then the raw dict; sub-configs DBRX keeps
    (``ffn_config``, ``attn_config``) are read too."""
    objs: list[Any] = []
    try:
        obj = H.make_config({"config": dict(cfg), "where": "the config"})
        text = obj.get_text_config() if hasattr(obj, "get_text_config") else obj
        objs = [text, obj] + [getattr(text, k) for k in ("ffn_config", "attn_config") if hasattr(text, k)]
    except Exception:  # transformers missing or the config not buildable: the raw dict alone
        pass
    subs = [cfg.get(k) for k in ("ffn_config", "attn_config") if isinstance(cfg.get(k), Mapping)]

    def g(*keys, d=None):
        for k in keys:
            for o in objs:
                v = getattr(o, k, None)
                if v is not None and not callable(v):
                    return v
            for m in [cfg] + subs:
                if m.get(k) is not None:
                    return m[k]
        return d
    return g


def _moe_layers(g, layers: int) -> int:
    """How many of ``layers`` layers hold experts: ``mlp_only_layers`` and ``decoder_sparse_step``
    (Qwen-MoE), ``first_k_dense_replace`` (DeepSeek), ``moe_layer_start_index`` /
    ``moe_layer_end_index`` / ``moe_layer_interval`` (ERNIE-4.5), ``expert_layer_period`` /
    ``expert_layer_offset`` (Jamba), ``interleave_moe_layer_step`` (Llama 4); else all."""
    idx = range(layers)
    dense = set(g("mlp_only_layers", d=()) or ())
    step = g("decoder_sparse_step", "moe_layer_interval", "interleave_moe_layer_step", d=1) or 1
    first = g("first_k_dense_replace", "moe_layer_start_index", d=0) or 0
    end = g("moe_layer_end_index", d=layers - 1)
    end = layers - 1 if end is None or end < 0 else end
    period, offset = g("expert_layer_period"), g("expert_layer_offset", d=0)
    if period:
        return sum(1 for i in idx if i % period == offset)
    if g("moe_layer_start_index") is not None:
        # transformers 5.25 modeling_ernie4_5_moe.py: (layer_idx + 1) % interval == 0 within start..end
        return sum(1 for i in idx if first <= i <= end and (i + 1) % step == 0)
    return sum(1 for i in idx if i not in dense and i >= first and (i + 1) % step == 0)


def _mamba_mixer(g, hidden: int, mt: str, layers: int) -> tuple[int, int]:
    """``(weights of one Mamba mixer, layers holding one)`` from the config: Mamba-1
    (``transformers/models/mamba/modeling_mamba.py::MambaMixer``: ``in_proj`` h x 2d, ``x_proj``
    d x (dt_rank + 2 state), ``dt_proj``, ``out_proj`` d x h, ``A_log`` d x state) for
    :data:`MAMBA_ONLY` types; Mamba-2 (``in_proj`` h x (2d + 2 groups x state + heads),
    ``out_proj`` d x h) where ``mamba_d_state`` / ``mamba_n_heads`` are set -- on the layers that
    are not attention ones (``layers_block_type`` / ``layer_types``), every layer for Falcon-H1
    (attention and mixer side by side). ``(0, 0)`` otherwise."""
    if mt in MAMBA_ONLY:
        d = int(g("intermediate_size", d=None) or int(g("expand", d=2)) * hidden)
        state = int(g("state_size", "ssm_state_size", d=16))
        rank = g("time_step_rank", d=None)
        rank = int(rank) if isinstance(rank, int) else -(-hidden // 16)
        return 3 * hidden * d + d * (rank + 2 * state) + rank * d + d * state + d * int(g("conv_kernel", d=4)), layers
    heads = g("mamba_n_heads", d=None)
    if not (heads or g("mamba_d_state", d=None)):
        return 0, 0
    state = int(g("mamba_d_state", d=16))
    d = int(g("mamba_d_ssm", d=None) or int(g("mamba_expand", d=2)) * hidden)
    heads = int(heads or 1)
    one = hidden * (2 * d + 2 * int(g("mamba_n_groups", d=1)) * state + heads) + d * hidden
    if mt == "falcon_h1":
        return one, layers
    types = g("layers_block_type", "layer_types", d=None)
    if isinstance(types, (list, tuple)) and len(types) == layers:
        return one, sum(1 for t in types if "mamba" in str(t) or "linear" in str(t))
    return one, 0


def model_dims(cfg: Mapping) -> dict:
    """The dims of a decoder-only transformer config that size its step, read from transformers'
    config object of ``cfg`` (:func:`flyexplore.ops.model.hf.make_config`: GPT-2's ``n_embd``,
    DBRX's ``d_model`` and its ``ffn_config`` / ``attn_config``, each class's defaults such as
    ``tie_word_embeddings``), else the raw dict: ``hidden``, ``layers``, ``heads``, ``kv_heads``,
    ``head_dim``, ``inter`` (dense MLP; a per-layer list: its largest), ``experts``, ``top_k``,
    ``moe_inter``, ``shared_inter``, ``moe_layers`` (layers holding experts), ``gated`` (3 MLP
    matrices, else 2: :data:`UNGATED_MLP`), ``vocab``; ``params`` (all weights: attention, MLP or
    every expert, router, embeddings and LM head) and ``active`` (the weights one token's GEMMs
    read: top-k experts). An estimate for FLOP counts and the fallback of the memory estimate,
    not a parameter count of the built module (norms and biases are left out; a Mamba or hybrid
    layer is counted as attention + MLP): :func:`weight_bytes` counts the built module."""
    g = _reader(cfg)
    mt = str(g("model_type", d=""))
    hidden = int(g("hidden_size", "n_embd", "d_model", d=1))
    layers = int(g(*H._LAYER_KEYS, "n_layers", d=1))
    heads = int(g(*H._HEAD_KEYS, "n_heads", d=1))
    kv = int(g("num_key_value_heads", "kv_n_heads", d=heads) or heads)
    hd = int(g("head_dim", d=None) or max(1, hidden // max(1, heads)))
    raw_inter = g("intermediate_size", "n_inner", "ffn_hidden_size", d=None)
    inter = int(max(raw_inter) if isinstance(raw_inter, (list, tuple)) else raw_inter or 4 * hidden)
    experts = int(g(*H._EXPERT_KEYS, "moe_num_experts", d=0) or 0)
    top_k = int(g("num_experts_per_tok", "experts_per_token", "moe_top_k", "moe_k", d=1 if experts else 0) or 0)
    moe_inter = int(g("moe_intermediate_size", d=None) or inter)
    shared = int(g("shared_expert_intermediate_size", "shared_intermediate_size", d=0) or 0)
    n_shared = int(g("n_shared_experts", "moe_num_shared_experts", d=0) or 0)
    shared = shared or n_shared * moe_inter
    vocab = int(g("vocab_size", d=32000))
    mats = 2 if mt in UNGATED_MLP else 3
    moe_layers = _moe_layers(g, layers) if experts else 0
    dense_inter = int(g("intermediate_size_mlp", d=None) or inter)
    attn = hidden * hd * (2 * heads + 2 * kv)
    dense = mats * hidden * (sum(raw_inter) / layers if isinstance(raw_inter, (list, tuple)) and raw_inter
                             else dense_inter)
    moe_all = experts * mats * hidden * moe_inter + mats * hidden * shared + hidden * experts
    moe_act = top_k * mats * hidden * moe_inter + mats * hidden * shared + hidden * experts
    tie = bool(g("tie_word_embeddings", d=False))
    emb = vocab * hidden * (1 if tie else 2)
    mixer, n_mix = _mamba_mixer(g, hidden, mt, layers)
    if mt in MAMBA_ONLY:
        attn, dense, n_attn = 0, 0, 0
    else:
        types = g("layers_block_type", "layer_types", d=None)
        n_attn = sum(1 for t in types if "attention" in str(t) and "linear" not in str(t)) \
            if isinstance(types, (list, tuple)) and len(types) == layers and 0 < n_mix < layers else layers
    if mt in LEARNED_POSITIONS:
        emb += int(g("max_position_embeddings", "n_positions", d=0) or 0) * hidden
    body = n_attn * attn + (layers - moe_layers) * dense + n_mix * mixer
    return {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv, "head_dim": hd, "inter": inter,
            "experts": experts, "top_k": top_k, "moe_inter": moe_inter, "shared_inter": shared,
            "moe_layers": moe_layers, "gated": mats == 3, "vocab": vocab,
            "params": int(body + moe_layers * moe_all + emb),
            "active": int(body + moe_layers * moe_act + vocab * hidden)}


# -- counted on the meta device -----------------------------------------------------------------------

def _cfg_key(cfg: Mapping) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def meta_model(cfg: Mapping, dtype: str):
    """``(model, None)``: transformers' causal LM of ``cfg`` (a config dict, the case's cut one)
    built on the ``meta`` device (``AutoModelForCausalLM.from_config`` of
    :func:`flyexplore.ops.model.hf.model_scope`'s config, SDPA where the model has it) in
    ``dtype``: no memory, and no seed drawn (the RNG state is put back). ``(None, why)`` where it
    cannot be built. Cached per config and dtype."""
    return _meta_model(_cfg_key(cfg), dtype)


@functools.lru_cache(maxsize=8)
def _meta_model(text: str, dtype: str):
    import copy

    import torch

    cfg = json.loads(text)
    try:
        tr = H._transformers()
        scope = H.model_scope({"config": cfg, "where": "the config", "title": str(cfg.get("model_type")),
                               "name": str(cfg.get("model_type"))})
        with torch.device("meta"), H.quiet_transformers(), torch.random.fork_rng(devices=[]):
            last = None
            for attn in ("sdpa", "eager"):
                try:
                    auto = getattr(tr, scope.get("auto", "AutoModelForCausalLM"))
                    model = auto.from_config(copy.deepcopy(scope["config"]), dtype=torch_dtype(dtype),
                                             attn_implementation=attn)
                    return model.eval(), None
                except ValueError as exc:  # no SDPA path (Mamba, gpt-oss)
                    last = exc
            raise last
    except Exception as exc:  # any failure: the estimate falls back to the config's dims, saying why
        return None, _why(exc)


def _why(exc: BaseException) -> str:
    first = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def module_bytes(module) -> int:
    """Bytes of a module's parameters and buffers (each in its own dtype; shared ones once)."""
    return _tensor_bytes(list(module.parameters()) + list(module.buffers()))


def weight_bytes(cfg: Mapping, dtype: str) -> tuple[int | None, str]:
    """``(bytes, how)``: the parameters (in ``dtype``, or the dtype the model keeps one in, e.g. a
    router bias in fp32) and buffers (their own dtype) of :func:`meta_model` of ``cfg``;
    ``(None, why)`` where it cannot be built."""
    model, why = meta_model(cfg, dtype)
    if model is None:
        return None, why
    return module_bytes(model), "parameters and buffers of the model built on the meta device"


def cache_tensors(cache) -> list:
    """Every tensor a transformers cache object holds (its layers' keys, values, conv and
    recurrent states): each layer's attributes that are tensors, or dicts / lists of tensors,
    less 0-d ones (its write-position counters, ``cumulative_length``: 8 bytes a layer)."""
    import torch

    out = []
    for layer in getattr(cache, "layers", ()):
        for v in vars(layer).values():
            items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
            out += [t for t in items if torch.is_tensor(t) and t.dim() > 0]
    return out


def cache_bytes(cfg: Mapping, dtype: str, batch: int, seq: int) -> tuple[int | None, str]:
    """``(bytes, how)`` of a decode step's cache: transformers' ``StaticCache(config,
    max_cache_len=seq + 1)`` for :func:`meta_model` of ``cfg`` (as the ``model`` family's decode
    inputs make it), its layers initialised by a prefill of :data:`META_PREFILL` tokens per
    sequence on the ``meta`` device (each layer's shape is fixed by ``max_cache_len``, its sliding
    window or its conv kernel); :func:`cache_tensors` summed. ``(None, why)`` where the model
    cannot be built or its step cannot run on ``meta``. Cached."""
    return _meta_cache(_cfg_key(cfg), dtype, int(batch), int(seq))


@functools.lru_cache(maxsize=16)
def _meta_cache(text: str, dtype: str, batch: int, seq: int) -> tuple[int | None, str]:
    import inspect

    import torch

    model, why = _meta_model(text, dtype)
    if model is None:
        return None, why
    try:
        from transformers import StaticCache

        fwd = inspect.signature(model.forward).parameters
        name = "cache" if "cache" in fwd else "past_key_values"   # transformers 5.2x renamed it
        extra = {"logits_to_keep": 1} if "logits_to_keep" in fwd else {}
        cache = StaticCache(config=model.config, max_cache_len=seq + 1)
        ids = torch.zeros(batch, min(seq, META_PREFILL), dtype=torch.long, device="meta")
        with torch.no_grad(), H.quiet_transformers():
            model(input_ids=ids, use_cache=True, **{name: cache}, **extra)
        return _tensor_bytes(cache_tensors(cache)), "StaticCache after a prefill on the meta device"
    except Exception as exc:  # the model's step does not run on meta: the dims formula stands in
        return None, _why(exc)


# -- the terms ---------------------------------------------------------------------------------------

def _tokens(case) -> tuple[int, int]:
    """(query tokens per sequence, keys per sequence) of the step."""
    return (1, case["seq"] + 1) if case["phase"] == "decode" else (case["seq"], case["seq"])


def module_terms(module, inputs=(), kwargs: Mapping | None = None) -> dict:
    """:func:`memory_terms` of a registered module (``model=module:NAME``): ``weights`` its own
    parameters and buffers, ``activations`` its input tensors' bytes, no cache."""
    import torch

    w = module_bytes(module)
    acts = _tensor_bytes([t for t in list(inputs) + list((kwargs or {}).values()) if torch.is_tensor(t)])
    return {"weights": int(w), "kv_cache": 0, "activations": int(acts), "total": int(w + acts),
            "how": "weights: the registered module's parameters and buffers; activations: its inputs"}


def memory_terms(case, dtype: str, cfg: Mapping) -> dict:
    """Bytes one case of the ``model`` family needs, before anything is allocated, for ``cfg``
    (the case's config, cut to its ``layers``): ``weights`` (:func:`weight_bytes`), ``kv_cache``
    (decode: :func:`cache_bytes`), ``activations``, ``total``, and ``how`` (the sources in words,
    naming any fallback to the config's dims).

    The activations rule: the largest live set of one layer's step -- per token row (``batch x``
    query tokens) ``4 x hidden`` (residual, normed input, attention output, MLP output) ``+ 3 x``
    the MLP intermediate (gate, up and their product; for MoE the larger of the dense
    intermediate and ``top_k x moe_intermediate + shared``) ``+ head_dim x (heads + 2 x
    kv_heads)`` (Q, K, V), x 2 for the reference and a compiled variant's buffers side by side;
    plus the fp32 logits of the kept position (``batch x vocab x 4``); decode adds the attention
    scores of the new tokens (``batch x heads x (seq + 1) x 4``, SDPA's math path on the CPU).
    Dims from :func:`model_dims` of ``cfg``."""
    d = model_dims(cfg)
    it = DTYPE_BYTES[dtype]
    b = case["batch"]
    q, kv = _tokens(case)
    hows = []
    w, w_how = weight_bytes(cfg, dtype)
    if w is None:
        w = d["params"] * it
        hows.append(f"weights from the config's dims (transformers could not build it on the meta device: {w_how})")
    cache, c_how = cache_bytes(cfg, dtype, b, case["seq"]) if case["phase"] == "decode" else (0, "")
    if cache is None:
        cache = 2 * d["layers"] * b * d["kv_heads"] * kv * d["head_dim"] * it
        hows.append(f"KV cache from the config's dims (the prefill did not run on the meta device: {c_how})")
    rows = b * q
    inter = max(d["inter"], d["top_k"] * d["moe_inter"] + d["shared_inter"]) if d["experts"] else d["inter"]
    per_row = 4 * d["hidden"] + 3 * inter + d["head_dim"] * (d["heads"] + 2 * d["kv_heads"])
    acts = 2 * (rows * per_row * it) + b * d["vocab"] * 4
    if case["phase"] == "decode":
        acts += rows * d["heads"] * kv * 4
    if not hows:
        hows.append("weights and cache counted from transformers' model and StaticCache on the meta device"
                    if case["phase"] == "decode" else "weights counted from transformers' model on the meta device")
    hows.append("activations from the config's dims")
    return {"weights": int(w), "kv_cache": int(cache), "activations": int(acts), "total": int(w + cache + acts),
            "how": "; ".join(hows)}


def terms_text(t: Mapping) -> str:
    """:func:`memory_terms`' terms in words, for :attr:`Operator.memory`: ``weights A + KV cache
    B + activations C (how)``, in GB."""
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    return (f"weights {gb(t['weights'])} + KV cache {gb(t['kv_cache'])} + activations "
            f"{gb(t['activations'])} ({t['how']})")


def tensor_sizes(t: Mapping) -> tuple:
    """:attr:`Operator.tensors` from :func:`memory_terms`: the weights and KV cache (held for the
    case) and the activations."""
    return tuple(TensorSize(n, role, (max(1, t[n]),), 1) for n, role in
                 (("weights", "input"), ("kv_cache", "input"), ("activations", "work")) if t[n])
