"""The dispatch inspector, :class:`DispatchInspector` (``fx.DispatchInspector``):
will a call take FlyDSL and why, what ran, and what the FlyDSL kernel costs on gfx950. UI only;
every answer is a call into :mod:`flyexplore.insight.explain`, :mod:`flyexplore.insight.trace` and
:mod:`flyexplore.insight.xray`.
"""
from __future__ import annotations

import html
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import ipywidgets as W
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight import explain as X
from flyexplore.insight import xray as XR
from flyexplore.insight.case_trace import backend_status, trace_case
from flyexplore.insight.xray import xray_frame
from flyexplore.ops import get_op
from flyexplore.results.table import split_arm
from flyexplore.ui.widget_base import Sync, fmt_seconds, frame_html, html_span

if TYPE_CHECKING:
    from flyexplore.ui.panel import SweepPanel

#: Arch dropdown entry for "judge this process's real environment".
THIS_MACHINE = "this machine"
#: Columns of the X-ray resource table.
XRAY_COLUMNS = ("kernel", "family", "vgprs_total", "agprs", "sgprs", "vgpr_spills", "sgpr_spills",
                "scratch_bytes", "lds_bytes", "workgroup_size", "waves_per_simd", "occupancy", "limited_by",
                "inst_total", "compile_s", "cached")


class DispatchInspector:
    """Will this call take FlyDSL, and if not, why not? What really ran? What does the FlyDSL
    kernel cost in registers and LDS on gfx950?

    Pick a case -- operator (those :mod:`flyexplore.insight.explain` covers), shape (the operator
    catalogue's syntax, e.g. ``8192x4096``), dtype, explainer options (``key=value; ...``:
    strides, offsets, bias, ...) -- or take one from a :class:`SweepPanel` row (:meth:`attach`,
    :meth:`show_row`), and see:

    - the verdict and every condition torch 2.15 applies, in words with its torch source
      (:func:`flyexplore.insight.explain.explain_text`), for gfx950 by default or another arch, or for
      "this machine" (the real environment; CUDA builds say why not);
    - **Run traced**: the catalogue case run with the chosen backend under
      :func:`flyexplore.insight.case_trace.trace_case` -- the kernels that ran, by family; on a CPU the
      top-level CPU operators and "no device kernels", said as such; a backend that cannot run
      here is reported with its reason, never replaced;
    - **X-ray**: where :func:`flyexplore.insight.xray.xray_request` allows (the X-ray can run here,
      covers the case, and the call qualifies on gfx950), the FlyDSL kernel compiled for gfx950
      (compile-only; nothing runs): registers, spills, LDS, occupancy, instruction counts.

    Tracing and the X-ray run in a background thread (an X-ray compile takes seconds: a
    subprocess starting torch, then flydsl); :attr:`xray_status` counts the seconds. Invalid
    input is a message in :attr:`message`, never a traceback.

    Parameters set the initial controls: ``op``, ``shape`` (default the operator's example),
    ``dtype``, ``options``, ``arch`` (a key of :data:`flyexplore.insight.explain.ARCHES` or
    ``"this machine"``/``None``), ``backend`` (for Run traced; default ``flydsl`` where it can run
    here, else the operator's baseline), ``device`` (default the first GPU, else the CPU).

    Programmatic API: controls :attr:`op`, :attr:`shape`, :attr:`dtype`, :attr:`options`,
    :attr:`arch`, :attr:`backend` (set ``.value``), :attr:`explain_button`,
    :attr:`trace_button`, :attr:`xray_button` (``.click()``); :meth:`set_case`,
    :meth:`show_row`, :meth:`explain`, :meth:`run_trace`, :meth:`run_xray`, :meth:`wait`,
    :attr:`busy`; results :attr:`explanation` (:class:`~flyexplore.insight.explain.Explanation`),
    :attr:`trace_result` (the dict of :func:`~flyexplore.insight.case_trace.trace_case`), :attr:`xray_result`
    (:class:`~flyexplore.insight.xray.XRay`); outputs :attr:`message`, :attr:`verdict`,
    :attr:`conditions`, :attr:`trace_view`, :attr:`xray_status`, :attr:`xray_view` (``HTML``).
    """

    def __init__(self, op: str = "rmsnorm", shape: str | None = None, dtype: str | None = None,
                 options: str = "", *, arch: str | None = "gfx950", backend: str | None = None, device=None):

        if op not in X.explainable():
            raise bad_choice("operator for the dispatch inspector", op, X.explainable())
        arch = arch or THIS_MACHINE
        arches = [(f"{a} ({d})", a) for a, d in X.ARCHES.items()] + [(THIS_MACHINE, THIS_MACHINE)]
        if arch not in [v for _, v in arches]:
            raise bad_choice("arch", arch, [v for _, v in arches])
        self.device = device
        self._sync = Sync()
        self._thread: threading.Thread | None = None
        self._xray_req, self._xray_why = None, ""
        self.explanation = None
        self.trace_result: dict | None = None
        self.xray_result = None
        self.op = W.Dropdown(options=list(X.explainable()), value=op, description="operator")
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

        self.dtype.options = X.dtypes_for(op)
        self.dtype.value = self.dtype.options[0]
        self.shape.placeholder = X.examples()[op]
        self.shape.value = X.examples()[op]
        self.options.value = ""
        self.options_help.value = (f"<small>options for {html.escape(op)}: "
                                   f"{html.escape(', '.join(X.options_for(op)))}</small>")
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
        self.message.value = html_span(text, kind)

    # -- explain -------------------------------------------------------------------------
    def set_case(self, op: str, shape: str, dtype: str | None = None, options: str | None = None,
                 backend: str | None = None):
        """Set every control of the case at once and explain it. Returns the
        :class:`~flyexplore.insight.explain.Explanation`, or ``None`` with :attr:`message` saying what is
        wrong with the input."""

        try:
            if op not in X.explainable():
                raise bad_choice("operator for the dispatch inspector", op, X.explainable())
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
        :meth:`SweepPanel.on_select` passes). An environment A/B's arm (``aten@ck``) is inspected
        as its backend (``aten``), in this process's environment. Returns the explanation, or
        ``None`` with a message (for example an operator the explainer does not cover)."""

        op = row.get("op")
        if op not in X.explainable():
            self._clear()
            self._say(f"the explainer covers {', '.join(X.explainable())}; {op} is not one of them"
                      + (" (SDPA: AOTriton chooses its FlyDSL kernels itself; see flyexplore switches)"
                         if op == "attention" else ""), "warn")
            return None
        backend = row.get("backend")
        return self.set_case(op, str(row.get("case", "")), row.get("dtype"), None,
                             None if backend is None else split_arm(backend)[0])

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
        :class:`~flyexplore.insight.explain.Explanation`, or ``None`` with :attr:`message` saying why."""

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
        head = (html_span("FlyDSL YES", "ok") if ok else html_span("FlyDSL NO", "error"))
        kernel = (f"<br>kernel: {html.escape(ex.kernel)}" if ex.kernel and ok else
                  f"<br>kernel if the environment allowed: {html.escape(ex.kernel)}" if ex.kernel else "")
        qual = "" if ok else (f"<br>the call itself {'qualifies' if ex.call_ok else 'does not qualify'}; "
                              f"the environment {'qualifies' if ex.environment_ok else 'does not qualify'}")
        self.verdict.value = (f"<b>{head}</b> -- {html.escape(ex.path)}<br><small>judged for: "
                              f"{html.escape(where)}</small><br>{html_span(ex.reason, 'ok' if ok else 'error')}"
                              f"{kernel}{qual}")
        rows = pd.DataFrame([{"": {True: "ok", False: "NO", None: "-"}[c.ok], "kind": c.kind,
                              "condition": c.detail, "torch source": c.source} for c in ex.conditions])
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in ex.notes)
        self.conditions.value = frame_html(rows, 360) + (f"<small><ul>{notes}</ul></small>" if notes else "")
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
            self.xray_status.value = f"<small>{html_span(why, 'info' if req else 'warn')}</small>" if why else \
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
                status.value = f"<small>{html_span(err, 'error')}</small>"
                self._say(err, "error")
            else:
                try:
                    show(res)
                    self._say(f"{name} done in {fmt_seconds(took)}", "ok")
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
        :func:`flyexplore.insight.case_trace.trace_case` in a background thread. Returns ``True`` if it
        started; ``False`` with :attr:`message` saying why (bad input, already busy)."""

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
            self.trace_view.value = head + html_span(f"{r['status']}: {r.get('message') or ''}", "warn")
            return
        tr = r["trace"]
        parts = [head + html.escape(tr.observed)]
        if not tr.kernels:
            parts.append(html_span("no device kernels" + (" (a CPU run: below are the call's top-level CPU "
                                                     "operators)" if tr.device == "cpu" else ""), "warn"))
        if "flydsl_taken" in r:
            kind = "ok" if r["flydsl_taken"] else "warn"
            parts.append(html_span(f"FlyDSL taken: {r['flydsl_taken']} -- {r.get('flydsl_reason') or ''}", kind))
        out = "<br>".join(parts)
        fams = tr.family_frame()
        if not fams.empty:
            out += "<br><small>by family</small>" + frame_html(fams, 200)
        ks = tr.to_frame()
        if not ks.empty:
            out += "<small>kernels</small>" if tr.kernels else "<small>CPU operators</small>"
            out += frame_html(ks, 260)
        at = tr.autotune_frame()
        if not at.empty:
            out += "<small>autotune</small>" + frame_html(at, 220)
        notes = list(tr.notes) + ([note] if note else [])
        if notes:
            out += "<small><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul></small>"
        self.trace_view.value = out

    # -- X-ray ---------------------------------------------------------------------------
    def run_xray(self) -> bool:
        """What X-ray does: compile the case's FlyDSL kernel for gfx950
        (:func:`flyexplore.insight.xray.xray`, compile-only) in a background thread and show its
        resources. Returns ``True`` if it started; ``False`` with a message when the X-ray cannot
        show this case (:func:`flyexplore.insight.xray.xray_request` says why) or something runs."""

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

        self.xray_result = x
        df = xray_frame([x])
        cols = [c for c in XRAY_COLUMNS if c in df.columns]
        verdict = html_span(f"{'ELIGIBLE' if x.eligible else 'not eligible'}: {x.reason}", "ok" if x.eligible else "warn")
        cached = "; read from the X-ray cache (compiled earlier)" if any(k.cached for k in x.kernels) else ""
        self.xray_status.value = f"<small>{verdict}<br>verdict from {html.escape(x.verdict_source)}; " \
                                 f"compiler output for gfx950, nothing was run{cached}</small>"
        head = (f"<b>{html.escape(x.op)} {html.escape(x.case)} {html.escape(x.dtype)}</b> for "
                f"{html.escape(x.arch)}<br>")
        table = head + (frame_html(df[cols], 200) if x.kernels else "")
        err = html_span(f"error: {x.error}", "error") if x.error else ""
        self.xray_view.value = (table + err + "<details><summary>full X-ray report</summary><pre style="
                                f"'font-size:11px'>{html.escape(x.to_text())}</pre></details>")
