"""Hugging Face transformers models from a ``config.json``, built with no weights, captured per phase.

:func:`capture_model` builds a transformers causal LM from its config under ``FakeTensorMode``
(``AutoModelForCausalLM.from_config`` with every parameter a fake tensor on ``cuda:0``: no
weights, no memory, no hub access) and captures one forward step of a phase with
:func:`flyexplore.insight.capture.run_step`:

- ``prefill``: ``batch`` sequences of ``seq`` tokens, no cache;
- ``decode``: one new token for each of ``batch`` sequences whose KV cache holds ``seq`` tokens
  (the cache is made by an unrecorded prefill of ``seq`` tokens).

Both phases ask for the last position's logits only (``logits_to_keep=1``, as ``generate`` does).
The model gets ``attn_implementation="sdpa"`` where the model supports it and transformers'
default experts implementation (``grouped_mm``: ``torch._grouped_mm`` with the weights as the
model stores them). The built-in configs (:func:`builtin_models`) are the published dims of a
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

import copy
import inspect
import json
import logging
import math
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.capture import (VIEWS, Capture, CaptureError, fake_mode, layer_kinds, quiet_torch_logs,
                                        run_step, target_device, views_of)
from flyexplore.measure.devstate import cpu_free_memory
from flyexplore.paths import data_dir

#: Phases of :func:`capture_model`.
PHASES = ("prefill", "decode")
#: MoE routing assumptions: ``uniform`` (every expert gets the same share of the routed rows) or
#: ``zipf:S`` (expert i, by load rank, gets a share proportional to 1 / (i + 1) ** S; S > 0).
ROUTINGS = ("uniform", "zipf:S")
#: What one decoder layer costs :func:`capture_model`, ``{stage: (CPU seconds, peak-RSS MB)}`` a layer:
#: ``build`` once per model, ``prefill`` / ``decode`` per recorded view of a phase (decode with its
#: unrecorded prefill). Measured here on a Llama-style config (hidden 512, 8 heads, seq 128) at 40
#: and 240 layers, the difference over 200 layers, on the project's 2-core x86 CPU (torch 2.15,
#: transformers 5.24; process CPU time: the wall time was 1.7-2.4x that with other work running).
#: A break-it trial (issue 33) saw a 1e5-layer config run 20 min at 4.7 GB and rising (by these
#: numbers its build alone takes 20 min and 4.8 GB) and 1,000 layers in 94 s (half what these give:
#: the estimate errs long). Hidden size (512 vs 65,536), vocabulary (32k vs 10M), heads (8 vs 512),
#: experts (8 vs 4,096) and seq (128 vs 1e7) changed neither time nor memory (fake tensors hold no
#: data).
LAYER_COST = {"build": (0.012, 0.04), "prefill": (0.080, 0.27), "decode": (0.128, 0.23)}
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
    limit) for: a config number that cannot describe a model (:func:`check_config`); a phase
    past the model's ``max_position_embeddings`` (:func:`check_phase`); a tensor of the step past
    what torch can address (2**63 bytes: the attention scores [batch, heads, seq, seq] at
    ``seq`` 1e9); and, unless ``force``, a model past :data:`MODEL_LIMITS` (layers, experts, the
    estimated time) or whose estimated memory passes what is available now (``MemAvailable``)."""
    check_config(desc)
    cfg, where = desc["config"], desc.get("where", "the config")
    mp = cfg.get("max_position_embeddings")
    for ph, b, sq in phases:
        check_phase(ph, b, sq, mp)
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
    sequence below 1, or a sequence (decode: the context, plus the new token) past the model's
    ``max_position_embeddings``."""
    if phase not in PHASES:
        raise bad_choice("phase", phase, PHASES)
    for what, v in (("batch", batch), ("seq", seq)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UsageError(f"{what} must be a positive integer, got {v!r}")
    total = seq + (1 if phase == "decode" else 0)
    if max_positions and total > max_positions:
        raise UsageError(f"{phase} at seq {seq} needs {total} positions, past the model's "
                         f"max_position_embeddings {max_positions}")


def build(desc: Mapping, *, mode=None, device: str = "cuda:0", arch: str = "gfx950", dtype: str | None = None):
    """Build the model of ``desc`` (:func:`load_config`) with fake parameters: ``(model, mode,
    notes)``. ``dtype``: the parameters' dtype name (default the config's ``torch_dtype``, else
    bf16). Raises :class:`UsageError` when transformers cannot build it (the message names the
    module class where it failed)."""
    import torch

    tr = _transformers()
    cfg = make_config(desc)
    mode = mode or fake_mode()
    dt_name = dtype or str(desc["config"].get("torch_dtype") or desc["config"].get("dtype") or "bfloat16")
    dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(dt_name, dt_name), None)
    if not isinstance(dt, torch.dtype):
        raise UsageError(f"unknown model dtype {dt_name!r} (valid: bf16, fp16, fp32)")
    notes = list(desc.get("notes", ()))
    with target_device(arch, device) as patched, quiet_torch_logs(), mode, torch.device(device):
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
    ex = getattr(model.config, "_experts_implementation", None)
    if ex and experts_info(model):
        notes.append(f"experts implementation {ex!r} (transformers' default where torch._grouped_mm runs)")
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
        past = getattr(model(input_ids=ctx, use_cache=True, **extra), cache)
    with mode:
        pos = torch.full((batch, 1), seq, dtype=torch.long, device=device)
    return lambda: model(input_ids=new, position_ids=pos, use_cache=True, **{cache: past}, **extra)


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
    title, source, phase, batch, seq, routing, experts). Raises :class:`UsageError` for an
    unknown model or phase, a config transformers cannot build, a model past the bounds, and
    :class:`~flyexplore.insight.capture.CaptureError` naming the module where a capture failed."""
    views = views_of(views)
    routing_shares(routing, 8)  # checks the routing text
    if built is None:
        return capture_phases(hf, config, phases=[(phase, batch, seq)], views=views, routing=routing, arch=arch,
                              device=device, dtype=dtype, force=force, say=say)
    desc = built[0]
    _, model, mode, notes = built
    notes = list(notes) + ["logits for the last position only (logits_to_keep=1, as generate asks)"]
    rn = routing_note(model, routing)
    if rn:
        notes.append(rn)
    label = f"{desc['title']} {phase} {batch}x{seq}" if phase == "prefill" else \
        f"{desc['title']} decode batch {batch} at context {seq}"
    out = []
    for v in views:
        try:
            step = _step(model, mode, phase, batch, seq, device, arch)
        except Exception as exc:
            raise CaptureError(f"capture of {label} failed while making the {phase} inputs/cache "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
        cap = run_step(model, step, view=v, label=label, phase=phase, device=device, arch=arch, mode=mode,
                       assumptions=notes, progress=say)
        lt = getattr(model.config, "layer_types", None)
        if lt:
            cap.layers = layer_kinds(cap, list(lt))
        cap.meta.update({"model": desc["name"], "title": desc["title"], "source": desc["source"],
                         "phase": phase, "batch": batch, "seq": seq, "routing": routing,
                         "experts": experts_info(model), "tokens": batch * (seq if phase == "prefill" else 1)})
        out.append(cap)
    return out


def capture_phases(hf: str | None = None, config=None, *, phases: Iterable[tuple[str, int, int]] = (("prefill", 1, 2048),),
                   force: bool = False, say: bool = True, **kw) -> list[Capture]:
    """:func:`capture_model` for several ``(phase, batch, seq)`` of one model, built once.

    Before anything is built (and before torch is imported) the routing and the model are
    checked (:func:`check_model`: the config's numbers, tensors torch can address, and unless
    ``force`` the :data:`MODEL_LIMITS` of 512 layers, 2,048 experts, an estimated 30 min and the
    memory available). With ``say``, the config's notes (custom code not run) and an estimate of
    :data:`SAY_ESTIMATE_S` or more are printed to stderr first."""
    phases = [tuple(p) for p in phases]
    routing_shares(kw.get("routing", "uniform"), 8)  # checks the routing text
    desc = load_config(hf, config)
    est = check_model(desc, phases, views_of(kw.get("views", VIEWS)), force=force)
    if say:
        for n in desc.get("notes", ()):
            print(f"flyexplore: note: {n}", file=sys.stderr)
        if est["seconds"] >= SAY_ESTIMATE_S:
            print(f"flyexplore: estimate: {est['text']}", file=sys.stderr)
    model, mode, notes = build(desc, device=kw.get("device", "cuda:0"), arch=kw.get("arch", "gfx950"),
                               dtype=kw.pop("dtype", None))
    out = []
    for phase, batch, seq in phases:
        out += capture_model(phase=phase, batch=batch, seq=seq, built=(desc, model, mode, notes), **kw)
    return out
