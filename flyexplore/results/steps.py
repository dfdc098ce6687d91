"""Steps in a series of runs: where a case's time (or a geometric mean) changed level, with the
run, the size and its interval (``flyexplore history show``, :mod:`flyexplore.results.history`).

The method is asv's (airspeed velocity, ``asv.step_detect``, described in its docs): a
piecewise-constant fit with a penalty per level, each point weighted by how well it is known.
It is written here from that description, not taken from asv, because it has to read
flyexplore's intervals:

- **Points.** ``y`` is the log of each run's time (a ratio scale: a 3% step is the same
  distance at 10 µs and at 10 ms). Each point's variance is ``sigma**2 + tau**2``: ``sigma``
  the run's own interval (its 95% interval of the median, ``time_ci_lo_ms`` / ``time_ci_hi_ms``,
  over ``2 x 1.96`` in log space) and ``tau`` what runs move beyond their own interval (clock and
  power state, autotune choices, neighbours' load). ``tau`` is read from the series itself: the
  mean square of successive differences (von Neumann's estimator, which a step inflates by only
  ``step**2 / (2 (n - 1))``), less the runs' own variance. No point's variance is below that
  mean square (:func:`scatter_sd`): runs with narrow intervals move between runs like the others
  (two CPU runs whose intervals differ 3x otherwise gave the geometric mean steps that were not
  there). A build series (the environments of one A/B, interleaved in one run) has no between-run
  part: ``between_runs=False``.
- **Fit.** The levels minimise ``sum(w_i (y_i - level)**2) + beta x (number of levels)`` with
  ``w_i = 1 / variance_i``: the exact optimum over every segmentation, by dynamic programming
  (optimal partitioning, O(n^2) per series, all series of one length at once with numpy). A level
  before the newest needs :data:`MIN_LEVEL` (2) runs, so one wild run is not a level of its own;
  the newest run alone may be one, so a step in the run just added is seen at once. (A build
  series' points are builds, not repeats: one build may be a level of its own.)
- **The newest runs.** The fit reads the noise from the whole series, so a step in the newest
  run or two inflates it and hides itself in a short series. The newest 1 and 2 runs
  (:data:`NEWEST`) are therefore also tested against the runs of the fit's newest level before
  them (at least :data:`NEWEST_BEFORE`): the difference of the means over its standard error,
  the noise read from the runs before alone (:func:`scatter_sd`, at least their median own
  ``sigma``), against Student's t with ``m - 1`` degrees of freedom at ``ALPHA / 4`` a tail (two
  sides, two tests); the two newest runs count as one level only when both lie on one side, each
  at least half their mean's distance away (one wild run beside a normal one is no level). Where
  it trips, the newest level starts there, with those means and errors.
- **Penalty.** ``beta = (PENALTY_LOG x ln n + PENALTY_BASE) x kappa`` = ``(3 ln n + 3) x kappa``.
  ``kappa`` (1 when the variance is given) is the ratio of the F(1, n - 2) and chi-square(1)
  quantiles at :data:`ALPHA`: a variance read from n points is itself uncertain, and a low
  reading would find steps in noise. Chosen by simulation (``benchmarks/evidence/history_penalty.py``,
  ``data/cpu/history_penalty/``; one case a series, 0.5% noise within a run, 1.3% between runs --
  one process's spread between runs on the H200): a series without a step reads one in 0.4% of
  10-run, 0.8% of 30-run and 0.3% of 100-run series (heavy-tailed noise, Student t(4): 0.7%, 1.5%,
  2.0%; without the newest-runs test 0.1%, 0.9%, 1.5%); a 3% step at run 20 of 30 is found at run
  20 +- 1 in 79% of single series at 1.3% noise, 94% at 1%, 99.8% at 0.5%. ``2 ln n + 3`` found
  a little more (85% at 1.3%) but read steps in 2-5% of 30- and 100-run series. On real rows
  (``data/cpu/history_steps/``, from the H200's and the CPU's measured runs;
  ``data/h100/history_runs/``, 30 real runs of the lent H100) the geometric mean finds a 3% step
  at run 20 +- 1 in every seed, and no geometric mean of 10 runs without a step reads one (1 of
  the 1,320 case series does). asv fits in L1 (robust to a wild run); the L2 fit here has a closed-form
  level and interval, and :data:`MIN_LEVEL` keeps one wild run from being a level.

Why not a change-point library: ``ruptures`` (the well-kept one) fits with a Python cost
callback per candidate segment and no per-point weights, about 10^6 calls for 100 series of
1,000 runs; the fit here is vectorised over series and holds the 5 s goal of
``history show`` on 1,000 runs x 100 cases.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np

from flyexplore.measure import stats as MS

#: Penalty per level, ``beta = (PENALTY_LOG x ln n + PENALTY_BASE) x kappa`` (module docstring).
PENALTY_LOG = 3.0
PENALTY_BASE = 3.0
#: Tail probability of the F / chi-square quantiles in ``kappa``.
ALPHA = 0.001
#: z of the 95% interval of a run's median (its ``time_ci_lo_ms`` / ``time_ci_hi_ms``) and of a step
#: (:data:`flyexplore.measure.stats.Z95`).
Z95 = MS.Z95
#: Points a level needs, except the newest: one wild run in the middle of a series is no level
#: of its own (it would read as two steps, out and back); the newest run alone can be one, so a
#: step in the run just added is seen at once (``history show --fail-on ... --recent 1``).
MIN_LEVEL = 2
#: The newest-runs test (module docstring) asks whether the newest 1 or 2 runs left the level of
#: the runs before them, whose noise it reads from those runs alone (a step in the newest run
#: inflates the whole series' scatter: 6 steady runs and a 30% slower seventh read no step by the
#: fit alone) ...
NEWEST = (1, 2)
#: ... when at least this many runs of the fit's newest level come before them.
NEWEST_BEFORE = 4
#: Smallest standard deviation a point is given, in log space (0.01%): a series of identical
#: numbers has no noise to weigh by.
MIN_SD = 1e-4


@dataclass(frozen=True)
class Fit:
    """The fitted levels of one series: ``starts`` (index of each level's first point; the first is
    0), ``levels`` (each level, in log space), ``se`` (each level's standard error, log space),
    ``tau`` (the between-run standard deviation used, log space) and ``beta`` (the penalty)."""

    starts: tuple[int, ...]
    levels: tuple[float, ...]
    se: tuple[float, ...]
    tau: float
    beta: float


@functools.lru_cache(maxsize=4096)
def penalty(n: int, given: bool = False) -> float:
    """The penalty per level for a series of ``n`` points (module docstring): ``(PENALTY_LOG x ln n +
    PENALTY_BASE) x kappa``, ``kappa`` 1 when the variance is ``given`` or ``n < 4`` cannot estimate
    it (then no step is found: inf)."""
    from scipy import stats as st

    base = PENALTY_LOG * np.log(max(n, 2)) + PENALTY_BASE
    if given:
        return float(base)
    if n < 4:
        return float("inf")
    kappa = st.f.ppf(1 - ALPHA, 1, n - 2) / st.chi2.ppf(1 - ALPHA, 1)
    return float(base * kappa)


def scatter_sd(y: np.ndarray) -> np.ndarray:
    """Each series' own scatter (rows of ``y``, log times, NaN where a run has no point): the
    root of the mean square of successive differences over 2 (von Neumann's estimator of a
    standard deviation, which a step inflates by only ``step**2 / (2 (n - 1))``), the differences
    taken between a series' points in order, over the runs without one. One float per row (NaN
    for fewer than 2 points)."""
    y = np.atleast_2d(np.asarray(y, dtype=float))
    ok = np.isfinite(y)
    # each row's points packed to the left, in order (a stable sort puts the NaNs last)
    order = np.argsort(~ok, axis=1, kind="stable")
    packed = np.take_along_axis(y, order, axis=1)
    n = ok.sum(axis=1)
    d = np.diff(packed, axis=1)
    valid = np.arange(d.shape[1])[None, :] < (n - 1)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        ms = np.where(valid, d * d, 0.0).sum(axis=1) / np.maximum(n - 1, 1) / 2.0
    return np.where(n >= 2, np.sqrt(ms), np.nan)


def between_run_sd(y: np.ndarray, sigma: np.ndarray, total: np.ndarray | None = None) -> np.ndarray:
    """The between-run standard deviation ``tau`` of each series (rows of ``y``, log times, NaN
    where a run has no point; ``sigma`` the points' own standard deviations): the square of
    :func:`scatter_sd` (or ``total``, when given) less the median of the points' ``sigma**2``, at
    least 0, its root. Returns one float per row (NaN for fewer than 2 points)."""
    y = np.atleast_2d(np.asarray(y, dtype=float))
    sigma = np.atleast_2d(np.asarray(sigma, dtype=float))
    total = scatter_sd(y) if total is None else total
    own = np.where(np.isfinite(y) & np.isfinite(sigma), sigma ** 2, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a row without any sigma: its median is NaN
        med = np.nanmedian(own, axis=1)
    med = np.where(np.isfinite(med), med, 0.0)
    return np.where(np.isfinite(total), np.sqrt(np.maximum(total ** 2 - med, 0.0)), np.nan)


def fit(y, sigma=None, *, between_runs: bool = True, newest: bool = True) -> list[Fit]:
    """Fit levels to series of runs (module docstring).

    ``y``: a 1-D array (one series) or 2-D ``(series, runs)`` of log times (any log-scale
    quantity), NaN where a series has no point in that run; ``sigma``: the points' own standard
    deviations in log space, the same shape (NaN or None: 0). ``between_runs``: add the series'
    between-run standard deviation (:func:`between_run_sd`) to every point's variance, never
    letting a point's variance fall below the series' own scatter (:func:`scatter_sd`: runs whose
    intervals are narrow move between runs as the others do), and pay for estimating it
    (``kappa``); False for points whose ``sigma`` is their whole uncertainty (a
    build series of one A/B). ``newest``: also run the newest-runs test (module docstring).
    Returns one :class:`Fit` per series. A series with fewer than 2
    points, or too few to estimate its noise, has one level."""
    y = np.asarray(y, dtype=float)
    one = y.ndim == 1
    y = np.atleast_2d(y)
    sig = np.zeros_like(y) if sigma is None else np.atleast_2d(np.asarray(sigma, dtype=float))
    if sig.shape != y.shape:
        raise ValueError(f"sigma has shape {sig.shape}, y {y.shape}")
    ok = np.isfinite(y)
    sig = np.where(np.isfinite(sig), np.abs(sig), 0.0)
    floor = scatter_sd(y) if between_runs else np.full(y.shape[0], np.nan)
    tau = between_run_sd(y, sig, floor) if between_runs else np.zeros(y.shape[0])
    tau = np.where(np.isfinite(tau), tau, 0.0)
    var = np.maximum(sig ** 2 + tau[:, None] ** 2, MIN_SD ** 2)
    if between_runs:   # no run is better known than the series' own scatter shows
        var = np.maximum(var, np.where(np.isfinite(floor), floor, 0.0)[:, None] ** 2)
    w = np.where(ok, 1.0 / var, 0.0)
    n = ok.sum(axis=1)
    beta = np.array([penalty(int(k), given=not between_runs) for k in n])
    cuts = _partition(np.where(ok, y, 0.0), w, np.where(np.isfinite(beta), beta, 0.0), np.isfinite(beta) & (n >= 2),
                      MIN_LEVEL if between_runs else 1)
    fits = []
    for s in range(y.shape[0]):
        last = _newest_step(y[s], ok[s], sig[s], cuts[s]) if newest and between_runs and ok[s, -1] else None
        bounds = [0, *cuts[s], y.shape[1]] if last is None else [0, *cuts[s], last[0], y.shape[1]]
        levels, ses, starts = [], [], []
        for a, b in zip(bounds[:-1], bounds[1:]):
            ws = w[s, a:b]
            tot = ws.sum()
            if tot <= 0:
                continue
            starts.append(a + int(np.argmax(ok[s, a:b])))   # the level's first run with a point
            levels.append(float((ws * np.where(ok[s, a:b], y[s, a:b], 0.0)).sum() / tot))
            ses.append(float(1.0 / np.sqrt(tot)))
        if last is not None:   # the two levels as the newest-runs test read them
            levels[-2:], ses[-2:] = list(last[1:3]), list(last[3:5])
        if not starts:
            starts, levels, ses = [0], [float("nan")], [float("nan")]
        fits.append(Fit(tuple(starts), tuple(levels), tuple(ses), float(tau[s]), float(beta[s])))
    return fits[0] if one else fits


def _newest_step(y: np.ndarray, ok: np.ndarray, sig: np.ndarray, cuts: list[int]):
    """The newest-runs test of one series (module docstring): whether the newest 1 or 2 runs
    (:data:`NEWEST`) left the level of the runs before them, that level's noise read from those
    runs alone. Returns ``(cut, level_before, level_after, se_before, se_after)`` or None."""
    pos = np.flatnonzero(ok)
    last = pos[pos >= (cuts[-1] if cuts else 0)]   # the points of the fit's newest level
    best, out = 1.0, None
    for k in NEWEST:
        before, after = last[:-k], last[-k:]
        m = before.size
        if m < NEWEST_BEFORE:
            continue
        yb, ya = y[before], y[after]
        sd = max(float(np.sqrt(np.mean(np.diff(yb) ** 2) / 2.0)), float(np.sqrt(np.median(sig[before] ** 2))), MIN_SD)
        se_b, se_a = sd / np.sqrt(m), sd / np.sqrt(k)
        dev = ya - yb.mean()
        if k > 1 and not (np.all(np.sign(dev) == np.sign(dev.mean())) and np.min(np.abs(dev)) >= abs(dev.mean()) / 2):
            continue   # the newest runs are no level together: one wild run beside a normal one
        t = abs(float(ya.mean() - yb.mean())) / float(np.hypot(se_b, se_a))
        crit = _t_quantile(1 - ALPHA / (2 * len(NEWEST)), m - 1)
        if t / crit > best:
            best, out = t / crit, (int(after[0]), float(yb.mean()), float(ya.mean()), se_b, se_a)
    return out


@functools.lru_cache(maxsize=4096)
def _t_quantile(q: float, dof: int) -> float:
    from scipy import stats as st

    return float(st.t.ppf(q, dof))


def _partition(y: np.ndarray, w: np.ndarray, beta: np.ndarray, active: np.ndarray,
               min_level: int = 1) -> list[list[int]]:
    """Optimal partitioning of every row of ``y`` (weights ``w``, 0 where no point; penalty
    ``beta`` per row): the cut positions (the first index of each level after the first), by
    dynamic programming over the prefix sums of ``w``, ``w y`` and ``w y**2``; every level holds
    ``min_level`` points or more, but the last of a row with a point in the newest column. Rows
    not ``active`` get no cut."""
    S, N = y.shape
    zero = np.zeros((S, 1))
    cnt = np.concatenate([zero, np.cumsum(w > 0, axis=1)], axis=1)
    # only a series with a point in the newest run may end in a level of fewer points (a case
    # left out of the newer runs has no newest run whose step would show at once)
    open_end = w[:, -1] > 0
    c0 = np.concatenate([zero, np.cumsum(w, axis=1)], axis=1)
    c1 = np.concatenate([zero, np.cumsum(w * y, axis=1)], axis=1)
    c2 = np.concatenate([zero, np.cumsum(w * y * y, axis=1)], axis=1)
    best = np.empty((S, N + 1))
    best[:, 0] = -beta
    last = np.zeros((S, N + 1), dtype=np.int64)
    rows = np.arange(S)
    for t in range(1, N + 1):
        sw = c0[:, t:t + 1] - c0[:, :t]
        s1 = c1[:, t:t + 1] - c1[:, :t]
        s2 = c2[:, t:t + 1] - c2[:, :t]
        has = sw > 0
        cost = np.where(has, s2 - s1 * s1 / np.where(has, sw, 1.0), 0.0)
        # a level without a point costs beta and explains nothing: never better than merging it;
        # a level before the newest needs MIN_LEVEL points (one wild run is no level of its own)
        total = best[:, :t] + np.maximum(cost, 0.0) + beta[:, None]
        if min_level > 1:
            closed = np.full((S, 1), t < N) | ~open_end[:, None]
            total = np.where(~closed | (cnt[:, t:t + 1] - cnt[:, :t] >= min_level), total, np.inf)
        k = np.argmin(total, axis=1)
        last[:, t] = k
        best[:, t] = total[rows, k]
    out = []
    for s in range(S):
        cuts: list[int] = []
        if active[s]:
            t = N
            while t > 0:
                k = int(last[s, t])
                if k > 0:
                    cuts.append(k)
                t = k
        out.append(sorted(cuts))
    return out


@dataclass(frozen=True)
class Step:
    """One step of a series: at point ``at`` (the first run of the new level), the relative
    change ``change = exp(after - before) - 1`` (> 0: slower, for times) and its 95% interval
    ``lo``..``hi`` (the two levels' standard errors, in quadrature)."""

    at: int
    before: float
    after: float
    change: float
    lo: float
    hi: float


def steps_of(f: Fit) -> list[Step]:
    """The steps of a :class:`Fit`, oldest first (:class:`Step`; levels in log space)."""
    out = []
    for i in range(1, len(f.starts)):
        d = f.levels[i] - f.levels[i - 1]
        half = Z95 * float(np.hypot(f.se[i], f.se[i - 1]))
        out.append(Step(f.starts[i], f.levels[i - 1], f.levels[i], float(np.expm1(d)),
                        float(np.expm1(d - half)), float(np.expm1(d + half))))
    return out
