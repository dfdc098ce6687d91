"""The model coverage panel, :class:`ModelPanel` (``fx.ModelPanel``): will this model take
FlyDSL? Pick a built-in Hugging Face model, a phase, batch and sequence; Run captures one
forward step with no weights and no GPU and shows the verdicts. UI only; every answer is a call
into :func:`flyexplore.views.model.model_coverage` (and the :class:`~flyexplore.views.model.ModelCoverage`
it returns).
"""
from __future__ import annotations

import html
import json
import time

import ipywidgets as W
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight import hf as HF
from flyexplore.insight.capture import VIEWS
from flyexplore.ui.widget_base import fmt_seconds, frame_html, html_span
from flyexplore.views.model import ModelCoverage, model_coverage
from flyexplore.world.readiness import check_arch

#: The view choices of the panel: each capture view, or both.
VIEW_CHOICES = (*VIEWS, "both")
#: Columns of the judged-calls table (from :attr:`ModelCoverage.table`), with their headings.
CALL_COLUMNS = {"view": "view", "count": "count", "op": "op", "shapes": "shapes", "module": "module",
                "status": "status", "flops_share": "FLOPs", "modelled_share": "modelled",
                "modelled_us": "µs / call (modelled)", "reason": "reason"}
#: Columns of the summary table, with their headings (shares of the step; time in µs per step); those
#: the coverage has are shown (``step``: the phase with its batch and tokens, where the table has it).
SUMMARY_COLUMNS = {"model": "model", "step": "step", "phase": "phase", "view": "view", "calls": "kernel calls",
                   "eligible_calls": "eligible calls", "eligible_flops_share": "eligible FLOPs (captured)",
                   "eligible_bytes_share": "eligible bytes (captured)",
                   "eligible_modelled_share": "eligible time (modelled)",
                   "modelled_us": "µs / step (modelled)"}


def _pct(v) -> str:
    return "" if v is None or v != v else f"{v:.1%}"


def _short_op(op: str) -> str:
    return str(op).replace("aten.", "").replace(".default", "")


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


class ModelPanel:
    """Will this model take FlyDSL on gfx950? Choose a built-in Hugging Face model
    (:func:`flyexplore.insight.hf.builtin_models`: Llama-3.1-8B, Qwen3-30B-A3B, Mixtral-8x7B,
    gpt-oss-20b), a phase (``prefill``: ``batch`` sequences of ``seq`` tokens; ``decode``: one new
    token per sequence against a KV cache of ``seq`` tokens), and the view (``eager``: what ATen
    and the eager overrides see; ``compiled``: what Inductor lowers, where FlyDSL's GEMM
    templates are autotune candidates; ``both``). **Run** captures one forward step with fake
    tensors (no weights, no GPU; :func:`flyexplore.views.model.model_coverage`: seconds, a few
    per view on a 2-core CPU) and shows:

    - the summary per view: kernel calls, eligible calls, and the eligible share of FLOPs and
      bytes (captured from the model) and of the time (modelled: a roofline on the MI355X
      datasheet peaks, µs per step -- never a measurement);
    - the judged calls: every distinct call with a FlyDSL route (GEMM, grouped GEMM, RMSNorm,
      TopK, attention), its count per step, shapes, module, verdict and reason, FLOPs share,
      modelled share and modelled µs per call;
    - the figure: modelled time per view, stacked by verdict category
      (:meth:`ModelCoverage.figure`);
    - the what-if advice: changes to the model or its run, each re-judged
      (:attr:`ModelCoverage.advice`).

    Display it by making it the last expression of a cell. The capture runs in the calling
    thread (it patches torch's device queries while it runs, so it does not share the kernel
    with other work); :attr:`status` says what is being captured meanwhile. Invalid input (a
    sequence of 0, a context past the model's positions) or a capture that fails is one line of
    error text in :attr:`message`, never a traceback; the results of the last run are cleared
    then, so what the panel shows always matches its inputs.

    Parameters set the initial controls: ``model`` (a built-in name), ``phase`` (``prefill`` /
    ``decode``), ``batch``, ``seq`` (decode: the context length), ``view`` (one of
    :data:`VIEW_CHOICES`), ``arch`` (the target judged for, gfx950). An invalid initial value
    raises :class:`~flyexplore.errors.UsageError`.

    Programmatic API: controls :attr:`model`, :attr:`phase`, :attr:`view` (set ``.value``),
    :attr:`batch`, :attr:`seq` (``IntText``), :attr:`run_button` (``.click()``); :meth:`run`
    (what Run does), :attr:`coverage` (the last :class:`~flyexplore.views.model.ModelCoverage`,
    ``None`` before the first run and after a failed one), :attr:`figure` (its plotly figure);
    outputs :attr:`message`, :attr:`status`, :attr:`summary_view`, :attr:`calls_view`,
    :attr:`advice_view`, :attr:`notes_view` (assumptions, uncaptured calls) (``HTML``),
    :attr:`figure_view` (``Output``); :meth:`summary_frame` and :meth:`calls_frame` (what the
    two tables show, as DataFrames); :attr:`widget` (the top-level ``VBox``).
    """

    def __init__(self, model: str = "llama-3.1-8b", *, phase: str = "prefill", batch: int = 1, seq: int = 1024,
                 view: str = "both", arch: str = "gfx950"):
        names = HF.builtin_models()
        if model not in names:
            raise bad_choice("built-in model", model, names)
        if phase not in HF.PHASES:
            raise bad_choice("phase", phase, HF.PHASES)
        if view not in VIEW_CHOICES:
            raise bad_choice("view", view, VIEW_CHOICES)
        for what, v in (("batch", batch), ("seq", seq)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"{what} must be a positive integer, got {v!r}")
        check_arch(arch)
        self.arch = arch
        self.coverage: ModelCoverage | None = None
        self.figure = None
        self.model = W.Dropdown(options=[(f"{title} ({name})" if title != name else name, name)
                                         for name, title in names.items()],
                                value=model, description="model")
        self.phase = W.ToggleButtons(options=list(HF.PHASES), value=phase, description="phase",
                                     tooltips=["batch sequences of seq tokens, no cache",
                                               "one new token per sequence, KV cache of seq tokens"])
        self.batch = W.IntText(value=batch, description="batch", layout=W.Layout(width="180px"))
        self.seq = W.IntText(value=seq, description="seq", layout=W.Layout(width="180px"),
                             tooltip="prefill: tokens per sequence; decode: the context length")
        self.view = W.ToggleButtons(options=list(VIEW_CHOICES), value=view, description="view",
                                    tooltips=["what ATen and the eager overrides see",
                                              "what Inductor lowers (FlyDSL GEMMs are autotune candidates here)",
                                              "eager and compiled"])
        self.run_button = W.Button(description="Run", button_style="primary", icon="play",
                                   tooltip="capture one forward step (no weights, no GPU) and judge every call")
        self.status = W.HTML()
        self.message = W.HTML()
        self.summary_view = W.HTML()
        self.calls_view = W.HTML()
        self.figure_view = W.Output()
        self.advice_view = W.HTML()
        self.notes_view = W.HTML()
        self.run_button.on_click(lambda _b: self.run())
        self.widget = W.VBox([
            W.HBox([self.model, self.batch, self.seq]),
            W.HBox([self.phase]), W.HBox([self.view]),
            W.HBox([self.run_button, self.status]),
            self.message,
            W.HTML("<b>Summary</b> <small>(FLOPs and bytes: captured from the model; time: modelled, a "
                   "roofline on datasheet peaks, not measured)</small>"), self.summary_view,
            W.HTML("<b>Calls with a FlyDSL route</b> <small>(largest modelled share first)</small>"),
            self.calls_view,
            W.HTML("<b>Modelled time by verdict</b>"), self.figure_view,
            W.HTML("<b>What-if</b> <small>(each change re-judged)</small>"), self.advice_view,
            self.notes_view,
        ], layout=W.Layout(width="auto"))

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # -- inputs --------------------------------------------------------------------------
    def _views(self) -> tuple[str, ...]:
        return VIEWS if self.view.value == "both" else (self.view.value,)

    def _say(self, text: str, kind: str = "info") -> None:
        self.message.value = html_span(text, kind)

    def _clear(self) -> None:
        self.coverage = None
        self.figure = None
        self.summary_view.value = self.calls_view.value = self.advice_view.value = self.notes_view.value = ""
        self.figure_view.outputs = ()

    # -- run -----------------------------------------------------------------------------
    def run(self) -> ModelCoverage | None:
        """What Run does: capture the chosen model's step in the chosen view(s) for
        :attr:`arch`, judge every call (:func:`flyexplore.views.model.model_coverage`) and show
        the summary, the judged calls, the figure and the what-if advice. Blocks until done
        (seconds). Returns the :class:`~flyexplore.views.model.ModelCoverage` (also
        :attr:`coverage`), or ``None`` with one line in :attr:`message` saying why (bad input,
        a capture that failed)."""
        name, phase = self.model.value, self.phase.value
        batch, seq, views = self.batch.value, self.seq.value, self._views()
        what = f"{name} {phase}, batch {batch}, seq {seq}, {' and '.join(views)} view{'s' if len(views) > 1 else ''}"
        self._clear()
        self._say("")
        self.run_button.disabled = True
        self.status.value = f"<small>capturing {html.escape(what)} (fake tensors, no weights)...</small>"
        t0 = time.perf_counter()
        try:
            HF.check_phase(phase, batch, seq)  # before building the model: bad input answers at once
            cov = model_coverage(name, phases=[(phase, batch, seq)], views=views, arch=self.arch)
        except UsageError as exc:  # CaptureError included: it names the module where capture failed
            return self._failed(_first_line(exc))
        except Exception as exc:  # shown in the panel, never a traceback
            return self._failed(f"model coverage failed: {type(exc).__name__}: {_first_line(exc)}")
        finally:
            self.run_button.disabled = False
        try:
            self._show(cov)
        except Exception as exc:
            self._clear()
            return self._failed(f"showing the coverage failed: {type(exc).__name__}: {_first_line(exc)}")
        self.coverage = cov
        took = time.perf_counter() - t0
        n = int(cov.table["family"].notna().sum())
        self.status.value = f"<small>{html.escape(what)}: captured and judged in {fmt_seconds(took)}</small>"
        self._say(f"{n} distinct calls with a FlyDSL route judged for {self.arch}; "
                  f"{len(cov.advice)} what-if change{'' if len(cov.advice) == 1 else 's'}", "ok")
        return cov

    def _failed(self, text: str) -> None:
        self.status.value = ""
        self._say(text, "error")
        return None

    # -- outputs -------------------------------------------------------------------------
    def _show(self, cov: ModelCoverage) -> None:
        self.summary_view.value = frame_html(self.summary_frame(cov), 200)
        self.calls_view.value = frame_html(self.calls_frame(cov), 420)
        self.figure = cov.figure()
        data = {"application/vnd.plotly.v1+json": json.loads(self.figure.to_json()),
                "text/plain": f"<modelled time by verdict: {len(self.figure.data)} categories>"}
        self.figure_view.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)
        items = [f"<li><b>{html.escape(str(a.get('view', '')))}</b>: {html.escape(a['text'])}</li>"
                 for a in cov.advice]
        self.advice_view.value = (f"<ul style='margin:2px 0'>{''.join(items)}</ul>" if items else
                                  html_span("no change re-judged here turns a call eligible", "info"))
        attrs = cov.table.attrs
        notes = list(dict.fromkeys(x for v in attrs.get("assumptions", {}).values() for x in v))
        if attrs.get("peaks"):
            notes.append(f"modelled time: roofline on {attrs['peaks']}")
        unc = attrs.get("uncaptured") or []
        notes.append(f"not captured: {len(unc)} call{'' if len(unc) == 1 else 's'}" if unc else
                     "not captured: none (every call of the step was recorded)")
        notes += [f"not captured: {u.get('op')} in {u.get('module') or '(top)'}: {u.get('reason')}" for u in unc[:20]]
        self.notes_view.value = ("<details><summary><small>assumptions and what was not captured</small></summary>"
                                 "<small><ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in notes)
                                 + "</ul></small></details>")

    @staticmethod
    def summary_frame(cov: ModelCoverage) -> pd.DataFrame:
        """The summary table the panel shows: per model, step (or phase) and view the kernel calls,
        eligible calls, eligible shares (text percentages) and the modelled µs per step."""
        s = cov.summary()
        s = s.assign(**{c: s[c].map(_pct) for c in ("eligible_flops_share", "eligible_bytes_share",
                                                     "eligible_modelled_share")},
                     modelled_us=s["modelled_us"].map(lambda v: f"{v:.0f}"))
        return s[[c for c in SUMMARY_COLUMNS if c in s.columns]].rename(columns=SUMMARY_COLUMNS)

    @staticmethod
    def calls_frame(cov: ModelCoverage) -> pd.DataFrame:
        """The judged calls the panel shows: the rows of :attr:`ModelCoverage.table` with a
        FlyDSL route (``family`` not null), per view largest modelled share first, with
        :data:`CALL_COLUMNS` (shares as text percentages, modelled µs per call)."""
        t = cov.table
        j = t[t["family"].notna()]
        order = {v: i for i, v in enumerate(dict.fromkeys(t["view"]))}
        j = j.assign(_v=j["view"].map(order)).sort_values(["_v", "modelled_share"], ascending=[True, False],
                                                          kind="stable")
        j = j.assign(op=j["op"].map(_short_op), flops_share=j["flops_share"].map(_pct),
                     modelled_share=j["modelled_share"].map(_pct),
                     modelled_us=j["modelled_us"].map(lambda v: "" if v != v else f"{v:.2f}"))
        return j[list(CALL_COLUMNS)].rename(columns=CALL_COLUMNS).reset_index(drop=True)
