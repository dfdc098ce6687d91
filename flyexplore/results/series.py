"""A build series: an environment A/B of three or more environments in one run (AOTriton
0.11.2b / 0.13b / 0.14.2b, torch nightlies, flydsl 0.3.x / 0.4.x, ROCm releases), read as each
case's speedup in every environment against the first one, the environments in the run's order.
Its figure and report section are :mod:`flyexplore.views.series`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.measure import stats as S
from flyexplore.results import table as R

#: The columns a build series reads from the rows (besides those :func:`flyexplore.results.table.speedup`
#: reads where present: ``run_id``, ``baseline``, ``speedup``, the samples, ...).
NEEDED = ("op", "case", "dtype", "backend", "env", "status", "time_ms")

#: The columns of :func:`series_table`, in order.
COLUMNS = ("op", "case", "dtype", "backend", "env", "position", "arm", "reference", "time_ms", "reference_ms",
           "speedup", "speedup_lo", "speedup_hi", "verdict", "interval")

_NOT_AB = "not an environment A/B (flyexplore sweep --env A --env B --env C ...; fx.sweep(..., envs=[...]))"


def _name_of(text) -> str | None:
    """An environment's name from ``--env`` text (``0.13b=/opt/py:X=1`` -> ``0.13b``)."""
    name = str(text).split("=", 1)[0].split(":", 1)[0].strip()
    return name or None


def run_order(df: pd.DataFrame) -> list[str]:
    """The environments of an A/B's rows in the run's order: as its sweep record lists them
    (``df.attrs["sweeps"]``, each record's ``plan["envs"]``, else its ``spec["envs"]`` text; the
    first environment is the A/B's base), then any environment of the rows no record names, in
    order of first appearance (:func:`flyexplore.results.table.ab_envs`). Only environments that
    have rows. ``[]`` for rows without an ``env`` column."""
    present = R.ab_envs(df)
    if not present:
        return []
    listed: list[str] = []
    for rec in df.attrs.get("sweeps") or []:
        if not isinstance(rec, dict):
            continue
        plan, spec = rec.get("plan") or {}, rec.get("spec") or {}
        names = [e.get("name") for e in plan.get("envs") or [] if isinstance(e, dict)] or \
                [_name_of(e) for e in spec.get("envs") or []]
        listed += [str(n) for n in names if n]
    have = set(present)
    order = [e for e in dict.fromkeys(listed) if e in have]
    return order + [e for e in present if e not in set(order)]


def check_series_rows(df: pd.DataFrame, what: str = "a build series") -> list[str]:
    """Check that ``df`` holds an environment A/B's result rows and return its environments in
    the run's order (:func:`run_order`). Raises :class:`UsageError` (one line) for a missing
    column of :data:`NEEDED` (named), rows without any environment, or fewer than two
    environments."""
    if not isinstance(df, pd.DataFrame):
        raise UsageError(f"{what} needs result rows (a DataFrame or a result file), got {type(df).__name__}")
    for c in NEEDED:
        if c not in df.columns:
            raise UsageError(f"{what} needs column {c!r}, which the rows lack: {_NOT_AB}")
    order = run_order(df)
    if not order:
        raise UsageError(f"{what} needs rows with an environment (column 'env' is empty): {_NOT_AB}")
    if len(order) < 2:
        raise UsageError(f"{what} needs two or more environments, the rows hold one ({order[0]})")
    return order


def pick_envs(order: Sequence[str], envs: Sequence[str] | str | None) -> list[str]:
    """``envs`` checked against the A/B's environments ``order``: each must be one of them, none
    twice, two or more; None gives ``order``. A string is one comma-separated list. Raises
    :class:`UsageError` naming the bad value and the valid ones."""
    if envs is None:
        return list(order)
    names = [e.strip() for e in envs.split(",")] if isinstance(envs, str) else [str(e) for e in envs]
    for e in names:
        if e not in order:
            raise bad_choice("environment", e, order)
    dup = [e for e in dict.fromkeys(names) if names.count(e) > 1]
    if dup:
        raise UsageError(f"environment {dup[0]!r} named twice in envs ({', '.join(names)})")
    if len(names) < 2:
        raise UsageError(f"a build series needs two or more environments, got {len(names)} "
                         f"({', '.join(names) or 'none'}; valid: {', '.join(order)})")
    return names


def series_table(df: pd.DataFrame, envs: Sequence[str] | str | None = None) -> pd.DataFrame:
    """Each case's speedup in every environment against the first one: the numbers of a build
    series.

    ``df``: an environment A/B's result rows (columns :data:`NEEDED`: ``backend`` holds the arm,
    ``flash@0.13b``, and ``env`` its environment; the speedup columns, samples and ``run_id``
    are read where present). ``envs``: the environments to show, in this order, the first being
    the reference (default: all, in the run's order, :func:`run_order`; the first is the A/B's
    base environment).

    A backend's series is its arms in those environments; each arm's speedup is time of the
    reference arm / time of the arm (> 1: faster than the first environment), with its 95%
    interval and label, by :func:`flyexplore.results.table.speedup` -- the speedup the A/B
    measured in paired rounds where the row holds it against that same reference arm (the
    first environment is the A/B's base: ``flash@0.14.2b`` against ``flash@0.13b``), else from
    the samples (another first environment). The reference arm is the same backend in the first
    environment, or, for a backend with no arm there (``--backends aten@base,flydsl@new``), the
    A/B's baseline arm when that is in the first environment; a backend with neither is left
    out (``attrs["notes"]`` says so).

    Returns one row per case, backend and environment that has a number, the first
    environment's row included as the reference (``speedup`` 1.0, no interval, ``verdict``
    NA, ``interval`` ``reference``), with columns :data:`COLUMNS`: ``op, case, dtype``,
    ``backend`` (without ``@env``), ``env``, ``position`` (0-based place of ``env`` in the
    order), ``arm``, ``reference`` (the arm it is against), ``time_ms`` and ``reference_ms``
    (median times, ms), ``speedup``, ``speedup_lo``, ``speedup_hi`` (ratios), ``verdict``
    (FASTER/SAME/SLOWER/AMBIGUOUS), ``interval`` (how the interval was had: ``paired``,
    ``unpaired``, ... as in :func:`~flyexplore.results.table.speedup`). Rows by case in order of
    first appearance, then backend, then environment in the order. ``attrs``: ``envs`` (the
    order), ``notes`` (backends or cases left out, and why). Raises :class:`UsageError` for rows
    that are not an environment A/B (the missing column named), fewer than two environments,
    or an ``envs`` entry that is not one of the A/B's (the valid ones listed)."""
    order = pick_envs(check_series_rows(df), envs)
    first = order[0]
    rank = {e: i for i, e in enumerate(order)}
    d = df[df["env"].isin(order)]
    part = np.array([R.split_arm(b)[0] for b in d["backend"].astype(object).tolist()], dtype=object)
    backends = list(dict.fromkeys(part.tolist()))
    base_arm = R.default_baseline(df)
    notes: list[str] = []
    frames = []
    for b in backends:
        mine = d[part == b]
        ref = R.arm_name(b, first)
        if not (mine["backend"] == ref).any():
            if R.split_arm(base_arm)[1] != first or not (d["backend"] == base_arm).any():
                notes.append(f"{b}: no arm in {first} and no baseline arm there, left out")
                continue
            ref = base_arm
            mine = pd.concat([mine, d[d["backend"] == base_arm]])
        try:
            sp = R.speedup(mine, ref)
        except UsageError:   # the reference arm has no counted row (not ok in every case)
            notes.append(f"{b}: {ref} has no ok row, left out")
            continue
        sp = sp[sp["backend"] != ref]
        sp = sp.assign(arm=sp["backend"], backend=b, reference=ref, reference_ms=sp["baseline_ms"],
                       env=[R.split_arm(a)[1] for a in sp["backend"]])
        # the reference itself: 1.0, where the reference arm has a counted time in the case
        ok = mine[(mine["backend"] == ref) & mine["status"].isin(["ok", "published"]) & mine["time_ms"].notna()]
        refs = (ok.groupby(["op", "case", "dtype"], sort=False, dropna=False)["time_ms"].median().reset_index()
                .assign(backend=b, env=first, arm=ref, reference=ref, reference_ms=lambda t: t["time_ms"],
                        speedup=1.0, speedup_lo=np.nan, speedup_hi=np.nan, verdict=pd.NA, interval="reference"))
        frames += [refs, sp]
        lost = mine.loc[~mine["backend"].eq(ref), ["op", "case", "dtype"]].drop_duplicates()
        have = ok[["op", "case", "dtype"]].drop_duplicates()
        missing = len(lost.merge(have, how="left", indicator=True).query("_merge == 'left_only'"))
        if missing:
            notes.append(f"{b}: {missing} case(s) without an ok {ref} row, left out")
    if not frames:
        out = pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    else:
        out = pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
        out = out[out["env"].isin(order)]
        out["position"] = out["env"].map(rank).astype("int64")
        case_rank = {k: i for i, k in enumerate(dict.fromkeys(zip(d["op"], d["case"], d["dtype"])))}
        back_rank = {b: i for i, b in enumerate(backends)}
        out["_c"] = [case_rank.get(k, len(case_rank)) for k in zip(out["op"], out["case"], out["dtype"])]
        out["_b"] = out["backend"].map(back_rank)
        out = out.sort_values(["_c", "_b", "position"], kind="stable").reset_index(drop=True)
        out = out[list(COLUMNS)]
        for c in ("time_ms", "reference_ms", "speedup", "speedup_lo", "speedup_hi"):
            out[c] = out[c].astype(float)
        out["verdict"] = out["verdict"].astype(object).where(out["verdict"].notna(), pd.NA)
    out.attrs = {"envs": list(order), "notes": notes}
    return out


def series_geomeans(table: pd.DataFrame) -> pd.DataFrame:
    """Per (op, dtype, backend) and environment of a :func:`series_table`, the geometric mean of
    the cases' speedups against the first environment with its 95% interval
    (:func:`flyexplore.measure.stats.geomean_ci`; NaN when a case has none), its label, the
    number of cases and of each label. The first environment's rows are the reference (1.0).
    Columns ``op, dtype, backend, env, position, cases, geomean, geomean_lo, geomean_hi,
    verdict`` and one count column per label; rows in the table's order."""
    cols = ["op", "dtype", "backend", "env", "position", "cases", "geomean", "geomean_lo", "geomean_hi",
            "verdict", *S.LABELS]
    if table.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (op, dt, b, env), g in table.groupby(["op", "dtype", "backend", "env"], sort=False, dropna=False):
        ref = (g["interval"] == "reference").all()
        est, lo, hi = ((1.0, np.nan, np.nan) if ref else
                       S.geomean_ci(g["speedup"].to_numpy(float), g["speedup_lo"].to_numpy(float),
                                    g["speedup_hi"].to_numpy(float)))
        lab = pd.NA if ref or np.isnan(est) else S.verdict(lo, hi)
        counts = {k: int((g["verdict"] == k).sum()) for k in S.LABELS}
        rows.append({"op": op, "dtype": dt, "backend": b, "env": env, "position": int(g["position"].iloc[0]),
                     "cases": len(g), "geomean": est, "geomean_lo": lo, "geomean_hi": hi, "verdict": lab, **counts})
    return pd.DataFrame(rows, columns=cols)
