"""The sweep panel's environment A/B area, :class:`ABArea`. UI only; the panel
(:class:`flyexplore.ui.panel.SweepPanel`) owns one and calls it.

An environment A/B (``SweepPanel(..., envs=[...])``): the environments are picked in the area's
:class:`~flyexplore.ui.envs.EnvPicker` and go into the same
:class:`~flyexplore.run.spec.SweepSpec` that ``fx.sweep(..., envs=...)`` builds; its rows (one per
arm, ``backend@env``) come through the panel's ``on_row`` path, each case's once its last pair of
workers has timed it. The A/B figures (:func:`flyexplore.views.plots_compare.ab_figure` of two
environments paired round by round, the AOTriton figure for attention rows, and with three or
more environments the build-series figure, :func:`flyexplore.views.series.series_figure`) are
drawn with the panel's table, at most every ``TABLE_S`` seconds of :mod:`flyexplore.ui.panel`
and once at the end.
"""
from __future__ import annotations

import json
from typing import Any, Callable

import ipywidgets as W
import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.results import table as R
from flyexplore.results.aotriton_ab import ab_view
from flyexplore.results.compare import env_sides, pair
from flyexplore.run.envs import check_envs
from flyexplore.run.spec import SweepSpec
from flyexplore.ui.envs import EnvPicker
from flyexplore.ui.widget_base import Sync, html_span
from flyexplore.views import plots_compare
from flyexplore.views.aotriton import aotriton_ab_figure
from flyexplore.views.series import series_figure

#: Environments from which an A/B also draws the build-series figure (each case's speedup
#: against the first environment, across the environments in order).
SERIES_ENVS = 3


class ABArea:
    """The environment A/B part of a sweep panel: the environment picker, the baseline as an arm
    of the A/B, the A/B status text, and the figures area redrawn from the panel's rows.

    ``envs``, ``aa``, ``pairs``: as :class:`~flyexplore.ui.panel.SweepPanel` takes them --
    ``envs`` the environments as ``fx.sweep(envs=...)`` takes them (texts, one environment each:
    ``"NAME"``, ``"NAME=/path/to/python"``, ``"NAME:VAR=VALUE,..."``;
    :func:`flyexplore.run.envs.parse_env`), ``aa`` the first environment against a copy of itself
    (with no ``envs``, this interpreter), ``pairs`` the fresh pairs of workers (``"auto"``, the
    default: :data:`flyexplore.run.envs.PAIRS`, then more while a label is AMBIGUOUS; or a number). Either of ``envs`` and ``aa`` makes the area
    :attr:`active`, with an :attr:`env_picker` (an :class:`~flyexplore.ui.envs.EnvPicker`: one
    environment per line, A/A, pairs, Check); otherwise it holds no picker, shows nothing and
    draws nothing. Names or variables that do not parse raise :class:`UsageError` here, as in
    ``fx.sweep`` (the interpreters are started on Check and Run), and so does ``pairs`` without an
    A/B. ``on_pick``: called when :attr:`ab_with` is changed from outside the area (the panel then
    redraws: :meth:`draw` with its rows).

    The figures area: :attr:`ab_with` (Dropdown: the environment set against the baseline arm's,
    side A; default the last), :attr:`message` (HTML: what the figures show, or why none yet),
    :attr:`view` (``Output``: the figures) and :attr:`figures` (``{"ab": ..., "aotriton": ...,
    "series": ...}``, plotly figures: :func:`flyexplore.views.plots_compare.ab_figure` of the two
    environments' rows paired round by round, time A / time B per case and backend; for attention
    pairs :func:`flyexplore.views.aotriton.aotriton_ab_figure`; with :data:`SERIES_ENVS` or more
    environments the build-series figure, :func:`flyexplore.views.series.series_figure`: each
    case's speedup in every environment against the first, the environments in the run's order).

    What the panel calls: :attr:`header` and :attr:`box` (its widgets, above Run and below the
    speedup figure), :attr:`inputs` (disabled while a sweep runs), :attr:`options` (for the
    spec), :meth:`baseline_choices` and :meth:`baseline_arm` (the baseline dropdown's arms),
    :meth:`follow_baseline`, :meth:`start` (a run's environments and pairs; its message),
    :meth:`status` (the progress line's note), :meth:`clear` and :meth:`draw`.
    """

    def __init__(self, envs=None, aa: bool = False, pairs: int | str | None = None,
                 on_pick: Callable[[], None] | None = None):
        if envs is not None or aa:
            env_lines = [envs] if isinstance(envs, str) else list(envs or ())
            check_envs(env_lines, aa)   # names and variables: a bad one raises here, as in fx.sweep
            self.env_picker: EnvPicker | None = EnvPicker([str(e) for e in env_lines], aa=aa, pairs=pairs)
        else:
            if pairs is not None:
                raise UsageError("pairs is for an environment A/B: give envs (or aa=True)")
            self.env_picker = None
        self._sync = Sync()
        #: the environments' names of the A/B shown (picked; at Run, the spec's)
        self.names: list[str] = ([] if self.env_picker is None else
                                 [e.name for e in check_envs(self.env_picker.lines(), self.env_picker.aa.value)])
        #: pairs of workers of the A/B running (0: no A/B)
        self.pairs = 0
        #: the figures drawn last: ``{"ab": ..., "aotriton": ..., "series": ...}``
        self.figures: dict[str, Any] = {}
        self.ab_with = W.Dropdown(description="A/B with", options=[],
                                  tooltip="the environment set against the baseline arm's in the A/B figure")
        self.message = W.HTML()
        self.view = W.Output()
        self._on_pick = on_pick
        self.ab_with.observe(self._ab_with_changed, names="value")
        ep = self.env_picker
        #: the widgets above Run: the environments' title and the picker
        self.header: list[W.Widget] = [] if ep is None else [
            W.HTML("<b>Environments</b> (an A/B: each backend timed in every environment, round by round)"),
            ep.widget]
        #: the A/B figures area (empty without an A/B)
        self.box = W.VBox([W.HTML("<b>A/B</b>"), self.ab_with, self.message, self.view] if ep is not None else [])
        #: the picker's inputs, disabled while a sweep runs
        self.inputs: tuple[W.Widget, ...] = () if ep is None else (ep.text, ep.aa, ep.pairs, ep.check_button)

    @property
    def active(self) -> bool:
        """Whether the panel runs an environment A/B (it has an :attr:`env_picker`)."""
        return self.env_picker is not None

    @property
    def options(self) -> dict:
        """What the spec takes from the picker (``envs``, ``aa``, ``pairs``; ``{}`` without an
        A/B). Raises :class:`UsageError` for environment text that does not parse."""
        return {} if self.env_picker is None else self.env_picker.options

    # -- the baseline arm ------------------------------------------------------------------
    def baseline_choices(self, registered: str, backends: list[str], current: str | None, arms=None,
                         default: str | None = None) -> tuple[tuple[str, ...], str | None]:
        """The baseline dropdown's options and value in an A/B: the arms (``arms``, else every
        one of ``backends`` in every environment, in environment order), and ``current`` if it is
        one, else ``default``, else the ``registered`` baseline in the first environment, else
        the first arm."""
        opts = tuple(arms) if arms is not None else tuple(R.arm_name(b, n) for n in self.names for b in backends)
        first = R.arm_name(registered, self.names[0]) if self.names else None
        first = default if default in opts else first if first in opts else (opts[0] if opts else None)
        return opts, (current if current in opts else first)

    def baseline_arm(self, op, baseline: str, options) -> str:
        """The arm a ``baseline`` given to the panel names: ``backend@env``, or a backend taken in
        the first environment. Raises :class:`UsageError` when it is not one of ``options``."""
        b, e = R.split_arm(baseline)
        arm = R.arm_name(op.get_backend(b).name, e or self.names[0])
        if arm not in options:
            raise UsageError(f"baseline {baseline!r} is not an arm of the A/B ({', '.join(options)})")
        return arm

    def follow_baseline(self, baseline: str | None) -> None:
        """The environments :attr:`ab_with` offers: every one but the ``baseline`` arm's (side A),
        the value kept if still there, else the last. Nothing without an A/B."""
        if not self.active:
            return
        names = self.names
        a = R.split_arm(baseline)[1] if baseline else None
        a = a if a in names else (names[0] if names else None)
        others = tuple(n for n in names if n != a)
        keep = self.ab_with.value
        with self._sync():
            self.ab_with.options = others
            self.ab_with.value = keep if keep in others else (others[-1] if others else None)

    def _ab_with_changed(self, change) -> None:
        if not self._sync.depth and self._on_pick is not None:
            self._on_pick()

    # -- a run -----------------------------------------------------------------------------
    def start(self, spec: SweepSpec, baseline: str | None) -> str | None:
        """Take the run of ``spec``: its pairs of workers and environments (the A/B figure's
        sides, :meth:`follow_baseline` of the ``baseline`` arm). Returns the panel's line saying
        what runs, or ``None`` for an ordinary sweep."""
        self.pairs = spec.pairs_or_default if spec.environments else 0
        if not spec.environments:
            return None
        self.names = [e.name for e in spec.environments]
        self.follow_baseline(baseline)
        plan = spec.plan
        return (f"running an environment A/B of {plan.op.name}: {len(plan)} rows ({len(plan.pairs)} cases x "
                f"dtypes, {len(plan.backends)} arms in {len(spec.environments)} environments: "
                f"{', '.join(self.names)}), {self.pairs_text(spec)} of workers; a case's rows come "
                f"once its last pair has timed it")

    @staticmethod
    def pairs_text(spec: SweepSpec) -> str:
        """The A/B's pairs in words: ``3 pairs``, or ``3-10 pairs (auto: more while a label is AMBIGUOUS)``."""
        k = spec.pairs_or_default
        if spec.pairs_auto and spec.pairs_max > k:
            return f"{k}-{spec.pairs_max} pairs (auto: more while a label is AMBIGUOUS)"
        return f"{k} pair{'s' if k != 1 else ''}"

    def status(self) -> str | None:
        """The progress line's note while rows are awaited: an A/B's rows come in its last pair
        of workers, so neither the case now running nor the time left can be read from them
        (``None`` with at most one pair, or no A/B)."""
        if self.pairs > 1:
            return f"{self.pairs} pairs of workers; a case's rows come when the last has timed it"
        return None

    # -- the figures -----------------------------------------------------------------------
    def clear(self) -> None:
        """No figures, no message (a new feed of rows)."""
        self.figures = {}
        self.view.outputs = ()
        self.message.value = ""

    def draw(self, rows: list[dict], baseline: str | None) -> None:
        """Draw the A/B figures of ``rows`` into :attr:`view` (see :attr:`figures`): side A the
        ``baseline`` arm's environment, side B :attr:`ab_with`'s, paired by
        :func:`flyexplore.results.compare.pair` after :func:`flyexplore.results.compare.env_sides`
        (the A/B's own intervals, no cross-run allowance); with :data:`SERIES_ENVS` or more
        environments in the rows also the build series. :attr:`message` says what is shown, or
        why not (yet). Nothing without an A/B. Never raises: a figure that cannot be drawn is a
        line in :attr:`message`, the others are still drawn."""
        if not self.active:
            return
        figs: dict[str, Any] = {}
        lines: list[tuple[str, str]] = []
        if rows:
            df = R.frame(rows)
            envs = R.ab_envs(df)
            for part, what in ((self._pair_figures, "A/B figure"), (self._series_figure, "build series")):
                try:
                    lines += part(df, envs, baseline, figs)
                except UsageError as exc:
                    lines.append((f"{what}: {exc}", "warn"))
                except Exception as exc:  # a drawing bug must not end the sweep
                    lines.append((f"{what} failed: {type(exc).__name__}: {exc}", "error"))
        self.figures = figs
        self.view.outputs = tuple(
            {"output_type": "display_data", "metadata": {},
             "data": {"application/vnd.plotly.v1+json": json.loads(f.to_json()),
                      "text/plain": f"<{k} figure: {len(f.data)} traces>"}} for k, f in figs.items())
        self.message.value = "<br>".join(html_span(t, k) for t, k in lines)

    def _pair_figures(self, df: pd.DataFrame, envs: list[str], baseline: str | None,
                      figs: dict) -> list[tuple[str, str]]:
        """Put the A/B figure of the two environments (and, for attention pairs, the AOTriton
        figure) in ``figs``; return the lines saying what they show. Raises :class:`UsageError`
        (from the pairing) when nothing pairs."""
        a_env = R.split_arm(baseline)[1] if baseline else None
        b_env = self.ab_with.value
        if a_env not in envs or b_env not in envs:
            return [(f"A/B figure: waiting for rows of {a_env} and {b_env}", "info")]
        da, db, names = env_sides(df, a_env, b_env)
        ab = pair(da, db, names)
        figs["ab"] = plots_compare.ab_figure(ab)
        n = len(ab.pairs)
        if (da["op"] == "attention").any():
            view = ab_view(ab, da, db)
            if not view.empty:
                figs["aotriton"] = aotriton_ab_figure(view)
        return [(f"A/B: time {a_env} / time {b_env} per case and backend (> 1: {b_env} faster), {n} "
                 f"pair{'s' if n != 1 else ''}, paired round by round", "info")]

    def _series_figure(self, df: pd.DataFrame, envs: list[str], baseline: str | None,
                       figs: dict) -> list[tuple[str, str]]:
        """With :data:`SERIES_ENVS` or more environments in the rows, put the build-series figure
        in ``figs`` (the environments in the run's order, the first the reference); return the
        line saying so. Raises :class:`UsageError` when no case has a speedup to draw."""
        if len(envs) < SERIES_ENVS:
            return []
        order = [n for n in self.names if n in envs] + [n for n in envs if n not in self.names]
        figs["series"] = series_figure(df, envs=order)
        return [(f"build series: each case's speedup in every environment against {order[0]}, the "
                 "environments in the run's order", "info")]
