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
    from scipy.stats import norm

    est = np.asarray(estimates, dtype=float)
    if est.size == 0 or (est <= 0).any() or not np.isfinite(est).all():
        return (math.nan, math.nan, math.nan)
    lg = float(np.mean(np.log(est)))
    lo = np.asarray(los, dtype=float)
    hi = np.asarray(his, dtype=float)
    z = float(norm.ppf(0.5 + confidence / 2))
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
