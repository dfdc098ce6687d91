"""Cutting a model config to N decoder layers (``layers=N``, ``--layers N``) without losing a kind
of layer.

A plain cut keeps the first N layers (``num_hidden_layers`` = N, every per-layer list cut to N).
On a hybrid that can drop a whole kind: Jamba's attention layer is every 8th from offset 4, so
``layers=2`` would build Mamba layers only; DeepSeek's first 3 layers are dense, so ``layers=2``
would build no expert. :func:`cut_config` judges kinds on the model transformers builds (on the
``meta`` device: no memory): a layer's kind is its class, the classes of its sub-modules (norms
aside) and its ``layer_types`` entry (sliding vs full attention), and what a cut must keep is each
of those parts somewhere among its layers (Jamba's attention, Mamba, MoE and dense MLP fit in two
layers: attention + MoE, Mamba + MLP). Where the first N layers lack a part of the full model it
tries, in order, a cut that picks N layers covering every kind (each
per-layer list -- ``layer_types``, ``layers_block_type``, ``hybrid_override_pattern`` -- picked
at those layers, each layer-index list -- ``attn_layer_indices``, ``full_attn_idxs``,
``mlp_only_layers`` -- renumbered), then the period and offset keys (``attn_layer_period`` /
``attn_layer_offset``, ``expert_layer_*``, ``first_k_dense_replace``, ``decoder_sparse_step``,
``moe_layer_start_index``, ``full_attention_interval`` ...) set to small values; the first config
whose built layers hold every part is kept. Where none does, the cut that holds the most parts is
built -- among those, one with an attention layer (a hybrid's decode step needs one: transformers
sizes its mask from the attention layers' cache) -- and the note names each part dropped.
"""
from __future__ import annotations

import copy
import functools
import itertools
import json
from typing import Mapping

from flyexplore.ops.model import hf as H

#: Integer keys that place layer kinds by period or offset, and the values a cut tries for each
#: (``"offset"``: 0..N-1; ``"period"``: 1..N).
PERIOD_KEYS = {"attn_layer_offset": "offset", "attn_layer_period": "period", "expert_layer_offset": "offset",
               "expert_layer_period": "period", "first_k_dense_replace": "offset", "decoder_sparse_step": "period",
               "moe_layer_start_index": "offset", "moe_layer_interval": "period", "interleave_moe_layer_step": "period",
               "full_attention_interval": "period", "moe_layer_freq": "period"}
#: Per-layer strings (one character a layer): NemotronH's ``hybrid_override_pattern``.
PATTERN_KEYS = ("hybrid_override_pattern",)
#: At most this many period/offset settings are tried (each one builds the cut model on ``meta``).
MAX_TRIES = 64


def _plain(cfg: Mapping, key: str, full: int, idx: list[int]) -> dict:
    """``cfg`` with ``key`` = len(idx), per-layer lists and patterns picked at ``idx`` and layer-index
    lists renumbered (an index list: a list of ints < full under a key ending ``indices``, ``idxs``
    or ``layers``)."""
    out = dict(cfg)
    out[key] = len(idx)
    keep = set(idx)
    for k, v in cfg.items():
        if k == "architectures":
            continue
        if isinstance(v, list) and len(v) == full:
            out[k] = [v[i] for i in idx]
        elif k in PATTERN_KEYS and isinstance(v, str) and len(v) == full:
            out[k] = "".join(v[i] for i in idx)
        elif (isinstance(v, list) and k.endswith(("indices", "idxs", "_layers")) and v
              and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < full for i in v)):
            out[k] = [j for j, i in enumerate(idx) if i in set(v) & keep]
    return out


def _decoder_layers(model, n: int):
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    return max(lists, key=lambda m: sum(1 for _ in m.modules()), default=None)


def _kind(layer, layer_type) -> str:
    parts = [type(layer).__name__] + [type(c).__name__ for name, c in layer.named_children()
                                      if "norm" not in name.lower() and "norm" not in type(c).__name__.lower()]
    return (f"{layer_type}: " if isinstance(layer_type, str) else "") + " + ".join(parts)


def layer_kinds(cfg: Mapping) -> list[str] | None:
    """Each decoder layer's kind (its class and its sub-modules' classes, norms aside, after the
    config's ``layer_types`` entry where it has one) in the model transformers builds from
    ``cfg`` on the ``meta`` device. ``None`` where it cannot be built or its layer list not found."""
    return _kinds_cached(json.dumps(cfg, sort_keys=True, default=str))


@functools.lru_cache(maxsize=64)
def _kinds_cached(text: str):
    import torch

    cfg = json.loads(text)
    try:
        desc = {"config": cfg, "where": "the config", "title": cfg.get("model_type", "model"), "name": "model"}
        scope = H.model_scope(desc)
        tr = H._transformers()
        with torch.device("meta"), H.quiet_transformers(), torch.random.fork_rng(devices=[]):
            model = getattr(tr, scope.get("auto", "AutoModelForCausalLM")).from_config(copy.deepcopy(scope["config"]))
    except Exception:  # transformers missing or the config not buildable: the plain cut stands
        return None
    text_cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = H._first(vars(text_cfg), H._LAYER_KEYS)[1] or H._first(cfg, H._LAYER_KEYS)[1]
    layers = _decoder_layers(model, int(n or 0))
    if layers is None:
        return None
    types = getattr(text_cfg, "layer_types", None)
    types = types if isinstance(types, (list, tuple)) and len(types) == len(layers) else [None] * len(layers)
    return [_kind(layer, t) for layer, t in zip(layers, types)]


def _parts(kind: str) -> set[str]:
    """The parts of a layer kind (:func:`_kind`): its ``layer_types`` entry and each class."""
    head, sep, body = kind.partition(": ")
    return ({head} | set(body.split(" + "))) if sep else set(kind.split(" + "))


def _attends(parts: set[str]) -> bool:
    """Whether a layer's parts hold (softmax) attention: a part named ``...attention`` or
    ``...Attention`` that is not linear attention."""
    return any("attention" in p.lower() and "linear" not in p.lower() for p in parts)


def _score(kinds: list[str], want: set[str]) -> tuple[int, bool]:
    """How good a cut is: the parts of ``want`` its layers hold, then whether one attends."""
    got = set().union(*map(_parts, kinds)) if kinds else set()
    return len(want & got), _attends(got & want) or not _attends(want)


def _cover(kinds: list[str], n: int) -> list[int]:
    """N layer indices, ascending: layers picked one at a time for the most parts not yet held
    (an attention layer first among equals), then the first layers."""
    parts = [_parts(k) for k in kinds]
    left = set().union(*parts)
    pick: list[int] = []
    while len(pick) < n and left:
        i = max((i for i in range(len(kinds)) if i not in pick),
                key=lambda i: (len(parts[i] & left), _attends(parts[i]), -i))
        if not parts[i] & left:
            break
        pick.append(i)
        left -= parts[i]
    rest = [i for i in range(len(kinds)) if i not in pick]
    return sorted(pick + rest[: n - len(pick)])


def _period_tries(cfg: Mapping, obj, n: int):
    keys = [k for k in PERIOD_KEYS if isinstance(getattr(obj, k, cfg.get(k)), int)
            and not isinstance(getattr(obj, k, cfg.get(k)), bool)]
    ranges = {k: list(range(0, n)) if PERIOD_KEYS[k] == "offset" else list(range(1, n + 1)) for k in keys}
    tries = 0
    for r in range(1, len(keys) + 1):
        for ks in itertools.combinations(keys, r):
            for vals in itertools.product(*(ranges[k] for k in ks)):
                if tries >= MAX_TRIES:
                    return
                tries += 1
                yield dict(zip(ks, vals))


def cut_config(cfg: Mapping, n: int) -> tuple[dict, str | None]:
    """``(config, note)``: ``cfg`` cut to ``n`` decoder layers keeping a layer of each kind of the
    full model where a config can say so (see the module's text for the order of tries), and the
    note: ``None`` for a plain cut of the first ``n`` layers that keeps every kind, else one
    sentence saying which layers were kept and how, or which kinds were dropped. ``n`` of 0 or past
    the model's layers: ``cfg`` unchanged (a copy). transformers builds each candidate on the
    ``meta`` device; where it cannot, the plain cut stands with no note."""
    cfg = dict(cfg)
    key, full = H._first(cfg, H._LAYER_KEYS)
    if not n or full is None or n >= full:
        if n and full is None:
            cfg[key] = n
        return cfg, None
    plain = _plain(cfg, key, full, list(range(n)))
    full_kinds = layer_kinds(cfg)
    if full_kinds is None:
        return plain, None
    want = set().union(*map(_parts, full_kinds))
    got = layer_kinds(plain)
    if got is None or _score(got, want) == (len(want), True):
        return plain, None
    first = f"the first {n} layer{'s are' if n > 1 else ' is'} built"
    best = (_score(got, want), plain, first, got)
    idx = _cover(full_kinds, n)
    tries = [(_plain(cfg, key, full, idx), f"layers {', '.join(map(str, idx))} of the {full} are built")] \
        if idx != list(range(n)) else []
    try:
        obj = H.make_config({"config": cfg, "where": "the config"})
    except Exception:
        obj = None
    tries = itertools.chain(tries, ((({**plain, **ch}), "the cut sets " + ", ".join(f"{a}={b}" for a, b in ch.items()))
                                    for ch in _period_tries(cfg, obj, n)))
    for cand, how in tries:
        k = layer_kinds(cand)
        if k is None:
            continue
        if _score(k, want) == (len(want), True):
            return cand, (f"layers: the first {n} of {full} layers lack a kind of layer, so {how} to hold one of "
                          f"each ({'; '.join(k)})")
        if _score(k, want) > best[0]:
            best = (_score(k, want), cand, how, k)
    _, cand, how, kept = best
    dropped = want - set().union(*map(_parts, kept))
    return cand, (f"layers: no cut to {n} of the {full} layers holds every kind of layer: {how} "
                  f"({'; '.join(kept)}), dropping {', '.join(sorted(dropped))}")
