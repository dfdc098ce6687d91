"""Result rows: the versioned schema, its validation, load/save.

A result set is a tidy ``pandas.DataFrame``: one row per (operator, case, dtype, requested
backend, run). :data:`COLUMNS` documents every core column; operator parameters (``m``, ``n``,
``k``, ``layout``, ``eps``, ...) follow as one column each and are also kept whole, as JSON, in
``params``. ``source`` says whether a number was ``measured`` here, ``emulated`` (for example
MXFP by dequantize-then-matmul) or ``published`` (copied from a publication; never measured
by flyexplore). Times are milliseconds; throughput TFLOP/s and GB/s.

FlyDSL misses: a row that asked for FlyDSL (backend ``flydsl``) keeps status ``ok`` and its
measured time, but when tracing saw no FlyDSL kernel it has ``flydsl_taken=False``, the kernel
families that did run in ``observed`` and the reason in ``flydsl_reason``. Such a row is never
a FlyDSL number: :func:`~flyexplore.results.speedups.speedup` (and so
:func:`~flyexplore.results.speedups.geomean_speedup` and the figures) leaves out every row with
``flydsl_taken == False``.

Files: Parquet (``.parquet``), CSV (``.csv``) or JSON Lines (``.jsonl``), chosen by extension.
Writes are atomic (temporary file, then rename), so an interrupted save never damages an
existing file. :data:`SCHEMA_VERSION` is stored in every row; :func:`load` upgrades older rows.
:func:`load` refuses, in one :class:`UsageError` line naming the file, whatever is not a whole
result file: unreadable, empty, cut short (a CSV not ending in a newline has a torn last row),
damaged, or a table without the :data:`IDENTITY_COLUMNS`; ``load(path, validated=True)`` (what
``flyexplore report``, ``compare``, ``export`` and ``fx.load`` read with) also applies
:func:`validate`, and :func:`checked` applies it to rows given as a DataFrame (``fx.speedup``,
``fx.report``, ``fx.compare``, ...): one validation for the command line and the Python API.

Speedups and geometric means with their intervals are :mod:`flyexplore.results.speedups`; the arms
of an environment A/B (``backend@env``) and the default baseline are :mod:`flyexplore.results.arms`.
Both are re-exported at the end of this module, so ``R.speedup``, ``R.split_arm``, ... (``from
flyexplore.results import table as R``) keep working.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from flyexplore.atomic import write_file
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.measure.stats import notch_ci
from flyexplore.measure.timing import rounds_from_json
from flyexplore.results import samples as SP
from flyexplore.results.schema_version import SCHEMA_VERSION  # noqa: F401 - R.SCHEMA_VERSION

#: Row status values.
STATUSES = ("ok", "unavailable", "error", "oom", "published", "crashed", "timeout", "refused")
#: Where a number came from.
SOURCES = ("measured", "emulated", "published")

#: Core columns, in order: name -> (pandas dtype, meaning).
COLUMNS: dict[str, tuple[str, str]] = {
    "schema_version": ("Int64", "result schema version (this is %d)" % SCHEMA_VERSION),
    "run_id": ("string", "id shared by the rows of one sweep"),
    "plan": ("string", "fingerprint of what the sweep that wrote the row measured and how "
             "(flyexplore.run.spec.SweepSpec.plan_fingerprint); a --resume with another plan is refused"),
    "timestamp": ("string", "UTC time the row was written, ISO 8601"),
    "op": ("string", "operator family: gemm, rmsnorm, topk, ..."),
    "case": ("string", "canonical case label, e.g. 8x4096x4096:NN (dims x-separated, options after ':')"),
    "params": ("string", "all case parameters as a JSON object"),
    "dtype": ("string", "input dtype name: bf16, fp16, fp32, mxfp8, ..."),
    "backend": ("string", "backend requested: aten, triton, inductor, flydsl, ..."),
    "status": ("string", "ok | unavailable (reason in message) | error | oom | published | crashed (the "
               "worker process died in this case: signal or exit code and its last stderr lines in message) | "
               "timeout (the case ran past --case-timeout; its worker was killed) (flyexplore.run.engine) | "
               "refused (not run: its estimated memory, in message, is over the device's free memory or "
               "--max-memory; flyexplore.run.cases)"),
    "message": ("string", "why a row is not ok, or notes on an ok row"),
    "source": ("string", "measured | emulated | published"),
    "timing_mode": ("string", "cpu-thread | cpu-wall | event-gated | event | graph | kernel (see flyexplore.measure.timing)"),
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
    # -- schema 2: intervals, raw samples, verdicts, device state (flyexplore.measure.stats, .devstate)
    "order": ("string", "interleaved (backends of a case timed in shared rounds, A B A B ...) | block "
              "(one backend's calls, then the next: schema-1 rows and --order block)"),
    "rounds": ("Int64", "timed rounds (interleaved) or timed calls (block)"),
    "calls_per_round": ("Int64", "calls of this backend in each round (1 for block order)"),
    "samples_ms": ("string", "raw samples: JSON list of rounds, each a list of call times, ms"),
    "time_ci_lo_ms": ("Float64", "95% interval of time_ms, low end (order statistics of the round medians), ms"),
    "time_ci_hi_ms": ("Float64", "95% interval of time_ms, high end, ms"),
    "ci_method": ("string", "how the intervals were computed: order-statistic | notch (schema 1: "
                  "median +- 1.57 IQR/sqrt(n), approximate) | none"),
    "converged": ("boolean", "the case stopped at its target: every speedup label decided (99% interval) "
                  "or settled at a band edge, and every median's interval within ci_target (stop_reason=target)"),
    "ci_target": ("Float64", "stopping target: relative half-width of every interval (0.01 = +-1%)"),
    "baseline": ("string", "backend the speedup columns compare with (same case, same rounds)"),
    "speedup": ("Float64", "baseline time / this backend's time (median of paired per-round ratios)"),
    "speedup_lo": ("Float64", "95% interval of speedup, low end"),
    "speedup_hi": ("Float64", "95% interval of speedup, high end"),
    "verdict": ("string", "FASTER | SAME | SLOWER | AMBIGUOUS against the baseline (flyexplore.measure.stats.verdict)"),
    "band": ("Float64", "equivalence band of the SAME label (0.01 = +-1%)"),
    "wall_s": ("Float64", "wall time of the case's timing (warm-up and all rounds, all backends), s"),
    "verdict_s": ("Float64", "wall time until every speedup label of the case was first decided (99% interval "
                  "inside the band or beyond an edge) or settled at a band edge, s"),
    "stop_reason": ("string", "why the case's rounds ended: target | precision_cap (labels decided, medians "
                    "not yet within ci_target) | label_cap (a label undecided) | budget | max_rounds "
                    "(flyexplore.measure.interleaved.STOP_REASONS)"),
    "processes": ("Int64", "fresh worker processes whose measurements this row combines (sweep --processes; "
                  "flyexplore.run.processes); its intervals then cover another run. Missing: 1"),
    "process_estimates": ("string", "JSON list, one object per process: time_ms, time_se (log standard error "
                          "within that process), speedup, speedup_se, rounds, wall_s, verdict_s, clock_mhz_min, worker"),
    "recheck_ok": ("boolean", "output checked again after timing, on fresh input values, within tolerance"),
    "device_id": ("string", "physical device: GPU UUID (NVIDIA) or PCI bus id (AMD)"),
    "clock_mhz_start": ("Float64", "SM/GFX clock read at the start of the case, MHz (NVML / amdsmi)"),
    "clock_mhz_end": ("Float64", "SM/GFX clock read at the end of the case, MHz"),
    "clock_mhz_min": ("Float64", "lowest SM/GFX clock read during the case (start, each round, end), MHz"),
    "clock_mhz_max": ("Float64", "the device's maximum SM/GFX clock, MHz"),
    "power_w_start": ("Float64", "board power at the start of the case, W"),
    "power_w_end": ("Float64", "board power at the end of the case, W"),
    "temp_c_start": ("Float64", "GPU temperature at the start of the case, C"),
    "temp_c_end": ("Float64", "GPU temperature at the end of the case, C"),
    "throttled": ("boolean", "clock_mhz_min < 80% of clock_mhz_max (flyexplore.measure.devstate.THROTTLE_FRACTION)"),
    "throttle_reasons": ("string", "clock-event reasons NVML reported at start/end (sw_power_cap, hw_thermal, ...)"),
    "round_clock_mhz": ("string", "JSON list: the clock read at the start of each round, MHz"),
    "time_cycles": ("Float64", "median over rounds of round time x clock read in that round: an estimate "
                    "in SM clock cycles (clocks are instantaneous readings)"),
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
    "peak_mem_bytes": ("Float64", "GPU: torch.cuda.max_memory_allocated during the backend's build and first call "
                       "(compile, autotune), bytes -- what the case already held (inputs, a model's weights, the "
                       "backends built before it) included; empty on the CPU"),
    "breakdown": ("string", "JSON of one profiled call by kernel category (families with model hooks, other, "
                  "idle): flyexplore.insight.breakdown.Breakdown.to_dict; the model family's rows"),
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
    "flyexplore_commit": ("string", "flyexplore's git commit that wrote the row; '-dirty' after it: tracked files "
                          "had changed since, '-dirty?': unknown whether they had (FLYEXPLORE_COMMIT given "
                          "without FLYEXPLORE_DIRTY); empty: unknown, as in files written before the column "
                          "(flyexplore.world.env.git_commit, Environment.code_columns)"),
    "torch_git": ("string", "torch's git version (torch.version.git_version)"),
    "blas_library": ("string", "the BLAS library torch prefers for GEMMs (cublas, cublaslt, hipblaslt, ck; "
                     "'cpu: mkl' on the CPU): with tunableop, what decides ATen's GEMM kernel "
                     "(flyexplore.world.env.blas_state)"),
    "tunableop": ("string", "TunableOp: off | on, tuning | on, no tuning (PYTORCH_TUNABLEOP_ENABLED)"),
    # -- environment A/B (flyexplore sweep --env; flyexplore.run.envab): rows of one case timed
    # round by round across worker processes of several environments; backend reads backend@env
    "env": ("string", "the environment of an environment A/B (sweep --env NAME...); its backend column "
            "reads backend@env (an arm)"),
    "env_python": ("string", "the interpreter the environment's worker ran"),
    "env_changes": ("string", "JSON object: the environment variables the environment set (null: removed)"),
    "inputs_digest": ("string", "BLAKE2b digest of the case's inputs as this environment built them from the "
                      "seed (flyexplore.run.build.inputs_digest): equal across the environments of an A/B"),
    "cross_env_err_rel": ("Float64", "||output - base environment's output|| / ||base output|| for the same "
                          "case (the base environment's own backend, or its baseline's)"),
    "cross_env_ok": ("boolean", "cross_env_err_rel within 2x the dtype's tolerance and the same NaN/Inf "
                     "(flyexplore.run.build.output_difference)"),
    "cross_env_note": ("string", "what else differs between this output and the base environment's"),
    "turn_overhead_ms": ("Float64", "median cost of handing the GPU to this case's workers in turn: a turn's "
                         "round trip less the worker's time inside it, ms (what an A/B pays per turn)"),
    # -- engine (flyexplore.run.engine): where the case ran
    "worker": ("string", "where the case ran: in-process | <place>/pid<pid> of a worker process (cuda:1, "
               "cpu0) | ray:<node ip>:<slot>/pid<pid> of a Ray actor"),
}

KEY = ("op", "case", "dtype", "backend")

def empty_frame() -> pd.DataFrame:
    """An empty result set with every core column at its dtype."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, (t, _) in COLUMNS.items()})


def _upgrade(df: pd.DataFrame) -> pd.DataFrame:
    """Bring rows of older schema versions to :data:`SCHEMA_VERSION`.

    Version 1 -> 2: rows were timed block-wise and kept no samples, so ``order`` is ``block``,
    ``rounds`` is ``n_samples`` and the interval of ``time_ms`` is the approximate box-plot
    notch from the stored IQR (:func:`flyexplore.measure.stats.notch_ci`), marked ``ci_method=notch``.
    Published rows get no interval."""
    if "schema_version" not in df or not len(df):
        return df
    ver = pd.to_numeric(df["schema_version"], errors="coerce")
    newer = ver.max()
    if pd.notna(newer) and newer > SCHEMA_VERSION:
        raise UsageError(f"result file has schema version {int(newer)}, newer than this "
                         f"flyexplore understands ({SCHEMA_VERSION}); upgrade flyexplore")
    old = (ver < 2).fillna(False).to_numpy()
    if old.any():
        df = df.copy()
        for c in ("order", "ci_method", "time_ci_lo_ms", "time_ci_hi_ms", "rounds", "calls_per_round"):
            if c not in df:
                df[c] = pd.Series([None] * len(df), index=df.index, dtype=object)
            else:
                df[c] = df[c].astype(object)
        ok = old & df["status"].eq("ok").fillna(False).to_numpy(dtype=bool)

        def num(c):
            return pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan) if c in df \
                else np.full(len(df), np.nan)

        lo, hi = notch_ci(num("time_ms")[ok], num("time_iqr_ms")[ok], num("n_samples")[ok])
        df.loc[old & ~ok, "ci_method"] = "none"
        df.loc[ok, "order"] = "block"
        df.loc[ok, "rounds"] = df.loc[ok, "n_samples"].to_numpy(dtype=object) if "n_samples" in df else None
        df.loc[ok, "calls_per_round"] = 1
        df.loc[ok, "time_ci_lo_ms"] = lo
        df.loc[ok, "time_ci_hi_ms"] = hi
        df.loc[ok, "ci_method"] = "notch"
        df.loc[old, "schema_version"] = SCHEMA_VERSION
    return df


#: Whether this pandas copies on write (pandas >= 3): a shallow copy is then a copy.
_COPY_ON_WRITE = int(pd.__version__.split(".")[0]) >= 3
#: Each core column's pandas dtype (:data:`COLUMNS`), made once.
_DTYPES = {c: pd.api.types.pandas_dtype(t) for c, (t, _) in COLUMNS.items()}


def group_codes(columns: Sequence) -> np.ndarray:
    """The group of each row by the values of ``columns`` (Series or arrays of one length; a
    missing value is a value of its own), numbered 0, 1, ... in order of first appearance (int64):
    what ``groupby(columns, sort=False, dropna=False).ngroup()`` gives, from one factorize a
    column and one of the combined codes (no groupby, no tuples). The speedup rules' cases and
    validation's duplicate keys."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    span = 1
    for col in columns:
        codes, uniques = pd.factorize(col, use_na_sentinel=False)
        n = max(len(uniques), 1)
        if span * n >= 2 ** 62:   # too many distinct combinations for one int64: renumber first
            key = pd.factorize(key)[0].astype(np.int64)
            span = int(key.max()) + 1 if key.size else 1
        key = key * n + codes
        span *= n
    return pd.factorize(key)[0]


def without_attrs(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as a frame of the same columns without ``attrs`` (a shallow copy, which the rules
    only read): pandas deep-copies
    a frame's ``attrs`` into the result of every operation (``__finalize__``), and a sweep's
    ``attrs["sweeps"]`` lists its plan's every case -- 10,000 rows of a 3,400-case sweep spent
    3 s of a 3.3 s ``fx.speedup`` copying it. The rules read rows, never ``attrs``."""
    # pandas >= 3: the constructor makes a shallow copy without attrs (0.6 ms at 10,000 rows);
    # before it, the constructor shares the manager, so a shallow copy (and one copy of attrs)
    out = pd.DataFrame(df) if _COPY_ON_WRITE else df.copy(deep=False)
    if out.attrs:
        out.attrs = {}
    return out


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Add missing core columns (as NA), order core columns first, and cast them to their
    documented dtypes. Extra columns (operator parameters) are kept after the core ones.
    A text core column that is a pandas ``Categorical`` stays categorical, with its categories
    in their order (as text) and its ``ordered`` flag."""
    # pandas >= 3 copies on write, so a shallow copy is a copy; before it, a deep one
    df = _upgrade(df.copy(deep=not _COPY_ON_WRITE))
    had = df.dtypes.to_dict() if df.columns.is_unique else {}   # one look-up, not a column each
    for c, (t, _) in COLUMNS.items():
        if c not in df:
            df[c] = pd.Series([pd.NA] * len(df), dtype=t, index=df.index)
        elif had.get(c) == _DTYPES[c]:
            continue   # already its type (a frame normalized before): no cast, no copy
        elif t == "string" and isinstance(df[c].dtype, pd.CategoricalDtype):
            # a categorical text column keeps its categories and their order (a plot's order)
            cat = df[c].dtype
            df[c] = df[c].cat.rename_categories(lambda v: str(v)) if not all(
                isinstance(v, str) for v in cat.categories) else df[c]
        else:
            try:
                if t == "boolean":
                    df[c] = _as_boolean(df[c])
                else:
                    df[c] = df[c].astype(t)
            except (TypeError, ValueError):
                df[c] = pd.to_numeric(df[c], errors="coerce").astype(t) if t in ("Float64", "Int64") else df[c]
    extra = [c for c in df.columns if c not in COLUMNS]
    if list(df.columns) == [*COLUMNS, *extra] and isinstance(df.index, pd.RangeIndex) and df.index.start == 0 \
            and df.index.step == 1:
        return df   # the columns in order and the index 0..n-1 already (a copy, made above)
    return df[list(COLUMNS) + extra].reset_index(drop=True)


def _as_boolean(col: pd.Series) -> pd.Series:
    """``col`` as pandas ``boolean`` by :func:`_to_bool`, applied once per distinct value
    (``pandas.factorize``), not once per row: True/False, 1/0, "true"/"false"/"1"/"0" in any
    case; anything else (missing, other text) NA."""
    if isinstance(col.dtype, pd.BooleanDtype):
        return col
    try:
        codes, uniques = pd.factorize(col, use_na_sentinel=True)
    except TypeError:  # an unhashable cell (a list): one value at a time
        return col.map(_to_bool).astype("boolean")
    table = pd.array([_to_bool(u) for u in uniques] + [pd.NA], dtype="boolean")
    return pd.Series(table[codes], index=col.index, name=col.name)   # code -1 (missing): the last, NA


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


#: Largest relative difference between an ``ok`` row's stored ``time_ms`` and the time its own
#: ``samples_ms`` give (:func:`sample_times`) that :func:`validate` lets pass. The samples are
#: stored to 6 significant digits (:func:`flyexplore.measure.timing.samples_json`), so each is
#: within 5e-6 of the exact time it stands for, and so is any median or geometric mean of them
#: (the committed H200 and CPU sweeps differ by at most 2.2e-6); twice that bound. A time edited
#: by hand (doubled, or moved by 0.01%) is far outside it.
SAMPLES_RTOL = 1e-5


def _row_name(df: pd.DataFrame, i: int) -> str:
    """``row 3 (gemm 8x64x64 fp32 aten, run r1)``: row position ``i`` (from 0, as ``df.iloc``
    takes it) and its key, missing values left out."""
    r = df.iloc[i]
    key = " ".join(str(r[c]) for c in KEY if c in df and not pd.isna(r[c]))
    run = r["run_id"] if "run_id" in df else None
    return f"row {i} ({key}{'' if run is None or pd.isna(run) else f', run {run}'})"


def _and_more(n: int, what: str = "rows like it") -> str:
    """``" (3 rows like it)"`` for ``n`` > 1 offending rows, else ``""``."""
    return f" ({n} {what})" if n > 1 else ""


def sample_times(df: pd.DataFrame, positions: np.ndarray) -> np.ndarray:
    """The ``time_ms`` each row at ``positions`` (int, from 0) should hold by its own
    ``samples_ms``, as the sweep derives it: the median of the per-round medians
    (:attr:`flyexplore.measure.timing.Measurement.median`); for a row combining several fresh
    processes (``processes`` >= 2: ``sweep --processes``, an environment A/B's pairs) the geometric
    mean of each process's median, the stored rounds split in pass order by each process's
    ``rounds`` in ``process_estimates`` (:func:`flyexplore.run.processes.combine`). NaN (float64,
    ms) where it cannot be told: no samples, a non-finite sample, or process rounds that do not
    add up to the stored rounds. Raises :class:`flyexplore.results.samples.BadSamples` (its
    ``position`` the row's position in ``df``) for a text that is not a JSON list of rounds."""
    positions = np.asarray(positions, dtype=np.int64)
    out = np.full(positions.size, np.nan)
    if "samples_ms" not in df or not positions.size:
        return out
    out[:] = SP.column_medians(df["samples_ms"], positions)
    procs = (pd.to_numeric(df["processes"].iloc[positions], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
             if "processes" in df else np.full(positions.size, np.nan))
    texts = df["process_estimates"] if "process_estimates" in df else None
    multi = np.flatnonzero(procs >= 2)
    parsed = dict(zip(multi.tolist(), SP.parse_column(df["samples_ms"], positions[multi]))) if multi.size else {}
    for k in multi.tolist():
        out[k] = np.nan
        p = parsed[k]
        counts = [e.get("rounds") for e in process_estimates(texts.iloc[positions[k]])] if texts is not None else []
        if len(counts) < 2 or not all(isinstance(c, int) and c >= 0 for c in counts) or sum(counts) != p.rounds:
            continue
        if p.values.size == p.rounds:   # no empty round: the per-round medians split as they are
            parts = np.split(p.values, np.cumsum(counts)[:-1])
        else:
            rounds = rounds_from_json(df["samples_ms"].iloc[positions[k]])
            ends = np.cumsum(counts)
            parts = [S.round_values(rounds[e - c:e]) for e, c in zip(ends, counts)]
        meds = np.asarray([np.median(v) if v.size else np.nan for v in parts], dtype=float)
        meds = meds[np.isfinite(meds) & (meds > 0)]   # as between_process leaves them out
        if meds.size:
            out[k] = math.exp(float(np.mean(np.log(meds))))
    release_arrow_memory()   # the parser's buffers
    return out


def _missing(v) -> bool:
    """Whether one cell is missing (None, NA, NaN); False for a list or other non-scalar."""
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _number_text(v) -> str:
    """A cell as a message shows it: ``%g`` of a number, else its repr."""
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return repr(v)


def validate(df: pd.DataFrame, raw: pd.DataFrame | None = None) -> None:
    """Raise ``ValueError``, one line, at the first way the result rows ``df`` (normalized:
    :func:`normalize`) break the schema. What ``flyexplore report``, ``compare`` and ``export``
    read files with (:func:`load` with ``validated=True``, :func:`load_set`) and what the public
    functions check (``fx.load``, ``fx.speedup``, ``fx.report``, ``fx.compare``, ...): one rule
    for the command line and the Python API. In order:

    - a missing core column (:data:`COLUMNS`);
    - an unknown ``status`` (:data:`STATUSES`) or ``source`` (:data:`SOURCES`);
    - an ``ok`` row without a positive ``time_ms``: a file without the column, an empty cell,
      text (``'fast'``), zero, a negative number;
    - two rows of one key (:data:`KEY`) in one run (``run_id``);
    - an ``ok`` row whose ``time_ms`` is not the time its own ``samples_ms`` give
      (:func:`sample_times`: the median of the rounds' medians, or the geometric mean of the
      processes' medians), off by more than :data:`SAMPLES_RTOL` (relative); rows without
      samples are not checked. Such a row is refused, not flagged: the report's and the
      summary's times are ``time_ms`` while the speedups and their labels come from the samples,
      so a hand-edited time would stand beside a label it contradicts (a doubled time beside
      ``1.000x SAME``), and the ``compare --fail-on`` gate would pass on it;
    - a ``samples_ms`` text of an ``ok`` row that is not a JSON list of rounds of numbers.

    The message names the column, the first offending row (its position from 0, as ``df.iloc``
    takes it, the header not counted) by key and run, the value, and how many rows break the
    same rule. ``raw``: the rows as read or given, before :func:`normalize` (which
    reads a cell that is no number as missing), so that the message quotes the cell as it was
    (``got 'fast'``) and says when the ``time_ms`` column is absent."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"missing columns: {', '.join(missing)}")
    for col, valid in (("status", STATUSES), ("source", SOURCES)):
        v = df[col]
        bad = np.flatnonzero((v.notna() & ~v.isin(valid)).to_numpy(dtype=bool))
        if bad.size:
            raise ValueError(f"unknown {col} {v.iloc[bad[0]]!r} in column {col}, {_row_name(df, int(bad[0]))} "
                             f"(valid: {', '.join(valid)}){_and_more(bad.size)}")
    ok = df["status"].eq("ok").fillna(False).to_numpy(dtype=bool)   # a mask: no row is copied
    t = pd.to_numeric(df["time_ms"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = np.flatnonzero(ok & ~(t > 0))
    if bad.size:
        i = int(bad[0])
        if raw is not None and "time_ms" not in raw.columns:
            raise ValueError(f"no time_ms column: {bad.size} ok rows need a positive time in ms "
                             f"(the first: {_row_name(df, i)})")
        cell = raw["time_ms"].iloc[i] if raw is not None and len(raw) == len(df) else df["time_ms"].iloc[i]
        got = "an empty cell" if _missing(cell) else repr(cell) if isinstance(cell, str) else _number_text(cell)
        raise ValueError(f"column time_ms, {_row_name(df, i)}: an ok row needs a positive time in ms, got {got}"
                         f"{_and_more(bad.size, 'ok rows like it')}")
    cols = ["run_id", *KEY]
    group = group_codes([df[c] for c in cols])
    dup = np.bincount(group)[group] > 1   # a key held by two rows or more
    if dup.any():
        first = int(np.flatnonzero(dup)[0])
        same = np.flatnonzero(group == group[first]).tolist()
        r = df.iloc[first]
        key = " ".join(str(r[c]) for c in KEY if not pd.isna(r[c]))
        run = "" if pd.isna(r["run_id"]) else f" in run {r['run_id']}"
        which = (f"{', '.join(map(str, same[:-1]))} and {same[-1]}" if len(same) <= 4
                 else f"{', '.join(map(str, same[:3]))}, ... ({len(same)} rows)")
        raise ValueError(f"duplicate rows for {key}{run}: rows {which} hold the same key (a run measures each key "
                         f"once){_and_more(np.unique(group[dup]).size, 'keys held twice')}")
    pos = np.flatnonzero(ok & df["samples_ms"].notna().to_numpy(dtype=bool))
    try:
        want = sample_times(df, pos)
    except SP.BadSamples as exc:
        raise ValueError(f"column samples_ms, {_row_name(df, exc.position)}: not a JSON list of rounds of numbers "
                         f"({type(exc.reason).__name__}: {_one_line(exc.reason)})") from None
    with np.errstate(divide="ignore", invalid="ignore"):
        off = np.abs(t[pos] / want - 1)
    bad = np.flatnonzero(off > SAMPLES_RTOL)   # NaN (no samples to tell by) passes
    if bad.size:
        k = int(bad[0])
        i = int(pos[k])
        procs = pd.to_numeric(pd.Series([df["processes"].iloc[i]]), errors="coerce").iloc[0]
        what = (f"the geometric mean of its {int(procs)} processes' sample medians" if pd.notna(procs) and procs >= 2
                else "the median of its samples_ms")
        raise ValueError(f"column time_ms, {_row_name(df, i)}: stored {t[i]:.6g} ms is not {what} "
                         f"({want[k]:.6g} ms recomputed){_and_more(bad.size)}")


FORMATS = (".parquet", ".csv", ".jsonl")


def check_writable(path: str | os.PathLike, what: str = "output file", folder: bool = False) -> Path:
    """Check, creating nothing, that ``path`` can be written: an output file (``folder``
    false: not an existing folder, its folder creatable and writable) or an output folder
    (``folder`` true: not an existing file, creatable and writable). The nearest existing
    folder on the way must take a file (a temporary probe, removed at once), so ``/proc/x``,
    a read-only mount or a path under a file fail here, before anything is written.
    Returns the path; raises :class:`UsageError` naming ``what`` and ``path`` and the reason."""
    p = Path(path)
    shown = repr(str(p))
    if folder and p.exists() and not p.is_dir():
        raise UsageError(f"cannot write {what} {shown}: it is a file, not a folder")
    if not folder and p.is_dir():
        raise UsageError(f"cannot write {what} {shown}: it is a folder")
    if not folder and p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"cannot write {what} {shown}: the file is not writable")
    d = (p if folder else p.parent).absolute()
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir():
        raise UsageError(f"cannot write {what} {shown}: {str(d)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".flyexplore-probe.", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"cannot write {what} {shown}: {exc.strerror or exc} (in {str(d)!r})") from None
    return p


def check_path(path: str | os.PathLike) -> Path:
    """Check that results can be written to ``path`` (known extension; :func:`check_writable`),
    and create its folder. Raises :class:`UsageError` naming the path."""
    p = Path(path)
    if p.suffix not in FORMATS:
        raise UsageError(f"unknown result file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join(FORMATS)})")
    check_writable(p, "output file")
    try:
        (p.parent if str(p.parent) else Path(".")).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write output file {str(p)!r}: {exc.strerror or exc}") from None
    return p


def json_value(v):
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
            f.write(json.dumps({c: json_value(v) for c, v in zip(cols, row)}, allow_nan=True) + "\n")


def save(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` to ``path`` (.parquet, .csv or .jsonl), atomically (:mod:`flyexplore.atomic`:
    whole or not at all). Returns the path.
    Every format keeps float64 values exactly (JSONL by :func:`write_jsonl`). Parquet also keeps
    categorical columns (and their order); CSV and JSONL cannot, so saving a frame with
    categorical columns there warns (``UserWarning``) naming them. Raises :class:`UsageError`
    for a path that cannot be written (:func:`check_path`) and
    :class:`~flyexplore.errors.WriteError` when a write fails (a full disk; the old file is kept)."""
    p = check_path(path)
    df = normalize(df)
    cats = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
    if cats and p.suffix != ".parquet":
        import warnings
        warnings.warn(f"{p.suffix} files do not store categorical order; columns {', '.join(cats)} "
                      "load back as text (save as .parquet to keep it)", UserWarning, stacklevel=2)
    if p.suffix == ".parquet":
        write_file(p, lambda t: df.to_parquet(t, index=False))
    elif p.suffix == ".csv":
        write_file(p, lambda t: df.to_csv(t, index=False))
    else:
        write_file(p, lambda t: write_jsonl(df, t))
    return p


#: Columns every result file has: what identifies a row (:data:`KEY`) and its ``status``.
#: :func:`load` refuses a file without one of them (it is not a result file).
IDENTITY_COLUMNS = (*KEY, "status")


def _one_line(text: object) -> str:
    """``text`` as one line (newlines and runs of blanks become single spaces)."""
    return " ".join(str(text).split())


def _last_line(p: Path) -> int:
    """The 1-based number of the last line of ``p`` (one more than its newlines)."""
    return p.read_bytes().count(b"\n") + 1


def _ends_in_newline(p: Path) -> bool:
    """Whether the (non-empty) file ``p`` ends with a newline byte."""
    with open(p, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


#: pandas before 3.1 parses CSV floats with a fast parser that is often 1 ulp off (measured with
#: pandas 3.0.6 on the lent H200: 9,831 of 10,000 float32 event times saved by ``to_csv`` came
#: back different; ``benchmarks/evidence/torture.py`` saw every CSV time change across a resume);
#: ``float_precision="round_trip"`` reads every float ``save`` wrote exactly. pandas 3.1 parses
#: exactly by default and deprecates the argument.
_CSV_FLOATS = ({"float_precision": "round_trip"}
               if tuple(int(x) for x in pd.__version__.split(".")[:2] if x.isdigit()) < (3, 1) else {})


def _read_csv(p: Path, name: str) -> pd.DataFrame:
    if not _ends_in_newline(p):
        raise UsageError(f"{name} line {_last_line(p)}: the last row is cut short (the file does not end "
                         "with a newline, as every CSV file flyexplore writes does)")
    with warnings.catch_warnings():
        # index_col=False: a row with more fields than the header is an error, never a shifted index
        warnings.simplefilter("error", pd.errors.ParserWarning)
        try:
            return pd.read_csv(p, dtype={"case": str, "params": str, "kernels": str}, index_col=False,
                               **_CSV_FLOATS)
        except pd.errors.EmptyDataError:
            raise UsageError(f"{name} is not a flyexplore result file: it holds no header row") from None
        except pd.errors.ParserWarning as exc:
            raise UsageError(f"{name} is not a readable CSV file: a row has more fields than the header "
                             f"({_one_line(exc)})") from None
        except pd.errors.ParserError as exc:
            why = _one_line(exc).replace("Error tokenizing data. C error: ", "")
            raise UsageError(f"{name} is not a readable CSV file (cut short or damaged): {why}") from None


def _read_jsonl(p: Path, name: str) -> pd.DataFrame:
    text = p.read_text(encoding="utf-8")
    lines = text.split("\n")   # numbered as an editor numbers them ("\r" before it is JSON blank)
    try:
        rows = [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError:
        rows = None
    if rows is None or not all(isinstance(r, dict) for r in rows):  # find the first bad line
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as exc:
                if i == len(lines) and not text.endswith("\n"):
                    raise UsageError(f"{name} line {i} is cut short (the file ends inside it: "
                                     f"{exc.msg}: column {exc.colno})") from None
                raise UsageError(f"{name} line {i} is not valid JSON ({exc.msg}: column {exc.colno})") from None
            if not isinstance(r, dict):
                raise UsageError(f"{name} line {i} is not a JSON object (a row) but {type(r).__name__} "
                                 f"{_one_line(line)[:40]!r}")
    return pd.DataFrame(rows)


def _read(p: Path, name: str) -> pd.DataFrame:
    """The raw frame of result file ``p`` (by extension), every read failure as one-line
    :class:`UsageError` naming the file (``name``)."""
    import pyarrow as pa

    if p.suffix not in FORMATS:
        raise UsageError(f"unknown result file extension {p.suffix!r} in {str(p)!r} "
                         f"(valid: {', '.join(FORMATS)})")
    if p.is_dir():
        raise UsageError(f"{name} is a folder, not a result file")
    try:
        if p.stat().st_size == 0:
            if p.suffix == ".jsonl":   # what save writes for no rows: one line per row, none
                return empty_frame()
            raise UsageError(f"{name} is empty (0 bytes): not a result file")
        if p.suffix == ".parquet":
            try:
                return pd.read_parquet(p)
            except pa.ArrowException as exc:
                why = _one_line(exc).replace(f"Could not open Parquet input source '{p}': ", "")
                raise UsageError(f"{name} is not a readable Parquet file (cut short, damaged or not "
                                 f"Parquet): {why}") from None
        if p.suffix == ".csv":
            return _read_csv(p, name)
        return _read_jsonl(p, name)
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                         f"{exc.start}): not a {p.suffix} result file") from None
    except OSError as exc:
        raise UsageError(f"cannot read result file {name}: {exc.strerror or _one_line(exc)}") from None


def load(path: str | os.PathLike, *, validated: bool = False) -> pd.DataFrame:
    """Read a result file written by :func:`save` (or a sweep's ``.partial.jsonl`` journal) and
    return its rows, normalized (:func:`normalize`; older schema versions upgraded). Cost: one
    pandas/pyarrow read plus a check of the file's last byte (CSV) -- no per-row work beyond
    JSONL's one ``json.loads`` per line.

    ``validated``: also apply :func:`validate` (what ``flyexplore report``, ``compare`` and
    ``export`` read files with, and ``fx.load``), its ``ValueError`` raised as one
    :class:`UsageError` line naming the file, the column, the row and the value.

    Raises :class:`UsageError`, one line naming the file and the problem, for: a missing file,
    a folder, an unknown extension, an unreadable file (permission denied, ...), an empty
    Parquet/CSV file (an empty ``.jsonl`` is a result set without rows: what :func:`save`
    writes for none), a file that is not UTF-8 text (CSV, JSONL), a Parquet file pyarrow cannot
    read (cut short, damaged or another format), a CSV file pandas cannot parse (a quoted field
    never closed, a row with more fields than the header), a JSONL line that is not a JSON
    object (its line number given), a file without the :data:`IDENTITY_COLUMNS` (not a result
    file), a column that cannot take its core type, and a schema newer than this flyexplore.

    Cut-short files: Parquet keeps its footer last, so any cut is refused. :func:`save` ends
    every CSV row and JSONL line with a newline, so a CSV file not ending in one has a torn
    last row and is refused (naming its line: even a cut within the last field, which leaves
    the field count whole, is caught); a JSONL file whose last line does not parse and has no
    newline is refused as cut short. A cut exactly at a row's end leaves a valid file with
    fewer rows, which no reader can tell. A CSV row in the middle with fewer fields than the
    header (a hand edit, never a cut) reads as missing values."""
    p = Path(path)
    name = repr(str(p))
    if not p.exists():
        raise UsageError(f"result file not found: {name}")
    df = _read(p, name)
    if len(df.columns) or len(df):
        missing = [c for c in IDENTITY_COLUMNS if c not in df.columns]
        if missing:
            cols = [str(c) for c in df.columns]
            shown = ", ".join(cols[:8]) + (", ..." if len(cols) > 8 else "")
            raise UsageError(f"{name} is not a flyexplore result file: missing columns {', '.join(missing)} "
                             f"(its columns: {shown or 'none'})")
    raw = df
    df = _normalized(raw, name, "a valid result file")
    if validated:
        check_valid(df, name, raw)
    del raw
    release_arrow_memory()   # the reader's buffers
    return df


def release_arrow_memory() -> None:
    """Hand the memory pyarrow's pool keeps after it was freed back to the system. The pool
    (mimalloc) keeps freed pages: about 140 MB after reading 10,000 Parquet rows of CPU samples,
    more after every copy of rows with arrow-backed strings and every conversion of them to
    Python text; without this, each such step stacks its peak on the one before. Called by
    :func:`load`, by the sample-based intervals after parsing, and by the reports between
    sections; cheap (no data is touched)."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001 - only an optimisation: memory stays with the pool
        pass


def check_valid(df: pd.DataFrame, name: str, raw: pd.DataFrame | None = None,
                what: str = "a valid result file") -> None:
    """:func:`validate` ``df`` (``raw``: as there), its ``ValueError`` raised as one
    :class:`UsageError` line ``<name> is not <what>: <problem>`` (``name``: a file's repr, or what
    the rows are)."""
    try:
        validate(df, raw)
    except ValueError as exc:
        raise UsageError(f"{name} is not {what}: {_one_line(exc)}") from None


def checked(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Result rows given as a DataFrame (not read from a file), checked as a file is: ``df``
    normalized (:func:`normalize`, a copy) once :func:`validate` passes, else one
    :class:`UsageError` line ``<name> is not a valid result set: <problem>`` with the problem in
    the words a file gets (``name`` says whose rows: ``"the DataFrame given to fx.speedup"``)."""
    out = _normalized(df, name, "a valid result set")
    check_valid(out, name, df, "a valid result set")
    return out


def _normalized(raw: pd.DataFrame, name: str, what: str) -> pd.DataFrame:
    """:func:`normalize` ``raw``, its refusal as one :class:`UsageError` line naming ``name``
    (``<name> is not <what>: a core column cannot take its type (...)``, or a newer schema)."""
    try:
        return normalize(raw)
    except UsageError as exc:
        raise UsageError(f"{name}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{name} is not {what}: a core column cannot take its type ({_one_line(exc)})") from None


def load_set(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """Read result files with :func:`load` (``validated=True``) and concatenate them
    (:func:`concat`): what ``flyexplore report`` and ``export`` show. Raises :class:`UsageError`
    as :func:`load` does, and naming the files when two of them hold the same row of one run
    (the same file given twice, or a copy)."""
    paths = list(paths)
    frames = [load(p, validated=True) for p in paths]
    df = concat(frames)
    if len(frames) > 1 and len(df):
        dup = df.duplicated(subset=["run_id", *KEY], keep=False)
        if dup.any():
            first = df.loc[dup, list(KEY)].iloc[0].tolist()
            raise UsageError(f"{', '.join(repr(str(p)) for p in paths)} hold the same rows of one run "
                             f"(e.g. {first}): give each result file once")
    return df


def check_backends(df: pd.DataFrame, backends: str | Sequence[str], what: str = "baseline",
                   where: str = "the rows") -> None:
    """Raise :class:`UsageError` unless every backend named in ``backends`` (one name or several)
    is the ``backend`` of some row of ``df``; the message lists the backends present. A frame
    without any backend passes (nothing to compare)."""
    present = sorted(set(df["backend"].dropna().astype(str))) if "backend" in df else []
    if not present:
        return
    names = [backends] if isinstance(backends, str) else list(backends)
    bad = [b for b in names if b not in present]
    if bad:
        raise UsageError(f"unknown {what} {', '.join(repr(b) for b in bad)}: not a backend in {where} "
                         f"(backends present: {', '.join(present)})")


def concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate result sets, keeping every column."""
    frames = [normalize(f) for f in frames if len(f)]
    return normalize(pd.concat(frames, ignore_index=True)) if frames else empty_frame()


def json_list(text) -> list:
    """A row's JSON list column (``samples_ms``, ``round_clock_mhz``, ``process_estimates``) as a
    list; ``[]`` for a missing, unreadable or non-list text."""
    if not isinstance(text, str) or not text:
        return []
    try:
        got = json.loads(text)
    except ValueError:
        return []
    return got if isinstance(got, list) else []


def process_estimates(text) -> list[dict]:
    """The per-process estimates of a row measured with ``--processes`` (its
    ``process_estimates`` JSON text): a list of dicts (``time_ms``, ``time_se``, ``speedup``,
    ``speedup_se``, ...; see :data:`COLUMNS`); ``[]`` for a missing or unreadable text."""
    return [p for p in json_list(text) if isinstance(p, dict)]


# -- moved to modules of their own, re-exported here so that every ``R.<name>`` keeps working. At
# the end of this module, not the top: speedups imports KEY, process_estimates and
# release_arrow_memory from here (at its own end), so whichever of the two is imported first finds
# the names it asks for defined.
# an environment A/B's arms (backend@env) and the default baseline: flyexplore/results/arms.py
from flyexplore.results.arms import (  # noqa: E402,F401 - re-exported
    ARM_SEP, ab_envs, arm_name, default_baseline, split_arm,
)
# speedups, geometric means, their intervals and the run-to-run allowances: flyexplore/results/speedups.py
from flyexplore.results.speedups import (  # noqa: E402,F401 - re-exported
    PROCESS_FLOOR, RUN_SHIFT, RUN_SHIFT_PER_SD, RUN_TO_RUN, RUN_TO_RUN_SOURCE, SPEEDUP_COLUMNS, SPEEDUP_INPUTS,
    TIE_BAND, geomean, geomean_speedup, process_floor, ratio_interval, ratio_intervals, run_shift,
    run_shift_per_sd, speedup,
)
