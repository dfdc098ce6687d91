"""Jupyter widgets on top of the library: :class:`SweepPanel` and :func:`environment_view`.

UI only. Everything these widgets show or do is a call into the measuring core
(:func:`flyexplore.sweep.make_plan` / :func:`~flyexplore.sweep.run_sweep`,
:mod:`flyexplore.results`, :func:`flyexplore.plots.speedup_figure`,
:func:`flyexplore.env.collect`); the core never imports this module. Needs ipywidgets >= 8 and
plotly's ``FigureWidget`` (plotly >= 6 builds it on anywidget): the ``notebook`` extra.

Threading. A sweep runs in a background thread so that the notebook stays responsive while it
runs (other cells execute, Stop can be clicked). Widget updates are trait changes made from
that thread; in ipykernel every IOPub message, comm messages included, is handed to the
kernel's IOPub thread to send (``ipykernel.iostream.IOPubThread.send_multipart``), and a
message sent from a user thread takes the shell's parent header
(``ipykernel.kernelbase.Kernel._get_shell_context_var``), so this is safe without marshalling
through the IOLoop. ``tests/test_notebooks.py`` checks that the updates reach a real kernel's
frontend state.
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
from .errors import UsageError
from .ops import get_op, list_ops

#: Suite dropdown entry for shapes typed into the shapes box.
CUSTOM = "(custom shapes)"
#: Suite chosen first when the sweep runs on the CPU.
CPU_SUITE = "cpu-small"
#: Columns of the results table, in order.
TABLE_COLUMNS = ("case", "dtype", "backend", "status", "time_ms", "time_iqr_ms", "noisy",
                 "tflops", "gbps", "err_rel", "timing_mode", "message")

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
      left), :attr:`message` (HTML; errors and outcomes), :attr:`figure`
      (plotly ``FigureWidget``: :func:`flyexplore.plots.speedup_figure`, baseline time /
      backend time per case), :attr:`table` (HTML; times in ms, TFLOP/s, GB/s),
      :attr:`row_select` and :attr:`details` (one finished row, every column).
    - :meth:`plan`, :meth:`start`, :meth:`stop`, :meth:`wait`, :meth:`save`, :attr:`running`,
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
        self.figure = go.FigureWidget()
        self.table = W.HTML()
        self.row_select = W.Dropdown(description="row", options=[], layout=W.Layout(width="600px"))
        self.details = W.HTML()
        self.save_path = W.Text(value=save_path, description="save to",
                                placeholder="results.parquet | .csv | .jsonl")
        self.save_button = W.Button(description="Save", icon="save")
        self._sections = W.VBox([])

        self.op.observe(lambda ch: self._load_op(), names="value")
        self.suite.observe(lambda ch: self._load_suite(), names="value")
        self.shapes.observe(self._shapes_edited, names="value")
        self.baseline.observe(lambda ch: self._refresh_figure(), names="value")
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
            self.figure,
            W.HTML("<b>Results</b>"),
            self.table,
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
        with self._lock:
            self._rows = []
        self._items = [(c.label, d, b) for c, d, b in plan.items()]
        self._stop.clear()
        self.progress.max = max(1, len(plan))
        self.progress.value = 0
        self.progress.bar_style = ""
        self.row_select.options = []
        self.details.value = ""
        self.table.value = ""
        self._draw_empty()
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
                               on_row=self._row_done, should_stop=self._stop.is_set)
        except UsageError as exc:
            failure = (str(exc), "error")
        except Exception as exc:  # shown in the panel; finished rows are kept
            lines = str(exc).strip().splitlines()
            failure = (f"sweep failed: {type(exc).__name__}: {lines[0] if lines else ''}", "error")
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

    def _row_done(self, row: dict) -> None:
        with self._lock:
            self._rows.append(row)
        self.progress.value = len(self._rows)
        self._set_status()
        self._refresh_table()
        self._refresh_figure()
        self.row_select.options = [*self.row_select.options,
                                   (self._row_label(row), len(self._rows) - 1)]
        for cb in list(self._row_cbs):
            self._call(cb, row)

    def _set_status(self) -> None:
        done, total = len(self._rows), len(self._items)
        text = f"{done}/{total}"
        if done < total:
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

    def _draw_empty(self) -> None:
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.layout = {}
            self.figure.update_layout(title="speedup: no rows yet", template="plotly_white",
                                      height=380)

    def _refresh_figure(self) -> None:
        from .plots import speedup_figure

        df = self.results
        if df.empty:
            return
        try:
            fig = speedup_figure(df, self.baseline.value)
        except UsageError:  # no baseline row yet
            fig = None
        with self.figure.batch_update():
            self.figure.data = ()
            if fig is None:
                self.figure.layout = {}
                self.figure.update_layout(title=f"speedup: waiting for a {self.baseline.value} row",
                                          template="plotly_white", height=380)
            else:
                self.figure.add_traces(fig.data)
                self.figure.layout = fig.layout
                # the legend names each backend with its geometric mean, even for one backend
                self.figure.update_layout(height=380, showlegend=True)

    def _refresh_table(self) -> None:
        df = self.results
        cols = [c for c in TABLE_COLUMNS if c in df.columns]
        t = pd.DataFrame({c: [_cell(v) for v in df[c]] for c in cols})
        body = t.to_html(index=False, escape=True, classes="flyexplore-table", border=0)
        self.table.value = f'{_TABLE_CSS}<div style="max-height:320px;overflow:auto">{body}</div>'

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
    FlyDSL path (eager overrides, compile templates), every readiness check with its fix.
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
    for r in (env.flydsl_eager, env.flydsl_compile):
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
