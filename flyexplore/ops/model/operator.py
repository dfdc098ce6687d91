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
  of the context; before every call the cache is rewound (:mod:`flyexplore.ops.model.state`:
  position counters reset, Mamba / linear-attention / conv states restored), so every call
  computes the same step, checked before the case runs.

What each variant does with CUDA/HIP graphs is its row's ``graphs`` text (:data:`GRAPHS`): the
eager and compiled variants launch each kernel from the CPU (``triton.cudagraphs=False``); the
``*_graph`` variants replay graphs (:mod:`flyexplore.ops.model.graph`).

Variants (backends, :data:`VARIANTS`):

- ``eager``: eager ATen, FlyDSL eager overrides off (the baseline);
- ``eager_flydsl``: eager with torch 2.15's FlyDSL overrides on (RMSNorm, TopK; gfx950 only);
- ``compile``: ``torch.compile`` default;
- ``max_autotune``: max-autotune, ``max_autotune_gemm_backends="ATEN,TRITON"`` (Triton templates);
- ``max_autotune_flydsl``: max-autotune with ``"ATEN,TRITON,FLYDSL"`` (gfx950, torch >= 2.15);
- ``eager_ck`` (ROCm only): eager with SDPA on Composable Kernel
  (``preferred_rocm_fa_library("ck")``) instead of AOTriton -- the attention backend choice.
- ``eager_graph``: the eager step captured once in a ``torch.cuda.CUDAGraph`` (HIP graph on
  ROCm), the cache rewind inside it; a call is one replay;
- ``eager_flydsl_graph``: the same with the FlyDSL eager overrides on;
- ``compile_graph``: ``torch.compile`` with Inductor's CUDA graph trees (``triton.cudagraphs``,
  what ``mode="reduce-overhead"`` sets);
- ``max_autotune_flydsl_graph``: ``max_autotune_flydsl`` with CUDA graph trees.

A variant that cannot run here is an ``unavailable`` row with the reason. The check is the
logits of the last position against the eager variant's in the same dtype (:data:`LOGIT_TOL`).
A row's FLOPs are estimated from the config's dims (:func:`model_dims`); the memory a case needs
(:func:`memory_terms`: weights and KV cache counted on transformers' model and ``StaticCache``
built on the ``meta`` device, activations from the dims; :mod:`flyexplore.ops.model.memory`) is
checked before the model is allocated.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
from typing import Any, Mapping

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops.base import (
    Operator,
    compile_context,
    relative_error,
    torch_dtype,
)
from flyexplore.ops.gemm import operator as GEMM_OP
from flyexplore.ops.model import graph as G
from flyexplore.ops.model import hf as H
from flyexplore.ops.model import state as S
from flyexplore.ops.model.layers import cut_config
from flyexplore.ops.model import memory as MEM
from flyexplore.ops.model.memory import _tokens, model_dims  # noqa: F401 - named here too (M.model_dims)
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
    "eager_graph": "the eager step captured in one CUDA/HIP graph (torch.cuda.CUDAGraph), replayed per step",
    "eager_flydsl_graph": "eager_flydsl captured in one CUDA/HIP graph, replayed per step (gfx950)",
    "compile_graph": "torch.compile with Inductor's CUDA graph trees (as mode='reduce-overhead')",
    "max_autotune_graph": "max_autotune with Inductor's CUDA graph trees (the baseline of its FlyDSL twin)",
    "max_autotune_flydsl_graph": "max_autotune_flydsl with Inductor's CUDA graph trees (gfx950)",
}
#: The variants that replay CUDA/HIP graphs, each with the variant it is the graph twin of.
GRAPH_TWINS = {"eager_graph": "eager", "eager_flydsl_graph": "eager_flydsl", "compile_graph": "compile",
               "max_autotune_graph": "max_autotune", "max_autotune_flydsl_graph": "max_autotune_flydsl"}
#: Inductor options of the compiled variants: ``triton.cudagraphs`` off, but on for the ``*_graph``
#: ones (Inductor's CUDA graph trees: ``torch._inductor.list_mode_options("reduce-overhead")`` is
#: exactly ``{"triton.cudagraphs": True}``; ``torch.compile`` takes a mode or options, not both).
COMPILE_OPTIONS = {
    "compile": {"triton.cudagraphs": False},
    "max_autotune": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON", "triton.cudagraphs": False},
    "max_autotune_flydsl": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON,FLYDSL",
                            "triton.cudagraphs": False},
    "compile_graph": {"triton.cudagraphs": True},
    "max_autotune_graph": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
                           "triton.cudagraphs": True},
    "max_autotune_flydsl_graph": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON,FLYDSL",
                                  "triton.cudagraphs": True},
}
_EAGER_LAUNCH = "none: eager launches each kernel"
_COMPILED_LAUNCH = "none: Inductor, triton.cudagraphs=False"
_REPLAY = "one CUDA/HIP graph replay per step (rewind inside)"
_TREES = "Inductor CUDA graph trees (as reduce-overhead)"
#: What each variant does with CUDA/HIP graphs (every row says it: its ``graphs`` text). ``none``:
#: every kernel is launched from the CPU (eager; Inductor's code with ``triton.cudagraphs=False``);
#: a graph replay: the step, the decode cache rewind included, captured once in a
#: ``torch.cuda.CUDAGraph`` and replayed (:func:`flyexplore.ops.model.graph.graph_replay`);
#: Inductor's CUDA graph trees: ``triton.cudagraphs=True``, what ``mode="reduce-overhead"`` sets,
#: with the rewind launched before each replay (:func:`flyexplore.ops.model.graph.trees_step`).
GRAPHS = {"eager": _EAGER_LAUNCH, "eager_flydsl": _EAGER_LAUNCH, "eager_ck": _EAGER_LAUNCH,
          "compile": _COMPILED_LAUNCH, "max_autotune": _COMPILED_LAUNCH, "max_autotune_flydsl": _COMPILED_LAUNCH,
          "eager_graph": _REPLAY, "eager_flydsl_graph": _REPLAY, "compile_graph": _TREES,
          "max_autotune_graph": _TREES, "max_autotune_flydsl_graph": _TREES}


def graphs_text(variant: str) -> str:
    """What ``variant`` does with CUDA/HIP graphs (:data:`GRAPHS`); a registered module's or an
    unknown variant's: ``"not known"``."""
    return GRAPHS.get(variant, "not known")

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
    (:func:`flyexplore.ops.model.layers.cut_config`: ``num_hidden_layers`` and every per-layer
    list cut to the same length, keeping a layer of each kind of a hybrid where the config can
    say so; :func:`layers_note` says what the cut did)."""
    return cut_config(describe(case["model"])["config"], case["layers"])[0]


def layers_note(case) -> str | None:
    """What cutting the case's model to ``layers`` did beyond taking the first N layers (the
    layers picked, the keys set, or the kinds of layer dropped), in one sentence; ``None`` for a
    plain cut or no cut (:func:`flyexplore.ops.model.layers.cut_config`)."""
    if _module_key(case["model"]) is not None or not case["layers"]:
        return None
    return cut_config(describe(case["model"])["config"], case["layers"])[1]


def memory_terms(case, dtype: str) -> dict:
    """Bytes one case needs, before anything is allocated: ``weights``, ``kv_cache``,
    ``activations``, ``total`` and ``how`` (:func:`flyexplore.ops.model.memory.memory_terms` of the
    case's cut config: weights and cache counted on transformers' model and ``StaticCache`` built
    on the ``meta`` device; a registered module: :func:`flyexplore.ops.model.memory.module_terms`)."""
    key = _module_key(case["model"])
    if key is not None:
        return MEM.module_terms(*_MODULES[key])
    return MEM.memory_terms(case, dtype, config_of(case))


def _memory(case, dtype) -> tuple[int, str]:
    """:attr:`Operator.memory`: :func:`memory_terms`' total and its terms in words."""
    t = memory_terms(case, dtype)
    return t["total"], MEM.terms_text(t)


def _tensors(case, dtype):
    """:attr:`Operator.tensors`: the weights and KV cache (held for the case) and the activations."""
    return MEM.tensor_sizes(memory_terms(case, dtype))


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
    gpu = torch.device(device).type != "cpu"

    def once():
        with torch.no_grad():
            return logits(model(**kw)).detach().float().clone()

    with flydsl_eager(False, EAGER_OPS):
        rewind = S.plan_rewind(cache, once, tol=REPEAT_TOL.get(dtype, 1e-3) if gpu else 0.0)
    return {"model": model, "args": (), "kwargs": kw, "rewind": rewind}


#: How far two decode calls after a rewind may differ on a GPU (relative L2 of the logits and of
#: each restored state; :func:`flyexplore.ops.model.state.plan_rewind`): half of
#: :data:`LOGIT_TOL`. On the CPU they must be equal. On the lent H100 (torch 2.11, bf16) two eager
#: Llama-3.1-8B decode calls after a rewind differed by up to 0.019 (batch 1) and 0.010 (batch 32)
#: with no cache state moving, and by 0 with cuDNN's SDPA turned off
#: (``torch.backends.cuda.enable_cudnn_sdp(False)``): cuDNN's decode attention kernel is not
#: bitwise repeatable there (``data/h100/model_measure/diag.json``). The difference is in each row
#: (``state_restore``). A state left moving gives differences near 1 (Bamba's logits: 1.17).
REPEAT_TOL = {k: v / 2 for k, v in LOGIT_TOL.items()}


def input_columns(case, dtype, inputs) -> dict:
    """:attr:`Operator.input_columns`: a decode row's ``state_restore_bytes`` (bytes each call copies
    back before it runs: states and position counters, :class:`flyexplore.ops.model.state.Rewind`)
    and ``state_restore`` (the same in words); nothing for a prefill or a registered module."""
    rw = inputs.get("rewind")
    if not isinstance(rw, S.Rewind):
        return {}
    return {"state_restore_bytes": rw.bytes, "state_restore": rw.text()}


def step_fn(fn, inputs, mark_step: bool = False):
    """A zero-argument step: ``fn(*args, **kwargs)`` under ``torch.no_grad()`` (a decode step first
    puts its cache back as the prefill left it: :func:`flyexplore.ops.model.state.plan_rewind`).
    ``mark_step``: call ``torch.compiler.cudagraph_mark_step_begin()`` before ``fn`` (Inductor's CUDA
    graph trees: each call is a new step, whose outputs the next replay overwrites)."""
    import torch

    args, kw, rewind = inputs["args"], inputs["kwargs"], inputs.get("rewind")

    def step():
        with torch.no_grad():
            if rewind is not None:
                rewind()
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
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


def _graph_device(ctx, case, dtype):
    """Why a ``*_graph`` variant cannot run here: CUDA/HIP graphs need the case on a GPU."""
    if not ctx.gpu:
        return f"CUDA/HIP graphs need a GPU (torch.cuda.CUDAGraph); this case runs on {ctx.device.type}"
    return None


def _graph_and(available):
    """A ``*_graph`` twin's ``available``: a GPU, then its twin's own check."""
    def check(ctx, case, dtype):
        return _graph_device(ctx, case, dtype) or available(ctx, case, dtype)
    return check


def rolling_window(case) -> str | None:
    """Why an eager decode step cannot be captured in a CUDA/HIP graph: its sliding-window layers
    roll. Once a decode's context fills the window (``seq >= sliding_window``), transformers'
    ``StaticSlidingWindowLayer.update`` (``cache_utils.py``, 4.5x-5.2x) takes its roll branch,
    which makes a small CPU tensor and copies it to the device, which a graph capture refuses
    (seen on the lent H100: "Cannot copy between CPU and CUDA tensors during CUDA graph capture").
    ``None`` for a prefill, a registered module, or a config without an active window
    (``sliding_window`` unset, or ``use_sliding_window`` false)."""
    if case["phase"] != "decode" or _module_key(case["model"]) is not None:
        return None
    cfg = config_of(case)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
    win = text.get("sliding_window")
    if not isinstance(win, int) or isinstance(win, bool) or win <= 0 or text.get("use_sliding_window") is False:
        return None
    if case["seq"] < win:
        return None
    return (f"an eager decode at context {case['seq']} fills the sliding window ({win}): transformers' sliding-window "
            "cache then rolls its keys and values through a CPU tensor each step, which a CUDA/HIP graph cannot "
            "capture")


def _eager_graph_ok(available=None):
    """An eager ``*_graph`` variant's ``available``: a GPU, no rolling window (:func:`rolling_window`),
    then its twin's own check (``available``)."""
    def check(ctx, case, dtype):
        return (_graph_device(ctx, case, dtype) or rolling_window(case)
                or (available(ctx, case, dtype) if available is not None else None))
    return check


def _eager_build(case, dtype, inputs, ctx):
    return step_fn(inputs["model"], inputs)


def _eager_graph_build(case, dtype, inputs, ctx, api=None):
    """``eager_graph`` / ``eager_flydsl_graph``: the eager step (its rewind inside) as one graph
    replay per call (:func:`flyexplore.ops.model.graph.graph_replay`; ``api``: its graph calls)."""
    return G.graph_replay(step_fn(inputs["model"], inputs), ctx.device, api=api)


def _compiled_build(name):
    def build(case, dtype, inputs, ctx):
        import torch

        fn = torch.compile(inputs["model"], dynamic=False, options=dict(COMPILE_OPTIONS[name]))
        if COMPILE_OPTIONS[name].get("triton.cudagraphs"):   # CUDA graph trees: a new step per call
            return G.trees_step(step_fn(fn, inputs, mark_step=True))
        return step_fn(fn, inputs)
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
    would recompile with hooks added). None for a graph variant: its breakdown is one profiled
    replay, whose kernels have no CPU-side operator or module range around them (the graph
    launches them), so they are attributed by kernel name only; and its gaps are not lessened by the
    profiler's per-launch host cost (``graph=True``: one launch replays them all)."""
    if backend in GRAPH_TWINS:
        return {"graph": True}
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
MODEL.bytes = lambda case, dtype: float(sum(memory_terms(case, dtype)[k] for k in ("weights", "kv_cache")))
MODEL.tensors = _tensors
MODEL.input_columns = input_columns

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
MODEL.backend("eager_graph", VARIANTS["eager_graph"], available=_eager_graph_ok(),
              context=lambda ctx, case: flydsl_eager(False, EAGER_OPS))(_eager_graph_build)
MODEL.backend("eager_flydsl_graph", VARIANTS["eager_flydsl_graph"],
              available=_eager_graph_ok(_flydsl_eager_available),
              context=lambda ctx, case: flydsl_eager(True, EAGER_OPS))(_eager_graph_build)
MODEL.backend("compile_graph", VARIANTS["compile_graph"], available=_graph_device,
              context=compile_context)(_compiled_build("compile_graph"))
MODEL.backend("max_autotune_graph", VARIANTS["max_autotune_graph"], available=_graph_and(_needs_gpu),
              context=compile_context)(_compiled_build("max_autotune_graph"))
MODEL.backend("max_autotune_flydsl_graph", VARIANTS["max_autotune_flydsl_graph"],
              available=_graph_and(_flydsl_compile_available),
              context=compile_context)(_compiled_build("max_autotune_flydsl_graph"))
