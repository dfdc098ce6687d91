"""The public face's functions (``import flyexplore as fx``; :data:`flyexplore.__all__`): each is a
thin door into the layer that does the work, so README, docs and notebooks need no submodule.

Grouped as in :mod:`flyexplore` (the package docstring lists them): run and read (``sweep``,
``load``, ``speedup``, ``geomean``, ``compare``, ``published``, ``peaks``, ``walkthrough``),
FlyDSL insight (``explain``, ``trace``, ``autotune``, ``xray``, ``xray_figure``, ``kernels``,
``switches``, ``mx_blocks``, ``mx_errors``, ``aotriton_ab``) and views (``figure``, ``export``,
``files``, ``report``, ``summary``).

This module sits at the top, beside the CLI: it may import any layer. ``import flyexplore`` stays
light (no torch, pandas or plotly) because the root package imports this module only on first
use of one of its names; torch itself is imported inside the layers' functions.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.parsing import parse_bytes
from flyexplore.insight import capture as _cap
from flyexplore.insight import hf as _hf
from flyexplore.insight.case_trace import result_text, trace_autotune, trace_case
from flyexplore.insight.explain import explain as _explain_call
from flyexplore.insight.explain import explain_text
from flyexplore.insight.trace import trace as _trace_fn
from flyexplore.insight.xray import xray as _xray
from flyexplore.insight.xray import xray_dtypes, xray_shapes
from flyexplore.ops import get_op, list_ops
from flyexplore.ops.model import operator as MO
from flyexplore.ops.scaled_gemm import mx as _mx
from flyexplore.results import peaks as _peaks
from flyexplore.results import published as _published
from flyexplore.results import table as R
from flyexplore.results.aotriton_ab import compare_files
from flyexplore.results.compare import sides
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import run_sweep
from flyexplore.ui import notebooks as _nb
from flyexplore.views import export as _export
from flyexplore.views import plots, plots_compare
from flyexplore.views.aotriton import aotriton_ab_figure
from flyexplore.views import model_step as VS
from flyexplore.views.model import ModelCoverage, judge_captures, model_coverage
from flyexplore.views.report import refuse_no_rows, summary_table, write_ab_report, write_report
from flyexplore.views.series import series_figure
from flyexplore.views.xray import resources_figure
from flyexplore.world import switches as _switches
from flyexplore.world.facts import facts
from flyexplore.world.readiness import FLYDSL_ARCH, check_arch

_PathLike = (str, os.PathLike)


# -- run and read ------------------------------------------------------------------------------

#: Keywords of :func:`sweep` that watch the run (:func:`flyexplore.run.sweep.run_sweep`'s), not
#: part of the :class:`~flyexplore.run.spec.SweepSpec`.
RUN_KEYWORDS = ("progress", "on_row", "should_stop")
#: Keywords of :func:`sweep` that are the spec's fields.
SPEC_KEYWORDS = tuple(f.name for f in dataclasses.fields(SweepSpec) if f.init)


def sweep(op, *, shapes=None, suite: str | None = None, dtypes=None, backends=None,
          out: str | os.PathLike | None = None, **options):
    """Measure ``op`` (a catalogue name, :func:`flyexplore.list_ops`) over a suite or shapes and
    return the result rows (a pandas DataFrame, one row per case x dtype x backend; times in ms,
    the columns of :data:`flyexplore.results.table.COLUMNS`).

    ``shapes``: catalogue shape text (``"8192x4096;2048x16384:eps=1e-5"``) or a list of them;
    ``suite``: a named suite (``flyexplore suites``); ``dtypes`` / ``backends``: lists or comma
    text (default: the operator's). ``out``: also write ``.parquet`` / ``.csv`` / ``.jsonl``.
    Other options are the fields of :class:`flyexplore.run.spec.SweepSpec` (``timer``, ``order``,
    ``band``, ``baseline``, ``resume``, ``devices``, ...; for an A/B of environments -- two torch
    builds, flydsl versions, library settings, timed round by round on one GPU -- ``envs`` (a
    list, one environment each: ``["0.13b=/opt/envs/a/bin/python", "0.14.2b=/opt/envs/b/bin/python"]``
    or ``["base", "lt:TORCH_BLAS_PREFER_HIPBLASLT=0"]``), ``pairs``, ``aa``, ``worker_code``;
    ``docs/env-ab.md``), ``force`` (past the limits: more than 20 processes or pairs, or a time
    bound over a day, :meth:`~flyexplore.run.spec.SweepSpec.time_bound_s`), which is built from them, and
    :func:`flyexplore.run.sweep.run_sweep`'s ``progress``, ``on_row``, ``should_stop``. ``op`` may
    also be a SweepSpec, run as it is (then only those three keywords). The frame's
    ``attrs["sweeps"]`` holds the spec. Raises :class:`~flyexplore.errors.UsageError` with one
    line naming a bad value (an unknown keyword included) before anything runs. A walkthrough's
    sweep: ``fx.sweep(**fx.walkthrough("gemm", "cpu"))``.
    """

    run_kw = {k: options.pop(k) for k in RUN_KEYWORDS if k in options}
    for k in options:
        if k not in SPEC_KEYWORDS:
            raise bad_choice("sweep option", k, SPEC_KEYWORDS + RUN_KEYWORDS)
    if isinstance(op, SweepSpec):
        given = [k for k, v in (("shapes", shapes), ("suite", suite), ("dtypes", dtypes),
                                ("backends", backends), ("out", out)) if v is not None] + list(options)
        if given:
            raise UsageError(f"fx.sweep(spec) runs the spec as it is; give {given[0]} to the SweepSpec "
                             "(or dataclasses.replace it)")
        return run_sweep(op, **run_kw)
    spec = SweepSpec(op, suite=suite, shapes=shapes, dtypes=dtypes, backends=backends, out=out, **options)
    return run_sweep(spec, **run_kw)


def load(*paths: str | os.PathLike):
    """Read one or more result files (``.parquet``, ``.csv``, ``.jsonl``) into one result set in
    the result schema (a pandas DataFrame; every column kept), checked as ``flyexplore report``,
    ``compare`` and ``export`` check them (:func:`flyexplore.results.table.load_set`: each file
    by :func:`flyexplore.results.table.validate`, several files concatenated by
    :func:`flyexplore.results.table.concat`). A single list or tuple of paths is read the same
    way. Raises :class:`~flyexplore.errors.UsageError`, the command line's one line naming the
    file (and the column, row and value), for no path, a missing, damaged or foreign file, an
    unknown format, and rows the schema refuses: an unknown status or source, an ``ok`` row
    without a positive ``time_ms`` (a text such as ``'fast'``, an empty cell, no such column),
    two rows of one key in one run (also across files), or a ``time_ms`` that is not its samples'
    median. ``flyexplore.results.table.load(path)`` reads a file without these checks."""

    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    if not paths:
        raise UsageError("load needs at least one result file")
    return R.load_set(paths)


def _is_paths(data) -> bool:
    return isinstance(data, _PathLike) or (isinstance(data, (list, tuple)) and bool(data)
                                           and all(isinstance(p, _PathLike) for p in data))


def _rows(data, what: str):
    """``data`` as result rows, checked as the command line checks files: a path (or a list of
    paths) read by :func:`load`; a DataFrame checked by :func:`flyexplore.results.table.checked`
    (one :class:`~flyexplore.errors.UsageError` line ``the DataFrame given to fx.<what> is not a
    valid result set: ...``) and returned as it is, without its ``attrs``
    (:func:`flyexplore.results.table.without_attrs`)."""
    if isinstance(data, pd.DataFrame):
        data = R.without_attrs(data)   # the rules read rows: no deep copy of attrs per operation
        R.checked(data, f"the DataFrame given to fx.{what}")
        return data
    if _is_paths(data):
        return load(data)
    raise UsageError(f"{what} takes result rows (a DataFrame) or result file paths, "
                     f"got {type(data).__name__}")


def speedup(df, baseline: str | Sequence[str] = "aten", **kw):
    """Per case and backend: baseline time / backend time with its 95% interval and label
    (FASTER / SAME / SLOWER / AMBIGUOUS, against the +-1% band of
    :data:`flyexplore.results.table.TIE_BAND`); ``baseline`` one backend or several (the faster
    of them per case). ``df``: result rows or result file paths. Returns a DataFrame
    (:func:`flyexplore.results.table.speedup`, whose keywords it takes)."""

    return R.speedup(_rows(df, "speedup"), baseline, **kw)


def geomean(df, baseline: str | Sequence[str] = "aten", **kw):
    """Geometric-mean speedup per (op, dtype, backend) with its 95% interval (the per-case
    intervals combined in log space), label and label counts, as a DataFrame
    (:func:`flyexplore.results.table.geomean_speedup`). ``df``: result rows or result file
    paths."""

    return R.geomean_speedup(_rows(df, "geomean"), baseline, **kw)


def _two_names(names) -> tuple[str, str]:
    got = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n) for n in names]
    if len(got) != 2 or not all(got):
        raise UsageError(f"names needs two names (A, B), got {names!r}")
    return got[0], got[1]


def compare(a, b=None, *, names: Sequence[str] | str | None = None, a_backend: str | None = None,
            b_backend: str | None = None, out: str | os.PathLike | None = None, title: str | None = None,
            static: bool = True, formats: Sequence[str] | None = None, a_env: str | None = None,
            b_env: str | None = None, history=None):
    """A/B of two result sets paired by case, as ``flyexplore compare`` does.

    ``a`` / ``b``: result rows (DataFrames) or result file paths -- then the return value is a
    :class:`flyexplore.results.compare.ABResult` (``pairs``: time A / time B per paired
    (op, case, dtype, backend) with its 95% interval and label, > 1: B faster; ``summary``,
    ``only_a`` / ``only_b``, ``env``, ``warnings``; :func:`flyexplore.results.compare.pair`;
    ``ab.summary_lines()`` the terminal summary, ``ab.gate("SLOWER:5%").failed`` the CI gate
    of ``flyexplore compare --fail-on``, with its rule text: ``ab.gate("SLOWER:5%,AMBIGUOUS:5%")``,
    ``"AMBIGUOUS:5%:warn"``; :func:`flyexplore.results.gate.gate`).
    Or both ``vllm bench serve --save-result`` JSON files or folders of them -- then a
    DataFrame of per-metric speedups of B over A per (model, concurrency, request rate)
    (:func:`flyexplore.results.vllm.ab_table`). ``names``: the two sides' display names (a pair
    or ``"A,B"`` text; default ``A``, ``B``); ``a_backend`` / ``b_backend``: compare one backend of
    A with one of B (e.g. ``aten`` vs ``flydsl`` of one sweep). ``b`` None: ``a`` is one
    environment A/B (``fx.sweep(..., envs=...)``), whose environments are the sides (``a_env`` /
    ``b_env`` pick them; names default to theirs), paired round by round with no cross-run
    allowance (:func:`flyexplore.results.compare.env_sides`). ``history``: the history store
    whose identical runs of the two sets' one device give the cross-run allowance (a folder; None:
    the default store when there is one; ``"off"``: the per-platform constant;
    :func:`flyexplore.results.history.store_for_compare`). ``out``: also write the A/B report there
    (``report.html``, its tables and, with ``static``, figure images in ``formats``; an
    AOTriton section where attention rows pair; :func:`flyexplore.views.report.write_compare_report`
    / ``write_vllm_report``). Files and DataFrames are checked as ``flyexplore compare`` checks
    its files (:func:`flyexplore.results.table.validate`: a doubled ``time_ms`` that its samples
    contradict, duplicate rows, an unknown status, ... are refused in its one line). Raises
    :class:`~flyexplore.errors.UsageError` for a missing or invalid file or DataFrame, a vllm
    result against a flyexplore result, backends given for a vllm A/B, bad names, or when
    nothing pairs."""

    rep: dict[str, Any] = {"title": title, "static": static}
    if formats is not None:
        rep["formats"] = list(formats)
    # one file or frame a side is checked by sides, as flyexplore compare's files are
    a, b = (load(x) if isinstance(x, (list, tuple)) and _is_paths(x) else x for x in (a, b))
    for x in (a, b):
        if not (x is None or isinstance(x, (pd.DataFrame, *_PathLike))):
            raise UsageError(f"compare takes result rows (a DataFrame) or result file paths, got {type(x).__name__}")
    sd = sides(a, b, _two_names(names) if names is not None else None, a_backend, b_backend, a_env, b_env,
               history=history)
    if out is not None:
        write_ab_report(sd, out, **rep)
    return sd.ab


#: ``fx.published(what)`` tables other than the per-case rows.
PUBLISHED_TABLES = ("summary", "headlines", "ranges", "vllm")


def published(what: str | Sequence[str] | None = None):
    """The published AMD Instinct MI355X figures (``data/published/``, provenance in
    ``data/published/SOURCES.md``; never measured by flyexplore), as DataFrames.

    ``what``: ``None`` -- every per-case kernel row as result rows (``source="published"``,
    times in ms; :func:`flyexplore.results.published.load`); a kernel suite name (``dense``,
    ``rmsnorm``, ``topk``, ``grouped``, ``mxfp``), comma text or a list of them -- those rows;
    ``"summary"`` -- rows, cases, dtypes and backends per suite; ``"headlines"`` -- the headline
    numbers recomputed from the rows beside the printed ones; ``"ranges"`` -- the figures public
    only as ranges (``what, subject, low, high``); ``"vllm"`` -- the vLLM whole-request A/B
    (speedup = 1 + published % / 100). The names are ``flyexplore published --suite``'s plus
    ``summary`` and ``headlines``. Raises :class:`~flyexplore.errors.UsageError` for another
    name."""

    if isinstance(what, str) and what in PUBLISHED_TABLES:
        return {"summary": _published.summary, "headlines": _published.headlines,
                "ranges": _published.ranges, "vllm": _published.vllm_published}[what]()
    names = [s.strip() for s in what.split(",")] if isinstance(what, str) else what
    for n in names or ():
        if n not in _published.suites():
            raise bad_choice("published table", n, (*_published.suites(), *PUBLISHED_TABLES))
    return _published.load(what)


def peaks(df=None, *, device: str | None = None, kind: str | None = None):
    """Peak throughput (:mod:`flyexplore.results.peaks`: datasheet peaks of MI355X, MI350X,
    MI300X, H100, H200, and measured H200 peaks, each with its source).

    Without ``df``: the peak table (one row per device and dtype class: ``device, class,
    tflops, hbm_tbps, measured_tflops, measured_tbps``, ...). With result rows (or result file
    paths) ``df``: a copy with ``pct_peak_tflops`` / ``pct_peak_gbps`` (% of the peak of the
    rows' device, or ``device``), ``peak_tflops``, ``peak_gbps`` and ``peak_device``; ``kind``
    ``"datasheet"`` (default) or ``"measured"`` peaks (:func:`flyexplore.results.peaks.percent_of_peak`).
    Raises :class:`~flyexplore.errors.UsageError` for an unknown device or kind, or ``device`` /
    ``kind`` without rows."""

    if df is None:
        if device is not None or kind is not None:
            raise UsageError("peaks: device and kind apply to result rows; give the rows as the first argument")
        return _peaks.table()
    return _peaks.percent_of_peak(_rows(df, "peaks"), device=device, kind=kind or "datasheet")


def _walkthrough_steps() -> dict[str, Any]:
    """Walkthrough steps besides the sweeps of :data:`flyexplore.ui.notebooks.WALKTHROUGH_SWEEPS`:
    ``<op>:grid`` (eligibility grids) and ``rmsnorm:xray`` (the X-ray's shapes)."""
    steps: dict[str, Any] = {f"{op}:grid": {"op": op, **g} for op, g in _nb.ELIGIBILITY_GRIDS.items()}
    steps["rmsnorm:xray"] = {"op": "rmsnorm", "shapes": list(_nb.XRAY_RMSNORM), "dtype": "bf16"}
    return steps


def walkthrough(name: str, size: str = "cpu") -> dict[str, Any]:
    """The keyword arguments a walkthrough notebook (``notebooks/``) passes for step ``name`` at
    ``size`` (``"cpu"``: seconds on a 2-core CPU; ``"gpu"``: one GPU, minutes; ``"test"``: what the
    test suite runs, the cpu size's cases with fewer timed calls and A/B pairs), decided in
    :mod:`flyexplore.ui.notebooks`, not in the notebooks:

    - a sweep (``gemm``, ``gemm:m-sweep``, ``gemm:published``, ``grouped_gemm``, ``scaled_gemm``,
      ``attention``, ``rmsnorm``, ``topk``): ``op`` and ``suite`` or ``shapes``/``dtypes``, with
      ``backends`` and ``timer`` where set, for :func:`sweep` and :class:`SweepPanel`
      (:data:`flyexplore.ui.notebooks.WALKTHROUGH_SWEEPS`);
    - ``rmsnorm:grid``, ``topk:grid``: ``op``, ``ms``, ``ns``, ``dims`` for
      :func:`eligibility_grid` (:data:`flyexplore.ui.notebooks.ELIGIBILITY_GRIDS`; the same
      at every size);
    - ``rmsnorm:xray``: ``op``, ``shapes``, ``dtype`` for :func:`xray_figure`
      (:data:`flyexplore.ui.notebooks.XRAY_RMSNORM`).

    A fresh copy each call. Raises :class:`~flyexplore.errors.UsageError` for an unknown size or
    step."""

    _nb.check_size(size)
    steps = _walkthrough_steps()
    if name in steps:
        return copy.deepcopy(steps[name])
    sweeps = sorted({n for n, _ in _nb.WALKTHROUGH_SWEEPS})
    if name not in sweeps:
        raise bad_choice("walkthrough step", name, [*sweeps, *steps])
    return _nb.sweep_args(size, name)


# -- FlyDSL insight ----------------------------------------------------------------------------
def explain(op: str, shape: str | None = None, dtype: str | None = None,
            options: str | Mapping[str, Any] | None = None, **kw):
    """Would ``op`` take FlyDSL in torch 2.15? Returns an
    :class:`~flyexplore.world.conditions.Explanation`: ``taken`` (bool), ``reason`` (one line),
    every condition with its source in torch 2.15, ``to_text()``.

    With ``shape`` (catalogue shape text, ``"16x28672x4096:NT"``), ``dtype`` (default the
    operator's first) and ``options`` (``"a_offset=3"`` or a dict): judged for ``arch``
    (default gfx950 as on an MI355X, 256 CUs; ``arch=None``: this machine as it is); keywords
    ``arch``, ``cu``, ``compile_options`` and family options such as ``aotriton=``
    (:func:`flyexplore.insight.explain.explain_text`). Without ``shape``: the call's own
    arguments as keywords, real or fake tensors or :class:`TensorDesc` descriptions
    (``fx.explain("topk", x=tensor, k=8)``; :func:`flyexplore.insight.explain.explain`), judged
    for ``arch`` and ``cu`` the same way; ``compile_options`` (GEMMs) default to this process's
    Inductor settings there, ``env`` takes judged facts as they are. Raises :class:`~flyexplore.errors.UsageError` for an unknown operator, shape, dtype or
    argument."""

    if shape is None:
        if dtype is not None or options is not None:
            raise UsageError("explain without a shape takes the call's arguments as keywords "
                             "(x=..., k=...), not dtype or options")
        env = kw.pop("env", None)
        arch, cu, comp = kw.pop("arch", FLYDSL_ARCH), kw.pop("cu", None), kw.pop("compile_options", None)
        if env is None:
            check_arch(arch)
            env = facts(arch=arch, cu=cu, assume_rocm=arch is not None, compile_options=comp)
        return _explain_call(op, env=env, **kw)
    return explain_text(op, shape, dtype, options, **kw)


def _is_module(obj) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _model_source(model) -> dict:
    """``hf=`` or ``config=`` of :func:`flyexplore.insight.hf.load_config` for a built-in name, a
    config path or a config dict."""
    if isinstance(model, Mapping):
        return {"config": model}
    text = str(model)
    if isinstance(model, str) and text.strip().lower() in _hf.builtin_models():
        return {"hf": text}
    if text.endswith(".json") or Path(text).is_file():
        return {"config": text}
    if len(text) > 200 or "\n" in text:
        raise UsageError(f"model must be a built-in name ({', '.join(_hf.builtin_models())}), a config.json path or "
                         f"dict, an nn.Module or fx.capture's result; got a {type(model).__name__}")
    raise bad_choice("model (a built-in name or a config.json path)", text, _hf.builtin_models())


def capture(model, inputs=None, *, view: str = "eager", phase: str = "prefill", batch: int = 1, seq: int = 2048,
            arch: str = FLYDSL_ARCH, device: str | None = None, routing: str = "uniform",
            kwargs: Mapping[str, Any] | None = None, force: bool = False):
    """Record every operator call of one forward step of a model, with no GPU and no weights.

    ``model``: an ``nn.Module`` run as ``model(*inputs, **kwargs)`` (``inputs`` a tensor or a
    tuple; parameters and inputs become fake tensors on ``device``, default ``cuda:0`` whatever
    device the module is on); or a Hugging Face model -- a built-in name (``"llama-3.1-8b"``,
    ``"qwen3-30b-a3b"``, ``"mixtral-8x7b"``, ``"gpt-oss-20b"``), a ``config.json`` path or a config
    dict -- with the phase spec ``phase`` (``prefill`` / ``decode``), ``batch`` and ``seq``
    (decode: the context length) and the MoE ``routing`` assumption (``uniform``). ``view``:
    ``eager`` (what ATen and the eager overrides see), ``compiled`` (what Inductor lowers) or
    ``both``. ``arch``: the target the fake device stands for (gfx950). ``force``: capture a
    Hugging Face model past the limits of :func:`model` (512 layers, ...).

    Returns a :class:`~flyexplore.insight.capture.Capture` (a list of two for ``both``): its
    ``calls`` (op, :class:`TensorDesc` arguments with strides and storage offset, module path,
    FLOPs, bytes, ``count``: calls folded as recorded, e.g. the steps of a loop over the
    sequence), ``distinct()`` (identical calls counted), ``layers`` (identical layers
    detected), ``uncaptured`` (what could not be captured, with the reason) and ``assumptions``.
    Judge them with ``fx.model(capture)`` (or ``fx.model(module, inputs)`` to capture and judge in
    one call). Raises :class:`~flyexplore.errors.UsageError` for bad input
    and :class:`~flyexplore.insight.capture.CaptureError` naming the module where capture failed."""
    views = _cap.views_of(view)
    check_arch(arch)
    if isinstance(model, (str, os.PathLike, Mapping)):
        if inputs is not None or kwargs:
            raise UsageError("a Hugging Face model takes a phase spec (phase=, batch=, seq=), not inputs")
        caps = _hf.capture_model(**_model_source(model), phase=phase, batch=batch, seq=seq, views=views,
                                 routing=routing, arch=arch, device=device or "cuda:0", force=force)
    else:
        caps = [_cap.capture(model, inputs, view=v, phase=phase if inputs is None else "", arch=arch, device=device,
                             kwargs=kwargs) for v in views]
    return caps[0] if len(caps) == 1 else caps


def model(model=None, inputs=None, *, config=None, kwargs: Mapping[str, Any] | None = None,
          phases: Sequence[tuple[str, int, int]] | None = None, phase: str | None = None,
          batch: int | None = None, seq: int | None = None, views: str | Sequence[str] = ("eager", "compiled"),
          arch: str = FLYDSL_ARCH,
          routing: str = "uniform", device: str = "cuda:0", project: str | None = None,
          speedups=None, force: bool = False, measure: bool = False, variants=None, layers: int | None = None,
          dtype: str | None = None, measure_device=None, max_memory: int | str | None = None, timer=None,
          out=None, processes: int | None = None, progress: bool = True, resume: bool = False,
          overwrite: bool = False) -> ModelCoverage:
    """Will this model take FlyDSL? Capture a Hugging Face model (``model``: a built-in name, a
    ``config.json`` path or a config dict; or ``config=``) -- or any ``nn.Module`` run on ``inputs``
    (and ``kwargs``), or captures already made (``fx.capture``'s result) -- and judge every distinct call for
    ``arch`` in each of ``views``, with what-if advice (each re-judged), shares, and a projection
    when ``project`` is ``"published"`` (MI355X per-op figures by nearest shape) or
    ``"results"`` (``speedups``: a result file or frame measured on MI350).

    ``phases``: ``[(phase, batch, seq), ...]``, or one step as ``phase`` (default prefill), ``batch``
    (1) and ``seq`` (2048; decode: the context), not both; ``views``: ``"eager"``, ``"compiled"``,
    ``"both"`` or a list.
    Returns a :class:`~flyexplore.views.model.ModelCoverage`: ``.table`` (one row per distinct
    call and view), ``.shares(by)``, ``.summary()``, ``.advice``, ``.projection``, ``.text()``,
    ``.markdown()``, ``.figure()``, ``.report(dir)``, ``.shapes()`` / ``.export_shapes(path)``
    (sweep input), ``.to_dict()``. FLOPs and bytes are captured; time is modelled (roofline);
    a projection is labelled as one. Raises :class:`~flyexplore.errors.UsageError` for bad input,
    checked before torch is touched: a config number that is NaN, infinite or not positive where it
    must be; a tensor past what torch can address; and, unless ``force=True``, a Hugging Face model
    past :data:`flyexplore.insight.hf.MODEL_LIMITS` (512 layers, 2,048 experts, an estimated 30 min,
    or more memory than is available; the capture costs a few ms a layer and view on a 2-core
    CPU). A run estimated at a minute or more prints its estimate to stderr first.

    ``measure=True`` also **measures** the step (one phase) on ``measure_device`` (default a GPU
    when one is visible, else the CPU): the model built with random weights on the device (no
    download), each of ``variants`` (default all: ``eager``, ``eager_flydsl``, ``compile``,
    ``max_autotune``, ``max_autotune_flydsl``, ``eager_ck``, and in CUDA/HIP graphs ``eager_graph``,
    ``eager_flydsl_graph``, ``compile_graph``, ``max_autotune_graph``, ``max_autotune_flydsl_graph``;
    :data:`flyexplore.ops.model.operator.VARIANTS`; a decode's cache states rewound before each
    call) timed interleaved round by round, with intervals, labels, compile time and peak
    memory apart, one profiled step by kernel category beside the modelled shares, and the
    projection (default ``project="published"``) beside the measured FlyDSL speedup:
    ``.measured`` (:class:`flyexplore.views.model_step.MeasuredStep`), also in ``.text()``.
    ``layers`` cuts the model to its first N decoder layers (measured and captured alike);
    ``dtype`` (default the config's); ``max_memory`` (bytes or text like ``"40GB"``); ``timer``,
    ``out`` (a result file), ``processes``, ``resume`` and ``overwrite`` (of ``out``, after an
    interruption or to replace it): as :func:`sweep`. An ``nn.Module`` is measured
    in this process with its own weights and ``inputs``. Raises :class:`UsageError`, before
    anything is allocated, for an unknown variant, a step past the model's positions and a model
    whose estimate (weights + KV cache + activations) is over the free memory or ``max_memory``."""
    if measure:
        return _measure_model(model, inputs, config=config, kwargs=kwargs, phases=phases, phase=phase, batch=batch,
                              seq=seq, views=views, arch=arch, routing=routing, device=device,
                              project=project or "published", speedups=speedups, force=force, variants=variants,
                              layers=layers, dtype=dtype, measure_device=measure_device, max_memory=max_memory,
                              timer=timer, out=out, processes=processes, progress=progress, resume=resume,
                              overwrite=overwrite)
    if resume or overwrite:
        raise UsageError("resume and overwrite are for measure=True with out= (the measured rows' file)")
    if any(v is not None for v in (variants, layers, dtype, measure_device, max_memory, timer, out, processes)):
        raise UsageError("variants, layers, dtype, measure_device, max_memory, timer, out and processes are for "
                         "measure=True")
    if isinstance(model, _cap.Capture) or (isinstance(model, (list, tuple)) and model
                                            and all(isinstance(c, _cap.Capture) for c in model)):
        return judge_captures(model, arch=arch, project=project, speedups=speedups, routing=routing)
    if _is_module(model):
        if phases is not None or (phase, batch, seq) != (None, None, None):
            raise UsageError("an nn.Module takes its inputs (fx.model(module, inputs)), not phases")
        caps = [_cap.capture(model, inputs, view=v, arch=arch, device=device, kwargs=kwargs)
                for v in _cap.views_of(views)]
        return judge_captures(caps, arch=arch, project=project, speedups=speedups, routing=routing)
    if inputs is not None or kwargs:
        raise UsageError("inputs are for an nn.Module; a Hugging Face model takes phases=, or phase=/batch=/seq=")
    if (model is None) == (config is None):
        raise UsageError("give exactly one of a model (a built-in name, config path or dict, an nn.Module, or "
                         "fx.capture's result) and config=")
    src = _model_source(model) if model is not None else {"config": config}
    if phases is not None and (phase, batch, seq) != (None, None, None):
        raise UsageError("give phases=[(phase, batch, seq), ...] or phase=/batch=/seq=, not both")
    ph = list(phases) if phases is not None else [(phase or "prefill", 1 if batch is None else batch,
                                                   2048 if seq is None else seq)]
    return model_coverage(src.get("hf"), src.get("config"), phases=ph, views=views, arch=arch, routing=routing,
                          device=device, project=project, speedups=speedups, force=force)


def _measure_model(model, inputs, *, config, kwargs, phases, phase, batch, seq, views, arch, routing, device,
                   project, speedups, force, variants, layers, dtype, measure_device, max_memory, timer, out, processes,
                   progress, resume=False, overwrite=False):
    """``fx.model(..., measure=True)``: :func:`flyexplore.views.model_step.measure_model` for a Hugging
    Face model, or for an ``nn.Module`` the capture of it and a sweep of the ``model`` family in this
    process (:func:`flyexplore.ops.model.operator.register_module`)."""
    mm = parse_bytes(max_memory, "max_memory") if isinstance(max_memory, str) else max_memory
    if _is_module(model):
        if phases is not None or (phase, batch, seq) != (None, None, None) or layers is not None:
            raise UsageError("an nn.Module takes its inputs (fx.model(module, inputs, measure=True)), not phases or layers")
        name = f"{type(model).__name__}-{id(model):x}"
        value = MO.register_module(name, model, inputs if inputs is not None else (), kwargs)
        caps = [_cap.capture(model, inputs, view=v, arch=arch, device=device, kwargs=kwargs)
                for v in _cap.views_of(views)]
        cov = judge_captures(caps, arch=arch, project=project, speedups=speedups, routing=routing)
        if dtype is None:   # the module runs as it is: its rows say its parameters' dtype
            import torch

            p = next(iter(model.parameters()), None)
            dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(getattr(p, "dtype", None), "fp32")
        frame = sweep("model", shapes=f"1x1:model={value}", backends=variants, dtypes=dtype,
                      device=measure_device, engine="in-process", max_memory=mm, timer=timer, out=out,
                      progress=progress, resume=resume, overwrite=overwrite)
        cov.measured = VS.MeasuredStep(frame, cov.table, cov._proj())
        return cov
    if inputs is not None or kwargs:
        raise UsageError("inputs are for an nn.Module; a Hugging Face model takes phase=/batch=/seq=")
    if (model is None) == (config is None):
        raise UsageError("give exactly one of a model (a built-in name, config path or dict, or an nn.Module) and config=")
    if phases is not None:
        if len(phases) != 1 or (phase, batch, seq) != (None, None, None):
            raise UsageError("measure=True measures one step: give phase=/batch=/seq= (or phases with one entry)")
        phase, batch, seq = phases[0]
    src = _model_source(model) if model is not None else {"config": config}
    return VS.measure_model(src.get("hf"), src.get("config"), phase=phase or "prefill", batch=1 if batch is None else batch,
                            seq=2048 if seq is None else seq, layers=layers, variants=variants, dtype=dtype,
                            device=measure_device, max_memory=mm, timer=timer, out=out, processes=processes, arch=arch,
                            routing=routing, project=project, force=force, progress=progress, resume=resume,
                            overwrite=overwrite)


class CaseTrace(dict):
    """What :func:`trace` found for one catalogue case: the dict of
    :func:`flyexplore.insight.case_trace.trace_case` (``op``, ``case``, ``dtype``, ``backend``,
    ``device``, ``status``, ``message``, ``trace`` and, for ``flydsl``, ``flydsl_taken`` /
    ``flydsl_reason``); ``str()`` is the text ``flyexplore trace`` prints."""

    def __str__(self) -> str:
        return result_text(self)


def trace(what, shape: str | None = None, backend: str | None = None, dtype: str | None = None, **kw):
    """What really ran, from ``torch.profiler``: every kernel put in a family (FlyDSL,
    Triton/Inductor, vendor BLAS, AOTriton, CK, attention, ATen native, runtime, or
    ``unclassified``; on a CPU the call's top-level CPU operators, said as such).

    ``fx.trace(fn)`` (a callable taking no arguments): runs it (``warmup``, ``reps``,
    ``device``, ``autotune`` keywords) and returns a :class:`flyexplore.insight.trace.Trace`
    (``to_text()``, ``to_frame()``, ``flydsl_taken``, ``autotune_frame()``; times in µs per
    call). ``fx.trace(op, shape, backend, dtype)``: one catalogue case on one backend
    (keywords ``device``, ``reps``, ``seed``), returned as a :class:`CaseTrace` dict whose
    ``str()`` is ``flyexplore trace``'s text; a backend that cannot run here gives
    ``status="unavailable"`` and the reason (:func:`flyexplore.insight.case_trace.trace_case`).
    Raises :class:`~flyexplore.errors.UsageError` for an unknown operator, backend or dtype, a
    bad shape, or a case without ``shape`` and ``backend``."""

    if callable(what):
        if shape is not None or backend is not None or dtype is not None:
            raise UsageError("trace(fn) takes no shape, backend or dtype (they name a catalogue case)")
        return _trace_fn(what, **kw)
    if shape is None or backend is None:
        raise UsageError(f"trace of operator {what!r} needs a shape and a backend")
    return CaseTrace(trace_case(what, shape, backend, dtype, **kw))


def autotune(shape: str | None = None, dtype: str | None = None, *, device=None,
             backends: str | None = None, reps: int = 3):
    """Compile one GEMM with max-autotune (Inductor's caches off, so autotuning really runs),
    trace it and return the :class:`flyexplore.insight.trace.Trace`: ``autotune_frame()``
    holds every candidate, its time (ms) and the winner, so "FlyDSL enabled but Triton won"
    shows. GPU: ``torch.mm`` (``shape`` ``MxNxK``, default 4096^3 bf16) over ``ATEN,TRITON``
    (+ ``FLYDSL`` where the templates are ready); CPU: ``torch.bmm`` (default 32x16x48 fp32)
    over ``ATEN,CPP`` (:func:`flyexplore.insight.case_trace.trace_autotune`). Raises
    :class:`~flyexplore.errors.UsageError` for a malformed shape or unknown dtype."""

    return trace_autotune(shape, dtype, device=device, backends=backends, reps=reps)


def xray(op: str, shape: str, dtype: str = "bf16", arch: str = "gfx950", **kw):
    """Compile-only X-ray of the FlyDSL kernel torch 2.15 would build for ``op`` on ``shape``:
    VGPRs, SGPRs, spills, LDS bytes and occupancy on ``arch`` (default gfx950), instruction
    counts and the ISA, as an :class:`flyexplore.insight.xray.XRay` (``to_text()``, ``rows``;
    keywords ``out``, ``keep_ir``, ... of :func:`flyexplore.insight.xray.xray`). Needs torch
    2.15, flydsl 0.3 and an AMDGPU-capable ``ld.lld`` (``lld-22``), no GPU. Raises
    :class:`~flyexplore.insight.xray.XRayUnavailable` when it cannot run here, with the
    reason, and :class:`~flyexplore.errors.UsageError` for a bad operator, shape or dtype."""

    return _xray(op, shape, dtype, arch, **kw)


def xray_figure(op: str, shapes: str | Sequence[str], dtype: str = "bf16",
                out: str | os.PathLike | None = None):
    """The X-ray resources figure of ``op``'s FlyDSL kernels for gfx950 across ``shapes`` (a
    list, or ``;``-separated text): unified VGPRs, spills, LDS bytes and waves per SIMD, one
    compile-only subprocess; cases without a kernel are named in the title
    (:func:`flyexplore.ui.notebooks.xray_figure`). Where the X-ray cannot run here (no torch
    2.15, flydsl 0.3 or LLD >= 19) a :class:`flyexplore.ui.notebooks.Note` naming every failed
    check and its fix instead, so a notebook needs no ``try``. ``out``: a folder for each
    case's ISA and ``xray.json``, and ``xray.csv`` with every row. Raises
    :class:`~flyexplore.errors.UsageError` for a bad operator, shape or dtype."""

    labels = xray_shapes(op, shapes if isinstance(shapes, str) else ";".join(shapes))
    if dtype not in xray_dtypes()[op]:
        raise bad_choice(f"dtype for the {op} X-ray", dtype, xray_dtypes()[op])
    return _nb.xray_figure(op, tuple(labels), dtype, out)


def _kernel_tables() -> dict[str, Any]:
    return {n: get_op(n).flydsl.kernel_table for n in list_ops()
            if get_op(n).flydsl is not None and get_op(n).flydsl.kernel_table is not None}


def kernels(op: str, **kw):
    """Which FlyDSL kernel covers which calls of ``op``, as a DataFrame, from the family's
    ``FlyDSLPath.kernel_table``: ``topk`` -- its kernel families on gfx950 and the (K, N) band
    each covers (``kernel, k, n``; rule from ``torch/_native/ops/topk/flydsl_impl.py``
    ``_kernel_for``); ``attention`` -- the head dims AOTriton builds FlyDSL ("flyc") kernels
    for, per pass (``head_dim, pass, rung, flyc, reason``; keywords ``arch``, ``dtype``,
    ``head_dims``, ``version``: :func:`flyexplore.ops.attention.aotriton.flyc_table`). Raises
    :class:`~flyexplore.errors.UsageError` for an operator without such a table or a bad
    keyword value."""

    tables = _kernel_tables()
    if op not in tables:
        raise bad_choice("operator with a FlyDSL kernel table", op, tables)
    return tables[op](**kw)


def switches(text: bool = False):
    """The state of every FlyDSL switch as torch has it now, one row per operator: the torch
    mechanism (python_native eager overrides, Inductor's ``max_autotune_gemm_backends``, the
    SDPA flags), its setting, and whether it can change anything here (``effective``), as a
    DataFrame; with ``text=True`` the text ``flyexplore switches`` prints
    (:func:`flyexplore.world.switches.table` / ``text``). Change them with :func:`set_flydsl`,
    :func:`flydsl` and :func:`sdpa` (contexts), or :class:`SwitchPanel`."""

    return _switches.text() if text else _switches.table()


def mx_blocks(x, fmt: str = "mxfp8"):
    """Quantize a 2-D tensor ``x`` [rows, K] (K a multiple of 32) to ``fmt`` (``mxfp8``: FP8
    E4M3, ``mxfp4``: FP4 E2M1, each with one E8M0 scale per 32 values along K; OCP
    Microscaling v1.0) and back, one row per 32-value block: its largest magnitude, the E8M0
    scale exponent (``scale_exp``, log2 of the scale) and the block's error, as a DataFrame
    (:func:`flyexplore.ops.scaled_gemm.mx.block_table`). Raises
    :class:`~flyexplore.errors.UsageError` for another format or shape."""

    return _mx.block_table(x, fmt)


def mx_errors(x, formats=None):
    """Each format's error against the 2-D tensor ``x`` [rows, K]: FP8 with per-tensor and
    per-row fp32 scales, MXFP8 and MXFP4 (``formats`` default
    :data:`flyexplore.ops.scaled_gemm.mx.ERROR_FORMATS`), quantized, decoded and compared, with
    ``err_rel`` and ``err_rel_worst_row`` (what one per-tensor scale does to the smallest rows),
    as a DataFrame (:func:`flyexplore.ops.scaled_gemm.mx.format_errors`). Raises
    :class:`~flyexplore.errors.UsageError` for a tensor that is not 2-D or an unknown format."""

    return _mx.format_errors(x) if formats is None else _mx.format_errors(x, formats)


def aotriton_ab(a, b=None, *, names: Sequence[str] | None = None, backend: str | None = None):
    """Which AOTriton backend ran on each side of an A/B of two result files (e.g. AOTriton
    0.13b against 0.14.2b): loads ``a`` and ``b``, pairs their attention rows by case and
    returns ``(ab, view)`` -- the :class:`flyexplore.results.compare.ABResult` and one row per
    paired case with ``ran_a`` / ``ran_b`` (Triton, aiter or FlyDSL, from the recorded kernel
    names), ``flyc_b``, ``speedup`` (time A / time B) with its interval and label, and the
    published gfx950 range beside it (:func:`flyexplore.results.aotriton_ab.compare_files`).
    ``b`` None: ``a`` is one environment A/B file (two torch builds timed round by round,
    ``flyexplore sweep --op attention --env 0.13b=... --env 0.14.2b=...``), read as paired
    in-run data.
    ``names`` default to the AOTriton releases the files record; ``backend`` keeps one SDPA
    backend. Draw it with ``fx.figure("aotriton", view)``. Raises
    :class:`~flyexplore.errors.UsageError` for a missing file, a file without attention rows,
    or when no case pairs."""

    return compare_files(a, b, names, backend)


# -- views -------------------------------------------------------------------------------------
#: ``fx.figure(kind, ...)`` -> (figure function, plotly-express-like argument -> its parameter).
FIGURES: dict[str, tuple[Any, dict[str, str]]] = {
    "speedup": (plots.speedup_figure, {}),
    "sweep": (plots.sweep_figure, {"x": "x", "y": "y"}),
    "distribution": (plots.speedup_distribution_figure, {}),
    "heatmap": (plots.heatmap_figure, {"x": "x", "y": "y", "z": "value"}),
    "roofline": (plots.roofline_figure, {}),
    "error": (plots.error_figure, {"y": "metric"}),
    "range": (plots.range_figure, {}),
    "ab": (plots_compare.ab_figure, {}),
    "published": (plots_compare.published_vs_measured_figure, {"y": "metric"}),
    "vllm": (plots_compare.vllm_figure, {}),
    "aotriton": (aotriton_ab_figure, {}),
    "series": (series_figure, {}),
    "xray": (resources_figure, {"x": "x", "color": "color"}),
}
#: Figure kinds whose data are result rows (a path is loaded).
_ROW_FIGURES = ("speedup", "distribution", "sweep", "heatmap", "roofline", "error", "published", "series")


def _figure_options(kind: str) -> list[str]:
    fn, _ = FIGURES[kind]
    ps = list(inspect.signature(fn).parameters.values())[1:]
    names = [p.name for p in ps if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if any(p.kind == p.VAR_KEYWORD for p in ps):  # heatmap: the speedup grid's keywords
        names += [n for n in list(inspect.signature(plots.speedup_grid).parameters)[3:] if n not in names]
    return names


def figure(kind: str, data=None, /, *, x: str | None = None, y: str | None = None, z: str | None = None,
           color: str | None = None, title: str | None = None, **options):
    """A plotly ``Figure`` of ``kind`` from ``data``, with plotly-express-like arguments. Never
    changes the data; one colour per backend in every figure; speedup axes from zero with a
    dashed 1.0x line.

    Kinds (:data:`FIGURES`), their data and arguments:

    - ``speedup``: result rows; bars of baseline time / backend time per case with 95%
      whiskers and geometric means (``baseline``, ``backends``, ``show_values``, ``horizontal``).
    - ``distribution``: result rows; the speedups of many cases (what a report draws past
      80 cases): per (op, dtype) panel each backend's per-case speedups sorted (a rank curve of
      WebGL markers, x = share of cases in %), 95% whiskers, the label as the marker, the case
      in the hover, geometric means with intervals and label counts (``baseline``,
      ``backends``, ``cols``).
    - ``sweep``: result rows; ``y`` (``time_ms``, ``tflops``, ``gbps``) across case parameter
      ``x`` (``m``, ``n``, ``g``, ...), one line per backend (``fixed={"n": 4096}``, ``log_x``,
      ``log_y``, ``backends``, ``min_points``).
    - ``heatmap``: an eligibility grid (:func:`eligibility_grid`), any frame with columns
      ``x, y, z``, or result rows (a speedup grid: ``backend``, ``baseline``, ``dtype``);
      ``kind`` ``auto`` / ``speedup`` / ``eligibility`` / ``value``, ``hover`` (a column).
    - ``roofline``: result rows against :func:`peaks` (``device``, ``kind="measured"``).
    - ``error``: result rows; numerical error per case and format, ``y`` the metric
      (``err_rel``, ``err_rel_dequant``, ``err_max_abs``), ``log_y``.
    - ``range``: figures public only as ranges (default ``fx.published("ranges")``).
    - ``ab``: an A/B result of :func:`compare`.
    - ``published``: measured rows beside published ones (``published=`` rows, default all
      published rows; ``y`` the metric: ``speedup``, ``tflops``, ``time_ms``; ``baseline``).
    - ``vllm``: a vLLM A/B table (:func:`compare` of vllm files, or ``fx.published("vllm")``).
    - ``aotriton``: the view of :func:`aotriton_ab`.
    - ``series``: a build series, an environment A/B of three or more environments (``sweep
      --env A --env B --env C``): per case the speedup in each environment against the first,
      with 95% whiskers and the label as the marker, environments on the x axis in the run's
      order (``envs``: which, in what order, the first the reference; ``layout``: ``lines``,
      ``facets``, ``geomean`` or ``auto``). Rows that are not an A/B: one line naming the
      missing column.
    - ``xray``: X-ray rows (a list of :func:`xray` results or their frame; ``x``, ``color``).

    ``title`` sets the title (a subtitle with geometric means is kept where the kind adds one);
    ``data`` may be a result file path for the result-row kinds. The other keywords are the
    figure function's own (:mod:`flyexplore.views.plots`). Raises
    :class:`~flyexplore.errors.UsageError` for an unknown kind, an argument the kind does not
    take (one line naming it), no data, or what the figure function refuses (unknown column,
    nothing to draw)."""

    if kind not in FIGURES:
        raise bad_choice("figure kind", kind, FIGURES)
    fn, px = FIGURES[kind]
    valid = _figure_options(kind)
    kw: dict[str, Any] = {}
    for name, value in (("x", x), ("y", y), ("z", z), ("color", color)):
        if value is None:
            continue
        if name not in px:
            takes = ", ".join(f"{k}=" for k in px) or "none of x=, y=, z=, color="
            raise UsageError(f"figure {kind!r} takes no {name}= (it takes {takes})")
        if px[name] in options:
            raise UsageError(f"figure {kind!r}: {name}= and {px[name]}= name the same thing; give one")
        kw[px[name]] = value
    for name in options:
        if name not in valid or name == "title":
            raise UsageError(f"unknown option {name!r} for figure {kind!r} "
                             f"(valid: {', '.join(v for v in valid if v != 'title')}, title)")
    kw.update(options)
    if title is not None:
        kw["title"] = title
    if data is None and kind != "range":
        raise UsageError(f"figure {kind!r} needs data (fx.figure({kind!r}, rows, ...))")
    if kind in _ROW_FIGURES and isinstance(data, _PathLike):
        data = load(data)
    return fn(data, **kw)


def _is_figure(obj) -> bool:
    return hasattr(obj, "to_plotly_json") and hasattr(obj, "layout")


_EXPORT_COLUMNS = ["name", "format", "path", "status", "note"]


def _formats(formats) -> list[str]:
    return [f.strip().lstrip(".").lower() for f in (formats.split(",") if isinstance(formats, str) else formats)]


def export(obj, dest: str | os.PathLike, formats: Sequence[str] | str | None = None):
    """Write figures and tables to files and return what was written, as a DataFrame with
    ``name, format, path, status`` (``written`` or ``skipped``) and ``note`` (why a static image
    was skipped).

    ``obj``: one plotly figure or one DataFrame -- ``dest`` is the file and its extension the
    format (figures ``.png``, ``.svg``, ``.pdf``, ``.html``; tables ``.csv``, ``.md``,
    ``.tex``, ``.html``); a figure whose static image cannot be made here (no Chromium for
    kaleido, kaleido's error or timeout) is written as ``.html`` beside it instead, and the row
    says why. Or a dict name -> figure or DataFrame -- ``dest`` is a folder, each written as
    ``<name>.<format>`` in every ``formats`` entry that fits it (default figures
    ``png, svg, pdf, html``, tables ``csv, md, tex``); static images are skipped with the reason
    where no browser is found, HTML is always written (:mod:`flyexplore.views.export`: plotly.js
    embedded, opens offline; PNG at 2x 1100x560 CSS pixels; Markdown and LaTeX at 4
    significant digits, CSV at full precision). Raises :class:`~flyexplore.errors.UsageError`
    for an unknown extension or format, ``formats`` with a single object, a format that fits
    none of a dict's entries, or an entry that is neither a figure nor a DataFrame."""

    if isinstance(obj, Mapping):
        return _export_many(obj, Path(dest), formats)
    if formats is not None:
        raise UsageError("export: formats go with a dict of figures or tables; for one object the "
                         "file extension of dest names the format")
    p = Path(dest)
    fmt = p.suffix.lstrip(".").lower()
    if isinstance(obj, pd.DataFrame):
        rows = [(p.stem, fmt, str(_export.save_table(obj, p)), "written", "")]
    elif _is_figure(obj):
        written, note = _export.export_figure(obj, p)
        rows = [(p.stem, fmt, str(written), "written", "")] if note is None else \
            [(p.stem, fmt, str(p), "skipped", note), (p.stem, "html", str(written), "written", "")]
    else:
        raise UsageError(f"export takes a plotly figure, a DataFrame or a dict of them, got {type(obj).__name__}")
    return pd.DataFrame(rows, columns=_EXPORT_COLUMNS)


def _export_many(objs: Mapping[str, Any], out: Path, formats) -> pd.DataFrame:
    figs = {str(k): v for k, v in objs.items() if _is_figure(v)}
    tables = {str(k): v for k, v in objs.items() if isinstance(v, pd.DataFrame)}
    for k, v in objs.items():
        if str(k) not in figs and str(k) not in tables:
            raise UsageError(f"export: {k!r} is neither a plotly figure nor a DataFrame ({type(v).__name__})")
    if formats is None:
        fig_f, tab_f = list(_export.FIGURE_FORMATS), ["csv", "md", "tex"]
    else:
        fs = _formats(formats)
        for f in fs:
            if f not in _export.FIGURE_FORMATS and f not in _export.TABLE_FORMATS:
                raise bad_choice("export format", f, sorted({*_export.FIGURE_FORMATS, *_export.TABLE_FORMATS}))
        fig_f = [f for f in fs if f in _export.FIGURE_FORMATS]
        tab_f = [f for f in fs if f in _export.TABLE_FORMATS]
        for what, items, got, valid in (("figure", figs, fig_f, _export.FIGURE_FORMATS),
                                        ("table", tables, tab_f, _export.TABLE_FORMATS)):
            if items and not got:
                raise UsageError(f"export: no {what} format in {fs} (valid: {', '.join(valid)})")
    parts = []
    if figs:
        parts.append(_export.export_figures(figs, out, fig_f).rename(columns={"figure": "name"}))
    if tables:
        paths = _export.save_tables(tables, out, tab_f)
        names = [n for n in tables for _ in tab_f]
        parts.append(pd.DataFrame({"name": names, "format": [p.suffix.lstrip(".") for p in paths],
                                   "path": [str(p) for p in paths], "status": "written", "note": ""},
                                  columns=_EXPORT_COLUMNS))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=_EXPORT_COLUMNS)


def files(folder: str | os.PathLike):
    """Every file under ``folder`` (recursively, sorted) with its size: a DataFrame with
    ``path`` (relative to ``folder``) and ``bytes``; empty when the folder does not exist
    (:func:`flyexplore.views.export.files_table`). For showing what a sweep, an export or a
    report wrote."""

    return _export.files_table(folder)


def summary(df):
    """The result rows as a report's result table shows them (a DataFrame): key, status, the
    speedup against the case's baseline as ``est [lo, hi] vs baseline`` with its verdict, time
    in µs (``time_us``, its 95% interval ``time_ci_us``, ``per_call_us``), rounds and
    convergence, TFLOP/s, GB/s, error, flags, clock, source, device and message
    (:func:`flyexplore.views.report.summary_table`). ``df``: result rows or result file paths."""

    return summary_table(_rows(df, "summary"))


def report(data, out: str | os.PathLike, **kw) -> Path:
    """Write a self-contained HTML report of result rows ``data`` (a DataFrame, a result file
    path, or a list of paths, concatenated) to folder ``out`` and return the path of its
    ``report.html``: the environment, per operator and device a speedup figure against
    ``baseline`` (default ``aten``; several: the faster of them) with geometric means and a
    sweep figure, a roofline and % of peak per device with known peaks, the published
    comparison with ``published=True``, the result table; figures as PNG/SVG/PDF under
    ``figures/`` when ``static`` (and a browser is found; ``formats``), tables under
    ``tables/``. Keywords of :func:`flyexplore.views.report.write_report` (``title``,
    ``baseline``, ``static``, ``formats``, ``table_formats``, ``published``, ``peak_kind``,
    ``env``). An A/B report: :func:`compare` with ``out``. Raises
    :class:`~flyexplore.errors.UsageError` for data that are not result rows or paths, a
    missing file, data without a single result row (a header-only CSV: as ``flyexplore report``),
    or an ``out`` that is neither new, empty nor an earlier report."""

    rows = _rows(data, "report")
    if isinstance(data, pd.DataFrame) and not len(rows):
        raise UsageError("the DataFrame given to fx.report holds no result rows: nothing to report")
    refuse_no_rows(rows, [data] if isinstance(data, (str, os.PathLike)) else data)   # as the command line
    return write_report(rows, out, **kw)
