"""The AOTriton A/B view of two result files (AOTriton 0.13b vs 0.14.2b, two torch builds):
which AOTriton backend ran on each side (read from the rows' ``observed`` text or kernel
names), the speedup with its label, and the published range on gfx950. The facts it reads are
the attention family's (:mod:`flyexplore.ops.attention.aotriton`); its figure and report
section are :mod:`flyexplore.views.aotriton`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from flyexplore.errors import UsageError
from flyexplore.insight.kernels import classify
from flyexplore.ops import get_op
from flyexplore.ops.attention.aotriton import flyc_support, parse_version, release_name
from flyexplore.paths import data_dir
from flyexplore.results import table as R
from flyexplore.results.compare import Sides, env_sides, pair
from flyexplore.results.published import RANGES

#: A field of the example result files that marks them as made up (as in :mod:`flyexplore.results.vllm`).
SYNTHETIC_FIELD = "synthetic_example"
#: The two synthetic example files (``data/examples/aotriton/``), relative to the data folder.
EXAMPLE_FILES = ("examples/aotriton/aotriton_0.13b_synthetic.jsonl",
                 "examples/aotriton/aotriton_0.14.2b_synthetic.jsonl")


def backends_in(observed: Any = None, kernels: Any = None) -> tuple[str, ...]:
    """AOTriton backends named by a row: from its ``observed`` text (``AOTriton[FlyDSL],...``),
    else from its ``kernels`` JSON column (names classified by :func:`flyexplore.insight.kernels.classify`).
    Empty when neither names one."""
    if isinstance(observed, str) and observed:
        found = re.findall(r"AOTriton\[(\w+)\]", observed)
        if found:
            return tuple(dict.fromkeys(found))
    names = _kernel_names(kernels)
    if names:
        return tuple(dict.fromkeys(c.backend for c in map(classify, names) if c.backend))
    return ()


def _kernel_names(kernels: Any) -> list[str]:
    if not isinstance(kernels, str) or not kernels.strip():
        return []
    try:
        return [str(k[0]) for k in json.loads(kernels)]
    except (ValueError, TypeError, IndexError):
        return []


def ran_text(observed: Any = None, kernels: Any = None) -> str:
    """What ran, in words, for the A/B table: ``FlyDSL``, ``Triton``, ``aiter``, ``FlyDSL +
    Triton bwd_preprocess`` (the flyc backward's metro), ``FlyDSL + Triton``, ``no AOTriton
    kernel (<observed>)`` or ``not traced``."""
    bes = backends_in(observed, kernels)
    if not bes:
        if isinstance(observed, str) and observed:
            return f"no AOTriton kernel ({observed})"
        return "not traced"
    order = [b for b in ("FlyDSL", "aiter", "Triton") if b in bes]
    if order[0] == "FlyDSL" and "Triton" in order:
        tri = {n for n in _kernel_names(kernels) if classify(n).backend == "Triton"}
        if tri and all(n.startswith("bwd_preprocess") for n in tri):
            return " + ".join(b if b != "Triton" else "Triton bwd_preprocess" for b in order)
    return " + ".join(order)


# -- the A/B view -----------------------------------------------------------------------------

def published_range(pass_: str) -> tuple[float, float]:
    """The published AOTriton 0.14.2b vs 0.13b range on gfx950 for ``fwd`` / ``bwd`` (low, high)
    (:data:`flyexplore.results.published.RANGES`)."""

    subject = {"fwd": "SDPA forward", "bwd": "SDPA backward"}[pass_]
    r = next(r for r in RANGES if r["what"].startswith("AOTriton") and r["subject"] == subject)
    return float(r["low"]), float(r["high"])


def range_why_not(arch_a: Any, arch_b: Any, aotriton_a: Any, aotriton_b: Any) -> str | None:
    """Why the published AOTriton range (two AOTriton versions on gfx950) does not apply to a
    pair whose sides ran on ``arch_a`` / ``arch_b`` with AOTriton versions ``aotriton_a`` /
    ``aotriton_b`` (version text or release names; ``"not present"`` or missing: none), in a
    few words; None when it applies: both archs start with ``gfx950`` and both versions are
    known and differ."""
    why = []
    archs = [None if a is None or (not isinstance(a, str) and pd.isna(a)) else str(a) for a in (arch_a, arch_b)]
    if not all(a and a.startswith("gfx950") for a in archs):
        why.append("arch " + (archs[0] or "unknown") + (f" vs {archs[1] or 'unknown'}" if archs[1] != archs[0] else
                                                          " on both sides") + ", not gfx950")
    va, vb = (parse_version(v) if isinstance(v, str) else None for v in (aotriton_a, aotriton_b))
    if va is None or vb is None:
        why.append("no AOTriton version recorded on " + ("either side" if va is None and vb is None else
                                                          "side A" if va is None else "side B"))
    elif va == vb:
        why.append(f"the same AOTriton ({release_name(aotriton_a)}) on both sides")
    return "; ".join(why) or None


def range_note(view: pd.DataFrame) -> str | None:
    """One line on the published range of an A/B view (:func:`ab_view`): where it applies to
    every pair, how many pairs lie within it; where it applies to none or some, why it is not
    shown for the others (:func:`range_why_not`). None for an empty view."""
    if view is None or view.empty:
        return None
    lo_f, hi_f = published_range("fwd")
    lo_b, hi_b = published_range("bwd")
    what = (f"published AOTriton range (0.14.2b vs 0.13b on gfx950: fwd {lo_f:.2f}x-{hi_f:.2f}x, "
            f"bwd {lo_b:.2f}x-{hi_b:.2f}x)")
    shown = view["published_range"].notna()
    n, k = len(view), int(shown.sum())
    if k == n:
        inside = int(view["in_published_range"].fillna(False).astype(bool).sum())
        return f"{what}: {inside} of {n} attention pairs within it"
    why = dict.fromkeys(filter(None, (range_why_not(r.get("arch_a"), r.get("arch_b"), r.get("aotriton_a"),
                                                    r.get("aotriton_b")) for _, r in view[~shown].iterrows())))
    part = "" if k == 0 else f" for {n - k} of {n} attention pairs"
    return f"{what} not shown{part}: {'; '.join(why) or 'not the published setup'}"


def summary_notes(sd: Sides) -> list[str]:
    """The lines an A/B summary (:func:`flyexplore.results.compare.summary_lines`, ``notes``)
    adds for the attention pairs of two sides read by :func:`flyexplore.results.compare.sides`:
    the published range's line (:func:`range_note`: how many pairs lie within it, or why it is
    not shown). Empty for a vllm A/B, without attention pairs, or when the attention
    catalogue cannot read a pair's case (the report's section raises for that)."""
    if sd.kind != "rows" or "op" not in sd.ab.pairs or not (sd.ab.pairs["op"] == "attention").any():
        return []
    try:
        view = ab_view(sd.ab, sd.a, sd.b)
    except (UsageError, ValueError, KeyError):
        return []
    note = range_note(view)
    return [note] if note else []


def is_synthetic(df: pd.DataFrame) -> bool:
    """True when any row of ``df`` is marked made-up (the :data:`SYNTHETIC_FIELD` column)."""
    return SYNTHETIC_FIELD in df and df[SYNTHETIC_FIELD].notna().any()


def _first(s: pd.Series):
    s = s.dropna()
    return s.iloc[0] if len(s) else None


def _side(d: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    d = d[d["status"].isin(["ok", "published"])] if "status" in d else d
    cols = [c for c in ("observed", "kernels", "aotriton", "arch", "params", SYNTHETIC_FIELD) if c in d]
    if d.empty:
        return pd.DataFrame(columns=[*key, *cols])
    return d.groupby(key, dropna=False, sort=False)[cols].agg(_first).reset_index()


def ab_view(ab, a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per paired attention case of a :class:`flyexplore.results.compare.ABResult` (``ab``, from
    ``compare.pair(a, b, ...)``): which AOTriton backend ran on each side, the paired speedup
    and the published range beside it.

    ``a`` / ``b``: the two result sets ``ab`` was paired from (their ``observed`` / ``kernels``
    columns say what ran; ``aotriton`` / ``arch`` which build). Returns one row per attention
    pair: ``case, dtype, backend, pass, d, causal, aotriton_a, aotriton_b`` (release names),
    ``arch_a, arch_b, ran_a, ran_b`` (:func:`ran_text`), ``flyc_b`` (FlyDSL kernels existed for
    the call in build B, :func:`flyc_support`), ``time_a_ms, time_b_ms, speedup`` (time A / time
    B: > 1 means B faster), ``speedup_lo``/``speedup_hi`` (its 95% interval) and ``label``
    (FASTER/SAME/SLOWER/AMBIGUOUS, :func:`flyexplore.measure.stats.verdict`; from ``ab.pairs``),
    ``published_range`` (text) and ``in_published_range`` (boolean) -- NA unless the pair
    really compares two AOTriton versions on gfx950 (both sides' ``arch`` start with
    ``gfx950``, both ``aotriton`` versions known and different; :func:`range_why_not`,
    :func:`range_note` says why in one line), ``published_setup`` (True when both
    sides are gfx950 and the builds are 0.13.x vs 0.14.2 -- the published comparison) and
    ``source`` (``synthetic example`` when either input is marked made-up, else
    ``measured``). ``df.attrs["names"]`` keeps the two side names. Empty (same columns) when no
    pair is an attention case."""
    p = ab.pairs
    key = list(ab.key)
    cols = ["case", "dtype", "backend", "pass", "d", "causal", "aotriton_a", "aotriton_b", "arch_a", "arch_b",
            "ran_a", "ran_b", "flyc_b", "time_a_ms", "time_b_ms", "speedup", "speedup_lo", "speedup_hi",
            "label"]
    cols += ["published_range", "in_published_range", "published_setup", "source"]
    if "op" in p:
        p = p[p["op"] == "attention"]
    if p.empty:
        out = pd.DataFrame(columns=cols)
        out.attrs["names"] = tuple(ab.names)
        return out
    a = a[a["op"] == "attention"] if "op" in a else a
    b = b[b["op"] == "attention"] if "op" in b else b
    if "backend" not in key:  # one backend of A against another of B ("x -> y")
        be_a, _, be_b = str(p["backend"].iloc[0]).partition(" -> ")
        a = a if be_a in ("", "*") else a[a["backend"] == be_a]
        b = b if be_b in ("", "*") else b[b["backend"] == be_b]
    sa, sb = _side(a, key), _side(b, key)
    j = p.merge(sa, on=key, how="left").merge(sb, on=key, how="left", suffixes=("_a", "_b"))
    synthetic = is_synthetic(a) or is_synthetic(b)
    rows = []
    for _, r in j.iterrows():
        r = r.where(r.notna(), None)
        try:
            prm = json.loads(r.get("params_a") or r.get("params_b") or "{}")
        except (TypeError, ValueError):
            prm = {}
        if not prm:
            prm = get_op("attention").case(str(r["case"])).p
        pas = prm.get("pass", "fwd")
        lo, hi = published_range(pas)
        ver_a, ver_b = r.get("aotriton_a"), r.get("aotriton_b")
        arch_a, arch_b = r.get("arch_a"), r.get("arch_b")
        ok_b, _ = flyc_support(arch_b, str(r["dtype"]), int(prm.get("d", 0)), pas, ver_b)
        sp = float(r["ratio"])
        ta, tb = parse_version(ver_a), parse_version(ver_b)
        applies = range_why_not(arch_a, arch_b, ver_a, ver_b) is None
        row = {"case": r["case"], "dtype": r["dtype"], "backend": r.get("backend"), "pass": pas,
               "d": prm.get("d"), "causal": bool(prm.get("causal", False)),
               "aotriton_a": release_name(ver_a), "aotriton_b": release_name(ver_b),
               "arch_a": arch_a, "arch_b": arch_b,
               "ran_a": ran_text(r.get("observed_a"), r.get("kernels_a")),
               "ran_b": ran_text(r.get("observed_b"), r.get("kernels_b")), "flyc_b": ok_b,
               "time_a_ms": float(r["time_a_ms"]), "time_b_ms": float(r["time_b_ms"]), "speedup": sp,
               "published_range": f"{lo:.2f}x-{hi:.2f}x" if applies else pd.NA,
               "in_published_range": bool(lo <= sp <= hi) if applies else pd.NA,
               "published_setup": bool(arch_a == arch_b == "gfx950" and ta is not None and tb is not None
                                       and ta[:2] == (0, 13) and tb == (0, 14, 2)),
               "source": "synthetic example" if synthetic else "measured"}
        row.update(speedup_lo=r.get("ratio_lo"), speedup_hi=r.get("ratio_hi"), label=r.get("verdict"))
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    out["in_published_range"] = out["in_published_range"].astype("boolean")
    out.attrs["names"] = tuple(ab.names)
    return out


def example_paths() -> tuple[Path, Path]:
    """The two synthetic example result files (AOTriton "0.13b" and "0.14.2b" sides, made-up
    numbers; ``data/examples/README.md``), as paths."""

    return tuple(data_dir() / f for f in EXAMPLE_FILES)  # type: ignore[return-value]


def compare_files(path_a, path_b=None, names: Sequence[str] | None = None, backend: str | None = None):
    """Load two result files, pair their attention rows by case (:func:`flyexplore.results.compare.pair`)
    and return ``(ab, view)`` (:func:`ab_view`). ``names`` default to the AOTriton releases the
    files record (``AOTriton 0.13b``, ``AOTriton 0.14.2b``); ``backend`` keeps one SDPA backend
    (e.g. ``flash``). ``path_b`` None: ``path_a`` is one environment A/B file (the two torch
    builds timed round by round: :func:`flyexplore.results.compare.env_sides`; names default to
    the environments'). Files are read with validation (:func:`flyexplore.results.table.validate`,
    as ``flyexplore compare`` reads them). Raises :class:`UsageError` for a missing or invalid
    file, a file without attention rows, or when no case pairs."""

    if path_b is None:
        if not Path(path_a).exists():
            raise UsageError(f"result file not found: {str(path_a)!r}")
        d = R.load(path_a, validated=True)
        d = d[d["op"] == "attention"]
        if d.empty:
            raise UsageError(f"no attention rows in {str(path_a)!r}")
        a, b, envs = env_sides(d)
        if backend is not None:
            a, b = a[a["backend"] == backend], b[b["backend"] == backend]
            if a.empty or b.empty:
                raise UsageError(f"no attention rows for backend {backend!r} in {str(path_a)!r}")
        names = tuple(names) if names is not None else envs
        ab = pair(a, b, tuple(names))
        return ab, ab_view(ab, a, b)
    sides = []
    for path in (path_a, path_b):
        if not Path(path).exists():
            raise UsageError(f"result file not found: {str(path)!r}")
        d = R.load(path, validated=True)
        d = d[d["op"] == "attention"]
        if backend is not None:
            d = d[d["backend"] == backend]
        if d.empty:
            raise UsageError(f"no attention rows{' for backend ' + repr(backend) if backend else ''} in {str(path)!r}")
        sides.append(d)
    a, b = sides
    if names is None:
        names = tuple(f"AOTriton {release_name(_first(d['aotriton']))}" for d in (a, b))
        if names[0] == names[1]:
            names = (names[0] + " (A)", names[1] + " (B)")
    ab = pair(a, b, tuple(names))
    return ab, ab_view(ab, a, b)
