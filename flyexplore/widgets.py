"""Jupyter widgets on top of the library: :class:`SweepPanel`, :class:`SwitchPanel`,
:class:`DispatchInspector` and :func:`environment_view`.

UI only. Everything these widgets show or do is a call into the library
(:func:`flyexplore.sweep.make_plan` / :func:`~flyexplore.sweep.run_sweep`,
:mod:`flyexplore.results`, :func:`flyexplore.plots.speedup_figure`,
:func:`flyexplore.env.collect`, :mod:`flyexplore.switches`, :mod:`flyexplore.explain`,
:mod:`flyexplore.trace`, :mod:`flyexplore.xray`); the core never imports this module. Needs ipywidgets >= 8 and
plotly's ``FigureWidget`` (plotly >= 6 builds it on anywidget): the ``notebook`` extra.

Threading. A sweep runs in a background thread so that the notebook stays responsive while it
runs (other cells execute, Stop can be clicked). The sweep thread never renders: each finished
row is appended to a list and a redraw is requested (:meth:`SweepPanel.add_row`, microseconds);
a second thread (``flyexplore-panel-ui``) applies the rows that arrived since its last pass a few
times per second (:data:`REDRAW_S`, stretched to :data:`REDRAW_FACTOR` x the last redraw's own
cost, so the UI takes a bounded share of the CPU and of the GIL from the sweep). A redraw
appends to the figure's existing traces inside ``batch_update`` (plotly's advice for live
figures; WebGL markers for large plans) and updates the geometric means with their intervals
(:func:`flyexplore.stats.geomean_ci`) and the verdict counts of the touched series only.
Widget updates are trait changes made from that thread; in ipykernel every IOPub message,
comm messages included, is handed to the kernel's IOPub thread to send
(``ipykernel.iostream.IOPubThread.send_multipart``), and a message sent from a user thread takes
the shell's parent header (``ipykernel.kernelbase.Kernel._get_shell_context_var``), so this is
safe without marshalling through the IOLoop. ``tests/test_notebooks.py`` checks that the
updates reach a real kernel's frontend state.

Results table: an ``itables`` grid (:class:`itables.widget.ITable`, DataTables in the browser)
-- chosen over ipydatagrid (last release 2024, pulls bqplot and py2vega) and perspective
(a WebAssembly engine and its own JupyterLab extension) because it is maintained, small, pure
Python, built on anywidget like plotly's ``FigureWidget`` (no further JupyterLab extension), and
pages, sorts and searches thousands of rows in the browser. Without itables (or anywidget) the
table is a paged HTML view. Long messages (an ``unavailable`` reason) are numbered once in the
notes below the table; rows show the number and the first words.
"""
from __future__ import annotations

import contextlib
import html
import math
import threading
import time
from typing import Any, Callable, ContextManager

import ipywidgets as W
import pandas as pd

from . import results as R
from .errors import UsageError, bad_choice
from .ops import get_op, list_ops

#: Suite dropdown entry for shapes typed into the shapes box.
CUSTOM = "(custom shapes)"
#: Suite chosen first when the sweep runs on the CPU.
CPU_SUITE = "cpu-small"
#: Columns of the results table, in order.
TABLE_COLUMNS = ("case", "dtype", "backend", "status", "speedup", "speedup_lo", "speedup_hi", "verdict",
                 "time_ms", "time_ci_lo_ms", "time_ci_hi_ms", "converged", "noisy", "tflops", "gbps",
                 "err_rel", "timing_mode", "clock_mhz_min", "message")

_TABLE_CSS = ("<style>.flyexplore-table{border-collapse:collapse;font-size:12px;line-height:1.35}"
              ".flyexplore-table th,.flyexplore-table td{padding:2px 8px;text-align:left;"
              "border-bottom:1px solid #e5e5e5;white-space:nowrap}"
              ".flyexplore-table td:last-child{white-space:normal;min-width:240px}</style>")
_COLORS = {"info": "#444", "ok": "#1a7f37", "error": "#b42318", "warn": "#9a6700"}


def _cell(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _fmt_seconds(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min"


#: Seconds between two redraws of the sweep panel while rows arrive.
REDRAW_S = 0.25
#: Seconds between two refreshes of the results table (a full resend of its rows) while rows arrive.
TABLE_S = 2.0
#: A redraw that took ``t`` seconds waits at least ``REDRAW_FACTOR * t`` (at most
#: :data:`REDRAW_MAX_S`) before the next one, so the panel's thread takes about 1/REDRAW_FACTOR of
#: a core (and of the GIL) from the sweep.
REDRAW_FACTOR = 20
#: The longest wait between two redraws while rows arrive (seconds).
REDRAW_MAX_S = 2.0
#: A plan with more rows than this draws WebGL markers (``Scattergl``) instead of SVG.
GL_POINTS = 400
#: A plan with at most this many rows writes each point's value and label letter.
TEXT_POINTS = 40
#: Rows per page of the paged table (used without itables).
PAGE_ROWS = 25
#: Messages longer than this are numbered in the notes under the table instead of repeated.
NOTE_CHARS = 60
#: Marker symbol of each verdict label (SAME is also outlined in black, as in speedup_figure).
SYMBOLS = {"FASTER": "triangle-up", "SAME": "circle", "SLOWER": "triangle-down", "AMBIGUOUS": "diamond"}
_INSTALL = "pip install anywidget itables (or pip install 'flyexplore[notebook]')"


def _missing_anywidget() -> str | None:
    """Why the live figure widget cannot be made (``None`` when anywidget imports)."""
    try:
        import anywidget  # noqa: F401 - plotly's FigureWidget and itables' grid are anywidgets
    except ImportError as exc:
        return f"anywidget is not installed ({exc})"
    return None


def _finite(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def case_speedups(rows: list[dict], baseline: str) -> list[dict]:
    """Speedups of one case (``rows``: the row dicts of one (op, case, dtype), as the sweep
    emits them) against ``baseline``, by the rules of :func:`flyexplore.results.speedup` without
    building a frame: only ``ok``/``published`` rows with a time and not ``flydsl_taken=False``;
    the speedup, interval and label a row carries when its sweep measured it against the same
    baseline in the same run (paired rounds), else :func:`flyexplore.results.ratio_interval` on
    the two rows' stored samples; the label by :func:`flyexplore.stats.verdict` with the row's
    ``band``. Returns one dict per non-baseline backend with ``backend, speedup, speedup_lo,
    speedup_hi, verdict, time_ms, baseline_ms`` (times in ms); empty without a baseline row."""
    from . import stats as S

    ok = [r for r in rows if r.get("status") in ("ok", "published") and _finite(r.get("time_ms")) > 0
          and r.get("flydsl_taken") is not False]
    base = [r for r in ok if r.get("backend") == baseline]
    if not base:
        return []
    b = base[-1]
    out = []
    for x in ok:
        if x.get("backend") == baseline:
            continue
        band = _finite(x.get("band"))
        band = band if band == band else S.BAND
        if (x.get("baseline") == baseline and _finite(x.get("speedup")) == _finite(x.get("speedup"))
                and x.get("run_id") is not None and x.get("run_id") == b.get("run_id")):
            est, lo, hi = _finite(x["speedup"]), _finite(x.get("speedup_lo")), _finite(x.get("speedup_hi"))
        else:
            est, lo, hi, _how = R.ratio_interval(pd.DataFrame([b]), pd.DataFrame([x]))
        published = "published" in (b.get("source"), x.get("source"))
        lab = "" if published and not (lo == lo and hi == hi) else S.verdict(lo, hi, band)
        out.append({"backend": x["backend"], "speedup": est, "speedup_lo": lo, "speedup_hi": hi,
                    "verdict": lab, "time_ms": _finite(x["time_ms"]), "baseline_ms": _finite(b["time_ms"])})
    return out


class _Series:
    """The points of one (dtype, backend) series of the live speedup figure."""

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
        from . import stats as S
        return S.geomean_ci(self.y, self.lo, self.hi)

    def counts(self) -> str:
        from . import stats as S
        return ", ".join(f"{self.lab.count(k)} {k}" for k in S.LABELS if k in self.lab)


class _Notes:
    """Long messages numbered once: a row shows ``[n]`` and the first words."""

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


class _GridTable:
    """The results table as an itables grid (see the module text)."""

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


class _PagedTable:
    """The results table as HTML pages of :data:`PAGE_ROWS` rows (without itables)."""

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
        self.html.value = f"{_TABLE_CSS}{body}"


class SweepPanel:
    """A sweep panel: choose an operator, a suite or shapes, dtypes and backends; Run and Stop;
    watch a progress bar, a speedup figure and a results table fill in as rows arrive; save.

    Display it by making it the last expression of a cell (or ``display(panel)``).

    Parameters (all optional; they set the initial control values): ``op`` (an operator of
    :func:`flyexplore.ops.list_ops`), ``suite`` or ``shapes`` (shape text such as
    ``"4096x4096x4096;8x4096x4096"``), ``dtypes`` and ``backends`` (lists or comma-separated
    text; default: the suite's dtypes, all backends; the default suite is ``cpu-small`` on a CPU,
    else the operator's first suite), ``baseline`` (the backend speedups are
    measured against; default: the one the operator registers as baseline, ``aten``), ``timer`` (options for
    :class:`~flyexplore.timing.Timer`, e.g. ``{"rep": 20, "warmup": 3}``), ``device`` (default:
    the first GPU, else the CPU), ``save_path`` (initial text of the save box). An invalid
    initial value raises :class:`UsageError`; invalid values typed into the panel show a
    message instead (:attr:`message`).

    Programmatic API (what the buttons call, for tests and scripts):

    - controls: :attr:`op`, :attr:`suite`, :attr:`shapes`, :attr:`dtypes`, :attr:`backends`,
      :attr:`baseline` (ipywidgets; set ``.value``), :attr:`run_button`, :attr:`stop_button`,
      :attr:`save_path`, :attr:`save_button` (``.click()``).
    - outputs: :attr:`progress` (IntProgress: ``value`` rows done of ``max``), :attr:`status`
      (rows done, the case now running, time left = mean seconds per finished row x rows
      left), :attr:`message` (HTML; errors and outcomes), :attr:`figure` (plotly
      ``FigureWidget``, live: one marker series per backend (and dtype), baseline time /
      backend time per case with its 95% interval as a whisker, the verdict label as the
      marker (and letter, for small plans), the geometric mean with its interval and the label
      counts in the legend; the statistics of :func:`flyexplore.plots.speedup_figure`, computed
      case by case (:func:`case_speedups`); without anywidget a plain ``go.Figure`` shown
      statically, with :attr:`notice` saying what to install), :attr:`table` (the results grid:
      itables, else a paged HTML view; :attr:`table_frame` is what it shows; times in ms,
      TFLOP/s, GB/s), :attr:`notes` (long messages, numbered once), :attr:`row_select` and
      :attr:`details` (one finished row, every column).
    - :meth:`plan`, :meth:`start`, :meth:`stop`, :meth:`wait`, :meth:`save`, :attr:`running`,
      :meth:`open_feed`, :meth:`add_row` (the sweep thread's per-row call), :meth:`close_feed`,
      :meth:`redraw`,
      :attr:`results` (a DataFrame of the rows so far, :mod:`flyexplore.results` schema),
      :attr:`widget` (the top-level ``VBox``).

    Extension points (used by later panels; each is exercised by the tests):

    - :meth:`add_section` appends a titled widget below the panel.
    - :meth:`add_context` registers a factory of context managers entered in the worker
      thread around the whole sweep (e.g. a switch that changes how torch dispatches).
    - :meth:`on_row`, :meth:`on_done` and :meth:`on_select` register callbacks for a finished
      row, the end of a sweep (with its DataFrame) and the row chosen in :attr:`row_select`.
    """

    def __init__(self, op: str = "gemm", *, suite: str | None = None, shapes: str | None = None,
                 dtypes=None, backends=None, baseline: str | None = None, timer: dict | None = None,
                 device=None, save_path: str = "sweep-results.parquet"):
        import plotly.graph_objects as go

        self.timer = dict(timer or {})
        self.device = device
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sync_depth = 0
        self._items: list = []
        self._t0 = 0.0
        # rows reach the UI through self._rows + self._wake; the UI thread draws them (see module)
        self._total = 0
        self._drawn = 0
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._ui: threading.Thread | None = None
        self._draw_lock = threading.RLock()
        self._next_draw = self._next_table = 0.0
        self._gl = self._text = False
        #: (rows drawn, seconds, table refreshed) of each redraw the UI thread made in this feed
        self.redraw_log: list[tuple[int, float, bool]] = []
        self._last_table = False
        self._reset_views()
        self._row_cbs: list[Callable[[dict], Any]] = []
        self._done_cbs: list[Callable[[pd.DataFrame], Any]] = []
        self._select_cbs: list[Callable[[dict], Any]] = []
        self._contexts: list[Callable[[], ContextManager]] = []

        wide = W.Layout(width="auto")
        self.op = W.Dropdown(options=list_ops(), value=get_op(op).name, description="operator")
        self.suite = W.Dropdown(options=[CUSTOM], description="suite")
        self.suite_info = W.HTML()
        self.shapes = W.Textarea(description="shapes", rows=5, layout=W.Layout(width="320px"),
                                 placeholder="one shape per line, e.g. 4096x4096x4096:NT")
        self.dtypes = W.SelectMultiple(description="dtypes", rows=5)
        self.backends = W.SelectMultiple(description="backends", rows=5)
        self.baseline = W.Dropdown(description="baseline")
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.stop_button = W.Button(description="Stop", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress")
        self.status = W.Label("idle")
        self.message = W.HTML()
        self.notice = W.HTML()
        missing = _missing_anywidget()
        if missing is None:
            self.figure = go.FigureWidget()
            self._static = None
        else:  # a plain figure, shown as a static plot in an Output, redrawn in full
            self.figure = go.Figure()
            self._static = W.Output()
        try:
            if missing is not None:
                raise ImportError(missing)
            self._table = _GridTable()
        except ImportError as exc:
            self._table = _PagedTable()
            missing = missing or f"itables is not installed ({exc})"
        if missing is not None:
            live = ("the figure below is static, redrawn in full (no live updates)"
                    if self._static is not None else "the figure is live")
            self.notice.value = _span(f"{missing}: {live}; the table is a {self._table.kind}. For the live "
                                      f"figure and the data grid: {_INSTALL}", "warn")
        self.table = self._table.widget
        self.notes = W.HTML()
        self.row_select = W.Dropdown(description="row", options=[], layout=W.Layout(width="600px"))
        self.details = W.HTML()
        self.save_path = W.Text(value=save_path, description="save to",
                                placeholder="results.parquet | .csv | .jsonl")
        self.save_button = W.Button(description="Save", icon="save")
        self._sections = W.VBox([])

        self.op.observe(lambda ch: self._load_op(), names="value")
        self.suite.observe(lambda ch: self._load_suite(), names="value")
        self.shapes.observe(self._shapes_edited, names="value")
        self.baseline.observe(lambda ch: self.redraw(full=True), names="value")
        self.row_select.observe(self._row_chosen, names="value")
        self.run_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())
        self.save_button.on_click(lambda _b: self.save())

        self._load_op()
        self._apply_initial(suite, shapes, dtypes, backends, baseline)
        self._draw_empty()
        self._inputs = (self.op, self.suite, self.shapes, self.dtypes, self.backends, self.run_button)
        self.widget = W.VBox([
            W.HBox([self.op, self.suite, self.baseline]),
            self.suite_info,
            W.HBox([self.shapes, self.dtypes, self.backends]),
            W.HBox([self.run_button, self.stop_button, self.progress, self.status]),
            self.message,
            self.notice,
            self.figure if self._static is None else self._static,
            W.HTML("<b>Results</b>"),
            self.table,
            self.notes,
            W.HBox([self.row_select]),
            self.details,
            W.HBox([self.save_path, self.save_button]),
            self._sections,
        ], layout=wide)

    # -- display -------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # -- control state -------------------------------------------------------------------
    def _operator(self):
        return get_op(self.op.value)

    def _suite_text(self, name: str) -> str:
        return "\n".join(c.label for c in self._operator().get_suite(name).cases)

    def _suite_dtypes(self, name: str) -> tuple[str, ...]:
        s = self._operator().get_suite(name)
        return tuple(d for d in self._operator().dtypes if d in {d for _, d in s.pairs()})

    def _load_op(self):
        """Fill suites, dtypes, backends and baseline from the chosen operator's registry."""
        op = self._operator()
        with self._sync():
            self.dtypes.options = op.dtypes
            self.backends.options = tuple(op.backends)
            self.backends.value = tuple(op.backends)
            base = [b.name for b in op.backends.values() if b.baseline] or list(op.backends)[:1]
            self.baseline.options = tuple(op.backends)
            self.baseline.value = base[0]
            self.suite.options = (*op.suites, CUSTOM)
            self.suite.value = self._default_suite(op)
        self._load_suite()

    def _default_suite(self, op) -> str:
        """``cpu-small`` when the sweep runs on the CPU (where the others take long), else the
        operator's first suite."""
        import torch

        from .sweep import default_device

        dev = torch.device(self.device) if self.device is not None else default_device()
        if dev.type == "cpu" and CPU_SUITE in op.suites:
            return CPU_SUITE
        return next(iter(op.suites), CUSTOM)

    def _load_suite(self):
        """Show the chosen suite's shapes and dtypes (a custom entry keeps the typed text)."""
        name = self.suite.value
        if name is None or name == CUSTOM:
            self.suite_info.value = "<i>custom shapes: edit the shapes box</i>"
            return
        s = self._operator().get_suite(name)
        with self._sync():
            self.shapes.value = self._suite_text(name)
            self.dtypes.value = self._suite_dtypes(name)
        self.suite_info.value = (f"<small>{html.escape(s.description)} "
                                 f"[{html.escape(s.source)}]</small>")

    @contextlib.contextmanager
    def _sync(self):
        """Mark control changes made by the panel itself (not typed by the user)."""
        self._sync_depth += 1
        try:
            yield
        finally:
            self._sync_depth -= 1

    def _shapes_edited(self, change):
        if self._sync_depth or self.suite.value in (None, CUSTOM):
            return
        if change["new"].strip() != self._suite_text(self.suite.value):
            self.suite.value = CUSTOM

    def _apply_initial(self, suite, shapes, dtypes, backends, baseline):
        op = self._operator()
        if suite is not None and shapes is not None:
            raise UsageError("give at most one of a suite and shapes")
        if suite is not None:
            self.suite.value = op.get_suite(suite).name
        if shapes is not None:
            self.suite.value = CUSTOM
            self.shapes.value = shapes if isinstance(shapes, str) else "\n".join(shapes)
        if dtypes is not None:
            ds = [d.strip() for d in dtypes.split(",")] if isinstance(dtypes, str) else list(dtypes)
            self.dtypes.value = tuple(op.check_dtype(d) for d in ds)
        if backends is not None:
            bs = [b.strip() for b in backends.split(",")] if isinstance(backends, str) else list(backends)
            self.backends.value = tuple(op.get_backend(b).name for b in bs)
        if baseline is not None:
            self.baseline.value = op.get_backend(baseline).name

    # -- plan and run --------------------------------------------------------------------
    def _sweep_args(self) -> dict:
        op = self._operator()
        if not self.backends.value:
            raise UsageError(f"select at least one backend (valid: {', '.join(op.backends)})")
        if not self.dtypes.value:
            raise UsageError(f"select at least one dtype (valid: {', '.join(op.dtypes)})")
        args: dict[str, Any] = {"op": op.name, "backends": list(self.backends.value)}
        if self.suite.value != CUSTOM:
            args["suite"] = self.suite.value
            # The suite's own dtypes keep its per-case pairing (published suites name a dtype
            # per case); another selection runs every case in every selected dtype.
            if tuple(self.dtypes.value) != self._suite_dtypes(self.suite.value):
                args["dtypes"] = list(self.dtypes.value)
        else:
            args["shapes"] = self.shapes.value
            args["dtypes"] = list(self.dtypes.value)
        return args

    def plan(self):
        """The :class:`~flyexplore.sweep.Plan` the current controls describe.
        Raises :class:`UsageError` for invalid input (message names the bad value)."""
        from .sweep import make_plan

        a = self._sweep_args()
        return make_plan(a["op"], a.get("suite"), a.get("shapes"), a.get("dtypes"), a["backends"])

    @property
    def running(self) -> bool:
        """True while a sweep's worker thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """What Run does: validate the controls, then run the sweep in a background thread.
        Returns ``True`` if a sweep started; ``False`` (with :attr:`message` saying why) for
        invalid input or while a sweep is running. Earlier rows are replaced."""
        if self.running:
            self._say("a sweep is already running; Stop it first", "warn")
            return False
        try:
            args = self._sweep_args()
            plan = self.plan()
        except UsageError as exc:
            self._say(str(exc), "error")
            return False
        self._items = [(c.label, d, b) for c, d, b in plan.items()]
        self._stop.clear()
        self.open_feed(len(plan))
        for w in self._inputs:
            w.disabled = True
        self.stop_button.disabled = False
        self._t0 = time.perf_counter()
        self._set_status()
        self._say(f"running {len(plan)} runs of {plan.op.name} "
                  f"({len(plan.pairs)} cases x dtypes, {len(plan.backends)} backends)", "info")
        self._thread = threading.Thread(target=self._work, args=(args,), daemon=True,
                                        name="flyexplore-sweep")
        self._thread.start()
        return True

    def stop(self) -> None:
        """What Stop does: end the sweep after the current case; finished rows are kept."""
        if self.running:
            self._stop.set()
            self.stop_button.disabled = True
            self._say("stopping after the current case...", "warn")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running sweep (if any) ends, at most ``timeout`` seconds.
        Returns ``True`` if no sweep is running afterwards."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.running

    def _work(self, args: dict) -> None:
        from .sweep import run_sweep

        df, failure = None, None
        try:
            with contextlib.ExitStack() as stack:
                for factory in list(self._contexts):
                    stack.enter_context(factory())
                df = run_sweep(**args, device=self.device, timer=self.timer, progress=False,
                               on_row=self.add_row, should_stop=self._stop.is_set)
        except UsageError as exc:
            failure = (str(exc), "error")
        except Exception as exc:  # shown in the panel; finished rows are kept
            lines = str(exc).strip().splitlines()
            failure = (f"sweep failed: {type(exc).__name__}: {lines[0] if lines else ''}", "error")
        self.close_feed()
        self._finish(df, failure)

    def _finish(self, df, failure) -> None:
        n = len(self._rows)
        for w in self._inputs:
            w.disabled = False
        self.stop_button.disabled = True
        elapsed = time.perf_counter() - self._t0
        if failure:
            self.progress.bar_style = "danger"
            self._say(f"{failure[0]} ({n} finished rows kept)", failure[1])
        elif self._stop.is_set() and n < len(self._items):
            self.progress.bar_style = "warning"
            self._say(f"stopped after {n} of {len(self._items)} runs; finished rows kept", "warn")
        else:
            self.progress.bar_style = "success"
            bad = sum(1 for r in self._rows if r.get("status") in ("error", "oom"))
            una = sum(1 for r in self._rows if r.get("status") == "unavailable")
            self._say(f"done: {n} rows in {_fmt_seconds(elapsed)} ({una} unavailable, "
                      f"{bad} failed; see the table)", "ok")
        self.status.value = f"{n}/{len(self._items)} in {_fmt_seconds(elapsed)}"
        frame = self.results if df is None else df
        for cb in list(self._done_cbs):
            self._call(cb, frame)

    def _set_status(self) -> None:
        done, total = len(self._rows), len(self._items) or self._total
        text = f"{done}/{total}"
        if done < len(self._items):
            label, dtype, backend = self._items[done]
            text += f" - now {label} {dtype} {backend}"
            if done:
                left = (time.perf_counter() - self._t0) / done * (total - done)
                text += f" - about {_fmt_seconds(left)} left"
        self.status.value = text

    @staticmethod
    def _row_label(row: dict) -> str:
        t = row.get("time_ms")
        tt = f" {t:.4g} ms" if isinstance(t, (int, float)) and not math.isnan(t) else ""
        return f"{row['case']} {row['dtype']} {row['backend']}: {row['status']}{tt}"

    def _call(self, cb, arg) -> None:
        try:
            cb(arg)
        except Exception as exc:  # a listener's bug must not end the sweep
            self._say(f"callback {getattr(cb, '__name__', cb)!s} failed: "
                      f"{type(exc).__name__}: {exc}", "error")

    # -- outputs -------------------------------------------------------------------------
    @property
    def results(self) -> pd.DataFrame:
        """The rows finished so far (or in the last sweep), as a normalized result set."""
        with self._lock:
            rows = list(self._rows)
        return R.frame(rows)

    def _say(self, text: str, kind: str = "info") -> None:
        color = _COLORS.get(kind, _COLORS["info"])
        self.message.value = (f'<span style="color:{color}">{html.escape(text, quote=False)}</span>'
                              if text else "")

    def _draw_empty(self, title: str | None = None) -> None:
        self._trace_of = {}
        self._dirty = set(self._series)
        with self.figure.batch_update():
            self.figure.data = ()
            # the look of plotly_white, set directly: validating the template costs ~0.1 s a time
            self.figure.layout = dict(title=dict(text=title or "speedup: no rows yet"), height=420,
                                      paper_bgcolor="white", plot_bgcolor="white",
                                      font=dict(family="Arial, Helvetica, sans-serif", size=12),
                                      xaxis=dict(gridcolor="#EBF0F8", zerolinecolor="#EBF0F8"),
                                      yaxis=dict(gridcolor="#EBF0F8", zerolinecolor="#EBF0F8"))

    # -- rows to the UI ------------------------------------------------------------------
    def _reset_views(self) -> None:
        self._by_case: dict[tuple, list[dict]] = {}
        self._series: dict[tuple[str, str], _Series] = {}
        self._trace_of: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._table_rows: list[dict] = []
        self._options: list[tuple[str, int]] = []
        self._notes = _Notes()
        self._table_due = False
        self._dtypes: set[str] = set()

    def open_feed(self, total: int) -> None:
        """Start showing a new set of rows (what Run does before its sweep starts): clear the
        rows, figure, table and notes, and start the panel's UI thread, which applies the rows
        given to :meth:`add_row` a few times per second (see the module text). ``total``: rows
        expected (progress bar; above :data:`GL_POINTS` the figure uses WebGL markers, up to
        :data:`TEXT_POINTS` it writes values). Ends a feed still open."""
        self.close_feed(draw=False)
        from scipy.stats import norm  # noqa: F401 - imported here, not in the first redraw (geomean_ci)
        with self._draw_lock:
            with self._lock:
                self._rows = []
            self._drawn = 0
            self.redraw_log = []
            self._total = int(total)
            self._gl, self._text = total > GL_POINTS, total <= TEXT_POINTS
            self._reset_views()
            self.progress.max = max(1, self._total)
            self.progress.value = 0
            self.progress.bar_style = ""
            self.row_select.options = []
            self.details.value = ""
            self.notes.value = ""
            self._table.show([])
            self._draw_empty()
        self._wake.clear()
        self._closing.clear()
        self._next_draw = self._next_table = 0.0
        self._ui = threading.Thread(target=self._ui_loop, daemon=True, name="flyexplore-panel-ui")
        self._ui.start()

    def add_row(self, row: dict) -> None:
        """Take one finished row (a dict of result columns): what the sweep's thread calls for
        each row (``run_sweep(on_row=...)``). Only appends the row and wakes the UI thread
        (microseconds; the sweep never waits on rendering), then calls the :meth:`on_row`
        callbacks in the caller's thread."""
        with self._lock:
            self._rows.append(row)
        self._wake.set()
        for cb in list(self._row_cbs):
            self._call(cb, row)

    def close_feed(self, draw: bool = True) -> float:
        """Stop the UI thread, then (``draw``) redraw once in full with every row, table and
        notes included (what the end of a sweep does; a full redraw re-sends the figure, so a
        browser view that missed an update while it was being created ends right). Returns the
        seconds that last redraw took."""
        ui = self._ui
        if ui is not None:
            self._closing.set()
            self._wake.set()
            ui.join()
            self._ui = None
        return self.redraw(full=True, final=True) if draw else 0.0

    def _ui_loop(self) -> None:
        while True:
            self._wake.wait()
            wait = self._next_draw - time.perf_counter()
            if self._closing.is_set() or (wait > 0 and self._closing.wait(wait)):
                return
            self._wake.clear()
            try:
                cost = self.redraw()
                self.redraw_log.append((self._drawn, cost, self._last_table))
            except Exception as exc:  # a drawing bug must not end the sweep
                cost = REDRAW_S
                self._say(f"panel redraw failed: {type(exc).__name__}: {exc}", "error")
            self._next_draw = time.perf_counter() + min(REDRAW_MAX_S, max(REDRAW_S, REDRAW_FACTOR * cost))

    def redraw(self, full: bool = False, final: bool = False, table: bool | None = None) -> float:
        """Apply the rows that arrived since the last redraw: progress, status, the figure's
        touched series (appended in one ``batch_update``), their geometric means and label
        counts; the table, notes and row list at most every :data:`TABLE_S` seconds (always
        with ``final``; ``table`` True/False: now/not this time). ``full``: recompute every speedup and redraw the figure from all rows
        (what changing the baseline does). Called by the UI thread; safe from any thread.
        Returns the seconds it took."""
        t0 = time.perf_counter()
        self._last_table = False
        with self._draw_lock:
            with self._lock:
                new = self._rows[self._drawn:]
                n = len(self._rows)
            self._drawn = n
            self.progress.value = n
            self._set_status()
            touched: dict[tuple[str, str], None] = {}  # in arrival order: points append in case order
            for row in new:
                key = (str(row.get("case")), str(row.get("dtype")))
                self._by_case.setdefault(key, []).append(row)
                self._dtypes.add(key[1])
                touched[key] = None
                self._table_rows.append(self._display_row(row))
                self._options.append((self._row_label(row), len(self._options)))
            if new:
                self._table_due = True
            if full:
                self._series, self._trace_of, self._dirty = {}, {}, set()
                touched = dict.fromkeys(self._by_case)
            base = self.baseline.value
            for key in touched:
                for sp in case_speedups(self._by_case[key], base):
                    sk = (key[1], sp["backend"])
                    s = self._series.get(sk)
                    if s is None:
                        s = self._series[sk] = _Series(*sk)
                    s.put(self._x_label(key), sp, base)
                    self._dirty.add(sk)
            time.sleep(0)  # let a sweep thread that waits for the GIL run now, not after 5 ms
            self._draw_figure(rebuild=full)
            time.sleep(0)
            now = time.perf_counter()
            if table or (table is None and self._table_due and (final or full or now >= self._next_table)):
                self._table.show(list(self._table_rows))
                self.notes.value = self._notes.html()
                self.row_select.options = list(self._options)
                self._table_due = False
                if self._static is not None:
                    self._show_static()
                self._next_table = time.perf_counter() + min(
                    5 * REDRAW_MAX_S, max(TABLE_S, REDRAW_FACTOR * (time.perf_counter() - now)))
                self._last_table = True
            elif final and self._static is not None:
                self._show_static()
        return time.perf_counter() - t0

    def _x_label(self, key: tuple[str, str]) -> str:
        return f"{key[0]} {key[1]}" if self._multi_dtype() else key[0]

    def _multi_dtype(self) -> bool:
        return len({d for _, d, _ in self._items}) > 1

    def _display_row(self, row: dict) -> dict:
        return {c: (self._notes.short(row.get(c)) if c == "message" else _cell(row.get(c)))
                for c in TABLE_COLUMNS}

    @property
    def table_frame(self) -> pd.DataFrame:
        """The rows the table shows (text cells; long messages as ``[n] first words…``)."""
        return self._table.frame

    def _show_static(self) -> None:
        import json

        data = {"application/vnd.plotly.v1+json": json.loads(self.figure.to_json()),
                "text/plain": f"<speedup figure: {len(self.figure.data)} series>"}
        self._static.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)

    def _draw_figure(self, rebuild: bool = False) -> None:
        import plotly.graph_objects as go

        from . import stats as S
        from .plots import backend_color

        fig = self.figure
        base = self.baseline.value
        if not self._series:
            if rebuild or self._drawn:
                self._draw_empty(f"speedup: waiting for a {base} row" if self._drawn else None)
            return
        if rebuild or not self._trace_of:
            self._draw_empty()
            fig.update_layout(legend=dict(title_text="backend", orientation="h", x=0, y=1.0, xanchor="left",
                                          yanchor="bottom"),
                              showlegend=True, height=520, margin=dict(l=60, r=20, t=170, b=60),
                              hoverlabel=dict(align="left"),
                              xaxis=dict(type="category", title_text="case", automargin=True),
                              yaxis=dict(rangemode="tozero", title_text=f"speedup vs {base} (x)"))
        new = [k for k in self._series if k not in self._trace_of]
        if new:
            cls = go.Scattergl if self._gl else go.Scatter
            fig.add_traces([cls(mode="markers+text" if self._text else "markers", legendgroup=k[1],
                                marker=dict(color=backend_color(k[1]), size=9, line=dict(color="black")),
                                error_y=dict(type="data", symmetric=False, color="#333", thickness=1.2, width=3),
                                textposition="top center", textfont=dict(size=10), hoverinfo="text")
                            for k in new])
            for i, k in enumerate(new):
                self._trace_of[k] = len(fig.data) - len(new) + i
        single = len(self._dtypes) <= 1 and not self._multi_dtype()
        means, shapes = [], [dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                                  line=dict(color="#555", dash="dash", width=1.5))]
        # the touched series' arrays in one restyle: plotly_restyle sets the figure's trace data
        # without validating every element again (2,000 points: ~1 ms instead of ~100 ms)
        keys = ("name", "x", "y", "error_y.array", "error_y.arrayminus", "marker.symbol", "marker.line.width",
                "hovertext") + (("text",) if self._text else ())
        upd: dict[str, list] = {k: [] for k in keys}
        idx = []
        for k, s in self._series.items():
            gm, glo, ghi = s.geomean()
            gtxt = S.fmt_interval(gm, glo, ghi).replace(" [no interval]", "")
            name = f"{s.backend}: geomean {gtxt}" if single else f"{s.backend} {s.dtype}: geomean {gtxt}"
            means.append(name.replace(": geomean", " geomean"))
            if single and gm == gm:
                shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=gm, y1=gm,
                                   line=dict(color=backend_color(s.backend), dash="dot", width=1.5)))
            if k not in self._dirty:
                continue
            counts = s.counts()
            y = s.y
            idx.append(self._trace_of[k])
            for key, v in (("name", name + (f" ({counts})" if counts else "")), ("x", list(s.x)), ("y", list(y)),
                           ("error_y.array", [h - v if h == h and h > v else 0.0 for v, h in zip(y, s.hi)]),
                           ("error_y.arrayminus", [v - lo if lo == lo and v > lo else 0.0 for v, lo in zip(y, s.lo)]),
                           ("marker.symbol", [SYMBOLS.get(lab, "circle") for lab in s.lab]),
                           ("marker.line.width", [2 if lab == "SAME" else 0 for lab in s.lab]),
                           ("hovertext", list(s.hover)),
                           ("text", [f"{v:.2f} {lab[:1]}".rstrip() for v, lab in zip(y, s.lab)])):
                if key in upd:
                    upd[key].append(v)
        self._dirty = set()
        if idx:
            fig.plotly_restyle(upd, trace_indexes=idx)
        with fig.batch_update():
            gms = "; ".join(means) if len(means) <= 4 else f"geomeans of {len(means)} series in the legend"
            npts = sum(len(s.x) for s in self._series.values())
            fig.layout.title.text = (
                f"Speedup over {html.escape(base)} ({npts} points)<br><sup>baseline time / backend time per "
                "case; higher is better; whiskers: 95% interval; dashed: 1.0x, dotted: geomean<br>"
                "marker: ▲ FASTER, ● SAME (outlined: interval within ±1%), ▼ SLOWER, ◆ AMBIGUOUS"
                f"<br>{html.escape(gms)}</sup>")
            fig.layout.title.y, fig.layout.title.yanchor = 0.98, "top"
            fig.layout.shapes = shapes

    def _row_chosen(self, change) -> None:
        i = change["new"]
        if i is None:
            self.details.value = ""
            return
        row = self.selected_row
        items = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
                        f"<td>{html.escape(str(v))}</td></tr>"
                        for k, v in row.items() if v is not None and v == v)
        self.details.value = f'<div style="max-height:260px;overflow:auto"><table>{items}</table></div>'
        for cb in list(self._select_cbs):
            self._call(cb, row)

    @property
    def selected_row(self) -> dict | None:
        """The row chosen in :attr:`row_select` (a dict of its columns), or ``None``."""
        i = self.row_select.value
        with self._lock:
            return dict(self._rows[i]) if i is not None and i < len(self._rows) else None

    def save(self, path: str | None = None):
        """What Save does: write :attr:`results` to ``path`` (default: the save box) with
        :func:`flyexplore.results.save` (.parquet, .csv or .jsonl). Returns the path, or
        ``None`` with :attr:`message` saying why nothing was written."""
        path = path if path is not None else self.save_path.value.strip()
        df = self.results
        if df.empty:
            self._say("nothing to save yet: run a sweep first", "warn")
            return None
        if not path:
            self._say("type a file name to save to (.parquet, .csv or .jsonl)", "error")
            return None
        try:
            p = R.save(df, path)
        except UsageError as exc:
            self._say(str(exc), "error")
            return None
        self._say(f"saved {len(df)} rows to {p}", "ok")
        return p

    # -- extension points ----------------------------------------------------------------
    def add_section(self, title: str, widget: W.Widget) -> W.Widget:
        """Append ``widget`` under a bold ``title`` below the panel; returns ``widget``."""
        self._sections.children = (*self._sections.children,
                                   W.HTML(f"<b>{html.escape(title)}</b>"), widget)
        return widget

    def add_context(self, factory: Callable[[], ContextManager]) -> None:
        """Enter ``factory()`` in the worker thread around every later sweep (in the order
        added; exited in reverse). An exception from it ends that sweep with a message."""
        self._contexts.append(factory)

    def on_row(self, callback: Callable[[dict], Any]) -> None:
        """Call ``callback(row)`` (a dict of result columns) in the worker thread after each
        finished row. An exception in it shows a message; the sweep goes on."""
        self._row_cbs.append(callback)

    def on_done(self, callback: Callable[[pd.DataFrame], Any]) -> None:
        """Call ``callback(df)`` after each sweep ends (done, stopped or failed)."""
        self._done_cbs.append(callback)

    def on_select(self, callback: Callable[[dict], Any]) -> None:
        """Call ``callback(row)`` when a row is chosen in :attr:`row_select`."""
        self._select_cbs.append(callback)


def environment_view(env=None) -> W.HTML:
    """The environment report as an HTML widget: platform, devices, versions and, for each
    FlyDSL path (eager overrides, compile templates, the compile-only kernel X-ray), every
    readiness check with its fix.
    ``env`` defaults to :func:`flyexplore.env.collect()`."""
    from .env import collect

    env = env or collect()
    e = html.escape
    parts = [f"<b>platform</b>: {e(env.platform)}<br>"]
    unit = {"rocm": "CUs", "cuda": "SMs"}.get(env.platform, "cores")
    for d in env.devices:
        mem = f"{d.memory_bytes / 2**30:.1f} GiB" if d.memory_bytes else "?"
        parts.append(f"<b>device {d.index}</b>: {e(d.name)} ({e(d.arch)}), "
                     f"{d.compute_units} {unit}, {mem}<br>")
    parts.append("<b>versions</b>: " + ", ".join(f"{e(k)} {e(str(v) or 'none')}"
                                                 for k, v in env.versions.items()))
    parts.append(f"<br><b>FlyDSL target arch</b>: {e(env.target_arch or 'none')} "
                 f"(from {e(env.target_arch_source)})")
    for r in (env.flydsl_eager, env.flydsl_compile, getattr(env, "flydsl_xray", None)):
        if r is None:
            continue
        verdict = ('<span style="color:#1a7f37">READY</span>' if r.ready
                   else '<span style="color:#b42318">not available</span>')
        rows = "".join(
            f"<tr><td style='color:{_COLORS['ok'] if c.ok else _COLORS['error']}'>"
            f"{'&#10003;' if c.ok else '&#10007;'}</td><td>{e(c.name)}</td>"
            f"<td>{e(c.detail)}</td><td>{e(c.fix) if (c.fix and not c.ok) else ''}</td></tr>"
            for c in r.checks)
        parts.append(f"<h4>FlyDSL {e(r.path)}: {verdict}</h4><table class='flyexplore-table'>"
                     f"<tr><th></th><th>check</th><th>detail</th><th>fix</th></tr>{rows}</table>")
    return W.HTML(_TABLE_CSS + "".join(parts))


# -- shared helpers for the panels below -----------------------------------------------------

def _frame_html(df: pd.DataFrame, max_height: int = 320) -> str:
    """A DataFrame as the panels' table style (floats to 4 significant digits)."""
    t = pd.DataFrame({c: [_cell(v) for v in df[c]] for c in df.columns})
    body = t.to_html(index=False, escape=True, classes="flyexplore-table", border=0)
    return f'{_TABLE_CSS}<div style="max-height:{max_height}px;overflow:auto">{body}</div>'


def _span(text: str, kind: str = "info") -> str:
    return (f'<span style="color:{_COLORS.get(kind, _COLORS["info"])}">'
            f'{html.escape(str(text), quote=False)}</span>') if text else ""


class _Sync:
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


# -- the switch panel ------------------------------------------------------------------------

class SwitchPanel:
    """FlyDSL on/off per operator, FlyDSL's compile settings and the SDPA settings, over
    :mod:`flyexplore.switches`, with the live state of every switch.

    Display it by making it the last expression of a cell. Every change of a control changes
    torch's real settings at once (python_native filter sets, ``torch._inductor.config``,
    ``torch.backends.cuda`` SDPA flags and ROCm FA preference) and the panel then re-reads all
    of them (:func:`flyexplore.switches.states` / :func:`~flyexplore.switches.table`), so the
    controls and the state table always show what torch will do -- also the knock-on effects
    (``gemm``, ``grouped_gemm`` and ``scaled_gemm`` share one torch setting; turning FlyDSL
    attention on enables flash and efficient SDPA). A switch this torch cannot turn on
    (:func:`flyexplore.switches.unavailable`: torch 2.11 has no python_native and no FlyDSL
    templates; a CUDA build has no AOTriton) is disabled with the reason beside it; a switch
    that exists but cannot change what runs here (torch 2.15 on CUDA or without gfx950) stays
    usable and says "no effect here".

    Controls: :attr:`toggles` (operator -> ``Checkbox``), :attr:`autotuning` (``Checkbox``:
    ``flydsl_enable_autotuning``), :attr:`search_space` (``Dropdown``: DEFAULT / EXHAUSTIVE),
    :attr:`sdpa` (SDPA backend name -> ``Checkbox``), :attr:`rocm_fa` (``Dropdown``:
    aotriton / ck / default), :attr:`refresh_button`, :attr:`restore_button`. Outputs:
    :attr:`notes` (operator -> ``HTML``: state and reason), :attr:`gemm_backends` (``HTML``:
    ``max_autotune_gemm_backends`` and max-autotune), :attr:`table` (``HTML``: the state table),
    :attr:`message` (``HTML``: the outcome of the last change, warnings included).

    Programmatic API: set a control's ``.value`` (what a click does), :meth:`refresh`,
    :meth:`restore` (every switch back as found when the panel was made), :attr:`settings`
    (the :class:`flyexplore.switches.Settings` the controls show), :meth:`apply`,
    :meth:`context` (a context manager running code under these settings and restoring
    afterwards), :meth:`attach` (feed a :class:`SweepPanel`: its sweeps run under the chosen
    switches, and the panel appears below it), :attr:`widget`.
    """

    def __init__(self):
        from . import switches as S

        self.initial = S.snapshot()
        self._sync = _Sync()
        self._locked = False
        self.toggles = {op: W.Checkbox(description=op, indent=False, layout=W.Layout(width="130px"))
                        for op in S.OPS}
        self.notes = {op: W.HTML(layout=W.Layout(width="auto")) for op in S.OPS}
        self.autotuning = W.Checkbox(description="flydsl_enable_autotuning", indent=False)
        self.search_space = W.Dropdown(options=("DEFAULT", "EXHAUSTIVE"), description="search space",
                                       style={"description_width": "initial"})
        self.gemm_backends = W.HTML()
        self.compile_note = W.HTML()
        self.sdpa = {n: W.Checkbox(description=n, indent=False, layout=W.Layout(width="130px"))
                     for n in S.SDPA_BACKENDS}
        self.rocm_fa = W.Dropdown(options=S.ROCM_FA_LIBRARIES, description="ROCm FA library",
                                  style={"description_width": "initial"})
        self.sdpa_note = W.HTML()
        self.refresh_button = W.Button(description="Refresh", icon="refresh",
                                       tooltip="re-read every switch from torch")
        self.restore_button = W.Button(description="Restore", icon="undo",
                                       tooltip="every switch back as it was when this panel was made")
        self.message = W.HTML()
        self.table = W.HTML()

        for op, cb in self.toggles.items():
            cb.observe(self._on(lambda ch, op=op: S.set_flydsl([op], ch["new"]),
                                lambda ch, op=op: f"FlyDSL {'on' if ch['new'] else 'off'} for {op}"), names="value")
        self.autotuning.observe(self._on(lambda ch: S.set_compile_settings(autotuning=ch["new"]),
                                         lambda ch: f"flydsl_enable_autotuning={ch['new']}"), names="value")
        self.search_space.observe(self._on(lambda ch: S.set_compile_settings(search_space=ch["new"]),
                                           lambda ch: f"max_autotune_gemm_search_space={ch['new']}"), names="value")
        for n, cb in self.sdpa.items():
            cb.observe(self._on(lambda ch: S.set_sdpa([k for k, c in self.sdpa.items() if c.value]),
                                lambda ch, n=n: f"SDPA {n} {'enabled' if ch['new'] else 'disabled'}"), names="value")
        self.rocm_fa.observe(self._on(lambda ch: S.set_sdpa(rocm_fa_library=ch["new"]),
                                      lambda ch: f"preferred_rocm_fa_library={ch['new']}"), names="value")
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.restore_button.on_click(lambda _b: self.restore())

        self.refresh()
        rows = [W.HBox([self.toggles[op], self.notes[op]]) for op in S.OPS]
        self.widget = W.VBox([
            W.HTML("<b>FlyDSL per operator</b>"), *rows,
            W.HTML("<b>Compiled GEMMs</b> (torch.compile max-autotune; one setting for gemm, grouped_gemm "
                   "and scaled_gemm)"),
            W.HBox([self.autotuning, self.search_space]), self.gemm_backends, self.compile_note,
            W.HTML("<b>SDPA</b> (backends allowed; on ROCm the preferred flash-attention library)"),
            W.HBox([*self.sdpa.values(), self.rocm_fa]), self.sdpa_note,
            W.HBox([self.refresh_button, self.restore_button]), self.message,
            W.HTML("<b>State of every switch</b>"), self.table,
        ], layout=W.Layout(width="auto"))

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def _on(self, action: Callable, what: Callable):
        """An observer: run ``action(change)`` through the library, say what happened (with any
        warning the library gave), then re-read every switch."""
        import warnings

        def handler(change):
            if self._sync.depth:
                return
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    action(change)
                except UsageError as exc:
                    self._say(str(exc), "error")
                    self.refresh(keep_message=True)
                    return
            warned = "; ".join(str(w.message) for w in caught)
            self._say(f"nothing changed: {warned}" if warned else what(change), "warn" if warned else "ok")
            self.refresh(keep_message=True)
        return handler

    def _say(self, text: str, kind: str = "info") -> None:
        self.message.value = _span(text, kind)

    @property
    def settings(self):
        """The :class:`flyexplore.switches.Settings` the controls show (disabled controls --
        switches this torch cannot turn on -- are left out)."""
        from . import switches as S

        fly = {op: cb.value for op, cb in self.toggles.items() if not self._unavailable.get(op)}
        comp = "compile_settings" not in self._unavailable
        return S.Settings(fly, self.autotuning.value if comp else None,
                          self.search_space.value if comp else None,
                          tuple(n for n, cb in self.sdpa.items() if cb.value),
                          None if "rocm_fa_library" in self._unavailable else self.rocm_fa.value)

    def refresh(self, keep_message: bool = False) -> None:
        """Re-read every switch from torch into the controls, the notes and the state table."""
        from torch._inductor import config as ic

        from . import switches as S

        self._unavailable = S.unavailable()
        states = {st.op: st for st in S.states()}
        now = S.settings()
        with self._sync():
            for op, cb in self.toggles.items():
                st = states[op]
                cb.value = st.flydsl in ("on", "possible")
                cb.disabled = self._locked or op in self._unavailable
                if op in self._unavailable:
                    note = _span(f"unavailable: {self._unavailable[op]}", "error")
                else:
                    kind = "ok" if st.effective else "warn"
                    note = (f"<b>{html.escape(st.flydsl)}</b> " + _span(st.note, kind)) if st.note else \
                        f"<b>{html.escape(st.flydsl)}</b>"
                self.notes[op].value = f"<small>{note}</small>"
            comp_missing = self._unavailable.get("compile_settings")
            self.autotuning.value = bool(getattr(ic, "flydsl_enable_autotuning", False))
            ss = str(getattr(ic, "max_autotune_gemm_search_space", "DEFAULT")).upper()
            self.search_space.value = ss if ss in self.search_space.options else "DEFAULT"
            for w in (self.autotuning, self.search_space):
                w.disabled = self._locked or bool(comp_missing)
            self.gemm_backends.value = (f"<small><code>max_autotune_gemm_backends = "
                                        f"{html.escape(repr(ic.max_autotune_gemm_backends))}</code>; "
                                        f"max_autotune={ic.max_autotune}, max_autotune_gemm={ic.max_autotune_gemm}"
                                        "</small>")
            self.compile_note.value = f"<small>{_span(f'unavailable: {comp_missing}', 'error')}</small>" \
                if comp_missing else ""
            on = set(now.sdpa_backends or ())
            for n, cb in self.sdpa.items():
                cb.value = n in on
                cb.disabled = self._locked
            fa_missing = self._unavailable.get("rocm_fa_library")
            fa = now.rocm_fa_library or S.rocm_fa_library()
            if fa in self.rocm_fa.options:
                self.rocm_fa.value = fa
            self.rocm_fa.disabled = self._locked or bool(fa_missing)
            notes = []
            if not on:
                notes.append(_span("no SDPA backend enabled: F.scaled_dot_product_attention will raise", "warn"))
            if fa_missing:
                notes.append(_span(f"ROCm FA library unavailable: {fa_missing}", "error"))
            self.sdpa_note.value = "<small>" + "<br>".join(notes) + "</small>"
        cols = ["op", "flydsl", "effective", "mechanism", "setting"]  # notes are beside the toggles
        self.table.value = _frame_html(S.table()[cols], max_height=420)
        if not keep_message:
            self._say("")

    def apply(self, settings) -> None:
        """Put every switch to ``settings`` (:func:`flyexplore.switches.apply_settings`) and
        refresh. Raises :class:`UsageError` for inconsistent settings."""
        from . import switches as S

        S.apply_settings(settings, warn=False)
        self.refresh()

    def restore(self) -> None:
        """What Restore does: every switch back to the state found when the panel was made
        (:func:`flyexplore.switches.restore`)."""
        from . import switches as S

        S.restore(self.initial)
        self.refresh()
        self._say("every switch restored to the state found when this panel was made", "ok")

    def _lock(self, on: bool) -> None:
        self._locked = on
        self.refresh(keep_message=True)

    @contextlib.contextmanager
    def context(self):
        """Context manager: code inside runs under the switches the panel shows
        (:func:`flyexplore.switches.using`, applied again in case something changed them since);
        afterwards every switch is as it was before. The controls are disabled meanwhile (a
        sweep must not see its switches change half-way)."""
        from . import switches as S

        chosen = self.settings
        self._lock(True)
        self._say("a sweep is running under these switches; controls are locked until it ends", "info")
        try:
            with S.using(chosen) as snap:
                yield snap
        finally:
            self._lock(False)
            self._say("")

    def attach(self, panel: "SweepPanel") -> "SwitchPanel":
        """Feed ``panel``: its sweeps run under the switches chosen here (``panel.add_context``),
        and this panel is shown below it (``panel.add_section``). Returns ``self``."""
        panel.add_context(self.context)
        panel.add_section("FlyDSL switches", self.widget)
        return self


# -- the dispatch inspector ------------------------------------------------------------------

#: Arch dropdown entry for "judge this process's real environment".
THIS_MACHINE = "this machine"
#: Columns of the X-ray resource table.
XRAY_COLUMNS = ("kernel", "family", "vgprs_total", "agprs", "sgprs", "vgpr_spills", "sgpr_spills",
                "scratch_bytes", "lds_bytes", "workgroup_size", "waves_per_simd", "occupancy", "limited_by",
                "inst_total", "compile_s")


class DispatchInspector:
    """Will this call take FlyDSL, and if not, why not? What really ran? What does the FlyDSL
    kernel cost in registers and LDS on gfx950?

    Pick a case -- operator (those :mod:`flyexplore.explain` covers), shape (the operator
    catalogue's syntax, e.g. ``8192x4096``), dtype, explainer options (``key=value; ...``:
    strides, offsets, bias, ...) -- or take one from a :class:`SweepPanel` row (:meth:`attach`,
    :meth:`show_row`), and see:

    - the verdict and every condition torch 2.15 applies, in words with its torch source
      (:func:`flyexplore.explain.explain_text`), for gfx950 by default or another arch, or for
      "this machine" (the real environment; CUDA builds say why not);
    - **Run traced**: the catalogue case run with the chosen backend under
      :func:`flyexplore.trace.trace_case` -- the kernels that ran, by family; on a CPU the
      top-level CPU operators and "no device kernels", said as such; a backend that cannot run
      here is reported with its reason, never replaced;
    - **X-ray**: where :func:`flyexplore.xray.xray_request` allows (the X-ray can run here,
      covers the case, and the call qualifies on gfx950), the FlyDSL kernel compiled for gfx950
      (compile-only; nothing runs): registers, spills, LDS, occupancy, instruction counts.

    Tracing and the X-ray run in a background thread (an X-ray compile takes seconds: a
    subprocess starting torch, then flydsl); :attr:`xray_status` counts the seconds. Invalid
    input is a message in :attr:`message`, never a traceback.

    Parameters set the initial controls: ``op``, ``shape`` (default the operator's example),
    ``dtype``, ``options``, ``arch`` (a key of :data:`flyexplore.explain.ARCHES` or
    ``"this machine"``/``None``), ``backend`` (for Run traced; default ``flydsl`` where it can run
    here, else the operator's baseline), ``device`` (default the first GPU, else the CPU).

    Programmatic API: controls :attr:`op`, :attr:`shape`, :attr:`dtype`, :attr:`options`,
    :attr:`arch`, :attr:`backend` (set ``.value``), :attr:`explain_button`,
    :attr:`trace_button`, :attr:`xray_button` (``.click()``); :meth:`set_case`,
    :meth:`show_row`, :meth:`explain`, :meth:`run_trace`, :meth:`run_xray`, :meth:`wait`,
    :attr:`busy`; results :attr:`explanation` (:class:`~flyexplore.explain.Explanation`),
    :attr:`trace_result` (the dict of :func:`~flyexplore.trace.trace_case`), :attr:`xray_result`
    (:class:`~flyexplore.xray.XRay`); outputs :attr:`message`, :attr:`verdict`,
    :attr:`conditions`, :attr:`trace_view`, :attr:`xray_status`, :attr:`xray_view` (``HTML``).
    """

    def __init__(self, op: str = "rmsnorm", shape: str | None = None, dtype: str | None = None,
                 options: str = "", *, arch: str | None = "gfx950", backend: str | None = None, device=None):
        from . import explain as X

        if op not in X.OPS:
            raise bad_choice("operator for the dispatch inspector", op, X.OPS)
        arch = arch or THIS_MACHINE
        arches = [(f"{a} ({d})", a) for a, d in X.ARCHES.items()] + [(THIS_MACHINE, THIS_MACHINE)]
        if arch not in [v for _, v in arches]:
            raise bad_choice("arch", arch, [v for _, v in arches])
        self.device = device
        self._sync = _Sync()
        self._thread: threading.Thread | None = None
        self._xray_req, self._xray_why = None, ""
        self.explanation = None
        self.trace_result: dict | None = None
        self.xray_result = None
        self.op = W.Dropdown(options=list(X.OPS), value=op, description="operator")
        self.shape = W.Text(description="shape", continuous_update=False)
        self.dtype = W.Dropdown(description="dtype")
        self.options = W.Text(value=options, description="options", continuous_update=False,
                              placeholder="key=value; key=value", layout=W.Layout(width="420px"))
        self.options_help = W.HTML()
        self.arch = W.Dropdown(options=arches, value=arch, description="judge for")
        self.backend = W.Dropdown(description="trace with")
        self.explain_button = W.Button(description="Explain", icon="question")
        self.trace_button = W.Button(description="Run traced", icon="search")
        self.xray_button = W.Button(description="X-ray (gfx950)", icon="microchip", disabled=True)
        self.message = W.HTML()
        self.verdict = W.HTML()
        self.conditions = W.HTML()
        self.trace_view = W.HTML()
        self.xray_status = W.HTML()
        self.xray_view = W.HTML()

        self.op.observe(self._op_changed, names="value")
        for w in (self.shape, self.dtype, self.options, self.arch):
            w.observe(lambda ch: None if self._sync.depth else self.explain(), names="value")
        self.explain_button.on_click(lambda _b: self.explain())
        self.trace_button.on_click(lambda _b: self.run_trace())
        self.xray_button.on_click(lambda _b: self.run_xray())

        with self._sync():
            self._load_op(op)
            if shape is not None:
                self.shape.value = shape
            if dtype is not None:
                self.dtype.value = self._check_dtype(dtype)
            if backend is not None:
                self.backend.value = self._check_backend(backend)
        self.widget = W.VBox([
            W.HBox([self.op, self.dtype, self.arch]),
            W.HBox([self.shape, self.options]), self.options_help,
            W.HBox([self.explain_button, self.backend, self.trace_button, self.xray_button]),
            self.message,
            W.HTML("<b>Verdict</b>"), self.verdict, self.conditions,
            W.HTML("<b>What ran</b>"), self.trace_view,
            W.HTML("<b>Kernel X-ray for gfx950</b>"), self.xray_status, self.xray_view,
        ], layout=W.Layout(width="auto"))
        self.explain(pick_backend=backend is None)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # -- controls ------------------------------------------------------------------------
    def _check_dtype(self, dtype: str) -> str:
        if dtype not in self.dtype.options:
            raise bad_choice(f"dtype for {self.op.value}", dtype, self.dtype.options)
        return dtype

    def _check_backend(self, backend: str) -> str:
        names = [v for _, v in self.backend.options]
        if backend not in names:
            raise bad_choice(f"backend for {self.op.value}", backend, names)
        return backend

    def _load_op(self, op: str) -> None:
        from . import explain as X
        from .ops import get_op

        self.dtype.options = X.dtypes_for(op)
        self.dtype.value = self.dtype.options[0]
        self.shape.placeholder = X.EXAMPLES[op]
        self.shape.value = X.EXAMPLES[op]
        self.options.value = ""
        self.options_help.value = (f"<small>options for {html.escape(op)}: "
                                   f"{html.escape(', '.join(X.EXPLAIN_OPTIONS[op]))}</small>")
        names = list(get_op(op).backends)
        self.backend.options = [(n, n) for n in names]
        self.backend.value = names[0]

    def _op_changed(self, change) -> None:
        if self._sync.depth:
            return
        with self._sync():
            self._load_op(change["new"])
        self.explain(pick_backend=True)

    def _case(self) -> tuple[str, str, str, str, str | None]:
        shape = self.shape.value.strip()
        if not shape:
            raise UsageError(f"type a {self.op.value} shape (e.g. {self.shape.placeholder})")
        if self.op.value == "grouped_gemm" and shape[:1] in "gG":
            shape = shape[1:]  # the explainer's g8x512x... is the catalogue's 8x512x...
        arch = None if self.arch.value == THIS_MACHINE else self.arch.value
        return self.op.value, shape, self.dtype.value, self.options.value, arch

    def _say(self, text: str, kind: str = "info") -> None:
        self.message.value = _span(text, kind)

    # -- explain -------------------------------------------------------------------------
    def set_case(self, op: str, shape: str, dtype: str | None = None, options: str | None = None,
                 backend: str | None = None):
        """Set every control of the case at once and explain it. Returns the
        :class:`~flyexplore.explain.Explanation`, or ``None`` with :attr:`message` saying what is
        wrong with the input."""
        from . import explain as X

        try:
            if op not in X.OPS:
                raise bad_choice("operator for the dispatch inspector", op, X.OPS)
            with self._sync():
                if op != self.op.value:
                    self.op.value = op
                    self._load_op(op)
                self.shape.value = shape
                self.dtype.value = self._check_dtype(dtype or self.dtype.options[0])
                self.options.value = options or ""
                if backend is not None:
                    self.backend.value = self._check_backend(backend)
        except UsageError as exc:
            self._clear()
            self._say(str(exc), "error")
            return None
        return self.explain(pick_backend=backend is None)

    def show_row(self, row: dict):
        """Inspect a sweep row (a dict with ``op``, ``case``, ``dtype``, ``backend``; what
        :meth:`SweepPanel.on_select` passes). Returns the explanation, or ``None`` with a
        message (for example an operator the explainer does not cover)."""
        from . import explain as X

        op = row.get("op")
        if op not in X.OPS:
            self._clear()
            self._say(f"the explainer covers {', '.join(X.OPS)}; {op} is not one of them"
                      + (" (SDPA: AOTriton chooses its FlyDSL kernels itself; see flyexplore switches)"
                         if op == "attention" else ""), "warn")
            return None
        return self.set_case(op, str(row.get("case", "")), row.get("dtype"), None, row.get("backend"))

    def attach(self, panel: "SweepPanel") -> "DispatchInspector":
        """Inspect the row picked in ``panel``'s row list (``panel.on_select``) and show this
        inspector below ``panel`` (``panel.add_section``). Returns ``self``."""
        panel.on_select(self.show_row)
        panel.add_section("Dispatch inspector", self.widget)
        return self

    def _clear(self) -> None:
        self.explanation = None
        self.verdict.value = self.conditions.value = ""
        self.xray_button.disabled = True
        self._xray_req, self._xray_why = None, ""
        self.xray_status.value = ""

    def explain(self, pick_backend: bool = False):
        """What Explain does (and every change of the case): explain the case and show the
        verdict, the conditions and whether the X-ray can show its kernel. Returns the
        :class:`~flyexplore.explain.Explanation`, or ``None`` with :attr:`message` saying why."""
        from . import explain as X
        from . import xray as XR
        from .trace import backend_status

        try:
            op, shape, dtype, options, arch = self._case()
            ex = X.explain_text(op, shape, dtype, options, arch=arch)
        except UsageError as exc:
            self._clear()
            self._say(str(exc), "error")
            return None
        self.explanation = ex
        self._say("")
        ok = ex.taken
        where = ex.assumed or "this machine, as it is"
        head = (_span("FlyDSL YES", "ok") if ok else _span("FlyDSL NO", "error"))
        kernel = (f"<br>kernel: {html.escape(ex.kernel)}" if ex.kernel and ok else
                  f"<br>kernel if the environment allowed: {html.escape(ex.kernel)}" if ex.kernel else "")
        qual = "" if ok else (f"<br>the call itself {'qualifies' if ex.call_ok else 'does not qualify'}; "
                              f"the environment {'qualifies' if ex.environment_ok else 'does not qualify'}")
        self.verdict.value = (f"<b>{head}</b> -- {html.escape(ex.path)}<br><small>judged for: "
                              f"{html.escape(where)}</small><br>{_span(ex.reason, 'ok' if ok else 'error')}"
                              f"{kernel}{qual}")
        rows = pd.DataFrame([{"": {True: "ok", False: "NO", None: "-"}[c.ok], "kind": c.kind,
                              "condition": c.detail, "torch source": c.source} for c in ex.conditions])
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in ex.notes)
        self.conditions.value = _frame_html(rows, 360) + (f"<small><ul>{notes}</ul></small>" if notes else "")
        # backends this case can be traced with here
        try:
            status = backend_status(op, shape, dtype, self.device)
        except UsageError:
            status = None
        if status is not None:
            cur = self.backend.value
            with self._sync():
                self.backend.options = [(n if why is None else f"{n} (unavailable here)", n)
                                        for n, why in status.items()]
                if pick_backend:
                    cur = "flydsl" if status.get("flydsl", "x") is None else next(iter(status))
                self.backend.value = cur if cur in status else next(iter(status))
        if not self.busy:
            try:
                req, why = XR.xray_request(op, shape, dtype, options)
            except UsageError as exc:
                req, why = None, str(exc)
            self._xray_req, self._xray_why = req, why
            self.xray_button.disabled = req is None
            self.xray_status.value = f"<small>{_span(why, 'info' if req else 'warn')}</small>" if why else \
                "<small>ready: compiles the FlyDSL kernel for gfx950 (compile-only, a few seconds)</small>"
        return ex

    # -- background work -----------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a trace or an X-ray runs."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running trace or X-ray (if any) ends; ``True`` if none runs then."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.busy

    def _start(self, name: str, work: Callable[[], Any], show: Callable[[Any], None],
               status: W.HTML, label: str) -> bool:
        if self.busy:
            self._say("a trace or X-ray is running; wait for it to end", "warn")
            return False
        done = threading.Event()
        t0 = time.perf_counter()
        for b in (self.trace_button, self.xray_button):
            b.disabled = True
        status.value = f"<small>{html.escape(label)}...</small>"

        def tick():
            while not done.wait(0.5):
                status.value = f"<small>{html.escape(label)}... {time.perf_counter() - t0:.0f} s</small>"

        ticker = threading.Thread(target=tick, daemon=True, name=f"flyexplore-{name}-tick")

        def run():
            try:
                res, err = work(), None
            except UsageError as exc:
                res, err = None, str(exc)
            except Exception as exc:  # shown in the widget, never a traceback
                lines = str(exc).strip().splitlines()
                res, err = None, f"{name} failed: {type(exc).__name__}: {lines[0] if lines else ''}"
            done.set()
            ticker.join()
            took = time.perf_counter() - t0
            self.trace_button.disabled = False
            self.xray_button.disabled = self._xray_req is None
            if err is not None:
                status.value = f"<small>{_span(err, 'error')}</small>"
                self._say(err, "error")
            else:
                try:
                    show(res)
                    self._say(f"{name} done in {_fmt_seconds(took)}", "ok")
                except Exception as exc:
                    self._say(f"showing the {name} failed: {type(exc).__name__}: {exc}", "error")

        ticker.start()
        self._thread = threading.Thread(target=run, daemon=True, name=f"flyexplore-{name}")
        self._thread.start()
        return True

    # -- trace ---------------------------------------------------------------------------
    def run_trace(self) -> bool:
        """What Run traced does: explain the case again (refusing invalid input), then run it
        (catalogue shape, dtype; explainer options are not applied) with the chosen backend under
        :func:`flyexplore.trace.trace_case` in a background thread. Returns ``True`` if it
        started; ``False`` with :attr:`message` saying why (bad input, already busy)."""
        from .trace import trace_case

        if self.busy:
            self._say("a trace or X-ray is running; wait for it to end", "warn")
            return False
        if self.explain() is None:  # invalid input: the message says why
            return False
        op, shape, dtype, options, _ = self._case()
        backend, dev = self.backend.value, self.device
        self.trace_result = None
        self.trace_view.value = ""
        note = ("explainer options are not applied to the traced run (it runs the catalogue case, "
                "contiguous inputs)" if options.strip() else "")
        return self._start("trace", lambda: trace_case(op, shape, backend, dtype, dev, reps=3),
                           lambda r: self._show_trace(r, note), self.trace_view,
                           f"running {op} {shape} {dtype} with {backend}, traced")

    def _show_trace(self, r: dict, note: str = "") -> None:
        self.trace_result = r
        head = f"<b>{html.escape(r['op'])} {html.escape(r['case'])} {html.escape(r['dtype'])}</b>, backend " \
               f"<b>{html.escape(r['backend'])}</b> on {html.escape(r['device'])}: "
        if r["status"] != "ok":
            self.trace_view.value = head + _span(f"{r['status']}: {r.get('message') or ''}", "warn")
            return
        tr = r["trace"]
        parts = [head + html.escape(tr.observed)]
        if not tr.kernels:
            parts.append(_span("no device kernels" + (" (a CPU run: below are the call's top-level CPU "
                                                     "operators)" if tr.device == "cpu" else ""), "warn"))
        if "flydsl_taken" in r:
            kind = "ok" if r["flydsl_taken"] else "warn"
            parts.append(_span(f"FlyDSL taken: {r['flydsl_taken']} -- {r.get('flydsl_reason') or ''}", kind))
        out = "<br>".join(parts)
        fams = tr.family_frame()
        if not fams.empty:
            out += "<br><small>by family</small>" + _frame_html(fams, 200)
        ks = tr.to_frame()
        if not ks.empty:
            out += "<small>kernels</small>" if tr.kernels else "<small>CPU operators</small>"
            out += _frame_html(ks, 260)
        at = tr.autotune_frame()
        if not at.empty:
            out += "<small>autotune</small>" + _frame_html(at, 220)
        notes = list(tr.notes) + ([note] if note else [])
        if notes:
            out += "<small><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul></small>"
        self.trace_view.value = out

    # -- X-ray ---------------------------------------------------------------------------
    def run_xray(self) -> bool:
        """What X-ray does: compile the case's FlyDSL kernel for gfx950
        (:func:`flyexplore.xray.xray`, compile-only) in a background thread and show its
        resources. Returns ``True`` if it started; ``False`` with a message when the X-ray cannot
        show this case (:func:`flyexplore.xray.xray_request` says why) or something runs."""
        from . import xray as XR

        if self.busy:
            self._say("a trace or X-ray is running; wait for it to end", "warn")
            return False
        if self.explain() is None:
            return False
        req = self._xray_req
        if req is None:
            self._say(f"no X-ray for this case: {self._xray_why}", "warn")
            return False
        self.xray_result = None
        self.xray_view.value = ""
        op, shape, dtype = req
        return self._start("X-ray", lambda: XR.xray(op, shape, dtype, arch="gfx950"), self._show_xray,
                           self.xray_status, f"compiling {op} {shape} {dtype} for gfx950 (compile-only, "
                           "in a subprocess)")

    def _show_xray(self, x) -> None:
        from .xray import xray_frame

        self.xray_result = x
        df = xray_frame([x])
        cols = [c for c in XRAY_COLUMNS if c in df.columns]
        verdict = _span(f"{'ELIGIBLE' if x.eligible else 'not eligible'}: {x.reason}", "ok" if x.eligible else "warn")
        self.xray_status.value = f"<small>{verdict}<br>verdict from {html.escape(x.verdict_source)}; " \
                                 "compiler output for gfx950, nothing was run</small>"
        head = (f"<b>{html.escape(x.op)} {html.escape(x.case)} {html.escape(x.dtype)}</b> for "
                f"{html.escape(x.arch)}<br>")
        table = head + (_frame_html(df[cols], 200) if x.kernels else "")
        err = _span(f"error: {x.error}", "error") if x.error else ""
        self.xray_view.value = (table + err + "<details><summary>full X-ray report</summary><pre style="
                                f"'font-size:11px'>{html.escape(x.to_text())}</pre></details>")
