"""Hugging Face transformers models from a ``config.json``, built with no weights, captured per phase.

:func:`capture_model` builds a transformers causal LM from its config under ``FakeTensorMode``
(``AutoModelForCausalLM.from_config`` with every parameter a fake tensor on ``cuda:0``: no
weights, no memory, no hub access) and captures one forward step of a phase with
:func:`flyexplore.insight.capture.run_step`:

- ``prefill``: ``batch`` sequences of ``seq`` tokens, no cache;
- ``decode``: one new token for each of ``batch`` sequences whose KV cache holds ``seq`` tokens
  (the cache is made by an unrecorded prefill of ``seq`` tokens).

Both phases ask for the last position's logits only (``logits_to_keep=1``, as ``generate`` does).

What is captured (:func:`model_scope`, from transformers' own auto tables): a decoder-only causal
LM as it is; an encoder (BERT, RoBERTa) as one bidirectional pass, prefill only (decode is refused:
no KV cache); a multimodal model's text decoder fed text only, its vision (or audio) tower and
cross-attention layers listed as not captured; an encoder-decoder model (T5, BART) is refused, as
is a ``model_type`` transformers does not know (:func:`check_model_type`, read before torch is
imported). Positions are checked against the built model's position table (:func:`check_positions`;
a rotary or ALiBi model is not refused, and says so). A ``quantization_config`` is named in the
assumptions with whether torch 2.15 has a FlyDSL path for it (:func:`quantization_note`; the GEMMs
are captured unquantized), and so is transformers' reference PyTorch code run for want of a kernel
package (:func:`fallback_notes`: Mamba without ``mamba_ssm``, Qwen3-Next without
``flash-linear-attention``).
The model gets ``attn_implementation="sdpa"`` where the model supports it and transformers'
default experts implementation (``grouped_mm``: ``torch._grouped_mm`` with the weights as the
model stores them, where the model's experts support it); what the experts really called is
said from the capture (:func:`experts_notes`). The built-in configs (:func:`builtin_models`) are the published dims of a
few models, in ``data/models/`` with their sources.

Bounds (:func:`check_model`, run before torch is touched): a config's sizes must be positive
integers and its numbers finite; no tensor of the step may pass what torch can address
(2**63 bytes); and past :data:`MODEL_LIMITS` (512 layers, 2,048 experts, an estimated 30 min,
or more memory than is available) a model is refused unless ``force``. Only the layer count (times
views and phases) costs time and memory here: under fake tensors hidden size, heads, vocabulary,
experts, batch and sequence length cost nothing (measured, :data:`LAYER_COST`).

transformers is an optional dependency (``pip install 'flyexplore[models]'``).
"""
from __future__ import annotations

import ast
import contextlib
import copy
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.capture import (VIEWS, Capture, CaptureError, fake_mode, layer_kinds, quiet_torch_logs,
                                        run_step, target_device, views_of)
from flyexplore.measure.devstate import cpu_free_memory
from flyexplore.paths import data_dir
from flyexplore.world.conditions import short_dtype

#: Phases of :func:`capture_model`.
PHASES = ("prefill", "decode")
#: MoE routing assumptions: ``uniform`` (every expert gets the same share of the routed rows) or
#: ``zipf:S`` (expert i, by load rank, gets a share proportional to 1 / (i + 1) ** S; S > 0).
ROUTINGS = ("uniform", "zipf:S")
#: What one decoder layer costs :func:`capture_model`, ``{stage: (CPU seconds, peak-RSS MB)}`` a layer:
#: ``build`` once per model, ``prefill`` / ``decode`` per recorded view of a phase (decode with its
#: unrecorded prefill, which fills the KV cache and is most of its cost). Measured here on a
#: Llama-style config (hidden 512, 8 heads, seq 128) at 40 and 240 layers, the difference over 200
#: layers, on the project's 2-core x86 CPU (torch 2.15, transformers 5.25, process CPU time), with
#: identical layers recorded once (issue 34; :class:`flyexplore.insight.capture._LayerReuse`):
#: prefill 0.6-3.0 ms a layer and view, decode 15 ms, the build 5.4 ms. Before it (issue 33) a
#: layer and view cost 80 ms (prefill) and 128 ms (decode), and a break-it trial saw a 1e5-layer
#: config run 20 min at 4.7 GB and 1,000 layers in 94 s: the estimate errs long. Hidden size (512
#: vs 65,536), vocabulary (32k vs 10M), heads (8 vs 512), experts (8 vs 4,096) and seq (128 vs 1e7)
#: changed neither time nor memory (fake tensors hold no data), except where model code loops over
#: the sequence (a reference scan: its calls are folded, the loop still runs per token).
LAYER_COST = {"build": (0.006, 0.05), "prefill": (0.003, 0.06), "decode": (0.016, 0.06)}
#: Model types whose transformers code loops over the sequence when a package is missing:
#: ``{model_type: (CPU seconds a token and view, the package)}``. Measured with
#: ``benchmarks/evidence/model_capture.py --long``: a Mamba-130m-like config at prefill 1x2048 spent
#: 6.2 s capturing each view (identical layers recorded once), 3 ms a token.
SCAN_COST = {"mamba": (0.003, "mamba_ssm"), "falcon_mamba": (0.003, "mamba_ssm")}
#: The part of a run that does not grow with the layers (seconds, MB): torch and transformers
#: imported, the first build's imports, the tables (same measurement).
BASE_COST = (8.0, 850.0)
#: Past these :func:`check_model` refuses a model unless ``force`` (``flyexplore model --force``):
#: ``layers`` (``num_hidden_layers``), ``experts`` (each is a row count in the exported shapes),
#: ``seconds`` (the :func:`estimate_model` time of the whole run); and the memory available now
#: (``MemAvailable``) against the estimate.
MODEL_LIMITS = {"layers": 512, "experts": 2048, "seconds": 1800.0}
#: An estimate this long (s) or longer is printed before the run starts.
SAY_ESTIMATE_S = 60.0
#: Config fields that must be positive integers, and positive numbers (plus any ``*_eps`` /
#: ``*epsilon``), where present and not null.
POSITIVE_INT_FIELDS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                       "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                       "max_position_embeddings", "num_experts", "num_local_experts", "n_routed_experts",
                       "num_experts_per_tok", "experts_per_token", "n_layer", "n_head", "n_embd", "n_positions")
POSITIVE_FIELDS = ("rope_theta", "eps")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
#: What one torch tensor can address, bytes (its storage size is an int64); each element is
#: counted at 4 bytes (fp32, the widest dtype a captured step uses).
_MAX_BYTES = 2 ** 63 - 1


def routing_shares(routing: str, experts: int) -> list[float]:
    """Each expert's share of the routed rows under ``routing`` (:data:`ROUTINGS`), summing to 1.
    Raises :class:`UsageError` for an unknown routing or a bad exponent."""
    r = str(routing).strip()
    if r == "uniform":
        return [1.0 / experts] * experts
    if r.startswith("zipf:"):
        try:
            s = float(r.split(":", 1)[1])
        except ValueError:
            s = float("nan")
        if not s > 0 or s > 10:
            raise UsageError(f"routing {routing!r}: the zipf exponent must be a number in (0, 10], e.g. zipf:1.1")
        w = [1.0 / (i + 1) ** s for i in range(experts)]
        t = sum(w)
        return [x / t for x in w]
    raise bad_choice("MoE routing", routing, ROUTINGS)


def models_dir() -> Path:
    """``data/models``: the built-in configs."""
    return data_dir() / "models"


def builtin_models() -> dict[str, str]:
    """``{name: title}`` of the built-in configs (``flyexplore model --hf NAME``)."""
    out = {}
    for p in sorted(models_dir().glob("*.json")):
        out[p.stem] = json.loads(p.read_text()).get("title", p.stem)
    return out


def load_config(hf: str | None = None, config: str | Path | Mapping | None = None) -> dict:
    """The model description to build: ``{"name", "title", "source", "config", "where", "notes"}``
    (``where``: the file, or the built-in name, for messages; ``notes``: what the build will not do
    that the config asks for -- ``auto_map`` / ``trust_remote_code`` code is never run).

    ``hf``: a built-in name (:func:`builtin_models`); ``config``: a ``config.json`` path (a Hugging
    Face config, or a built-in file's layout with a ``config`` key) or its dict. Exactly one.
    Raises :class:`UsageError` naming an unknown model, a missing or unreadable file, or a config
    without ``model_type``."""
    if (hf is None) == (config is None):
        raise UsageError("give exactly one of a built-in model name (--hf) and a config file (--config)")
    if hf is not None:
        names = builtin_models()
        key = str(hf).strip().lower()
        if key not in names:
            raise bad_choice("model", hf, names)
        d = json.loads((models_dir() / f"{key}.json").read_text())
        return {"name": key, "title": d.get("title", key), "source": d.get("source", ""), "config": d["config"],
                "where": f"built-in model {key}", "notes": []}
    if isinstance(config, Mapping) and isinstance(config.get("config"), Mapping) and "where" in config:
        return dict(config)  # a description already loaded
    if isinstance(config, Mapping):
        d, where = dict(config), "the config given"
    else:
        p = Path(config)
        where = str(p)
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            raise UsageError(f"config file {p} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UsageError(f"config file {p} is not readable JSON ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:120]})") from None
        if not isinstance(d, dict):
            raise UsageError(f"config file {p} holds a JSON {type(d).__name__}, not an object")
    cfg = d.get("config", d) if isinstance(d.get("config"), dict) else d
    if "model_type" not in cfg:
        raise UsageError(f"{where} has no model_type: not a transformers config.json")
    name = d.get("name") or (Path(where).stem if not isinstance(config, Mapping) else cfg["model_type"])
    return {"name": name, "title": d.get("title", name), "source": d.get("source", where), "config": cfg,
            "where": where, "notes": _custom_code_notes(cfg, where)}


def _custom_code_notes(cfg: Mapping, where: str) -> list[str]:
    """The note for a config that names custom code (``auto_map``, ``trust_remote_code``): it is
    not run; the built-in transformers class of its ``model_type`` is built instead."""
    amap = cfg.get("auto_map")
    named = sorted({str(v) for v in (amap.values() if isinstance(amap, Mapping) else [amap] if amap else [])})
    asks = ["auto_map " + ", ".join(named)] if named else []
    if cfg.get("trust_remote_code"):
        asks.append("trust_remote_code")
    if not asks:
        return []
    note = (f"{where} names custom code ({'; '.join(asks)}): not run -- flyexplore builds transformers' own "
            f"class for model_type {cfg.get('model_type')!r}, which may differ from that code")
    return [note]


def _first(cfg: Mapping, keys: Sequence[str]):
    """The first of ``keys`` that ``cfg`` sets (not null): ``(key, value)``, else ``(keys[0], None)``."""
    return next(((k, cfg[k]) for k in keys if cfg.get(k) is not None), (keys[0], None))


def _leaves(obj, path: str = ""):
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def check_config(desc: Mapping) -> None:
    """Raise :class:`UsageError` naming the file, the field and the value for a config number
    that cannot describe a model: any number (nested ones too) that is NaN or infinite; a
    :data:`POSITIVE_INT_FIELDS` field that is not a positive integer; a :data:`POSITIVE_FIELDS`
    field (and any ``*_eps`` / ``*epsilon``) that is not a positive number. transformers accepts
    ``rms_norm_eps: NaN`` (and a NaN norm makes every value of the step NaN)."""
    cfg, where = desc["config"], desc.get("where", desc.get("source", "the config"))
    for path, v in _leaves(cfg):
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{where}: {path} is {'NaN' if math.isnan(v) else v}, not a finite number")
    for k, v in cfg.items():
        if v is None:
            continue
        if k in POSITIVE_INT_FIELDS and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise UsageError(f"{where}: {k} must be a positive integer, got {v!r}")
        if (k in POSITIVE_FIELDS or k.endswith(("_eps", "epsilon"))) and (
                not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
            raise UsageError(f"{where}: {k} must be a positive number, got {v!r}")


def _mapping_keys(path: Path) -> set[str]:
    """The model types a transformers ``auto`` file puts in ``CONFIG_MAPPING_NAMES``: the string keys of
    the dicts and of the ``(key, value)`` pairs in each statement that assigns or updates it, read
    from the file's syntax tree (the file is not imported)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if "CONFIG_MAPPING_NAMES" not in ast.unparse(node).split("=", 1)[0].split("(", 1)[0]:
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Dict):
                out |= {k.value for k in sub.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            elif isinstance(sub, ast.Tuple) and len(sub.elts) == 2 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in sub.elts):
                out.add(sub.elts[0].value)
    return out


def transformers_model_types() -> tuple[str, frozenset[str]] | None:
    """``(version, model types)`` of the installed transformers, without importing it (nor torch):
    the keys of ``CONFIG_MAPPING_NAMES`` as written in ``transformers/models/auto/auto_mappings.py``
    and ``transformers/models/auto/configuration_auto.py`` (where ``AutoConfig.for_model`` looks a
    model type up), read from their source. ``None`` where transformers is not installed or its
    files are not laid out so (then the build's own error speaks)."""
    try:
        spec = importlib.util.find_spec("transformers")
        root = Path(next(iter(spec.submodule_search_locations)))
        ver = importlib.metadata.version("transformers")
        types: set[str] = set()
        for f in ("auto_mappings.py", "configuration_auto.py"):
            if (root / "models" / "auto" / f).is_file():
                types |= _mapping_keys(root / "models" / "auto" / f)
    except Exception:  # not installed, or a layout this reader does not know
        return None
    return (ver, frozenset(types)) if len(types) > 50 else None


def check_model_type(desc: Mapping) -> None:
    """Raise :class:`UsageError` (one line) when the config's ``model_type`` is not one transformers
    knows (:func:`transformers_model_types`, read without importing transformers or torch): a config
    for custom code (``auto_map``) is named as such -- flyexplore never runs that code -- and any
    other unknown type says only that transformers does not know it. A type registered in this
    process (``AutoConfig.register``, transformers already imported) passes."""
    cfg, where = desc["config"], desc.get("where", "the config")
    known = transformers_model_types()
    mt = cfg.get("model_type")
    if known is None or mt in known[1]:
        return
    auto = sys.modules.get("transformers.models.auto.configuration_auto")
    if auto is not None and mt in getattr(auto, "CONFIG_MAPPING", {}):
        return  # registered in this process (AutoConfig.register)
    msg = f"{where}: cannot build a config of model_type {mt!r}: it is not a transformers {known[0]} model type"
    amap = cfg.get("auto_map")
    named = sorted({str(v) for v in (amap.values() if isinstance(amap, Mapping) else [amap] if amap else [])})
    if named:
        msg += f"; its config names custom code (auto_map {', '.join(named)}), which flyexplore never runs"
    raise UsageError(msg)


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def estimate_model(desc: Mapping, phases: Sequence[tuple[str, int, int]], views: Sequence[str]) -> dict:
    """The time and memory of capturing ``desc`` (:func:`load_config`) in each of ``phases``
    (``(phase, batch, seq)``) and ``views``, from :data:`LAYER_COST` and :data:`BASE_COST` (on the
    CPU they were measured on; a faster one takes less): ``{"layers", "experts", "seconds", "mb",
    "text"}``. The layer count is ``num_hidden_layers`` (or ``n_layer`` / ``num_layers``; 1 where
    none is set)."""
    cfg = desc["config"]
    layers = _first(cfg, _LAYER_KEYS)[1] or 1
    experts = _first(cfg, _EXPERT_KEYS)[1] or 0
    per = [LAYER_COST["build"]] + [LAYER_COST[ph] for ph, *_ in phases for _ in views]
    sec = BASE_COST[0] + layers * sum(c[0] for c in per)
    mb = BASE_COST[1] + layers * sum(c[1] for c in per)
    text = (f"about {_duration(sec)} and {mb / 1024:.1f} GB: {layers} layers x {len(views)} view(s) x "
            f"{len(phases)} phase(s) at {1e3 * sum(c[0] for c in per[1:]) / max(1, len(per) - 1):.0f} ms a layer "
            "and view, as measured on a 2-core x86 CPU")
    scan = SCAN_COST.get(str(cfg.get("model_type")))
    if scan and importlib.util.find_spec(scan[1]) is None:
        # transformers' reference scan loops over the tokens (decode: in the prefill that fills its cache)
        tokens = sum(sq for _, _, sq in phases) * len(views)
        sec += scan[0] * tokens
        text = (f"about {_duration(sec)} and {mb / 1024:.1f} GB: {layers} layers x {len(views)} view(s) x "
                f"{len(phases)} phase(s), and {tokens:,} token steps of transformers' reference scan "
                f"({scan[1]} not installed) at {1e3 * scan[0]:.0f} ms each, as measured on a 2-core x86 CPU")
    return {"layers": layers, "experts": experts, "seconds": sec, "mb": mb, "text": text}


def _check_addressable(cfg: Mapping, where: str, phase: str, batch: int, seq: int) -> None:
    """Raise :class:`UsageError` when a tensor of the step would pass what torch can address
    (:data:`_MAX_BYTES` at 4 bytes an element): torch fails inside the step on it."""
    heads = _first(cfg, _HEAD_KEYS)[1] or 1
    hidden = cfg.get("hidden_size") or cfg.get("n_embd") or 1
    experts = _first(cfg, _EXPERT_KEYS)[1] or 1
    big = [(f"seq {seq} ({phase}, batch {batch}): the attention scores [batch, heads, seq, seq]",
            (batch, heads, seq, seq)),
           (f"{where}: the embedding [vocab_size, hidden_size]", (cfg.get("vocab_size") or 1, hidden)),
           (f"seq {seq} ({phase}, batch {batch}): the MLP activations [batch x seq, intermediate_size]",
            (batch * seq, cfg.get("intermediate_size") or 1)),
           (f"{where}: the expert weights [experts, 2 x moe_intermediate_size, hidden_size]",
            (experts, 2 * (cfg.get("moe_intermediate_size") or 1), hidden))]
    for what, shape in big:
        n = math.prod(shape)
        if n * 4 > _MAX_BYTES:
            hint = ""
            if "attention" in what:
                top = math.isqrt(_MAX_BYTES // (4 * batch * heads))
                hint = f"; the largest seq at batch {batch} with {heads} heads is {top}"
            raise UsageError(f"{what} would hold {n:.3g} elements, past what one torch tensor can address "
                             f"(2**63 bytes at 4 bytes an element){hint}")


def check_model(desc: Mapping, phases: Sequence[tuple[str, int, int]], views: Sequence[str] = VIEWS, *,
                force: bool = False) -> dict:
    """Check a model run before torch is touched, and return its :func:`estimate_model`.

    Raises :class:`UsageError` (one line naming the file, field or option, the value and the
    limit) for: a ``model_type`` transformers does not know (:func:`check_model_type`); a config
    number that cannot describe a model (:func:`check_config`); a phase that makes no sense
    (:func:`check_phase`; positions are checked against the built model's position table, by
    :func:`check_positions`, since only the built model says whether it has one); a tensor of the step past
    what torch can address (2**63 bytes: the attention scores [batch, heads, seq, seq] at
    ``seq`` 1e9); and, unless ``force``, a model past :data:`MODEL_LIMITS` (layers, experts, the
    estimated time) or whose estimated memory passes what is available now (``MemAvailable``)."""
    check_model_type(desc)
    check_config(desc)
    cfg, where = desc["config"], desc.get("where", "the config")
    for ph, b, sq in phases:
        check_phase(ph, b, sq)
        _check_addressable(cfg, where, ph, b, sq)
    est = estimate_model(desc, phases, views)
    if force:
        return est
    go_on = "give --force (fx.model(..., force=True)) to run it anyway"
    lk, layers = _first(cfg, _LAYER_KEYS)
    ek, experts = _first(cfg, _EXPERT_KEYS)
    for key, v, lim in ((lk, layers, MODEL_LIMITS["layers"]), (ek, experts, MODEL_LIMITS["experts"])):
        if v is not None and v > lim:
            raise UsageError(f"{where}: {key} {v} is past the limit of {lim} (estimate: {est['text']}); {go_on}")
    if est["seconds"] > MODEL_LIMITS["seconds"]:
        raise UsageError(f"{where}: the run's estimate is past the limit of {_duration(MODEL_LIMITS['seconds'])} "
                         f"(estimate: {est['text']}); capture fewer phases or views, or {go_on}")
    free, _ = cpu_free_memory()
    if free is not None and est["mb"] * 2 ** 20 > free:
        raise UsageError(f"{where}: the run needs more memory than is available ({free / 2 ** 30:.1f} GB; "
                         f"estimate: {est['text']}); {go_on}")
    return est


def _transformers():
    try:
        logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum notices
        import transformers
    except ImportError:
        raise UsageError("capturing a Hugging Face model needs transformers: "
                         "pip install 'flyexplore[models]'") from None
    return transformers


def make_config(desc: Mapping):
    """A transformers ``PretrainedConfig`` from :func:`load_config`'s ``config`` dict
    (``AutoConfig.for_model``). Raises :class:`UsageError` when transformers cannot build it."""
    tr = _transformers()
    cfg = dict(desc["config"])
    mt = cfg.pop("model_type")
    for k in ("architectures", "transformers_version", "quantization_config", "auto_map", "trust_remote_code"):
        cfg.pop(k, None)
    try:
        return tr.AutoConfig.for_model(mt, **cfg)
    except Exception as exc:  # transformers' and huggingface_hub's validators raise their own types
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = lines[-1] if lines else ""
        custom = "; its custom code (auto_map) is never run" if desc["config"].get("auto_map") else ""
        raise UsageError(f"transformers {tr.__version__} cannot build a config of model_type {mt!r} "
                         f"({type(exc).__name__}: {why[:200]}){custom}") from None


def check_phase(phase: str, batch: int, seq: int, max_positions: int | None = None) -> None:
    """Raise :class:`UsageError` for a phase that makes no sense: an unknown phase, a batch or
    sequence below 1, or, where ``max_positions`` is given, a sequence (decode: the context, plus
    the new token) past it. :func:`check_model` gives no ``max_positions``: whether positions past
    ``max_position_embeddings`` fail is a property of the built model (a learned position table
    fails, rotary or ALiBi positions do not), checked by :func:`check_positions`."""
    if phase not in PHASES:
        raise bad_choice("phase", phase, PHASES)
    for what, v in (("batch", batch), ("seq", seq)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"{what} must be a positive integer, got {v!r}")
    total = seq + (1 if phase == "decode" else 0)
    if max_positions and total > max_positions:
        raise UsageError(f"{phase} at seq {seq} needs {total} positions, past the model's "
                         f"max_position_embeddings {max_positions}")


#: A module or buffer that holds one row per position (its last dotted name): gpt2 ``wpe``, OPT
#: ``embed_positions``, BERT ``position_embeddings``, GPT-J's sinusoidal ``embed_positions`` buffer.
_POSITION_NAME = re.compile(r"^(wpe|.*pos.*)$", re.IGNORECASE)


def position_tables(model) -> list[dict]:
    """The learned (or precomputed) position tables of a built model: ``{"name", "class", "shape",
    "positions"}`` for each ``nn.Embedding`` -- and each 2-D buffer -- whose name is ``wpe`` or holds
    ``pos`` (``position_ids`` buffers excepted). ``positions``: how many positions the table can
    index: its rows less an ``offset`` attribute (OPT's learned embedding adds 2 to every position:
    ``transformers/models/opt/modeling_opt.py::OPTLearnedPositionalEmbedding``), else less
    ``padding_idx + 1`` where the embedding has a padding index (RoBERTa-style positions start
    after it: ``transformers/models/roberta/modeling_roberta.py::create_position_ids_from_input_ids``).
    Rotary and ALiBi models have none (their positions are computed)."""
    import torch

    out = []
    for path, m in model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if isinstance(m, torch.nn.Embedding) and _POSITION_NAME.match(leaf):
            rows = m.num_embeddings
            off = getattr(m, "offset", None)
            if isinstance(off, int):
                usable = rows - off
            elif m.padding_idx is not None:
                usable = rows - (m.padding_idx + 1)
            else:
                usable = rows
            out.append({"name": path, "class": type(m).__name__, "shape": [rows, m.embedding_dim],
                        "positions": usable})
        for bname, b in m.named_buffers(recurse=False):
            if b is not None and b.dim() == 2 and _POSITION_NAME.match(bname) and not bname.endswith("_ids"):
                out.append({"name": f"{path}.{bname}" if path else bname, "class": "buffer",
                            "shape": list(b.shape), "positions": int(b.shape[0])})
    return out


def check_positions(model, phase: str, seq: int) -> str | None:
    """Check the positions a step uses (prefill: ``seq``; decode: the context ``seq`` plus the new
    token) against the built model. Raises :class:`UsageError` (one line naming the table and its
    size) past a position table (:func:`position_tables`: a real run indexes past it and fails with
    an IndexError; a fake-tensor run would not notice). Where the model has no table (rotary,
    ALiBi) and the positions pass ``max_position_embeddings``, returns the assumption sentence
    saying they are computed and not checked; else ``None``."""
    total = seq + (1 if phase == "decode" else 0)
    tables = position_tables(model)
    for t in tables:
        if total > t["positions"]:
            size = "[" + ", ".join(map(str, t["shape"])) + "]"
            extra = "" if t["positions"] == t["shape"][0] else f" ({t['positions']} usable positions)"
            raise UsageError(f"{phase} at seq {seq} needs {total} positions, past {type(model).__name__}'s position "
                             f"table {t['name']} {size}{extra}; a real run would fail indexing it")
    mp = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(mp, int) and total > mp and not tables:
        return (f"positions: {phase} at seq {seq} uses {total} positions, past max_position_embeddings {mp}; "
                f"{type(model).__name__} has no position table (rotary or ALiBi positions are computed), so they "
                "are captured as computed and not checked against a table -- the model's quality there is not judged")
    return None


# -- what of a model is captured ---------------------------------------------------------------------

#: The input a multimodal part encodes, by its sub-config's name less ``_config``.
_INPUT_OF = {"vision": "image", "audio": "audio", "speech": "audio"}


def model_scope(desc: Mapping, model=None) -> dict:
    """What of the model of ``desc`` (:func:`load_config`) flyexplore captures, decided from
    transformers' own tables (``transformers/models/auto/modeling_auto.py``:
    ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, ``MODEL_FOR_MASKED_LM_MAPPING_NAMES``) and the config
    (``is_encoder_decoder``, ``is_decoder``, ``sub_configs``, ``get_text_config()``,
    ``cross_attention_layers``). Returns ``{"kind", "config", "notes", "uncaptured", "no_decode"}``:

    - ``decoder`` (a causal LM: Llama, GPT-2, Mamba...): built with ``AutoModelForCausalLM``, as
      ever; ``notes`` empty.
    - ``encoder`` (a model type with a masked-LM class whose config is not ``is_decoder``: BERT,
      RoBERTa...): transformers' causal-LM class of it (``BertLMHeadModel``) runs one bidirectional
      pass with no KV cache; captured as the prefill step, with a note saying so; ``no_decode``
      holds the one-line refusal of a decode phase.
    - ``multimodal`` (a config with sub-configs besides the text one: mllama, llava, gemma3...): the
      text decoder is built -- the model type's own causal-LM class where transformers has one,
      else the ``text_config``'s -- and fed text only; every other part (vision tower: its class
      from ``MODEL_MAPPING_NAMES`` of the sub-config's model type, else the sub-config's class name
      with ``Config`` -> ``Model``) is an ``uncaptured`` entry, and so are the text decoder's
      ``cross_attention_layers`` (``transformers/models/mllama/modeling_mllama.py::MllamaTextModel``
      skips them with no image input).

    ``config``: the transformers config to build. Raises :class:`UsageError` (one line naming the
    model type) for an encoder-decoder model (``is_encoder_decoder``: T5, BART, Whisper -- the
    decoder alone, with no encoder, is not the model's step) and a model type with no causal-LM
    class (nor a text config that has one). ``model``: the built model, to name the
    cross-attention layers' class."""
    tr = _transformers()
    from transformers.models.auto import modeling_auto as MA

    cfg = make_config(desc)
    mt, ver = cfg.model_type, tr.__version__
    causal, masked = MA.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MA.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    what = "flyexplore captures decoder-only causal LMs (transformers' AutoModelForCausalLM) and the text decoder " \
           "of multimodal ones"
    if getattr(cfg, "is_encoder_decoder", False):
        raise UsageError(f"model_type {mt!r} is an encoder-decoder model (is_encoder_decoder true): {what}; its "
                         "decoder alone, with no encoder output, is not its step")
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    out = {"kind": "decoder", "config": cfg, "notes": [], "uncaptured": [], "no_decode": None}
    if mt not in causal:
        if text is cfg or getattr(text, "model_type", None) not in causal:
            tt = "" if text is cfg else f", nor has its text config ({getattr(text, 'model_type', None)!r})"
            raise UsageError(f"model_type {mt!r} has no causal-LM class in transformers {ver}{tt}: {what}")
        out["config"] = text
        out["notes"].append(f"multimodal model {mt!r}: its text decoder (text config, model_type {text.model_type!r}, "
                            f"transformers' {causal[text.model_type]}) is built and fed text only")
    elif mt in masked and not getattr(cfg, "is_decoder", False):
        out["kind"] = "encoder"
        out["notes"].append(f"encoder model {mt!r} (is_decoder false): transformers' {causal[mt]} runs one "
                            "bidirectional pass over the batch x seq tokens (no causal mask, no KV cache) and its "
                            "LM head; captured as the prefill step")
        out["no_decode"] = (f"decode: model_type {mt!r} is an encoder (is_decoder false: {causal[mt]} keeps no KV "
                            "cache); flyexplore captures its prefill (one encoder pass) only")
    others = [k for k in (getattr(cfg, "sub_configs", None) or {})
              if getattr(cfg, k, None) is not None and getattr(cfg, k) is not text]
    if others:
        out["kind"] = "multimodal"
        if not out["notes"]:
            out["notes"].append(f"multimodal model {mt!r}: its text decoder is built ({causal[mt]}) and fed text only")
    for k in others:
        sub = getattr(cfg, k)
        part = k[:-len("_config")] if k.endswith("_config") else k
        cls = MA.MODEL_MAPPING_NAMES.get(getattr(sub, "model_type", ""), "") or \
            re.sub(r"Config$", "Model", type(sub).__name__)
        out["uncaptured"].append({"op": f"{part} tower", "module": k, "module_type": cls,
                                  "reason": f"not captured -- flyexplore captures the text decoder "
                                            f"(no {_INPUT_OF.get(part, part)} input)"})
    cross = getattr(out["config"].get_text_config() if hasattr(out["config"], "get_text_config") else out["config"],
                    "cross_attention_layers", None)
    if cross:
        layers = _first(vars(text), _LAYER_KEYS)[1]
        of = f" (of {layers})" if layers else ""
        cls = ""
        if model is not None:
            idx = re.compile(r"\.(%s)$" % "|".join(map(str, cross)))
            cls = next((type(m).__name__ for n, m in model.named_modules() if idx.search(n)), "")
        out["uncaptured"].append({"op": f"cross-attention layers {', '.join(map(str, cross))}{of}",
                                  "module": "model.layers", "module_type": cls,
                                  "reason": "not captured -- no image input (transformers skips them with no "
                                            "cross-attention states): the captured layers are the self-attention ones"})
    return out


# -- quantization ------------------------------------------------------------------------------------

#: What torch 2.15 compiles to FlyDSL for the weight formats of a ``quantization_config``,
#: ``{key: (format, verdict)}`` for :func:`quantization_note` (key: ``quant_method``, with
#: ``fp8:block`` for an ``fp8`` config that sets ``weight_block_size``). Sources (torch 2.15):
#: ``torch/_inductor/kernel/mm.py::get_flydsl_mxfp_template_kwargs`` -- the only FlyDSL scaled
#: GEMM, the dense MXFP ``aten._scaled_mm_v2`` (BlockWise1x32 recipe: both operands
#: float8_e4m3fn or float4_e2m1fn_x2, float8_e8m0fnu scales, one per 32 elements of K,
#: K % 128 == 0, a bf16/fp16 output); ``torch/_inductor/kernel/mm_grouped.py::
#: use_flydsl_grouped_mm_template`` -- False for any scaled grouped GEMM (the FlyDSL grouped GEMM
#: takes bf16/fp16 operands), so ``aten._scaled_grouped_mm`` (MXFP4 MoE experts) has none. Block-128x128 FP8 with fp32
#: scales (DeepSeek-V3's ``weight_block_size: [128, 128]``), per-tensor and per-row FP8 have no
#: FlyDSL path.
QUANT_FLYDSL = {
    "mxfp4": ("MXFP4 (float4_e2m1fn_x2 values, a float8_e8m0fnu scale per 32 elements)",
              "a dense MXFP4 GEMM has a FlyDSL path (aten._scaled_mm_v2, BlockWise1x32 recipe, K % 128 == 0); "
              "expert (grouped) GEMMs have none (aten._scaled_grouped_mm has no FlyDSL path)"),
    "fp8:block": ("block-wise FP8 ({fmt}, fp32 weight scales per {block} block)",
                  "there is no FlyDSL path for block-wise FP8 with fp32 scales, dense or grouped (the only FlyDSL "
                  "scaled GEMM is the MXFP aten._scaled_mm_v2, BlockWise1x32 with e8m0 scales)"),
    "fp8": ("per-tensor FP8 ({fmt})",
            "there is no FlyDSL path for per-tensor FP8 (the only FlyDSL scaled GEMM is the MXFP "
            "aten._scaled_mm_v2, BlockWise1x32 with e8m0 scales)"),
    "fbgemm_fp8": ("per-row FP8 (float8_e4m3fn, a scale per row)",
                   "there is no FlyDSL path for per-row FP8 (the only FlyDSL scaled GEMM is the MXFP "
                   "aten._scaled_mm_v2, BlockWise1x32 with e8m0 scales)"),
}


def quantization_note(cfg: Mapping, dtype: str = "bf16") -> str | None:
    """The assumption sentence for a config's ``quantization_config`` (``None`` without one): its
    ``quant_method`` and format, that the GEMMs are captured unquantized (as ``dtype``: no weights
    and no quantizer are loaded), and whether torch 2.15 has a FlyDSL path for it
    (:data:`QUANT_FLYDSL`; a method not there is "not judged")."""
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    m = str(q.get("quant_method") or "unknown")
    block = q.get("weight_block_size")
    key = "fp8:block" if m == "fp8" and block else m
    fmt = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}.get(str(q.get("fmt", "e4m3")), str(q.get("fmt")))
    bs = "x".join(map(str, block)) if isinstance(block, (list, tuple)) else str(block)
    keep = q.get("modules_to_not_convert")
    kept = f"; not quantized: {', '.join(map(str, keep))}" if isinstance(keep, (list, tuple)) and keep else ""
    head = f"quantization_config: quant_method {m!r}"
    if key in QUANT_FLYDSL:
        form, verdict = QUANT_FLYDSL[key]
        head += f", {form.format(fmt=fmt, block=bs)}{kept}"
        verdict = f"in torch 2.15 {verdict}"
    else:
        verdict = "whether torch 2.15 has a FlyDSL path for it is not judged"
        head += kept
    return f"{head} -- the GEMMs are captured unquantized, as {dtype}: no weights or quantizer are loaded; {verdict}"


# -- reference code paths ----------------------------------------------------------------------------

#: transformers' warning when a kernel-backed function runs its reference PyTorch code
#: (``transformers/integrations/hub_kernels.py::use_kernel_func_from_hub_with_fallback``).
_FALLBACK = re.compile(r"`(\w+)` is falling back to its reference PyTorch implementation because `([\w.\-]+)`")
#: ``{module class: {function: package}}`` seen falling back in this process (transformers warns
#: once a process: a later capture of the same class reads it from here).
FALLBACKS_SEEN: dict[str, dict[str, str]] = {}


@contextlib.contextmanager
def watch_fallbacks():
    """Record transformers' fallback warnings (:data:`_FALLBACK`) into :data:`FALLBACKS_SEEN`,
    under the class of the nearest model module on the stack when each is emitted (an ``nn.Module``
    of a ``transformers.models.*`` file; transformers wraps the kernel functions themselves in
    modules made inside a function, ``_create_func_module.<locals>.Func``, which are passed over)."""
    import torch

    class Watch(logging.Handler):
        def emit(self, record):
            m = _FALLBACK.search(record.getMessage())
            if not m:
                return
            f, cls = sys._getframe(), "?"
            while f is not None:
                me = f.f_locals.get("self")
                if isinstance(me, torch.nn.Module) and type(me).__module__.startswith("transformers.models.") \
                        and "<locals>" not in type(me).__qualname__:
                    cls = type(me).__name__
                    break
                f = f.f_back
            FALLBACKS_SEEN.setdefault(cls, {})[m.group(1)] = m.group(2)

    h = Watch(level=logging.WARNING)
    lg = logging.getLogger("transformers")
    lg.addHandler(h)
    try:
        yield
    finally:
        lg.removeHandler(h)


def fallback_notes(model) -> list[str]:
    """One assumption sentence per module class of ``model`` that ran transformers' reference
    PyTorch code for want of a kernel package (:data:`FALLBACKS_SEEN`: ``mamba_ssm``,
    ``causal_conv1d``, ``flash-linear-attention``...): the captured calls are that code's."""
    out = []
    for cls in dict.fromkeys(type(m).__name__ for m in model.modules()):
        seen = FALLBACKS_SEEN.get(cls)
        if not seen:
            continue
        pk = sorted(set(seen.values()))
        out.append(f"{cls} runs transformers' reference PyTorch code ({', '.join(sorted(seen))}): "
                   f"{' and '.join(pk)} {'is' if len(pk) == 1 else 'are'} not installed here -- the captured calls "
                   "are the reference path's, which a GPU run with those kernels would not make")
    return out


def build(desc: Mapping, *, mode=None, device: str = "cuda:0", arch: str = "gfx950", dtype: str | None = None):
    """Build the model of ``desc`` (:func:`load_config`) with fake parameters: ``(model, mode,
    notes)``: what :func:`model_scope` says is captured (the causal LM, or a multimodal model's
    text decoder), with its notes and a :func:`quantization_note`. ``dtype``: the parameters'
    dtype name (default the config's ``torch_dtype``, else bf16). Raises :class:`UsageError` for
    a model outside the scope (:func:`model_scope`) and when transformers cannot build it (the
    message names the module class where it failed)."""
    import torch

    tr = _transformers()
    scope = model_scope(desc)
    cfg = scope["config"]
    mode = mode or fake_mode()
    dt_name = dtype or str(desc["config"].get("torch_dtype") or desc["config"].get("dtype") or "bfloat16")
    dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(dt_name, dt_name), None)
    if not isinstance(dt, torch.dtype):
        raise UsageError(f"unknown model dtype {dt_name!r} (valid: bf16, fp16, fp32)")
    notes = list(desc.get("notes", ())) + scope["notes"]
    with target_device(arch, device) as patched, quiet_torch_logs(), watch_fallbacks(), mode, torch.device(device):
        model, attn, err = None, None, None
        for attn in ("sdpa", "eager"):  # SDPA where the model supports it (gpt-oss does not)
            try:
                model = tr.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), dtype=dt, attn_implementation=attn)
                break
            except ValueError as exc:
                err = exc
                if "attention" not in str(exc).lower():
                    break
            except Exception as exc:  # transformers' own code failed on this config
                err = exc
                break
        if model is None:
            raise UsageError(f"transformers cannot build {desc['title']} ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    model.eval()
    notes.append(f"transformers {tr.__version__} {type(model).__name__}, parameters fake {str(dt).replace('torch.', '')} "
                 f"on {device} (no weights), attention implementation {attn!r}"
                 + ("" if attn == "sdpa" else " (the model does not support SDPA)"))
    qn = quantization_note(desc["config"], str(dt).replace("torch.", ""))
    if qn:
        notes.append(qn)
    if patched:
        notes.append(patched)
    return model, mode, notes


def experts_info(model) -> list[dict]:
    """Per experts module class: ``{"class", "experts", "top_k", "transposed"}`` (transformers'
    ``is_transposed``: weights stored [G, K, N] rather than [G, N, K])."""
    out, seen = [], set()
    cfg = model.config
    top_k = getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "experts_per_token", None)
    for m in model.modules():
        n = type(m).__name__
        if n.endswith("Experts") and n not in seen:
            seen.add(n)
            out.append({"class": n, "experts": getattr(m, "num_experts", None), "top_k": top_k,
                        "transposed": bool(getattr(m, "is_transposed", False))})
    return out


def experts_notes(cap: Capture, model, routing: str) -> list[str]:
    """The sentences on a MoE's experts, derived from what the capture saw (never written ahead
    of it): the experts implementation transformers chose (``config._experts_implementation``)
    and the kernels the experts modules (classes ending in ``Experts``) really called; the
    routing assumption (:func:`routing_note`) only where it shapes something -- when the experts
    ran as ``torch._grouped_mm`` (all routed rows and cumulative offsets: the per-expert M of
    exported shapes depends on the routing). Experts that ran as ``aten.bmm`` over every expert
    are said in the coverage's notes (:func:`flyexplore.insight.coverage.experts_as_bmm`).
    Empty for a dense model."""
    if not experts_info(model):
        return []
    ran = Counter(c.op for c in cap.kernel_calls() if c.module_type.endswith("Experts") and c.family is not None)
    impl = getattr(model.config, "_experts_implementation", None)
    seen = ", ".join(f"{op} x {n}" for op, n in ran.most_common()) or "no GEMM (see what was not captured)"
    out = [f"experts implementation {impl!r}: the experts modules called {seen}" if impl else
           f"experts: the experts modules called {seen}"]
    if "aten._grouped_mm.default" in ran:
        rn = routing_note(model, routing)
        if rn:
            out.append(rn)
    return out


def routing_note(model, routing: str) -> str | None:
    """The sentence stating the MoE routing assumption (``None`` for a dense model)."""
    info = experts_info(model)
    if not info:
        return None
    e = info[0]
    how = (f"each of the {e['experts']} experts gets 1/{e['experts']} of the tokens x top-{e['top_k']} routed rows"
           if routing == "uniform" else
           f"expert i (by load) gets a share of the tokens x top-{e['top_k']} routed rows proportional to "
           f"1 / (i + 1) ** {routing.split(':', 1)[1]}")
    return (f"MoE routing: {routing} -- {how}; the captured shapes do not depend on it (torch._grouped_mm "
            "takes all rows and cumulative offsets), the per-expert M of exported shapes does")


def _step(model, mode, phase: str, batch: int, seq: int, device: str, arch: str):
    """The recorded step as a function, with its cache made beforehand for decode."""
    import torch

    fwd = inspect.signature(model.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in fwd else {}
    # the KV cache's name: ``cache`` from transformers 5.2x (``past_key_values`` is deprecated there,
    # with a warning on every call), ``past_key_values`` before
    cache = "cache" if "cache" in fwd else "past_key_values"
    with mode:
        if phase == "prefill":
            ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
            return lambda: model(input_ids=ids, use_cache=False, **extra)
        ctx = torch.zeros(batch, seq, dtype=torch.long, device=device)
        new = torch.zeros(batch, 1, dtype=torch.long, device=device)
    with target_device(arch, device), quiet_torch_logs(), mode, torch.no_grad():
        past = getattr(model(input_ids=ctx, use_cache=True, **extra), cache, None)
    if past is None:
        raise UsageError(f"decode: {type(model).__name__} returns no KV cache (a prefill with use_cache=True gave "
                         f"none; model_type {getattr(model.config, 'model_type', '?')!r}): flyexplore captures decode "
                         "only where the model keeps a cache -- capture its prefill")
    with mode:
        pos = torch.full((batch, 1), seq, dtype=torch.long, device=device)
    def step():
        return model(input_ids=new, position_ids=pos, use_cache=True, **{cache: past}, **extra)

    step.cache = type(past).__name__
    return step


def capture_model(hf: str | None = None, config: str | Path | Mapping | None = None, *, phase: str = "prefill",
                  batch: int = 1, seq: int = 2048, views: Sequence[str] = VIEWS, routing: str = "uniform",
                  arch: str = "gfx950", device: str = "cuda:0", dtype: str | None = None,
                  built=None, force: bool = False, say: bool = True) -> list[Capture]:
    """Capture one forward step of a transformers model in each of ``views``.

    ``hf`` / ``config``: as :func:`load_config`; ``phase`` (:data:`PHASES`), ``batch``, ``seq``
    (decode: the context length); ``routing``: the MoE routing assumption (:data:`ROUTINGS`);
    ``arch``: the target (gfx950); ``device``: the fake device (``cuda:0``; on a machine with a
    GPU the real device's dispatch decisions are made); ``built``: ``(desc, model, mode, notes)``
    from an earlier call, to capture another phase of the same model without building it again.
    ``force``, ``say``: as :func:`capture_phases` (the bounds of :func:`check_model`).
    Returns a :class:`~flyexplore.insight.capture.Capture` per view, each with ``meta`` (model,
    title, source, phase, batch, seq, routing, experts), the parts :func:`model_scope` leaves out
    in ``uncaptured`` (a vision tower, cross-attention layers) and in ``assumptions`` the scope's
    notes, positions past ``max_position_embeddings`` of a model with no table
    (:func:`check_positions`), the :func:`quantization_note` and the :func:`fallback_notes`.
    Raises :class:`UsageError` for an unknown model or phase, a config transformers cannot build,
    a model outside the scope (:func:`model_scope`), decode of a model that keeps no KV cache,
    positions past the model's position table, a model past the bounds, and
    :class:`~flyexplore.insight.capture.CaptureError` naming the module where a capture failed."""
    views = views_of(views)
    routing_shares(routing, 8)  # checks the routing text
    if built is None:
        return capture_phases(hf, config, phases=[(phase, batch, seq)], views=views, routing=routing, arch=arch,
                              device=device, dtype=dtype, force=force, say=say)
    desc = built[0]
    _, model, mode, notes = built
    scope = model_scope(desc, model)
    if phase == "decode" and scope["no_decode"]:
        raise UsageError(scope["no_decode"])
    check_phase(phase, batch, seq)
    keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    notes = list(notes) + ["logits for the last position only (logits_to_keep=1, as generate asks)" if keep else
                           f"logits for every position ({type(model).__name__}'s forward takes no logits_to_keep)"]
    pn = check_positions(model, phase, seq)
    if pn:
        notes.append(pn)
    label = f"{desc['title']} {phase} {batch}x{seq}" if phase == "prefill" else \
        f"{desc['title']} decode batch {batch} at context {seq}"
    out = []
    for v in views:
        with watch_fallbacks():
            try:
                step = _step(model, mode, phase, batch, seq, device, arch)
            except UsageError:
                raise
            except Exception as exc:
                raise CaptureError(f"capture of {label} failed while making the {phase} inputs/cache "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
                                   ) from None
            cache_note = ([f"decode: the KV cache is transformers' {step.cache} holding the context (made by an "
                           "unrecorded prefill); the step's cache updates are that class's (a DynamicCache concatenates "
                           "each layer's new keys and values: the aten.cat rows), where a static or paged cache, as "
                           "serving engines use, writes them in place"] if getattr(step, "cache", None) else [])
            cap = run_step(model, step, view=v, label=label, phase=phase, device=device, arch=arch, mode=mode,
                           assumptions=notes + cache_note, progress=say)
        cap.assumptions += [n for n in fallback_notes(model) + experts_notes(cap, model, routing)
                            if n not in cap.assumptions]
        cap.uncaptured += [dict(u) for u in scope["uncaptured"]]
        lt = getattr(model.config, "layer_types", None)
        if lt:
            cap.layers = layer_kinds(cap, list(lt))
        skipped = [u["op"] for u in scope["uncaptured"] if u["op"].startswith("cross-attention layers")]
        if skipped:   # the layer count must not read as the whole model
            cap.layers = {**cap.layers, "text": f"{cap.layers.get('text', '')}; not captured: {'; '.join(skipped)}"}
        cap.meta.update({"model": desc["name"], "title": desc["title"], "source": desc["source"],
                         "phase": phase, "batch": batch, "seq": seq, "routing": routing,
                         "experts": experts_info(model), "tokens": batch * (seq if phase == "prefill" else 1),
                         "dtype": short_dtype(next(model.parameters()).dtype)})
        out.append(cap)
    return out


def capture_phases(hf: str | None = None, config=None, *, phases: Iterable[tuple[str, int, int]] = (("prefill", 1, 2048),),
                   force: bool = False, say: bool = True, **kw) -> list[Capture]:
    """:func:`capture_model` for several ``(phase, batch, seq)`` of one model, built once.

    Before anything is built (and before torch is imported) the routing and the model are
    checked (:func:`check_model`: the model type, the config's numbers, tensors torch can address, and unless
    ``force`` the :data:`MODEL_LIMITS` of 512 layers, 2,048 experts, an estimated 30 min and the
    memory available). With ``say``, the config's notes (custom code not run) and an estimate of
    :data:`SAY_ESTIMATE_S` or more are printed to stderr first. Then, before the build, the scope
    (:func:`model_scope`: an encoder-decoder model, decode of an encoder), and after it, before any
    capture, every phase's positions (:func:`check_positions`) are checked."""
    phases = [tuple(p) for p in phases]
    routing_shares(kw.get("routing", "uniform"), 8)  # checks the routing text
    desc = load_config(hf, config)
    est = check_model(desc, phases, views_of(kw.get("views", VIEWS)), force=force)
    if say:
        for n in desc.get("notes", ()):
            print(f"flyexplore: note: {n}", file=sys.stderr)
        if est["seconds"] >= SAY_ESTIMATE_S:
            print(f"flyexplore: estimate: {est['text']}", file=sys.stderr)
    scope = model_scope(desc)  # refusals (scope, decode without a cache) before the build
    for ph, *_ in phases:
        if ph == "decode" and scope["no_decode"]:
            raise UsageError(scope["no_decode"])
    with quiet_transformers():
        model, mode, notes = build(desc, device=kw.get("device", "cuda:0"), arch=kw.get("arch", "gfx950"),
                                   dtype=kw.pop("dtype", None))
        for ph, _, sq in phases:  # every phase's positions before any is captured
            check_positions(model, ph, sq)
        out = []
        for phase, batch, seq in phases:
            out += capture_model(phase=phase, batch=batch, seq=seq, built=(desc, model, mode, notes), say=say, **kw)
    return out


@contextlib.contextmanager
def quiet_transformers():
    """transformers' own log handler (its ``[transformers] ...`` lines on stderr) off while a
    model is built and captured, so that an error stays one line; the records still reach
    :func:`watch_fallbacks`, and what matters of them is said in the capture's assumptions."""
    import transformers.utils.logging as tl

    root = logging.getLogger("transformers")
    had = getattr(tl, "_default_handler", None) is not None and tl._default_handler in root.handlers
    if had:
        tl.disable_default_handler()
    try:
        yield
    finally:
        if had:
            tl.enable_default_handler()
