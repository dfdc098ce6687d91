"""Figures that compare two sets: an A/B run (:func:`ab_figure`), measured against published
figures (:func:`published_vs_measured_figure`) and vLLM serving arms (:func:`vllm_figure`). Same
rules as :mod:`flyexplore.views.plots`; the common look is
:mod:`flyexplore.views.plot_style`.
"""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.results.published import load
from flyexplore.views.plot_style import (
    BAR_MAX_CASES,
    HEIGHT,
    NO_INTERVALS,
    SERIES_COLORS,
    backend_color,
    baseline_name,
    case_labels,
    has_intervals,
    horizontal_bars,
    rank_curve,
    ref_line,
    style_figure,
    whiskers,
    wrap_text,
)


# -- A/B -------------------------------------------------------------------------------------
def ab_figure(ab, title: str | None = None):
    """Ratio time_A / time_B per paired case (> 1: B faster; coloured by backend) and the
    distribution of the ratios per backend, from a :class:`flyexplore.results.compare.ABResult`.
    Up to :data:`~flyexplore.views.plot_style.BAR_MAX_CASES` cases: one bar per case, and a
    box with every point. More: each backend's ratios sorted against their share of the cases
    (a rank curve of WebGL markers, the label as the marker, the case in the hover) and a box
    without points. Dashed 1.0x line, geometric means with their 95% intervals in the legend,
    each ratio's interval as a whisker, SAME labels outlined (bars), cases present on one side
    only counted in the subtitle, which promises whiskers only where some pair has an interval
    (else says there are none). The data are not changed."""
    from plotly.subplots import make_subplots

    a, b = ab.names
    p = ab.pairs.copy()
    p["x"] = case_labels(p)
    many = p["x"].nunique() > BAR_MAX_CASES
    fig = make_subplots(rows=1, cols=2, column_widths=[0.78, 0.22], horizontal_spacing=0.06,
                        subplot_titles=("per case, sorted" if many else "per case", "distribution"))
    bcol = "backend" if "backend" in p else None
    groups = p.groupby(bcol, sort=False) if bcol else [("all", p)]
    for be, g in groups:
        gm, glo, ghi = S.geomean_ci(g["ratio"], g["ratio_lo"], g["ratio_hi"])
        c = backend_color(str(be).split(" -> ")[-1])
        labels = g["verdict"].astype(object).where(g["verdict"].notna(), "")
        name = f"{be}: geomean {S.fmt_interval(gm, glo, ghi)}"
        if many:
            rank_curve(fig, g, "ratio", "ratio_lo", "ratio_hi", g["x"], c, str(be),
                       f"{a}/{b} %{{y:.3f}}x [%{{customdata[0]:.3f}}, %{{customdata[1]:.3f}}]", row=1, col=1)
            counts = ", ".join(f"{int((labels == k).sum())} {k}" for k in S.LABELS if (labels == k).any())
            fig.add_scatter(x=[None], y=[None], mode="markers", name=name + (f" ({counts})" if counts else ""),
                            legendgroup=str(be), marker=dict(color=c, size=8), hoverinfo="skip", row=1, col=1)
        else:
            fig.add_bar(x=g["x"], y=g["ratio"], name=name,
                        legendgroup=str(be), error_y=whiskers(g, "ratio", "ratio_lo", "ratio_hi"),
                        marker_color=c, marker_line_width=[2.5 if t == "SAME" else 0 for t in labels],
                        marker_line_color="black", row=1, col=1,
                        customdata=list(zip(g["time_a_ms"] * 1e3, g["time_b_ms"] * 1e3, labels)),
                        hovertemplate=(f"<b>{be}</b> %{{x}}<br>{a}/{b} %{{y:.3f}}x %{{customdata[2]}}<br>{a} "
                                       f"%{{customdata[0]:.2f}} µs<br>{b} %{{customdata[1]:.2f}} µs<extra></extra>"))
        fig.add_box(y=g["ratio"].to_numpy(dtype=float), name=str(be), legendgroup=str(be), showlegend=False,
                    marker_color=c, boxpoints=False if many else "all", jitter=0.4, pointpos=0, row=1, col=2,
                    hovertemplate=f"{be}<br>%{{y:.3f}}x<extra></extra>")
    for col in (1, 2):
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", line_width=1.5, row=1, col=col)
    fig.add_scatter(x=[None], y=[None], mode="lines", name="1.0x (no change)",
                    line=dict(color="#555", dash="dash", width=1.5), hoverinfo="skip", row=1, col=1)
    only = f"{len(ab.only_a)} case(s) only in {a}, {len(ab.only_b)} only in {b}"
    # whiskers and labels promised only where some pair has an interval (the synthetic examples have none)
    if has_intervals(p, "ratio_lo", "ratio_hi"):
        ci = (f"{'whiskers or band' if many else 'whiskers'}: 95% interval; "
              + ("sorted per backend, x: share of cases; marker: label" if many else "outlined: SAME"))
    else:
        ci = NO_INTERVALS + ("; sorted per backend, x: share of cases" if many else "")
    ttl = (title or f"A/B: {b} vs {a}") + \
        (f"<br><sup>time {a} / time {b} per case (> 1: {b} faster; {ci}); "
         f"{len(p)} pairs, geomean {S.fmt_interval(*ab.geomean_ci)}; {only}</sup>")
    style_figure(fig, ttl, "", f"time {a} / time {b} (x)", legend_title="backend")
    fig.update_layout(barmode="group", margin=dict(t=110))
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", title_text="", row=1, col=2)
    if many:
        fig.update_xaxes(range=[0, 100], title_text="share of cases (%), sorted by ratio", row=1, col=1)
    else:
        fig.update_xaxes(type="category", title_text="case", row=1, col=1)
    return fig


# -- published vs measured -------------------------------------------------------------------
_PVM = {"speedup": "speedup vs {base} (x)", "tflops": "TFLOP/s", "time_ms": "time (µs)"}


def published_vs_measured_figure(measured: pd.DataFrame, published: pd.DataFrame | None = None,
                                 metric: str = "speedup", baseline: str | Sequence[str] = "aten",
                                 title: str | None = None):
    """Measured and published numbers side by side for the (op, case, dtype, backend) keys
    both have: per backend a solid bar (measured here) and a hatched, lighter bar (published).

    ``metric``: ``speedup`` over ``baseline`` (the comparable number across devices; default),
    ``tflops`` or ``time_ms`` (drawn in µs). Hover shows each bar's device and, for published
    bars, the provenance (publication, setup, file). ``published`` defaults to
    :func:`flyexplore.results.published.load`. Raises ``UsageError`` for an unknown metric or when no
    key is in both."""
    import plotly.graph_objects as go

    if metric not in _PVM:
        raise bad_choice("metric", metric, _PVM)
    if published is None:

        published = load()
    key = ["op", "case", "dtype", "backend"]

    def values(d):
        d = d[d["status"].isin(["ok", "published"]) & d["time_ms"].notna()]
        if metric == "speedup":
            v = R.speedup(d, baseline).rename(columns={"speedup": "v"})
            extra = d.drop_duplicates(subset=key)[key + [c for c in ("device", "provenance", "torch") if c in d]]
            return v.merge(extra, on=key, how="left")
        g = d.groupby(key, sort=False).agg(v=(metric, "median"), device=("device", "first")).reset_index()
        if "provenance" in d:
            g = g.merge(d.drop_duplicates(subset=key)[key + ["provenance"]], on=key, how="left")
        if metric == "time_ms":
            g["v"] = g["v"] * 1e3
        return g

    m, p = values(measured[measured["source"] != "published"]), values(published)
    j = m.merge(p, on=key, suffixes=("_m", "_p"))
    if j.empty:
        raise UsageError("no (op, case, dtype, backend) of the measured set is in the published figures "
                         f"(published ops: {', '.join(sorted(published['op'].dropna().unique()))})")
    j["x"] = case_labels(j)
    horizontal = horizontal_bars(j["x"])
    v, c_ = ("y", "x") if horizontal else ("x", "y")  # category axis, value axis

    def xy(vals):
        return dict(x=vals, y=g["x"], orientation="h") if horizontal else dict(x=g["x"], y=vals)

    fig = go.Figure()
    for be, g in j.groupby("backend", sort=False):
        c = backend_color(be)
        dev_m = g["device_m"].fillna("?").astype(str) if "device_m" in g else "?"
        wm = ({("error_x" if horizontal else "error_y"): whiskers(g, "v_m", "speedup_lo_m", "speedup_hi_m")}
              if "speedup_lo_m" in g else {})
        fig.add_bar(**xy(g["v_m"]), **wm, name=f"{be} measured", legendgroup=be, marker_color=c,
                    offsetgroup=f"{be}-m", customdata=list(zip(dev_m, g.get("torch", pd.Series([""] * len(g))).fillna(""))),
                    hovertemplate=(f"<b>{be} measured</b> %{{{v}}}<br>%{{{c_}:.3f}}<br>device %{{customdata[0]}}"
                                   "<br>torch %{customdata[1]}<extra></extra>"))
        prov = g["provenance_p"] if "provenance_p" in g else g.get("provenance", pd.Series([""] * len(g)))
        fig.add_bar(**xy(g["v_p"]), name=f"{be} published", legendgroup=be, marker_color=c,
                    opacity=0.55, marker_pattern_shape="/", offsetgroup=f"{be}-p",
                    customdata=[[wrap_text(p_, 70), dv] for p_, dv in zip(prov, g["device_p"].fillna("?"))],
                    hovertemplate=(f"<b>{be} published</b> %{{{v}}}<br>%{{{c_}:.3f}}<br>device %{{customdata[1]}}"
                                   "<br>%{customdata[0]}<extra></extra>"))
    ylab = _PVM[metric].format(base=baseline_name(baseline))
    if metric == "speedup":
        ref_line(fig, 1.0, "#555", "dash", "1.0x (baseline)", horizontal)
    devs_m = ", ".join(sorted(j["device_m"].dropna().astype(str).unique())) if "device_m" in j else "?"
    ttl = (title or f"Measured vs published: {ylab.split(' (')[0]}") + \
        (f"<br><sup>solid: measured ({devs_m}){', whiskers: 95% interval' if metric == 'speedup' else ''}; "
         "hatched: published (AMD Instinct MI355X, no interval published); hover for provenance</sup>")
    ncase = j["x"].nunique()
    nbars = 2 * j["backend"].nunique()
    if horizontal:
        style_figure(fig, ttl, ylab, "case", legend_title="", height=max(HEIGHT, 200 + 12 * ncase * nbars))
        fig.update_xaxes(rangemode="tozero")
        fig.update_yaxes(type="category", autorange="reversed", dtick=1)
    else:
        style_figure(fig, ttl, "case", ylab, legend_title="")
        fig.update_yaxes(rangemode="tozero")
        fig.update_xaxes(type="category")
    fig.update_layout(barmode="group")
    return fig


# -- vLLM ------------------------------------------------------------------------------------
def _source_tag(source) -> str:
    """`` [synthetic example]`` etc. for a vLLM A/B row that is neither measured nor published
    (published rows are tagged by their own panel title)."""
    if not isinstance(source, str) or source in ("", "measured", "published"):
        return ""
    return f" [{source}]"


def vllm_figure(ab: pd.DataFrame, title: str | None = None):
    """Whole-request A/B of vLLM serving: speedup (> 1: arm B better) against concurrency, one
    line per model (and precision), one panel per metric (TTFT, TPOT, ITL, request
    throughput, ... or the published whole-request figure per precision). ``ab`` is
    :func:`flyexplore.results.vllm.ab_table` or :func:`flyexplore.results.published.vllm_published` output
    (or both concatenated). Dashed 1.0x line, y from zero. Panels of published rows are titled
    ``[published]``; rows with another non-measured ``source`` (e.g. ``synthetic example``,
    :func:`flyexplore.results.vllm.ab_table`'s ``source=``) carry it in brackets too."""
    from plotly.subplots import make_subplots

    if ab.empty:
        raise UsageError("no vLLM A/B rows to plot")
    d = ab.copy()
    d["panel"] = d.apply(lambda r: f"{r['metric']}" + (f" ({r['precision']})" if "precision" in d and
                                                       pd.notna(r.get("precision")) else "") +
                         (" [published]" if r.get("source") == "published" else ""), axis=1)
    d["panel"] = d["panel"].str.replace("whole_request", "whole request", regex=False)
    if "label" in d:
        srcs = d["source"] if "source" in d else [""] * len(d)
        d["panel"] = [lab.split(" (")[0] + _source_tag(s) if isinstance(lab, str) and s != "published" else pn
                      for lab, s, pn in zip(d["label"], srcs, d["panel"])]
    panels = list(dict.fromkeys(d["panel"]))
    ncol = min(3, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig = make_subplots(rows=nrow, cols=ncol, subplot_titles=panels, shared_xaxes=False,
                        horizontal_spacing=0.08, vertical_spacing=0.16 if nrow > 1 else 0.1)
    models = list(dict.fromkeys(d["model"]))
    conc = sorted({int(c) for c in d["concurrency"].dropna()})
    arms = ", ".join(dict.fromkeys(f"{a} → {b}" for a, b in zip(d["a"], d["b"])))
    ttl = (title or "vLLM serving A/B") + \
        f"<br><sup>speedup of B over A (> 1: B better; latency A/B, throughput B/A); {arms}</sup>"
    style_figure(fig, ttl, "", "", height=max(HEIGHT, 330 * nrow + 150), legend_title="model")
    fig.update_layout(margin=dict(t=120))
    for i, pn in enumerate(panels):
        r, c = divmod(i, ncol)
        g = d[d["panel"] == pn]
        for mdl, gm in g.groupby("model", sort=False):
            gm = gm.sort_values("concurrency")
            col = SERIES_COLORS[models.index(mdl) % len(SERIES_COLORS)]
            fig.add_scatter(x=[str(int(v)) if pd.notna(v) else "∞" for v in gm["concurrency"]], y=gm["speedup"],
                            mode="lines+markers", name=mdl, legendgroup=mdl, showlegend=i == 0,
                            line=dict(color=col, width=2), marker=dict(size=7), row=r + 1, col=c + 1,
                            customdata=list(zip(gm["a"], gm["b"], gm["a_value"], gm["b_value"],
                                                gm.get("provenance", pd.Series([""] * len(gm))).fillna("").map(lambda v: wrap_text(v, 70)))),
                            hovertemplate=(f"<b>{mdl}</b> concurrency %{{x}}<br>speedup %{{y:.3f}}x"
                                           "<br>%{customdata[0]}: %{customdata[2]:.4g}<br>%{customdata[1]}: %{customdata[3]:.4g}"
                                           "<br>%{customdata[4]}<extra></extra>"))
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", line_width=1.5, row=r + 1, col=c + 1)
        if "noise_pct" in g and g["noise_pct"].notna().any():
            nz = float(g["noise_pct"].max()) / 100
            fig.add_hrect(y0=1 - nz, y1=1 + nz, fillcolor="#888", opacity=0.2, line_width=0, row=r + 1, col=c + 1)
            if not any(t.name and t.name.startswith("noise floor") for t in fig.data):
                fig.add_scatter(x=[None], y=[None], mode="markers", name=f"noise floor ±{nz * 100:.2f}% (shaded)",
                                marker=dict(symbol="square", size=12, color="#888", opacity=0.4), hoverinfo="skip")
        fig.update_xaxes(type="category", categoryorder="array",
                         categoryarray=[str(v) for v in conc] + ["∞"], row=r + 1, col=c + 1,
                         title_text="concurrency" if r == nrow - 1 else "")
        fig.update_yaxes(rangemode="tozero", row=r + 1, col=c + 1, title_text="speedup (x)" if c == 0 else "")
    return fig
