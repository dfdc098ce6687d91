"""The sweep panel's results table and its notes: an ``itables`` grid (:class:`GridTable`;
:class:`itables.widget.ITable`, DataTables in the browser) -- chosen over ipydatagrid (last
release 2024, pulls bqplot and py2vega) and perspective (a WebAssembly engine and its own
JupyterLab extension) because it is maintained, small, pure Python, built on anywidget like
plotly's ``FigureWidget`` (no further JupyterLab extension), and pages, sorts and searches
thousands of rows in the browser. Without itables (or anywidget) the table is a paged HTML view
(:class:`PagedTable`). Long messages (an ``unavailable`` reason) are numbered once in the notes
below the table (:class:`MessageNotes`); rows show the number and the first words. UI only.
"""
from __future__ import annotations

import html
import math

import ipywidgets as W
import pandas as pd

from flyexplore.ui.widget_base import TABLE_CSS

#: Columns of the results table, in order.
TABLE_COLUMNS = ("case", "dtype", "backend", "status", "speedup", "speedup_lo", "speedup_hi", "verdict",
                 "time_ms", "time_ci_lo_ms", "time_ci_hi_ms", "converged", "noisy", "tflops", "gbps",
                 "err_rel", "timing_mode", "clock_mhz_min", "message")
#: Rows per page of the paged table (used without itables).
PAGE_ROWS = 25
#: Messages longer than this are numbered in the notes under the table instead of repeated.
NOTE_CHARS = 60


class MessageNotes:
    """Long messages (over :data:`NOTE_CHARS` characters) numbered once: a row shows ``[n]`` and
    the first words (:meth:`short`); :meth:`html` lists every message with its row count."""

    def __init__(self):
        self.num: dict[str, int] = {}
        self.count: dict[str, int] = {}

    def short(self, msg) -> str:
        if msg is None or (isinstance(msg, float) and math.isnan(msg)) or msg is pd.NA:
            return ""
        msg = str(msg)
        if len(msg) <= NOTE_CHARS:
            return msg
        n = self.num.setdefault(msg, len(self.num) + 1)
        self.count[msg] = self.count.get(msg, 0) + 1
        return f"[{n}] {msg[:NOTE_CHARS - 20].rstrip()}…"

    def html(self) -> str:
        if not self.num:
            return ""
        items = "".join(f"<li>[{n}] ({self.count[m]} row{'s' if self.count[m] != 1 else ''}) "
                        f"{html.escape(m)}</li>" for m, n in self.num.items())
        return f"<small><b>messages</b><ul style='margin:2px 0'>{items}</ul></small>"


class GridTable:
    """The results table as an itables grid (see the module text): :attr:`widget` to show,
    :meth:`show` to replace its rows, :attr:`frame` the rows shown. Raises ``ImportError``
    without itables."""

    kind = "itables grid"

    def __init__(self):
        from itables.widget import ITable

        self.frame = pd.DataFrame(columns=list(TABLE_COLUMNS))
        # every row (no downsampling), 15 a page; the options go with every update (update()
        # otherwise falls back to itables' defaults, which downsample above 64 KB)
        self.opts = dict(maxBytes=0, pageLength=15, lengthMenu=[15, 50, 200, 1000], showIndex=False,
                         scrollX=True, classes="display compact nowrap cell-border flyexplore-grid")
        self.widget = ITable(self.frame, **self.opts)

    def show(self, rows: list[dict]) -> None:
        self.frame = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
        self.widget.update(self.frame, **self.opts)


class PagedTable:
    """The results table as HTML pages of :data:`PAGE_ROWS` rows (without itables), with
    previous/next buttons: :attr:`widget`, :meth:`show`, :meth:`turn`, :attr:`frame`."""

    kind = "paged table"

    def __init__(self):
        self.frame = pd.DataFrame(columns=list(TABLE_COLUMNS))
        self.page = 0
        self.html = W.HTML()
        self.prev = W.Button(description="previous", icon="chevron-left", layout=W.Layout(width="110px"))
        self.next = W.Button(description="next", icon="chevron-right", layout=W.Layout(width="110px"))
        self.label = W.Label()
        self.prev.on_click(lambda _b: self.turn(-1))
        self.next.on_click(lambda _b: self.turn(1))
        self.widget = W.VBox([W.HBox([self.prev, self.label, self.next]), self.html])
        self._render()

    def show(self, rows: list[dict]) -> None:
        self.frame = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
        self._render()

    def turn(self, step: int) -> None:
        """Show the page ``step`` pages on (negative: back), within the pages there are."""
        self.page += step
        self._render()

    def _render(self) -> None:
        pages = max(1, math.ceil(len(self.frame) / PAGE_ROWS))
        self.page = min(max(self.page, 0), pages - 1)
        part = self.frame.iloc[self.page * PAGE_ROWS:(self.page + 1) * PAGE_ROWS]
        self.label.value = f"page {self.page + 1} of {pages} ({len(self.frame)} rows)"
        self.prev.disabled, self.next.disabled = self.page == 0, self.page >= pages - 1
        body = part.to_html(index=False, escape=True, classes="flyexplore-table", border=0, na_rep="")
        self.html.value = f"{TABLE_CSS}{body}"
