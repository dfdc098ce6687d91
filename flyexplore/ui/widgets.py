"""Jupyter widgets on top of the library: :class:`SweepPanel`, :class:`SwitchPanel`,
:class:`DispatchInspector` and :func:`environment_view`.

UI only. Everything these widgets show or do is a call into the library
(:class:`flyexplore.run.spec.SweepSpec` / :func:`~flyexplore.run.sweep.run_sweep`,
:mod:`flyexplore.results.table`, :func:`flyexplore.views.plots.speedup_figure`,
:func:`flyexplore.world.env.collect`, :mod:`flyexplore.world.switches`, :mod:`flyexplore.insight.explain`,
:mod:`flyexplore.insight.trace`, :mod:`flyexplore.insight.xray`); the core never imports this module. Needs ipywidgets >= 8 and
plotly's ``FigureWidget`` (plotly >= 6 builds it on anywidget): the ``notebook`` extra.

Where each lives: :class:`SweepPanel` in :mod:`flyexplore.ui.panel` (its results table in
:mod:`flyexplore.ui.tables`), :class:`DispatchInspector` in :mod:`flyexplore.ui.inspector`,
:class:`SwitchPanel` and :func:`environment_view` here, what they share in
:mod:`flyexplore.ui.widget_base`. A notebook reaches all four through the public face (``fx.SweepPanel``, ``fx.SwitchPanel``,
``fx.DispatchInspector``, ``fx.environment_view``); code imports each from where it lives.
"""
from __future__ import annotations

import contextlib
import html
from typing import Callable

import ipywidgets as W

from flyexplore.errors import UsageError
from flyexplore.ui.panel import SweepPanel
from flyexplore.ui.widget_base import COLORS, TABLE_CSS, Sync, frame_html, html_span
from flyexplore.world import env as ENV
from flyexplore.world import switches as S


def environment_view(env=None) -> W.HTML:
    """The environment report as an HTML widget: platform, devices, versions, flyexplore's commit and, for each
    FlyDSL path (eager overrides, compile templates, the compile-only kernel X-ray), every
    readiness check with its fix.
    ``env`` defaults to :func:`flyexplore.world.env.collect()`."""

    env = env or ENV.collect()
    e = html.escape
    parts = [f"<b>platform</b>: {e(env.platform)}<br>"]
    unit = {"rocm": "CUs", "cuda": "SMs"}.get(env.platform, "cores")
    for d in env.devices:
        mem = f"{d.memory_bytes / 2**30:.1f} GiB" if d.memory_bytes else "?"
        parts.append(f"<b>device {d.index}</b>: {e(d.name)} ({e(d.arch)}), "
                     f"{d.compute_units} {unit}, {mem}<br>")
    parts.append("<b>versions</b>: " + ", ".join(f"{e(k)} {e(str(v) or 'none')}"
                                                 for k, v in env.versions.items()))
    parts.append(f"<br><b>flyexplore commit</b>: "
                 f"{e(ENV.commit_text(getattr(env, 'flyexplore_commit', ''), getattr(env, 'flyexplore_dirty', '')))}")
    parts.append(f"<br><b>FlyDSL target arch</b>: {e(env.target_arch or 'none')} "
                 f"(from {e(env.target_arch_source)})")
    for r in (env.flydsl_eager, env.flydsl_compile, getattr(env, "flydsl_xray", None)):
        if r is None:
            continue
        verdict = ('<span style="color:#1a7f37">READY</span>' if r.ready
                   else '<span style="color:#b42318">not available</span>')
        rows = "".join(
            f"<tr><td style='color:{COLORS['ok'] if c.ok else COLORS['error']}'>"
            f"{'&#10003;' if c.ok else '&#10007;'}</td><td>{e(c.name)}</td>"
            f"<td>{e(c.detail)}</td><td>{e(c.fix) if (c.fix and not c.ok) else ''}</td></tr>"
            for c in r.checks)
        parts.append(f"<h4>FlyDSL {e(r.path)}: {verdict}</h4><table class='flyexplore-table'>"
                     f"<tr><th></th><th>check</th><th>detail</th><th>fix</th></tr>{rows}</table>")
    return W.HTML(TABLE_CSS + "".join(parts))


# -- the switch panel ------------------------------------------------------------------------

class SwitchPanel:
    """FlyDSL on/off per operator, FlyDSL's compile settings and the SDPA settings, over
    :mod:`flyexplore.world.switches`, with the live state of every switch.

    Display it by making it the last expression of a cell. Every change of a control changes
    torch's real settings at once (python_native filter sets, ``torch._inductor.config``,
    ``torch.backends.cuda`` SDPA flags and ROCm FA preference) and the panel then re-reads all
    of them (:func:`flyexplore.world.switches.states` / :func:`~flyexplore.world.switches.table`), so the
    controls and the state table always show what torch will do -- also the knock-on effects
    (``gemm``, ``grouped_gemm`` and ``scaled_gemm`` share one torch setting; turning FlyDSL
    attention on enables flash and efficient SDPA). A switch this torch cannot turn on
    (:func:`flyexplore.world.switches.unavailable`: torch 2.11 has no python_native and no FlyDSL
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
    (the :class:`flyexplore.world.switches.SwitchSettings` the controls show), :meth:`apply`,
    :meth:`context` (a context manager running code under these settings and restoring
    afterwards), :meth:`attach` (feed a :class:`SweepPanel`: its sweeps run under the chosen
    switches, and the panel appears below it), :attr:`widget`.
    """

    def __init__(self):

        self.initial = S.snapshot()
        self._sync = Sync()
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
        self.message.value = html_span(text, kind)

    @property
    def settings(self):
        """The :class:`flyexplore.world.switches.SwitchSettings` the controls show (disabled controls --
        switches this torch cannot turn on -- are left out)."""

        fly = {op: cb.value for op, cb in self.toggles.items() if not self._unavailable.get(op)}
        comp = "compile_settings" not in self._unavailable
        return S.SwitchSettings(fly, self.autotuning.value if comp else None,
                          self.search_space.value if comp else None,
                          tuple(n for n, cb in self.sdpa.items() if cb.value),
                          None if "rocm_fa_library" in self._unavailable else self.rocm_fa.value)

    def refresh(self, keep_message: bool = False) -> None:
        """Re-read every switch from torch into the controls, the notes and the state table."""
        from torch._inductor import config as ic


        self._unavailable = S.unavailable()
        states = {st.op: st for st in S.states()}
        now = S.settings()
        with self._sync():
            for op, cb in self.toggles.items():
                st = states[op]
                cb.value = st.flydsl in ("on", "possible")
                cb.disabled = self._locked or op in self._unavailable
                if op in self._unavailable:
                    note = html_span(f"unavailable: {self._unavailable[op]}", "error")
                else:
                    kind = "ok" if st.effective else "warn"
                    note = (f"<b>{html.escape(st.flydsl)}</b> " + html_span(st.note, kind)) if st.note else \
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
            self.compile_note.value = f"<small>{html_span(f'unavailable: {comp_missing}', 'error')}</small>" \
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
                notes.append(html_span("no SDPA backend enabled: F.scaled_dot_product_attention will raise", "warn"))
            if fa_missing:
                notes.append(html_span(f"ROCm FA library unavailable: {fa_missing}", "error"))
            self.sdpa_note.value = "<small>" + "<br>".join(notes) + "</small>"
        cols = ["op", "flydsl", "effective", "mechanism", "setting"]  # notes are beside the toggles
        self.table.value = frame_html(S.table()[cols], max_height=420)
        if not keep_message:
            self._say("")

    def apply(self, settings) -> None:
        """Put every switch to ``settings`` (:func:`flyexplore.world.switches.apply_settings`) and
        refresh. Raises :class:`UsageError` for inconsistent settings."""

        S.apply_settings(settings, warn=False)
        self.refresh()

    def restore(self) -> None:
        """What Restore does: every switch back to the state found when the panel was made
        (:func:`flyexplore.world.switches.restore`)."""

        S.restore(self.initial)
        self.refresh()
        self._say("every switch restored to the state found when this panel was made", "ok")

    def _lock(self, on: bool) -> None:
        self._locked = on
        self.refresh(keep_message=True)

    @contextlib.contextmanager
    def context(self):
        """Context manager: code inside runs under the switches the panel shows
        (:func:`flyexplore.world.switches.using`, applied again in case something changed them since);
        afterwards every switch is as it was before. The controls are disabled meanwhile (a
        sweep must not see its switches change half-way)."""

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
