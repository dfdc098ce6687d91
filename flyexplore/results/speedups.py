"""Speedups and geometric means, with their 95% intervals and labels: the speedup rules.

:func:`speedup` (every backend against a baseline, per case), :func:`geomean_speedup` (per operator,
dtype and backend) and :func:`geomean`; the sample-based interval of a ratio, of one pair
(:func:`ratio_interval`) or of many at once (:func:`ratio_intervals`: paired, between-process,
between-pair, unpaired, unpaired+run, notch, none); and the run-to-run allowances such an interval
holds (:data:`RUN_TO_RUN`, :data:`RUN_SHIFT`, :data:`RUN_SHIFT_PER_SD`). The rows are result rows
(:mod:`flyexplore.results.table`), each row's samples parsed once (:mod:`flyexplore.results.samples`).
Every public name here is re-exported by :mod:`flyexplore.results.table` (``R.speedup``,
``R.RUN_TO_RUN``, ...).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import samples as SP
from flyexplore.results.arms import arm_name, split_arm

def geomean(values: Iterable[float]) -> float:
    """Geometric mean exp(mean(log v)) of positive values; NaN when there are none.
    Raises ``ValueError`` for a value <= 0."""
    vals = [float(v) for v in values if v is not None and not pd.isna(v)]
    if not vals:
        return float("nan")
    if any(v <= 0 for v in vals):
        raise ValueError(f"geometric mean needs positive values, got {min(vals)}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


#: Ratios within this fraction of 1.0 count as ties by the point estimate (the published dense
#: suite's rule; ``tie`` column). Verdicts use intervals instead (:mod:`flyexplore.measure.stats`).
TIE_BAND = 0.01

SPEEDUP_COLUMNS = ("backend", "time_ms", "baseline", "baseline_ms", "speedup", "speedup_lo",
                   "speedup_hi", "verdict", "interval", "tie", "source")
#: Columns :func:`speedup` and :func:`ratio_interval` read (besides ``by``). ``status``,
#: ``time_ms`` and ``backend`` must be there; any other may be missing (it reads as NA).
SPEEDUP_INPUTS = ("status", "time_ms", "backend", "flydsl_taken", "run_id", "source", "band", "baseline",
                  "speedup", "speedup_lo", "speedup_hi", "order", "samples_ms", "platform",
                  "time_ci_lo_ms", "time_ci_hi_ms", "processes", "process_estimates", "env")


def _eq(a, b) -> bool:
    """``a == b`` where a missing value equals nothing."""
    return not (pd.isna(a) or pd.isna(b)) and a == b


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_eq` element by element over two object arrays of one length."""
    out = np.zeros(len(a), dtype=bool)
    ok = ~(pd.isna(a) | pd.isna(b))
    if ok.any():
        out[ok] = np.asarray(a[ok] == b[ok], dtype=bool)
    return out


class _Rows:
    """The columns of a result frame that the speedup rules read, as numpy arrays by row position
    (a column the frame lacks reads as NA), and each row's samples parsed from ``samples_ms``
    (:meth:`parsed`: by :func:`flyexplore.results.samples.parse`, in one batch per call, each
    text once). ``keep``: the positions in ``df`` of the rows meant (default: every row); position
    ``i`` here is row ``keep[i]`` there, and only the samples of rows asked for are copied out."""

    def __init__(self, df: pd.DataFrame, keep: np.ndarray | None = None):
        self.df = df
        self.keep = keep
        self.n = len(df) if keep is None else len(keep)
        self._obj: dict[str, np.ndarray] = {}
        self._num: dict[str, np.ndarray] = {}
        self._parsed = np.full(self.n, None, dtype=object)

    def _col(self, c: str) -> pd.Series:
        return self.df[c] if self.keep is None else self.df[c].iloc[self.keep]

    def obj(self, c: str) -> np.ndarray:
        """Column ``c`` as an object array (NA where missing)."""
        a = self._obj.get(c)
        if a is None:
            a = self._obj[c] = (self._col(c).to_numpy(dtype=object) if c in self.df
                                else np.full(self.n, pd.NA, dtype=object))
        return a

    def num(self, c: str) -> np.ndarray:
        """Column ``c`` as float64 (NaN where missing or not a number)."""
        a = self._num.get(c)
        if a is None:
            if c not in self.df:
                a = np.full(self.n, np.nan)
            elif pd.api.types.is_numeric_dtype(self.df[c].dtype) and not pd.api.types.is_bool_dtype(self.df[c].dtype):
                # a number column (float64, Float64, Int64): converted whole, then the rows taken
                a = self.df[c].to_numpy(dtype=float, na_value=np.nan)
                a = np.array(a) if self.keep is None else a[self.keep]   # never a view of the frame
            else:
                a = pd.to_numeric(self._col(c), errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            self._num[c] = a
        return a

    def allowance(self) -> np.ndarray:
        """Each row's run-to-run allowance (:data:`RUN_TO_RUN` of its ``platform``; -inf where
        it has none)."""
        a = self._num.get("_allowance")
        if a is None:
            a = self._num["_allowance"] = _allowance(self.obj("platform"))
        return a

    def parsed(self, pos: np.ndarray) -> np.ndarray:
        """The :class:`flyexplore.results.samples.Parsed` records of the rows at positions ``pos``
        (an object array in that order); the rows not parsed yet are parsed together
        (:func:`flyexplore.results.samples.parse_column`). Raises :class:`UsageError` naming the
        first row (op, case, dtype, backend, run) whose samples do not parse."""
        pos = np.asarray(pos, dtype=np.int64)
        todo = np.unique(pos[np.equal(self._parsed[pos], None)])
        if todo.size:
            at = todo if self.keep is None else self.keep[todo]
            try:
                got = (SP.parse_column(self.df["samples_ms"], at) if "samples_ms" in self.df
                       else [SP.EMPTY] * todo.size)
            except SP.BadSamples as exc:
                row = self.df.iloc[exc.position]
                what = " ".join(str(row.get(c)) for c in (*KEY, "run_id"))
                raise UsageError(f"the samples of the row {what} cannot be read: {exc.reason} "
                                 "(samples_ms must be a JSON list of rounds, each a list of times in ms)") from None
            self._parsed[todo] = np.fromiter(got, dtype=object, count=len(got))
            release_arrow_memory()   # the conversion's and the parser's buffers
        return self._parsed[pos]


#: Run-to-run allowance for comparisons across runs of rows measured in one process each (no
#: ``--processes``): the interval of a ratio of medians from different runs is widened by this
#: fraction on each side, because one process's interval knows its own noise but not how much a
#: fresh process or another run reads (clock and power state, autotune choices on a GPU; load and
#: neighbours on a shared CPU). Calibrated by ``benchmarks/evidence/reproducible.py`` (``calibration.json``:
#: for every row, every two single processes of different runs, ``|t_p / t_q - 1|``), the 95th
#: percentile rounded up: H200, 8 GEMM shapes x 3 backends x 3 runs x 3 processes (648 pairs):
#: median 0.45%, p95 3.61%, largest 8.7% (``label_cap_0.2/``), and the same again a day later:
#: median 0.35%, p95 3.34%, largest 7.7% -> 4% (the 2% used before gave FASTER to 4 of 72
#: cross-run A-vs-A pairs); this 2-core shared CPU, 6 shapes x 2 backends x 2 runs x 3 processes,
#: twice (data/bench/reproducible_cpu): p95 9.5% and 34%, largest 13% and 50% -> 50% (was 100%;
#: 10% gave one SLOWER of 12 identical pairs). Rows measured with ``--processes`` carry their own
#: between-process variation and use it instead (``between-process`` intervals). Where a side
#: drifted more than this within its own run, :func:`ratio_interval` widens by that drift.
RUN_TO_RUN = {"cuda": 0.04, "rocm": 0.04, "cpu": 0.50}
#: A shift of a whole run that its own processes cannot see, as a standard deviation in log
#: space, per platform: added (in quadrature) to the between-process intervals of rows measured
#: with ``--processes`` and of cross-run pairs of such rows
#: (:func:`flyexplore.measure.stats.between_process`, :func:`~flyexplore.measure.stats.between_runs`).
#: Calibrated by ``benchmarks/evidence/reproducible.py`` as the variance of run means beyond what the runs'
#: between-process variation explains (method of moments, pooled over rows): H200, 2 runs x 3
#: processes x 24 rows: none (the between-run differences, -0.94% to +0.31%, are what the
#: processes' own spread predicts: excess variance < 0), so 0; this 2-core shared CPU, 2 runs x 3
#: processes x 12 rows: 2.6% (the machine's speed moves with its neighbours' load over minutes,
#: more than over the seconds between passes), so 3%. On a GPU the shift grows with the row's own
#: spread instead: :data:`RUN_SHIFT_PER_SD`.
RUN_SHIFT = {"cuda": 0.0, "rocm": 0.0, "cpu": 0.03}
#: A run shift in proportion to a row's own between-process spread, per platform: the shift used
#: for a row (or a cross-run pair) of ``--processes`` rows is ``max(RUN_SHIFT, RUN_SHIFT_PER_SD x
#: sd)``, ``sd`` the standard deviation of one process's log estimate. A GPU under its power limit
#: moves between runs a few minutes apart as it moves between processes, and the more a shape
#: moves between processes, the more it moves between runs: on an H200, two sweeps of 8 processes
#: each (``benchmarks/evidence/reproducible.py --processes 8``, ``data/h200/reproducible/processes8/``) read
#: 8192x8192x8192 4% apart, past their Welch interval (A-vs-A read FASTER on 2 of 24 pairs, and
#: each run's interval held the other run's time on 39 of 48 rows). Method of moments over those
#: 24 rows x 1 pair of runs: excess variance of run means / per-process variance = 0.47, whose
#: square root, 0.69, is rounded to 0.7
#: (the 3-process runs cannot see it: their ratios are 0.005 and below 0). The CPU's flat
#: ``RUN_SHIFT`` stands.
RUN_SHIFT_PER_SD = {"cuda": 0.7, "rocm": 0.7, "cpu": 0.0}
#: The per-process floor, per platform: the standard deviation, in log space, of the offset that
#: one fresh process -- one pair of an environment A/B's workers, one ``--processes`` process --
#: gives a speedup and that its own rounds cannot see. A row combined from fewer than
#: :data:`flyexplore.run.processes.SPREAD_PAIRS` (3) pairs or processes has no spread between them
#: to read, so its speedup's interval is widened by this floor
#: (:func:`flyexplore.measure.stats.between_process`, ``floor``): one pair never reads FASTER or
#: SLOWER on a difference one fresh process can explain (issue 45). Three or more read their own
#: spread (the t-interval over pairs), as before. Sources, the worst case seen on each, rounded up:
#:
#: - **GPU** (``cuda``, ``rocm``): A/As on the lent H100. bf16 ATen calls
#:   (``benchmarks/evidence/aa_pairs.py --device cuda``, ``data/h100/aa_pairs/``, 4-11 pairs a case):
#:   0.05-0.9% (standard deviation of the per-pair log speedups) for GEMMs and a 4 ms TopK, 0.8-5.0%
#:   for RMSNorm and TopK 1024x4096x8, memory-bound (RMSNorm 32768x4096, 261 µs: 5.03%). A whole
#:   model step, launch-bound (``data/h100/ab_auto/model.parquet``: a 2-layer Llama-like prefill of
#:   1.1-2.7 ms under ``--aa``): 13.5-14.3%, one pair 27% off -> 15%. (The H200: 0.7-2.9% for
#:   calls under 20 µs, ``data/h200/ab/aa.parquet``.)
#: - **CPU**: A/As on this project's 2-core shared machine, other jobs beside it (``data/cpu/aa/``:
#:   20 A/As at each of 1, 3 and auto pairs, 283 pairs in all), after the workers' heap was fixed
#:   (:data:`flyexplore.run.engine.CPU_MALLOC`, which removed a 5x offset): 1.2-2.9% for GEMM and
#:   TopK, 13.2-25.0% for RMSNorm, memory-bound (1024x1024: one pair 87% off) -> 25%.
PROCESS_FLOOR = {"cuda": 0.15, "rocm": 0.15, "cpu": 0.25}
#: Where :data:`RUN_TO_RUN`'s figures come from (shown beside every verdict that uses them).
RUN_TO_RUN_SOURCE = ("data/h200/reproducible/calibration.json (and label_cap_0.2/) and "
                     "data/bench/reproducible_cpu/calibration.json")


def ratio_interval(base_rows: pd.DataFrame, x_rows: pd.DataFrame) -> tuple[float, float, float, str]:
    """Speedup ``base time / x time`` of one case with its 95% interval, from the rows' stored
    samples: ``(estimate, lo, hi, method)``, floats (a ratio, no unit; lo/hi NaN without an
    interval) and the method's name.

    ``base_rows``, ``x_rows``: the rows (one or more each, with a ``time_ms``) of the baseline and
    of the other backend in one case; the columns read are :data:`SPEEDUP_INPUTS` (missing ones
    read as NA). The estimate is the ratio of the two sides' median ``time_ms``.

    * ``paired``: one row each, from one run, timed interleaved in the same rounds ->
      :func:`flyexplore.measure.stats.paired_ratio`;
    * ``unpaired``: samples on both sides otherwise (block order, several runs, two files) ->
      :func:`flyexplore.measure.stats.unpaired_ratio` over round medians; when the two sides come from
      different runs the interval is widened on each side by :data:`RUN_TO_RUN` of their
      platform, or by how far either side drifted within its own run
      (:func:`flyexplore.measure.stats.drift`) when that is more (``unpaired+run``);
    * ``notch``: schema-1 rows without samples -> the two medians' notch intervals divided
      (approximate);
    * ``none``: no interval (published rows); the estimate is the ratio of median times.

    Raises ``ValueError`` when paired rows' rounds differ in number once empty rounds are
    skipped (:func:`flyexplore.measure.stats.paired_ratio`), and :class:`UsageError` naming the
    row whose ``samples_ms`` is not a JSON list of rounds. Many pairs at once:
    :func:`ratio_intervals`."""
    est = float(base_rows["time_ms"].astype(float).median() / x_rows["time_ms"].astype(float).median())
    e, lo, hi, how = ratio_intervals(base_rows, [np.arange(len(base_rows))], x_rows, [np.arange(len(x_rows))],
                                     np.asarray([est]))
    return float(e[0]), float(lo[0]), float(hi[0]), str(how[0])


def ratio_intervals(base: pd.DataFrame | _Rows, base_groups: Sequence[np.ndarray], x: pd.DataFrame | _Rows,
                    x_groups: Sequence[np.ndarray], est: np.ndarray, with_allowance: bool = False,
                    run_to_run: float | None = None) -> tuple[np.ndarray, ...]:
    """The rules of :func:`ratio_interval` for many pairs at once: pair ``k`` is the rows at
    positions ``base_groups[k]`` of ``base`` (the baseline side) against ``x_groups[k]`` of ``x``
    (positions in row order, not index labels; ``base`` and ``x`` may be one frame), and
    ``est[k]`` the ratio of their median ``time_ms`` (the estimate of a ``notch`` or ``none``
    pair). Returns ``(estimate, lo, hi, method)`` arrays (float64 ratios, an object array of
    method names), one entry per pair.

    Each row's samples are parsed once (:mod:`flyexplore.results.samples`); pairs of one row a
    side -- what a sweep and a compare of two sweeps give -- are computed together with numpy,
    the paired ones for all pairs of one round count at once; only pairs with several rows on a
    side (several runs of a backend) concatenate their samples one pair at a time. Raises
    ``ValueError`` as :func:`ratio_interval` does.

    ``with_allowance``: also return a fifth array, the relative cross-run allowance each pair's
    interval holds (NaN where none): for ``unpaired+run`` the fraction each side was widened by
    (:data:`RUN_TO_RUN` or a drift), for ``between-process`` the relative half-width of the
    interval (:func:`flyexplore.measure.stats.between_runs`: ``exp(half) - 1``).

    ``run_to_run``: the cross-run allowance of ``unpaired+run`` pairs in place of each row's
    :data:`RUN_TO_RUN` (a fraction; the allowance learned from a history of identical runs of the
    rows' one device, :func:`flyexplore.results.history.compare_allowance`); None: the constant."""
    b = base if isinstance(base, _Rows) else _Rows(base)
    x = x if isinstance(x, _Rows) else _Rows(x)
    if run_to_run is None:
        allow_b, allow_x = b.allowance, x.allowance
    else:
        def allow_b():
            return np.full(b.n, float(run_to_run))

        def allow_x():
            return np.full(x.n, float(run_to_run))
    n = len(base_groups)
    est = np.array(est, dtype=float)
    lo, hi = np.full(n, np.nan), np.full(n, np.nan)
    how = np.full(n, "none", dtype=object)
    allow = np.full(n, np.nan)
    if not n:
        return (est, lo, hi, how, allow) if with_allowance else (est, lo, hi, how)
    nb = np.fromiter((len(g) for g in base_groups), dtype=np.int64, count=n)
    nx = np.fromiter((len(g) for g in x_groups), dtype=np.int64, count=n)
    one = (nb == 1) & (nx == 1)
    i = np.fromiter((g[0] if len(g) else -1 for g in base_groups), dtype=np.int64, count=n)
    j = np.fromiter((g[0] if len(g) else -1 for g in x_groups), dtype=np.int64, count=n)
    pb = b.parsed(np.concatenate([np.asarray(g, dtype=np.int64) for g in base_groups]))
    px = x.parsed(np.concatenate([np.asarray(g, dtype=np.int64) for g in x_groups]))
    first_b, first_x = np.cumsum(nb) - nb, np.cumsum(nx) - nx
    rb = np.zeros(n, dtype=np.int64)
    rx = np.zeros(n, dtype=np.int64)
    rb[one] = [p.rounds for p in pb[first_b[one]]]
    rx[one] = [p.rounds for p in px[first_x[one]]]

    # an environment A/B's own pairs: x's row carries its speedup over base's arm, measured round
    # by round in the same run (paired; with --pairs, the interval over the fresh pairs of workers)
    envp = one.copy()
    if envp.any():
        ii, jj = np.maximum(i, 0), np.maximum(j, 0)
        eb, ex = b.obj("env"), x.obj("env")
        envp &= ~pd.isna(eb[ii]) & ~pd.isna(ex[jj]) & _same(b.obj("run_id")[ii], x.obj("run_id")[jj])
        arms = np.asarray([_arm_of(bk, e) for bk, e in zip(b.obj("backend")[ii], eb[ii])], dtype=object)
        envp &= _same(x.obj("baseline")[jj], arms)
        lo_s, hi_s, sp_s = x.num("speedup_lo")[jj], x.num("speedup_hi")[jj], x.num("speedup")[jj]
        envp &= np.isfinite(lo_s) & np.isfinite(hi_s) & np.isfinite(sp_s)
        if envp.any():
            k = np.flatnonzero(envp)
            est[k], lo[k], hi[k] = sp_s[k], lo_s[k], hi_s[k]
            many_pairs = x.num("processes")[jj[k]] >= 2
            how[k] = np.where(many_pairs, "between-pair", "paired")
            one = one & ~envp

    # between-process: one row a side, each measured in >= 2 fresh processes (sweep --processes):
    # the per-process estimates give the interval, within and between processes together
    procs = one & (b.num("processes")[np.maximum(i, 0)] >= 2) & (x.num("processes")[np.maximum(j, 0)] >= 2)
    if procs.any():
        _between(np.flatnonzero(procs), b, i, x, j, est, lo, hi, how, allow)
        # both kinds are final: an A/B's two non-base arms (between-pair) are not paired again
        # over the rounds, which would drop the spread between the pairs of workers
        one = one & ~np.isin(how, ("between-process", "between-pair"))

    # paired: one row a side, both interleaved in one run, the same number of stored rounds
    paired = one.copy()
    if paired.any():
        ii, jj = i[paired], j[paired]
        paired[paired] = (_same(b.obj("order")[ii], np.full(ii.size, "interleaved", dtype=object))
                          & _same(x.obj("order")[jj], np.full(jj.size, "interleaved", dtype=object))
                          & _same(b.obj("run_id")[ii], x.obj("run_id")[jj]))
        paired &= (rb > 0) & (rb == rx)
    if paired.any():
        _paired(np.flatnonzero(paired), pb[first_b], px[first_x], est, lo, hi, how)

    # unpaired: samples on both sides; one row a side from the parsed records, together
    rest = ~paired & ~np.isin(how, ("between-process", "between-pair")) & ~envp
    if rest.any():
        kk = np.flatnonzero(rest & one)
        if kk.size:
            sb, sx = pb[first_b[kk]], px[first_x[kk]]
            has = np.fromiter((p.values.size > 0 and q.values.size > 0 for p, q in zip(sb, sx)), dtype=bool,
                              count=kk.size)
            k1 = kk[has]
            if k1.size:
                _unpaired(k1, sb[has], sx[has], ~_same(b.obj("run_id")[i[k1]], x.obj("run_id")[j[k1]]),
                          np.maximum(allow_b()[i[k1]], allow_x()[j[k1]]), est, lo, hi, how, allow)
            # notch: one row a side, a side without samples: the stored intervals of the medians
            k2 = kk[~has]
            if k2.size:
                blo, bhi = b.num("time_ci_lo_ms")[i[k2]], b.num("time_ci_hi_ms")[i[k2]]
                xlo, xhi = x.num("time_ci_lo_ms")[j[k2]], x.num("time_ci_hi_ms")[j[k2]]
                with np.errstate(divide="ignore", invalid="ignore"):
                    ok = np.isfinite(blo) & np.isfinite(bhi) & np.isfinite(xlo) & np.isfinite(xhi) & (xlo > 0) & (blo > 0)
                    lo[k2[ok]], hi[k2[ok]] = blo[ok] / xhi[ok], bhi[ok] / xlo[ok]
                how[k2[ok]] = "notch"
        many = np.flatnonzero(rest & ~one)   # several rows on a side: their samples joined, in row order
        if many.size:
            vb = [np.concatenate([p.values for p in pb[first_b[k]:first_b[k] + nb[k]]] or [np.empty(0)])
                  for k in many.tolist()]
            vx = [np.concatenate([p.values for p in px[first_x[k]:first_x[k] + nx[k]]] or [np.empty(0)])
                  for k in many.tolist()]
            has = np.fromiter((u.size > 0 and w.size > 0 for u, w in zip(vb, vx)), dtype=bool, count=many.size)
            k3 = many[has]
            if k3.size:
                sb = SP.summarize_many([0] * k3.size, [v for v, h in zip(vb, has) if h])
                sx = SP.summarize_many([0] * k3.size, [v for v, h in zip(vx, has) if h])
                cross = np.zeros(k3.size, dtype=bool)
                allow_ = np.zeros(k3.size)
                run_b, run_x = b.obj("run_id"), x.obj("run_id")
                al_b, al_x = allow_b(), allow_x()
                for m, k in enumerate(k3.tolist()):
                    ib, ix = base_groups[k], x_groups[k]
                    runs_b = {v for v in run_b[ib] if not pd.isna(v)}
                    runs_x = {v for v in run_x[ix] if not pd.isna(v)}
                    cross[m] = runs_b != runs_x or len(runs_b) != 1
                    allow_[m] = max(al_b[ib].max(), al_x[ix].max())
                _unpaired(k3, np.asarray(sb, dtype=object), np.asarray(sx, dtype=object), cross, allow_,
                          est, lo, hi, how, allow)
    return (est, lo, hi, how, allow) if with_allowance else (est, lo, hi, how)


def _of_platform(table: dict, platform) -> float:
    return table.get(str(platform), table["cpu"]) if not pd.isna(platform) else table["cpu"]


def run_shift(platform) -> float:
    """:data:`RUN_SHIFT` of ``platform`` (the CPU's for an unknown or missing one)."""
    return _of_platform(RUN_SHIFT, platform)


def process_floor(platform) -> float:
    """:data:`PROCESS_FLOOR` of ``platform`` (the CPU's for an unknown or missing one): the
    standard deviation, in log space (natural log, no unit), of one fresh process's offset on a
    speedup."""
    return _of_platform(PROCESS_FLOOR, platform)


def run_shift_per_sd(platform) -> float:
    """:data:`RUN_SHIFT_PER_SD` of ``platform`` (the CPU's for an unknown or missing one)."""
    return _of_platform(RUN_SHIFT_PER_SD, platform)


def _between(k: np.ndarray, b: _Rows, i: np.ndarray, x: _Rows, j: np.ndarray, est, lo, hi, how, allow) -> None:
    """Pairs ``k`` whose one row a side carries >= 2 per-process estimates: the ratio of the
    sides' geometric-mean times with the Welch interval over processes
    (:func:`flyexplore.measure.stats.between_runs`). Rows of one run (the same ``run_id``) were
    timed process by process together: their per-process time ratios are combined instead
    (:func:`flyexplore.measure.stats.between_process`, a prediction interval). A pair whose
    estimates do not read is left to the other rules. Writes into the arrays."""
    eb, ex, rb, rx = b.obj("process_estimates"), x.obj("process_estimates"), b.obj("run_id"), x.obj("run_id")
    pl, px_ = b.obj("platform"), x.obj("platform")
    for q in k.tolist():
        pb, px = process_estimates(eb[i[q]]), process_estimates(ex[j[q]])
        tb = [float(p.get("time_ms") or np.nan) for p in pb]
        tx = [float(p.get("time_ms") or np.nan) for p in px]
        sb = [float(p["time_se"]) if p.get("time_se") is not None else np.nan for p in pb]
        sx = [float(p["time_se"]) if p.get("time_se") is not None else np.nan for p in px]
        if len(tb) < 2 or len(tx) < 2:
            continue
        in_ab = False
        if _eq(rb[i[q]], rx[j[q]]) and len(tb) == len(tx):
            r = np.asarray(tb) / np.asarray(tx)
            se = np.sqrt(np.asarray(sb) ** 2 + np.asarray(sx) ** 2)
            # an environment A/B's two arms took turns in each pair of workers: the interval of
            # the mean over the pairs (nothing to predict); --processes rows predict another run
            in_ab = not (pd.isna(b.obj("env")[i[q]]) or pd.isna(x.obj("env")[j[q]]))
            e, l_, h_ = S.between_process(r, se, prediction=not in_ab)
            a = h_ / e - 1 if math.isfinite(h_) and e > 0 and not in_ab else np.nan
        else:
            e, l_, h_, a = S.between_runs(tb, sb, tx, sx, shift=max(run_shift(pl[i[q]]), run_shift(px_[j[q]])),
                                          shift_per_sd=max(run_shift_per_sd(pl[i[q]]), run_shift_per_sd(px_[j[q]])))
            a = math.expm1(a)   # the allowance as a fraction, as for unpaired+run
        if not all(math.isfinite(v) for v in (e, l_, h_)):
            continue
        est[q], lo[q], hi[q], how[q], allow[q] = e, l_, h_, "between-pair" if in_ab else "between-process", a


def _arm_of(backend, env):
    """The arm a row stands for: its ``backend`` when that is already an arm's name
    (``flash@A``), else ``backend@env`` (a side of an environment A/B whose backend column was
    read without its environment: :func:`flyexplore.results.compare.env_sides`)."""
    if pd.isna(backend):
        return pd.NA
    if split_arm(backend)[1] is not None or pd.isna(env):
        return backend
    return arm_name(str(backend), str(env))


def _allowance(platform: np.ndarray) -> np.ndarray:
    """:data:`RUN_TO_RUN` of each platform (the CPU's for an unknown one), -inf where missing."""
    codes, names = pd.factorize(pd.Series(platform, dtype=object))
    allow = np.asarray([RUN_TO_RUN.get(str(p), RUN_TO_RUN["cpu"]) for p in names] + [-np.inf], dtype=float)
    return allow[codes]   # code -1 (missing) picks the last entry, -inf


def _paired(k: np.ndarray, pb: np.ndarray, px: np.ndarray, est, lo, hi, how) -> None:
    """Paired ratios (:func:`flyexplore.measure.stats.paired_ratio`) of pairs ``k``, whose one
    row a side has parsed records ``pb[k]``, ``px[k]``: all pairs of one number of rounds as one
    array, a pair with a non-finite ratio by the scalar function. Writes into the arrays."""
    nvb = np.fromiter((p.values.size for p in pb[k]), dtype=np.int64, count=k.size)
    nvx = np.fromiter((p.values.size for p in px[k]), dtype=np.int64, count=k.size)
    bad = np.flatnonzero(nvb != nvx)
    if bad.size:
        raise ValueError(f"paired rounds differ in number: {nvb[bad[0]]} vs {nvx[bad[0]]}")
    how[k] = "paired"
    est[k] = np.nan
    for m in np.unique(nvb):
        kk = k[nvb == m]
        if m == 0:
            continue
        r = np.stack([p.values for p in pb[kk]]) / np.stack([p.values for p in px[kk]])
        fin = np.isfinite(r).all(axis=1)
        for q in kk[~fin].tolist():
            e, l_, h_ = S.paired_ratio([[v] for v in pb[q].values], [[v] for v in px[q].values])
            est[q], lo[q], hi[q] = e, l_, h_
        kk, r = kk[fin], r[fin]
        if not kk.size:
            continue
        est[kk] = np.median(r, axis=1)
        a, z = S.median_ci_ranks(int(m), S.CONFIDENCE) if m >= 2 else (-1, int(m))
        if a >= 0 and z < m:
            srt = np.sort(r, axis=1)
            lo[kk], hi[kk] = srt[:, a], srt[:, z]


def _unpaired(k: np.ndarray, pb: np.ndarray, px: np.ndarray, cross: np.ndarray, allow: np.ndarray,
              est, lo, hi, how, used=None) -> None:
    """Unpaired ratios (:func:`flyexplore.measure.stats.unpaired_ratio`) of pairs ``k`` from each
    side's parsed record (``pb``, ``px``: one :class:`~flyexplore.results.samples.Parsed` a pair:
    median, interval at the side confidence, drift), widened where ``cross`` (the sides come from
    different runs) by the larger of ``allow`` (the platforms' :data:`RUN_TO_RUN`; -inf: none
    known, the CPU's) and the two drifts. Writes into the arrays; ``used`` (optional) gets the
    allowance applied to each cross-run pair."""
    mb, blo, bhi, db = (np.fromiter((getattr(p, f) for p in pb), dtype=float, count=k.size)
                        for f in ("median", "lo", "hi", "drift"))
    mx, xlo, xhi, dx = (np.fromiter((getattr(p, f) for p in px), dtype=float, count=k.size)
                        for f in ("median", "lo", "hi", "drift"))
    allow = np.where(np.isneginf(allow), RUN_TO_RUN["cpu"], allow)
    with np.errstate(divide="ignore", invalid="ignore"):
        est[k] = mb / mx
        ok = np.isfinite(blo) & np.isfinite(bhi) & np.isfinite(xlo) & np.isfinite(xhi) & (xlo > 0)
        l_ = np.where(ok, blo / xhi, np.nan)
        h_ = np.where(ok, bhi / xlo, np.nan)
        a = np.fmax(np.fmax(allow, db), dx)   # a NaN drift counts for nothing, as in max()
        lo[k] = np.where(cross, l_ / (1 + a), l_)
        hi[k] = np.where(cross, h_ * (1 + a), h_)
    how[k] = np.where(cross, "unpaired+run", "unpaired")
    if used is not None:
        used[k] = np.where(cross, a, np.nan)   # the allowance applied, shown beside the verdict


def speedup(df: pd.DataFrame, baseline: str | Sequence[str] = "aten",
            by: Sequence[str] = ("op", "case", "dtype"), band: float | None = None) -> pd.DataFrame:
    """Speedup of every backend against ``baseline`` per case: baseline time / backend time,
    with its 95% interval and verdict label.

    ``df``: result rows (needs ``status``, ``time_ms``, ``backend`` and the ``by`` columns; the
    others of :data:`SPEEDUP_INPUTS` read as NA where missing). A case is one value of ``by``
    (NA is a value). ``baseline`` is one backend, or several: then the faster of them (lower
    median ``time_ms``; the first named on a tie) at each case (the published dense suite
    compares FlyDSL with the faster of ATen and Triton). Only ``ok`` and ``published`` rows with
    a time count, and never a row with ``flydsl_taken == False`` (a FlyDSL request that ran
    another kernel); a case without a baseline row gives no rows. Where a backend's one row in
    a case already carries the speedup its sweep measured against the same baseline in the same
    run (the baseline's one row there has the same ``run_id``), that is used (``paired``);
    otherwise the interval comes from the stored samples by the rules of
    :func:`ratio_interval`. Several rows of one backend in a case (several runs) count by
    their median time. ``band``: the SAME band (default: the backend row's own ``band``, else
    :data:`flyexplore.measure.stats.BAND`).

    Returns a frame with columns ``*by``, ``backend``, ``time_ms`` (the backend's median time,
    ms), ``baseline`` (the baseline backend chosen), ``baseline_ms`` (its median time, ms),
    ``speedup``, ``speedup_lo``, ``speedup_hi`` (float64, ratios; lo/hi NaN without an
    interval), ``verdict`` (FASTER/SAME/SLOWER/AMBIGUOUS by :func:`flyexplore.measure.stats.verdict`;
    NA for published figures, which carry no interval), ``interval`` (paired, unpaired,
    unpaired+run, notch, none), ``tie`` (bool: point estimate within :data:`TIE_BAND`, the
    published suite's rule) and ``source`` (the backend row's); one row per case and
    non-baseline backend, cases in the order they first appear in ``df``, backends in the order
    they first appear within their case. Raises :class:`UsageError` when no counted row is of
    the baseline."""
    cols = [*by, *SPEEDUP_COLUMNS]
    out = _speedup_columns(df, baseline, by, band)
    if out is None:
        return pd.DataFrame(columns=cols)
    res = pd.DataFrame(out or [], columns=cols)
    for c in ("speedup", "speedup_lo", "speedup_hi", "time_ms", "baseline_ms"):
        res[c] = res[c].astype(float)
    res["tie"] = res["tie"].astype(bool)
    return res


def _speedup_columns(df: pd.DataFrame, baseline: str | Sequence[str], by: Sequence[str],
                     band: float | None) -> dict | None:
    """:func:`speedup`'s columns (``*by`` and :data:`SPEEDUP_COLUMNS`) as arrays of one length;
    None when no row counts, an empty dict when no counted row pairs with a baseline (a frame is
    built only for the callers that show it: :func:`geomean_speedup` reads the arrays)."""
    df = without_attrs(df)   # no deep copy of a sweep's attrs in every operation below
    bases = [baseline] if isinstance(baseline, str) else list(baseline)
    counted = df["status"].isin(["ok", "published"]) & df["time_ms"].notna()
    if "flydsl_taken" in df:  # a FlyDSL request that ran something else is not a FlyDSL time
        counted &= ~(df["flydsl_taken"].astype("boolean") == False).fillna(False)  # noqa: E712
    keep = np.flatnonzero(counted.to_numpy(dtype=bool))
    if not keep.size:
        return None
    # the rows counted, without copying what only the sample-based intervals read (_Rows does)
    d = df[[c for c in dict.fromkeys([*by, "backend", "source"]) if c in df]].iloc[keep].reset_index(drop=True)
    if not d["backend"].isin(bases).any():
        raise UsageError(f"no rows for baseline {', '.join(bases)} "
                         f"(backends present: {', '.join(sorted(d['backend'].dropna().unique()))})")
    rows = _Rows(df, keep)
    # the cases (values of ``by``; NA a value), numbered in order of first appearance, and each
    # case's values of ``by`` (from its first row)
    case = group_codes([d[c] for c in by])
    at_first = np.unique(case, return_index=True)[1]
    levels = [d[c].to_numpy(dtype=object)[at_first] for c in by]
    # "combos": the (case, backend) groups, numbered in order of first appearance (rows without
    # a backend belong to none); their median times, row counts and rows
    backend = rows.obj("backend")
    pos = np.flatnonzero(~pd.isna(backend))
    cid = group_codes([case[pos], backend[pos]])
    med = pd.Series(rows.num("time_ms")[pos]).groupby(cid).median().to_numpy(dtype=float)
    cnt = np.bincount(cid, minlength=med.size)
    in_order = np.argsort(cid, kind="stable")  # rows grouped by combo, each combo's in row order
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    first = pos[in_order[start]]  # each combo's first row
    c_case, c_backend = case[first], backend[first]
    rank = np.full(med.size, -1, dtype=np.int64)   # each combo's place in bases (-1: not a baseline)
    for i, b in reversed(list(enumerate(bases))):   # a name given twice keeps its first place
        rank[c_backend == b] = i

    # the baseline of each case: its fastest baseline combo (the first named on a tie)
    bi = np.flatnonzero(rank >= 0)
    bi = bi[np.lexsort((rank[bi], med[bi], c_case[bi]))]
    with_base, at = np.unique(c_case[bi], return_index=True)
    base_of = np.full(at_first.size, -1)
    base_of[with_base] = bi[at]
    xi = np.flatnonzero((rank < 0) & (base_of[c_case] >= 0))
    xi = xi[np.lexsort((xi, c_case[xi]))]  # by case, then backend by first appearance
    bc = base_of[c_case[xi]]
    n = xi.size
    if not n:
        return {}
    x0, b0 = first[xi], first[bc]
    bname = [bases[r] for r in rank[bc]]
    sp = rows.num("speedup")
    fast = ((cnt[xi] == 1) & (cnt[bc] == 1) & _same(rows.obj("baseline")[x0], np.asarray(bname, dtype=object))
            & ~np.isnan(sp[x0]) & _same(rows.obj("run_id")[b0], rows.obj("run_id")[x0]))
    est, lo, hi = sp[x0], rows.num("speedup_lo")[x0], rows.num("speedup_hi")[x0]
    how = np.full(n, "paired", dtype=object)

    slow = np.flatnonzero(~fast)  # the pairs whose interval comes from the samples
    if slow.size:
        members = np.split(pos[in_order], start[1:])   # each combo's rows, in row order
        est[slow], lo[slow], hi[slow], how[slow] = ratio_intervals(
            rows, [members[c] for c in bc[slow]], rows, [members[c] for c in xi[slow]],
            med[bc[slow]] / med[xi[slow]])
    src = rows.obj("source")
    pub = np.zeros(len(d), dtype=bool)
    if "source" in d:
        pub = d["source"].eq("published").fillna(False).to_numpy(dtype=bool)
    c_pub = np.bincount(cid, weights=pub[pos], minlength=med.size) > 0
    published = c_pub[xi] | c_pub[bc]
    if band is not None:
        bd = band
    else:
        own = rows.num("band")[x0]
        bd = np.where(np.isnan(own), S.BAND, own)
    verdict = S.verdicts(lo, hi, bd)
    verdict[published & (how == "none")] = pd.NA
    out = {c: levels[j][c_case[xi]] for j, c in enumerate(by)}
    out.update(backend=c_backend[xi].tolist(), time_ms=med[xi], baseline=bname, baseline_ms=med[bc],
               speedup=est, speedup_lo=lo, speedup_hi=hi, verdict=verdict, interval=how.tolist(),
               tie=np.abs(est - 1.0) <= TIE_BAND, source=src[x0].tolist())
    return out


def geomean_speedup(df: pd.DataFrame, baseline: str | Sequence[str] = "aten",
                    by: Sequence[str] = ("op", "case", "dtype")) -> pd.DataFrame:
    """Geometric-mean speedup per (op, dtype, backend) over the cases both sides have, with
    its 95% interval (:func:`flyexplore.measure.stats.geomean_ci`: per-case intervals combined in log
    space; NaN when a case has none) and label, and the count of each case label.
    The per-case speedups are :func:`speedup`'s (``by`` must name ``op`` and ``dtype``).
    Columns ``op, dtype, backend, cases`` (int), ``geomean, geomean_lo, geomean_hi`` (float
    ratios), ``verdict`` (:func:`flyexplore.measure.stats.verdict` at its default band; NA when a case
    has no label), ``FASTER, SAME, SLOWER, AMBIGUOUS`` (int counts of the case labels); one row
    per (op, dtype, backend), in order of first appearance. Raises :class:`UsageError` when no
    row is of the baseline."""

    cols = ["op", "dtype", "backend", "cases", "geomean", "geomean_lo", "geomean_hi", "verdict", *S.LABELS]
    s = _speedup_columns(df, baseline, by, None)
    if not s:
        return pd.DataFrame(columns=cols)
    # the (op, dtype, backend) groups in order of first appearance; a pair with a missing op or
    # dtype belongs to none (as pandas' groupby leaves NA keys out)
    keys = [np.asarray(s[c], dtype=object) for c in ("op", "dtype", "backend")]
    whole = np.flatnonzero(~(pd.isna(keys[0]) | pd.isna(keys[1]) | pd.isna(keys[2])))
    gid = np.full(keys[0].size, -1, dtype=np.int64)
    gid[whole] = group_codes([k[whole] for k in keys])
    at = whole[np.unique(gid[whole], return_index=True)[1]] if whole.size else whole   # each group's first pair
    group = {tuple(k[i] for k in keys): g for g, i in enumerate(at.tolist())}
    est_all = np.asarray(s["speedup"], dtype=float)
    lo_all, hi_all = np.asarray(s["speedup_lo"], dtype=float), np.asarray(s["speedup_hi"], dtype=float)
    verdict = np.asarray(s["verdict"], dtype=object)
    rows = []
    for (op, dt, be), g in group.items():
        ix = np.flatnonzero(gid == g)
        est, lo, hi = S.geomean_ci(est_all[ix], lo_all[ix], hi_all[ix])
        v = verdict[ix]
        lab = S.verdict(lo, hi) if not pd.isna(v).any() else pd.NA
        known = v[~pd.isna(v)]
        counts = {lb: int((known == lb).sum()) for lb in S.LABELS}
        rows.append({"op": op, "dtype": dt, "backend": be, "cases": int(ix.size), "geomean": est,
                     "geomean_lo": lo, "geomean_hi": hi, "verdict": lab, **counts})
    return pd.DataFrame(rows, columns=cols)


# Last, not at the top: flyexplore.results.table re-exports this module's names at its own end, so
# whichever of the two is imported first finds the names it asks for defined.
from flyexplore.results.table import KEY, group_codes, process_estimates, release_arrow_memory, without_attrs  # noqa: E402
