"""Figures: functions that take a result set (tidy DataFrame) and return a plotly figure.
Rendering never changes the data. Colours are fixed per backend across all figures
(:data:`BACKEND_COLORS`).
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from . import results as R

#: One colour per backend, the same in every figure.
BACKEND_COLORS = {
    "aten": "#636EFA", "triton": "#EF553B", "inductor": "#00CC96", "flydsl": "#AB63FA",
    "emulated": "#FFA15A", "reference": "#19D3F3", "flash": "#FF6692", "efficient": "#B6E880",
    "cudnn": "#FF97FF", "math": "#FECB52", "ck": "#8C564B", "aotriton": "#1F77B4",
}


def speedup_figure(df: pd.DataFrame, baseline: str | Sequence[str] = "aten", title: str | None = None):
    """Grouped bars of speedup per case (baseline time / backend time) for each non-baseline
    backend, a dashed 1.0x line, the geometric mean per backend in the legend, ties within
    +-1% marked with an outline, and the y axis from zero. Raises ``UsageError`` when the
    baseline has no rows."""
    import plotly.graph_objects as go

    s = R.speedup(df, baseline)
    base = baseline if isinstance(baseline, str) else " / faster of " + ", ".join(baseline)
    fig = go.Figure()
    for (op, dtype, backend), g in s.groupby(["op", "dtype", "backend"], sort=False):
        gm = R.geomean(g["speedup"])
        fig.add_bar(
            x=[f"{op} {c} {dtype}" for c in g["case"]], y=g["speedup"],
            name=f"{backend} {op} {dtype} (geomean {gm:.2f}x)",
            marker_color=BACKEND_COLORS.get(backend),
            marker_line_width=[3 if t else 0 for t in g["tie"]], marker_line_color="black",
            customdata=list(zip(g["time_ms"] * 1e3, g["baseline_ms"] * 1e3, g["baseline"], g["source"])),
            hovertemplate="%{x}<br>speedup %{y:.3f}x<br>time %{customdata[0]:.2f} us<br>"
                          "baseline %{customdata[2]} %{customdata[1]:.2f} us<br>%{customdata[3]}<extra></extra>",
        )
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    fig.update_layout(title=title or f"Speedup over {base} (higher is better; outlined: tie within 1%)",
                      barmode="group", yaxis_title=f"speedup vs {base} (x)", xaxis_title="case",
                      legend_title="backend", template="plotly_white")
    fig.update_yaxes(rangemode="tozero")
    return fig
