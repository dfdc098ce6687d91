"""A/B comparison of two result sets paired by case: two torch builds, two AOTriton versions,
FlyDSL on vs off, this machine vs the published MI355X figures.

``ratio = time_A / time_B`` per paired key: > 1 means B is faster (the speedup of B over A).
Each ratio gets a 95% interval from the stored samples and a label (FASTER: B faster,
SAME, SLOWER, AMBIGUOUS; :mod:`flyexplore.measure.stats`): paired when both sides are rows of one
interleaved run, otherwise the unpaired interval. Cases present in one side only are listed,
never dropped silently; when the two environments differ (device, versions, clocks) the
result says so in ``warnings`` instead of mixing them silently.

What CI reads of an A/B: :func:`summary_lines` (the terminal summary), :func:`summary_dict`
(JSON-ready) and :func:`summary_markdown` (a GitHub Actions job summary), each with the gate's
outcome when given one. The gate itself (``--fail-on``: its rules, their results,
:func:`flyexplore.results.gate.gate`) is :mod:`flyexplore.results.gate`, which
:meth:`ABResult.gate` calls; the per-pair text both print (a case's key, an interval with its
label, JSON-ready records) is :mod:`flyexplore.results.pairtext`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.results import vllm as V
from flyexplore.results.gate import FailOn, GateResult, gate
from flyexplore.results.history import compare_allowance, store_for_compare
from flyexplore.results.pairtext import (TOP, _case_lines, _fmt, _geomean_label, _missing, _pair_records, _pct,
                                         _wrap, case_text, jsonable)

#: Two sides' clocks differ when their median case-start SM clocks differ by more than this.
CLOCK_DIFFERS = 0.05

#: Environment columns shown side by side (and flagged when they differ).
ENV_COLUMNS = ("env", "env_python", "env_changes", "platform", "device", "arch", "torch", "torch_git", "triton",
               "flydsl", "aotriton", "gpu_runtime", "blas_library", "tunableop", "python", "host", "env_id",
               "flyexplore", "flyexplore_commit")


@dataclass
class ABResult:
    """The outcome of :func:`pair`.

    ``pairs``: one row per key in both sides, columns ``*key, time_a_ms, time_b_ms, ratio``
    (time_a / time_b; > 1: B faster), ``ratio_lo``, ``ratio_hi`` (95% interval), ``verdict``
    (FASTER = B faster, SAME, SLOWER, AMBIGUOUS; NA for published figures), ``interval``
    (paired, unpaired, notch, none, between-process, between-pair), ``tie`` (point estimate
    within +-1%), ``source_a``, ``source_b``, ``worker_pairs`` and ``pair_sd`` (a
    ``between-pair`` interval's number of pairs of workers and the standard deviation of one
    pair's log ratio; NA / NaN for other intervals). ``only_a`` / ``only_b``: key rows present
    in one side only. ``summary``: per
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
    #: an environment A/B's sides in words (:func:`ab_setting`): what the two sides ran in and how
    #: they were paired; empty for two result files
    setting: tuple[str, ...] = ()
    #: either side has a row marked made-up (``synthetic_example``: the example files under
    #: data/examples/); every summary then says so first (:func:`is_synthetic`)
    synthetic: bool = False

    @property
    def geomean(self) -> float:
        """Geometric mean of all paired ratios."""
        return R.geomean(self.pairs["ratio"])

    @property
    def geomean_ci(self) -> tuple[float, float, float]:
        """``(geomean, lo, hi)`` of all paired ratios (:func:`geomean_interval`)."""
        return geomean_interval(self.pairs)


    def gate(self, fail_on: "str | FailOn | Sequence[str | FailOn]" = "SLOWER") -> "GateResult":
        """The CI gate of this A/B (:func:`flyexplore.results.gate.gate`), with ``flyexplore
        compare --fail-on``'s rule text: ``ab.gate("SLOWER:5%").failed`` is True when a pair, or
        the geometric mean, has B slower by more than 5% at its interval's most favourable end;
        ``ab.gate("SLOWER:5%,AMBIGUOUS:5%")`` also fails on an AMBIGUOUS interval wider than 5%
        (``hi / lo - 1``), and its lines say how many pairs of workers would decide it;
        ``AMBIGUOUS:5%:warn`` only warns (``.warned``). Raises :class:`UsageError` for a bad
        ``fail_on``."""
        return gate(self, fail_on)

    def __repr__(self) -> str:
        """The terminal summary (:meth:`summary_lines`), as ``flyexplore compare`` prints it; the
        tables are :attr:`pairs`, :attr:`summary`, :attr:`env`."""
        return "\n".join(self.summary_lines())

    def summary_lines(self, fail_on: "str | FailOn | Sequence[str | FailOn] | None" = None) -> list[str]:
        """The terminal summary of this A/B, as ``flyexplore compare`` prints it
        (:func:`summary_lines`), with the gate's lines when ``fail_on`` is given. Raises
        :class:`UsageError` for a bad ``fail_on``."""
        return summary_lines(self, None if fail_on is None else gate(self, fail_on))


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


def _basis(hows: np.ndarray, allow: np.ndarray, platform: str, given=None) -> list:
    """Why each pair's interval holds the cross-run allowance it does (text; NA where none);
    ``given``: the :class:`flyexplore.results.history.Allowance` applied in place of the constant."""
    default = max((R.RUN_TO_RUN.get(p, R.RUN_TO_RUN["cpu"]) for p in platform.split(",")), default=math.nan)
    if given is not None:
        default = given.value
    out = []
    for h, a in zip(hows.tolist(), allow.tolist()):
        if h == "between-process" and math.isfinite(a):
            out.append("the runs' own between-process variation (sweep --processes)")
        elif h == "unpaired+run" and math.isfinite(a) and given is not None and abs(a - default) < 1e-12:
            out.append(f"{given.basis}, on each side")
        elif h == "unpaired+run" and math.isfinite(a):
            out.append(f"the {platform} default on each side (flyexplore.results.table.RUN_TO_RUN, calibrated on "
                       f"{R.RUN_TO_RUN_SOURCE}); sweep --processes measures the runs' own"
                       if abs(a - default) < 1e-12 else "how far a side drifted within its own run")
        else:
            out.append(pd.NA)
    return out


def env_warnings(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B")) -> tuple[str, ...]:
    """Sentences naming how the measured rows of two result sets differ in environment:
    device, arch, versions (torch, Triton, flydsl, AOTriton, GPU runtime), the BLAS library and
    TunableOp's state (what decides ATen's GEMM kernel on ROCm), an environment A/B's interpreter
    and variables (``env_python``, ``env_changes``: what its two sides differ by) and the SM clock
    (median case-start clock differing by more than :data:`CLOCK_DIFFERS`). Published rows
    are left out (they are another device by design)."""
    ma, mb = (d[d["source"] != "published"] if "source" in d else d for d in (a, b))
    out = []
    for c in ("device", "arch", "torch", "triton", "flydsl", "aotriton", "gpu_runtime", "blas_library", "tunableop",
              "env_python", "env_changes"):
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
         key: Sequence[str] = ("op", "case", "dtype", "backend"), allowance=None) -> ABResult:
    """Pair result sets ``a`` and ``b`` by ``key`` (default op, case, dtype, backend) and
    compute ``time_a / time_b`` per pair (median time when a key has several rows; only
    ``ok``/``published`` rows with a time count).

    ``a_backend``/``b_backend`` compare one backend of A with another of B (e.g. ``aten`` vs
    ``flydsl`` in one sweep, passed as both ``a`` and ``b``): rows are filtered to that backend
    and ``backend`` leaves the key; with one of them given, the other side takes the same
    backend. The intervals are the speedup rules' own, for all pairs at
    once (:func:`flyexplore.results.table.ratio_intervals`; each row's samples parsed once), so
    two 10,000-row files pair in about a second. Each pair also gets ``same_within``
    (fraction): ``max(1 - ratio_lo, ratio_hi - 1)``, the narrowest SAME band its interval fits
    (an AMBIGUOUS A-vs-A pair still bounds the change by it); a pair whose interval came from an
    environment A/B's pairs of workers (``between-pair``) gets ``worker_pairs`` (how many) and
    ``pair_sd`` (the spread between them, in log space: what the gate's pairs-needed figure
    reads; :func:`_pair_spreads`). ``allowance``: a
    :class:`flyexplore.results.history.Allowance` (learned from a history store, or its constant
    fallback with the reason) for the cross-run pairs in place of the per-platform constant, its
    ``basis`` said beside them; None: the constant. Raises :class:`UsageError` when a given
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
    pos_a = [ka[rows_a[g]] for g in p.pop("_order_a").astype(int)]
    pos_b = [kb[rows_b[g]] for g in p.pop("_order_b").astype(int)]
    ests, los, his, hows, allow = R.ratio_intervals(
        a, pos_a, b, pos_b, (p["time_a_ms"] / p["time_b_ms"]).to_numpy(dtype=float), with_allowance=True,
        run_to_run=None if allowance is None else allowance.value)
    p["ratio"] = ests
    p["ratio_lo"], p["ratio_hi"], p["interval"] = los, his, hows
    p["worker_pairs"], p["pair_sd"] = _pair_spreads(a, pos_a, b, pos_b, hows, los, his)
    p["allowance"] = allow
    p["allowance_basis"] = _basis(hows, allow, _platform(a, b), allowance)
    p["verdict"] = [pd.NA if h == "none" else S.verdict(lo, hi) for h, lo, hi in zip(hows, los.tolist(), his.tolist())]
    with np.errstate(invalid="ignore"):
        p["same_within"] = np.maximum(1.0 - np.asarray(los, dtype=float), np.asarray(his, dtype=float) - 1.0)
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
    setting = ab_setting(a, b, names)
    warn = env_warnings(a, b, names)
    if setting:   # an A/B's interpreters and variables are what it compares, said in its setting
        warn = tuple(w for w in warn if not w.startswith(("env_python differs", "env_changes differs")))
    synth = _marked_synthetic(a, b)
    return ABResult(p, only_a, only_b, pd.DataFrame(rows), tuple(names), tuple(key), env_table(a, b, names),
                    warn, setting, synth)


def ab_setting(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B")) -> tuple[str, ...]:
    """What an environment A/B's two sides ran in (rows of one environment each, as
    :func:`env_sides` gives them), in one sentence: each side's environment, interpreter and
    variable changes, and that the sides were paired round by round in one run (with the number
    of pairs of workers). Empty unless each side is one environment of the same run."""
    envs = [sorted({str(e) for e in d["env"].dropna()}) if "env" in d else [] for d in (a, b)]
    runs = [set(d["run_id"].dropna().astype(str)) if "run_id" in d else set() for d in (a, b)]
    if not all(len(e) == 1 for e in envs) or not (runs[0] & runs[1]):
        return ()
    parts = []
    for nm, e, d in zip(names, envs, (a, b)):
        py = next((str(v) for v in d["env_python"].dropna()), "?") if "env_python" in d else "?"
        ch = next((str(v) for v in d["env_changes"].dropna()), "{}") if "env_changes" in d else "{}"
        try:
            changes = ", ".join(f"-{k}" if v is None else f"{k}={v}" for k, v in json.loads(ch).items()) or "none"
        except (ValueError, AttributeError):
            changes = ch
        parts.append(f"{nm} = env {e[0]} ({py}; variables set: {changes})")
    k = pd.to_numeric(pd.concat([a.get("processes", pd.Series(dtype=float)),
                                 b.get("processes", pd.Series(dtype=float))]), errors="coerce").max()
    pairs = f"{int(k)} pairs of workers" if pd.notna(k) and k > 1 else "one pair of workers"
    return (f"environment A/B, its arms timed round by round in one run ({pairs}): " + "; ".join(parts),)


def _pair_spreads(a: pd.DataFrame, pos_a: Sequence[np.ndarray], b: pd.DataFrame, pos_b: Sequence[np.ndarray],
                  hows: np.ndarray, los: np.ndarray, his: np.ndarray) -> tuple[pd.Series, np.ndarray]:
    """Per pair of :func:`pair`: the number of pairs of workers its ``between-pair`` interval came
    from (an environment A/B's ``--pairs``; NA for every other interval) and the standard
    deviation, in natural-log space, of one pair's ratio (NaN where unknown): from the B row's
    per-pair speedups (``process_estimates``) when they are taken against A's arm, else from the
    per-pair time ratios of the two rows' ``process_estimates``
    (:func:`flyexplore.measure.stats.pair_spread`, each pair's own error as the floor, as the
    interval's), else from the interval and its count
    (:func:`flyexplore.measure.stats.interval_spread`). What the gate's pairs-needed figure reads
    (:func:`flyexplore.measure.stats.pairs_to_decide`)."""
    n = len(hows)
    count = pd.Series([pd.NA] * n, dtype="Int64")
    sd = np.full(n, np.nan)
    idx = [k for k in range(n) if hows[k] == "between-pair" and len(pos_a[k]) == 1 and len(pos_b[k]) == 1]
    if not idx:
        return count, sd

    def col(d, c):
        return d[c].to_numpy(dtype=object) if c in d else np.full(len(d), None, dtype=object)

    est_a, est_b = col(a, "process_estimates"), col(b, "process_estimates")
    be_a, env_a, base_b, procs = col(a, "backend"), col(a, "env"), col(b, "baseline"), col(b, "processes")
    for k in idx:
        i, j = int(pos_a[k][0]), int(pos_b[k][0])
        pa, pb = R.process_estimates(est_a[i]), R.process_estimates(est_b[j])
        own = _missing(env_a[i]) or R.split_arm(be_a[i])[1] is not None   # already an arm's name
        arm = be_a[i] if own else R.arm_name(str(be_a[i]), str(env_a[i]))
        sps = [_float(e.get("speedup")) for e in pb]
        against_a = not _missing(base_b[j]) and str(base_b[j]) == str(arm)   # B's speedups are over A's arm
        if len(pb) >= 2 and against_a and all(math.isfinite(v) for v in sps):
            m, v = len(pb), S.pair_spread(sps, [_float(e.get("speedup_se")) for e in pb])
        elif len(pa) >= 2 and len(pa) == len(pb):
            ta, tb = (np.asarray([_float(e.get("time_ms")) for e in q]) for q in (pa, pb))
            sa, sb = (np.asarray([_float(e.get("time_se")) for e in q]) for q in (pa, pb))
            with np.errstate(divide="ignore", invalid="ignore"):
                m, v = len(pa), S.pair_spread(ta / tb, np.hypot(sa, sb))
        else:
            m = int(_float(procs[j])) if math.isfinite(_float(procs[j])) else 0
            v = S.interval_spread(los[k], his[k], m)
        if math.isfinite(v):
            count.iloc[k], sd[k] = m, v
    return count, sd


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


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


def env_sides(df: pd.DataFrame, a_env: str | None = None, b_env: str | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame, tuple[str, str]]:
    """The two sides of an environment A/B file (``flyexplore sweep --env``): the rows of
    environment ``a_env`` (default: the A/B's base environment, whose arm the speedups are
    taken against) and of ``b_env`` (default: the one other environment), each with its arms'
    backend names (``flash@B`` -> ``flash``) so that :func:`pair` pairs the same backend; and
    the two environment names. The pairs' intervals are then the A/B's own, paired round by
    round in the same run (:func:`flyexplore.results.table.ratio_intervals`: ``paired`` or, with
    several pairs of workers, ``between-pair``), with no cross-run allowance. Raises
    :class:`UsageError` for rows of fewer than two environments, an environment not in the rows,
    or no ``b_env`` where there are several others (naming them)."""
    envs = R.ab_envs(df)
    if len(envs) < 2:
        raise UsageError("the rows are not an environment A/B (sweep --env): give two result files to compare"
                         if not envs else f"the A/B rows hold one environment ({envs[0]}): give two result files")
    for what, e in (("--a-env", a_env), ("--b-env", b_env)):
        if e is not None and e not in envs:
            raise UsageError(f"{what} {e!r} is not an environment of the rows (environments: {', '.join(envs)})")
    if a_env is None:
        a_env = R.split_arm(R.default_baseline(df))[1] or envs[0]
    if b_env is None:
        others = [e for e in envs if e != a_env]
        if len(others) > 1:
            raise UsageError(f"the A/B has {len(envs)} environments: name the one to compare with {a_env} by "
                             f"--b-env ({', '.join(others)})")
        b_env = others[0]
    if a_env == b_env:
        raise UsageError(f"--a-env and --b-env are both {a_env!r}")
    out = []
    for e in (a_env, b_env):
        d = df[df["env"] == e].copy()
        d["backend"] = [R.split_arm(b)[0] for b in d["backend"].astype(object)]
        out.append(R.normalize(d))
    return out[0], out[1], (a_env, b_env)


def sides(a, b=None, names: tuple[str, str] | None = None, a_backend: str | None = None,
          b_backend: str | None = None, a_env: str | None = None, b_env: str | None = None,
          history=None) -> Sides:
    """Read the two sides of an A/B and pair them, once, whatever they are: both
    ``vllm bench serve`` result files or folders (paths; :func:`flyexplore.results.vllm.looks_like_vllm`),
    or result rows -- DataFrames or result file paths (files read by
    :func:`flyexplore.results.table.load` with ``validated=True``, DataFrames checked alike by
    :func:`flyexplore.results.table.checked`: :func:`flyexplore.results.table.validate`), paired
    by :func:`pair` (``a_backend`` / ``b_backend`` as there). What ``flyexplore compare``, ``fx.compare`` and the A/B report share.
    ``b`` None: ``a`` is one environment A/B's rows (``flyexplore sweep --env``), whose two
    environments are the sides (:func:`env_sides`; ``a_env`` / ``b_env`` pick them, ``names``
    default to their names). Otherwise ``names`` default to ``("A", "B")``.
    Raises :class:`UsageError` for a vllm side against a result side, backends given for a vllm
    A/B, a missing, damaged, foreign or invalid result file or DataFrame (one line naming it and
    the column, row and value), rows that are no environment A/B where ``b`` is None, or when
    nothing pairs.

    ``history``: where the cross-run allowance of two result sets of one device is learned from
    (:func:`flyexplore.results.history.store_for_compare`: None, the default store when there is
    one; ``"off"``, the constant; a folder, that store, which must exist): with a store, the
    allowance is :func:`flyexplore.results.history.compare_allowance`'s, learned from identical
    runs of that device or, with too few, the constant with the reason, said beside the pairs."""
    store = store_for_compare(history)   # a bad --history before any file is read, whatever the sides
    if b is None:
        d = R.checked(a, "the DataFrame of the environment A/B") if isinstance(a, pd.DataFrame) \
            else R.load(a, validated=True)
        da, db, envs = env_sides(d, a_env, b_env)
        names = tuple(names) if names is not None else envs
        return Sides("rows", da, db, pair(da, db, names, a_backend, b_backend), names)
    if a_env is not None or b_env is not None:
        raise UsageError("--a-env / --b-env pick the sides of one environment A/B file; give one file")
    names = tuple(names) if names is not None else ("A", "B")
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
    da, db = (R.checked(x, f"the DataFrame of side {n}") if isinstance(x, pd.DataFrame) else R.load(x, validated=True)
              for x, n in zip((a, b), names))
    allowance = None
    if store is not None:
        try:
            allowance = compare_allowance(da, db, store)
        except UsageError:
            if history not in (None, True):   # the store named is damaged: said, as any bad input
                raise
            # the default store, not named: a damaged one leaves the constant, not a failed compare
    return Sides("rows", da, db, pair(da, db, names, a_backend, b_backend, allowance=allowance), names)


# -- the summaries -----------------------------------------------------------------------------

def label_name(label: Any, names: tuple[str, str] = ("A", "B")) -> str:
    """A label as the summaries show it, saying which side is faster: ``"FASTER (B faster)"``,
    ``"SLOWER (B slower)"``, ``"SAME"``, ``"AMBIGUOUS"``; ``"no label"`` for a missing one
    (published figures, no interval)."""
    if label is None or (not isinstance(label, str) and pd.isna(label)):
        return "no label"
    return {"FASTER": f"FASTER ({names[1]} faster)", "SLOWER": f"SLOWER ({names[1]} slower)"}.get(label, str(label))


def allowance_text(pairs: pd.DataFrame) -> str | None:
    """The cross-run allowance of the pairs (columns ``allowance``, a fraction, NaN where none,
    and ``allowance_basis``, why), as one text: ``"cross-run allowance ±0.8% (from the files'
    between-process variation)"``, a range (``±0.5% to 2%``) when pairs differ. None when the
    pairs have no ``allowance`` column or none has an allowance."""
    if "allowance" not in pairs:
        return None
    v = pd.to_numeric(pairs["allowance"], errors="coerce").astype(float)
    has = np.isfinite(v.to_numpy())
    if not has.any():
        return None
    lo, hi = float(v[has].min()), float(v[has].max())
    amount = f"±{_pct(lo)}" if math.isclose(lo, hi, rel_tol=1e-9, abs_tol=1e-12) else f"±{_pct(lo)} to {_pct(hi)}"
    basis = []
    if "allowance_basis" in pairs:
        basis = list(dict.fromkeys(str(b).strip() for b in pairs.loc[has, "allowance_basis"]
                                   if not _missing(b) and str(b).strip()))
    if not basis:
        return f"cross-run allowance {amount}"
    why = "; ".join(basis)
    return f"cross-run allowance {amount} ({why if why.lower().startswith('from ') else 'from ' + why})"


def same_within_text(pairs: pd.DataFrame) -> str | None:
    """What the AMBIGUOUS pairs still say, as one text: every such pair's 95% interval lies
    within ``±largest`` of 1 (column ``same_within``: ``max(1 - ratio_lo, ratio_hi - 1)``, the
    narrowest ``--band`` at which the pair would read SAME), with the median of them. An
    A-vs-A compare across runs on a GPU is AMBIGUOUS at the ±1% band whenever fresh processes
    spread by more than that (``benchmarks/evidence/process_spread.py``); this line is then the bound it
    does give. None when no AMBIGUOUS pair has a finite ``same_within``."""
    if "same_within" not in pairs or "verdict" not in pairs:
        return None
    amb = (pairs["verdict"] == "AMBIGUOUS").fillna(False).to_numpy(dtype=bool)
    v = pd.to_numeric(pairs["same_within"], errors="coerce").to_numpy(dtype=float)[amb]
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    return (f"AMBIGUOUS pairs: each 95% interval lies within ±{_pct(float(v.max()))} of 1 "
            f"(median ±{_pct(float(np.median(v)))}; the --band that would read it SAME)")


def largest_changes(ab: ABResult, n: int = TOP) -> pd.DataFrame:
    """The ``n`` pairs whose ratio is farthest from 1 in either direction (largest
    ``|log ratio|``; pairs without a positive finite ratio left out), largest first, with the
    columns of ``ab.pairs``."""
    r = pd.to_numeric(ab.pairs["ratio"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        size = np.abs(np.log(r))
    ok = np.flatnonzero(np.isfinite(size))
    order = ok[np.argsort(-size[ok], kind="stable")][:n]
    return ab.pairs.iloc[order]


def label_counts(ab: ABResult) -> dict[str, int]:
    """Pairs per label: ``{"FASTER": n, "SAME": n, "SLOWER": n, "AMBIGUOUS": n, "none": n}``
    (``none``: pairs without a label: published figures, no interval)."""
    v = ab.pairs["verdict"]
    out = {lab: int((v == lab).fillna(False).sum()) for lab in S.LABELS}
    out["none"] = int(len(v) - sum(out.values()))
    return out


def _parts(x: "ABResult | Sides"):
    """``(kind, ab, names)`` of an A/B given as an :class:`ABResult` or :class:`Sides`."""
    if isinstance(x, Sides):
        return x.kind, x.ab, tuple(x.names)
    if isinstance(x, ABResult):
        return "rows", x, tuple(x.names)
    raise TypeError(f"an A/B summary needs an ABResult or Sides, got {type(x).__name__}")


#: The line every summary of made-up inputs starts with (terminal, JSON, Markdown, report).
SYNTHETIC_LINE = "SYNTHETIC EXAMPLE: the inputs are marked made-up; no number here is a measurement"


def is_synthetic(x: "ABResult | Sides") -> bool:
    """True when either side of an A/B has a row marked made-up (a ``synthetic_example``
    value, :data:`flyexplore.results.vllm.SYNTHETIC_FIELD`: the example files under
    data/examples/): an :class:`ABResult`'s ``synthetic``; for :class:`Sides` (result rows or
    vllm runs) their rows are read."""
    if isinstance(x, ABResult):
        return x.synthetic
    return isinstance(x, Sides) and _marked_synthetic(x.a, x.b)


def _marked_synthetic(*frames) -> bool:
    """Whether any of ``frames`` (DataFrames; anything else is skipped) has a row with a
    ``synthetic_example`` value: what :func:`pair` and :func:`is_synthetic` read."""
    return any(isinstance(d, pd.DataFrame) and V.SYNTHETIC_FIELD in d and d[V.SYNTHETIC_FIELD].notna().any()
               for d in frames)


def _vllm_lines(tab: pd.DataFrame, names: tuple[str, str]) -> list[str]:
    keys = tab[["model", "concurrency", "request_rate"]].drop_duplicates() if len(tab) else tab
    out = [f"flyexplore compare (vllm serve): {names[1]} vs {names[0]}, {len(keys)} (model, concurrency, "
           f"request rate) pairs; speedup > 1: {names[1]} better (latency A/B, throughput B/A)"]
    for m, g in tab.groupby("metric", sort=False):
        sp = pd.to_numeric(g["speedup"], errors="coerce")
        sp = sp[np.isfinite(sp) & (sp > 0)]
        if len(sp):
            out.append(f"  {str(g['label'].iloc[0]) if 'label' in g else m}: geomean {R.geomean(sp):.3f}x "
                       f"(min {sp.min():.3f}x, max {sp.max():.3f}x)")
    oa, ob = tab.attrs.get("only_a", []), tab.attrs.get("only_b", [])
    out.append(f"only in {names[0]}: {len(oa)}, only in {names[1]}: {len(ob)}; no intervals (vllm bench "
               "results keep no per-request samples), so no labels and no gate")
    return [ln for s in out for ln in _wrap(s)]


def summary_lines(x: "ABResult | Sides", gate_result: GateResult | None = None, top: int = TOP,
                  notes: Sequence[str] = ()) -> list[str]:
    """The A/B in a few plain-text lines of at most :data:`flyexplore.results.pairtext.WIDTH`
    characters, what ``flyexplore compare`` prints: first, for made-up inputs (:func:`is_synthetic`),
    :data:`SYNTHETIC_LINE`; the number of pairs and of cases in one side only; the
    pairs per label (FASTER / SAME / SLOWER / AMBIGUOUS, saying which side is faster); the
    geometric mean of ``time A / time B`` with its 95% interval and label; the cross-run
    allowance when the pairs carry one (:func:`allowance_text`); the bound the AMBIGUOUS pairs
    still give (:func:`same_within_text`); the ``top`` largest changes
    (:func:`largest_changes`: case, ratio, interval, label); the ``notes`` (lines a caller
    adds: ``flyexplore compare`` the published AOTriton range's,
    :func:`flyexplore.results.aotriton_ab.summary_notes`); one line per environment warning;
    the gate's lines (``gate_result``, :func:`flyexplore.results.gate.gate`). ``x``: an
    :class:`ABResult` or the :class:`Sides` of :func:`sides`. A vllm A/B
    (:class:`Sides` of kind ``"vllm"``) gets a short summary of its per-metric speedups.
    Returns the lines (no newlines). Raises ``TypeError`` for anything but an
    :class:`ABResult` or :class:`Sides`."""
    kind, ab, names = _parts(x)
    synth = _wrap(SYNTHETIC_LINE) if is_synthetic(x) else []
    if kind != "rows":
        return synth + _vllm_lines(ab, names)
    na, nb = names
    c = label_counts(ab)
    out = synth + _wrap(f"flyexplore compare: {nb} vs {na}, {len(ab.pairs)} pairs ({len(ab.only_a)} only in {na}, "
                        f"{len(ab.only_b)} only in {nb})")
    out += _wrap(f"ratio = time {na} / time {nb} per pair (> 1: {nb} faster), with its 95% interval")
    for line in ab.setting:
        out += _wrap(line)
    counts = [f"{label_name(lab, names)} {c[lab]}" for lab in S.LABELS]
    if c["none"]:
        counts.append(f"no label {c['none']}")
    out += _wrap("labels: " + ", ".join(counts))
    gm = ab.geomean_ci
    out.append(f"geometric mean: {_fmt(*gm, _geomean_label(gm))}{' (95% interval)' if _geomean_label(gm) else ''}")
    al = allowance_text(ab.pairs)
    if al:
        out += _wrap(al)
    sw = same_within_text(ab.pairs)
    if sw:
        out += _wrap(sw)
    big = largest_changes(ab, top)
    if len(big):
        out.append(f"largest changes (by |log ratio|, {min(top, len(big))} of {len(ab.pairs)}):")
        out += _case_lines(big, ab.key)
    for note in notes:
        out += _wrap(note)
    for w in ab.warnings:
        out += _wrap(f"warning: {w}")
    if gate_result is not None:
        out += gate_result.lines
    return out


def summary_dict(x: "ABResult | Sides", gate_result: GateResult | None = None, top: int = TOP,
                 notes: Sequence[str] = ()) -> dict:
    """The A/B as a JSON-ready dict (NaN and NA as None; ``json.dumps(..., allow_nan=False)``
    takes it), what ``flyexplore compare --json`` writes.

    Both kinds have ``synthetic`` (:func:`is_synthetic`: the inputs are marked made-up).
    Result rows: ``kind`` ``"rows"``, ``names``, ``ratio`` (its definition), ``key`` (the
    pairing columns), ``pairs_count``, ``only_a`` / ``only_b`` (counts of cases in one side
    only), ``counts`` (pairs per label, :func:`label_counts`), ``geomean`` (``ratio``, ``lo``,
    ``hi``, ``label``), ``allowance`` (:func:`allowance_text` or None), ``largest`` (the
    ``top`` largest changes, as in ``pairs``), ``pairs`` (every pair: ``case_key``, the key
    values as one text; the key columns; ``time_a_ms``, ``time_b_ms`` in ms; ``ratio``,
    ``ratio_lo``, ``ratio_hi``; ``verdict``; ``interval``, the method; ``allowance`` /
    ``allowance_basis`` where the pairs have them; ``same_within``, the narrowest SAME band the
    pair's interval fits; ``worker_pairs``, ``pair_sd``: an environment A/B pair's number of
    pairs of workers and their spread, in log space), ``notes`` (as :func:`summary_lines` takes them), ``warnings`` and
    ``gate`` (:meth:`flyexplore.results.gate.GateResult.as_dict`, None without a gate).
    A vllm A/B: ``kind`` ``"vllm"``, ``names``, ``pairs`` (its per-metric rows), ``only_a`` /
    ``only_b`` (counts), ``warnings`` (empty), ``gate`` (None). Raises ``TypeError`` as
    :func:`summary_lines`."""
    kind, ab, names = _parts(x)
    synth = is_synthetic(x)
    if kind != "rows":
        return jsonable({"kind": "vllm", "synthetic": synth, "names": names, "pairs": ab.to_dict("records"),
                         "only_a": len(ab.attrs.get("only_a", [])), "only_b": len(ab.attrs.get("only_b", [])),
                         "warnings": [], "gate": None})
    gm = ab.geomean_ci
    d = {"kind": "rows", "synthetic": synth, "names": names, "ratio": f"time {names[0]} / time {names[1]} (> 1: {names[1]} faster)",
         "key": ab.key, "pairs_count": len(ab.pairs), "only_a": len(ab.only_a), "only_b": len(ab.only_b),
         "counts": label_counts(ab),
         "geomean": {"ratio": gm[0], "lo": gm[1], "hi": gm[2], "label": _geomean_label(gm)},
         "allowance": allowance_text(ab.pairs),
         "largest": _pair_records(largest_changes(ab, top), ab.key),
         "pairs": _pair_records(ab.pairs, ab.key),
         "notes": list(notes),
         "setting": list(ab.setting),
         "warnings": list(ab.warnings),
         "gate": gate_result.as_dict() if gate_result is not None else None}
    return jsonable(d)


def _md(text: Any) -> str:
    """Text for a Markdown table cell: pipes escaped, newlines as spaces."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _md_code(text: Any) -> str:
    return "`" + _md(text).replace("`", "'") + "`"


def _num(v: Any, fmt: str) -> str:
    return "" if _missing(v) or not math.isfinite(float(v)) else format(float(v), fmt)


def summary_markdown(x: "ABResult | Sides", gate_result: GateResult | None = None, top: int = TOP,
                     notes: Sequence[str] = ()) -> str:
    """The A/B as GitHub-flavoured Markdown for a GitHub Actions job summary
    (``$GITHUB_STEP_SUMMARY``), what ``flyexplore compare --summary-md`` appends: a heading
    (with the gate's outcome when there is a gate), :data:`SYNTHETIC_LINE` in bold for made-up
    inputs, the number of pairs, a table of pairs per
    label, the geometric mean with its interval and label, the cross-run allowance when the
    pairs carry one, a table of the ``top`` largest changes (case, times in ms, ratio, 95%
    interval, label), the ``notes`` (as :func:`summary_lines` takes them), the environment
    warnings and the gate's outcome with the cases that tripped it. A vllm A/B
    gets its summary lines as a list. Returns the text, ending in a newline. Raises
    ``TypeError`` as :func:`summary_lines`."""
    kind, ab, names = _parts(x)
    na, nb = names
    synth = [f"**{_md(SYNTHETIC_LINE)}**", ""] if is_synthetic(x) else []
    if kind != "rows":
        body = "\n".join(f"- {_md(ln.strip())}" for ln in _vllm_lines(ab, names))
        return f"## flyexplore compare (vllm serve): {_md(nb)} vs {_md(na)}\n\n" + "".join(t + "\n" for t in synth) \
            + f"{body}\n"
    head = f"## flyexplore compare: {_md(nb)} vs {_md(na)}"
    if gate_result is not None:
        head += f" (gate {gate_result.outcome})"
    out = [head, "", *synth,
           f"{len(ab.pairs)} pairs, ratio = time {_md(na)} / time {_md(nb)} (> 1: {_md(nb)} faster); "
           f"{len(ab.only_a)} only in {_md(na)}, {len(ab.only_b)} only in {_md(nb)}.", "",
           "| label | pairs |", "| --- | ---: |"]
    c = label_counts(ab)
    out += [f"| {_md(label_name(lab, names))} | {c[lab]} |" for lab in S.LABELS]
    if c["none"]:
        out.append(f"| no label | {c['none']} |")
    gm = ab.geomean_ci
    out += ["", f"**Geometric mean:** {_fmt(*gm, _geomean_label(gm))}{' (95% interval)' if _geomean_label(gm) else ''}"]
    al = allowance_text(ab.pairs)
    if al:
        out += ["", al[0].upper() + al[1:] + "."]
    sw = same_within_text(ab.pairs)
    if sw:
        out += ["", _md(sw) + "."]
    big = largest_changes(ab, top)
    if len(big):
        out += ["", f"### Largest changes ({len(big)} of {len(ab.pairs)}, by \\|log ratio\\|)", "",
                f"| case | {_md(na)} ms | {_md(nb)} ms | ratio | 95% interval | label |",
                "| --- | ---: | ---: | ---: | --- | --- |"]
        for _, r in big.iterrows():
            lo, hi = _num(r["ratio_lo"], ".3f"), _num(r["ratio_hi"], ".3f")
            out.append(f"| {_md_code(case_text(r, ab.key))} | {_num(r['time_a_ms'], '.4g')} | "
                       f"{_num(r['time_b_ms'], '.4g')} | {_num(r['ratio'], '.3f')}x | "
                       f"{f'[{lo}, {hi}]' if lo and hi else 'none'} | {_md(label_name(r['verdict'], names))} |")
    for note in notes:
        out += ["", _md(note)]
    if ab.warnings:
        out += ["", "### Environment warnings", ""] + [f"- {_md(w)}" for w in ab.warnings]
    if gate_result is not None:
        g = gate_result
        out += ["", f"### Gate `--fail-on {g.text}`: {g.outcome}", "",
                _md(g.reason[0].upper() + g.reason[1:]) + "."]
        for res in g.results:
            if not res.hit:
                continue
            items = [f"- {_md_code(case_text(r, ab.key))}: "
                     f"{_fmt(r['ratio'], r['ratio_lo'], r['ratio_hi'], r['verdict'])}"
                     for _, r in res.tripped.head(TOP).iterrows()]
            if len(res.tripped) > TOP:
                items.append(f"- ... and {len(res.tripped) - TOP} more (all in the JSON summary, --json)")
            if res.geomean_tripped:
                items.append(f"- geometric mean: {_fmt(*g.geomean, g.geomean_label)}")
            if len(g.results) > 1:
                out += ["", f"`{res.rule.text}` ({'warns' if res.rule.warn else 'fails'}):"]
            out += [""] + items
    return "\n".join(out) + "\n"
