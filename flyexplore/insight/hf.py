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
said from the capture (:func:`experts_notes`). Experts that loop in Python over the experts their
router hit (DBRX, the "eager" experts implementation) are captured under the routing assumption
(``routing``: :class:`flyexplore.insight.expert_routing.ExpertLoop` answers the loop's
data-dependent ``nonzero`` / ``where``), and the capture says so. A multimodal model's text decoder
is built alone where its text config has a causal-LM class (Gemma-3: ``Gemma3ForCausalLM``),
else the model type's causal-LM or image-text-to-text class (Qwen2.5-VL) fed text only
(:func:`model_scope`). The built-in configs (:func:`builtin_models`) are the published dims of a
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

import contextlib
import copy
import importlib.metadata
import importlib.util
import inspect
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
from flyexplore.insight.expert_routing import ROUTINGS, routing_shares  # noqa: F401 - named here too
from flyexplore.measure.devstate import cpu_free_memory
from flyexplore.ops.model.hf import (_EXPERT_KEYS, _HEAD_KEYS, _LAYER_KEYS, PHASES, POSITIVE_FIELDS,  # noqa: F401 - named here too
                                     POSITIVE_INT_FIELDS, _first, _transformers, builtin_models, check_config,
                                     check_model_type, check_phase, check_positions, load_config, make_config,
                                     model_scope, models_dir, position_tables, quiet_transformers,
                                     transformers_model_types)
from flyexplore.world.conditions import short_dtype

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
#: What one torch tensor can address, bytes (its storage size is an int64); each element is
#: counted at 4 bytes (fp32, the widest dtype a captured step uses).
_MAX_BYTES = 2 ** 63 - 1


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


def _widest(v) -> int:
    """A size or the largest of a per-layer list of sizes (Gemma-3n's ``intermediate_size``); 1 if unset."""
    if isinstance(v, (list, tuple)):
        v = max((x for x in v if isinstance(x, int)), default=1)
    return v if isinstance(v, int) and v > 0 else 1


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
            (batch * seq, _widest(cfg.get("intermediate_size")))),
           (f"{where}: the expert weights [experts, 2 x moe_intermediate_size, hidden_size]",
            (experts, 2 * _widest(cfg.get("moe_intermediate_size")), hidden))]
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


# -- what of a model is captured ---------------------------------------------------------------------


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
                model = getattr(tr, scope.get("auto", "AutoModelForCausalLM")).from_config(
                    copy.deepcopy(cfg), dtype=dt, attn_implementation=attn)
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
    roots = tuple(p for p, m in model.named_modules() if type(m).__name__.endswith("Experts"))
    ran: Counter = Counter()
    for c in cap.kernel_calls():
        if c.family is not None and (c.module_type.endswith("Experts") or _under(c.module, roots)):
            ran[c.op] += c.count
    impl = getattr(model.config, "_experts_implementation", None)
    seen = ", ".join(f"{op} x {n}" for op, n in ran.most_common()) or "no GEMM (see what was not captured)"
    out = [f"experts implementation {impl!r}: the experts modules called {seen}" if impl else
           f"experts: the experts modules called {seen}"]
    if "aten._grouped_mm.default" in ran:
        rn = routing_note(model, routing)
        if rn:
            out.append(rn)
    return out


def _under(path: str, roots: Sequence[str]) -> bool:
    """``path`` is one of the module paths ``roots`` (list indices as ``*`` match any) or inside one."""
    pat = re.sub(r"\.\d+(?=\.|$)", ".*", path)
    for r in roots:
        rp = re.sub(r"\.\d+(?=\.|$)", ".*", r)
        if pat == rp or pat.startswith(rp + "."):
            return True
    return False


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
                           assumptions=notes + cache_note, progress=say, routing=routing)
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


