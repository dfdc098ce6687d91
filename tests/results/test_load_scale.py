"""Loading at scale: :func:`flyexplore.results.table.normalize` (what ``load`` runs on every file)
casts the boolean columns once per distinct value and upgrades schema-1 rows as arrays, and
gives the frames the per-row version gave. The per-row version is kept below, frozen (copied
from flyexplore/results/table.py before the change; names prefixed ``_old_``). Do not edit it to
make a test pass: it is the reference."""
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flyexplore.errors import UsageError
from flyexplore.measure.stats import notch_ci
from flyexplore.results import table as R

from conftest import data_file_params, examples, FAST_DATA_FILES, result_file_facts, ROOT


# ---- the OLD implementation, frozen --------------------------------------------------------------

def _old_num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _old_upgrade(df: pd.DataFrame) -> pd.DataFrame:
    if "schema_version" not in df or not len(df):
        return df
    ver = pd.to_numeric(df["schema_version"], errors="coerce")
    newer = ver.max()
    if pd.notna(newer) and newer > R.SCHEMA_VERSION:
        raise UsageError("newer")
    old = (ver < 2).fillna(False).to_numpy()
    if old.any():
        df = df.copy()
        for c in ("order", "ci_method", "time_ci_lo_ms", "time_ci_hi_ms", "rounds", "calls_per_round"):
            if c not in df:
                df[c] = pd.Series([None] * len(df), index=df.index, dtype=object)
            else:
                df[c] = df[c].astype(object)
        for i in df.index[old]:
            r = df.loc[i]
            if r.get("status") != "ok":
                df.at[i, "ci_method"] = "none"
                continue
            lo, hi = notch_ci(_old_num(r.get("time_ms")), _old_num(r.get("time_iqr_ms")), _old_num(r.get("n_samples")))
            df.at[i, "order"] = "block"
            df.at[i, "rounds"] = r.get("n_samples")
            df.at[i, "calls_per_round"] = 1
            df.at[i, "time_ci_lo_ms"], df.at[i, "time_ci_hi_ms"] = lo, hi
            df.at[i, "ci_method"] = "notch"
        df.loc[old, "schema_version"] = R.SCHEMA_VERSION
    return df


def _old_to_bool(v):
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return pd.NA
    if isinstance(v, str):
        return {"true": True, "false": False, "1": True, "0": False}.get(v.lower(), pd.NA)
    return bool(v)


def _old_normalize(df: pd.DataFrame) -> pd.DataFrame:
    df = _old_upgrade(df.copy())
    for c, (t, _) in R.COLUMNS.items():
        if c not in df:
            df[c] = pd.Series([pd.NA] * len(df), dtype=t, index=df.index)
        elif t == "string" and isinstance(df[c].dtype, pd.CategoricalDtype):
            cat = df[c].dtype
            df[c] = df[c].cat.rename_categories(lambda v: str(v)) if not all(
                isinstance(v, str) for v in cat.categories) else df[c]
        else:
            try:
                if t == "boolean":
                    df[c] = df[c].map(_old_to_bool).astype("boolean")
                else:
                    df[c] = df[c].astype(t)
            except (TypeError, ValueError):
                df[c] = pd.to_numeric(df[c], errors="coerce").astype(t) if t in ("Float64", "Int64") else df[c]
    extra = [c for c in df.columns if c not in R.COLUMNS]
    return df[list(R.COLUMNS) + extra].reset_index(drop=True)


# ---- the same frames -------------------------------------------------------------------------------

def _files():
    return sorted(str(p.relative_to(ROOT)) for ext in ("parquet", "csv", "jsonl")
                  for p in (ROOT / "data").rglob(f"*.{ext}"))


def test_the_fast_lanes_data_files_are_all_there():
    """The fast lane's sample of data files (conftest.FAST_DATA_FILES) exists, so the sample cannot
    shrink unseen when a file moves."""
    assert FAST_DATA_FILES <= set(_files()), sorted(FAST_DATA_FILES - set(_files()))


def _same(raw: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(R.normalize(raw), _old_normalize(raw), check_exact=True)


@pytest.mark.parametrize("path", data_file_params([f for f in _files() if result_file_facts(f)["result"]]))
def test_committed_files_normalize_as_before(path):
    """Every committed result file (one with the identity columns: the tables made from results
    are refused by load, tests/results/test_damaged_inputs.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = R._read(ROOT / path, repr(path))
    _same(raw)


_BOOLS = st.sampled_from([True, False, None, math.nan, "true", "False", "TRUE", "1", "0", "yes", "", 1, 0, 2.0,
                          0.0, np.True_, np.False_])


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None, database=None)
@given(cells=st.lists(st.tuples(_BOOLS, _BOOLS), min_size=1, max_size=12),
       old=st.lists(st.booleans(), min_size=12, max_size=12),
       status=st.lists(st.sampled_from(["ok", "error", "unavailable", "published"]), min_size=12, max_size=12))
def test_boolean_cells_and_schema_1_rows_normalize_as_before(cells, old, status):
    rows = []
    for i, (a, b) in enumerate(cells):
        rows.append({"schema_version": 1 if old[i] else 2, "run_id": "r", "op": "gemm", "case": f"{i}x8x8",
                     "dtype": "bf16", "backend": "aten", "status": status[i], "source": "measured",
                     "time_ms": 1.0 + i, "time_iqr_ms": [0.1, None, math.nan, 0.3][i % 4],
                     "n_samples": [10, 0, None, 7][i % 3], "noisy": a, "converged": b})
    raw = pd.DataFrame(rows)
    _same(raw)
    for col in ("noisy", "converged"):   # the same cells as text, as CSV and JSONL read them back
        _same(raw.assign(**{col: raw[col].map(lambda v: None if v is None else str(v))}))


def test_a_boolean_column_with_unhashable_cells():
    raw = pd.DataFrame([{"op": "gemm", "case": "a", "dtype": "bf16", "backend": "aten", "status": "ok",
                         "noisy": [1]}, {"op": "gemm", "case": "b", "dtype": "bf16", "backend": "aten",
                                         "status": "ok", "noisy": []}])
    _same(raw)
    assert R.normalize(raw)["noisy"].tolist() == [True, False]


def test_a_schema_1_row_without_a_status_is_upgraded_without_an_interval():
    raw = pd.DataFrame([{"schema_version": 1, "op": "gemm", "case": "a", "dtype": "bf16", "backend": "aten",
                         "status": None, "time_ms": 1.0, "time_iqr_ms": 0.1, "n_samples": 9}])
    got = R.normalize(raw)
    assert got.loc[0, "ci_method"] == "none" and pd.isna(got.loc[0, "time_ci_lo_ms"])
    assert got.loc[0, "schema_version"] == R.SCHEMA_VERSION


def test_notch_ci_takes_arrays_and_scalars_alike():
    med, iqr, n = np.array([10.0, 5.0, 1.0, np.nan]), np.array([2.0, np.nan, 0.5, 1.0]), np.array([16, 9, 0, 4])
    lo, hi = notch_ci(med, iqr, n)
    for k in range(4):
        want = notch_ci(float(med[k]), float(iqr[k]), int(n[k]))
        np.testing.assert_array_equal([lo[k], hi[k]], want)
    assert all(math.isnan(v) for v in notch_ci(10.0, 2.0, None))   # no count: no interval
