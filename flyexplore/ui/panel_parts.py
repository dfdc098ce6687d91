"""The pieces a :class:`flyexplore.ui.panel.SweepPanel` draws: the points of one series of the live
figure (:class:`SpeedupSeries`; the speedups come from :func:`flyexplore.results.table.speedup`), long
messages numbered once (:class:`MessageNotes`) and the results table (:class:`GridTable`,
:class:`PagedTable`). UI only.

Results table: an ``itables`` grid (:class:`itables.widget.ITable`, DataTables in the browser)
-- chosen over ipydatagrid (last release 2024, pulls bqplot and py2vega) and perspective
(a WebAssembly engine and its own JupyterLab extension) because it is maintained, small, pure
Python, built on anywidget like plotly's ``FigureWidget`` (no further JupyterLab extension), and
pages, sorts and searches thousands of rows in the browser. Without itables (or anywidget) the
table is a paged HTML view. Long messages (an ``unavailable`` reason) are numbered once in the
notes below the table; rows show the number and the first words.
"""
from __future__ import annotations

import html
import math

import ipywidgets as W
import pandas as pd

from flyexplore.measure import stats as S
from flyexplore.ui.widget_base import TABLE_CSS

#: Columns of the results table, in order.
TABLE_COLUMNS = ("case", "dtype", "backend", "status", "speedup", "speedup_lo", "speedup_hi", "verdict",
                 "time_ms", "time_ci_lo_ms", "time_ci_hi_ms", "converged", "noisy", "tflops", "gbps",
                 "err_rel", "timing_mode", "clock_mhz_min", "message")
#: Rows per page of the paged table (used without itables).
PAGE_ROWS = 25
#: Messages longer than this are numbered in the notes under the table instead of repeated.
NOTE_CHARS = 60
#: Marker symbol of each verdict label (SAME is also outlined in black, as in speedup_figure).
SYMBOLS = {"FASTER": "triangle-up", "SAME": "circle", "SLOWER": "triangle-down", "AMBIGUOUS": "diamond"}


class SpeedupSeries:
    """The points of one (dtype, backend) series of the live speedup figure: x labels, speedups
    with their 95% intervals, verdict labels and hover text, one point per case (:meth:`put`);
    :meth:`geomean` and :meth:`counts` for the legend."""

    def __init__(self, dtype: str, backend: str):
        self.dtype, self.backend = dtype, backend
        self.pos: dict[str, int] = {}
        self.x: list[str] = []
        self.y: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.lab: list[str] = []
        self.hover: list[str] = []

    def put(self, x: str, sp: dict, baseline: str) -> None:
        est, lo, hi, lab = sp["speedup"], sp["speedup_lo"], sp["speedup_hi"], sp["verdict"]
        iv = f"[{lo:.3f}, {hi:.3f}]" if lo == lo and hi == hi else "[no interval]"
        hov = (f"<b>{html.escape(self.backend)}</b> {html.escape(x)}<br>speedup {est:.3f}x {iv} {lab}<br>"
               f"time {sp['time_ms'] * 1e3:.2f} µs<br>baseline {html.escape(baseline)} "
               f"{sp['baseline_ms'] * 1e3:.2f} µs")
        i = self.pos.get(x)
        if i is None:  # append: the common case, one point per case
            self.pos[x] = len(self.x)
            for lst, v in ((self.x, x), (self.y, est), (self.lo, lo), (self.hi, hi), (self.lab, lab),
                           (self.hover, hov)):
                lst.append(v)
        else:  # a case's rows arrived in several parts (block order): its point moves
            self.y[i], self.lo[i], self.hi[i], self.lab[i], self.hover[i] = est, lo, hi, lab, hov

    def geomean(self) -> tuple[float, float, float]:
        return S.geomean_ci(self.y, self.lo, self.hi)

    def counts(self) -> str:
        return ", ".join(f"{self.lab.count(k)} {k}" for k in S.LABELS if k in self.lab)


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
