"""The AOTriton A/B figure and report section: which AOTriton backend ran on each side of two
result files, and the speedups against the published range (the view is
:func:`flyexplore.results.aotriton_ab.ab_view`).
"""
from __future__ import annotations

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.results.aotriton_ab import ab_view, published_range, range_note
from flyexplore.views.plot_style import style_figure, whiskers

_RAN_COLORS = {"FlyDSL": "#2CA02C", "aiter": "#FF7F0E", "Triton": "#1F77B4"}


def _ran_color(text: str) -> str:
    return next((c for k, c in _RAN_COLORS.items() if str(text).startswith(k)), "#7F7F7F")


def aotriton_ab_figure(view: pd.DataFrame, title: str | None = None):
    """The A/B view as a figure: per pass (forward, backward) one panel of bars, the paired
    speedup (time A / time B; > 1: B faster) per case, coloured by the AOTriton backend that ran
    on side B, each bar labelled with its verdict (``label``) when the view has one, else its
    value; the published range (0.14.2b vs 0.13b on gfx950) shaded behind where it applies (a
    pass with a ``published_range``: two AOTriton versions on gfx950), and a dashed 1.0x line. Titles of synthetic views start with ``SYNTHETIC EXAMPLE``. Raises
    :class:`UsageError` for an empty view."""
    from plotly.subplots import make_subplots


    if view is None or view.empty:
        raise UsageError("ab_figure needs a non-empty AOTriton A/B view (no attention case paired)")
    na, nb = view.attrs.get("names", ("A", "B"))
    passes = [x for x in ("fwd", "bwd") if (view["pass"] == x).any()]
    titles = [{"fwd": "forward", "bwd": "backward"}[x] for x in passes]
    fig = make_subplots(rows=1, cols=len(passes), subplot_titles=titles, horizontal_spacing=0.08)
    seen = set()
    for i, pas in enumerate(passes, start=1):
        g = view[view["pass"] == pas]
        lo, hi = published_range(pas)
        for ran, h in g.groupby("ran_b", sort=False):
            text = [f"{s:.2f}x {v}" if isinstance(v, str) and v else f"{s:.2f}x"
                    for v, s in zip(h["label"] if "label" in h else [None] * len(h), h["speedup"])]
            err = {}
            if "speedup_lo" in h and h["speedup_lo"].notna().any():
                err = {"error_y": whiskers(h.assign(speedup_lo=pd.to_numeric(h["speedup_lo"], errors="coerce"),
                                                    speedup_hi=pd.to_numeric(h["speedup_hi"], errors="coerce")))}
            fig.add_bar(x=h["case"] + " " + h["dtype"], y=h["speedup"], name=f"{nb} ran {ran}", legendgroup=ran,
                        **err,
                        showlegend=ran not in seen, marker_color=_ran_color(ran), text=text, textposition="outside",
                        customdata=list(zip(h["ran_a"], h["time_a_ms"] * 1e3, h["time_b_ms"] * 1e3)),
                        hovertemplate=(f"%{{x}}<br>{na}/{nb} %{{y:.3f}}x<br>{na} ran %{{customdata[0]}}, "
                                       f"%{{customdata[1]:.1f}} µs<br>{nb} ran {ran}, %{{customdata[2]:.1f}} µs"
                                       "<extra></extra>"), row=1, col=i)
            seen.add(ran)
        # shapes after the bars: plotly skips shapes on subplots that have no trace yet
        if "published_range" not in g or g["published_range"].notna().any():
            fig.add_hrect(y0=lo, y1=hi, fillcolor="#BBBBBB", opacity=0.25, line_width=0, layer="below", row=1, col=i)
            fig.add_annotation(text=f"published {lo:.2f}x-{hi:.2f}x (gfx950, range only)",
                               xref=f"x{i if i > 1 else ''} domain", yref=f"y{i if i > 1 else ''}", x=0.0, y=hi,
                               xanchor="left", yanchor="bottom", showarrow=False, font=dict(size=11, color="#555"))
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", line_width=1.5, row=1, col=i)
    fig.add_scatter(x=[None], y=[None], mode="lines", name="1.0x (no change)",
                    line=dict(color="#555", dash="dash", width=1.5), hoverinfo="skip", row=1, col=1)
    synthetic = (view["source"] == "synthetic example").any()
    ttl = title or f"AOTriton A/B: {nb} vs {na}, per case"
    if synthetic and not ttl.startswith("SYNTHETIC EXAMPLE"):
        ttl = "SYNTHETIC EXAMPLE (made-up numbers): " + ttl
    band = "published_range" not in view or view["published_range"].notna().any()
    ttl += (f"<br><sup>time {na} / time {nb} (> 1: {nb} faster); bar colour: the AOTriton backend {nb} ran"
            + ("; grey band: the published range</sup>" if band else "</sup>"))
    style_figure(fig, ttl, "", f"time {na} / time {nb} (x)", legend_title="")
    fig.update_layout(margin=dict(t=110))
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(type="category")
    return fig


def report_section(page, ab, a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Add the AOTriton section to an A/B report page (:func:`flyexplore.views.report.write_compare_report`):
    nothing when no attention case paired; else which AOTriton backend ran on each side, the
    speedups with their labels and the published range (:func:`ab_view`, :func:`aotriton_ab_figure`)."""
    view = ab_view(ab, a, b)
    if view.empty:
        return
    page.h2("Attention: which AOTriton backend ran")
    # made-up inputs: the report says so at its top (flyexplore.views.report), the figure in its title
    page.p("AOTriton picks Triton, aiter or FlyDSL (flyc, 0.14 and later) per call from its own tuning table; "
           "torch has no switch for it. 'ran' is read from the kernel names each row recorded (sweep with "
           "--trace on ROCm); 'not traced' means the row has no kernel record. The published range (AOTriton "
           "0.14.2b vs 0.13b on gfx950, forward 0.92x-2.34x, backward 0.93x-2.47x) is shown only where both "
           "sides ran on gfx950 with two different AOTriton versions (published_setup: exactly 0.13 vs 0.14.2).")
    note = range_note(view)
    if note:
        page.p(note[0].upper() + note[1:] + ".", cls="note")
    page.fig("aotriton_ab", aotriton_ab_figure(view))
    page.table("aotriton_backends", view)
