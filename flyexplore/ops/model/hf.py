"""Hugging Face transformers models as the ``model`` family and the capture take them: a config
(a built-in name or a ``config.json``), checked before torch is imported, made into a
transformers config, with what of it is built (:func:`model_scope`) and where its positions end
(:func:`check_positions`).

Shared by the model capture (:mod:`flyexplore.insight.hf`, fake parameters) and the ``model``
operator family (:mod:`flyexplore.ops.model.operator`, random weights on the device), so that both
read a config the same way. transformers is an optional dependency
(``pip install 'flyexplore[models]'``).
"""
from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.paths import data_dir

#: Phases of :func:`capture_model`.
PHASES = ("prefill", "decode")


#: Config fields that must be positive integers, and positive numbers (plus any ``*_eps`` /
#: ``*epsilon``), where present and not null.
POSITIVE_INT_FIELDS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                       "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                       "max_position_embeddings", "num_experts", "num_local_experts", "n_routed_experts",
                       "num_experts_per_tok", "experts_per_token", "n_layer", "n_head", "n_embd", "n_positions")


POSITIVE_FIELDS = ("rope_theta", "eps")
#: Of :data:`POSITIVE_INT_FIELDS`, those a config may give per layer, as a list of positive
#: integers one per layer (Gemma-3n's ``intermediate_size``: transformers 5.25
#: ``models/gemma3n/configuration_gemma3n.py``, ``intermediate_size: int | list[int]``).
PER_LAYER_FIELDS = ("intermediate_size", "moe_intermediate_size")


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


_HEAD_KEYS = ("num_attention_heads", "n_head")


_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


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


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _check_per_layer(cfg: Mapping, where: str, k: str, v: Sequence) -> None:
    """A per-layer list (:data:`PER_LAYER_FIELDS`): positive integers, one per layer where the
    layer count is set."""
    bad = next((x for x in v if not _positive_int(x)), None) if v else v
    if bad is not None:
        raise UsageError(f"{where}: {k} must be a positive integer or a list of them (one per layer), "
                         f"got {k} holding {bad!r}")
    lk, layers = _first(cfg, _LAYER_KEYS)
    if isinstance(layers, int) and len(v) != layers:
        raise UsageError(f"{where}: {k} lists {len(v)} values, but {lk} is {layers} (one per layer)")


def check_config(desc: Mapping) -> None:
    """Raise :class:`UsageError` naming the file, the field and the value for a config number
    that cannot describe a model: any number (nested ones too) that is NaN or infinite; a
    :data:`POSITIVE_INT_FIELDS` field that is not a positive integer (a :data:`PER_LAYER_FIELDS`
    field may be a list of them, one per layer); a :data:`POSITIVE_FIELDS`
    field (and any ``*_eps`` / ``*epsilon``) that is not a positive number. transformers accepts
    ``rms_norm_eps: NaN`` (and a NaN norm makes every value of the step NaN)."""
    cfg, where = desc["config"], desc.get("where", desc.get("source", "the config"))
    for path, v in _leaves(cfg):
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{where}: {path} is {'NaN' if math.isnan(v) else v}, not a finite number")
    for k, v in cfg.items():
        if v is None:
            continue
        if k in PER_LAYER_FIELDS and isinstance(v, (list, tuple)):
            _check_per_layer(cfg, where, k, v)
        elif k in POSITIVE_INT_FIELDS and not _positive_int(v):
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


#: The input a multimodal part encodes, by its sub-config's name less ``_config``.
_INPUT_OF = {"vision": "image", "audio": "audio", "speech": "audio"}
#: Sub-config names (their first word) that name a tower for another input than text.
_TOWERS = frozenset({"vision", "audio", "speech", "image", "video", "vq"})


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
      text decoder is built -- the ``text_config``'s causal-LM class where transformers has one,
      else the model type's own causal-LM class, else its image-text-to-text class -- and fed text
      only; every other part (vision tower: its class
      from ``MODEL_MAPPING_NAMES`` of the sub-config's model type, else the sub-config's class name
      with ``Config`` -> ``Model``) is an ``uncaptured`` entry, and so are the text decoder's
      ``cross_attention_layers`` (``transformers/models/mllama/modeling_mllama.py::MllamaTextModel``
      skips them with no image input).

    ``config``: the transformers config to build; ``auto``: the transformers auto class to build it
    with (``AutoModelForCausalLM``; ``AutoModelForImageTextToText`` for a multimodal model with no
    causal-LM class for it nor its text config, Qwen2.5-VL: fed text only). A multimodal model
    whose text config has a causal-LM class (Gemma-3: ``Gemma3ForCausalLM``) is built as that
    text decoder alone. Raises :class:`UsageError` (one line naming the
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
    out = {"kind": "decoder", "config": cfg, "notes": [], "uncaptured": [], "no_decode": None,
           "auto": "AutoModelForCausalLM"}
    itt = getattr(MA, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", {})
    tmt = getattr(text, "model_type", None)
    if text is not cfg and tmt in causal:
        # the text decoder alone (Gemma-3's Gemma3ForCausalLM): its towers are neither built nor run
        out["config"] = text
        out["notes"].append(f"multimodal model {mt!r}: its text decoder (text config, model_type {tmt!r}, "
                            f"transformers' {causal[tmt]}) is built and fed text only")
    elif mt not in causal:
        if text is cfg or mt not in itt:
            tt = "" if text is cfg else f", nor has its text config ({tmt!r})"
            raise UsageError(f"model_type {mt!r} has no causal-LM class in transformers {ver}{tt}: {what}")
        # no causal-LM class for it nor its text config (Qwen2.5-VL): the image-text-to-text class,
        # fed text only, its tower built (fake parameters) and never called
        out["auto"] = "AutoModelForImageTextToText"
        out["notes"].append(f"multimodal model {mt!r}: transformers {ver} has no causal-LM class for it nor its text "
                            f"config ({tmt!r}): its {itt[mt]} is built and fed text only -- the text decoder runs, "
                            "its other parts (listed as not captured) are built (fake parameters) and never called")
    elif mt in masked and not getattr(cfg, "is_decoder", False):
        out["kind"] = "encoder"
        out["notes"].append(f"encoder model {mt!r} (is_decoder false): transformers' {causal[mt]} runs one "
                            "bidirectional pass over the batch x seq tokens (no causal mask, no KV cache) and its "
                            "LM head; captured as the prefill step")
        out["no_decode"] = (f"decode: model_type {mt!r} is an encoder (is_decoder false: {causal[mt]} keeps no KV "
                            "cache); flyexplore captures its prefill (one encoder pass) only")
    # parts besides the text decoder: every sub-config of a model whose text config is its own,
    # and those naming an input (vision_config...) of one whose config is the text config
    # (DBRX's attn_config / ffn_config are parts of the decoder itself)
    others = [k for k in (getattr(cfg, "sub_configs", None) or {})
              if getattr(cfg, k, None) is not None and getattr(cfg, k) is not text
              and (text is not cfg or k.split("_")[0] in _TOWERS)]
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
