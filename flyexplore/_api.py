"""The public face's functions (``import flyexplore as fx``; :data:`flyexplore.__all__`): each is a
thin door into the layer that does the work, so README, docs and notebooks need no submodule.

This module sits at the top, beside the CLI: it may import any layer. ``import flyexplore`` stays
light (no torch, pandas or plotly) because the root package imports this module only on first
use of one of its names; torch itself is imported inside the layers' functions.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.explain import explain_text
from flyexplore.insight.trace import trace_case
from flyexplore.insight.xray import xray as _xray
from flyexplore.results import table as R
from flyexplore.results.table import geomean_speedup
from flyexplore.results.table import load as _load
from flyexplore.results.table import speedup as _speedup
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import run_sweep
from flyexplore.views import plots
from flyexplore.views.report import write_report


#: Keywords of :func:`sweep` that watch the run (:func:`flyexplore.run.sweep.run_sweep`'s), not
#: part of the :class:`~flyexplore.run.spec.SweepSpec`.
RUN_KEYWORDS = ("progress", "on_row", "should_stop")
#: Keywords of :func:`sweep` that are the spec's fields.
SPEC_KEYWORDS = tuple(f.name for f in dataclasses.fields(SweepSpec) if f.init)


def sweep(op, *, shapes=None, suite: str | None = None, dtypes=None, backends=None,
          out: str | os.PathLike | None = None, **options):
    """Measure ``op`` (a catalogue name, :func:`flyexplore.list_ops`) over a suite or shapes and
    return the result rows (a pandas DataFrame, one row per case x dtype x backend; times in ms).

    ``shapes``: catalogue shape text (``"8192x4096;2048x16384:eps=1e-5"``) or a list of them;
    ``suite``: a named suite (``flyexplore suites``); ``dtypes`` / ``backends``: lists or comma
    text (default: the operator's). ``out``: also write ``.parquet`` / ``.csv`` / ``.jsonl``.
    Other options are the fields of :class:`flyexplore.run.spec.SweepSpec` (``timer``, ``order``,
    ``band``, ``baseline``, ``resume``, ``devices``, ...), which is built from them, and
    :func:`flyexplore.run.sweep.run_sweep`'s ``progress``, ``on_row``, ``should_stop``. ``op`` may
    also be a SweepSpec, run as it is (then only those three keywords). The frame's
    ``attrs["sweeps"]`` holds the spec. Raises :class:`~flyexplore.errors.UsageError` with one
    line naming a bad value (an unknown keyword included) before anything runs.
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


def explain(op: str, shape: str, dtype: str | None = None, options: str | Mapping[str, Any] | None = None,
            **kw):
    """Would ``op`` on ``shape`` (catalogue shape text) in ``dtype`` take FlyDSL? Returns an
    :class:`~flyexplore.world.conditions.Explanation` (``taken``, ``reason``, every condition
    with its source in torch 2.15) for ``arch`` (default gfx950; ``arch=None``: this machine).
    Keywords as :func:`flyexplore.insight.explain.explain_text` (``arch``, ``cu``,
    ``compile_options``, family options such as ``aotriton=``). Raises
    :class:`~flyexplore.errors.UsageError` for an unknown operator, shape or dtype."""

    return explain_text(op, shape, dtype, options, **kw)


def trace(op: str, shape: str, backend: str, dtype: str | None = None, **kw) -> dict:
    """Run one catalogue case on ``backend`` under the profiler and say what really ran: a dict
    with ``status``, the classified kernels (``observed``), autotune decisions and, for FlyDSL
    requests, ``flydsl_taken`` / ``flydsl_reason`` (:func:`flyexplore.insight.trace.trace_case`;
    keywords ``device``, ``reps``, ``seed``)."""

    return trace_case(op, shape, backend, dtype, **kw)


def xray(op: str, shape: str, dtype: str = "bf16", arch: str = "gfx950", **kw):
    """Compile-only X-ray of the FlyDSL kernel torch 2.15 would build for ``op`` on ``shape``:
    registers, LDS, occupancy on ``arch`` (:func:`flyexplore.insight.xray.xray`; needs flydsl
    and ``lld-22``). Raises :class:`~flyexplore.insight.xray.XRayUnavailable` when it cannot
    run here, with the reason."""

    return _xray(op, shape, dtype, arch, **kw)


def load(path: str | os.PathLike):
    """Read a result file (``.parquet``, ``.csv``, ``.jsonl``) into the result schema
    (:func:`flyexplore.results.table.load`); :class:`~flyexplore.errors.UsageError` for a
    missing file or an unknown format."""

    return _load(path)


def speedup(df, baseline: str | Sequence[str] = "aten", **kw):
    """Per case and backend: baseline time / backend time with its 95% interval and label
    (FASTER / SAME / SLOWER / AMBIGUOUS); ``baseline`` one backend or several (the faster of
    them per case). See :func:`flyexplore.results.table.speedup`."""

    return _speedup(df, baseline, **kw)


def geomean(df, baseline: str | Sequence[str] = "aten", **kw):
    """Geometric-mean speedup per (op, dtype, backend) with its 95% interval, label and label
    counts (:func:`flyexplore.results.table.geomean_speedup`)."""

    return geomean_speedup(df, baseline, **kw)


#: ``fx.figure(kind, ...)`` -> the figure function of :mod:`flyexplore.views.plots`.
FIGURES = {
    "speedup": "speedup_figure", "sweep": "sweep_figure", "heatmap": "heatmap_figure",
    "roofline": "roofline_figure", "ab": "ab_figure", "published": "published_vs_measured_figure",
    "vllm": "vllm_figure", "error": "error_figure", "range": "range_figure",
}


def figure(kind: str, *args, **kw):
    """A plotly figure of ``kind`` (:data:`FIGURES`: ``speedup``, ``sweep``, ``heatmap``,
    ``roofline``, ``ab``, ``published``, ``vllm``, ``error``, ``range``) from result rows; the
    arguments are the figure function's (:mod:`flyexplore.views.plots`). Never changes the data.
    Raises :class:`~flyexplore.errors.UsageError` for an unknown kind."""

    if kind not in FIGURES:
        raise bad_choice("figure", kind, list(FIGURES))
    return getattr(plots, FIGURES[kind])(*args, **kw)


def report(data, out: str | os.PathLike, **kw):
    """Write a self-contained HTML report (``report.html`` with figures and tables) of result
    rows ``data`` (a DataFrame, or result file paths) to folder ``out`` and return its path
    (:func:`flyexplore.views.report.write_report`; keywords ``baseline``, ``static``,
    ``published``, ...)."""
    import pandas as pd


    if not isinstance(data, pd.DataFrame):
        paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
        data = R.concat([R.load(p) for p in paths])
    return write_report(data, out, **kw)
