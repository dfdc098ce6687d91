"""The build-series figure and report section: an environment A/B of three or more environments
(AOTriton 0.11.2b / 0.13b / 0.14.2b, torch nightlies, flydsl 0.3.x / 0.4.x, ROCm releases), each
case's speedup in every environment against the first, the environments on the x axis in the
run's order. The numbers are :func:`flyexplore.results.series.series_table`'s.

Which drawing reads best depends on how many series (case x backend) there are:

- up to :data:`LINES_MAX` series, one panel, a line per case: the cases are read against each
  other and against 1.0 at a glance, and a build that moves every case shows as lines moving
  together;
- up to :data:`FACETS_MAX`, one small panel per case (shared y axis): lines of that many cases
  cross and hide each other's whiskers, panels never do, and a SLOWER point stands out by colour;
- past that, per (op, dtype, backend) the geometric mean over the cases with its 95% interval and
  label, bold, over each case's line drawn faint (a panel for each where there are several):
  panels of hundreds of cases are unreadable.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure import stats as S
from flyexplore.results import series as SR
from flyexplore.views import plot_style as P

#: Up to this many series (case x backend) the figure draws one line each in one panel.
LINES_MAX = 8
#: Up to this many series it draws one small panel each (:data:`FACET_COLS` to a row); past it,
#: the geometric mean over the cases with the cases' lines faint behind.
FACETS_MAX = 40
#: Panels to a row of the faceted layout.
FACET_COLS = 4
#: The layouts :func:`series_figure` draws.
LAYOUTS = ("auto", "lines", "facets", "geomean")
#: Marker colour of each label in panels (one case a panel: the colour marks the label).
LABEL_COLORS = {"FASTER": "#2CA02C", "SAME": "#7F7F7F", "SLOWER": "#D62728", "AMBIGUOUS": "#FF7F0E", "": "#7F7F7F"}
#: The marker of the first environment's point (the reference, 1.0 by definition).
REFERENCE_SYMBOL = "diamond-open"


def _symbols(t: pd.DataFrame) -> list[str]:
    lab = t["verdict"].astype(object).where(t["verdict"].notna(), "")
    return [REFERENCE_SYMBOL if how == "reference" else P.LABEL_SYMBOLS.get(str(v), "circle-open")
            for v, how in zip(lab, t["interval"])]


def _hover(t: pd.DataFrame, label: str) -> tuple[np.ndarray, str]:
    """customdata and hovertemplate of one series' points."""
    text = []
    for r in t.itertuples():
        if pd.isna(r.interval):
            text.append(f"{r.env}: no number (no ok row of the arm or its reference)")
        elif r.interval == "reference":
            text.append(f"{r.arm}: the reference (1.0 by definition)")
        else:
            lab = None if pd.isna(r.verdict) else str(r.verdict)
            text.append(f"{r.arm} vs {r.reference}: {S.fmt_interval(r.speedup, r.speedup_lo, r.speedup_hi, lab)}")
    custom = np.column_stack([np.asarray(text, dtype=object), t["time_ms"].to_numpy(float) * 1e3,
                              t["reference_ms"].to_numpy(float) * 1e3])
    tmpl = (f"<b>{label}</b><br>%{{customdata[0]}}<br>time %{{customdata[1]:.2f}} µs "
            "(reference %{customdata[2]:.2f} µs)<extra></extra>")
    return custom, tmpl


def _series_label(t: pd.DataFrame) -> pd.Series:
    """Each row's series label: the case (op and dtype where they vary), the backend where
    several are drawn."""
    return P.case_labels(t, cols=("op", "dtype", "backend"))


def series_figure(df: pd.DataFrame, envs: Sequence[str] | str | None = None, layout: str = "auto",
                  title: str | None = None):
    """A build series as a figure: per case, the speedup in every environment against the first
    one (time in the first environment / time in that one; > 1: faster), with its 95% interval
    as whiskers and its label (FASTER / SAME / SLOWER / AMBIGUOUS) as the marker, the
    environments on the x axis in the run's order; a dashed 1.0x line and the SAME band
    (``±band``, the rows' own, default 1%) shaded. The first environment's point is the reference
    (1.0, :data:`REFERENCE_SYMBOL`). Never changes ``df``.

    ``df``: an environment A/B's result rows (``sweep --env A --env B --env C``; the columns of
    :data:`flyexplore.results.series.NEEDED`: ``backend`` holds the arm, ``flash@0.13b``, ``env``
    its environment; the order comes from the sweep record in ``df.attrs["sweeps"]``).
    ``envs``: the environments to draw, in this order, the first being the reference (default:
    all, in the run's order). ``layout``: ``lines`` (one line per case and backend in one panel),
    ``facets`` (one panel per case), ``geomean`` (per op, dtype and backend the geometric mean
    over the cases, the cases faint behind), or ``auto`` (lines up to :data:`LINES_MAX` series,
    facets up to :data:`FACETS_MAX`, else geomean; geomean draws a panel per op, dtype and
    backend where there are several). Each case's trace carries ``meta``
    ``{"op", "case", "dtype", "backend", "reference"}`` and its points ``x`` (environments, in
    order) and ``y`` (speedups). Raises :class:`UsageError` for rows that are not an environment
    A/B (the missing column named), fewer than two environments, an unknown environment or
    layout (the valid ones listed), or no case with a number in two environments."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if layout not in LAYOUTS:
        raise bad_choice("series layout", layout, LAYOUTS)
    t = SR.series_table(df, envs)
    order = t.attrs["envs"]
    first = order[0]
    t = t.assign(label=_series_label(t)) if len(t) else t.assign(label=pd.Series(dtype=object))
    keys = ["op", "case", "dtype", "backend"]
    groups = [(k, g) for k, g in t.groupby(keys, sort=False, dropna=False) if (g["interval"] != "reference").any()]
    if not groups:
        notes = "; ".join(t.attrs.get("notes") or []) or "no ok row of the same backend in two environments"
        raise UsageError(f"build series: no case has a speedup against {first} ({notes})")
    n = len(groups)
    if layout == "auto":
        layout = "lines" if n <= LINES_MAX else "facets" if n <= FACETS_MAX else "geomean"
    band = S.BAND
    if "band" in df:
        bands = pd.to_numeric(df["band"], errors="coerce").dropna()
        band = float(bands.median()) if len(bands) else S.BAND
    with_ci = P.has_intervals(t)
    head = title or P.data_title(df[df["env"].isin(order)],
                                 f"build series over {len(order)} environments, speedup vs {first}")
    sub = (f"time in {first} / time in each environment (> 1: faster than {first}); environments in run order; "
           + ("whiskers: 95% interval; marker: label" if with_ci else P.NO_INTERVALS)
           + f"; grey band: SAME (±{band:.0%})")
    if layout == "geomean":
        sub += f"; {t[['op', 'case', 'dtype']].drop_duplicates().shape[0]:,} cases, each a faint line"
    ttl = head + f"<br><sup>{sub}</sup>"
    ytitle = f"speedup vs {first} (x)"

    # panels: one per case (facets), one per (op, dtype, backend) of the geometric means where
    # there are several (their labels would overlap in one), else one
    sets = list(t.groupby(["op", "dtype", "backend"], sort=False, dropna=False))
    if layout == "facets":
        titles = [g["label"].iloc[0] for _, g in groups]
    elif layout == "geomean" and len(sets) > 1:
        titles = [" ".join(str(v) for v in k) for k, _ in sets]
    else:
        titles = []
    ncol = min(FACET_COLS if layout == "facets" else 2, len(titles)) if titles else 1
    nrow = math.ceil(len(titles) / ncol) if titles else 1
    if titles:
        fig = make_subplots(rows=nrow, cols=ncol, shared_yaxes=True, horizontal_spacing=0.05,
                            vertical_spacing=min(0.12, 0.35 / max(nrow - 1, 1)) if nrow > 1 else 0.1,
                            subplot_titles=titles)
        height = max(P.HEIGHT, 170 + (210 if layout == "facets" else 380) * nrow)
    else:
        fig = go.Figure()
        height = P.HEIGHT
    P.style_figure(fig, ttl, "environment (run order)", ytitle, height=height, legend_title="")
    seen: set[str] = set()

    def place(i: int) -> dict:
        if not titles:
            return {}
        r, c = divmod(i, ncol)
        return {"row": r + 1, "col": c + 1}

    if layout in ("lines", "facets"):
        for i, (key, g) in enumerate(groups):
            label = g["label"].iloc[0]
            # every environment in order; one without a number breaks the line there (no y)
            g = g.set_index("env").reindex(order).rename_axis("env").reset_index()
            syms = _symbols(g)
            labs = g["verdict"].astype(object).where(g["verdict"].notna(), "").map(str).tolist()
            seen |= {"reference" if s == REFERENCE_SYMBOL else lab
                     for s, lab, how in zip(syms, labs, g["interval"]) if not pd.isna(how)}
            color = (P.SERIES_COLORS[i % len(P.SERIES_COLORS)] if layout == "lines"
                     else P.backend_color(str(key[3])))
            mcolor = (color if layout == "lines"
                      else ["#333" if s == REFERENCE_SYMBOL else LABEL_COLORS.get(lab, "#7F7F7F")
                            for s, lab in zip(syms, labs)])
            custom, tmpl = _hover(g, label)
            if layout == "lines":   # the legend entry: the case's line (its first marker is the reference's)
                fig.add_scatter(x=[None], y=[None], mode="lines", name=label, legendgroup=label,
                                line=dict(color=color, width=2), hoverinfo="skip")
            fig.add_trace(go.Scatter(
                x=g["env"].tolist(), y=g["speedup"].to_numpy(float), mode="lines+markers", name=label,
                legendgroup=label, showlegend=False, line=dict(color=color, width=2),
                marker=dict(symbol=syms, size=10, color=mcolor, line=dict(width=1.5, color=mcolor)),
                error_y=dict(P.whiskers(g), color=color) if with_ci else None,
                customdata=custom, hovertemplate=tmpl,
                meta={"op": key[0], "case": key[1], "dtype": key[2], "backend": key[3],
                      "reference": str(g["reference"].iloc[0])}), **place(i))
    else:   # geomean: per (op, dtype, backend) the cases faint, their geometric mean bold
        gm = SR.series_geomeans(t)
        for i, ((op, dt, b), g) in enumerate(sets):
            color = P.SERIES_COLORS[i % len(P.SERIES_COLORS)]
            name = " ".join(str(v) for v in (op, dt, b))
            xs: list = []
            ys: list = []
            txt: list = []
            for _, c in g.groupby(["case"], sort=False):
                xs += c["env"].tolist() + [None]
                ys += c["speedup"].tolist() + [None]
                txt += [str(c["case"].iloc[0])] * len(c) + [None]
            fig.add_trace(P.scatter_class(len(xs))(
                x=xs, y=ys, mode="lines", name=f"{name}: each case", legendgroup=name, showlegend=True,
                line=dict(color=color, width=1), opacity=0.25, text=txt,
                hovertemplate="%{text} in %{x}: %{y:.3f}x<extra></extra>"), **place(i))
            m = gm[(gm["op"] == op) & (gm["dtype"] == dt) & (gm["backend"] == b)]
            m = m.assign(speedup=m["geomean"], speedup_lo=m["geomean_lo"], speedup_hi=m["geomean_hi"],
                         interval=np.where(m["position"] == 0, "reference", "geomean"))
            syms = _symbols(m)
            labs = m["verdict"].astype(object).where(m["verdict"].notna(), "").map(str).tolist()
            seen |= {"reference" if s == REFERENCE_SYMBOL else lab for s, lab in zip(syms, labs)}
            text = [f"{r.env}: the reference" if r.interval == "reference" else
                    f"{r.env}: geomean of {r.cases} cases "
                    + S.fmt_interval(r.geomean, r.geomean_lo, r.geomean_hi, None if pd.isna(r.verdict) else r.verdict)
                    + "".join(f", {getattr(r, k)} {k}" for k in S.LABELS if getattr(r, k))
                    for r in m.itertuples()]
            marks = ["" if r.interval == "reference" else
                     f"{r.geomean:.3f}x" + ("" if pd.isna(r.verdict) else f" {r.verdict}") for r in m.itertuples()]
            fig.add_trace(go.Scatter(
                x=m["env"].tolist(), y=m["geomean"].to_numpy(float), mode="lines+markers+text",
                name=f"{name}: geometric mean", legendgroup=name, line=dict(color=color, width=3),
                marker=dict(symbol=syms, size=11, color=color, line=dict(width=1.5, color=color)),
                error_y=dict(P.whiskers(m), color=color) if with_ci else None, text=marks,
                textposition="top center", textfont=dict(color=color, size=12), customdata=text,
                hovertemplate="%{customdata}<extra></extra>",
                meta={"op": op, "dtype": dt, "backend": b, "geomean": True}), **place(i))
    for i in range(max(len(titles), 1)):
        at = place(i)
        fig.add_hrect(y0=1 - band, y1=1 + band, fillcolor="#BBBBBB", opacity=0.3, line_width=0, layer="below", **at)
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", line_width=1.5, **at)
    fig.add_scatter(x=[None], y=[None], mode="lines", name=f"1.0x ({first}, the reference)",
                    line=dict(color="#555", dash="dash", width=1.5), hoverinfo="skip")
    for lab in ["reference", *P.LABEL_SYMBOLS]:   # what each marker means
        if lab in seen:
            sym = REFERENCE_SYMBOL if lab == "reference" else P.LABEL_SYMBOLS[lab]
            fig.add_scatter(x=[None], y=[None], mode="markers", legendgroup="labels",
                            name={"reference": f"{first}: the reference", "": "no label"}.get(lab, lab),
                            marker=dict(color=LABEL_COLORS.get(lab, "#333") if layout == "facets" else "#777",
                                        size=9, symbol=sym), hoverinfo="skip")
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=list(order))
    fig.update_yaxes(rangemode="tozero")
    if titles:
        # one x axis for every panel (the same environments at the same places), its names under
        # the lowest panel of each column only; the axis titles once, short (the subtitle says more)
        fig.update_xaxes(title_text="", matches="x", showticklabels=False)
        for i in range(len(titles)):
            if i + ncol >= len(titles):
                fig.update_xaxes(showticklabels=True, **place(i))
        fig.update_yaxes(title_text="")
        fig.update_yaxes(title_text="speedup (x)", row=1, col=1)
        fig.update_annotations(font_size=11)
        # the legend (what the markers mean) below the panels, so they keep the width
        fig.update_layout(margin=dict(t=110, b=90), legend=dict(orientation="h", yref="container", y=0.005,
                                                                 yanchor="bottom", x=0, xanchor="left"))
    else:
        fig.update_layout(margin=dict(t=110))
    if layout == "lines":   # the cases' points side by side at each environment, whiskers apart
        fig.update_layout(scattermode="group", scattergap=0.75)
    return fig


def _summary_lines(t: pd.DataFrame) -> list[str]:
    """One sentence per environment after the first: how many cases got each label, and the
    geometric mean per (op, dtype, backend) where there are several cases."""
    out = []
    gm = SR.series_geomeans(t)
    for env, g in gm[gm["position"] > 0].groupby("env", sort=False):
        parts = []
        for r in g.itertuples():
            counts = ", ".join(f"{getattr(r, k)} {k}" for k in S.LABELS if getattr(r, k)) or "no label"
            what = " ".join(str(v) for v in (r.op, r.dtype, r.backend))
            gmt = S.fmt_interval(r.geomean, r.geomean_lo, r.geomean_hi, None if pd.isna(r.verdict) else r.verdict)
            parts.append(f"{what}, {r.cases} case(s): {counts}" + (f"; geometric mean {gmt}" if r.cases > 1 else ""))
        out.append(f"{env} vs {t.attrs['envs'][0]}: " + "; ".join(parts) + ".")
    return out


def series_section(page, df: pd.DataFrame) -> None:
    """Add the build-series section to a report page (:func:`flyexplore.views.report.write_report`):
    the environments in the run's order, a line per environment with its label counts and
    geometric means, the figure (:func:`series_figure`) and the table
    (:func:`flyexplore.results.series.series_table`, ``tables/series.*``). Where the rows give no
    series (not an A/B, nothing ok in two environments) the section says why in one line."""
    try:
        t = SR.series_table(df)
        fig = series_figure(df)
    except UsageError as exc:
        page.h2("Build series")
        page.p(f"No build series: {exc}.")
        return
    order = t.attrs["envs"]
    page.h2(f"Build series: {len(order)} environments in run order")
    page.p(f"Each case's speedup in every environment against the first, {order[0]} (time in {order[0]} / time "
           f"in the environment; > 1: faster than {order[0]}), with its 95% interval and label; the environments "
           f"in the run's order ({' → '.join(order)}). Every environment's arms were timed round by round in one "
           f"run, one turn each per round, the order of the turns rotated from round to round (A B C, B C A, "
           f"C A B, ...). Any two side by side: flyexplore compare FILE --a-env X --b-env Y.")
    for line in _summary_lines(t):
        page.p(line)
    for note in t.attrs.get("notes") or []:
        page.p(f"Left out: {note}.", cls="note")
    page.fig("series", fig)
    page.table("series", t)
