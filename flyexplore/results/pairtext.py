"""An A/B's pairs as text and JSON, what both the summaries (:mod:`flyexplore.results.compare`)
and the CI gate (:mod:`flyexplore.results.gate`) print: a pair's key values as one text
(:func:`case_text`), a ratio with its 95% interval and label, one line per pair within the
terminal's :data:`WIDTH`, the label of a geometric mean's interval, JSON-ready values
(:func:`jsonable`) and one record per pair.
"""
from __future__ import annotations

import math
import textwrap
from typing import Any, Sequence

import numpy as np
import pandas as pd

from flyexplore.measure import stats as S

#: Cases the summary lists as the largest changes, and the gate as the ones that tripped it.
TOP = 5
#: Width of the terminal summary, in characters.
WIDTH = 100


def case_text(row: Any, key: Sequence[str]) -> str:
    """One pair's key values as one text, in key order, missing ones left out
    (``"gemm 2048x4096x4096 bf16 aten"``)."""
    return " ".join(str(row[k]) for k in key if k in row and not _missing(row[k]))


def _missing(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _pct(fraction: float) -> str:
    """``0.05`` -> ``"5%"``, ``0.008`` -> ``"0.8%"`` (up to 3 significant digits)."""
    return f"{fraction * 100:.3g}%"


def _wrap(text: str, width: int = WIDTH) -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent="    ", break_long_words=True, break_on_hyphens=False) or [""]


def _fmt(est, lo, hi, label) -> str:
    """``"0.333x [0.331, 0.336] SLOWER"`` (:func:`flyexplore.measure.stats.fmt_interval`; NA read as NaN)."""
    lab = None if label is None or _missing(label) else str(label)
    return S.fmt_interval(*(float(x) if not _missing(x) else math.nan for x in (est, lo, hi)), lab)


def _case_lines(rows: pd.DataFrame, key: Sequence[str], extra: Sequence[tuple] = (),
                width: int = WIDTH, suffix: Sequence[str] | None = None) -> list[str]:
    """One line per pair of ``rows`` (columns ``ratio``, ``ratio_lo``, ``ratio_hi``,
    ``verdict``), then one per ``extra`` ``(name, est, lo, hi, label)``: ``"  <case>  0.333x
    [0.331, 0.336] SLOWER"``, the numbers in one column, each line within ``width`` (a long
    case cut with ``...``); ``suffix``: a text after each line's numbers (rows, then extras)."""
    items = [(case_text(r, key), _fmt(r["ratio"], r["ratio_lo"], r["ratio_hi"], r["verdict"]))
             for _, r in rows.iterrows()]
    items += [(name, _fmt(*vals)) for name, *vals in extra]
    if suffix is not None:
        items = [(c, num + sfx) for (c, num), sfx in zip(items, list(suffix) + [""] * len(items))]
    if not items:
        return []
    room = max(width - 4 - max(len(num) for _, num in items), 12)
    col = min(max(len(c) for c, _ in items), room)
    return [f"  {(c if len(c) <= col else c[:col - 3] + '...'):<{col}}  {num}" for c, num in items]


def _geomean_label(gm: tuple[float, float, float]) -> str | None:
    """The label of a geometric mean's interval (:func:`flyexplore.measure.stats.verdict`), None without one."""
    _, lo, hi = gm
    return S.verdict(lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def jsonable(v: Any) -> Any:
    """``v`` with every value JSON can hold as itself: NaN, infinities, ``pd.NA`` and ``None``
    as ``None``; numpy scalars as Python numbers; tuples and arrays as lists; dict keys as
    text. Containers are copied, never changed."""
    if isinstance(v, str):   # the common cases first: a pair's record is texts and floats
        return v
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if v is None or _missing(v):
        return None
    return str(v)


def _pair_records(pairs: pd.DataFrame, key: Sequence[str]) -> list[dict]:
    """One dict per pair: ``case_key`` (:func:`case_text`), the key columns, times, ratio,
    interval, label, method and the allowance columns where present (a column pass, no
    per-row Series: 100,000 pairs in about a second)."""
    cols = [c for c in (*key, "time_a_ms", "time_b_ms", "ratio", "ratio_lo", "ratio_hi", "verdict", "interval",
                        "allowance", "allowance_basis", "same_within", "worker_pairs", "pair_sd", "width",
                        "pairs_to_decide", "pairs_to_narrow") if c in pairs]
    texts = [" ".join(str(v) for v in row if not _missing(v))
             for row in pairs[list(key)].itertuples(index=False, name=None)]
    return [{"case_key": t, **r} for t, r in zip(texts, pairs[cols].to_dict("records"))]
