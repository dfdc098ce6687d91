"""A measured model step shown beside the capture's answer: what ``fx.model(..., measure=True)``
adds to :class:`~flyexplore.views.model.ModelCoverage` (``.measured``) and ``flyexplore model
--measure`` prints after the coverage.

Three parts, each labelled with what its numbers are (:mod:`flyexplore.results.model_step`):
the variants' measured step times and speedups with intervals; one profiled step of each by
kernel category beside the capture's modelled shares; the projected FlyDSL speedup beside the
measured one, with the difference stated.
"""
from __future__ import annotations

import math
import sys

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.ops.model.operator import describe
from flyexplore.results import model_step as MS
from flyexplore.run import model_step as RS
from flyexplore.run.journal import check_new
from flyexplore.run.sweep import run_sweep
from flyexplore.views.model import model_coverage
from flyexplore.views.plot_style import style_figure


def _f(v, fmt: str, none: str = "-") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return none
    return none if not math.isfinite(x) else format(x, fmt)


def _ci(est, lo, hi, fmt: str, unit: str = "") -> str:
    if not math.isfinite(_num(est)):
        return "-"
    s = f"{_f(est, fmt)}{unit}"
    if math.isfinite(_num(lo)) and math.isfinite(_num(hi)):
        s += f" [{_f(lo, fmt)}, {_f(hi, fmt)}]"
    return s


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _grid(rows: list[list[str]], head: list[str]) -> list[str]:
    w = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
    return [line(head), line(["-" * x for x in w]), *(line(r) for r in rows)]


def _title_of(model) -> str:
    """A model's title (``Llama-3.1-8B``) for a case's ``model`` value; a registered module's class
    (``MLP (an nn.Module)``); else the value."""
    if str(model).startswith("module:"):
        return f"{str(model)[len('module:'):].rsplit('-', 1)[0]} (an nn.Module)"
    try:
        return describe(str(model))["title"]
    except Exception:  # noqa: BLE001 - a registered module, or a file gone since
        return str(model)


#: What a step costs on a small CPU, FLOP/s, for the note before a long CPU measurement: about what
#: the project's 2-core x86 machine gave a small Llama step in fp32 (0.02-0.05 TFLOP/s in the tests'
#: rows); a bigger CPU takes less.
CPU_FLOPS = 5e10


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


class MeasuredStep:
    """A measured step: ``frame`` (the ``model`` sweep's rows), with the capture's coverage
    ``table`` (:func:`flyexplore.results.model.coverage_table`, for the modelled shares) and its
    projection summary (``projection``), either may be ``None``. Tables: :meth:`steps`,
    :meth:`breakdown`, :meth:`beside_modelled`, :meth:`breakdown_check`,
    :meth:`projection_vs_measured`; :meth:`text`, :meth:`markdown`, :meth:`to_dict`."""

    def __init__(self, frame: pd.DataFrame, table: pd.DataFrame | None = None, projection: pd.DataFrame | None = None,
                 notes: tuple[str, ...] = ()):
        self.frame = frame
        self.table = table
        self.projection = projection
        self.notes = tuple(notes)

    def __repr__(self) -> str:
        s = self.steps()
        ok = s[s["status"] == "ok"]
        return (f"MeasuredStep({len(ok)} of {len(s)} variants measured: "
                + ", ".join(f"{r.variant} {_f(r.step_ms, '.3g')} ms" for r in ok.itertuples()) + ")")

    def steps(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model_step.step_table`."""
        return MS.step_table(self.frame)

    def serving(self) -> dict:
        """:func:`flyexplore.results.model_step.serving_variant` of the measured phase and batch."""
        r = self.frame.iloc[0]
        return MS.serving_variant(str(r.get("phase")), int(r.get("batch")), self.frame)

    def breakdown(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model_step.breakdown_table`."""
        return MS.breakdown_table(self.frame)

    def breakdown_check(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model_step.breakdown_check`."""
        return MS.breakdown_check(self.frame)

    def beside_modelled(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model_step.beside_modelled`."""
        return MS.beside_modelled(self.frame, self.table)

    def largest_gap(self) -> dict | None:
        """:func:`flyexplore.results.model_step.largest_gap`."""
        return MS.largest_gap(self.frame, self.table) if self.table is not None else None

    def projection_vs_measured(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model_step.projection_vs_measured`."""
        return MS.projection_vs_measured(self.frame, self.projection)

    # -- text -----------------------------------------------------------------------------------
    def _title(self) -> str:
        r = self.frame.iloc[0] if len(self.frame) else {}
        layers = int(r.get("layers") or 0) if len(self.frame) else 0
        ph = r.get("phase", "?")
        what = (f"prefill {r.get('batch')}x{r.get('seq')}" if ph == "prefill"
                else f"decode {r.get('batch')} at context {r.get('seq')} (static KV cache)")
        if str(r.get("model", "")).startswith("module:"):
            what = "on its own inputs and weights"
        ok = self.frame[self.frame["status"] == "ok"] if len(self.frame) else self.frame
        mode = ", ".join(sorted({str(m) for m in ok.get("timing_mode", pd.Series(dtype=object)).dropna()})) or "-"
        dev = r.get("device", "?")
        picked = any(n.startswith(f"--layers {layers}: layers:") for n in self.notes)   # a hybrid's cut
        depth = f", {'' if picked else 'first '}{layers} layers only (--layers)" if layers else ""
        return (f"Measured step (measured on {dev}): {_title_of(r.get('model'))} {what}, {r.get('dtype')}{depth}; "
                f"timing mode {mode}, interleaved round by round; what each variant does with CUDA/HIP graphs: "
                "its graphs column")

    def _lines(self, md: bool) -> list[str]:
        out = [("### " if md else "") + self._title(), ""]
        s = self.steps()
        rows = []
        for r in s.itertuples():
            if r.status not in ("ok", MS.CHECK_FAILED):
                rows.append([r.variant, r.status, "-", "-", "-", "-", r.graphs, r.note])
                continue
            sp = "baseline" if r.verdict == "baseline" else (
                _ci(r.speedup, r.speedup_lo, r.speedup_hi, ".3f", "x") + f" {r.verdict or ''}")
            rows.append([r.variant, r.status, _ci(r.step_ms, r.step_lo_ms, r.step_hi_ms, ".4g"), sp,
                         _f(r.first_call_s, ".1f"), _f(r.peak_gb, ".1f"), r.graphs, r.note])
        out += _table(rows, ["variant", "status", "step ms [95% CI]", "speedup vs eager [95% CI]",
                             "first call s (compile, autotune, capture)", "peak GB", "graphs", "note"], md)
        rewind = next((t for t in self.frame.get("state_restore", pd.Series(dtype=object)) if isinstance(t, str)), None)
        if rewind:
            out.append(("- " if md else "note: ") + rewind + " (before each timed call, so every call is the same step)")
        if len(self.frame):
            out.append(("- " if md else "") + self.serving()["text"])
        chk = self.breakdown_check()
        bm = self.beside_modelled()
        bd = self.breakdown()
        spans = bd.attrs["spans"]
        if len(chk):
            on = bm.attrs.get("modelled_on", "no capture")
            src = (f"roofline on {on}" if self.table is not None
                   else "no capture: modelled shares not shown")
            out += ["", ("#### " if md else "") +
                    f"One profiled step by kernel category (measured, torch.profiler) beside the capture's modelled "
                    f"shares ({src})"]
            cpu_notes = sorted({n for s in spans.values() if s.get("device") == "cpu" for n in s.get("notes", [])})
            for n in cpu_notes:
                out.append(("- " if md else "note: ") + n + "; the profiler's own cost makes its total no measure "
                           "of the step, so only the shares are compared")
            for c in chk.itertuples():
                g = bm[bm["variant"] == c.variant]
                idle = bd[(bd["variant"] == c.variant) & (bd["category"] == "idle")]
                view = MS.VIEW_OF.get(c.variant, "eager")
                if spans.get(c.variant, {}).get("device") == "cpu":
                    out += ["", f"{c.variant} ({view} view): CPU-op self times of one profiled step, "
                                f"{_f(c.kernel_ms, '.4g')} ms in all (measured step {_f(c.measured_ms, '.4g')} ms)"]
                else:
                    out += ["", f"{c.variant} ({view} view): profiled {_f(c.profiled_ms, '.4g')} ms "
                                f"(kernels {_f(c.kernel_ms, '.4g')} + idle {_f(c.idle_ms, '.4g')}) vs measured "
                                f"{_f(c.measured_ms, '.4g')} ms: {_f(100 * c.difference, '+.1f')}% "
                                f"(kernels alone {_f(100 * c.kernel_difference, '+.1f')}%; idle at most measured - "
                                f"kernels: {_f(c.bounded_ms, '.4g')} ms, {_f(100 * c.bounded_difference, '+.1f')}%)"]
                rows = [[x.category, _f(bd[(bd['variant'] == c.variant) & (bd['category'] == x.category)]['us'].sum() / 1e3, '.4g'),
                         _f(100 * x.measured_share, ".1f"), _f(100 * x.modelled_share, ".1f"),
                         _f(100 * x.difference, "+.1f")] for x in g.itertuples()]
                for x in idle.itertuples():
                    rows.append(["idle (launch gaps)", _f(x.us / 1e3, ".4g"), f"({_f(100 * x.share, '.1f')} of span)", "-", "-"])
                out += _table(rows, ["category", "ms", "measured %", "modelled %", "difference (points)"], md)
            gap = self.largest_gap()
            if gap is not None:
                out += ["", ("- " if md else "") + "largest gap between modelled and measured: " + gap["text"]]
        pv = self.projection_vs_measured()
        if len(pv):
            out += ["", ("#### " if md else "") + "FlyDSL whole-step speedup: projected (published MI355X per-op "
                    "speedups through Amdahl's law, not a measurement) beside measured (this device)"]
            rows = []
            for p in pv.itertuples():
                meas = (_ci(p.measured, p.measured_lo, p.measured_hi, ".3f", "x") + f" {p.verdict}"
                        if math.isfinite(_num(p.measured)) else f"not measured: {p.reason}")
                rows.append([p.view, _ci(p.projected, p.projected_lo, p.projected_hi, ".3f", "x"), p.measured_pair, meas,
                             _f(100 * p.difference, "+.1f") + ("%" if math.isfinite(_num(p.difference)) else "")])
            out += _table(rows, ["view", "projected", "measured variants", "measured", "difference"], md)
        for n in self.notes:
            out.append(("- " if md else "note: ") + n)
        return out

    def text(self) -> str:
        """The measured step as terminal text."""
        return "\n".join(self._lines(False))

    def markdown(self) -> str:
        """The measured step as Markdown."""
        return "\n".join(self._lines(True))

    def figure(self, title: str | None = None):
        """Grouped bars per variant (one panel each): each kernel category's share of the profiled
        kernel time (measured) beside the capture's modelled share of the same view
        (:meth:`beside_modelled`; the peaks it was modelled on in the subtitle). Raises
        :class:`~flyexplore.errors.UsageError` when no variant has a breakdown."""
        import plotly.express as px

        bm = self.beside_modelled()
        if not len(bm):
            raise UsageError("no measured breakdown to plot (no variant ran)")
        long = bm.melt(id_vars=["variant", "view", "category"], value_vars=["measured_share", "modelled_share"],
                       var_name="kind", value_name="share")
        long["kind"] = long["kind"].map({"measured_share": "measured (one profiled step)",
                                         "modelled_share": "modelled (roofline)"})
        fig = px.bar(long, x="category", y="share", color="kind", barmode="group", facet_col="variant",
                     labels={"share": "share of kernel time", "kind": ""})
        fig.update_yaxes(tickformat=".0%")
        fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
        sub = bm.attrs.get("modelled_on", "")
        fig = style_figure(fig, title or f"{self._title().split(';')[0]}<br><sup>modelled on {sub}</sup>",
                           "kernel category", "share of kernel time")
        fig.for_each_yaxis(lambda ax: ax.update(title_text=""))
        cpu = any(s.get("device") == "cpu" for s in self.breakdown().attrs["spans"].values())
        fig.update_yaxes(title_text="share of CPU-op time" if cpu else "share of kernel time", row=1, col=1)
        fig.update_layout(margin=dict(t=100))
        return fig

    def section(self):
        """A report section (``f(page)``, :func:`flyexplore.views.report.write_sections`): the
        variants, the breakdown check, the measured shares beside the modelled ones and the
        figure, the projection beside the measured speedup; each labelled with what it is."""
        def add(page):
            page.h2("Measured step")
            page.p(self._title(), cls="note")
            page.table("step_variants", self.steps())
            if len(self.breakdown_check()):
                page.h3("One profiled step by kernel category (measured) beside the modelled shares")
                page.p("measured: torch.profiler, one step of each variant; modelled: the capture's roofline "
                       f"({self.beside_modelled().attrs.get('modelled_on', '')})", cls="note")
                page.fig("step_breakdown", self.figure())
                page.table("step_breakdown_check", self.breakdown_check())
                page.table("step_beside_modelled", self.beside_modelled())
            page.h3("FlyDSL speedup: projected (not a measurement) beside measured")
            page.table("step_projection_vs_measured", self.projection_vs_measured())
            for n in self.notes:
                page.p(n, cls="note")
        return add

    def to_dict(self) -> dict:
        """Plain data (``flyexplore model --measure --json``): the tables, each with ``kind`` per column."""
        def rec(df):
            return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
                    for r in df.to_dict("records")]
        return {"kind": "measured step", "cuda_graphs": {v: r for v, r in zip(self.steps()["variant"],
                                                                               self.steps()["graphs"])},
                "serving": self.serving()["text"] if len(self.frame) else None, "title": self._title(),
                "steps": rec(self.steps()), "breakdown": rec(self.breakdown()),
                "breakdown_check": rec(self.breakdown_check()), "beside_modelled": rec(self.beside_modelled()),
                "projection_vs_measured": rec(self.projection_vs_measured()),
                "kinds": {"steps": "measured", "breakdown": "measured",
                          "beside_modelled": {"measured_share": "measured", "modelled_share": "modelled"},
                          "projection_vs_measured": {"projected": "projection", "measured": "measured"}},
                "notes": list(self.notes)}


def _table(rows: list[list[str]], head: list[str], md: bool) -> list[str]:
    if not md:
        return _grid(rows, head)
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(esc(c) for c in r) + " |" for r in rows)]


def measure_model(hf=None, config=None, *, phase: str = "prefill", batch: int = 1, seq: int = 2048,
                  layers: int | None = None, variants=None, dtype: str | None = None, device=None,
                  max_memory: int | None = None, timer=None, out=None, processes: int | None = None,
                  arch: str = "gfx950", routing: str = "uniform", project: str | None = "published",
                  force: bool = False, progress: bool = True, say: bool = True, resume: bool = False,
                  overwrite: bool = False):
    """Capture and measure one step of a model: the capture's answer
    (:func:`flyexplore.views.model.model_coverage` of the same config, its depth cut as ``layers``
    says) with ``.measured`` a :class:`MeasuredStep` of the ``model`` family's sweep
    (:func:`flyexplore.run.model_step.measure_step`; its arguments). Everything is checked first --
    an unknown variant, model or phase, a step past the model's positions, a model whose estimate
    is over the free memory or ``max_memory`` -- each a :class:`~flyexplore.errors.UsageError` in
    one line with nothing written; then the capture (fake tensors, no memory) runs, then the
    measurement. ``out`` (a result file) is the sweep's: there already, it is refused unless
    ``resume`` (measure only the variants it lacks, e.g. after an interruption or a full disk) or
    ``overwrite`` (replace it); the two exclude each other (:class:`~flyexplore.run.spec.SweepSpec`)."""
    spec = RS.step_spec(hf, config, phase=phase, batch=batch, seq=seq, layers=layers, variants=variants, dtype=dtype,
                        device=device, max_memory=max_memory, timer=timer, out=out, processes=processes,
                        resume=resume, overwrite=overwrite)
    if out is not None and not resume:
        check_new(out, overwrite)   # a file there is refused before the capture, not after it
    case = spec.plan.pairs[0][0]
    flops = spec.plan.op.flops(case)
    if spec.device is not None and str(spec.device).startswith("cpu") or (spec.device is None and not _gpu()):
        per_step = flops / CPU_FLOPS
        if per_step > 1.0 and say:
            print(f"flyexplore: note: one step is {flops / 1e12:.2g} TFLOP: on this CPU about {per_step:.0f} s a "
                  f"step (at {CPU_FLOPS / 1e9:.0f} GFLOP/s), and each variant is timed over 10 rounds or more: "
                  "many minutes; --layers N or a GPU is quicker", file=sys.stderr)
    desc = RS.capture_config(case)
    cov = model_coverage(None, desc, phases=[(phase, batch, seq)], arch=arch, routing=routing, project=project,
                         force=force, say=say)
    notes = []
    if case["layers"]:
        notes.append(f"--layers {case['layers']}: {desc['layers_note']} (measured and captured alike)"
                     if desc.get("layers_note") else
                     f"--layers {case['layers']}: the model is cut to its first {case['layers']} decoder layers "
                     "(measured and captured alike); a full-depth step takes longer")
    if phase == "decode":
        notes.append("the capture's decode step updates transformers' DynamicCache (its aten.cat rows); the measured "
                     "step writes a static KV cache in place: the modelled 'other' share holds concatenations the "
                     "measured step does not run")
    if say and progress:
        print(f"flyexplore: measuring {len(spec.backends)} variant(s) of {case.label} {spec.dtypes[0]} "
              "(each compiled variant compiles and autotunes first: minutes on a GPU)", file=sys.stderr)
    frame = run_sweep(spec, progress=progress)
    cov.measured = MeasuredStep(frame, cov.table, cov._proj(), tuple(notes))
    return cov
