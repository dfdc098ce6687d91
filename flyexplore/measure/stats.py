"""Intervals and verdicts: how sure a time or a speedup is, and what it says.

A verdict is reached in three steps, each a named function here:

1. **Rounds.** Backends of one case are timed interleaved (A B C A B C ...; a few calls per
   backend per round, :func:`flyexplore.measure.interleaved.measure_interleaved`), so that every round sees
   one GPU clock regime for all of them. A round's value for a backend is the median of its
   calls in that round (:func:`round_values`).
2. **Intervals.** The interval of a median is the distribution-free order-statistic interval
   (:func:`median_ci`: the binomial interval of ``scipy.stats.quantile_test``, exact for any
   continuous distribution, no resampling, so it is deterministic). A speedup of backend X over
   baseline B from one interleaved run is the median of the *paired* per-round ratios
   ``B_round / X_round`` with the same order-statistic interval (:func:`paired_ratio`): the
   pairing cancels what the rounds share (the clock, the thermal state), which is why
   interleaving makes intervals narrow. Rows that were not timed in the same rounds (block-wise
   order, two result files) get the unpaired, conservative interval of
   :func:`unpaired_ratio` (each median's interval at sqrt(confidence), then divided).
3. **Labels** (:func:`verdict`): with the equivalence band ``band`` (default +-1%: the
   tie rule of the published dense-GEMM comparison and gpu-mode's 1% rule),

   * ``SAME``      the whole interval lies inside [1 - band, 1 + band];
   * ``FASTER``    the whole interval lies above 1 + band (X is faster than the baseline);
   * ``SLOWER``    the whole interval lies below 1 - band;
   * ``AMBIGUOUS`` anything else (the interval straddles a band edge, or there is none):
     the data cannot tell at this band; more rounds may.

The geometric mean of several speedups gets an interval by the delta method in log space
(:func:`geomean_ci`): the per-case intervals' half-widths, as standard errors, added in
quadrature. It covers measurement noise only; the cases themselves are fixed, not sampled.

Measured in fresh processes or pairs of workers, a row's interval is Student t over them
(:func:`between_process`); how many pairs would decide an AMBIGUOUS reading at the spread seen
between them is :func:`pairs_to_decide`.

Anchors: nvbench's ``stdrel`` stopping criterion and ``nvbench_compare``'s noise-aware
comparison, tritonbench's ``latency_analysis``; none of them interleaves backends.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Sequence

import numpy as np

#: Confidence level of every interval flyexplore shows.
CONFIDENCE = 0.95
#: Equivalence band of the SAME label: |speedup - 1| within 1%.
BAND = 0.01
#: Labels, in display order.
LABELS = ("FASTER", "SAME", "SLOWER", "AMBIGUOUS")
#: One-character marks of the labels, for bar texts: `` +`` faster, `` =`` same, `` −`` slower,
#: `` ?`` ambiguous.
MARKS = {"FASTER": " +", "SAME": " =", "SLOWER": " −", "AMBIGUOUS": " ?"}


def round_values(rounds: Sequence[Sequence[float]]) -> np.ndarray:
    """Per-round medians of ``rounds`` (a list of rounds, each a list of call times), in
    round order; empty rounds are skipped."""
    rounds = [r for r in rounds if len(r)]
    if not rounds:
        return np.asarray([], dtype=float)
    if len({len(r) for r in rounds}) == 1:  # the usual case: one array, one vectorised median
        return np.median(np.asarray(rounds, dtype=float), axis=1)
    return np.asarray([float(np.median(r)) for r in rounds], dtype=float)


#: Parts of a run's rounds (consecutive, in time order) compared by :func:`drift`.
DRIFT_PARTS = 4


def drift(values: Sequence[float], parts: int = DRIFT_PARTS) -> float:
    """How far one backend's speed moved during its own measurement: the rounds' values (per-
    round medians, in time order) cut into ``parts`` consecutive parts, the largest part median
    over the smallest, minus 1 (0.0 = steady; 1.0 = one quarter of the run took twice as long
    as another). 0.0 with fewer than ``2 * parts`` values. A machine that drifts this much
    within one run can drift as much between two runs; :func:`flyexplore.results.table.ratio_interval`
    widens cross-run intervals by it."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 * parts:
        return 0.0
    meds = [float(np.median(c)) for c in np.array_split(v, parts)]
    return max(meds) / min(meds) - 1.0 if min(meds) > 0 else math.inf


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float) -> tuple[int, int]:
    """Positions, in sorted order, of the two order statistics that bound the ``confidence``
    interval of the median of ``n`` values (-1 or ``n`` where there is none): the ones
    ``scipy.stats.quantile_test(..., p=0.5).confidence_interval`` picks, which depend on ``n``
    alone. With ``X ~ Binomial(n, 1/2)`` and ``a = (1 - confidence) / 2``, the low one is
    ``binom.ppf(a) - 1`` and the high one ``binom.isf(a)``, found here from the binomial CDF
    (``scipy.special.bdtr``, started at its inverse ``bdtrik``) in some 20 us, where asking
    ``quantile_test`` takes 0.7 ms -- the stopping checks of
    :func:`flyexplore.measure.interleaved.measure_interleaved` ask for a new ``n`` at every look.
    The test suite checks both ways agree for every ``n`` up to 3000 and some larger ones."""
    n = int(n)
    if n < 1:
        return (-1, max(n, 0))
    a = (1.0 - float(confidence)) / 2.0
    lo = _first_cdf_over(a, n, strict=False) - 1          # binom.ppf(a) - 1
    hi = n - _first_cdf_over(a, n, strict=True)           # binom.isf(a), by the symmetry at p=1/2
    return (max(lo, -1), min(hi, n))


def _first_cdf_over(a: float, n: int, strict: bool) -> int:
    """The smallest ``k`` in ``[0, n]`` with ``P(X <= k) >= a`` (``> a`` when ``strict``),
    ``X ~ Binomial(n, 1/2)``."""
    from scipy.special import bdtr, bdtrik

    guess = float(bdtrik(a, n, 0.5))
    k = int(min(max(math.ceil(guess), 0), n)) if math.isfinite(guess) else 0

    def ok(c: float) -> bool:
        return c > a if strict else c >= a
    while k > 0 and ok(float(bdtr(k - 1, n, 0.5))):
        k -= 1
    while k < n and not ok(float(bdtr(k, n, 0.5))):
        k += 1
    return k


def median_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free ``confidence`` interval of the median of ``values``: the order
    statistics given by ``scipy.stats.quantile_test(..., p=0.5).confidence_interval``.

    Needs at least 6 values for a finite 95% interval (2 * 0.5**6 < 0.05); with fewer it
    returns ``(nan, nan)``. Raises ``ValueError`` for ``confidence`` outside (0, 1)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    v = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    v = v[np.isfinite(v)]   # None reads as NaN: missing and non-finite values are left out
    if v.size < 2:
        return (math.nan, math.nan)
    i, j = median_ci_ranks(v.size, float(confidence))
    if i < 0 or j >= v.size:
        return (math.nan, math.nan)
    v = np.sort(v)
    lo, hi = float(v[i]), float(v[j])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return (math.nan, math.nan)
    return (lo, hi)


def paired_ratio(base_rounds: Sequence[Sequence[float]], x_rounds: Sequence[Sequence[float]],
                 confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Speedup of X over the baseline from rounds timed together: the median of the per-round
    ratios ``median(base round) / median(X round)`` and its order-statistic interval.

    Returns ``(estimate, lo, hi)`` (lo/hi NaN with fewer than 6 rounds). Raises ``ValueError``
    when the two sides have different numbers of rounds (they were not timed together)."""
    b, x = round_values(base_rounds), round_values(x_rounds)
    if b.size != x.size:
        raise ValueError(f"paired rounds differ in number: {b.size} vs {x.size}")
    if b.size == 0:
        return (math.nan, math.nan, math.nan)
    r = b / x
    lo, hi = median_ci(r, confidence)
    return (float(np.median(r)), lo, hi)


def unpaired_ratio(base_values: Sequence[float], x_values: Sequence[float],
                   confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Speedup ``median(base) / median(x)`` of values not timed together, with a conservative
    interval: each median's order-statistic interval at ``sqrt(confidence)`` (so that both hold
    together with probability >= ``confidence`` for independent samples), then
    ``[base_lo / x_hi, base_hi / x_lo]``. Returns ``(estimate, lo, hi)``."""
    b = np.asarray(list(base_values), dtype=float)
    x = np.asarray(list(x_values), dtype=float)
    if b.size == 0 or x.size == 0:
        return (math.nan, math.nan, math.nan)
    c = math.sqrt(confidence)
    blo, bhi = median_ci(b, c)
    xlo, xhi = median_ci(x, c)
    est = float(np.median(b) / np.median(x))
    if not all(math.isfinite(v) for v in (blo, bhi, xlo, xhi)) or xlo <= 0:
        return (est, math.nan, math.nan)
    return (est, blo / xhi, bhi / xlo)


def notch_ci(median, iqr, n):
    """Approximate 95% interval of a median from summary statistics alone:
    ``median +- 1.57 * IQR / sqrt(n)`` (the box-plot notch of McGill, Tukey and Larsen, 1978).
    Used only for result rows that kept no samples (schema version 1). Scalars give a pair of
    floats, arrays (one entry per row) a pair of float arrays; NaN where ``n`` is not positive
    or the median or IQR is missing or not finite."""
    m, q, k = (np.asarray(v, dtype=float) for v in (median, iqr, n))   # None reads as NaN
    with np.errstate(invalid="ignore", divide="ignore"):
        h = 1.57 * q / np.sqrt(k)
        ok = (k > 0) & np.isfinite(m) & np.isfinite(q)
    lo, hi = np.where(ok, m - h, np.nan), np.where(ok, m + h, np.nan)
    if lo.ndim == 0:
        return (float(lo), float(hi))
    return lo, hi


def verdict(lo: float, hi: float, band: float = BAND) -> str:
    """The label of a speedup interval ``[lo, hi]`` against the equivalence band ``band``
    (see the module text). A missing bound gives ``AMBIGUOUS``."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "AMBIGUOUS"
    if lo >= 1 - band and hi <= 1 + band:
        return "SAME"
    if lo > 1 + band:
        return "FASTER"
    if hi < 1 - band:
        return "SLOWER"
    return "AMBIGUOUS"


def verdicts(lo, hi, band=BAND) -> np.ndarray:
    """:func:`verdict` of many intervals at once: ``lo``, ``hi`` (float arrays of one length;
    NaN or inf: a missing bound) and ``band`` (a float or an array of that length). Returns an
    object array of the labels, each the one :func:`verdict` gives for its row."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    band = np.broadcast_to(np.asarray(band, dtype=float), lo.shape)
    out = np.full(lo.shape, "AMBIGUOUS", dtype=object)
    fin = np.isfinite(lo) & np.isfinite(hi)
    with np.errstate(invalid="ignore"):
        same = fin & (lo >= 1 - band) & (hi <= 1 + band)
        faster = fin & ~same & (lo > 1 + band)
        slower = fin & ~same & ~faster & (hi < 1 - band)
    out[same], out[faster], out[slower] = "SAME", "FASTER", "SLOWER"
    return out


def within(est: float, lo: float, hi: float, target: float) -> bool:
    """True when ``[lo, hi]`` lies within ``est * (1 +- target)``: the stopping rule."""
    if not all(v is not None and math.isfinite(v) for v in (est, lo, hi)) or est <= 0:
        return False
    return lo >= est * (1 - target) and hi <= est * (1 + target)


def geomean_ci(estimates: Sequence[float], los: Sequence[float], his: Sequence[float],
               confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Geometric mean of speedups with an interval by the delta method in log space: each
    case's standard error is ``(log hi - log lo) / (2 z)``; the mean log speedup's standard
    error is ``sqrt(sum se_i**2) / n``; the interval is ``exp(mean log +- z se)``.
    ``z`` is the normal quantile of ``confidence``. Cases without an interval make the
    interval NaN (the estimate stays). Returns ``(geomean, lo, hi)``."""
    # scipy.special.ndtri is what scipy.stats.norm.ppf computes (the same value, checked in
    # tests/measure/test_stats_quantiles.py) without importing scipy.stats (0.7 s a process)
    from scipy.special import ndtri

    est = np.asarray(estimates, dtype=float)
    if est.size == 0 or (est <= 0).any() or not np.isfinite(est).all():
        return (math.nan, math.nan, math.nan)
    lg = float(np.mean(np.log(est)))
    lo = np.asarray(los, dtype=float)
    hi = np.asarray(his, dtype=float)
    z = float(ndtri(0.5 + confidence / 2))
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()) or (lo <= 0).any():
        return (math.exp(lg), math.nan, math.nan)
    se = (np.log(hi) - np.log(lo)) / (2 * z)
    s = math.sqrt(float(np.sum(se ** 2))) / est.size
    return (math.exp(lg), math.exp(lg - z * s), math.exp(lg + z * s))


def fmt_interval(est: float, lo: float, hi: float, label: str | None = None) -> str:
    """``"1.103x [1.098, 1.109] FASTER"`` (``"1.103x [no interval]"`` without bounds)."""
    if est is None or not math.isfinite(est):
        return "n/a"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        s = f"{est:.3f}x [no interval]"
    else:
        s = f"{est:.3f}x [{lo:.3f}, {hi:.3f}]"
    return f"{s} {label}" if label else s


# -- between processes and between runs -------------------------------------------------------------

#: Normal quantile of the two-sided 95% interval (``scipy.stats.norm.ppf(0.975)``): turns an
#: order-statistic 95% interval's half-width, in log space, into a standard error.
Z95 = 1.959963984540054


@functools.lru_cache(maxsize=256)
def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student-t quantile (``scipy.stats.t.ppf(0.5 + confidence / 2, df)``) for ``df``
    degrees of freedom (> 0; not necessarily an integer: Welch's df). Computed by
    ``scipy.special.stdtrit``, what ``scipy.stats.t.ppf`` calls (the same value), without importing
    scipy.stats (0.7 s a process: the first figure in a notebook, every CLI report)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, 0.5 + confidence / 2))


def log_se(lo, hi):
    """Standard error, in log space, that a 95% interval ``[lo, hi]`` stands for:
    ``(log hi - log lo) / (2 * 1.96)``. Scalars or arrays; NaN where a bound is missing or not
    positive."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.where((lo > 0) & (hi >= lo), (np.log(hi) - np.log(lo)) / (2 * Z95), np.nan)
    return float(se) if se.ndim == 0 else se


def _spread(x: np.ndarray, se: np.ndarray) -> float:
    """Variance of one process's log estimate: the sample variance of ``x`` (between processes,
    which includes each process's own noise), but never below the mean within-process variance
    ``se**2`` (with 2 or 3 processes the sample variance alone can come out near 0 by chance)."""
    s2 = float(np.var(x, ddof=1)) if x.size > 1 else math.nan
    w = se[np.isfinite(se)]
    w2 = float(np.mean(w ** 2)) if w.size else 0.0
    return max(s2, w2) if math.isfinite(s2) else w2


def between_process(estimates: Sequence[float], ses: Sequence[float] | None = None,
                    confidence: float = CONFIDENCE, shift: float = 0.0,
                    shift_per_sd: float = 0.0, prediction: bool = True,
                    floor: float = 0.0) -> tuple[float, float, float]:
    """Combine one quantity (a median time in ms, or a speedup) measured in ``n`` fresh processes
    into ``(estimate, lo, hi)``: the geometric mean of the per-process estimates and a
    ``confidence`` **prediction interval for another run of n processes** -- the interval that
    covers what the next run of the same sweep reads, not only this run's own noise.

    In log space, with ``x_i = log(estimate_i)``: the variance of one process's estimate is the
    sample variance of the ``x_i`` (it holds both the between-process variation and each
    process's own noise), floored at the mean of ``ses**2`` (each process's within-process
    standard error in log space, :func:`log_se` of its 95% interval); the difference of two runs'
    means has twice the variance of one mean, so the half-width is
    ``t(n - 1) * sqrt(2 * var / n)`` (Student t, the usual prediction interval for a future
    mean of n; pyperf's lesson that run-to-run variation must be measured across processes, not
    assumed). ``shift``: the standard deviation, in log space, of a shift that moves a whole run
    and that its own processes cannot see (a machine whose speed wanders over minutes:
    :data:`flyexplore.results.table.RUN_SHIFT`); it adds ``z * sqrt(2) * shift`` in quadrature.
    ``shift_per_sd``: a run shift that grows with the quantity's own between-process spread --
    the shift used is ``max(shift, shift_per_sd * sd)``, ``sd`` the standard deviation of one
    process's log estimate (:data:`flyexplore.results.table.RUN_SHIFT_PER_SD`: a GPU under its
    power limit moves between runs minutes apart as it moves between processes).
    ``prediction=False`` gives the ``confidence`` interval of the mean instead,
    ``t(n - 1) * sqrt(var / n)``: what an environment A/B's fresh pairs of workers give for a
    ratio paired round by round within each pair (both environments shared each pair's device
    state, so a run shift cancels and no other run is predicted; :mod:`flyexplore.run.envab`).
    ``floor``: a stated per-process floor, the standard deviation in log space of the offset one
    fresh process gives and that its own rounds cannot see
    (:data:`flyexplore.results.speedups.PROCESS_FLOOR`). With it the half-width is never below
    ``z * sqrt(k * (floor**2 + mean se**2) / n)`` (``k`` 2 for a prediction, else 1; the floor a
    known spread, so the normal quantile), and one process (n = 1) gets exactly that interval
    instead of none: a reading that the floor can explain is never a label, however tight the
    process's own rounds were (issue 45: two identical CPU workers differed by 5x for a whole
    pass, each with an interval of +-1%). Needs n >= 2 for an interval without a ``floor`` (else
    ``lo``/``hi`` are NaN); non-positive or missing estimates are left out."""
    x = np.asarray(estimates, dtype=float)
    se = np.full(x.size, np.nan) if ses is None else np.asarray(ses, dtype=float)
    keep = np.isfinite(x) & (x > 0)
    x, se = np.log(x[keep]), se[keep]
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    c = float(np.mean(x))
    k = 2 if prediction else 1
    w = se[np.isfinite(se)]
    own2 = float(np.mean(w ** 2)) if w.size else 0.0
    least = _z(confidence) * math.sqrt(k * (floor ** 2 + own2) / x.size) if floor > 0 else 0.0
    if x.size < 2:
        if not least:
            return (math.exp(c), math.nan, math.nan)
        var, half = floor ** 2 + own2, least
    else:
        var = _spread(x, se)
        half = max(t_quantile(x.size - 1, confidence) * math.sqrt(k * var / x.size), least)
    half = math.hypot(half, _z(confidence) * math.sqrt(2) * max(shift, shift_per_sd * math.sqrt(var)))
    return (math.exp(c), math.exp(c - half), math.exp(c + half))


def _z(confidence: float) -> float:
    return Z95 if confidence == CONFIDENCE else t_quantile(1e9, confidence)


def between_runs(a: Sequence[float], a_ses: Sequence[float] | None, b: Sequence[float],
                 b_ses: Sequence[float] | None, confidence: float = CONFIDENCE,
                 shift: float = 0.0, shift_per_sd: float = 0.0) -> tuple[float, float, float, float]:
    """The ratio ``A / B`` of one quantity measured by two runs, each in several fresh processes
    (``a``, ``b``: the per-process estimates, e.g. median times in ms; ``*_ses``: their
    within-process log standard errors, or None): ``(ratio, lo, hi, half)`` where ``ratio`` is
    the ratio of the two geometric means, ``[lo, hi]`` its ``confidence`` interval and ``half``
    its half-width in log space (the cross-run allowance this pair was given).

    Welch's interval on the log estimates: each side's variance as in :func:`between_process`
    (sample variance floored by the within-process one), ``se**2 = var_a / n_a + var_b / n_b``,
    Welch-Satterthwaite degrees of freedom, ``log ratio +- t(df) * se``. It uses each run's own
    between-process variation, so two identical builds can read SAME when their processes agree.
    ``shift`` as in :func:`between_process` (a run-wide shift no process sees), added in
    quadrature; with ``shift_per_sd`` the shift is ``max(shift, shift_per_sd * sd)``, ``sd`` the
    root mean of the two sides' per-process variances (as in :func:`between_process`). Needs
    two processes a side (else NaN bounds)."""
    xa, xb = (np.asarray(v, dtype=float) for v in (a, b))
    sa = np.full(xa.size, np.nan) if a_ses is None else np.asarray(a_ses, dtype=float)
    sb = np.full(xb.size, np.nan) if b_ses is None else np.asarray(b_ses, dtype=float)
    ka, kb = np.isfinite(xa) & (xa > 0), np.isfinite(xb) & (xb > 0)
    xa, sa, xb, sb = np.log(xa[ka]), sa[ka], np.log(xb[kb]), sb[kb]
    if xa.size == 0 or xb.size == 0:
        return (math.nan, math.nan, math.nan, math.nan)
    d = float(np.mean(xa) - np.mean(xb))
    if xa.size < 2 or xb.size < 2:
        return (math.exp(d), math.nan, math.nan, math.nan)
    pa, pb = _spread(xa, sa), _spread(xb, sb)
    va, vb = pa / xa.size, pb / xb.size
    v = va + vb
    extra = _z(confidence) * math.sqrt(2) * max(shift, shift_per_sd * math.sqrt((pa + pb) / 2))
    if v <= 0:
        return (math.exp(d), math.exp(d - extra), math.exp(d + extra), extra)
    df = v ** 2 / (va ** 2 / (xa.size - 1) + vb ** 2 / (xb.size - 1))
    half = math.hypot(t_quantile(df, confidence) * math.sqrt(v), extra)
    return (math.exp(d), math.exp(d - half), math.exp(d + half), half)


# -- how many pairs would decide it ------------------------------------------------------------------

def pair_spread(estimates: Sequence[float], ses: Sequence[float] | None = None) -> float:
    """The standard deviation, in natural-log space, of one pair's (or one process's) estimate:
    the spread that :func:`between_process` builds its interval from. ``estimates``: the
    per-pair ratios (e.g. an environment A/B row's per-pair speedups, ``process_estimates``);
    ``ses``: each one's within-pair log standard error (:func:`log_se`), or None. The sample
    standard deviation (ddof 1) of ``log(estimates)``, never below the root mean of ``ses**2``
    (the floor :func:`between_process` applies). Non-positive or missing estimates are left out.
    NaN when fewer than two estimates and no ``ses`` are left (the spread is unknown)."""
    x = np.asarray(estimates, dtype=float)
    se = np.full(x.size, np.nan) if ses is None else np.asarray(ses, dtype=float)
    keep = np.isfinite(x) & (x > 0)
    x, se = np.log(x[keep]), se[keep]
    if x.size < 2 and not np.isfinite(se).any():
        return math.nan
    return math.sqrt(_spread(x, se))


def interval_spread(lo: float, hi: float, n: int, confidence: float = CONFIDENCE) -> float:
    """The per-pair standard deviation, in natural-log space, that a ``confidence`` Student-t
    interval of the mean over ``n`` pairs stands for: ``log(hi / lo) / 2 * sqrt(n) / t(n - 1)``
    -- the inverse of the half-width ``t(n - 1) * sd / sqrt(n)`` of :func:`between_process`
    with ``prediction=False`` (an environment A/B's ``between-pair`` interval), so it equals
    :func:`pair_spread` of the estimates that interval came from. NaN where a bound is missing
    or not positive, ``hi < lo``, or ``n < 2``."""
    try:
        lo, hi, n = float(lo), float(hi), int(n)
    except (TypeError, ValueError):
        return math.nan
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi) or n < 2:
        return math.nan
    return math.log(hi / lo) / 2 * math.sqrt(n) / t_quantile(n - 1, confidence)


def pairs_to_decide(sd: float | None, band: float = BAND, estimate: float | None = None,
                    confidence: float = CONFIDENCE) -> int | float | None:
    """How many pairs (or processes) a ``confidence`` Student-t interval of the mean needs to be
    narrow enough to decide: the smallest ``n >= 2`` with ``t(n - 1) * sd / sqrt(n) <= h``
    (``t`` the two-sided quantile of ``scipy.stats.t``, :func:`t_quantile`), where ``sd`` is the
    observed standard deviation of one pair's log ratio (natural log, no unit:
    :func:`pair_spread` of the per-pair estimates, or :func:`interval_spread` of an interval and
    the number of pairs it came from) and ``h`` the half-width needed, in log space:

    - ``estimate`` None -- a change of ``band``'s size (a fraction: 0.01 = 1%, the SAME band
      :data:`BAND` by default, or the width of ``compare --fail-on AMBIGUOUS:WIDTH``): the whole
      interval no wider than the change, ``hi / lo <= 1 + band``, i.e. ``h = log(1 + band) / 2``;
      then no change (1) and a change of ``band`` (``1 + band``) cannot both lie in it;
    - ``estimate`` given (a ratio, e.g. 0.5) -- that reading, if its estimate held: the interval
      around ``log(estimate)`` clear of both edges of the band ``[1 - band, 1 + band]`` that
      :func:`verdict` reads (SAME inside it, FASTER / SLOWER beyond it), i.e. ``h`` = the
      distance from ``log(estimate)`` to the nearer of ``log(1 - band)`` and ``log(1 + band)``.

    The rule is the interval's own (:func:`between_process` with ``prediction=False``); the
    number is a planning figure: a new run's spread and estimate differ from these. Returns an
    int; ``math.inf`` when no number would do (``estimate`` exactly on a band edge); None when
    the spread or the estimate is unknown (None, NaN, negative ``sd``; a non-positive
    ``estimate``). ``sd`` 0 needs 2 (the least that has an interval); an ``estimate`` within
    1e-12 (log space) of an edge counts as on it. Raises ``ValueError`` for a ``band`` that is
    not above 0 (with an ``estimate``: not in (0, 1), the band's lower edge ``1 - band`` must be a
    ratio) or ``confidence`` outside (0, 1)."""
    if isinstance(band, bool) or not isinstance(band, (int, float, np.floating, np.integer)) or not (
            0 < band < (1 if estimate is not None else math.inf)):
        raise ValueError(f"band must be a fraction above 0{' and below 1' if estimate is not None else ''}, "
                         f"got {band!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if sd is None or not math.isfinite(sd) or sd < 0:
        return None
    if estimate is None:
        need = math.log1p(band) / 2
    else:
        if not (math.isfinite(estimate) and estimate > 0):
            return None
        x = math.log(estimate)
        need = min(abs(x - math.log1p(band)), abs(x - math.log1p(-band)))
    if need <= 1e-12:   # on an edge (up to rounding: log(1.01) is not log1p(0.01) to the last bit)
        return math.inf
    if sd == 0:
        return 2
    # t(n - 1) > z for every n, so the normal answer is a floor; t comes down to z within a few
    # steps (past 1e12 pairs t and z agree to 12 digits: the normal answer is the answer)
    n = max(2, math.ceil((_z(confidence) * sd / need) ** 2))
    if n > 1e12:
        return n
    while t_quantile(float(n - 1), confidence) * sd / math.sqrt(n) > need:
        n += 1
    return n
