"""The look every figure shares: a fixed colour per backend, the layout, reference lines,
interval whiskers and case labels. Used by :mod:`flyexplore.views.plots`, :mod:`flyexplore.views.plots_compare`
and :mod:`flyexplore.ops.attention.aotriton`; :mod:`flyexplore.views.plots` re-exports the colours,
:func:`backend_color`, :func:`dtype_shade` and :data:`HEIGHT`.
"""
from __future__ import annotations

import math
import textwrap
import zlib

import pandas as pd

#: One colour per backend, the same in every figure.
BACKEND_COLORS = {
    "aten": "#636EFA", "triton": "#EF553B", "inductor": "#00CC96", "flydsl": "#AB63FA",
    "emulated": "#FFA15A", "reference": "#19D3F3", "flash": "#FF6692", "efficient": "#B6E880",
    "cudnn": "#FF97FF", "math": "#FECB52", "ck": "#8C564B", "aotriton": "#1F77B4",
}
_EXTRA = ("#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16FF", "#B68100", "#750D86", "#EB663B",
          "#511CFB", "#00A08B", "#FB00D1", "#6C7C32", "#778AAE", "#862A16", "#A777F1", "#620042")
#: Colours for series that are not backends (models in vLLM figures), in order.
SERIES_COLORS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2",
                 "#7F7F7F", "#BCBD22", "#17BECF")
HEIGHT = 560
_FONT = dict(family="Arial, Helvetica, sans-serif", size=13)


def backend_color(name: str) -> str:
    """The colour of ``name``: :data:`BACKEND_COLORS`, else a stable colour from its hash (so
    an unknown backend has the same colour in every figure and every run)."""
    return BACKEND_COLORS.get(name) or _EXTRA[zlib.crc32(str(name).encode()) % len(_EXTRA)]


def dtype_shade(color: str, i: int) -> str:
    """The ``i``-th shade of a backend colour, for the ``i``-th dtype of that backend in one
    figure (0: the colour itself; 1: lighter; 2: darker; ...), so fp32 and bf16 bars differ."""
    if i == 0:
        return color
    r, g, b = (int(color[k:k + 2], 16) for k in (1, 3, 5))
    f = (0.5, -0.4, 0.25, -0.2)[(i - 1) % 4]
    mix = (lambda v: v + (255 - v) * f) if f > 0 else (lambda v: v * (1 + f))
    return "#" + "".join(f"{int(round(mix(v))):02X}" for v in (r, g, b))


def style_figure(fig, title: str, xtitle: str, ytitle: str, height: int = HEIGHT, legend_title: str = ""):
    """Give ``fig`` (a plotly figure) the common look: ``title`` at the top left (16 px), the
    ``plotly_white`` template, Arial 13, ``height`` px, fixed margins, left-aligned hover labels,
    the axis titles ``xtitle``/``ytitle`` and the legend title. Changes ``fig`` and returns it."""
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", font=dict(size=16)),
                      template="plotly_white", font=_FONT, height=height,
                      margin=dict(l=70, r=30, t=90, b=60), legend_title_text=legend_title,
                      hoverlabel=dict(align="left"))
    fig.update_xaxes(title_text=xtitle, automargin=True)
    fig.update_yaxes(title_text=ytitle, automargin=True)
    return fig


def ref_line(fig, v: float, color: str, dash: str, name: str, horizontal: bool = False, **kw):
    """A reference line across the plot at ``v`` (y, or x when ``horizontal``) with a legend
    entry named ``name`` (a line shape does not appear in the legend by itself)."""
    if horizontal:
        fig.add_vline(x=v, line_dash=dash, line_color=color, line_width=1.5, **kw)
    else:
        fig.add_hline(y=v, line_dash=dash, line_color=color, line_width=1.5, **kw)
    fig.add_scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color=color, dash=dash, width=1.5),
                    hoverinfo="skip", showlegend=True)


def horizontal_bars(labels) -> bool:
    """Many (> 30) or long case labels read better one per row (horizontal bars)."""
    u = pd.unique(pd.Series(list(labels)).astype(str))
    return len(u) > 30 or sum(len(x) for x in u) > 350


def wrap_text(text, width: int = 70) -> str:
    """``text`` broken into lines of at most ``width`` characters joined by ``<br>`` (plotly
    hover text); ``""`` for a missing value (``None``, NaN, ``pd.NA``)."""
    if text is None or (isinstance(text, float) and math.isnan(text)) or text is pd.NA:
        return ""
    return "<br>".join(textwrap.wrap(str(text), width)) or ""


def baseline_name(baseline) -> str:
    """How a figure names its baseline: the backend name, or for several (a list: the faster of
    them per case, :func:`flyexplore.results.table.speedup`) ``"the faster of a, b"``."""
    return baseline if isinstance(baseline, str) else "the faster of " + ", ".join(baseline)


def _few(values, what: str, most: int = 3) -> str:
    """The distinct values, ``/``-joined (``gemm/rmsnorm``), or ``"5 ops"`` past ``most``."""
    u = [str(v) for v in pd.unique(pd.Series(list(values)).dropna())]
    return "/".join(u) if len(u) <= most else f"{len(u)} {what}"


def data_title(df: pd.DataFrame, what: str, device: str | None = None) -> str:
    """A figure's default title from the data it draws: ``"gemm bf16 on NVIDIA H200: speedup
    vs aten"`` -- the ``op``, ``dtype`` and ``device`` columns' values (``/``-joined, or a count
    past three; a CPU row's device marked ``(CPU)``), then ``what`` the figure shows.
    ``device``: name this device instead of the rows' (a roofline's peaks). The figures use it
    where the caller gives no title; a given title is kept as it is."""
    if "status" in df:
        df = df[df["status"].isin(["ok", "published"])]
    head = " ".join(t for t in (_few(df["op"], "ops") if "op" in df else "",
                                _few(df["dtype"], "dtypes") if "dtype" in df else "") if t)
    if device is None and "device" in df:
        plat = df["platform"].astype(object) if "platform" in df else pd.Series([None] * len(df), index=df.index)
        names = [f"{d} (CPU)" if p == "cpu" and "cpu" not in str(d).lower() else str(d)
                 for d, p in zip(df["device"].astype(object), plat) if d is not None and not pd.isna(d)]
        device = _few(names, "devices") or None
    if device:
        head += f" on {device}"
    return f"{head}: {what}" if head else what[:1].upper() + what[1:]


def case_labels(d: pd.DataFrame, cols=("op", "dtype")) -> pd.Series:
    """Every row's case label on a category axis, for all rows of ``d`` at once (a string
    Series on ``d``'s index): the ``case``, preceded by the ``op`` and followed by the other
    ``cols`` (default ``dtype``) where those vary within ``d``, so that labels stay short and
    unique."""
    vary = [c for c in cols if c in d and d[c].nunique() > 1]
    parts = [d[c].astype(object).map(str) for c in vary if c == "op"] + [d["case"].astype(object).map(str)] + \
            [d[c].astype(object).map(str) for c in vary if c != "op"]
    out = parts[0]
    for p in parts[1:]:
        out = out + " " + p
    return out.astype(object)


#: A scatter figure with more points than this draws them with WebGL (``Scattergl``): SVG
#: markers make a browser slow past a few thousand.
WEBGL_POINTS = 2000


#: A figure of more cases than this draws their distribution instead of one bar per case
#: (:func:`flyexplore.views.plots.speedup_distribution_figure`, the A/B figure's rank curve):
#: bars of hundreds of cases are not readable, and thousands of bars make a page slow.
BAR_MAX_CASES = 80

#: Marker of each verdict label on a rank curve (WebGL markers); ``""``: no label.
LABEL_SYMBOLS = {"FASTER": "triangle-up", "SAME": "circle", "SLOWER": "triangle-down", "AMBIGUOUS": "x",
                 "": "circle-open"}


def rank_positions(n: int):
    """x of ``n`` sorted values on a rank curve: the middle of each one's share of the cases,
    in percent (``(i + 0.5) / n * 100``), so curves of different case counts line up."""
    import numpy as np

    return (np.arange(n) + 0.5) / max(n, 1) * 100.0


#: A rank curve of more points than this draws the 95% intervals as a shaded band (their lower
#: and upper ends, in the curve's order) instead of one whisker per point, which would cover it.
BAND_POINTS = 300

#: A rank curve of more cases than this is drawn through this many of them, evenly spaced by
#: rank (the first and the last included), so that a figure -- and a report -- stays bounded
#: in size (about 120 bytes a point) whatever the number of cases; the curve's shape is exact
#: at the points drawn, and every case stays in the data (a report's tables/results.csv).
CURVE_MAX_POINTS = 5000


def rank_curve(fig, g: pd.DataFrame, value: str, lo: str, hi: str, text, color: str, legendgroup: str,
               hover: str, row: int | None = None, col: int | None = None) -> int:
    """Add the rows of ``g`` to ``fig`` as a rank curve: ``value`` sorted ascending against the
    share of rows (x, %: :func:`rank_positions`), WebGL markers (``Scattergl``) in ``color``,
    the 95% interval (``lo``, ``hi`` columns) as whiskers (up to :data:`BAND_POINTS` points)
    or a shaded band, the ``verdict`` column's label as the marker (:data:`LABEL_SYMBOLS`: one
    trace per label, none in the legend; an array of symbols is checked value by value by
    plotly, seconds at 100,000 points). ``text``: one hover text per row of ``g`` (the case);
    ``hover``: the hover's value line, a plotly template (``%{y}``, ``%{customdata[0]}`` /
    ``[1]``: the interval). Past :data:`CURVE_MAX_POINTS` rows the curve is drawn through that
    many, evenly spaced by rank. Returns the row count (all rows, drawn or not). ``g`` is not
    changed."""
    import numpy as np
    import plotly.graph_objects as go

    order = np.argsort(g[value].to_numpy(dtype=float), kind="stable")
    n = len(g)
    x = rank_positions(n)
    if n > CURVE_MAX_POINTS:   # evenly spaced by rank: the first and the last case included
        keep = np.unique(np.linspace(0, n - 1, CURVE_MAX_POINTS).round().astype(np.int64))
        order, x = order[keep], x[keep]
    g = g.iloc[order]
    y = g[value].to_numpy(dtype=float)
    labels = (g["verdict"].astype(object).where(g["verdict"].notna(), "").to_numpy(dtype=object)
              if "verdict" in g else np.full(len(g), "", dtype=object))
    txt = np.asarray(text, dtype=object)[order]
    txt = np.where(labels != "", txt + " · " + labels, txt)
    lo_v, hi_v = g[lo].to_numpy(dtype=float), g[hi].to_numpy(dtype=float)
    custom = np.column_stack([lo_v, hi_v])
    r, gg, b = (int(color[k:k + 2], 16) for k in (1, 3, 5)) if color.startswith("#") and len(color) == 7 else (85, 85, 85)
    band = len(g) > BAND_POINTS
    if band:   # one closed outline: the lower ends left to right, the upper ends back
        ok = ~(np.isnan(lo_v) | np.isnan(hi_v))
        fig.add_trace(go.Scattergl(x=np.concatenate([x[ok], x[ok][::-1]]),
                                   y=np.concatenate([lo_v[ok], hi_v[ok][::-1]]), mode="lines",
                                   line=dict(width=0.5, color=f"rgba({r},{gg},{b},0.35)"), fill="toself",
                                   fillcolor=f"rgba({r},{gg},{b},0.18)", showlegend=False, hoverinfo="skip",
                                   legendgroup=legendgroup, name=f"{legendgroup} 95% interval"), row=row, col=col)
    err = whiskers(g, value, lo, hi)
    for lab in [k for k in LABEL_SYMBOLS if (labels == k).any()]:
        sel = labels == lab
        fig.add_trace(go.Scattergl(
            x=x[sel], y=y[sel], mode="markers", name=f"{legendgroup} {lab or 'no label'}", showlegend=False,
            legendgroup=legendgroup, marker=dict(color=color, size=5 if band else 7, symbol=LABEL_SYMBOLS[lab]),
            error_y=None if band else dict(err, array=err["array"][sel], arrayminus=err["arrayminus"][sel],
                                           thickness=0.8, width=0, color=f"rgba({r},{gg},{b},0.6)"),
            text=txt[sel], customdata=custom[sel],
            hovertemplate=f"<b>{legendgroup}</b> %{{text}}<br>{hover}<br>"
                          "%{x:.1f}% of the cases rank below or here<extra></extra>"), row=row, col=col)
    return n


def scatter_class(points: int):
    """``go.Scattergl`` for more than :data:`WEBGL_POINTS` points, else ``go.Scatter``."""
    import plotly.graph_objects as go

    return go.Scattergl if points > WEBGL_POINTS else go.Scatter


def has_intervals(g: pd.DataFrame, lo: str = "speedup_lo", hi: str = "speedup_hi") -> bool:
    """True when some row of ``g`` has a 95% interval (both ``lo`` and ``hi``): whether a
    figure draws whiskers, and so whether its subtitle may promise them."""
    if lo not in g or hi not in g or g.empty:
        return False
    both = pd.to_numeric(g[lo], errors="coerce").notna() & pd.to_numeric(g[hi], errors="coerce").notna()
    return bool(both.any())


#: What a figure's subtitle says in place of its whiskers when no value has an interval.
NO_INTERVALS = "no 95% intervals (the rows carry no samples), so no whiskers and no labels"


def whiskers(g: pd.DataFrame, est: str = "speedup", lo: str = "speedup_lo", hi: str = "speedup_hi") -> dict:
    """plotly ``error_y``/``error_x`` for the 95% intervals in ``g``: columns ``est`` (the
    value), ``lo`` and ``hi`` (the interval; none drawn where missing, never negative)."""
    e = g[est].astype(float)
    plus = (g[hi].astype(float) - e).where(g[hi].notna(), 0.0).clip(lower=0)
    minus = (e - g[lo].astype(float)).where(g[lo].notna(), 0.0).clip(lower=0)
    # float arrays: plotly writes them as compact typed arrays (a list becomes JSON text)
    return dict(type="data", symmetric=False, array=plus.to_numpy(dtype=float), arrayminus=minus.to_numpy(dtype=float),
                color="#333", thickness=1.2, width=3)
