"""The kernel X-ray's figure: FlyDSL kernel resources across a sweep of compile-only X-rays
(:mod:`flyexplore.insight.xray`; compiler output for the target arch, never measurements).
"""
from __future__ import annotations

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.insight.isa import ARCH_LIMITS
from flyexplore.insight.xray import xray_frame

_METRICS = (("vgprs_total", "unified VGPRs per lane"), ("spills", "spilled registers (VGPR + SGPR)"),
            ("lds_bytes", "LDS bytes per workgroup"), ("waves_per_simd", "waves per SIMD (occupancy)"))
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "triangle-down")


def resources_figure(data, x: str | None = None, color: str | None = None, title: str | None = None):
    """Kernel resources across a sweep: stacked panels of unified VGPRs, spilled registers
    (VGPR spills go to scratch memory, SGPR spills to VGPR lanes), LDS bytes and the resulting occupancy (waves per SIMD, of 8 on
    gfx950), one line per ``color`` group.

    ``data``: a :func:`flyexplore.insight.xray.xray_frame` DataFrame or a list of :class:`flyexplore.insight.xray.XRay`. ``x`` defaults to ``n``
    when the sweep varies N, else ``case``; ``color`` defaults to ``dtype`` when several dtypes
    are present, else ``family``. Cases without a kernel (not eligible) are listed in the title,
    not plotted. Returns a plotly ``Figure`` (``fig.write_html``, or ``fig.write_image`` once
    kaleido and a Chromium are installed). Raises ``UsageError`` when nothing was compiled or
    ``x`` / ``color`` is not a column.
    """
    from plotly.subplots import make_subplots

    df = data if isinstance(data, pd.DataFrame) else xray_frame(list(data))
    if "kernel" not in df or df["kernel"].isna().all():
        raise UsageError("no compiled kernel to plot (every case was not eligible or failed)")
    have = df[df["kernel"].notna()].copy()
    have["spills"] = have["vgpr_spills"] + have["sgpr_spills"]
    if x is None:
        x = "n" if "n" in have and have["n"].nunique() > 1 else "case"
    if color is None:
        color = "dtype" if have["dtype"].nunique() > 1 else "family"
    for col in (x, color):
        if col not in have:
            raise UsageError(f"unknown column {col!r} (valid: {', '.join(map(str, have.columns))})")
    skipped = df[df["kernel"].isna()]
    fig = make_subplots(rows=len(_METRICS), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[t for _, t in _METRICS])
    palette = ["#AB63FA", "#636EFA", "#EF553B", "#00CC96", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880"]
    if x != "case":
        have = have.sort_values(x)
    for gi, (key, g) in enumerate(have.groupby(color, sort=True)):
        c = palette[gi % len(palette)]
        hover = [f"{r.op} {r.case} {r.dtype}<br>{r.kernel} ({r.family})<br>limited by {r.limited_by}"
                 for r in g.itertuples()]
        for row, (metric, _) in enumerate(_METRICS, start=1):
            fig.add_scatter(x=g[x], y=g[metric], mode="lines+markers", name=f"{color}={key}",
                            legendgroup=str(key), showlegend=row == 1, line_color=c, row=row, col=1,
                            marker_symbol=_SYMBOLS[gi % len(_SYMBOLS)], marker_size=9 - 2 * (gi % 3),
                            hovertext=hover, hovertemplate="%{hovertext}<br>%{y}<extra></extra>")
    arch = have["arch"].iloc[0]
    if arch in ARCH_LIMITS:
        fig.add_hline(y=ARCH_LIMITS[arch].max_waves_per_simd, line_dash="dash", line_color="gray",
                      row=len(_METRICS), col=1)
    ops = ", ".join(sorted(have["op"].unique()))
    ttl = title or f"FlyDSL kernel resources for {arch} ({ops}; compiled, not run)"
    if len(skipped):
        ttl += f"<br><sup>not eligible / no kernel: {', '.join(skipped['case'] + ' ' + skipped['dtype'])}</sup>"
    fig.update_layout(title=ttl, template="plotly_white", legend_title=color, height=900)
    fig.update_xaxes(title_text=x, row=len(_METRICS), col=1)
    if x == "n":
        fig.update_xaxes(type="log")
    for row in range(1, len(_METRICS) + 1):
        fig.update_yaxes(rangemode="tozero", row=row, col=1)
    return fig
