"""Result rows, the versioned schema, load/save, speedups and geometric means.

A result set is a tidy ``pandas.DataFrame``: one row per (operator, case, dtype, requested
backend, run). :data:`COLUMNS` documents every core column; operator parameters (``m``, ``n``,
``k``, ``layout``, ``eps``, ...) follow as one column each and are also kept whole, as JSON, in
``params``. ``source`` says whether a number was ``measured`` here, ``emulated`` (for example
MXFP by dequantize-then-matmul) or ``published`` (copied from a publication; never measured
by flyexplore). Times are milliseconds; throughput TFLOP/s and GB/s.

FlyDSL misses: a row that asked for FlyDSL (backend ``flydsl``) keeps status ``ok`` and its
measured time, but when tracing saw no FlyDSL kernel it has ``flydsl_taken=False``, the kernel
families that did run in ``observed`` and the reason in ``flydsl_reason``. Such a row is never
a FlyDSL number: :func:`speedup` (and so :func:`geomean_speedup` and the figures) leaves out
every row with ``flydsl_taken == False``.

Files: Parquet (``.parquet``), CSV (``.csv``) or JSON Lines (``.jsonl``), chosen by extension.
Writes are atomic (temporary file, then rename), so an interrupted save never damages an
existing file. :data:`SCHEMA_VERSION` is stored in every row; :func:`load` upgrades older rows.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from .errors import UsageError

SCHEMA_VERSION = 1

#: Row status values.
STATUSES = ("ok", "unavailable", "error", "oom", "published")
#: Where a number came from.
SOURCES = ("measured", "emulated", "published")

#: Core columns, in order: name -> (pandas dtype, meaning).
COLUMNS: dict[str, tuple[str, str]] = {
    "schema_version": ("Int64", "result schema version (this is %d)" % SCHEMA_VERSION),
    "run_id": ("string", "id shared by the rows of one sweep"),
    "timestamp": ("string", "UTC time the row was written, ISO 8601"),
    "op": ("string", "operator family: gemm, rmsnorm, topk, ..."),
    "case": ("string", "canonical case label, e.g. 8x4096x4096:NN (dims x-separated, options after ':')"),
    "params": ("string", "all case parameters as a JSON object"),
    "dtype": ("string", "input dtype name: bf16, fp16, fp32, mxfp8, ..."),
    "backend": ("string", "backend requested: aten, triton, inductor, flydsl, ..."),
    "status": ("string", "ok | unavailable (reason in message) | error | oom | published"),
    "message": ("string", "why a row is not ok, or notes on an ok row"),
    "source": ("string", "measured | emulated | published"),
    "timing_mode": ("string", "cpu-wall | event | graph | kernel (see flyexplore.timing)"),
    "time_ms": ("Float64", "headline time: median of the samples, ms"),
    "time_iqr_ms": ("Float64", "interquartile range of the samples, ms"),
    "time_p20_ms": ("Float64", "20th percentile, ms"),
    "time_p80_ms": ("Float64", "80th percentile, ms"),
    "time_min_ms": ("Float64", "fastest sample, ms"),
    "time_mean_ms": ("Float64", "mean of the samples, ms"),
    "n_samples": ("Int64", "number of timed calls"),
    "per_call_ms": ("Float64", "per-call event (or wall) median, kept beside a kernel/graph headline, ms"),
    "first_call_ms": ("Float64", "wall time of the first call (includes torch.compile and autotune), ms"),
    "noisy": ("boolean", "IQR/median > 10%"),
    "host_bound": ("boolean", "per-call time / kernel time > 1.25 (launch overhead dominates)"),
    "flush_bytes": ("Int64", "cache flush buffer zeroed before each timed call, bytes"),
    "flops": ("Float64", "floating-point operations per call"),
    "bytes": ("Float64", "bytes moved per call (ideal: each input read once, output written once)"),
    "tflops": ("Float64", "flops / time, TFLOP/s"),
    "gbps": ("Float64", "bytes / time, GB/s"),
    "err_rel": ("Float64", "relative error against the operator's high-precision reference"),
    "err_max_abs": ("Float64", "max absolute error against the reference"),
    "err_rel_dequant": ("Float64", "scaled GEMM: relative error against the product of the dequantized inputs (the kernel's own error)"),
    "err_tol": ("Float64", "tolerance on err_rel for this dtype"),
    "accuracy_ok": ("boolean", "the operator's correctness check passed (the rule is in accuracy_rule; "
                    "rows without one: err_rel <= err_tol)"),
    "err_bound_ratio": ("Float64", "largest |out - ref| / allowed error over the elements (<= 1 passes; "
                        "the bound is stated in accuracy_rule)"),
    "err_row_max_rel": ("Float64", "relative error of the worst row (RMSNorm row, GEMM output row, attention "
                        "query row; TopK: max |diff| / max |ref| per row)"),
    "err_block_max_rel": ("Float64", "relative error of the worst block: 32x32 output tile (gemm, scaled_gemm), "
                          "group (grouped_gemm), head (attention)"),
    "err_fail_count": ("Int64", "elements failing the check (over their bound, or a NaN/Inf mismatch; "
                       "TopK: value positions differing from the reference)"),
    "nonfinite_matched": ("Int64", "NaN/Inf output elements where the reference has the same (a match)"),
    "nonfinite_mismatch": ("Int64", "NaN/Inf on one side only, or unequal (a failure)"),
    "index_errors": ("Int64", "TopK: indices out of range, repeated in a row, or not gathering their value"),
    "order_errors": ("Int64", "TopK: rows out of order though sorted=True"),
    "tie_order_diffs": ("Int64", "TopK: indices differing from the reference's only among equal values "
                        "(allowed, not a failure)"),
    "accuracy_rule": ("string", "the check behind accuracy_ok, with its tolerance and where it comes from"),
    "kernels": ("string", "JSON list of [kernel name, launches per call, device us per call] (kernel mode)"),
    "observed": ("string", "kernel families seen for the call (filled by tracing), comma-separated, "
                 "by time; 'CPU: ...' when the call ran on the CPU (no device kernels)"),
    "flydsl_reason": ("string", "for a flydsl request: why FlyDSL was or was not taken (the FlyDSL kernels "
                      "seen, the autotune decision that picked another backend, or the explainer's reason)"),
    "flydsl_taken": ("boolean", "for a flydsl request: True = FlyDSL kernels ran, False = they did not (the "
                     "time is of the fallback; speedup() leaves the row out), NA = not traced or unknown (an unclassified "
                     "kernel or no kernel record; kept, flydsl_reason says why)"),
    "autotune": ("string", "JSON list of Inductor autotune decisions made while compiling the call: op, "
                 "winner, winner_family, candidates [name, family, time_ms, description]"),
    "platform": ("string", "cpu | cuda | rocm"),
    "device": ("string", "device name, e.g. NVIDIA H200, AMD Instinct MI355X"),
    "arch": ("string", "gfx950, sm_90, x86_64, ..."),
    "torch": ("string", "torch version"),
    "triton": ("string", "Triton version"),
    "flydsl": ("string", "flydsl version or 'not installed'"),
    "aotriton": ("string", "AOTriton version from the bundled library, or 'not present'"),
    "gpu_runtime": ("string", "HIP or CUDA version"),
    "python": ("string", "Python version"),
    "host": ("string", "host name"),
    "env_id": ("string", "hash of the environment fingerprint"),
    "flyexplore": ("string", "flyexplore version that wrote the row"),
}

KEY = ("op", "case", "dtype", "backend")


def empty_frame() -> pd.DataFrame:
    """An empty result set with every core column at its dtype."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, (t, _) in COLUMNS.items()})


def _upgrade(df: pd.DataFrame) -> pd.DataFrame:
    """Bring rows of older schema versions to :data:`SCHEMA_VERSION` (none older exist yet)."""
    if "schema_version" in df and len(df):
        newer = pd.to_numeric(df["schema_version"], errors="coerce").max()
        if pd.notna(newer) and newer > SCHEMA_VERSION:
            raise UsageError(f"result file has schema version {int(newer)}, newer than this "
                             f"flyexplore understands ({SCHEMA_VERSION}); upgrade flyexplore")
    return df


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Add missing core columns (as NA), order core columns first, and cast them to their
    documented dtypes. Extra columns (operator parameters) are kept after the core ones.
    A text core column that is a pandas ``Categorical`` stays categorical, with its categories
    in their order (as text) and its ``ordered`` flag."""
    df = _upgrade(df.copy())
    for c, (t, _) in COLUMNS.items():
        if c not in df:
            df[c] = pd.Series([pd.NA] * len(df), dtype=t, index=df.index)
        elif t == "string" and isinstance(df[c].dtype, pd.CategoricalDtype):
            # a categorical text column keeps its categories and their order (a plot's order)
            cat = df[c].dtype
            df[c] = df[c].cat.rename_categories(lambda v: str(v)) if not all(
                isinstance(v, str) for v in cat.categories) else df[c]
        else:
            try:
                if t == "boolean":
                    df[c] = df[c].map(_to_bool).astype("boolean")
                else:
                    df[c] = df[c].astype(t)
            except (TypeError, ValueError):
                df[c] = pd.to_numeric(df[c], errors="coerce").astype(t) if t in ("Float64", "Int64") else df[c]
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[list(COLUMNS) + extra].reset_index(drop=True)


def _to_bool(v):
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return pd.NA
    if isinstance(v, str):
        return {"true": True, "false": False, "1": True, "0": False}.get(v.lower(), pd.NA)
    return bool(v)


def frame(rows: Iterable[dict]) -> pd.DataFrame:
    """A normalized result set from row dicts."""
    rows = list(rows)
    return normalize(pd.DataFrame(rows)) if rows else empty_frame()


def validate(df: pd.DataFrame) -> None:
    """Raise ``ValueError`` if ``df`` breaks the schema: a missing core column, an unknown
    status or source, an ``ok`` row without a positive time, or a duplicate key in one run."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"missing columns: {missing}")
    bad = set(df["status"].dropna()) - set(STATUSES)
    if bad:
        raise ValueError(f"unknown status {sorted(bad)} (valid: {STATUSES})")
    bad = set(df["source"].dropna()) - set(SOURCES)
    if bad:
        raise ValueError(f"unknown source {sorted(bad)} (valid: {SOURCES})")
    ok = df[df["status"] == "ok"]
    if len(ok) and not (ok["time_ms"].notna() & (ok["time_ms"] > 0)).all():
        raise ValueError("an ok row has no positive time_ms")
    dup = df.duplicated(subset=["run_id", *KEY], keep=False)
    if dup.any():
        raise ValueError(f"duplicate rows for {df.loc[dup, list(KEY)].iloc[0].tolist()}")


def _atomic_write(path: Path, writer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


FORMATS = (".parquet", ".csv", ".jsonl")


def check_path(path: str | os.PathLike) -> Path:
    """Check that results can be written to ``path`` (known extension, writable folder).
    Raises :class:`UsageError` naming the path."""
    p = Path(path)
    if p.suffix not in FORMATS:
        raise UsageError(f"unknown result file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join(FORMATS)})")
    parent = p.parent if str(p.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=".flyexplore-probe.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"cannot write output file {str(p)!r}: {exc.strerror or exc}") from None
    if p.exists() and (p.is_dir() or not os.access(p, os.W_OK)):
        raise UsageError(f"cannot write output file {str(p)!r}: not a writable file")
    return p


def _json_value(v):
    """A cell as a JSON value: None for NA, Python int/float/bool/str otherwise."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()  # numpy scalar -> Python
    return v if isinstance(v, (bool, int, float, str)) else str(v)


def write_jsonl(df: pd.DataFrame, path) -> None:
    """One JSON object per row, floats written by ``repr`` (``json.dumps``), which round-trips
    every float64 exactly (pandas' ``to_json`` keeps at most 15 significant digits: 3.3e-12
    becomes 0.0 at its default of 10). NA is ``null``; +-inf are ``Infinity``/``-Infinity``."""
    cols = list(df.columns)
    with open(path, "w", encoding="utf-8") as f:
        for row in df.itertuples(index=False, name=None):
            f.write(json.dumps({c: _json_value(v) for c, v in zip(cols, row)}, allow_nan=True) + "\n")


def save(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` to ``path`` (.parquet, .csv or .jsonl), atomically. Returns the path.
    Every format keeps float64 values exactly (JSONL by :func:`write_jsonl`). Parquet also keeps
    categorical columns (and their order); CSV and JSONL cannot, so saving a frame with
    categorical columns there warns (``UserWarning``) naming them."""
    p = check_path(path)
    df = normalize(df)
    cats = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
    if cats and p.suffix != ".parquet":
        import warnings
        warnings.warn(f"{p.suffix} files do not store categorical order; columns {', '.join(cats)} "
                      "load back as text (save as .parquet to keep it)", UserWarning, stacklevel=2)
    if p.suffix == ".parquet":
        _atomic_write(p, lambda t: df.to_parquet(t, index=False))
    elif p.suffix == ".csv":
        _atomic_write(p, lambda t: df.to_csv(t, index=False))
    else:
        _atomic_write(p, lambda t: write_jsonl(df, t))
    return p


def load(path: str | os.PathLike) -> pd.DataFrame:
    """Read a result file written by :func:`save` (or a sweep's ``.partial.jsonl`` journal).
    Raises :class:`UsageError` if it is missing or of an unknown format."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"result file not found: {str(p)!r}")
    if p.suffix == ".parquet":
        df = pd.read_parquet(p)
    elif p.suffix == ".csv":
        df = pd.read_csv(p, dtype={"case": str, "params": str, "kernels": str})
    elif p.suffix == ".jsonl":
        lines = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        df = pd.DataFrame(lines)
    else:
        raise UsageError(f"unknown result file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join(FORMATS)})")
    return normalize(df)


def concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate result sets, keeping every column."""
    frames = [normalize(f) for f in frames if len(f)]
    return normalize(pd.concat(frames, ignore_index=True)) if frames else empty_frame()


def geomean(values: Iterable[float]) -> float:
    """Geometric mean exp(mean(log v)) of positive values; NaN when there are none.
    Raises ``ValueError`` for a value <= 0."""
    vals = [float(v) for v in values if v is not None and not pd.isna(v)]
    if not vals:
        return float("nan")
    if any(v <= 0 for v in vals):
        raise ValueError(f"geometric mean needs positive values, got {min(vals)}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


#: Ratios within this fraction of 1.0 count as ties (the published dense suite's rule).
TIE_BAND = 0.01


def speedup(df: pd.DataFrame, baseline: str | Sequence[str] = "aten",
            by: Sequence[str] = ("op", "case", "dtype")) -> pd.DataFrame:
    """Speedup of every backend against ``baseline`` per case: baseline time / backend time.

    ``baseline`` is one backend, or several: then the faster of them at each case (the
    published dense suite compares FlyDSL with the faster of ATen and Triton). Only ``ok`` and
    ``published`` rows with a time count, and never a row with ``flydsl_taken == False`` (a
    FlyDSL request that ran another kernel); when one key has several rows (several runs) the
    median time is used. Returns columns ``*by, backend, time_ms, baseline, baseline_ms,
    speedup, tie, source`` (one row per case and non-baseline backend).
    """
    bases = [baseline] if isinstance(baseline, str) else list(baseline)
    d = df[df["status"].isin(["ok", "published"]) & df["time_ms"].notna()]
    if "flydsl_taken" in d:  # a FlyDSL request that ran something else is not a FlyDSL time
        d = d[~(d["flydsl_taken"].astype("boolean") == False).fillna(False)]  # noqa: E712
    if d.empty:
        return pd.DataFrame(columns=[*by, "backend", "time_ms", "baseline", "baseline_ms",
                                     "speedup", "tie", "source"])
    t = d.groupby([*by, "backend"], dropna=False, sort=False).agg(
        time_ms=("time_ms", "median"), source=("source", "first")).reset_index()
    b = t[t["backend"].isin(bases)]
    if b.empty:
        raise UsageError(f"no rows for baseline {', '.join(bases)} "
                         f"(backends present: {', '.join(sorted(t['backend'].unique()))})")
    best = b.loc[b.groupby(list(by), dropna=False, sort=False)["time_ms"].idxmin()]
    best = best[[*by, "backend", "time_ms"]].rename(columns={"backend": "baseline", "time_ms": "baseline_ms"})
    out = t[~t["backend"].isin(bases)].merge(best, on=list(by), how="inner")
    out["speedup"] = out["baseline_ms"].astype(float) / out["time_ms"].astype(float)
    out["tie"] = (out["speedup"] - 1.0).abs() <= TIE_BAND
    return out[[*by, "backend", "time_ms", "baseline", "baseline_ms", "speedup", "tie", "source"]]


def geomean_speedup(df: pd.DataFrame, baseline: str | Sequence[str] = "aten",
                    by: Sequence[str] = ("op", "case", "dtype")) -> pd.DataFrame:
    """Geometric-mean speedup per (op, dtype, backend) over the cases both sides have."""
    s = speedup(df, baseline, by)
    if s.empty:
        return pd.DataFrame(columns=["op", "dtype", "backend", "cases", "geomean"])
    g = s.groupby(["op", "dtype", "backend"], sort=False)["speedup"]
    return g.agg(cases="count", geomean=lambda v: geomean(v)).reset_index()
