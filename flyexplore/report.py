"""Reports: one self-contained HTML file (environment, tables, figures) that opens offline."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Sequence

import pandas as pd

from . import results as R
from .plots import speedup_figure

_TABLE_COLS = ["op", "case", "dtype", "backend", "status", "time_ms", "per_call_ms", "timing_mode",
               "tflops", "gbps", "err_rel", "accuracy_ok", "noisy", "host_bound", "source", "observed",
               "flydsl_taken", "message"]


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a report shows: key, status, time in µs (headline and per call), TFLOP/s,
    GB/s, error, flags, source and message."""
    t = df[[c for c in _TABLE_COLS if c in df]].copy()
    t["time_us"] = t.pop("time_ms") * 1e3
    t["per_call_us"] = t.pop("per_call_ms") * 1e3
    return t


def write_report(df: pd.DataFrame, out_dir: str | Path, env=None, title: str = "flyexplore report",
                 baseline: str | Sequence[str] = "aten") -> Path:
    """Write ``report.html`` to ``out_dir``: the environment, a speedup figure per operator
    (when the baseline has rows) with geometric means, and the result table. plotly.js is
    embedded once, so the file opens offline. Returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if env is not None:
        parts.append(f"<h2>Environment</h2><pre>{html.escape(env.to_text())}</pre>")
    first = True
    for op, d in df.groupby("op", sort=False):
        try:
            fig = speedup_figure(d, baseline, title=f"{op}: speedup over {baseline}")
        except Exception as exc:  # no baseline rows for this op
            parts.append(f"<p>{html.escape(op)}: no speedup figure ({html.escape(str(exc))})</p>")
            continue
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if first else False))
        first = False
        gm = R.geomean_speedup(d, baseline)
        parts.append(gm.to_html(index=False, float_format=lambda v: f"{v:.3f}"))
    parts.append("<h2>Results</h2>")
    parts.append(summary_table(df).to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}"))
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + html.escape(title) +
            "</title><style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;"
            "font-size:12px} td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>"
            + "\n".join(parts) + "</body></html>")
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
