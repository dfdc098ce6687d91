"""The live sweep panel, :class:`SweepPanel` (``fx.SweepPanel``). UI only;
its results table is :mod:`flyexplore.ui.tables`.

Threading. A sweep runs in a background thread so that the notebook stays responsive while it
runs (other cells execute, Stop can be clicked). The sweep thread never renders: each finished
row is appended to a list and a redraw is requested (:meth:`SweepPanel.add_row`, microseconds);
a second thread (``flyexplore-panel-ui``) applies the rows that arrived since its last pass a few
times per second (:data:`REDRAW_S`, stretched to :data:`REDRAW_FACTOR` x the last redraw's own
cost, so the UI takes a bounded share of the CPU and of the GIL from the sweep). A redraw
appends to the figure's existing traces inside ``batch_update`` (plotly's advice for live
figures; WebGL markers for large plans) and updates the geometric means with their intervals
(:func:`flyexplore.measure.stats.geomean_ci`) and the verdict counts of the touched series only.
Widget updates are trait changes made from that thread; in ipykernel every IOPub message,
comm messages included, is handed to the kernel's IOPub thread to send
(``ipykernel.iostream.IOPubThread.send_multipart``), and a message sent from a user thread takes
the shell's parent header (``ipykernel.kernelbase.Kernel._get_shell_context_var``), so this is
safe without marshalling through the IOLoop. ``tests/ui/test_notebooks.py`` checks that the
updates reach a real kernel's frontend state.

An environment A/B (``SweepPanel(..., envs=[...])``) is the panel's :class:`~flyexplore.ui.panel_ab.ABArea`;
its rows come through the same ``on_row`` path, its figures are redrawn with the table.
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

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.measure.devstate import default_device
from flyexplore.ops import get_op, list_ops
from flyexplore.results import table as R
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import run_sweep
from flyexplore.ui.envs import EnvPicker
from flyexplore.ui.panel_ab import SERIES_ENVS, ABArea  # noqa: F401 - SERIES_ENVS: still read from here
from flyexplore.ui.tables import TABLE_COLUMNS, GridTable, MessageNotes, PagedTable
from flyexplore.ui.widget_base import COLORS, cell_text, fmt_seconds, html_span
from flyexplore.views.plot_style import backend_color

#: Marker symbol of each verdict label (SAME is also outlined in black, as in speedup_figure).
SYMBOLS = {"FASTER": "triangle-up", "SAME": "circle", "SLOWER": "triangle-down", "AMBIGUOUS": "diamond"}
#: What the mark after a point's value (small plans: :data:`flyexplore.measure.stats.MARKS`) means;
#: never a first letter, which would read SAME and SLOWER alike.
MARK_LEGEND = ", ".join(f"{m.strip()} {lab}" for lab, m in S.MARKS.items())


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


#: Suite dropdown entry for shapes typed into the shapes box.
CUSTOM = "(custom shapes)"
#: Suite chosen first when the sweep runs on the CPU.
CPU_SUITE = "cpu-small"
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
_INSTALL = "pip install anywidget itables (or pip install 'flyexplore[notebook]')"


def _missing_anywidget() -> str | None:
    """Why the live figure widget cannot be made (``None`` when anywidget imports)."""
    try:
        import anywidget  # noqa: F401 - plotly's FigureWidget and itables' grid are anywidgets
    except ImportError as exc:
        return f"anywidget is not installed ({exc})"
    return None


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
    :class:`~flyexplore.measure.timing.Timer`, e.g. ``{"rep": 20, "warmup": 3}``), ``device`` (default:
    the first GPU, else the CPU), ``save_path`` (initial text of the save box). An invalid
    initial value raises :class:`UsageError`; invalid values typed into the panel show a
    message instead (:attr:`message`).

    An environment A/B (``docs/env-ab.md``): ``envs`` (the environments as ``fx.sweep(envs=...)``
    takes them), ``aa`` and ``pairs`` put an environment picker in the panel (:attr:`env_picker`);
    Run then runs the A/B that ``fx.sweep(..., **panel.env_picker.options)`` would, each backend an
    arm in every environment (``flash@ck``), the baseline an arm (a backend given as ``baseline`` is
    taken in the first environment). Bad environment text is the one-line error in
    :attr:`message`. The A/B part is :attr:`ab`, an :class:`~flyexplore.ui.panel_ab.ABArea`.

    Programmatic API (what the buttons call, for tests and scripts):

    - controls: :attr:`op`, :attr:`suite`, :attr:`shapes`, :attr:`dtypes`, :attr:`backends`,
      :attr:`baseline` (ipywidgets; set ``.value``), :attr:`run_button`, :attr:`stop_button`,
      :attr:`save_path`, :attr:`save_button` (``.click()``).
    - outputs: :attr:`progress` (IntProgress: ``value`` rows done of ``max``), :attr:`status`
      (rows done, the case now running, time left = mean seconds per finished row x rows
      left), :attr:`message` (HTML; errors and outcomes), :attr:`figure` (plotly
      ``FigureWidget``, live: one marker series per backend (and dtype), baseline time /
      backend time per case with its 95% interval as a whisker, the verdict label as the
      marker (and, for small plans, a mark after the value: + FASTER, = SAME, − SLOWER,
      ? AMBIGUOUS), the geometric mean with its interval and the label
      counts in the legend; the statistics of :func:`flyexplore.views.plots.speedup_figure`, computed
      by :func:`flyexplore.results.table.speedup`, one call per redraw; without anywidget a plain ``go.Figure`` shown
      statically, with :attr:`notice` saying what to install), :attr:`table` (the results grid:
      itables, else a paged HTML view; :attr:`table_frame` is what it shows; times in ms,
      TFLOP/s, GB/s), :attr:`notes` (long messages, numbered once), :attr:`row_select` and
      :attr:`details` (one finished row, every column).
    - an environment A/B's (:class:`~flyexplore.ui.panel_ab.ABArea`'s): :attr:`env_picker` (``None`` for
      an ordinary sweep), :attr:`ab_with` (the environment set against the baseline arm's),
      :attr:`ab_message`, :attr:`ab_view` and :attr:`ab_figures`, redrawn with the table.
    - :meth:`spec`, :meth:`plan`, :meth:`start`, :meth:`stop`, :meth:`wait`, :meth:`save`, :attr:`running`,
      :meth:`open_feed`, :meth:`add_row` (the sweep thread's per-row call), :meth:`close_feed`,
      :meth:`redraw`,
      :attr:`results` (a DataFrame of the rows so far, :mod:`flyexplore.results.table` schema),
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
                 device=None, save_path: str = "sweep-results.parquet", envs=None, aa: bool = False,
                 pairs: int | None = None):
        import plotly.graph_objects as go

        #: the environment A/B part (picker, baseline arms, status text, figures area)
        self.ab = ABArea(envs, aa, pairs, on_pick=self._draw_ab)   # bad environments raise here
        self.env_picker: EnvPicker | None = self.ab.env_picker

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
            self._table = GridTable()
        except ImportError as exc:
            self._table = PagedTable()
            missing = missing or f"itables is not installed ({exc})"
        if missing is not None:
            live = ("the figure below is static, redrawn in full (no live updates)"
                    if self._static is not None else "the figure is live")
            self.notice.value = html_span(f"{missing}: {live}; the table is a {self._table.kind}. For the live "
                                      f"figure and the data grid: {_INSTALL}", "warn")
        self.table = self._table.widget
        self.notes = W.HTML()
        self.row_select = W.Dropdown(description="row", options=[], layout=W.Layout(width="600px"))
        self.details = W.HTML()
        self.save_path = W.Text(value=save_path, description="save to",
                                placeholder="results.parquet | .csv | .jsonl")
        self.save_button = W.Button(description="Save", icon="save")
        self._sections = W.VBox([])
        self.ab_with, self.ab_message, self.ab_view = self.ab.ab_with, self.ab.message, self.ab.view

        self.op.observe(lambda ch: self._load_op(), names="value")
        self.suite.observe(lambda ch: self._load_suite(), names="value")
        self.shapes.observe(self._shapes_edited, names="value")
        self.baseline.observe(self._baseline_changed, names="value")
        self.row_select.observe(self._row_chosen, names="value")
        self.run_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())
        self.save_button.on_click(lambda _b: self.save())

        self._load_op()
        self._apply_initial(suite, shapes, dtypes, backends, baseline)
        self._draw_empty()
        self._inputs = (self.op, self.suite, self.shapes, self.dtypes, self.backends, self.run_button,
                        *self.ab.inputs)
        self.ab.follow_baseline(self.baseline.value)
        self._ab_box = self.ab.box
        self.widget = W.VBox([
            W.HBox([self.op, self.suite, self.baseline]),
            self.suite_info,
            W.HBox([self.shapes, self.dtypes, self.backends]),
            *self.ab.header,
            W.HBox([self.run_button, self.stop_button, self.progress, self.status]),
            self.message,
            self.notice,
            self.figure if self._static is None else self._static,
            self._ab_box,
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
            self.baseline.options, self.baseline.value = self._baseline_choices()
            self.suite.options = (*op.suites, CUSTOM)
            self.suite.value = self._default_suite(op)
        self._load_suite()

    def _default_suite(self, op) -> str:
        """``cpu-small`` when the sweep runs on the CPU (where the others take long), else the
        operator's first suite."""
        import torch


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
            if self.ab.active:  # the arms of the backends chosen
                with self._sync():
                    self.baseline.options, self.baseline.value = self._baseline_choices()
        if baseline is not None:
            self.baseline.value = (self.ab.baseline_arm(op, baseline, self.baseline.options) if self.ab.active
                                   else op.get_backend(baseline).name)

    def _baseline_choices(self, arms=None, default: str | None = None) -> tuple[tuple[str, ...], str]:
        """The baseline dropdown's options and value: the operator's backends and its registered
        baseline; in an A/B the arms (:meth:`flyexplore.ui.panel_ab.ABArea.baseline_choices`)."""
        op = self._operator()
        base = [b.name for b in op.backends.values() if b.baseline] or list(op.backends)[:1]
        if not self.ab.active:
            return tuple(op.backends), base[0]
        return self.ab.baseline_choices(base[0], list(self.backends.value) or list(op.backends),
                                        self.baseline.value, arms, default)

    # -- plan and run --------------------------------------------------------------------
    def spec(self) -> SweepSpec:
        """The :class:`~flyexplore.run.spec.SweepSpec` the current controls (and the panel's
        ``timer`` and ``device``) describe: what Run runs (with an environment picker, an A/B). Raises
        :class:`UsageError` for invalid input (message names the bad value), an empty backend or
        dtype selection, bad environment text or interpreters (:func:`flyexplore.run.envs.probe`)."""
        op = self._operator()
        if not self.backends.value:
            raise UsageError(f"select at least one backend (valid: {', '.join(op.backends)})")
        if not self.dtypes.value:
            raise UsageError(f"select at least one dtype (valid: {', '.join(op.dtypes)})")
        args: dict[str, Any] = {"backends": list(self.backends.value)}
        if self.suite.value != CUSTOM:
            args["suite"] = self.suite.value
            # The suite's own dtypes keep its per-case pairing (published suites name a dtype
            # per case); another selection runs every case in every selected dtype.
            if tuple(self.dtypes.value) != self._suite_dtypes(self.suite.value):
                args["dtypes"] = list(self.dtypes.value)
        else:
            args["shapes"] = self.shapes.value
            args["dtypes"] = list(self.dtypes.value)
        args.update(self.ab.options)   # envs, aa, pairs of an A/B: UsageError for text that does not parse
        return SweepSpec(op.name, device=self.device, timer=self.timer, **args)

    def plan(self):
        """The :class:`~flyexplore.run.plan.Plan` the current controls describe (:meth:`spec`'s).
        Raises :class:`UsageError` for invalid input (message names the bad value)."""

        return self.spec().plan

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
            spec = self.spec()
        except UsageError as exc:
            self._say(str(exc), "error")
            return False
        plan = spec.plan
        self._items = [(c.label, d, b) for c, d, b in plan.items()]
        self._stop.clear()
        if spec.environments:   # the baseline and the A/B figure's sides: this run's arms and environments
            with self._sync():
                self.baseline.options, self.baseline.value = self._baseline_choices(plan.backends, spec.ab_baseline)
        running_ab = self.ab.start(spec, self.baseline.value)
        self.open_feed(len(plan))
        for w in self._inputs:
            w.disabled = True
        self.stop_button.disabled = False
        self._t0 = time.perf_counter()
        self._set_status()
        self._say(running_ab or f"running {len(plan)} runs of {plan.op.name} "
                  f"({len(plan.pairs)} cases x dtypes, {len(plan.backends)} backends)", "info")
        self._thread = threading.Thread(target=self._work, args=(spec,), daemon=True,
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

    def _work(self, spec: SweepSpec) -> None:

        df, failure = None, None
        try:
            with contextlib.ExitStack() as stack:
                for factory in list(self._contexts):
                    stack.enter_context(factory())
                df = run_sweep(spec, progress=False, on_row=self.add_row, should_stop=self._stop.is_set)
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
            self._say(f"done: {n} rows in {fmt_seconds(elapsed)} ({una} unavailable, "
                      f"{bad} failed; see the table)", "ok")
        self.status.value = f"{n}/{len(self._items)} in {fmt_seconds(elapsed)}"
        frame = self.results if df is None else df
        for cb in list(self._done_cbs):
            self._call(cb, frame)

    def _set_status(self) -> None:
        done, total = len(self._rows), len(self._items) or self._total
        text = f"{done}/{total}"
        note = self.ab.status() if done < len(self._items) else None
        if note:   # an A/B's: neither the case now running nor the time left can be read from its rows
            text += f" - {note}"
        elif done < len(self._items):
            label, dtype, backend = self._items[done]
            text += f" - now {label} {dtype} {backend}"
            if done:
                left = (time.perf_counter() - self._t0) / done * (total - done)
                text += f" - about {fmt_seconds(left)} left"
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
        color = COLORS.get(kind, COLORS["info"])
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
        self._series: dict[tuple[str, str], SpeedupSeries] = {}
        self._trace_of: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._table_rows: list[dict] = []
        self._options: list[tuple[str, int]] = []
        self._notes = MessageNotes()
        self._table_due = False
        self._dtypes: set[str] = set()

    def open_feed(self, total: int) -> None:
        """Start showing a new set of rows (what Run does before its sweep starts): clear the
        rows, figure, table and notes, and start the panel's UI thread, which applies the rows
        given to :meth:`add_row` a few times per second (see the module text). ``total``: rows
        expected (progress bar; above :data:`GL_POINTS` the figure uses WebGL markers, up to
        :data:`TEXT_POINTS` it writes values). Ends a feed still open."""
        self.close_feed(draw=False)
        from scipy.special import ndtri  # noqa: F401 - imported here, not in the first redraw (geomean_ci)
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
            self.ab.clear()
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
            # close_feed sets _closing, then _wake: if both came after the check above, the
            # clear just swallowed that wake and the loop would wait for ever -- look again
            if self._closing.is_set():
                return
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
            for key, sp in self._speedups(list(touched), base):
                sk = (key[1], sp["backend"])
                s = self._series.get(sk)
                if s is None:
                    s = self._series[sk] = SpeedupSeries(*sk)
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
                self._draw_ab()
                if self._static is not None:
                    self._show_static()
                self._next_table = time.perf_counter() + min(
                    5 * REDRAW_MAX_S, max(TABLE_S, REDRAW_FACTOR * (time.perf_counter() - now)))
                self._last_table = True
            elif final and self._static is not None:
                self._show_static()
        return time.perf_counter() - t0

    def _speedups(self, keys: list[tuple[str, str]], base: str) -> list[tuple[tuple[str, str], dict]]:
        """The speedups of the cases ``keys`` (keys of ``_by_case``) against ``base``: one call of
        :func:`flyexplore.results.table.speedup` over their rows (the columns it reads; a row lacking
        one reads as NA), each case on its own. Returns ``(key, point)`` pairs, cases in ``keys``
        order and backends in arrival order; a point is a dict of ``backend``, ``speedup``,
        ``speedup_lo``, ``speedup_hi`` (NaN without an interval), ``verdict`` (``""`` for a
        published figure without an interval), ``time_ms`` and ``baseline_ms`` (median times,
        ms). Nothing for a case without a ``base`` row, nor when no row is of ``base``."""
        rows, case = [], []
        for i, key in enumerate(keys):
            part = self._by_case[key]
            rows.extend(part)
            case.extend([i] * len(part))
        if not rows:
            return []
        cols = {c: [r.get(c) for r in rows] for c in R.SPEEDUP_INPUTS}
        cols["_panel_case"] = case
        try:
            s = R.speedup(pd.DataFrame(cols), base, by=("_panel_case",))
        except UsageError:  # no row of this baseline yet
            return []
        return [(keys[k], {"backend": b, "speedup": e, "speedup_lo": lo, "speedup_hi": hi,
                           "verdict": "" if pd.isna(v) else v, "time_ms": t, "baseline_ms": bt})
                for k, b, e, lo, hi, v, t, bt in zip(
                    s["_panel_case"].tolist(), s["backend"].tolist(), s["speedup"].tolist(),
                    s["speedup_lo"].tolist(), s["speedup_hi"].tolist(), s["verdict"].tolist(),
                    s["time_ms"].tolist(), s["baseline_ms"].tolist())]

    def _x_label(self, key: tuple[str, str]) -> str:
        return f"{key[0]} {key[1]}" if self._multi_dtype() else key[0]

    def _multi_dtype(self) -> bool:
        return len({d for _, d, _ in self._items}) > 1

    def _display_row(self, row: dict) -> dict:
        return {c: (self._notes.short(row.get(c)) if c == "message" else cell_text(row.get(c)))
                for c in TABLE_COLUMNS}

    # -- the environment A/B's figures ----------------------------------------------------
    @property
    def ab_figures(self) -> dict[str, Any]:
        """The A/B figures drawn last (the ``figures`` of :class:`flyexplore.ui.panel_ab.ABArea`)."""
        return self.ab.figures

    def _baseline_changed(self, change) -> None:
        self.ab.follow_baseline(self.baseline.value)
        self.redraw(full=True)
        self._draw_ab()

    def _draw_ab(self) -> None:
        """Redraw the A/B figures from the rows so far (:meth:`flyexplore.ui.panel_ab.ABArea.draw`,
        side A the baseline arm's environment); nothing without an environment picker."""
        if not self.ab.active:
            return
        with self._draw_lock:
            with self._lock:
                rows = list(self._rows)
            self.ab.draw(rows, self.baseline.value)

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
                           ("text", [f"{v:.2f}{S.MARKS.get(lab, '')}" for v, lab in zip(y, s.lab)])):
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
                + (f"; after the value: {MARK_LEGEND}" if self._text else "")
                + f"<br>{html.escape(gms)}</sup>")
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
        :func:`flyexplore.results.table.save` (.parquet, .csv or .jsonl). Returns the path, or
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
