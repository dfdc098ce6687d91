"""A model's coverage shown: the modelled-time figure, a report section, terminal and Markdown text.

:func:`coverage_figure` stacks the model's modelled time (µs, the roofline of
:mod:`flyexplore.results.model`) per phase and view, one bar segment per category: eligible
first, then each reason a call is not. :func:`model_section` adds the coverage to a report page
(:func:`flyexplore.views.report.write_report`'s ``sections``); :func:`write_model_report` writes
a report of the coverage alone; :func:`coverage_text` and :func:`coverage_markdown` are what
``flyexplore model`` prints and writes with ``--md``. Every table says what its numbers are:
captured from the model, modelled, projected, or measured.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import pandas as pd

from flyexplore.atomic import write_file
from flyexplore.errors import UsageError
from flyexplore.insight import coverage as CV
from flyexplore.insight import hf as HF
from flyexplore.insight.capture import Capture, check_target, views_of
from flyexplore.results import model as RM
from flyexplore.results import table as R
from flyexplore.views.plot_style import SERIES_COLORS, style_figure
from flyexplore.views.report import write_sections
from flyexplore.world.readiness import check_arch

_ELIGIBLE = "#2CA02C"
#: What the modelled time is, said wherever it is shown.
MODELLED_NOTE = ("a roofline per call on the target's datasheet peaks, max(FLOPs / (peak x achieved), bytes / "
                 "(bandwidth x achieved)), with the fraction of peak each kernel class achieves "
                 "(flyexplore.results.peaks.ACHIEVED: GEMM, SDPA flash or memory-efficient, fused and unfused "
                 "pointwise); the eager view's pointwise calls are one ATen kernel each, the compiled view's are "
                 "grouped as Inductor fuses them, one pass over memory per group (flyexplore.results.fusion)")


def _category_colors(cats: Sequence[str]) -> dict[str, str]:
    others = [c for c in cats if c not in ("eligible", "no FlyDSL path (other ops)")]
    out = {"eligible": _ELIGIBLE, "no FlyDSL path (other ops)": "#C7C7C7"}
    pal = [c for c in SERIES_COLORS if c != "#2CA02C"] + ["#AEC7E8", "#FFBB78", "#98DF8A", "#FF9896", "#C5B0D5"]
    for i, c in enumerate(others):
        out[c] = pal[i % len(pal)]
    return out


def coverage_figure(table: pd.DataFrame, title: str | None = None):
    """Stacked bars of the modelled time (µs) per ``model phase (view)``, one segment per
    category of :func:`flyexplore.results.model.coverage_table` (``eligible`` green at the
    bottom, then the reasons, largest first; every call without a FlyDSL path is one grey segment,
    "no FlyDSL path (other ops)"). The title says the time is modelled (roofline on the
    target's datasheet peaks), not measured. Raises :class:`~flyexplore.errors.UsageError` for an
    empty table."""
    import plotly.graph_objects as go

    if table is None or table.empty:
        raise UsageError("no captured calls to plot")
    cat = table["category"].where(~table["category"].str.startswith("no FlyDSL path"), "no FlyDSL path (other ops)")
    t = table.assign(bar=table["model"].astype(str) + " " + table["step"].astype(str) + " (" + table["view"] + ")",
                     category=cat)
    g = t.groupby(["bar", "category"], sort=False)["modelled_total_us"].sum().reset_index()
    order = g.groupby("category")["modelled_total_us"].sum().sort_values(ascending=False).index.tolist()
    if "eligible" in order:
        order.remove("eligible")
        order.insert(0, "eligible")
    colors = _category_colors(order)
    bars = list(dict.fromkeys(t["bar"]))
    fig = go.Figure()
    for cat in order:
        d = g[g["category"] == cat].set_index("bar").reindex(bars)
        fig.add_bar(x=bars, y=d["modelled_total_us"].fillna(0.0), name=cat, marker_color=colors[cat],
                    hovertemplate="%{x}<br>" + cat.replace("%", "%%") + ": %{y:.1f} µs<extra></extra>")
    fig.update_layout(barmode="stack", legend_traceorder="reversed")  # the legend reads as the stack, top down
    peaks = table.attrs.get("peaks") or "datasheet peaks"
    dev = peaks.split(":", 1)[0]
    style_figure(fig, title or f"Modelled time by FlyDSL verdict (roofline on {dev} datasheet peaks at each kernel "
                 "class's achieved fraction; modelled, not measured)", "", "modelled time per step (µs)", legend_title="category")
    return fig


def _assumptions(table: pd.DataFrame) -> list[str]:
    """Every capture's assumptions in the table's ``attrs``, each once, in order."""
    return list(dict.fromkeys(x for v in table.attrs.get("assumptions", {}).values() for x in v))


def _pct(v) -> str:
    return "" if v != v else f"{v:.1%}"


def _uncaptured(table: pd.DataFrame) -> list[dict]:
    """What was not captured, each (op, module, reason) once over the table's steps and views."""
    seen, out = set(), []
    for u in table.attrs.get("uncaptured") or []:
        k = (u.get("op"), u.get("module"), u.get("reason"))
        if k not in seen:
            seen.add(k)
            out.append(u)
    return out


def advice_label(a: dict) -> str:
    """How an advice item is introduced: ``what-if (re-judged)`` for a change whose calls were
    re-judged, ``note`` for a statement derived from the capture (``kind="note"``)."""
    return "note" if a.get("kind") == "note" else "what-if (re-judged)"


def coverage_text(table: pd.DataFrame, advice: Iterable[dict] = (), projection: pd.DataFrame | None = None,
                  width: int = 90) -> str:
    """The terminal view: per capture the layers line, the eligible shares, a table of the
    judged calls (GEMMs, grouped GEMMs, RMSNorm, TopK, attention, largest modelled share first;
    other calls summed on one line), the what-if lines, the projection and the assumptions."""
    lines: list[str] = []
    summ = RM.summary(table)
    layers = table.attrs.get("layers", {})
    for (model, step, view), d in table.groupby(["model", "step", "view"], sort=False):
        key = f"{model} {step} {view}"
        s = summ[(summ["model"] == model) & (summ["step"] == step) & (summ["view"] == view)].iloc[0]
        lines.append(f"== {model} {step} ({view} view): {layers.get(key, '')}")
        lines.append(f"   eligible: {int(s['eligible_calls'])} of {int(s['calls'])} kernel calls, "
                     f"{_pct(s['eligible_flops_share'])} of FLOPs (captured), {_pct(s['eligible_modelled_share'])} "
                     f"of modelled time ({s['modelled_us']:.0f} µs per step, modelled)")
        judged = d[d["family"].notna()].sort_values("modelled_share", ascending=False, kind="stable")
        rest = d[d["family"].isna()]
        cols = ["count", "op", "shapes", "module", "status", "flops_share", "modelled_share", "reason"]
        show = judged[cols].copy()
        show["op"] = show["op"].str.replace("aten.", "", regex=False).str.replace(".default", "", regex=False)
        show["flops_share"] = show["flops_share"].map(_pct)
        show["modelled_share"] = show["modelled_share"].map(_pct)
        show["reason"] = show["reason"].map(lambda r: r if len(r) <= width else r[:width - 1].rstrip() + "…")
        show = show.rename(columns={"flops_share": "FLOPs", "modelled_share": "modelled"})
        if len(show):
            lines.append("   " + show.to_string(index=False).replace("\n", "\n   "))
        if len(rest):
            lines.append(f"   + {int(rest['count'].sum())} other calls ({rest['op'].nunique()} ATen ops, no FlyDSL "
                         f"path): {_pct(rest['flops_share'].sum())} of FLOPs, "
                         f"{_pct(rest['modelled_share'].sum())} of modelled time")
        for a in advice:
            if a.get("view") == view and a.get("step", step) == step and a.get("model", model) == model:
                lines.append(f"   {advice_label(a)}: {a['text']}")
        lines.append("")
    if projection is not None and len(projection):
        lines.append("projection: " + projection.attrs.get("assumptions", ""))
        for r in projection.itertuples(index=False):
            lines.append(f"   {r.model} {r.step} ({r.view}): whole-model kernel-time speedup {r.speedup:.3f}x "
                         f"[{r.speedup_lo:.3f}, {r.speedup_hi:.3f}] from {r.source} speedups; "
                         f"{r.covered_share:.1%} of modelled time covered")
        lines.append("")
    lines.append("(reasons longer than the table's column end in …: --md or --json print them whole)")
    unc = _uncaptured(table)
    if unc:
        lines.append(f"not captured ({len(unc)}):")
        for u in unc[:20]:
            lines.append(f"   {u['op']} in {u['module'] or '(top)'} ({u.get('module_type', '')}): {u['reason']}")
    else:
        lines.append("not captured: none (every call of the step was recorded)")
    lines.append("assumptions:")
    lines += [f"   - {x}" for x in _assumptions(table)]
    if table.attrs.get("peaks"):
        lines.append(f"   - modelled time: {MODELLED_NOTE} ({table.attrs['peaks']})")
    return "\n".join(lines)


def coverage_markdown(table: pd.DataFrame, advice: Iterable[dict] = (), projection: pd.DataFrame | None = None) -> str:
    """The coverage as Markdown: a summary table, the judged calls, the what-if lines, the
    projection (labelled as one) and the assumptions."""
    out = ["# Model coverage", ""]
    summ = RM.summary(table)
    out.append("Eligible shares (FLOPs and bytes: captured from the model; time: modelled).")
    out.append("")
    out.append(summ.assign(**{c: summ[c].map(_pct) for c in ("eligible_flops_share", "eligible_bytes_share",
                                                                "eligible_modelled_share")}).to_markdown(index=False))
    out.append("")
    judged = table[table["family"].notna()]
    cols = ["model", "step", "view", "count", "op", "shapes", "module", "status", "category", "flops_share",
            "modelled_share", "reason"]
    out.append("## Calls with a FlyDSL route")
    out.append("")
    out.append(judged[cols].assign(flops_share=judged["flops_share"].map(_pct),
                                   modelled_share=judged["modelled_share"].map(_pct)).to_markdown(index=False))
    adv = list(advice)
    if adv:
        out += ["", "## What-if (each re-judged) and notes", ""]
        out += [f"- {a.get('model', '')} {a.get('step', '')} ({a['view']}), {advice_label(a)}: {a['text']}" for a in adv]
    if projection is not None and len(projection):
        out += ["", "## Projection (not a measurement)", "", projection.attrs.get("assumptions", ""), "",
                projection.to_markdown(index=False)]
    unc = _uncaptured(table)
    out += ["", "## Not captured", ""]
    out += ([f"- {u['op']} in {u['module'] or '(top)'} ({u.get('module_type', '')}): {u['reason']}" for u in unc]
            or ["- none (every call of the step was recorded)"])
    out += ["", "## Assumptions", ""]
    out += [f"- {x}" for x in _assumptions(table)]
    if table.attrs.get("peaks"):
        out.append(f"- modelled time: {MODELLED_NOTE} ({table.attrs['peaks']})")
    return "\n".join(out) + "\n"


def model_section(table: pd.DataFrame, advice: Iterable[dict] = (), projection: pd.DataFrame | None = None):
    """A report section (``f(page)`` for :func:`flyexplore.views.report.write_report`'s
    ``sections``): the figure, the shares per category, the judged calls, what-if, projection and
    assumptions."""
    adv = list(advice)

    def add(page):
        page.h2("Model coverage")
        page.p("FLOPs and bytes are captured from the model's calls; the time is modelled (roofline on "
               f"{table.attrs.get('peaks', 'datasheet peaks')}), not measured.", cls="note")
        page.fig("model_coverage", coverage_figure(table))
        page.table("model_summary", RM.summary(table))
        page.h3("Shares per category")
        page.table("model_shares", RM.shares(table, "category"))
        page.h3("Calls with a FlyDSL route")
        page.table("model_calls", table[table["family"].notna()].drop(columns=["notes"]))
        if adv:
            page.h3("What-if (each re-judged) and notes")
            for a in adv:
                page.p(f"{a.get('model', '')} {a.get('step', '')} ({a['view']}), {advice_label(a)}: {a['text']}")
        if projection is not None and len(projection):
            page.h3("Projection (not a measurement)")
            page.p(projection.attrs.get("assumptions", ""), cls="note")
            page.table("model_projection", projection)
        page.h3("Assumptions")
        page.pre("\n".join(f"- {x}" for x in _assumptions(table) + [f"modelled time: {MODELLED_NOTE}"]))
    return add


def write_model_report(table: pd.DataFrame, out_dir: str | Path, advice: Iterable[dict] = (),
                       projection: pd.DataFrame | None = None, title: str = "flyexplore model coverage",
                       static: bool = True) -> Path:
    """Write ``report.html`` (and tables, and the figure as images when ``static``) of a model's
    coverage into ``out_dir`` (the rules of :func:`flyexplore.views.report.check_report_dir`).
    Returns its path."""
    return write_sections([model_section(table, advice, projection)], out_dir, title, static=static)


def _no_nan(obj):
    """``obj`` with every float NaN replaced by ``None`` (dicts and lists walked)."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_no_nan(v) for v in obj]
    return obj


def _records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts with missing values as ``None`` (JSON ``null``, never ``NaN``)."""
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


class Projection(NamedTuple):
    """A projection (:func:`flyexplore.results.model.projection`): ``calls`` (per eligible call its
    speedup and matched case) and ``summary`` (per step and view, the whole-model speedup with its
    interval). A projection, never a measurement."""

    calls: pd.DataFrame
    summary: pd.DataFrame


class ModelCoverage:
    """A model's captured steps judged, with every view of them (what ``fx.model`` returns and
    ``flyexplore model`` prints).

    ``judged``: :class:`~flyexplore.insight.coverage.Judged` per captured phase and view;
    ``table``: :func:`flyexplore.results.model.coverage_table`; ``advice``: the what-if lines;
    ``projection``: ``(calls, summary)`` of :func:`flyexplore.results.model.projection` or ``None``;
    ``routing``: the MoE routing assumption."""

    def __init__(self, judged, projection=None, routing: str = "uniform"):
        self.judged = list(judged)
        self.table = RM.coverage_table(self.judged)
        self.advice = [a for j in self.judged for a in j.advice]
        self.projection = Projection(*projection) if projection is not None else None
        self.routing = routing
        #: a :class:`flyexplore.views.model_step.MeasuredStep` when the step was measured
        #: (``fx.model(..., measure=True)``), else ``None``
        self.measured = None

    def __repr__(self) -> str:
        s = self.summary()
        parts = [f"{r.model} {r.step} ({r.view}): {int(r.eligible_calls)}/{int(r.calls)} calls eligible, "
                 f"{r.eligible_flops_share:.0%} of FLOPs" for r in s.itertuples()]
        return "ModelCoverage(" + "; ".join(parts) + ") -- .text() for the whole answer"

    def advice_table(self) -> pd.DataFrame:
        """The what-if advice as a table: ``model, step, view, rule, calls, eligible_after, text``."""
        cols = ["model", "step", "view", "rule", "calls", "eligible_after", "text"]
        return pd.DataFrame([{k: a.get(k) for k in cols} for a in self.advice], columns=cols)

    @property
    def captures(self):
        return [j.capture for j in self.judged]

    def shares(self, by: str = "category") -> pd.DataFrame:
        """:func:`flyexplore.results.model.shares` of the table."""
        return RM.shares(self.table, by)

    def summary(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model.summary` of the table."""
        return RM.summary(self.table)

    def shapes(self) -> pd.DataFrame:
        """:func:`flyexplore.results.model.export_shapes`: the calls as sweep input."""
        return RM.export_shapes(self.judged, self.routing)

    def export_shapes(self, path) -> int:
        """Write :meth:`shapes` as CSV to ``path`` whole or not at all (:mod:`flyexplore.atomic`;
        :class:`~flyexplore.errors.WriteError` on a failed write); returns the number of rows."""
        s = self.shapes()
        write_file(path, lambda t: s.to_csv(t, index=False))
        return len(s)

    def _proj(self):
        return self.projection[1] if self.projection is not None else None

    def text(self) -> str:
        """:func:`coverage_text`, then the measured step where there is one."""
        t = coverage_text(self.table, self.advice, self._proj())
        return t + ("\n\n" + self.measured.text() if self.measured is not None else "")

    def markdown(self) -> str:
        """:func:`coverage_markdown`, then the measured step where there is one."""
        t = coverage_markdown(self.table, self.advice, self._proj())
        return t + ("\n\n" + self.measured.markdown() if self.measured is not None else "")

    def figure(self, title: str | None = None):
        """:func:`coverage_figure`."""
        return coverage_figure(self.table, title)

    def section(self):
        """:func:`model_section` for a report."""
        return model_section(self.table, self.advice, self._proj())

    def report(self, out_dir, static: bool = True) -> Path:
        """:func:`write_model_report` into ``out_dir``, with the measured step's section after the
        coverage where the step was measured."""
        if self.measured is None:
            return write_model_report(self.table, out_dir, self.advice, self._proj(), static=static)
        return write_sections([self.section(), self.measured.section()], out_dir, "flyexplore model coverage",
                              static=static)

    def to_dict(self) -> dict:
        """Everything as plain data (``flyexplore model --json``): per capture its label, phase,
        view, layers, assumptions, uncaptured calls, and every distinct call with shapes,
        arguments (strides and offsets where not contiguous), count, verdict, reason, kernel,
        FLOPs, bytes, shares and modelled time; the what-if advice; the projection if any."""
        caps = []
        for j in self.judged:
            c = j.capture
            key = (c.meta.get("model", c.label), c.step, c.view)
            rows = self.table[(self.table["model"] == key[0]) & (self.table["step"] == key[1])
                              & (self.table["view"] == key[2])]
            caps.append({"label": c.label, "model": key[0], "step": c.step, "phase": c.phase, "view": c.view,
                         "arch": c.arch,
                         "meta": {k: v for k, v in c.meta.items() if k not in ("model",)},
                         "layers": c.layers.get("text"), "layer_kinds": c.layers.get("kinds"),
                         "assumptions": list(dict.fromkeys(c.assumptions)), "uncaptured": c.uncaptured,
                         "calls": _records(rows.drop(columns=["model", "step", "phase", "view"]))})
        out = {"kinds": {"flops": "captured from the model", "bytes": "captured from the model",
                         "modelled_us": f"modelled (roofline on {self.table.attrs.get('peaks')})"},
               "captures": caps, "advice": self.advice}
        if self.projection is not None:
            calls, summ = self.projection
            out["projection"] = {"kind": "projection (not a measurement)",
                                 "assumptions": summ.attrs.get("assumptions"),
                                 "summary": _records(summ), "calls": _records(calls)}
        if self.measured is not None:
            out["measured"] = self.measured.to_dict()
        return _no_nan(out)


def judge_captures(captures, *, arch: str | None = None, project: str | None = None, speedups=None,
                   routing: str = "uniform") -> ModelCoverage:
    """A :class:`ModelCoverage` of captures already made (:func:`flyexplore.insight.capture.capture`
    of any ``nn.Module``, or :func:`flyexplore.insight.hf.capture_model`): each judged for ``arch``
    (default: the arch it was captured for), with what-if advice and, with ``project``, a projection
    (as :func:`model_coverage`). Raises :class:`UsageError` for something that is not a capture."""
    caps = [captures] if isinstance(captures, Capture) else list(captures)
    if not caps or not all(isinstance(c, Capture) for c in caps):
        raise UsageError("judge_captures takes a Capture or a list of them (fx.capture's result)")
    envs = {}
    judged = []
    for c in caps:
        a = arch or c.arch
        check_target(a)
        envs.setdefault(a, CV.Envs(a))
        judged.append(CV.judge_capture(c, envs[a]))
    proj = None
    if project:
        res = None
        if project == "results":
            if speedups is None:
                raise UsageError("a projection from results needs a result file (speedups=)")
            res = speedups if isinstance(speedups, pd.DataFrame) else R.load(speedups)
        proj = RM.projection(judged, project, results=res)
    return ModelCoverage(judged, proj, routing)


def model_coverage(hf: str | None = None, config=None, *, phases=(("prefill", 1, 2048),),
                   views: str | Sequence[str] = ("eager", "compiled"),
                   arch: str = "gfx950", routing: str = "uniform", device: str = "cuda:0",
                   project: str | None = None, speedups=None, force: bool = False, say: bool = True) -> ModelCoverage:
    """Capture, judge and tabulate a Hugging Face model (what ``fx.model`` and ``flyexplore
    model`` run): :func:`flyexplore.insight.hf.capture_phases` for each ``(phase, batch, seq)``
    in ``views``, :func:`flyexplore.insight.coverage.judge_capture` for ``arch``, and with
    ``project`` (``published`` / ``results``) :func:`flyexplore.results.model.projection`
    (``speedups``: a result file or frame for ``results``). ``force``: run a model past
    :data:`flyexplore.insight.hf.MODEL_LIMITS` (512 layers, 2,048 experts, an estimated 30 min,
    the memory available); ``say``: print the estimate of a long run and the config's notes to
    stderr first. Raises :class:`~flyexplore.errors.UsageError` for bad input (unknown model,
    phase, view, arch, routing; a config number that cannot describe a model; a model past the
    limits; a model_type transformers does not know), all before torch is touched; then, once
    transformers' config is read, a model flyexplore does not capture (an encoder-decoder, decode
    on an encoder; :func:`flyexplore.insight.hf.model_scope`), a config transformers cannot build,
    and a phase past the built model's position table; and
    :class:`~flyexplore.insight.capture.CaptureError` naming the module where a capture failed."""
    check_arch(arch)
    check_target(arch)
    views = views_of(views)
    phases = [tuple(p) for p in phases]
    for p in phases:
        if len(p) != 3:
            raise UsageError(f"a phase is (phase, batch, seq), got {p!r}")
        HF.check_phase(*p)
    caps = HF.capture_phases(hf, config, phases=phases, views=views, routing=routing, arch=arch, device=device,
                             force=force, say=say)
    return judge_captures(caps, arch=arch, project=project, speedups=speedups, routing=routing)
