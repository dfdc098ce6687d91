"""The history of runs as a figure, a report section and ``fx.history``: the trends and steps that
:mod:`flyexplore.results.history` reads from a store (:mod:`flyexplore.results.history_store`).

- :func:`figure`: per device model (one panel each, stacked) the geometric mean, the cases with
  the largest steps, or a build series, each run's point with its 95% interval, the fitted level
  as a step line and every step marked where it happened with its size and interval;
- :func:`history_section` / :func:`write_history_report`: the report (``flyexplore history show
  --out DIR``, :meth:`History.report`);
- :func:`history` / :class:`History`: the public face, ``fx.history(store, add=[...])``.

Every number comes from :func:`flyexplore.results.history.analyse`; this module only draws and
writes it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from flyexplore import atomic as A
from flyexplore.errors import UsageError, bad_choice
from flyexplore.results import history as H
from flyexplore.results.history_store import Added, Store
from flyexplore.views import plot_style as P
from flyexplore.views.export import IMAGE_FORMATS
from flyexplore.views.report import write_sections

#: What :func:`figure` draws.
WHATS = ("geomean", "cases", "build")
#: The colour of the geometric mean's points and level.
GEOMEAN_COLOR = "#1F77B4"
#: The colour of a step's dotted line.
STEP_COLOR = "#D62728"
#: Height of one panel (one device model or build run), px.
PANEL_HEIGHT = 330


def step_label(change: float, lo: float, hi: float) -> str:
    """A step's size and 95% interval as the figure writes it: ``+3.1% [+2.3, +3.9]`` (relative
    change of time in percent, > 0 slower)."""
    return f"{change * 100:+.1f}% [{lo * 100:+.1f}, {hi * 100:+.1f}]"


def _bad_top(top) -> None:
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise UsageError(f"bad top {top!r}: a number of series, 1 or more")


def _names(cases) -> list[str] | None:
    if cases is None:
        return None
    out = [cases] if isinstance(cases, str) else [str(c) for c in cases]
    if not out:
        raise UsageError("cases=[] names no case: give series names or case values, or None for the largest steps")
    return out


def _resolve(names: list[str], series: pd.DataFrame, what: str) -> list[str]:
    """The series named by ``names`` (each a whole series name ``op case dtype backend``, or a
    ``case`` value: every series of it), in the order given. Raises :class:`UsageError` naming
    the first unknown one and a few valid names."""
    out: list[str] = []
    known = set(series["series"])
    for n in names:
        hit = [n] if n in known else sorted(set(series.loc[series["case"].astype(str) == n, "series"]))
        if not hit:
            valid = sorted(known)
            shown = ", ".join(repr(v) for v in valid[:4]) + (f", ... ({len(valid)} in all)" if len(valid) > 4 else "")
            raise UsageError(f"unknown case {n!r} in the history's {what} (valid: a series name "
                             f"'op case dtype backend' or a case, e.g. {shown})")
        out += [h for h in hit if h not in out]
    return out


def _top_series(steps: pd.DataFrame, series: Sequence[str], top: int) -> list[str]:
    """The ``top`` series with the largest step (by |change|), then the others by name."""
    big = steps.assign(a=steps["change"].abs()).groupby("series")["a"].max() if len(steps) else pd.Series(dtype=float)
    return sorted(series, key=lambda s: (-float(big.get(s, 0.0)), s))[:top]


def _panels(titles: list[str], title: str, xtitle: str, ytitle: str):
    from plotly.subplots import make_subplots

    n = len(titles)
    fig = make_subplots(rows=n, cols=1, subplot_titles=titles,
                        vertical_spacing=min(0.1, 0.3 / max(n - 1, 1)) if n > 1 else 0.1)
    P.style_figure(fig, title, xtitle, ytitle, height=max(P.HEIGHT, 190 + PANEL_HEIGHT * n))
    fig.update_layout(margin=dict(t=130))
    fig.update_annotations(font_size=12)
    return fig


def _run_axis(fig, row: int, n: int) -> None:
    """Panel ``row``'s x axis: runs 1..``n``, whole numbers only (each run ticked up to 20)."""
    fig.update_xaxes(range=[0.5, n + 0.5], tickformat="d", row=row, col=1,
                     **(dict(tickmode="linear", tick0=1, dtick=1) if n <= 20 else {}))


def _mark_steps(fig, row: int, marks: list[tuple[float, float, str, str]]) -> None:
    """Mark steps in panel ``row``: a dotted vertical line at each distinct ``x`` and, for each
    ``(x, y, text, color)``, an annotation pointing at the new level (stacked where several
    steps lie within two runs)."""
    lines: set[float] = set()
    done: list[float] = []
    for x, y, text, color in marks:
        if x not in lines:
            lines.add(x)
            fig.add_vline(x=x, line_dash="dot", line_color=STEP_COLOR, line_width=1.5, row=row, col=1)
        k = sum(abs(x - x0) <= 2 for x0 in done)    # steps within two runs: labels stacked
        done.append(x)
        fig.add_annotation(x=x, y=y, text=text, showarrow=True, arrowhead=2, arrowcolor=color, ax=40,
                           ay=-30 - 18 * k, font=dict(color=color, size=11), bgcolor="rgba(255,255,255,0.8)",
                           name="step", row=row, col=1)


def _run_hover(d: pd.DataFrame, runs: pd.DataFrame, label: str) -> tuple[np.ndarray, str]:
    """customdata and hovertemplate of points at run positions ``d["position"]``: the run, its
    timestamp and commit, the value and its interval (columns ``text``)."""
    r = runs.set_index("position").reindex(d["position"].to_numpy())
    custom = np.column_stack([r["run_id"].astype(str).to_numpy(), r["timestamp"].fillna("").astype(str).to_numpy(),
                              r["commit"].fillna("").astype(str).str[:12].to_numpy(),
                              d["text"].to_numpy(dtype=object)])
    tmpl = (f"<b>{label}</b><br>run %{{x}}: %{{customdata[0]}}<br>%{{customdata[1]}} commit %{{customdata[2]}}"
            "<br>%{customdata[3]}<extra></extra>")
    return custom, tmpl


def _interval_text(y, lo, hi, unit: str = "x") -> list[str]:
    return [f"{v:.4f}{unit}" + (f" [{a:.4f}, {b:.4f}]" if np.isfinite(a) and np.isfinite(b) else " (no interval)")
            for v, a, b in zip(y, lo, hi)]


def _add_series(fig, row: int, x, d: pd.DataFrame, name: str, color: str, custom, tmpl, show: bool, meta: dict):
    """One series in panel ``row``: its points (``y``, whiskers ``y_lo``..``y_hi``) and its fitted
    level (``level``) as a step line."""
    import plotly.graph_objects as go

    cls = P.scatter_class(len(d))
    with_ci = P.has_intervals(d, "y_lo", "y_hi")
    fig.add_trace(cls(x=x, y=d["y"].to_numpy(float), mode="markers", name=name, legendgroup=name, showlegend=show,
                      marker=dict(color=color, size=6), customdata=custom, hovertemplate=tmpl,
                      error_y=dict(P.whiskers(d, "y", "y_lo", "y_hi"), color=color, thickness=1, width=2)
                      if with_ci else None, meta={**meta, "kind": "points"}), row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=d["level"].to_numpy(float), mode="lines", line_shape="hv",
                             name=f"{name}: fitted level", legendgroup=name, showlegend=False,
                             line=dict(color=color, width=2), hoverinfo="skip", meta={**meta, "kind": "level"}),
                  row=row, col=1)


def figure(an: H.Analysis, what: str = "geomean", cases: str | Sequence[str] | None = None, top: int = 8):
    """The history as a plotly figure, one panel per device model (stacked rows), x the run's
    position in time order (1 = the oldest run of that device model; hover: ``run_id``, timestamp,
    commit), each run's point with its 95% interval as whiskers, the fitted level
    (:func:`flyexplore.results.steps.fit`: piecewise constant, points weighted by their intervals)
    as a step line, and each step marked: a dotted line at the first run of the new level and its
    size and 95% interval (``+3.1% [+2.3, +3.9]``, relative change of time, > 0 slower).

    ``an``: :func:`flyexplore.results.history.analyse`'s result. ``what``:

    - ``geomean``: each run's time against the cases' own levels (the run effect of a two-way fit
      of cases and runs, :func:`flyexplore.results.history.run_effects`; the median run 1.0, > 1
      slower), as :func:`~flyexplore.results.history.analyse` gives it;
    - ``cases``: per panel the ``top`` series (``op case dtype backend``) with the largest steps,
      or those named in ``cases`` (series names or case values), each as time / its first
      fitted level (1.0 = where it started);
    - ``build``: the build series (an A/B of three or more environments; one panel per run), x
      the environments in the run's order, each as time / its time in the first environment;
      ``cases`` / ``top`` pick the series as above; steps are marked between the two builds.

    Traces carry ``meta`` ``{"group" (or "run_id"), "series", "kind": "points" | "level"}``.
    Raises :class:`UsageError` (one line) for another ``what``, a bad ``top``, an unknown case
    name, or ``build`` without a build series in the history."""
    if what not in WHATS:
        raise bad_choice("history figure", what, WHATS)
    _bad_top(top)
    names = _names(cases)
    if what == "build":
        return _build_figure(an, names, top)
    groups = sorted(an.runs["group"].unique())
    steps = an.steps
    store = f" of {an.store}" if an.store else ""
    rule = ("<br>whiskers: 95% interval; line: the fitted level (piecewise constant, each run weighted by its "
            "interval); dotted: a step, its size [95% interval]")
    if what == "geomean":
        title = (f"History{store}: geometric mean over each run's cases<br><sup>each run's time against the "
                 f"cases' own levels, the median run 1.0 (> 1: slower){rule}</sup>")
        fig = _panels(groups, title, "run (1 = oldest, time order)", "geomean of time / the cases' levels (x)")
        for i, g in enumerate(groups, 1):
            gm = an.geomean[an.geomean["group"] == g].sort_values("position")
            d = pd.DataFrame({"position": gm["position"].to_numpy(), "y": gm["geomean"].to_numpy(float),
                              "y_lo": gm["lo"].to_numpy(float), "y_hi": gm["hi"].to_numpy(float),
                              "level": gm["level"].to_numpy(float)})
            d["text"] = [t + f" over {c} cases" for t, c in zip(_interval_text(d["y"], d["y_lo"], d["y_hi"]),
                                                                 gm["cases"])]
            custom, tmpl = _run_hover(d, an.runs[an.runs["group"] == g], "geomean")
            _add_series(fig, i, d["position"] + 1, d, "geomean", GEOMEAN_COLOR, custom, tmpl, i == 1,
                        {"group": g, "series": H.GEOMEAN})
            st = steps[(steps["group"] == g) & (steps["series"] == H.GEOMEAN)] if len(steps) else steps
            _run_axis(fig, i, len(gm))
            _mark_steps(fig, i, [(int(s["position"]) + 1, float(s["after"]),
                                  step_label(s["change"], s["lo"], s["hi"]), GEOMEAN_COLOR)
                                 for _, s in st.iterrows()])
        return fig
    # cases
    chosen: dict[str, list[str]] = {}
    wanted = _resolve(names, an.trends, "series") if names is not None else None
    for g in groups:
        tr = an.trends[an.trends["group"] == g]
        have = sorted(tr["series"].unique())
        if names is not None:
            chosen[g] = [s for s in wanted if s in set(have)]
        else:
            st = steps[(steps["group"] == g) & (steps["series"] != H.GEOMEAN)] if len(steps) else steps
            chosen[g] = _top_series(st, have, top)
    which = "the cases named" if names is not None else f"per device model the {top} series with the largest steps"
    title = (f"History{store}: {which}<br><sup>time / the series' first fitted level (1.0: where it started; "
             f"> 1: slower){rule}</sup>")
    fig = _panels(groups, title, "run (1 = oldest, time order)", "time / first level (x)")
    for i, g in enumerate(groups, 1):
        tr = an.trends[an.trends["group"] == g]
        runs = an.runs[an.runs["group"] == g]
        marks = []
        for j, s in enumerate(chosen[g]):
            t = tr[tr["series"] == s].sort_values("position")
            first = float(t["level_ms"].iloc[0])
            d = pd.DataFrame({"position": t["position"].to_numpy(), "y": t["time_ms"].to_numpy(float) / first,
                              "y_lo": t["lo_ms"].to_numpy(float) / first, "y_hi": t["hi_ms"].to_numpy(float) / first,
                              "level": t["level_ms"].to_numpy(float) / first})
            d["text"] = [f"{v * 1e3:.2f} µs ({r:.4f}x the first level)"
                         + (f", 95% interval [{a * 1e3:.2f}, {b * 1e3:.2f}] µs"
                            if np.isfinite(a) and np.isfinite(b) else "")
                         for v, r, a, b in zip(t["time_ms"], d["y"], t["lo_ms"], t["hi_ms"])]
            color = P.SERIES_COLORS[j % len(P.SERIES_COLORS)]
            custom, tmpl = _run_hover(d, runs, s)
            _add_series(fig, i, d["position"] + 1, d, s, color, custom, tmpl, True, {"group": g, "series": s})
            st = steps[(steps["group"] == g) & (steps["series"] == s)] if len(steps) else steps
            marks += [(int(r["position"]) + 1, float(r["after"]) / first, step_label(r["change"], r["lo"], r["hi"]),
                       color) for _, r in st.iterrows()]
        _run_axis(fig, i, len(runs))
        _mark_steps(fig, i, marks)
    return fig


def _build_figure(an: H.Analysis, names: list[str] | None, top: int):
    bp = an.build_points
    if not len(bp):
        raise UsageError("no build series in the history (a run of an environment A/B of three or more "
                         "environments makes one: sweep --env A --env B --env C)")
    runs = list(dict.fromkeys(bp["run_id"]))
    store = f" of {an.store}" if an.store else ""
    title = (f"History{store}: build series, each case across the environments of one A/B run<br><sup>time / "
             "time in the first environment (> 1: slower)<br>whiskers: 95% interval; dotted: a step between two "
             "builds, its size [95% interval]</sup>")
    fig = _panels([f"build series {r}" for r in runs], title, "environment (run order)", "time / first build (x)")
    wanted = (_resolve(names, bp.assign(case=bp["series"].str.split(" ").str[1]), "build series")
              if names is not None else None)
    for i, rid in enumerate(runs, 1):
        d_run = bp[bp["run_id"] == rid]
        envs = d_run.drop_duplicates("env").sort_values("position")["env"].tolist()
        b = an.builds[an.builds["run_id"] == rid]
        have = sorted(d_run["series"].unique())
        pick = [s for s in wanted if s in set(have)] if wanted is not None else _top_series(b, have, top)
        marks = []
        for j, s in enumerate(pick):
            t = d_run[d_run["series"] == s].sort_values("position")
            first = float(t["time_ms"].iloc[0])
            d = pd.DataFrame({"y": t["time_ms"].to_numpy(float) / first, "y_lo": t["lo_ms"].to_numpy(float) / first,
                              "y_hi": t["hi_ms"].to_numpy(float) / first})
            color = P.SERIES_COLORS[j % len(P.SERIES_COLORS)]
            text = [f"{e}: {v * 1e3:.2f} µs ({r:.4f}x {t['env'].iloc[0]})"
                    for e, v, r in zip(t["env"], t["time_ms"], d["y"])]
            fig.add_trace(P.scatter_class(len(d))(
                x=t["position"].to_numpy(), y=d["y"].to_numpy(float), mode="lines+markers", name=s, legendgroup=s,
                line=dict(color=color, width=2), marker=dict(color=color, size=8), text=text,
                error_y=dict(P.whiskers(d, "y", "y_lo", "y_hi"), color=color) if P.has_intervals(d, "y_lo", "y_hi")
                else None, hovertemplate=f"<b>{s}</b><br>%{{text}}<extra></extra>",
                meta={"run_id": rid, "series": s, "kind": "points"}), row=i, col=1)
            y_of = dict(zip(t["env"], d["y"]))
            for _, r in b[b["series"] == s].iterrows():   # on the line between the two builds
                x = (envs.index(r["from_env"]) + envs.index(r["to_env"])) / 2
                y = (y_of.get(r["from_env"], 1.0) + y_of.get(r["to_env"], 1.0)) / 2
                marks.append((x, y, step_label(r["change"], r["lo"], r["hi"]), color))
        _mark_steps(fig, i, marks)
        fig.update_xaxes(tickmode="array", tickvals=list(range(len(envs))), ticktext=envs, row=i, col=1)
    return fig


# -- the report ------------------------------------------------------------------------------------

def steps_table(an: H.Analysis) -> pd.DataFrame:
    """The steps as a report shows them: the geometric mean's first, then the cases' by size;
    ``run`` is the position (1 = oldest) of the first run of the new level, ``change_pct`` /
    ``lo_pct`` / ``hi_pct`` the relative change of time and its 95% interval in percent (> 0
    slower), ``before`` / ``after`` the levels in ``unit`` (ms; the geomean's: time over each
    run effect, ``x median run``)."""
    st = an.steps
    if not len(st):
        return pd.DataFrame(columns=["group", "series", "run", "run_id", "prev_run_id", "timestamp", "commit",
                                     "direction",
                                     "change_pct", "lo_pct", "hi_pct", "before", "after", "unit", "newest", "runs"])
    st = st.assign(g=(st["series"] != H.GEOMEAN).astype(int), a=-st["change"].abs()).sort_values(["group", "g", "a"])
    return pd.DataFrame({"group": st["group"], "series": st["series"], "run": st["position"] + 1,
                         "run_id": st["run_id"], "prev_run_id": st["prev_run_id"], "timestamp": st["timestamp"],
                         "commit": st["commit"], "direction": st["direction"], "change_pct": st["change"] * 100,
                         "lo_pct": st["lo"] * 100, "hi_pct": st["hi"] * 100, "before": st["before"],
                         "after": st["after"], "unit": st["unit"], "newest": st["newest"],
                         "runs": st["runs"]}).reset_index(drop=True)


def history_section(page, an: H.Analysis) -> None:
    """Add the history section to a report page (:class:`flyexplore.views.report._Page`): what
    the numbers are and how steps are found, the summary ``flyexplore history show`` prints
    (:func:`flyexplore.results.history.show_lines`), the geometric mean's figure
    (:func:`figure`), the cases' figure where a case has a step, the steps table
    (:func:`steps_table`, ``tables/history_steps.*``), the build series' figure and steps where
    the store holds one, the runs (``tables/history_runs.*``) and the cross-run allowances."""
    n_runs = an.runs["run_id"].nunique()
    n_groups = an.runs["group"].nunique()
    page.h2(f"History: {n_runs} run{'s' * (n_runs != 1)} on {n_groups} device model{'s' * (n_groups != 1)}")
    page.p("Each case (op, case, dtype, backend) on each device model across its runs in time order: each run's "
           "median time with its 95% interval, and the geometric mean of each run's time against the cases' own "
           "levels (a two-way fit of cases and runs; the median run 1.0). Steps are where the fitted level "
           "changes: a piecewise-constant fit with a penalty per level, each run weighted by its interval and the "
           "series' own run-to-run spread (asv's "
           "approach; flyexplore.results.steps). Each step is given at the first run of the new level, with its "
           "size and 95% interval (> 0: slower).")
    page.pre("\n".join(H.show_lines(an)))
    page.fig("history_geomean", figure(an, "geomean"))
    cst = an.steps[an.steps["series"] != H.GEOMEAN] if len(an.steps) else an.steps
    if len(cst):
        page.fig("history_cases", figure(an, "cases"))
    page.h3(f"Steps ({len(an.steps)})")
    if len(an.steps):
        page.table("history_steps", steps_table(an))
    else:
        page.p("No step in any series: every series holds one level.")
    if len(an.build_points):
        page.h3(f"Build series ({an.build_points['run_id'].nunique()})")
        page.p("Each case across the environments of one A/B run (timed round by round in one run: no "
               "between-run part), and the steps between builds.")
        page.fig("history_build", figure(an, "build"))
        if len(an.builds):
            page.table("history_builds", an.builds)
        else:
            page.p("No step between builds.")
    page.h3("Runs")
    page.table("history_runs", an.runs.assign(run=an.runs["position"] + 1))
    page.h3("Cross-run allowance")
    page.table("history_allowances", an.allowances)


def _formats(formats) -> list[str]:
    if formats is None:
        return list(IMAGE_FORMATS)
    got = [formats] if isinstance(formats, str) else list(formats)
    for f in got:
        if f not in IMAGE_FORMATS:
            raise bad_choice("figure format", f, IMAGE_FORMATS)
    return got


def write_history_report(an: H.Analysis, out_dir: str | os.PathLike, title: str | None = None, static: bool = True,
                         formats: Sequence[str] | None = None) -> Path:
    """Write the history report (:func:`history_section`) to ``out_dir/report.html`` and return
    its path; tables under ``tables/`` (CSV, Markdown); with ``static`` the figures as
    ``figures/*.{png,svg,pdf}`` (``formats``, default all three) -- when static export is not
    possible here the report says why and is written without them. ``out_dir``: new, empty, or an
    earlier flyexplore report (replaced whole; :func:`flyexplore.views.report.check_report_dir`).
    Raises :class:`UsageError`, before anything is written, for an unknown format or another
    folder; :class:`~flyexplore.errors.WriteError` when a write fails midway."""
    fmts = _formats(formats)
    return write_sections([lambda page: history_section(page, an)], out_dir,
                          title or f"flyexplore history{': ' + an.store if an.store else ''}", static, fmts)


# -- fx.history ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HistoryGate:
    """What :meth:`History.gate` decided: ``failed`` (a rule that fails tripped) and ``lines``
    (the text ``flyexplore history show --fail-on`` prints)."""

    failed: bool
    lines: list[str]


class History:
    """A history store seen from Python (``fx.history``): add runs, read trends and steps, gate,
    export, draw and report. ``store``: the store's folder (default
    :func:`flyexplore.results.history_store.default_store`) or a
    :class:`~flyexplore.results.history_store.Store`. The analysis is read once and kept until an
    add (or another process's add: the index changed on disk). Readers raise
    :class:`UsageError` when there is no store yet or it holds no timed row."""

    def __init__(self, store: str | os.PathLike | Store | None = None):
        self.store = store if isinstance(store, Store) else Store(store)
        self._cache: tuple | None = None

    @property
    def path(self) -> Path:
        """The store's folder."""
        return self.store.path

    def add(self, files: str | os.PathLike | pd.DataFrame | Iterable[str | os.PathLike | pd.DataFrame]) -> Added:
        """Add result files or DataFrames of result rows (one, or several) to the store, as
        ``flyexplore history add`` does (:meth:`~flyexplore.results.history_store.Store.add`:
        a run already there changes nothing; a damaged or foreign file raises
        :class:`UsageError` naming it, and nothing is added). Returns the
        :class:`~flyexplore.results.history_store.Added` (``lines``: one per source)."""
        if isinstance(files, (str, os.PathLike, pd.DataFrame)):
            files = [files]
        out = self.store.add(list(files))
        self._cache = None
        return out

    def _key(self):
        try:
            s = self.store.index.stat()
            return (s.st_mtime_ns, s.st_size)
        except OSError:
            return None

    def _read(self) -> tuple[pd.DataFrame, H.Analysis]:
        key = self._key()
        if self._cache is None or self._cache[0] != key or key is None:
            pts = self.store.points()
            self._cache = (key, pts, H.analyse(pts, str(self.store.path)))
        return self._cache[1], self._cache[2]

    def points(self) -> pd.DataFrame:
        """Every indexed row with its run's fields (:meth:`~flyexplore.results.history_store.Store.points`), a copy."""
        return self._read()[0].copy()

    def analysis(self) -> H.Analysis:
        """Trends, steps, build series and allowances (:func:`flyexplore.results.history.analyse`),
        kept until the store changes."""
        return self._read()[1]

    @property
    def steps(self) -> pd.DataFrame:
        """The steps (a copy of :attr:`Analysis.steps`: ``series``, ``position``, ``run_id``,
        ``change`` / ``lo`` / ``hi`` as fractions of time, > 0 slower, ...)."""
        return self.analysis().steps.copy()

    @property
    def trends(self) -> pd.DataFrame:
        """Each case's points in run order (a copy of :attr:`Analysis.trends`; times in ms)."""
        return self.analysis().trends.copy()

    @property
    def geomean(self) -> pd.DataFrame:
        """The geometric mean per run (a copy of :attr:`Analysis.geomean`; time / the case's
        median, > 1 slower)."""
        return self.analysis().geomean.copy()

    @property
    def runs(self) -> pd.DataFrame:
        """The runs per device model in time order (a copy of :attr:`Analysis.runs`)."""
        return self.analysis().runs.copy()

    def show(self, top: int = 10) -> list[str]:
        """The lines ``flyexplore history show`` prints (:func:`flyexplore.results.history.show_lines`;
        ``top`` largest case steps per device model)."""
        _bad_top(top)
        return H.show_lines(self.analysis(), top)

    def to_dict(self) -> dict:
        """``flyexplore history show --json`` (:func:`flyexplore.results.history.show_dict`)."""
        return H.show_dict(self.analysis())

    def gate(self, fail_on, recent: int | None = None) -> HistoryGate:
        """``flyexplore history show --fail-on``: each series' newest step (of the newest
        ``recent`` runs when given) trips ``SLOWER:X`` when slower by more than ``X`` at its
        interval's favourable end (:func:`flyexplore.results.history.gate_steps`). Raises
        :class:`UsageError` for a rule other than SLOWER or a bad ``recent``."""
        failed, lines = H.gate_steps(self.analysis(), fail_on, recent)
        return HistoryGate(failed, lines)

    def allowance(self, device_id: str | None = None, device: str | None = None,
                  platform: str | None = None) -> H.Allowance:
        """The cross-run allowance (a fraction) ``flyexplore compare`` would use for two runs of
        ``device_id`` (a device key: a GPU's ``device_id``, a CPU's ``host/device``;
        :func:`flyexplore.results.history_store.device_keys`), or any device of the model
        ``device``: learned from identical runs in
        the store, else the platform's constant
        (:func:`flyexplore.results.history.learned_allowance`; ``basis`` says which). Neither
        given: the store's only device. ``platform`` defaults to that device's runs'. Raises
        :class:`UsageError` when neither is given and the store holds several devices."""
        pts = self._read()[0]
        key = "device_key" if "device_key" in pts else "device_id"   # a GPU's device_id, a CPU's host/device
        if device_id is None and device is None:
            ids = sorted({i for v in pts[key].dropna() for i in [str(v)] if i})
            if len(ids) != 1:
                raise UsageError(f"history allowance: name a device_id ({', '.join(ids[:5]) or 'the store has none'}"
                                 f"{' ...' if len(ids) > 5 else ''})")
            device_id = ids[0]
        if platform is None:
            sel = pts[(pts[key].astype(str) == str(device_id)) if device_id
                      else (pts["run_device"].astype(str) == str(device))]
            plats = sel["run_platform"].dropna().unique()
            platform = str(plats[0]) if len(plats) == 1 else None
        return H.learned_allowance(pts, device_id, device, platform)

    def export(self, path: str | os.PathLike, format: str = "bmf", run: str | None = None) -> Path:
        """Write one run (default: the newest) for a benchmark dashboard to the JSON file
        ``path``, whole or not at all (:func:`flyexplore.atomic.write_text`): ``bmf`` (Bencher
        Metric Format, latency in ns with the 95% interval as bounds) or
        ``github-action-benchmark`` (ms; :func:`flyexplore.results.history.export`). Returns the
        path. Raises :class:`UsageError`, with nothing written, for another format, an unknown
        ``run``, an empty store or a ``path`` that is a folder or inside the store."""
        data = H.export(self._read()[0], format, run)
        p = Path(path)
        self.store.check_outside(p, "export file")
        if p.is_dir():
            raise UsageError(f"history export: {str(p)!r} is a folder; give a file name (e.g. {str(p / 'bmf.json')!r})")
        return A.write_text(p, json.dumps(data, indent=1) + "\n")

    def figure(self, what: str = "geomean", cases: str | Sequence[str] | None = None, top: int = 8):
        """The history as a plotly figure (:func:`figure`: ``geomean``, ``cases`` or ``build``)."""
        return figure(self.analysis(), what, cases, top)

    def report(self, out: str | os.PathLike, static: bool = True, formats: Sequence[str] | None = None,
               title: str | None = None) -> Path:
        """Write the history report into the folder ``out`` and return its ``report.html``
        (:func:`write_history_report`). Raises :class:`UsageError` for a folder inside the store."""
        self.store.check_outside(out, "report folder")
        return write_history_report(self.analysis(), out, title, static, formats)

    def __repr__(self) -> str:
        if not self.store.exists():
            return (f"History at {str(self.path)!r}: no store yet "
                    "(fx.history(store, add=[files]) or flyexplore history add FILE... --store DIR makes one)")
        try:
            return "\n".join(self.show())
        except UsageError as exc:
            return f"History at {str(self.path)!r}: {exc}"


def history(store: str | os.PathLike | Store | None = None,
            add: str | os.PathLike | pd.DataFrame | Iterable | None = None) -> History:
    """The history store at ``store`` (a folder; default ``$FLYEXPLORE_HISTORY``, else
    ``$XDG_DATA_HOME/flyexplore/history``, else ``~/.local/share/flyexplore/history``:
    :func:`flyexplore.results.history_store.default_store`) as a :class:`History`, after adding
    ``add`` (result files or DataFrames of result rows; :meth:`History.add`) when given.
    ``fx.history(store).steps``, ``.figure()``, ``.report(out)``, ``.gate("SLOWER:3%")``,
    ``.export("bmf.json")``. Raises :class:`UsageError` for a ``store`` that is a file or another
    folder, or a file ``add`` refuses (nothing added)."""
    h = History(store)
    if add is not None:
        h.add(add)
    return h
