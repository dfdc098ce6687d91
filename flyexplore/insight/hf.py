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

transformers is an optional dependency (``pip install 'flyexplore[models]'``).
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.capture import (VIEWS, Capture, CaptureError, fake_mode, layer_kinds, run_step, target_device,
                                        views_of)
from flyexplore.paths import data_dir

#: Phases of :func:`capture_model`.
PHASES = ("prefill", "decode")
#: MoE routing assumptions: ``uniform`` (every expert gets the same share of the routed rows) or
#: ``zipf:S`` (expert i, by load rank, gets a share proportional to 1 / (i + 1) ** S; S > 0).
ROUTINGS = ("uniform", "zipf:S")


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
    """The model description to build: ``{"name", "title", "source", "config"}``.

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
        return {"name": key, "title": d.get("title", key), "source": d.get("source", ""), "config": d["config"]}
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
    return {"name": name, "title": d.get("title", name), "source": d.get("source", where), "config": cfg}


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
    for k in ("architectures", "transformers_version", "quantization_config", "auto_map"):
        cfg.pop(k, None)
    try:
        return tr.AutoConfig.for_model(mt, **cfg)
    except Exception as exc:  # transformers' and huggingface_hub's validators raise their own types
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = lines[-1] if lines else ""
        raise UsageError(f"transformers {tr.__version__} cannot build a config of model_type {mt!r} "
                         f"({type(exc).__name__}: {why[:200]})") from None


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
    notes = []
    with target_device(arch, device) as patched, mode, torch.device(device):
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
    with mode:
        if phase == "prefill":
            ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
            return lambda: model(input_ids=ids, use_cache=False, **extra)
        ctx = torch.zeros(batch, seq, dtype=torch.long, device=device)
        new = torch.zeros(batch, 1, dtype=torch.long, device=device)
    with target_device(arch, device), mode, torch.no_grad():
        past = model(input_ids=ctx, use_cache=True, **extra).past_key_values
    with mode:
        pos = torch.full((batch, 1), seq, dtype=torch.long, device=device)
    return lambda: model(input_ids=new, past_key_values=past, position_ids=pos, use_cache=True, **extra)


def capture_model(hf: str | None = None, config: str | Path | Mapping | None = None, *, phase: str = "prefill",
                  batch: int = 1, seq: int = 2048, views: Sequence[str] = VIEWS, routing: str = "uniform",
                  arch: str = "gfx950", device: str = "cuda:0", dtype: str | None = None,
                  built=None) -> list[Capture]:
    """Capture one forward step of a transformers model in each of ``views``.

    ``hf`` / ``config``: as :func:`load_config`; ``phase`` (:data:`PHASES`), ``batch``, ``seq``
    (decode: the context length); ``routing``: the MoE routing assumption (:data:`ROUTINGS`);
    ``arch``: the target (gfx950); ``device``: the fake device (``cuda:0``; on a machine with a
    GPU the real device's dispatch decisions are made); ``built``: ``(desc, model, mode, notes)``
    from an earlier call, to capture another phase of the same model without building it again.
    Returns a :class:`~flyexplore.insight.capture.Capture` per view, each with ``meta`` (model,
    title, source, phase, batch, seq, routing, experts). Raises :class:`UsageError` for an
    unknown model or phase, a config transformers cannot build, and
    :class:`~flyexplore.insight.capture.CaptureError` naming the module where a capture failed."""
    views = views_of(views)
    routing_shares(routing, 8)  # checks the routing text
    desc = load_config(hf, config) if built is None else built[0]
    mp = desc["config"].get("max_position_embeddings")
    check_phase(phase, batch, seq, mp if isinstance(mp, int) else None)   # before building anything
    _, model, mode, notes = built or (desc, *build(desc, device=device, arch=arch, dtype=dtype))
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
                       assumptions=notes)
        lt = getattr(model.config, "layer_types", None)
        if lt:
            cap.layers = layer_kinds(cap, list(lt))
        cap.meta.update({"model": desc["name"], "title": desc["title"], "source": desc["source"],
                         "phase": phase, "batch": batch, "seq": seq, "routing": routing,
                         "experts": experts_info(model), "tokens": batch * (seq if phase == "prefill" else 1)})
        out.append(cap)
    return out


def capture_phases(hf: str | None = None, config=None, *, phases: Iterable[tuple[str, int, int]] = (("prefill", 1, 2048),),
                   **kw) -> list[Capture]:
    """:func:`capture_model` for several ``(phase, batch, seq)`` of one model, built once."""
    desc = load_config(hf, config)
    model, mode, notes = build(desc, device=kw.get("device", "cuda:0"), arch=kw.get("arch", "gfx950"),
                               dtype=kw.pop("dtype", None))
    out = []
    for phase, batch, seq in phases:
        out += capture_model(phase=phase, batch=batch, seq=seq, built=(desc, model, mode, notes), **kw)
    return out
