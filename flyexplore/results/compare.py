"""A/B comparison of two result sets paired by case: two torch builds, two AOTriton versions,
FlyDSL on vs off, this machine vs the published MI355X figures.

``ratio = time_A / time_B`` per paired key: > 1 means B is faster (the speedup of B over A).
Each ratio gets a 95% interval from the stored samples and a label (FASTER: B faster,
SAME, SLOWER, AMBIGUOUS; :mod:`flyexplore.measure.stats`): paired when both sides are rows of one
interleaved run, otherwise the unpaired interval. Cases present in one side only are listed,
never dropped silently; when the two environments differ (device, versions, clocks) the
result says so in ``warnings`` instead of mixing them silently.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.results import vllm as V

#: Two sides' clocks differ when their median case-start SM clocks differ by more than this.
CLOCK_DIFFERS = 0.05

#: Environment columns shown side by side (and flagged when they differ).
ENV_COLUMNS = ("platform", "device", "arch", "torch", "triton", "flydsl", "aotriton", "gpu_runtime",
               "python", "host", "env_id")


@dataclass
class ABResult:
    """The outcome of :func:`pair`.

    ``pairs``: one row per key in both sides, columns ``*key, time_a_ms, time_b_ms, ratio``
    (time_a / time_b; > 1: B faster), ``ratio_lo``, ``ratio_hi`` (95% interval), ``verdict``
    (FASTER = B faster, SAME, SLOWER, AMBIGUOUS; NA for published figures), ``interval``
    (paired, unpaired, notch, none), ``tie`` (point estimate within +-1%), ``source_a``,
    ``source_b``. ``only_a`` / ``only_b``: key rows present in one side only. ``summary``: per
    (op, dtype, backend) the number of pairs, geometric mean ratio with its interval and label,
    min, max, and the count of each label. ``names``: display names of the two sides;
    ``key``: the pairing columns; ``env``: :func:`env_table`; ``warnings``: one sentence per
    way the two environments differ."""

    pairs: pd.DataFrame
    only_a: pd.DataFrame
    only_b: pd.DataFrame
    summary: pd.DataFrame
    names: tuple[str, str]
    key: tuple[str, ...]
    env: pd.DataFrame = field(default_factory=pd.DataFrame)
    warnings: tuple[str, ...] = ()

    @property
    def geomean(self) -> float:
        """Geometric mean of all paired ratios."""
        return R.geomean(self.pairs["ratio"])

    @property
    def geomean_ci(self) -> tuple[float, float, float]:
        """``(geomean, lo, hi)`` of all paired ratios (:func:`geomean_interval`)."""
        return geomean_interval(self.pairs)


def geomean_interval(pairs: pd.DataFrame) -> tuple[float, float, float]:
    """``(geomean, lo, hi)`` of the ``ratio`` column of ``pairs`` (an :class:`ABResult`'s pairs).

    The per-pair intervals combine as in :func:`flyexplore.measure.stats.geomean_ci` (independent
    noise, in log space, shrinking as 1/sqrt(n)) -- except a run-to-run allowance
    (``unpaired+run`` pairs, :data:`flyexplore.results.table.RUN_TO_RUN`): that is one machine
    change shared by every case of the two runs, not noise that averages out, so it is taken off
    each pair's interval first and put back once, whole, on the geometric mean's. Without that,
    the geomean of 1,000 cross-run pairs read SLOWER while every pair read AMBIGUOUS."""
    est, lo, hi = (pairs[c].to_numpy(dtype=float, na_value=np.nan) for c in ("ratio", "ratio_lo", "ratio_hi"))
    run = (pairs["interval"] == "unpaired+run").to_numpy(dtype=bool) if "interval" in pairs else np.zeros(len(est), bool)
    a = pairs["allowance"].to_numpy(dtype=float, na_value=np.nan) if "allowance" in pairs else np.full(len(est), np.nan)
    run = run & np.isfinite(a)
    if not run.any():
        return S.geomean_ci(est, lo, hi)
    lo, hi = np.where(run, lo * (1 + a), lo), np.where(run, hi / (1 + a), hi)
    gm, glo, ghi = S.geomean_ci(est, lo, hi)
    common = float(np.max(a[run]))
    return gm, glo / (1 + common), ghi * (1 + common)


def _platform(a: pd.DataFrame, b: pd.DataFrame) -> str:
    vals = sorted({str(v) for d in (a, b) if "platform" in d for v in d["platform"].dropna().unique()})
    return ",".join(vals) or "unknown"


def _basis(hows: np.ndarray, allow: np.ndarray, platform: str) -> list:
    """Why each pair's interval holds the cross-run allowance it does (text; NA where none)."""
    out = []
    for h, a in zip(hows.tolist(), allow.tolist()):
        if h == "between-process" and math.isfinite(a):
            out.append(f"±{math.expm1(a):.1%}: the runs' own between-process variation")
        elif h == "unpaired+run" and math.isfinite(a):
            default = max((R.RUN_TO_RUN.get(p, R.RUN_TO_RUN["cpu"]) for p in platform.split(",")), default=math.nan)
            why = (f"the {platform} default (flyexplore.results.table.RUN_TO_RUN, calibrated on "
                   f"{R.RUN_TO_RUN_SOURCE}); measure with --processes to use the runs' own"
                   if abs(a - default) < 1e-12 else "how far a side drifted within its own run")
            out.append(f"±{a:.1%} a side: {why}")
        else:
            out.append(pd.NA)
    return out


def env_warnings(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B")) -> tuple[str, ...]:
    """Sentences naming how the measured rows of two result sets differ in environment:
    device, arch, versions (torch, Triton, flydsl, AOTriton, GPU runtime) and the SM clock
    (median case-start clock differing by more than :data:`CLOCK_DIFFERS`). Published rows
    are left out (they are another device by design)."""
    ma, mb = (d[d["source"] != "published"] if "source" in d else d for d in (a, b))
    out = []
    for c in ("device", "arch", "torch", "triton", "flydsl", "aotriton", "gpu_runtime"):
        if c not in ma or c not in mb:
            continue
        va, vb = set(ma[c].dropna().astype(str)), set(mb[c].dropna().astype(str))
        if va and vb and va != vb:
            out.append(f"{c} differs: {names[0]} {', '.join(sorted(va))}; {names[1]} {', '.join(sorted(vb))}")
    if "clock_mhz_start" in ma and "clock_mhz_start" in mb:
        ca = pd.to_numeric(ma["clock_mhz_start"], errors="coerce").median()
        cb = pd.to_numeric(mb["clock_mhz_start"], errors="coerce").median()
        if pd.notna(ca) and pd.notna(cb) and abs(ca / cb - 1) > CLOCK_DIFFERS:
            out.append(f"SM clock differs: median {ca:.0f} MHz at case start in {names[0]}, {cb:.0f} MHz in {names[1]}")
    for nm, d in zip(names, (ma, mb)):
        if "throttled" in d and (d["throttled"] == True).any():  # noqa: E712
            out.append(f"{int((d['throttled'] == True).sum())} row(s) of {nm} ran throttled "  # noqa: E712
                       "(clock below 80% of its maximum)")
    return tuple(out)


def env_table(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B")) -> pd.DataFrame:
    """The environments of two result sets side by side: one row per column of
    :data:`ENV_COLUMNS`, the distinct values on each side, and ``differs``."""
    rows = []
    for c in ENV_COLUMNS:
        va = ", ".join(sorted(str(v) for v in a[c].dropna().unique())) if c in a else ""
        vb = ", ".join(sorted(str(v) for v in b[c].dropna().unique())) if c in b else ""
        rows.append({"field": c, names[0]: va, names[1]: vb, "differs": va != vb})
    return pd.DataFrame(rows)


def pair(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B"),
         a_backend: str | None = None, b_backend: str | None = None,
         key: Sequence[str] = ("op", "case", "dtype", "backend")) -> ABResult:
    """Pair result sets ``a`` and ``b`` by ``key`` (default op, case, dtype, backend) and
    compute ``time_a / time_b`` per pair (median time when a key has several rows; only
    ``ok``/``published`` rows with a time count).

    ``a_backend``/``b_backend`` compare one backend of A with another of B (e.g. ``aten`` vs
    ``flydsl`` in one sweep, passed as both ``a`` and ``b``): rows are filtered to that backend
    and ``backend`` leaves the key; with one of them given, the other side takes the same
    backend. The intervals are the speedup rules' own, for all pairs at
    once (:func:`flyexplore.results.table.ratio_intervals`; each row's samples parsed once), so
    two 10,000-row files pair in about a second. Raises :class:`UsageError` when a given
    backend has no rows or no timed row, or when no key is in both sides."""
    key = list(key)
    if a_backend or b_backend:
        # one side named: the same backend on the other (never every backend of it pooled)
        a_backend, b_backend = a_backend or b_backend, b_backend or a_backend
        for side, d, be in (("A", a, a_backend), ("B", b, b_backend)):
            rows = d["backend"] == be
            if not rows.any():
                raise UsageError(f"no rows for backend {be!r} in {side} "
                                 f"(backends present: {', '.join(sorted(d['backend'].dropna().unique()))})")
            timed = rows & d["status"].isin(["ok", "published"]) & d["time_ms"].notna()
            if not timed.any():
                st = ", ".join(f"{n} {k}" for k, n in d.loc[rows, "status"].value_counts(dropna=False).items())
                raise UsageError(f"backend {be!r} in {side} has no timed row (its rows: {st})")
        a = a[a["backend"] == a_backend] if a_backend else a
        b = b[b["backend"] == b_backend] if b_backend else b
        key = [k for k in key if k != "backend"]
    # the rows that count, as positions in a and b: the sample-based intervals read the samples
    # of those rows only, where they are (a copy of every row would copy every row's samples)
    ka, kb = (np.flatnonzero((d["status"].isin(["ok", "published"]) & d["time_ms"].notna()).to_numpy(dtype=bool))
              for d in (a, b))
    da = a[[*key, "time_ms", "source"]].iloc[ka].reset_index(drop=True)
    db = b[[*key, "time_ms", "source"]].iloc[kb].reset_index(drop=True)
    ga = da.groupby(key, dropna=False, sort=False, observed=True)
    gb = db.groupby(key, dropna=False, sort=False, observed=True)
    ta = ga.agg(time_ms=("time_ms", "median"), source=("source", "first")).reset_index()
    tb = gb.agg(time_ms=("time_ms", "median"), source=("source", "first")).reset_index()
    ta["_order_a"], tb["_order_b"] = range(len(ta)), range(len(tb))  # = each side's group number
    j = ta.merge(tb, on=key, how="outer", suffixes=("_a", "_b"), indicator=True)
    j = j.sort_values(["_order_a", "_order_b"], na_position="last")
    only_a = j.loc[j["_merge"] == "left_only", key].reset_index(drop=True)
    only_b = j.loc[j["_merge"] == "right_only", key].reset_index(drop=True)
    p = j[j["_merge"] == "both"].drop(columns="_merge").rename(
        columns={"time_ms_a": "time_a_ms", "time_ms_b": "time_b_ms"}).reset_index(drop=True)
    if p.empty:
        raise UsageError(f"no case is in both {names[0]} and {names[1]} "
                         f"({len(only_a)} only in {names[0]}, {len(only_b)} only in {names[1]})")
    rows_a, rows_b = _groups(ga), _groups(gb)
    ests, los, his, hows, allow = R.ratio_intervals(
        a, [ka[rows_a[g]] for g in p.pop("_order_a").astype(int)], b, [kb[rows_b[g]] for g in p.pop("_order_b").astype(int)],
        (p["time_a_ms"] / p["time_b_ms"]).to_numpy(dtype=float), with_allowance=True)
    p["ratio"] = ests
    p["ratio_lo"], p["ratio_hi"], p["interval"] = los, his, hows
    p["allowance"] = allow
    p["allowance_basis"] = _basis(hows, allow, _platform(a, b))
    p["verdict"] = [pd.NA if h == "none" else S.verdict(lo, hi) for h, lo, hi in zip(hows, los.tolist(), his.tolist())]
    p["tie"] = (p["ratio"] - 1.0).abs() <= R.TIE_BAND
    if a_backend or b_backend:
        p["backend"] = f"{a_backend or '*'} -> {b_backend or '*'}"
    grp = [c for c in ("op", "dtype", "backend") if c in p]
    rows = []
    for k, g in p.groupby(grp, sort=False, dropna=False):
        k = k if isinstance(k, tuple) else (k,)
        r = dict(zip(grp, k))
        gm, lo, hi = geomean_interval(g)
        r.update({"pairs": len(g), "geomean": gm, "geomean_lo": lo, "geomean_hi": hi,
                  "verdict": S.verdict(lo, hi) if g["verdict"].notna().all() else pd.NA,
                  "min": g["ratio"].min(), "max": g["ratio"].max(),
                  **{f"{lab} ({names[1]} faster)" if lab == "FASTER" else
                     f"{lab} ({names[1]} slower)" if lab == "SLOWER" else lab: int((g["verdict"] == lab).sum())
                     for lab in S.LABELS}})
        rows.append(r)
    return ABResult(p, only_a, only_b, pd.DataFrame(rows), tuple(names), tuple(key), env_table(a, b, names),
                    env_warnings(a, b, names))


def _groups(g) -> list[np.ndarray]:
    """The row positions of each group of a ``groupby`` (in group-number order, rows in order)."""
    ids = g.ngroup().to_numpy()
    order = np.argsort(ids, kind="stable")
    return np.split(order, np.cumsum(np.bincount(ids, minlength=g.ngroups))[:-1])


@dataclass(frozen=True)
class Sides:
    """The two sides of an A/B, read once, and their A/B (:func:`sides`): ``kind`` ``"rows"``
    (result rows: ``a`` / ``b`` the two frames, ``ab`` an :class:`ABResult`) or ``"vllm"``
    (``vllm bench serve --save-result`` arms: ``a`` / ``b`` their runs,
    :func:`flyexplore.results.vllm.load_runs`; ``ab`` the per-metric table,
    :func:`flyexplore.results.vllm.ab_table`); ``names`` the two display names."""

    kind: str
    a: pd.DataFrame
    b: pd.DataFrame
    ab: object
    names: tuple[str, str]


def sides(a, b, names: tuple[str, str] = ("A", "B"), a_backend: str | None = None,
          b_backend: str | None = None) -> Sides:
    """Read the two sides of an A/B and pair them, once, whatever they are: both
    ``vllm bench serve`` result files or folders (paths; :func:`flyexplore.results.vllm.looks_like_vllm`),
    or result rows -- DataFrames or result file paths (read by :func:`flyexplore.results.table.load`
    with ``validated=True``: the checks of saving), paired by :func:`pair` (``a_backend`` /
    ``b_backend`` as there). What ``flyexplore compare``, ``fx.compare`` and the A/B report share.
    Raises :class:`UsageError` for a vllm side against a result side, backends given for a vllm
    A/B, a missing, damaged, foreign or invalid result file (one line naming it), or when nothing
    pairs."""
    is_vllm = [isinstance(x, (str, os.PathLike)) and V.looks_like_vllm(x) for x in (a, b)]
    if any(is_vllm):
        if not all(is_vllm):
            other = b if is_vllm[0] else a
            if isinstance(other, (str, os.PathLike)) and str(other).endswith(".json"):
                V.load_runs(other)   # a damaged vllm file: its own one-line error, naming it
            raise UsageError(f"cannot compare a vllm bench result with a flyexplore result ({a!r}, {b!r})")
        if a_backend is not None or b_backend is not None:
            raise UsageError("a_backend / b_backend compare flyexplore result rows, not vllm bench results")
        ra, rb = V.load_runs(a), V.load_runs(b)
        return Sides("vllm", ra, rb, V.ab_table(ra, rb, names=names), names)
    da, db = (R.normalize(x) if isinstance(x, pd.DataFrame) else R.load(x, validated=True) for x in (a, b))
    return Sides("rows", da, db, pair(da, db, names, a_backend, b_backend), names)
