"""Results over time, read from a history store (:mod:`flyexplore.results.history_store`):
each case's trend and the geometric mean's across runs, the steps in them
(:mod:`flyexplore.results.steps`), the build series of A/Bs of three or more environments, the
cross-run allowance learned from identical runs, the CI gate on the newest step, and the
exports for benchmark dashboards (Bencher's BMF, github-action-benchmark's JSON).
``flyexplore history`` and ``fx.history`` are the faces; the figure and report section are
:mod:`flyexplore.views.history`.

Series. A time series is one case (``op, case, dtype, backend``; an A/B's arm ``aten@B`` is a
backend of its own) on one device model (``device``, e.g. NVIDIA H100 80GB HBM3; lent GPUs of one
model are one series), its runs in time order (each run's first row's ``timestamp``). Only
``ok`` rows with a time count. Each point is the run's median time with its 95% interval
(``time_ci_lo_ms`` / ``time_ci_hi_ms``). The geometric mean of a device's runs is each run's
effect in a two-way fit of cases and runs (:func:`run_effects`: its time against the cases' own
levels, whichever cases it has; the median run 1.0), with its interval from the cases' intervals
(:func:`flyexplore.measure.stats.geomean_ci`'s rule, over the cases that have one).
A build series is one A/B run of three or more environments: each case's arms in the run's
environment order, points with their own intervals and no between-run part (the arms were timed
round by round in one run).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure.stats import log_se
from flyexplore.results import steps as ST
from flyexplore.results.arms import split_arm
from flyexplore.results.gate import parse_rules
from flyexplore.results.history_store import Store, device_keys
from flyexplore.results.pairtext import jsonable
from flyexplore.results.speedups import RUN_TO_RUN, RUN_TO_RUN_SOURCE

#: The series key of a time series (besides the device model).
SERIES_KEY = ("op", "case", "dtype", "backend")
#: The series name of the geometric mean in the steps table.
GEOMEAN = "geomean"
#: A learned allowance needs at least this many identical runs (10 pairs of runs: a few runs made
#: back to back move less than runs days apart) and this many pairs of rows.
MIN_ALLOWANCE_RUNS = 5
MIN_ALLOWANCE_PAIRS = 20
#: The allowance is this quantile of ``|t_p / t_q - 1|`` over pairs of identical runs, rounded up
#: to :data:`ALLOWANCE_STEP` -- the rule :data:`flyexplore.results.speedups.RUN_TO_RUN` was
#: calibrated by (``benchmarks/evidence/reproducible.py``: p95, rounded up).
ALLOWANCE_QUANTILE = 0.95
ALLOWANCE_STEP = 0.001
#: What makes two runs identical for the allowance: the same device, and these run fields equal.
IDENTICAL = ("run_env_id", "run_flyexplore_commit", "run_plan")
#: The allowance reads the newest this many runs of one build (their pairs: 1,225 per row).
ALLOWANCE_RUNS = 50


def _identity(points: pd.DataFrame) -> np.ndarray:
    """Each point's build identity (:data:`IDENTICAL` joined), as text."""
    out = None
    for c in IDENTICAL:
        v = points[c].astype("string").fillna("") if c in points else pd.Series("", index=points.index, dtype="string")
        out = v if out is None else out + "|" + v
    return out.to_numpy(dtype=object)


def _timed(points: pd.DataFrame) -> pd.DataFrame:
    t = pd.to_numeric(points["time_ms"], errors="coerce")
    return points[(points["status"] == "ok") & (t > 0)].copy()


def _group(points: pd.DataFrame) -> pd.Series:
    """Each point's device group: the device model and platform (``NVIDIA H100 80GB HBM3
    (cuda)``). The timing mode is not part of it: it is set per row, and one sweep's rows can mix
    modes (a model step's ``event`` beside the operators' ``event-gated``)."""
    dev = points["run_device"].fillna("unknown device").astype(str)
    plat = points["run_platform"].fillna("?").astype(str)
    return dev + " (" + plat + ")"


def run_effects(y: np.ndarray) -> tuple[np.ndarray, int]:
    """The run effects of a two-way additive fit ``y[s, r] = case_s + run_r`` (log times of
    series ``s`` in run ``r``, NaN where a series has no point), by least squares
    (:func:`scipy.sparse.linalg.lsqr`), each run effect centred on the median of its connected
    set of runs (runs linked through shared cases; :func:`scipy.sparse.csgraph.connected_components`).
    Each run's effect is its time against the cases' own levels, whichever cases it has: a case
    that joins later, after a step, is compared through the runs it shares with the others, not
    with its own median over the runs it has (which read the step as a second, opposite one).
    Runs that share no case with the others cannot be compared with them: they form sets of
    their own, each centred on its own median. Returns ``(effects, sets)``: one float per run
    (NaN for a run without a point) and the number of connected sets of runs."""
    from scipy import sparse
    from scipy.sparse.csgraph import connected_components
    from scipy.sparse.linalg import lsqr

    S, N = y.shape
    s_idx, r_idx = np.nonzero(np.isfinite(y))
    out = np.full(N, np.nan)
    if not s_idx.size:
        return out, 0
    k = s_idx.size
    rows = np.r_[np.arange(k), np.arange(k)]
    A = sparse.csr_matrix((np.ones(2 * k), (rows, np.r_[s_idx, S + r_idx])), shape=(k, S + N))
    sol = lsqr(A, y[s_idx, r_idx], atol=1e-12, btol=1e-12, iter_lim=20 * (S + N))[0]
    run = sol[S:]
    link = sparse.csr_matrix((np.ones(k), (s_idx, S + r_idx)), shape=(S + N, S + N))
    n_sets, label = connected_components(link, directed=False)
    have = np.zeros(N, dtype=bool)
    have[r_idx] = True
    sets = 0
    for c in np.unique(label[S:][have]):
        m = have & (label[S:] == c)
        out[m] = run[m] - np.median(run[m])
        sets += 1
    return out, sets


@dataclass
class Analysis:
    """What ``flyexplore history show`` reads from a store; every table long, one row per point:

    - ``runs``: ``group`` (device model and platform), ``position`` (0 = oldest run of the group),
      ``run_id``, ``timestamp``, ``commit`` (``flyexplore_commit``), ``torch``, ``env_id``, ``cases``;
    - ``trends``: ``group``, ``series`` (``op case dtype backend``), the key columns, ``position``,
      ``run_id``, ``time_ms`` with ``lo_ms`` / ``hi_ms`` (95%), ``level_ms`` (the fitted level);
    - ``geomean``: ``group``, ``position``, ``run_id``, ``geomean`` (the run's effect in a two-way
      fit of cases and runs, :func:`run_effects`: its time against the cases' own levels, the
      median run 1.0; > 1 slower) with ``lo`` / ``hi``, ``cases``, ``level``;
    - ``steps``: ``group``, ``series`` (or ``geomean``), ``position`` and ``run_id`` (the first run
      of the new level), ``prev_run_id``, ``timestamp``, ``commit``, ``change`` (relative change of
      time, > 0 slower) with ``lo`` / ``hi`` (95%), ``direction`` (slower / faster), ``before``
      / ``after`` (the levels) in ``unit`` (``ms`` for a case; ``x median run`` for the geomean:
      :func:`run_effects`), ``newest`` (the series' newest step), ``run`` (``position + 1``),
      ``runs`` (the device group's runs), ``points`` (the series' points);
    - ``builds``: build-series steps: ``run_id``, ``series``, ``from_env``, ``to_env``, ``change``,
      ``lo``, ``hi``, ``direction``, ``interval`` (``paired``: the A/B's own speedups; ``time``);
    - ``build_points``: the build series' points: ``run_id``, ``series``, ``env``, ``position``,
      ``time_ms``, ``lo_ms``, ``hi_ms`` (with ``paired``, the base time over the speedup's
      interval), ``interval`` (``reference``, ``paired`` or ``time``);
    - ``allowances``: per device: ``group``, ``device_id`` (the device key), ``value`` (fraction), ``runs``,
      ``pairs``, ``basis``."""

    runs: pd.DataFrame
    trends: pd.DataFrame
    geomean: pd.DataFrame
    steps: pd.DataFrame
    builds: pd.DataFrame
    build_points: pd.DataFrame
    allowances: pd.DataFrame
    store: str = ""
    notes: list[str] = field(default_factory=list)


STEP_COLUMNS = ("group", "series", "op", "case", "dtype", "backend", "position", "run_id", "prev_run_id", "timestamp",
                "commit", "change", "lo", "hi", "direction", "before", "after", "unit", "newest", "runs", "points",
                "run")


def analyse(points: pd.DataFrame, store: str = "") -> Analysis:
    """Trends, steps, build series and allowances of a store's points
    (:meth:`flyexplore.results.history_store.Store.points`; module docstring). Raises
    :class:`UsageError` when no point has a time."""
    pts = _timed(points)
    if pts.empty:
        raise UsageError(f"history {store or ''}: no ok row with a time in the store".replace("  ", " "))
    pts["group"] = _group(pts)
    pts["series"] = pts["op"].astype(str) + " " + pts["case"].astype(str) + " " + pts["dtype"].astype(str) + " " + \
        pts["backend"].astype(str)
    runs, trends, gms, steps, allows, notes = [], [], [], [], [], []
    for g, d in pts.groupby("group", sort=True):
        r, t, gm, st, sets, levels = _time_series(g, d)
        runs.append(r), trends.append(t), gms.append(gm), steps.append(st)
        allows.append(_allowances_of(g, d, levels))
        if sets > 1:
            notes.append(f"note: {g}: its runs form {sets} sets that share no case with each other; the geometric "
                         "mean is centred within each set, so a change between sets cannot be read")
    bsteps, bpoints = _build_series(pts)
    return Analysis(pd.concat(runs, ignore_index=True), pd.concat(trends, ignore_index=True),
                    pd.concat(gms, ignore_index=True), pd.concat(steps, ignore_index=True)
                    if any(len(s) for s in steps) else pd.DataFrame(columns=list(STEP_COLUMNS)),
                    bsteps, bpoints, pd.concat(allows, ignore_index=True), store, notes)


def _time_series(group: str, d: pd.DataFrame):
    order = d[["run_id", "timestamp"]].drop_duplicates("run_id").sort_values(["timestamp", "run_id"], kind="stable")
    run_ids = order["run_id"].tolist()
    pos_of = {r: i for i, r in enumerate(run_ids)}
    first = d.drop_duplicates("run_id").set_index("run_id")
    runs = pd.DataFrame({"group": group, "position": range(len(run_ids)), "run_id": run_ids,
                         "timestamp": order["timestamp"].tolist(),
                         "commit": first.loc[run_ids, "run_flyexplore_commit"].tolist(),
                         "torch": first.loc[run_ids, "run_torch"].tolist(),
                         "env_id": first.loc[run_ids, "run_env_id"].tolist(),
                         "cases": d.groupby("run_id").size().reindex(run_ids).tolist()})
    codes, names = pd.factorize(d["series"], sort=True)
    pos = d["run_id"].map(pos_of).to_numpy(dtype=np.int64)
    S, N = len(names), len(run_ids)
    t = pd.to_numeric(d["time_ms"], errors="coerce").to_numpy(dtype=float)
    lo = pd.to_numeric(d["time_ci_lo_ms"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    hi = pd.to_numeric(d["time_ci_hi_ms"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    Y = np.full((S, N), np.nan)
    SG = np.full((S, N), np.nan)
    Y[codes, pos] = np.log(t)
    SG[codes, pos] = log_se(lo, hi)
    fits = ST.fit(Y, SG)
    level = np.full((S, N), np.nan)
    label = np.zeros((S, N), dtype=np.int64)
    for s, f in enumerate(fits):
        bounds = [*f.starts[1:], N]
        a = 0
        for i, (lv, b) in enumerate(zip(f.levels, bounds)):
            level[s, a:b] = lv
            label[s, a:b] = i
            a = b
    levels = pd.DataFrame({"series": np.asarray(names)[codes], "run_id": d["run_id"].to_numpy(),
                           "level": label[codes, pos]})
    trends = d[["group", "series", *SERIES_KEY, "run_id", "time_ms"]].copy()
    trends.insert(4 + len(SERIES_KEY) - 3, "position", pos)
    trends["lo_ms"], trends["hi_ms"] = lo, hi
    trends["level_ms"] = np.exp(level[codes, pos])
    trends = trends.sort_values(["series", "position"], kind="stable").reset_index(drop=True)
    # the geometric mean: each run's effect in a two-way fit of cases and runs (run_effects); its
    # interval from the cases' intervals as geomean_ci's rule (the cases with one; none: NaN)
    have = np.isfinite(Y)
    m = have.sum(axis=0)
    gy, sets = run_effects(Y)
    with np.errstate(invalid="ignore", divide="ignore"):
        hs = have & np.isfinite(SG)
        ms = hs.sum(axis=0)
        gs = np.where(ms > 0, np.sqrt(np.where(hs, SG ** 2, 0.0).sum(axis=0)) / np.maximum(ms, 1), np.nan)
    gfit = ST.fit(gy, gs)
    glevel = np.full(N, np.nan)
    bounds = [*gfit.starts[1:], N]
    a = 0
    for lv, b in zip(gfit.levels, bounds):
        glevel[a:b] = lv
        a = b
    gm = pd.DataFrame({"group": group, "position": range(N), "run_id": run_ids, "geomean": np.exp(gy),
                       "lo": np.exp(gy - ST.Z95 * gs), "hi": np.exp(gy + ST.Z95 * gs), "cases": m,
                       "level": np.exp(glevel)})
    # the steps
    key_of = d.drop_duplicates("series").set_index("series")
    rows = []
    for s, f in enumerate([*fits, gfit]):
        steps = ST.steps_of(f)
        for i, stp in enumerate(steps):
            name = GEOMEAN if s == S else names[s]
            k = key_of.loc[name] if s < S else None
            prev = max(p for p in range(stp.at) if (s == S or np.isfinite(Y[s, p]))) if stp.at > 0 else None
            rows.append({"group": group, "series": name,
                         **{c: (k[c] if k is not None else GEOMEAN if c == "op" else "") for c in SERIES_KEY},
                         "position": stp.at, "run_id": run_ids[stp.at],
                         "prev_run_id": run_ids[prev] if prev is not None else None,
                         "timestamp": runs.at[stp.at, "timestamp"], "commit": runs.at[stp.at, "commit"],
                         "change": stp.change, "lo": stp.lo, "hi": stp.hi,
                         "direction": "slower" if stp.change > 0 else "faster",
                         "before": math.exp(stp.before), "after": math.exp(stp.after),
                         "unit": "x median run" if s == S else "ms", "run": stp.at + 1,
                         "newest": i == len(steps) - 1, "runs": N,
                         "points": int(np.isfinite(Y[s]).sum()) if s < S else int((m > 0).sum())})
    steps = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    return runs, trends, gm, steps, sets, levels


def _build_series(pts: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The build series of every run of three or more environments (module docstring). Each arm is
    read against the base environment's arm of its backend: where the row carries that speedup
    with its interval (the A/B's own, paired round by round, between pairs of workers, with the
    per-process floor of one or two pairs: what ``flyexplore compare`` reads), ``time / base
    time = 1 / speedup`` with that interval; else its time with the time's interval. A point
    without an interval is left out (nothing says how well it is known)."""
    scols = ["run_id", "series", "op", "case", "dtype", "backend", "from_env", "to_env", "change", "lo", "hi",
             "direction", "interval"]
    pcols = ["run_id", "series", "env", "position", "time_ms", "lo_ms", "hi_ms", "interval"]
    srows, prows = [], []
    ab = pts[pts["envs"].notna() & (pts["env"].astype(str) != "")]
    for run_id, d in ab.groupby("run_id", sort=False):
        present = list(dict.fromkeys(d["env"].astype(str)))
        listed = [e for e in json.loads(d["envs"].iloc[0]) if e in set(present)]
        envs = listed + [e for e in present if e not in set(listed)]
        if len(envs) < 3:
            continue
        d = d.assign(base=[split_arm(b)[0] for b in d["backend"].astype(str)],
                     epos=d["env"].astype(str).map({e: i for i, e in enumerate(envs)}))
        for key, g in d.groupby(["op", "case", "dtype", "base"], sort=True):
            g = g.sort_values("epos")
            name = " ".join(str(x) for x in key)
            ref = f"{key[3]}@{envs[0]}"
            base = g[g["epos"] == 0]
            sp, sp_lo, sp_hi = (pd.to_numeric(g[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
                                for c in ("speedup", "speedup_lo", "speedup_hi"))
            paired = ((g["baseline"].astype(str) == ref).to_numpy() & np.isfinite(sp_lo) & np.isfinite(sp_hi)
                      & (sp_lo > 0) & (len(base) == 1))
            use_pairs = len(base) == 1 and paired[g["epos"].to_numpy() > 0].any()
            t = g["time_ms"].to_numpy(dtype=float)
            lo = pd.to_numeric(g["time_ci_lo_ms"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            hi = pd.to_numeric(g["time_ci_hi_ms"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            y = np.full(len(envs), np.nan)
            sg = np.full(len(envs), np.nan)
            for i, (e, p) in enumerate(zip(g["env"].astype(str), g["epos"].to_numpy(dtype=int))):
                if use_pairs and p == 0:
                    y[p], sg[p], how = 0.0, 0.0, "reference"
                    bt = t[i]
                    lo_i = hi_i = t[i]
                elif use_pairs and paired[i]:
                    y[p], sg[p], how = -np.log(sp[i]), log_se(sp_lo[i], sp_hi[i]), "paired"
                    bt = float(base["time_ms"].iloc[0])
                    lo_i, hi_i = bt / sp_hi[i], bt / sp_lo[i]
                elif not use_pairs and np.isfinite(log_se(lo[i], hi[i])):
                    y[p], sg[p], how = np.log(t[i]), log_se(lo[i], hi[i]), "time"
                    lo_i, hi_i = lo[i], hi[i]
                else:
                    continue   # no interval: left out
                prows.append((run_id, name, e, p, t[i], lo_i, hi_i, how))
            f = ST.fit(y, sg, between_runs=False)
            for stp in ST.steps_of(f):
                prev = max(p for p in range(stp.at) if np.isfinite(y[p]))
                srows.append((run_id, name, *key, envs[prev], envs[stp.at], stp.change, stp.lo, stp.hi,
                              "slower" if stp.change > 0 else "faster", "paired" if use_pairs else "time"))
    return pd.DataFrame(srows, columns=scols), pd.DataFrame(prows, columns=pcols)


# -- the learned allowance ------------------------------------------------------------------------

@dataclass(frozen=True)
class Allowance:
    """A cross-run allowance (a fraction: each side of a cross-run ratio's interval is widened by
    it) and why: ``source`` ``learned`` (from ``runs`` identical runs of ``device``, ``pairs`` pairs
    of rows) or ``constant`` (:data:`flyexplore.results.speedups.RUN_TO_RUN`); ``basis`` says it in
    words, as ``flyexplore compare`` prints it."""

    value: float
    source: str
    device: str
    runs: int = 0
    pairs: int = 0
    basis: str = ""


def _one_process(pts: pd.DataFrame) -> pd.DataFrame:
    """The points measured in one process (``processes`` missing or 1): the rows a cross-run
    allowance widens."""
    if "processes" not in pts:
        return pts
    procs = pd.to_numeric(pts["processes"], errors="coerce")
    return pts[(procs.isna() | (procs <= 1)).to_numpy()]


def pair_moves(points: pd.DataFrame, levels: pd.DataFrame | None = None) -> np.ndarray:
    """``max(t_p, t_q) / min(t_p, t_q) - 1`` for every row in two identical runs ``p``, ``q`` (the
    same device, :data:`IDENTICAL` equal; ``ok`` rows with a time, measured in one process -- the
    rows a cross-run allowance widens; a ``--processes`` row's time is a mean over processes and
    moves less; the newest :data:`ALLOWANCE_RUNS` runs of each build) of ``points`` (a store's
    points, oldest first): how far identical runs moved.

    Only pairs on one level of the row's series count: a step (a driver, the machine's state, a
    slow newest run) is a change, not how far identical runs move. The levels are ``levels``
    (columns ``series``, ``run_id``, ``level``: what :func:`analyse` fitted) or else
    :func:`flyexplore.results.steps.fit` over the selected runs in time order. Returns the
    fractions (float64, any order)."""
    pts = _one_process(_timed(points))
    if pts.empty:
        return np.empty(0)
    ident = _identity(pts)
    keep = set()
    for _, d in pts.groupby(ident, sort=False):
        keep |= set(d["run_id"].drop_duplicates().iloc[-ALLOWANCE_RUNS:])   # the newest (oldest first)
    pts = pts[pts["run_id"].isin(keep)]
    ident = _identity(pts)
    series = (pts["op"].astype(str) + " " + pts["case"].astype(str) + " " + pts["dtype"].astype(str) + " "
              + pts["backend"].astype(str))
    rows, names = pd.factorize(series)
    runs = pd.Index(pts["run_id"].drop_duplicates())
    cols = runs.get_indexer(pts["run_id"])
    m = np.full((len(names), len(runs)), np.nan)
    m[rows, cols] = pts["time_ms"].astype(float).to_numpy()
    level = np.full(m.shape, -1)
    if levels is None:
        for s, f in enumerate(ST.fit(np.log(m))):
            for i, a in enumerate(f.starts):
                level[s, a:] = i
    else:
        lv = levels.set_index(["series", "run_id"])["level"]
        got = lv.reindex(pd.MultiIndex.from_arrays([series.to_numpy(), pts["run_id"].to_numpy()])).to_numpy()
        level[rows, cols] = np.where(pd.notna(got), got, -1).astype(int)
    run_ident = pd.Series(ident, index=pts.index).groupby(pts["run_id"].to_numpy()).first().reindex(runs).to_numpy()
    out = []
    for g in pd.unique(run_ident):
        c = np.flatnonzero(run_ident == g)
        for i in range(c.size - 1):
            r = m[:, c[i + 1:]] / m[:, c[i]:c[i] + 1]
            same = level[:, c[i + 1:]] == level[:, c[i]:c[i] + 1]
            r = r[np.isfinite(r) & same]
            out.append(np.expm1(np.abs(np.log(r))))   # the larger over the smaller, less 1
    return np.concatenate(out) if out else np.empty(0)


def learned_allowance(points: pd.DataFrame, device_id: str | None = None, device: str | None = None,
                      platform: str | None = None, levels: pd.DataFrame | None = None) -> Allowance:
    """The cross-run allowance for two runs of one device: learned from the store's ``points``
    of that device (``device_id``: a device key, :func:`flyexplore.results.history_store.device_keys`;
    else the device model ``device``) as the
    :data:`ALLOWANCE_QUANTILE` of :func:`pair_moves`, rounded up to :data:`ALLOWANCE_STEP`, when
    there are at least :data:`MIN_ALLOWANCE_RUNS` runs of one build and
    :data:`MIN_ALLOWANCE_PAIRS` pairs; else the constant :data:`RUN_TO_RUN` of ``platform``
    (the CPU's when unknown), with the reason in ``basis``. The quantile is of
    :func:`pair_moves`: one-process rows, pairs on one level of their series (``levels``: the
    levels :func:`analyse` fitted, else fitted here)."""
    const = RUN_TO_RUN.get(str(platform), RUN_TO_RUN["cpu"])
    sel = points.iloc[0:0]
    what = device_id or device or "unknown device"
    if device_id:
        sel = points[points["device_key"].astype(str) == str(device_id)]
    if sel.empty and device:
        sel = points[points["run_device"].astype(str) == str(device)]
        what = f"{device} (any device of that model)"
    moves = pair_moves(sel, levels) if not sel.empty else np.empty(0)
    sel = _one_process(_timed(sel)) if not sel.empty else sel
    most = int(sel.groupby(_identity(sel))["run_id"].nunique().max()) if not sel.empty else 0
    if most >= MIN_ALLOWANCE_RUNS and moves.size >= MIN_ALLOWANCE_PAIRS:
        v = math.ceil(float(np.quantile(moves, ALLOWANCE_QUANTILE)) / ALLOWANCE_STEP - 1e-9) * ALLOWANCE_STEP
        v = max(v, ALLOWANCE_STEP)
        return Allowance(v, "learned", what, most, int(moves.size),
                         f"from the history: learned, p95 of max/min - 1 over {moves.size} pairs of one-process "
                         f"rows of identical runs of {what} (the largest set of identical runs: {most})")
    short = []
    if most < MIN_ALLOWANCE_RUNS:
        short.append(f"at most {most} identical runs of one-process rows of {what} (it needs "
                     f"{MIN_ALLOWANCE_RUNS})")
    if moves.size < MIN_ALLOWANCE_PAIRS:
        short.append(f"{moves.size} pairs of rows of identical runs (it needs {MIN_ALLOWANCE_PAIRS})")
    why = "the history holds too few to learn one: " + " and ".join(short)
    return Allowance(const, "constant", what, most, int(moves.size),
                     f"the {platform or 'cpu'} constant (flyexplore.results.table.RUN_TO_RUN, calibrated on "
                     f"{RUN_TO_RUN_SOURCE}): {why}")


def _allowances_of(group: str, d: pd.DataFrame, levels: pd.DataFrame) -> pd.DataFrame:
    rows = []
    plat = str(d["run_platform"].dropna().iloc[0]) if d["run_platform"].notna().any() else None
    for dev in sorted(str(v) for v in d["device_key"].dropna().unique() if str(v)) or [None]:
        a = learned_allowance(d, dev, None if dev else str(d["run_device"].iloc[0]), plat, levels)
        rows.append({"group": group, "device_id": dev, "value": a.value, "source": a.source, "runs": a.runs,
                     "pairs": a.pairs, "basis": a.basis})
    return pd.DataFrame(rows)


#: ``history`` values that turn the learned allowance off (``flyexplore compare --history off``).
OFF = ("off", "none", "no", "false", "0")


def store_for_compare(history):
    """The store ``flyexplore compare`` reads its allowance from: ``history`` None -> the default
    store when it exists (else None; :func:`flyexplore.results.compare.sides` then falls back to the
    constant when that store cannot be read); False or one of :data:`OFF` -> None; a folder -> that
    store, which must exist. Raises :class:`UsageError` for a folder that holds no store."""
    if history is False or (isinstance(history, str) and history.strip().lower() in OFF):
        return None
    if history is None or history is True:
        try:
            st = Store()
        except UsageError:   # the default path is a file: no store, the constant (nothing named)
            return None
        return st if st.exists() else None
    st = Store(history)
    if not st.exists():
        raise UsageError(f"bad --history {str(history)!r}: no history store there (flyexplore history add makes "
                         "one; --history off uses the constant allowance)")
    return st


def compare_allowance(a: pd.DataFrame, b: pd.DataFrame, store) -> Allowance | None:
    """The allowance ``flyexplore compare`` uses for result sets ``a`` and ``b``: when the measured
    rows of both come from one device (one device key,
    :func:`flyexplore.results.history_store.device_keys`: a GPU's ``device_id``, a CPU's host) and ``store`` (a
    :class:`~flyexplore.results.history_store.Store`) exists, :func:`learned_allowance` of that
    device; None otherwise (the per-platform constant applies, as before)."""
    ids: set[str] = set()
    plats: set[str] = set()
    for d in (a, b):
        m = d[d["source"].astype("string").fillna("measured") != "published"] if "source" in d else d
        if m.empty:
            return None
        ids |= set(device_keys(m))
        if "platform" in m:
            plats |= {str(v) for v in m["platform"].dropna()}
    if len(ids) != 1 or store is None or not store.exists():
        return None
    dev = next(iter(ids))
    pts = store.points(device=dev)
    return learned_allowance(pts, dev, None, next(iter(plats)) if len(plats) == 1 else None)


# -- the gate ------------------------------------------------------------------------------------

_RULE_HINT = ("(the history gate takes SLOWER[:THRESHOLD] rules, comma-separated, each with an optional :warn; "
              "THRESHOLD a percentage such as 5% or a fraction such as 0.05)")


def history_rules(fail_on) -> tuple:
    """Read ``history show --fail-on``: SLOWER rules only (:func:`flyexplore.results.gate.parse_rules`
    reads each). Raises :class:`UsageError` naming the bad rule: another label (a step is slower or
    faster; AMBIGUOUS is compare's), a bad threshold."""
    items = fail_on.split(",") if isinstance(fail_on, str) else list(fail_on) if not hasattr(fail_on, "label") \
        else [fail_on]
    for x in items:
        if isinstance(x, str) and not x.strip():
            continue   # an empty rule: parse_rules says so
        label = x.label if hasattr(x, "label") else str(x).strip().split(":")[0].strip().upper()
        if label != "SLOWER":
            raise UsageError(f"bad --fail-on {str(getattr(x, 'text', x)).strip()!r}: a step is slower or faster, so "
                             f"only SLOWER gates it {_RULE_HINT}")
    try:
        return parse_rules(fail_on)
    except UsageError as exc:
        raise UsageError(str(exc).split(" (valid:")[0] + " " + _RULE_HINT) from None


def gate_steps(an: Analysis, fail_on, recent: int | None = None) -> tuple[bool, list[str]]:
    """``flyexplore history show --fail-on``: each series' newest step (and the geometric mean's),
    of the newest ``recent`` runs of its device when given, trips ``SLOWER:X`` when it made the
    series slower by more than ``X`` even at its interval's favourable end (``lo > X``; the rule of
    :class:`flyexplore.results.gate.FailOn`). Returns ``(failed, lines)``. Raises
    :class:`UsageError` for a rule other than SLOWER (AMBIGUOUS has no meaning for a step) or a bad
    ``recent``."""
    rules = history_rules(fail_on)
    if recent is not None and (not isinstance(recent, (int, np.integer)) or recent < 1):
        raise UsageError(f"bad --recent {recent!r}: a number of runs, 1 or more")
    st = an.steps[an.steps["newest"].astype(bool)] if len(an.steps) else an.steps
    if recent is not None and len(st):
        last = an.runs.groupby("group")["position"].max()
        st = st[st["position"] > st["group"].map(last) - recent]
    failed, lines = False, []
    for r in rules:
        trip = st[(st["direction"] == "slower") & (st["lo"] > r.threshold)] if len(st) else st
        if r.warn:
            word = "WARNING" if len(trip) else "ok"
        else:
            word = "FAILED" if len(trip) else "passed"
            failed |= bool(len(trip))
        where = f" of the newest {recent} run{'s' * (recent != 1)}" if recent is not None else ""
        if len(trip):
            what = (f"{len(trip)} series' newest step{where} is slower by more than {r.threshold:.1%} at its "
                    "interval's favourable end")
        else:
            what = (f"no series' newest step{where} is slower by more than {r.threshold:.1%} at its interval's "
                    "favourable end")
        lines.append(f"gate {r.text}: {word}: {what}")
        for _, s in trip.head(10).iterrows():
            lines.append("  " + step_text(s))
    return failed, lines


# -- text ----------------------------------------------------------------------------------------

def _pct(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "n/a"


def step_text(s) -> str:
    """One step as a line: series, run, size and interval."""
    when = str(s["timestamp"] or "")[:16]
    commit = f", commit {str(s['commit'])[:12]}" if s.get("commit") else ""
    return (f"{s['series']}: {s['direction']} {_pct(s['change'])} [{_pct(s['lo'])}, {_pct(s['hi'])}] from run "
            f"{s['run_id']} ({when}{commit}) on, run {s['position'] + 1} of {s['runs']}")


def show_lines(an: Analysis, top: int = 10) -> list[str]:
    """The terminal text of ``flyexplore history show``: per device model its runs, the geometric
    mean's trend and steps, the largest case steps (``top``), the allowance; then the build series'
    steps."""
    out = [f"history {an.store}: {an.runs['run_id'].nunique()} runs, {len(an.runs['group'].unique())} "
           f"device model{'s' * (len(an.runs['group'].unique()) != 1)}"]
    for g, r in an.runs.groupby("group", sort=True):
        gm = an.geomean[an.geomean["group"] == g]
        st = an.steps[an.steps["group"] == g] if len(an.steps) else an.steps
        ts = r["timestamp"].dropna().astype(str)
        out.append(f"{g}: {len(r)} runs ({ts.min()[:10] if len(ts) else '?'} .. {ts.max()[:10] if len(ts) else '?'}), "
                   f"{an.trends.loc[an.trends['group'] == g, 'series'].nunique()} series")
        newest = gm.iloc[-1]
        out.append(f"  geomean (each run's time against the cases' levels; the median run 1.0): newest run "
                   f"{newest['geomean']:.3f}x "
                   f"[{newest['lo']:.3f}, {newest['hi']:.3f}] over {int(newest['cases'])} cases")
        gst = st[st["series"] == GEOMEAN] if len(st) else st
        for _, s in gst.iterrows():
            out.append("  step: " + step_text(s))
        cst = st[st["series"] != GEOMEAN] if len(st) else st
        n_series = cst["series"].nunique() if len(cst) else 0
        if not len(cst):
            out.append("  no step in any case")
        else:
            out.append(f"  {len(cst)} step{'s' * (len(cst) != 1)} in {n_series} of "
                       f"{an.trends.loc[an.trends['group'] == g, 'series'].nunique()} cases; largest:")
            big = cst.reindex(cst["change"].abs().sort_values(ascending=False).index).head(top)
            for _, s in big.iterrows():
                out.append("    " + step_text(s))
        for _, a in an.allowances[an.allowances["group"] == g].iterrows():
            dev = f" {a['device_id']}" if a["device_id"] else ""
            out.append(f"  cross-run allowance{dev}: ±{a['value']:.1%} ({a['basis']})")
    if len(an.build_points):
        for run_id, d in an.build_points.groupby("run_id", sort=False):
            envs = d.drop_duplicates("env").sort_values("position")["env"].tolist()
            b = an.builds[an.builds["run_id"] == run_id]
            out.append(f"build series {run_id} ({' -> '.join(envs)}): "
                       f"{len(b)} step{'s' * (len(b) != 1)} in {d['series'].nunique()} cases")
            for _, s in b.reindex(b["change"].abs().sort_values(ascending=False).index).head(top).iterrows():
                out.append(f"    {s['series']}: between {s['from_env']} and {s['to_env']}: {s['direction']} "
                           f"{_pct(s['change'])} [{_pct(s['lo'])}, {_pct(s['hi'])}]")
    out.extend(an.notes)
    return out


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: jsonable(v) for k, v in r.items()} for r in df.to_dict("records")]


def show_dict(an: Analysis) -> dict:
    """``flyexplore history show --json``: ``store``, ``runs``, ``steps``, ``builds``,
    ``geomean``, ``allowances`` (lists of records, NaN as null; the tables of :class:`Analysis`)."""
    return {"store": an.store, "runs": _records(an.runs), "steps": _records(an.steps),
            "builds": _records(an.builds), "geomean": _records(an.geomean), "allowances": _records(an.allowances)}


# -- exports -------------------------------------------------------------------------------------

EXPORT_FORMATS = ("bmf", "github-action-benchmark")


def _run_points(points: pd.DataFrame, run_id: str | None) -> tuple[str, pd.DataFrame]:
    pts = _timed(points)
    if pts.empty:
        raise UsageError("history export: no ok row with a time in the store")
    if run_id is None:
        run_id = str(pts.sort_values(["timestamp", "run_id"], kind="stable")["run_id"].iloc[-1])
    sel = pts[pts["run_id"] == run_id]
    if sel.empty:
        newest = list(dict.fromkeys(pts.sort_values(["timestamp", "run_id"], kind="stable")["run_id"]))[-5:][::-1]
        raise UsageError(f"bad --run {run_id!r}: no run of that id with timed rows in the store (newest: "
                         f"{', '.join(newest)}; flyexplore history show --json lists them all)")
    return run_id, sel


def _sig(x: float) -> float:
    """``x`` to 9 significant digits (a float product's last bits are no measurement)."""
    return float(f"{x:.9g}")


def _bench_name(r) -> str:
    return f"{r['op']}/{r['case']}/{r['dtype']}/{r['backend']}"


def bmf(points: pd.DataFrame, run_id: str | None = None) -> dict:
    """One run (default: the newest) in Bencher Metric Format:
    ``{benchmark: {"latency": {"value", "lower_value", "upper_value"}}}``, the benchmark named
    ``op/case/dtype/backend`` and ``latency`` in nanoseconds (Bencher's built-in latency measure
    is in ns; https://bencher.dev/docs/reference/bencher-metric-format/), the bounds the row's
    95% interval. Raises :class:`UsageError` for an unknown run or an empty store."""
    _, sel = _run_points(points, run_id)
    out = {}
    for r in sel.to_dict("records"):
        m = {"value": _sig(float(r["time_ms"]) * 1e6)}
        for k, c in (("lower_value", "time_ci_lo_ms"), ("upper_value", "time_ci_hi_ms")):
            v = jsonable(r.get(c))
            if v is not None:
                m[k] = _sig(float(v) * 1e6)
        out[_bench_name(r)] = {"latency": m}
    return out


def github_benchmark(points: pd.DataFrame, run_id: str | None = None) -> list[dict]:
    """One run (default: the newest) as github-action-benchmark's ``customSmallerIsBetter`` JSON:
    a list of ``{"name", "unit": "ms", "value", "range", "extra"}`` (``range`` the 95% interval as
    text, ``lo..hi`` in ms -- it need not be symmetric; ``extra`` the run and device). Raises as :func:`bmf`."""
    rid, sel = _run_points(points, run_id)
    out = []
    for r in sel.to_dict("records"):
        lo, hi = jsonable(r.get("time_ci_lo_ms")), jsonable(r.get("time_ci_hi_ms"))
        item = {"name": _bench_name(r), "unit": "ms", "value": _sig(float(r["time_ms"]))}
        if lo is not None and hi is not None:
            item["range"] = f"95% interval {lo:.6g}..{hi:.6g}"
        item["extra"] = f"run {rid}; {r.get('run_device') or 'unknown device'}"
        out.append(item)
    return out


def export(points: pd.DataFrame, fmt: str, run_id: str | None = None):
    """:func:`bmf` or :func:`github_benchmark` by ``fmt`` (:data:`EXPORT_FORMATS`). Raises
    :class:`UsageError` for another format."""
    if fmt == "bmf":
        return bmf(points, run_id)
    if fmt == "github-action-benchmark":
        return github_benchmark(points, run_id)
    raise bad_choice("--format", fmt, EXPORT_FORMATS)
