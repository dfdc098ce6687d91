"""A/B comparison of two result sets paired by case: two torch builds, two AOTriton versions,
FlyDSL on vs off, this machine vs the published MI355X figures.

``ratio = time_A / time_B`` per paired key: > 1 means B is faster (the speedup of B over A).
Cases present in one side only are listed, never dropped silently.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

from . import results as R
from .errors import UsageError

#: Environment columns shown side by side (and flagged when they differ).
ENV_COLUMNS = ("platform", "device", "arch", "torch", "triton", "flydsl", "aotriton", "gpu_runtime",
               "python", "host", "env_id")


@dataclass
class ABResult:
    """The outcome of :func:`pair`.

    ``pairs``: one row per key in both sides, columns ``*key, time_a_ms, time_b_ms, ratio``
    (time_a / time_b; > 1: B faster), ``tie`` (within +-1%), ``source_a``, ``source_b``.
    ``only_a`` / ``only_b``: key rows present in one side only. ``summary``: per (op, dtype,
    backend) the number of pairs, geometric mean ratio, min, max, wins for B, ties, wins for A.
    ``names``: display names of the two sides; ``key``: the pairing columns."""

    pairs: pd.DataFrame
    only_a: pd.DataFrame
    only_b: pd.DataFrame
    summary: pd.DataFrame
    names: tuple[str, str]
    key: tuple[str, ...]
    env: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def geomean(self) -> float:
        """Geometric mean of all paired ratios."""
        return R.geomean(self.pairs["ratio"])


def _times(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    d = df[df["status"].isin(["ok", "published"]) & df["time_ms"].notna()]
    return d.groupby(key, dropna=False, sort=False).agg(
        time_ms=("time_ms", "median"), source=("source", "first")).reset_index()


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
    and ``backend`` leaves the key. Raises :class:`UsageError` when a given backend has no rows
    or when no key is in both sides."""
    key = list(key)
    if a_backend or b_backend:
        for side, d, be in (("A", a, a_backend), ("B", b, b_backend)):
            if be and not (d["backend"] == be).any():
                raise UsageError(f"no rows for backend {be!r} in {side} "
                                 f"(backends present: {', '.join(sorted(d['backend'].dropna().unique()))})")
        a = a[a["backend"] == a_backend] if a_backend else a
        b = b[b["backend"] == b_backend] if b_backend else b
        key = [k for k in key if k != "backend"]
    ta, tb = _times(a, key), _times(b, key)
    ta["_order_a"], tb["_order_b"] = range(len(ta)), range(len(tb))
    j = ta.merge(tb, on=key, how="outer", suffixes=("_a", "_b"), indicator=True)
    j = j.sort_values(["_order_a", "_order_b"], na_position="last").drop(columns=["_order_a", "_order_b"])
    only_a = j.loc[j["_merge"] == "left_only", key].reset_index(drop=True)
    only_b = j.loc[j["_merge"] == "right_only", key].reset_index(drop=True)
    p = j[j["_merge"] == "both"].drop(columns="_merge").rename(
        columns={"time_ms_a": "time_a_ms", "time_ms_b": "time_b_ms"}).reset_index(drop=True)
    if p.empty:
        raise UsageError(f"no case is in both {names[0]} and {names[1]} "
                         f"({len(only_a)} only in {names[0]}, {len(only_b)} only in {names[1]})")
    p["ratio"] = p["time_a_ms"].astype(float) / p["time_b_ms"].astype(float)
    p["tie"] = (p["ratio"] - 1.0).abs() <= R.TIE_BAND
    if a_backend or b_backend:
        p["backend"] = f"{a_backend or '*'} -> {b_backend or '*'}"
    grp = [c for c in ("op", "dtype", "backend") if c in p]
    rows = []
    for k, g in p.groupby(grp, sort=False, dropna=False):
        k = k if isinstance(k, tuple) else (k,)
        r = dict(zip(grp, k))
        r.update({"pairs": len(g), "geomean": R.geomean(g["ratio"]), "min": g["ratio"].min(),
                  "max": g["ratio"].max(), f"{names[1]} faster": int(((g["ratio"] > 1) & ~g["tie"]).sum()),
                  "ties": int(g["tie"].sum()), f"{names[0]} faster": int(((g["ratio"] < 1) & ~g["tie"]).sum())})
        rows.append(r)
    return ABResult(p, only_a, only_b, pd.DataFrame(rows), tuple(names), tuple(key), env_table(a, b, names))
