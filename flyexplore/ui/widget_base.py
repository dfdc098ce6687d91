"""What every notebook panel of flyexplore shares: the table style, message colours, cell and
duration text, DataFrames as HTML tables, and the guard for control changes a panel makes itself.
UI only (:mod:`flyexplore.ui.widgets`); no ipywidgets needed here.
"""
from __future__ import annotations

import contextlib
import html
import math

import pandas as pd

#: CSS of the panels' HTML tables (class ``flyexplore-table``).
TABLE_CSS = ("<style>.flyexplore-table{border-collapse:collapse;font-size:12px;line-height:1.35}"
              ".flyexplore-table th,.flyexplore-table td{padding:2px 8px;text-align:left;"
              "border-bottom:1px solid #e5e5e5;white-space:nowrap}"
              ".flyexplore-table td:last-child{white-space:normal;min-width:240px}</style>")
#: Text colour of each message kind (``info``, ``ok``, ``error``, ``warn``).
COLORS = {"info": "#444", "ok": "#1a7f37", "error": "#b42318", "warn": "#9a6700"}


def cell_text(v) -> str:
    """A table cell's text: ``""`` for a missing value (``None``, NaN, ``pd.NA``), floats to 4
    significant digits, anything else as ``str``."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def fmt_seconds(s: float) -> str:
    """A duration of ``s`` seconds for a status line: ``"42 s"`` below 90 s, else ``"1.5 min"``."""
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min"


def frame_html(df: pd.DataFrame, max_height: int = 320) -> str:
    """A DataFrame as the panels' table style (floats to 4 significant digits)."""
    t = pd.DataFrame({c: [cell_text(v) for v in df[c]] for c in df.columns})
    body = t.to_html(index=False, escape=True, classes="flyexplore-table", border=0)
    return f'{TABLE_CSS}<div style="max-height:{max_height}px;overflow:auto">{body}</div>'


def html_span(text: str, kind: str = "info") -> str:
    """``text`` (HTML-escaped) in the colour of ``kind`` (:data:`COLORS`; unknown kinds: ``info``);
    ``""`` for empty text."""
    return (f'<span style="color:{COLORS.get(kind, COLORS["info"])}">'
            f'{html.escape(str(text), quote=False)}</span>') if text else ""


class Sync:
    """Marks control changes a panel makes itself (refreshing from the library), so that its
    observers do not act on them."""

    def __init__(self):
        self.depth = 0

    @contextlib.contextmanager
    def __call__(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
