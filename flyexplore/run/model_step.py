"""Measure a model step: the ``model`` operator family (:mod:`flyexplore.ops.model.operator`) swept
for one case -- a model and a phase -- over its variants, as any sweep
(:func:`flyexplore.run.sweep.run_sweep`): interleaved round by round in one process, with the
sweep's stopping rule, intervals and labels, its journal, ``--processes``, the result file
``compare`` and ``report`` read. ``fx.model(..., measure=True)`` and ``flyexplore model
--measure`` call :func:`measure_step` and put its rows beside the capture's answer
(:mod:`flyexplore.views.model`).

Why a family and not a command of its own: a whole step then takes every tool a per-operator case
takes -- the interleaved timer and its verdicts, the memory check (the family's own estimate,
:attr:`~flyexplore.ops.base.Operator.memory`), worker processes that a crash or a time-out cannot
take down, the journal and resume, ``--processes`` and the environment A/B (``flyexplore sweep
model --shapes 1x2048:model=llama-3.1-8b --env A=... --env B=...`` times whole steps across two
builds) -- with nothing rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import get_op
from flyexplore.ops.model import operator as M
from flyexplore.run.memory import memory_check
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import run_sweep


def model_value(hf: str | None = None, config=None) -> str:
    """The ``model=`` value of a case: a built-in name as it is, a ``config.json`` path as an
    absolute path, and a config dict (or a loaded description) written once to a file named by its
    digest under the temporary folder (a case names its model in text). Raises :class:`UsageError`
    for neither or both, or a path with ``,`` (it separates case options)."""
    if (hf is None) == (config is None):
        raise UsageError("give exactly one of a built-in model name and a config")
    if hf is not None:
        return str(hf).strip().lower()
    if isinstance(config, Mapping):
        d = dict(config)
        if not isinstance(d.get("config"), Mapping):   # a bare config dict: named by its model_type
            mt = d.get("model_type", "model")
            d = {"name": f"{mt}-config", "title": f"{mt} config (a dict)", "source": "a config dict", "config": d}
        text = json.dumps(d, sort_keys=True, default=str)
        folder = Path(tempfile.gettempdir()) / "flyexplore-models"
        folder.mkdir(parents=True, exist_ok=True)
        p = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        if not p.exists():
            p.write_text(text)
        return str(p)
    p = os.path.abspath(str(config))
    if "," in p:
        raise UsageError(f"config path {p!r} holds a ',' which separates a case's options: copy or link it elsewhere")
    return p


def case_text(model: str, phase: str = "prefill", batch: int = 1, seq: int = 2048, layers: int | None = None) -> str:
    """``BATCHxSEQ:model=...[,decode][,layers=N]``: the ``model`` family's case."""
    opts = [f"model={model}"]
    if phase != "prefill":
        opts.append(str(phase))
    if layers:
        opts.append(f"layers={int(layers)}")
    return f"{batch}x{seq}:" + ",".join(opts)


def plan_case(hf=None, config=None, *, phase: str = "prefill", batch: int = 1, seq: int = 2048,
              layers: int | None = None):
    """The checked :class:`~flyexplore.ops.base.Case` of a step: unknown model, phase, a batch or
    seq below 1, a step past the model's positions (``max_position_embeddings``; decode: the
    context plus the new token) and ``layers`` past the model's are :class:`UsageError`, in one
    line, before torch is imported."""
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise UsageError(f"layers must be a positive integer, got {layers!r}")
    return get_op("model").case(case_text(model_value(hf, config), phase, batch, seq, layers))


def capture_config(case) -> dict:
    """The description the capture takes for the measured case (:func:`flyexplore.insight.hf.load_config`'s
    layout): the case's config with its depth cut as the case's ``layers`` says, titled so; a cut
    that picked layers, set period keys or dropped a kind of layer on a hybrid says so in ``notes``
    and ``layers_note`` (:func:`flyexplore.ops.model.operator.layers_note`)."""
    desc = dict(M.describe(case["model"]))
    cfg = M.config_of(case)
    if case["layers"]:
        full = M.model_dims(desc["config"])["layers"]
        desc["layers_note"] = M.layers_note(case)   # a hybrid's cut: the layers picked or the kinds dropped
        which = "first " if not desc["layers_note"] else ""
        desc["title"] = f"{desc['title']} ({which}{case['layers']} of {full} layers)"
        desc["notes"] = list(desc.get("notes", ())) + [desc["layers_note"] or (
            f"layers: the first {case['layers']} of {full} decoder layers are built (--layers, layers=), as in the "
            "measured step")]
    desc["config"] = cfg
    return desc


def step_spec(hf=None, config=None, *, phase: str = "prefill", batch: int = 1, seq: int = 2048,
              layers: int | None = None, variants: str | Sequence[str] | None = None, dtype: str | None = None,
              device=None, max_memory: int | None = None, timer: Mapping | None = None, out=None,
              processes: int | None = None, **sweep) -> SweepSpec:
    """The checked :class:`~flyexplore.run.spec.SweepSpec` of :func:`measure_step` (its arguments),
    with the step's memory checked against the device's free memory and ``max_memory``
    (:func:`flyexplore.run.memory.memory_check`, the family's own estimate). Raises
    :class:`UsageError` as :func:`measure_step` does, before anything is allocated."""
    case = plan_case(hf, config, phase=phase, batch=batch, seq=seq, layers=layers)
    op = get_op("model")
    names = list(M.VARIANTS) if variants is None else [v.strip() for v in (
        variants.split(",") if isinstance(variants, str) else variants) if v.strip()]
    for v in names:
        if v not in op.backends:
            raise bad_choice("variant", v, tuple(op.backends))
    if not names:
        raise UsageError("no variant given (valid: " + ", ".join(M.VARIANTS) + ")")
    if dtype is None:
        dt = str(M.describe(case["model"])["config"].get("torch_dtype") or "bfloat16")
        dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dt, "bf16")
    spec = SweepSpec(op="model", shapes=(case.label,), dtypes=(dtype,), backends=tuple(names), device=device,
                     max_memory=max_memory, timer=dict(timer or {}), out=Path(out) if out is not None else None,
                     processes=processes, **sweep)
    memory_check(spec.plan, spec.device, max_memory)  # refused in one line naming the estimate
    return spec


def measure_step(hf=None, config=None, *, phase: str = "prefill", batch: int = 1, seq: int = 2048,
                 layers: int | None = None, variants: str | Sequence[str] | None = None, dtype: str | None = None,
                 device=None, max_memory: int | None = None, timer: Mapping | None = None, out=None,
                 processes: int | None = None, progress: bool = True, **sweep) -> pd.DataFrame:
    """Measure one step of a model on ``device`` (default a GPU when one is visible, else the
    CPU), each of ``variants`` (default all of :data:`flyexplore.ops.model.operator.VARIANTS`) a
    backend, and return the sweep's rows (one per variant; those that cannot run here are
    ``unavailable`` with the reason).

    ``hf`` / ``config``: a built-in name, or a ``config.json`` path or dict (exactly one);
    ``phase`` (``prefill``: ``batch`` sequences of ``seq`` tokens; ``decode``: one token each
    against a static KV cache of ``seq``), ``layers`` (the first N decoder layers only), ``dtype``
    (default the config's ``torch_dtype``, else bf16). Times: ms per step (``median``, intervals,
    ``speedup`` against ``eager`` with its interval and label); ``first_call_ms`` holds the
    variant's compile and autotune; ``peak_mem_bytes`` its peak (GPU); ``breakdown`` one profiled
    step by kernel category. ``max_memory`` (bytes), ``timer``, ``out``, ``processes`` and the other
    keywords are :class:`~flyexplore.run.spec.SweepSpec`'s.

    Raises :class:`UsageError` (one line, nothing written) for an unknown variant, model or phase,
    a step past the model's positions, ``layers`` past its depth, and a model whose estimate
    (weights + KV cache + activations, :func:`flyexplore.ops.model.operator.memory_terms`) is over
    the device's free memory or ``max_memory`` -- named with the estimate, before anything is
    allocated."""
    spec = step_spec(hf, config, phase=phase, batch=batch, seq=seq, layers=layers, variants=variants, dtype=dtype,
                     device=device, max_memory=max_memory, timer=timer, out=out, processes=processes, **sweep)
    return run_sweep(spec, progress=progress)
