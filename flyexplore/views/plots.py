"""Figures: functions that take result sets (tidy DataFrames, :mod:`flyexplore.results.table`) and
return plotly figures. Rendering never changes the data: every function works on a copy and
plots the numbers it is given (speedups via :func:`flyexplore.results.table.speedup`).

Colours are fixed per backend in every figure (:data:`flyexplore.views.plot_style.BACKEND_COLORS`;
the common look is :mod:`flyexplore.views.plot_style`).
Speedup axes start at zero and carry a dashed 1.0x line; ratios within +-1%
(:data:`flyexplore.results.table.TIE_BAND`) are ties and are outlined.

Figures of one result set: :func:`speedup_figure`, :func:`sweep_figure`, :func:`heatmap_figure`
(with :func:`speedup_grid`), :func:`roofline_figure`, :func:`error_figure`, :func:`range_figure`.
Figures that compare two sets (A/B, published against measured, vLLM) are
:mod:`flyexplore.views.plots_compare`; ``fx.figure(kind, ...)`` reaches every one. Export:
:mod:`flyexplore.views.export`.
"""
from __future__ import annotations

import json
import math
from typing import Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure import stats as S
from flyexplore.results import peaks as P
from flyexplore.results import table as R
from flyexplore.results.published import ranges as _r
from flyexplore.views.plot_style import (
    BAR_MAX_CASES,
    CURVE_MAX_POINTS,
    HEIGHT,
    LABEL_SYMBOLS,
    NO_INTERVALS,
    SERIES_COLORS,
    backend_color,
    baseline_name,
    case_labels,
    data_title,
    dtype_shade,
    has_intervals,
    horizontal_bars,
    rank_curve,
    ref_line,
    scatter_class,
    style_figure,
    whiskers,
    wrap_text,
)

# -- speedup ---------------------------------------------------------------------------------
#: Up to this many (backend, op, dtype) series, their geometric means are also in the subtitle.
_SUBTITLE_MEANS = 4


def speedup_figure(df: pd.DataFrame, baseline: str | Sequence[str] = "aten", title: str | None = None,
                   backends: Sequence[str] | None = None, show_values: bool | None = None,
                   horizontal: bool | None = None):
    """Bars of speedup per case (baseline time / backend time) for each non-baseline backend.

    ``baseline`` is one backend or several (then the faster of them per case, e.g.
    ``["aten", "triton"]`` as in the published dense suite). Shows a dashed 1.0x line, the
    geometric mean per backend (legend -- shown even for a single backend --, subtitle for up to
    four series, and a dotted line when there is one op and dtype), each bar's 95% interval as a
    whisker and its label (:func:`flyexplore.measure.stats.verdict`: SAME outlined in black, the mark of
    :data:`flyexplore.measure.stats.MARKS` after the value), the y axis from zero, and per-bar values when there are
    at most 40 bars (``show_values``). With more than 30 cases or long case labels
    (``horizontal=None``) the bars run horizontally, one row per case, so every label stays
    readable. Hover: times in
    µs, which baseline won, source. ``backends`` limits the backends drawn. Raises
    ``UsageError`` when the baseline has no rows or no backend remains."""
    import plotly.graph_objects as go

    s = R.speedup(df, baseline)
    if backends is not None:
        s = s[s["backend"].isin(list(backends))]
    if s.empty:
        raise UsageError(f"no case has both {baseline_name(baseline)} and another backend")
    s = s.assign(x=case_labels(s))
    groups = list(s.groupby(["op", "dtype", "backend"], sort=False))
    single = s[["op", "dtype"]].drop_duplicates().shape[0] == 1
    if show_values is None:
        show_values = len(s) <= 40
    ncase = s["x"].nunique()
    if horizontal is None:
        horizontal = horizontal_bars(s["x"])
    fig = go.Figure()
    means = []
    for (op, dtype, backend), g in groups:
        gm, glo, ghi = S.geomean_ci(g["speedup"], g["speedup_lo"], g["speedup_hi"])
        gtxt = S.fmt_interval(gm, glo, ghi).replace(" [no interval]", "")
        labels = g["verdict"].astype(object).where(g["verdict"].notna(), "")
        same = (labels == "SAME").to_numpy()
        counts = ", ".join(f"{int((labels == k).sum())} {k}" for k in S.LABELS if (labels == k).any())
        name = f"{backend}: geomean {gtxt}" if single else f"{backend} {op} {dtype}: geomean {gtxt}"
        means.append(name.replace(": geomean", " geomean"))
        dts = list(pd.unique(s.loc[s["backend"] == backend, "dtype"]))
        c = dtype_shade(backend_color(backend), dts.index(dtype))
        err = whiskers(g)
        xy = (dict(x=g["speedup"], y=g["x"], orientation="h", error_x=err) if horizontal
              else dict(x=g["x"], y=g["speedup"], error_y=err))
        fig.add_bar(
            **xy, name=name, legendgroup=backend, marker_color=c,
            marker_pattern_shape=("", "/", "x", ".")[dts.index(dtype) % 4],
            marker_line_width=[2.5 if t else 0 for t in same], marker_line_color="black",
            text=[f"{v:.2f}{S.MARKS.get(lab, '')}" for v, lab in zip(g["speedup"], labels)] if show_values else None,
            textposition="outside", textfont=dict(size=10), cliponaxis=False,
            customdata=list(zip(g["time_ms"] * 1e3, g["baseline_ms"] * 1e3, g["baseline"], g["source"],
                                labels, g["speedup_lo"].fillna(float("nan")), g["speedup_hi"].fillna(float("nan")))),
            hovertemplate=(f"<b>{backend}</b> %{{{'y' if horizontal else 'x'}}}<br>speedup "
                           f"%{{{'x' if horizontal else 'y'}:.3f}}x [%{{customdata[5]:.3f}}, %{{customdata[6]:.3f}}] "
                           "%{customdata[4]}<br>"
                           "time %{customdata[0]:.2f} µs<br>baseline %{customdata[2]} %{customdata[1]:.2f} µs"
                           "<br>source %{customdata[3]}<extra></extra>"),
        )
        if counts:
            fig.data[-1].name += f" ({counts})"
        if single:
            ref_line(fig, gm, c, "dot", f"{backend} geomean (dotted)", horizontal)
    ref_line(fig, 1.0, "#555", "dash", "1.0x (baseline)", horizontal)
    base = baseline_name(baseline)
    ttl = title or data_title(df, f"speedup vs {base}")
    # the geometric means also in the subtitle: visible wherever the legend is hidden or cut
    gms = "; ".join(means) if len(means) <= _SUBTITLE_MEANS else f"geomeans of {len(means)} series in the legend"
    ci = ("whiskers: 95% interval; outlined: SAME (interval within ±1%); after the value: + FASTER, = SAME, "
          "− SLOWER, ? AMBIGUOUS") if has_intervals(s) else NO_INTERVALS
    ttl += f"<br><sup>baseline time / backend time per case; higher is better; {ci}<br>{gms}</sup>"
    vlab = f"speedup vs {base} (x)"
    style_figure(fig, ttl, vlab if horizontal else "case", "case" if horizontal else vlab, legend_title="backend",
           height=max(HEIGHT, 200 + 18 * ncase * s["backend"].nunique()) if horizontal else HEIGHT)
    # showlegend: plotly hides a legend with a single entry by default, which would hide the
    # geometric mean of a lone backend
    fig.update_layout(barmode="group", bargap=0.25, showlegend=True, margin=dict(t=110))
    if horizontal:
        fig.update_xaxes(rangemode="tozero")
        fig.update_yaxes(type="category", autorange="reversed", dtick=1)
    else:
        fig.update_yaxes(rangemode="tozero")
        fig.update_xaxes(type="category")
    return fig


def speedup_overview_figure(df: pd.DataFrame, baseline: str | Sequence[str] = "aten", title: str | None = None):
    """The speedup figure that stays readable at any number of cases: :func:`speedup_figure`
    (a bar per case) up to :data:`flyexplore.views.plot_style.BAR_MAX_CASES` cases, past that
    :func:`speedup_distribution_figure` (rank curves; its title gets the case count). What the
    report and ``flyexplore export --figure speedup`` draw. Raises ``UsageError`` as those do."""
    ncase = len(R.speedup(df, baseline).drop_duplicates(subset=["op", "case", "dtype"]))
    if ncase > BAR_MAX_CASES:  # a bar per case is unreadable (and slow) past this
        base = baseline_name(baseline)
        return speedup_distribution_figure(df, baseline,
                                           title=f"{title or data_title(df, f'speedup vs {base}')}, {ncase:,} cases")
    return speedup_figure(df, baseline, title=title)


def speedup_distribution_figure(df: pd.DataFrame, baseline: str | Sequence[str] = "aten",
                                title: str | None = None, backends: Sequence[str] | None = None,
                                cols: int = 2):
    """The speedups of many cases at once: one panel per (op, dtype), in each every
    non-baseline backend's per-case speedups (baseline time / backend time, a ratio, x)
    sorted ascending against their share of the cases (a rank curve, x in %: the speedup at
    50% is the median case), drawn with WebGL (``Scattergl``) so tens of thousands of cases
    stay fluid.

    Each case's 95% interval is a whisker (a shaded band past
    :data:`~flyexplore.views.plot_style.BAND_POINTS` cases) and its label
    (:func:`flyexplore.measure.stats.verdict`) the marker (:data:`LABEL_SYMBOLS`); the hover names the case and gives its speedup with
    the interval and label. A dashed 1.0x line; per backend a dotted line at the geometric
    mean with its 95% interval shaded, its legend entry naming the geometric mean with its
    interval and the label counts -- the numbers of
    :func:`flyexplore.results.table.geomean_speedup`, also in that line's ``meta``. The y axis
    starts at zero. ``baseline``: one backend or several (the faster of them per case);
    ``backends`` limits the backends drawn; ``cols``: panels per row. What the report draws
    instead of :func:`speedup_figure` past :data:`BAR_MAX_CASES` cases. Raises ``UsageError``
    when the baseline has no rows or no backend remains."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d = df[[c for c in dict.fromkeys(("op", "case", "dtype", *R.SPEEDUP_INPUTS)) if c in df]]
    s = R.speedup(d, baseline)
    if backends is not None:
        s = s[s["backend"].isin(list(backends))]
    if s.empty:
        raise UsageError(f"no case has both {baseline_name(baseline)} and another backend")
    gms = R.geomean_speedup(d, baseline).set_index(["op", "dtype", "backend"])
    facets = list(s[["op", "dtype"]].drop_duplicates().itertuples(index=False, name=None))
    ncol = max(1, min(cols, len(facets)))
    nrow = math.ceil(len(facets) / ncol)
    by_facet = s.groupby(["op", "dtype"], sort=False)
    titles = []
    for op, dtype in facets:
        f = by_facet.get_group((op, dtype))
        nc, nb = f["case"].nunique(), f["backend"].nunique()
        thin = f.groupby("backend", sort=False).size().max() > CURVE_MAX_POINTS
        titles.append(f"{op} {dtype}: {nc:,} cases" + (f" x {nb} backends" if nb > 1 else "")
                      + (f" (curves through {CURVE_MAX_POINTS:,}, evenly by rank)" if thin else ""))
    fig = make_subplots(rows=nrow, cols=ncol, subplot_titles=titles, horizontal_spacing=0.07,
                        vertical_spacing=min(0.12, 0.3 / max(nrow - 1, 1)) if nrow > 1 else 0.1)
    base = baseline_name(baseline)
    ttl = (title or data_title(df, f"speedup vs {base}")) + (
        "<br><sup>each backend's per-case speedups sorted (x: share of cases); "
        + ("whiskers or shaded band: 95% interval; marker: the case's label" if has_intervals(s) else NO_INTERVALS)
        + "; hover for the case</sup>")
    style_figure(fig, ttl, "", "", legend_title="", height=max(HEIGHT, 200 + 380 * nrow))
    single = len(facets) == 1
    seen_labels: set[str] = set()
    nleg = 0
    for i, (op, dtype) in enumerate(facets):
        r, c = divmod(i, ncol)
        f = by_facet.get_group((op, dtype))
        for backend, g in f.groupby("backend", sort=False):
            key = (op, dtype, backend)
            gm = gms.loc[key] if key in gms.index else None
            est, lo, hi = ((float(gm["geomean"]), float(gm["geomean_lo"]), float(gm["geomean_hi"])) if gm is not None
                           else (math.nan, math.nan, math.nan))
            counts = ", ".join(f"{int(gm[k])} {k}" for k in S.LABELS if gm is not None and int(gm[k]))
            gtxt = S.fmt_interval(est, lo, hi).replace(" [no interval]", "")
            name = f"{backend}: geomean {gtxt}" if single else f"{backend} {op} {dtype}: geomean {gtxt}"
            if counts:
                name += f" ({counts})"
            color = backend_color(backend)
            n = rank_curve(fig, g, "speedup", "speedup_lo", "speedup_hi", g["case"].astype(object).map(str), color,
                           backend, "speedup %{y:.3f}x [%{customdata[0]:.3f}, %{customdata[1]:.3f}]",
                           row=r + 1, col=c + 1)
            seen_labels |= set(g["verdict"].dropna().astype(str)) | ({""} if g["verdict"].isna().any() else set())
            if math.isfinite(lo) and math.isfinite(hi):
                fig.add_trace(go.Scatter(x=[0, 100, 100, 0, 0], y=[lo, lo, hi, hi, lo], mode="lines",
                                         fill="toself", fillcolor=color, opacity=0.15, line=dict(width=0),
                                         legendgroup=backend, showlegend=False, hoverinfo="skip"),
                              row=r + 1, col=c + 1)
            # the geometric mean: a dotted line whose legend entry names it
            fig.add_trace(go.Scatter(
                x=[0, 100], y=[est, est], mode="lines", name=name, legendgroup=backend, showlegend=True,
                line=dict(color=color, dash="dot", width=2),
                meta={"geomean": est, "geomean_lo": lo, "geomean_hi": hi, "op": op, "dtype": dtype,
                      "backend": backend, "cases": n},
                hovertemplate=f"{backend} {op} {dtype} geomean {gtxt}<extra></extra>"), row=r + 1, col=c + 1)
            nleg += 1
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", line_width=1.5, row=r + 1, col=c + 1)
        fig.update_yaxes(rangemode="tozero", row=r + 1, col=c + 1,
                         title_text=f"speedup vs {base} (x)" if c == 0 else "")
        fig.update_xaxes(range=[0, 100], row=r + 1, col=c + 1,
                         title_text="share of cases (%), sorted by speedup" if i + ncol >= len(facets) else "")
    fig.add_scatter(x=[None], y=[None], mode="lines", name="1.0x (baseline)",
                    line=dict(color="#555", dash="dash", width=1.5), hoverinfo="skip")
    seen_labels = [k for k in LABEL_SYMBOLS if k in seen_labels]
    for lab in seen_labels:   # what each marker means
        fig.add_scatter(x=[None], y=[None], mode="markers", name=lab or "no label", legendgroup="labels",
                        marker=dict(color="#777", size=8, symbol=LABEL_SYMBOLS[lab]), hoverinfo="skip")
    # the legend (geometric means: long names) below the panels, so they keep the width
    fig.update_layout(showlegend=True, margin=dict(t=110, b=70 + 22 * (nleg + 1 + len(seen_labels))),
                      legend=dict(orientation="v", yref="container", y=0.005, yanchor="bottom", x=0, xanchor="left"))
    return fig


# -- sweeps ----------------------------------------------------------------------------------
_Y = {"time_ms": "time", "tflops": "TFLOP/s", "gbps": "GB/s"}


def case_params(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """A copy of the result set ``df`` with each case parameter (``m``, ``n``, ``k``, ``layout``,
    ...: the keys of the rows' ``params`` JSON, :mod:`flyexplore.results.table`) as a column, filled
    from ``params`` where ``df`` has no such column or it is all missing; and the list of those
    parameter names (empty without a ``params`` column). ``df`` is not changed."""
    if "params" in df:
        # each distinct params text parsed once (the rows of one case, in every backend and
        # run, share it), then spread over the rows
        codes, uniq = pd.factorize(df["params"].astype(object), use_na_sentinel=True)
        missing = [{}] if (codes < 0).any() else []
        parsed = pd.DataFrame([json.loads(v) if isinstance(v, str) and v else {} for v in uniq] + missing)
        p = parsed.take(np.where(codes < 0, len(uniq), codes)).set_axis(df.index)
    else:
        p = pd.DataFrame(index=df.index)
    out = df.copy()
    for c in p.columns:
        if c not in out or out[c].isna().all():
            out[c] = p[c]
    return out, list(p.columns)


def _num(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _nums(s: pd.Series) -> pd.Series:
    """:func:`_num` of every value of ``s``, each distinct value converted once."""
    codes, uniq = pd.factorize(s, use_na_sentinel=True)
    txt = np.asarray([_num(v) for v in uniq] + [_num(float("nan"))], dtype=object)
    return pd.Series(txt[np.where(codes < 0, len(uniq), codes)], index=s.index)


def sweep_figure(df: pd.DataFrame, x: str = "m", y: str = "time_ms", title: str | None = None,
                 log_x: bool = True, log_y: bool = False, backends: Sequence[str] | None = None,
                 fixed: dict | None = None, min_points: int = 2):
    """Time, TFLOP/s or GB/s (``y``: ``time_ms`` | ``tflops`` | ``gbps``) across one swept case
    parameter ``x`` (``m``, ``n``, ``k``, ...), one line per backend (colour) and per setting of
    the other parameters that vary (dash and marker). Times are drawn in µs when all are below
    1 ms. Several rows of one point (runs) are reduced to their median. ``fixed`` keeps only
    cases with those parameter values (e.g. ``{"n": 4096, "k": 4096}``); series with fewer than
    ``min_points`` points are left out (counted in the subtitle), so a suite that is not a grid
    still gives readable lines. Raises ``UsageError`` for an unknown ``y``, ``x`` or ``fixed``
    parameter, or when nothing is left to draw."""
    import plotly.graph_objects as go

    if y not in _Y:
        raise bad_choice("sweep y", y, _Y)
    d = df[df["status"].isin(["ok", "published"]) & df[y].notna()]
    if backends is not None:
        d = d[d["backend"].isin(list(backends))]
    if d.empty:
        raise UsageError(f"no rows with {y} to plot")
    d, pcols = case_params(d)
    if x not in d or d[x].isna().all():
        raise bad_choice("sweep dimension", x, [c for c in pcols if c != "layout"] or ["m", "n", "k"])
    d = d[d[x].notna()]
    for c, v in (fixed or {}).items():
        if c not in d:
            raise bad_choice("sweep fixed parameter", c, pcols)
        d = d[_nums(d[c]) == _num(v)]
    other = [c for c in pcols if c != x and _nums(d[c]).nunique() > 1]
    unit, scale = _Y[y], 1.0
    if y == "time_ms":
        unit, scale = ("time (µs)", 1e3) if d[y].max() < 1.0 else ("time (ms)", 1.0)
    fig = go.Figure()
    trace = scatter_class(int(d.groupby(["op", "dtype", "backend", *other, x], sort=False, dropna=False).ngroups))
    dashes = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
    symbols = ("circle", "square", "diamond", "triangle-up", "x", "star")
    series, dropped, drawn = {}, 0, 0
    for keys, g in d.groupby(["op", "dtype", "backend", *other], sort=False, dropna=False):
        op, dtype, backend, *rest = keys
        tag = ", ".join(f"{c}={_num(v)}" for c, v in zip(other, rest))
        pts = g.groupby(x)[y].median().sort_index()
        if len(pts) < min_points:
            dropped += len(pts)
            continue
        drawn += len(pts)
        idx = series.setdefault((op, dtype, tag), len(series))
        name = " ".join(p for p in (backend, op if d["op"].nunique() > 1 else "",
                                    dtype if d["dtype"].nunique() > 1 else "", tag) if p)
        fig.add_trace(trace(x=pts.index.astype(float), y=pts.values.astype(float) * scale, mode="lines+markers",
                            name=name, legendgroup=backend, line=dict(color=backend_color(backend),
                                                                      dash=dashes[idx % len(dashes)], width=2),
                            marker=dict(symbol=symbols[idx % len(symbols)], size=8),
                            hovertemplate=f"<b>{name}</b><br>{x}=%{{x}}<br>{unit} %{{y:.4g}}<extra></extra>"))
    if not fig.data:
        raise UsageError(f"no series with {min_points} or more values of {x} to draw")
    xs = sorted(float(v) for v in d[x].unique())
    ttl = title or data_title(d, f"{unit.split(' (')[0]} across {x}")
    sub = [f"{c}={_num(v)}" for c, v in (fixed or {}).items()]
    if dropped:
        sub.append(f"{dropped} point(s) of series with fewer than {min_points} values not drawn")
    if sub:
        ttl += "<br><sup>" + "; ".join(sub) + "</sup>"
    style_figure(fig, ttl, x, unit, legend_title="backend")
    if log_x and min(xs) > 0:
        ticks = []  # every value, except ones too close (on the log axis) to the previous tick
        for v in xs:
            if not ticks or math.log10(v / ticks[-1]) >= 0.06 * max(1.0, math.log10(xs[-1] / xs[0])):
                ticks.append(v)
        fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{v:g}" for v in ticks])
    if log_y:
        fig.update_yaxes(type="log")
    else:
        fig.update_yaxes(rangemode="tozero")
    if len(fig.data) > 18:  # room for the legend, one row per line
        fig.update_layout(height=150 + 24 * len(fig.data))
    # points drawn / left out and lines, for callers choosing a dimension (not plotted data)
    fig._flyexplore_points = (drawn, dropped, len(fig.data))
    return fig


# -- heatmaps --------------------------------------------------------------------------------
def speedup_grid(df: pd.DataFrame, x: str = "n", y: str = "m", backend: str = "flydsl",
                 baseline: str | Sequence[str] = "aten", dtype: str | None = None) -> pd.DataFrame:
    """Speedup of ``backend`` over ``baseline`` per (x, y) case parameter pair, as a DataFrame
    with columns ``y, x, value`` ready for :func:`heatmap_figure`. ``dtype`` picks one dtype
    (required when the set has several). Raises ``UsageError`` otherwise or when nothing is
    left."""
    d = df if dtype is None else df[df["dtype"] == dtype]
    dts = sorted(d["dtype"].dropna().unique())
    if len(dts) > 1:
        raise UsageError(f"several dtypes ({', '.join(dts)}): pick one with dtype=")
    s = R.speedup(d, baseline)
    s = s[s["backend"] == backend]
    if s.empty:
        raise UsageError(f"no speedup of {backend} over {baseline_name(baseline)} in this set")
    key = d.drop_duplicates(subset=["op", "case", "dtype"])
    key, _ = case_params(key)
    for c in (x, y):
        if c not in key:
            raise UsageError(f"case parameter {c!r} not in this set")
    s = s.merge(key[["op", "case", "dtype", x, y]], on=["op", "case", "dtype"])
    return s.groupby([y, x])["speedup"].median().rename("value").reset_index()


def heatmap_figure(data: pd.DataFrame, x: str = "n", y: str = "m", value: str = "value",
                   title: str | None = None, kind: str = "auto", hover: str | None = None,
                   **grid_kw):
    """A heatmap of ``value`` over two case parameters (``x`` columns, ``y`` rows; numeric
    labels sorted, smallest M at the bottom).

    ``data``: a DataFrame with columns ``x, y, value`` (for example FlyDSL eligibility from the
    explainer: ``m, n, value`` with bool / 0-1 values and an optional ``reason`` column shown on
    hover), or a result set (it has ``backend`` and ``time_ms``), which is turned into a speedup
    grid by :func:`speedup_grid` (``grid_kw``: ``backend``, ``baseline``, ``dtype``).
    ``kind``: ``speedup`` (diverging colours centred on 1.0x, cell text "1.23x"),
    ``eligibility`` (two colours: taken / not taken), ``value`` (sequential), or ``auto``
    (bool values -> eligibility; a result set -> speedup; else value). ``hover``: a column
    added to the hover text (default ``reason`` when present). Missing cells stay blank."""
    import plotly.graph_objects as go

    if "backend" in data and "time_ms" in data:
        data = speedup_grid(data, x=x, y=y, **grid_kw)
        kind = "speedup" if kind == "auto" else kind
    for c in (x, y, value):
        if c not in data:
            raise UsageError(f"heatmap data has no column {c!r} (columns: {', '.join(map(str, data.columns))})")
    if kind == "auto":
        vals = data[value].dropna()
        kind = "eligibility" if vals.map(lambda v: isinstance(v, bool) or str(v) in ("True", "False")).all() \
            else "value"
    if kind not in ("speedup", "eligibility", "value"):
        raise bad_choice("heatmap kind", kind, ("auto", "speedup", "eligibility", "value"))
    d = data.copy()
    hover = hover or ("reason" if "reason" in d else None)

    def order(col):
        u = d[col].dropna().unique()
        try:
            return sorted(u, key=float)
        except (TypeError, ValueError):
            return sorted(u, key=str)

    xs, ys = order(x), order(y)
    grid = d.pivot_table(index=y, columns=x, values=value, aggfunc="first").reindex(index=ys, columns=xs)
    hv = (d.pivot_table(index=y, columns=x, values=hover, aggfunc="first").reindex(index=ys, columns=xs)
          if hover else None)
    z = grid.to_numpy(dtype=object)
    fig = go.Figure()
    xl, yl = [f"{v:g}" if isinstance(v, float) else str(v) for v in xs], \
             [f"{v:g}" if isinstance(v, float) else str(v) for v in ys]
    custom = None if hv is None else [[wrap_text(v, 60) for v in row] for row in hv.to_numpy(dtype=object)]
    if kind == "eligibility":
        zz = [[None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA
               else float(v in (True, 1, "True", "true")) for v in row] for row in z]
        text = [["" if v is None else ("yes" if v else "no") for v in row] for row in zz]
        fig.add_heatmap(x=xl, y=yl, z=zz, zmin=0, zmax=1, text=text, texttemplate="%{text}",
                        colorscale=[[0, "#D9D9D9"], [0.5, "#D9D9D9"], [0.5, backend_color("flydsl")],
                                    [1, backend_color("flydsl")]],
                        colorbar=dict(tickvals=[0.25, 0.75], ticktext=["not taken", "taken"], title=""),
                        customdata=custom, xgap=2, ygap=2,
                        hovertemplate=f"{y}=%{{y}} {x}=%{{x}}<br>%{{text}}" +
                                      ("<br>%{customdata}" if custom else "") + "<extra></extra>")
        ttl = title or f"FlyDSL eligibility over {y} and {x}"
    else:
        zz = [[None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else float(v)
               for v in row] for row in z]
        flat = [v for row in zz for v in row if v is not None]
        if kind == "speedup":
            lo, hi = min(flat + [1.0]), max(flat + [1.0])
            span = max(abs(math.log(lo)), abs(math.log(hi)), 0.05)
            text = [["" if v is None else f"{v:.2f}x" for v in row] for row in zz]
            fig.add_heatmap(x=xl, y=yl, z=[[None if v is None else math.log(v) for v in row] for row in zz],
                            zmin=-span, zmax=span, zmid=0, colorscale="RdBu", text=text,
                            texttemplate="%{text}", xgap=2, ygap=2, customdata=custom,
                            colorbar=dict(title="speedup", tickvals=[math.log(t) for t in (0.5, 0.8, 1, 1.25, 2, 4)
                                                                      if abs(math.log(t)) <= span],
                                          ticktext=[f"{t:g}x" for t in (0.5, 0.8, 1, 1.25, 2, 4)
                                                    if abs(math.log(t)) <= span]),
                            hovertemplate=f"{y}=%{{y}} {x}=%{{x}}<br>speedup %{{text}}" +
                                          ("<br>%{customdata}" if custom else "") + "<extra></extra>")
            ttl = title or f"Speedup over {y} and {x}"
        else:
            text = [["" if v is None else f"{v:.3g}" for v in row] for row in zz]
            fig.add_heatmap(x=xl, y=yl, z=zz, colorscale="Viridis", text=text, texttemplate="%{text}",
                            xgap=2, ygap=2, customdata=custom, colorbar=dict(title=value),
                            hovertemplate=f"{y}=%{{y}} {x}=%{{x}}<br>{value} %{{z:.4g}}" +
                                          ("<br>%{customdata}" if custom else "") + "<extra></extra>")
            ttl = title or f"{value} over {y} and {x}"
    style_figure(fig, ttl, x, y)
    fig.update_xaxes(type="category", showgrid=False)
    fig.update_yaxes(type="category", showgrid=False)
    return fig


# -- roofline --------------------------------------------------------------------------------
def roofline_figure(df: pd.DataFrame, device: str | None = None, kind: str = "datasheet",
                    title: str | None = None):
    """Roofline: achieved TFLOP/s against arithmetic intensity (FLOP per ideal byte, log-log)
    for each row with a FLOP and byte count, coloured by backend, under the device's roofs
    (min(peak TFLOP/s, intensity x peak bandwidth)) for each dtype class present, from
    :mod:`flyexplore.results.peaks`. With ``kind="measured"`` measured peaks (where known) are drawn
    dashed beside the datasheet roofs. ``device`` defaults to the rows' one device. Rows
    without a FLOP count (TopK) cannot be placed and are counted in a note. Raises
    ``UsageError`` for an unknown device, several devices without ``device=``, or no
    plottable row."""
    import plotly.graph_objects as go


    d = df[df["status"].isin(["ok", "published"]) & df["time_ms"].notna()].copy()
    if device is None:
        devs = sorted(d["device"].dropna().unique())
        if len(devs) != 1:
            raise UsageError(f"roofline needs one device; this set has {', '.join(devs) or 'none'}: pass device=")
        device = devs[0]
    peak = P.find_device(device, required=True)
    fl = pd.to_numeric(d["flops"], errors="coerce")
    nb = pd.to_numeric(d["bytes"], errors="coerce")
    ok = ((fl > 0) & (nb > 0)).fillna(False).astype(bool)
    skipped = int((~ok).sum())
    d = d[ok]
    if d.empty:
        raise UsageError("no row with a FLOP and byte count to place on a roofline")
    d["ai"] = fl[ok] / nb[ok]
    d["perf"] = fl[ok] / (d["time_ms"].astype(float) / 1e3) / 1e12
    d = P.percent_of_peak(d, device=peak.name)
    fig = go.Figure()
    classes: dict[str, list[str]] = {}
    for t in sorted(d["dtype"].unique(), key=str):
        classes.setdefault(P.DTYPE_CLASS.get(str(t), str(t)), []).append(str(t))
    roofs = {"/".join(ts): peak.peak(ts[0], "datasheet") for ts in classes.values()}
    ridges = [tf / (bw / 1e3) for tf, bw in roofs.values() if not math.isnan(tf)]
    lo = min([d["ai"].min() / 3] + [r / 3 for r in ridges])
    hi = max([d["ai"].max() * 3] + [r * 3 for r in ridges])
    for cls_dtype, (tf, bw) in roofs.items():
        if math.isnan(tf):
            continue
        xs = [lo, tf / (bw / 1e3), hi]
        fig.add_scatter(x=xs, y=[min(tf, a * bw / 1e3) for a in xs], mode="lines",
                        line=dict(color="#333", width=1.5), name=f"{cls_dtype}: {tf:g} TFLOP/s, {bw / 1e3:g} TB/s",
                        legendgroup="roof", legendgrouptitle_text=f"{peak.name} datasheet roofs",
                        hovertemplate=f"{peak.name} {cls_dtype} roof<br>%{{y:.0f}} TFLOP/s<extra></extra>")
        fig.add_annotation(x=math.log10(hi), y=math.log10(tf), text=f"{cls_dtype} {tf:g}", showarrow=False,
                           xanchor="right", yanchor="bottom", font=dict(size=11, color="#333"))
        if kind == "measured" and (peak.measured_tflops or peak.measured_tbps):
            mt, mb = peak.peak(cls_dtype.split("/")[0], "measured")
            if (mt, mb) != (tf, bw):
                fig.add_scatter(x=xs, y=[min(mt, a * mb / 1e3) for a in xs], mode="lines",
                                line=dict(color="#333", width=1.5, dash="dash"), legendgroup="roofm",
                                legendgrouptitle_text="measured roofs",
                                name=f"{cls_dtype}: {mt:g} TFLOP/s, {mb / 1e3:g} TB/s",
                                hovertemplate=f"{peak.name} {cls_dtype} measured<br>%{{y:.0f}} TFLOP/s<extra></extra>")
    shapes = ("circle", "diamond", "square", "triangle-up", "star", "cross", "x", "hexagon")
    sym = {t: shapes[i % len(shapes)] for i, t in enumerate(sorted(d["dtype"].astype(str).unique()))}
    trace = scatter_class(len(d))   # WebGL markers past a few thousand rows
    for backend, g in d.groupby("backend", sort=False):
        dts = g["dtype"].astype(str)
        fig.add_trace(trace(x=g["ai"].to_numpy(dtype=float), y=g["perf"].to_numpy(dtype=float), mode="markers",
                            name=backend, legendgroup="backends", legendgrouptitle_text="backend (colour)",
                            marker=dict(color=backend_color(backend), size=9 if len(d) <= 2000 else 6,
                                        line=dict(width=0.5, color="white"),
                                        symbol=sym[dts.iloc[0]] if dts.nunique() == 1 else dts.map(sym).to_numpy()),
                            customdata=list(zip(g["op"], g["case"], g["dtype"], g["gbps"].astype(float),
                                                g["pct_peak_tflops"].astype(float), g["pct_peak_gbps"].astype(float),
                                                g["source"])),
                            hovertemplate=("<b>" + backend + "</b> %{customdata[0]} %{customdata[1]} %{customdata[2]}"
                                           "<br>%{y:.1f} TFLOP/s (%{customdata[4]:.1f}% of peak)"
                                           "<br>%{customdata[3]:.0f} GB/s (%{customdata[5]:.1f}% of peak)"
                                           "<br>intensity %{x:.1f} FLOP/byte<br>%{customdata[6]}<extra></extra>")))
    if len(sym) > 1:
        for t, sh in sym.items():
            fig.add_scatter(x=[None], y=[None], mode="markers", name=t, legendgroup="dtypes",
                            legendgrouptitle_text="dtype (symbol)", marker=dict(symbol=sh, color="#777", size=9))
    note = f"; {skipped} row(s) without a FLOP or byte count not shown" if skipped else ""
    ttl = title or data_title(d, "roofline", device=peak.name)
    ttl += f"<br><sup>datasheet peaks{' and measured (dashed)' if kind == 'measured' else ''}; ideal bytes (each input read once){note}</sup>"
    style_figure(fig, ttl, "arithmetic intensity (FLOP / byte)", "achieved TFLOP/s", legend_title="")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig


# -- numerical error -------------------------------------------------------------------------
_ERR = {"err_rel": "relative error vs the high-precision reference",
        "err_rel_dequant": "relative error vs the product of the dequantized inputs",
        "err_max_abs": "max absolute error vs the reference"}


def error_figure(df: pd.DataFrame, metric: str = "err_rel", title: str | None = None, log_y: bool = True):
    """Numerical error per case, as dots: x = case, y = error, one series per (dtype, backend,
    source), coloured by dtype (a format's error hardly depends on the backend that runs it);
    filled markers for ``measured`` rows, open ones for ``emulated`` / ``published`` rows.
    ``metric``: ``err_rel`` (against the operator's reference: for scaled GEMM the unquantized
    bf16 product, i.e. what the format costs), ``err_rel_dequant`` (scaled GEMM: against the
    dequantized inputs' product, i.e. the kernel's own error) or ``err_max_abs``. For
    ``err_rel`` a dotted line marks each dtype's tolerance (``err_tol``) when it is one value.
    Several rows of one point are reduced to their median. Log y axis by default. Raises
    ``UsageError`` for an unknown metric or when no row has it."""
    import plotly.graph_objects as go

    if metric not in _ERR:
        raise bad_choice("error metric", metric, _ERR)
    d = df[df["status"].isin(["ok", "published"])]
    d = d[pd.to_numeric(d[metric], errors="coerce").notna()] if metric in d else d.iloc[0:0]
    if d.empty:
        raise UsageError(f"no rows with {metric} to plot")
    d = d.assign(x=case_labels(d, cols=("op",)))
    dtypes = sorted(d["dtype"].astype(str).unique())
    order = list(dict.fromkeys(d["x"]))
    fig = go.Figure()
    symbols = ("circle", "diamond", "square", "triangle-up", "cross", "star")
    backends = list(dict.fromkeys(d["backend"].astype(str)))
    trace = scatter_class(len(d))   # WebGL markers past a few thousand rows
    for (dtype, backend, source), g in d.groupby(["dtype", "backend", "source"], sort=False):
        v = g.groupby("x", sort=False)[metric].median().astype(float)
        tol = g.groupby("x", sort=False)["err_tol"].first().astype(float) if "err_tol" in g else None
        c = SERIES_COLORS[dtypes.index(str(dtype)) % len(SERIES_COLORS)]
        sym = symbols[backends.index(str(backend)) % len(symbols)] + ("" if source == "measured" else "-open")
        fig.add_trace(trace(x=list(v.index), y=v.values, mode="markers", name=f"{dtype} {backend} ({source})",
                            legendgroup=str(dtype), marker=dict(color=c, size=11, symbol=sym, line=dict(width=2, color=c)),
                            customdata=list(zip([source] * len(v), tol.values if tol is not None else [math.nan] * len(v))),
                            hovertemplate=(f"<b>{dtype} {backend}</b> %{{x}}<br>{metric} %{{y:.3g}}<br>tolerance "
                                           "%{customdata[1]:.3g}<br>source %{customdata[0]}<extra></extra>")))
    if "err_tol" in d and metric == "err_rel":
        for dtype, g in d.groupby("dtype", sort=False):
            tols = pd.to_numeric(g["err_tol"], errors="coerce").dropna().unique()
            if len(tols) == 1:
                c = SERIES_COLORS[dtypes.index(str(dtype)) % len(SERIES_COLORS)]
                ref_line(fig, float(tols[0]), c, "dot", f"{dtype} tolerance {float(tols[0]):g} (dotted)")
    kinds = ", ".join(sorted(d["source"].dropna().unique()))
    ttl = (title or data_title(d, f"numerical error per case ({metric})")) + \
        f"<br><sup>{_ERR[metric]}; lower is better; sources: {kinds} (open markers: not measured)</sup>"
    style_figure(fig, ttl, "case", metric, legend_title="dtype backend (source)")
    fig.update_layout(showlegend=True)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    if log_y:
        fig.update_yaxes(type="log")
    else:
        fig.update_yaxes(rangemode="tozero")
    return fig


# -- ranges ----------------------------------------------------------------------------------
def range_figure(ranges: pd.DataFrame | None = None, title: str | None = None):
    """Figures public only as ranges (``low``..``high``, e.g. AOTriton 0.14.2b vs 0.13b forward
    0.92x-2.34x) as floating horizontal bars from low to high, one row per (what, subject),
    with a dashed 1.0x line. ``ranges`` defaults to :func:`flyexplore.results.published.ranges` (columns
    ``what, subject, low, high``). No per-case value is drawn because none is public. Raises
    ``UsageError`` when ``ranges`` is empty or lacks those columns."""
    import plotly.graph_objects as go

    if ranges is None:

        ranges = _r()
    need = ["what", "subject", "low", "high"]
    if ranges.empty or any(c not in ranges for c in need):
        raise UsageError(f"range_figure needs rows with columns {', '.join(need)}")
    fig = go.Figure()
    whats = list(dict.fromkeys(ranges["what"]))
    for i, (what, g) in enumerate(ranges.groupby("what", sort=False)):
        lo, hi = g["low"].astype(float), g["high"].astype(float)
        fig.add_bar(y=[f"{what}: {s}" for s in g["subject"]], x=hi - lo, base=lo, orientation="h", name=what,
                    marker_color=SERIES_COLORS[whats.index(what) % len(SERIES_COLORS)], opacity=0.75,
                    text=[f"{a:.2f}x – {b:.2f}x" for a, b in zip(lo, hi)], textposition="outside",
                    cliponaxis=False,
                    hovertemplate="%{y}<br>%{text} (range only; no per-case values public)<extra></extra>")
    ref_line(fig, 1.0, "#555", "dash", "1.0x (no change)", horizontal=True)
    ttl = (title or "Published only as ranges") + \
        "<br><sup>low to high over the published cases; no per-case values are public</sup>"
    style_figure(fig, ttl, "speedup (x)", "", height=max(340, 190 + 46 * len(ranges)), legend_title="")
    fig.update_xaxes(range=[0, float(ranges["high"].astype(float).max()) * 1.3])  # room for the labels
    fig.update_yaxes(type="category", autorange="reversed")
    fig.update_layout(showlegend=True, margin=dict(b=110),
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.01, x=0))
    return fig
