"""Jupyter widgets on top of the library: :class:`SweepPanel`, :class:`SwitchPanel`,
:class:`DispatchInspector` and :func:`environment_view`.

UI only. Everything these widgets show or do is a call into the library
(:func:`flyexplore.sweep.make_plan` / :func:`~flyexplore.sweep.run_sweep`,
:mod:`flyexplore.results`, :func:`flyexplore.plots.speedup_figure`,
:func:`flyexplore.env.collect`, :mod:`flyexplore.switches`, :mod:`flyexplore.explain`,
:mod:`flyexplore.trace`, :mod:`flyexplore.xray`); the core never imports this module. Needs ipywidgets >= 8 and
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
