"""The published MI355X (gfx950) figures as result sets.

The per-case numbers behind the FlyDSL-in-PyTorch headlines live in ``data/published/*.csv``
with their provenance in ``data/published/SOURCES.md``. None of them was measured by
flyexplore. :func:`load` turns them into rows of the result schema
(:mod:`flyexplore.results.table`) with ``source="published"`` and ``status="published"``, so the same
speedup, geometric-mean and plotting functions work on them and on a user's own sweeps.

Per suite (``SUITES``):

============  ================  ======================================  ===========================
suite         op                case label                              published as
============  ================  ======================================  ===========================
``dense``     ``gemm``          ``MxNxK`` (layout NT, the default)       TFLOP/s; aten/triton/flydsl
``mxfp``      ``scaled_gemm``   ``MxNxK`` (NT), dtype mxfp8 / mxfp4      TFLOP/s; aten/flydsl
``grouped``   ``grouped_gemm``  ``GxMxNxK`` or ``GxMxNxK:ms=r0/r1/..``   TFLOP/s; aten/triton/flydsl
``rmsnorm``   ``rmsnorm``       ``MxN``, dtype per case                  µs; aten/flydsl
``topk``      ``topk``          ``MxNxK`` (``:deterministic=1`` for      µs; aten/flydsl
                                the deterministic-mode runs)
============  ================  ======================================  ===========================

Case labels, parameters and FLOP/byte counts come from the operator modules
(:mod:`flyexplore.ops`), so published rows pair with a user's own sweeps of the same suites.
Where only TFLOP/s is published, ``time_ms`` is derived as FLOPs / throughput with the
operator's FLOP count (GEMM 2*M*N*K; grouped 2*sum(M_g)*N*K) and the row's ``message`` says
so. Where time is published, ``tflops``/``gbps`` are derived with flyexplore's FLOP and byte
counts (also said in ``message``). Every row carries ``provenance`` (publication, setup, file),
``device="AMD Instinct MI355X"``, ``arch="gfx950"``, ``platform="rocm"``.

Grouped GEMM: the label printed in pytorch/pytorch PR 194032 is kept in ``published_label``
(``g8x512x2048x8192``, ``K4096 x N14336 (MoE up)``, ``[1024,512,...]``) with ``subset``
(standard / kn_variants / ragged_m) and ``total_m``; the flyexplore label is
:func:`flyexplore.ops.grouped_gemm.operator.published_case_label` of it (uniform cases take the printed
G x M x N x K order, which SOURCES.md notes is unconfirmed; the FLOP count does not depend on
the order of N and K). MXFP rows use op ``scaled_gemm`` with its default
``scaling=block``; grouped rows op ``grouped_gemm``.

The vLLM whole-request A/B (``vllm_e2e.csv``) is not per-kernel data: :func:`vllm_published`
returns it as a serving A/B table (see :mod:`flyexplore.results.vllm`). Figures that are public only
as ranges are in :data:`RANGES` (:func:`ranges`), marked ``kind="range only"``.
"""
from __future__ import annotations

import csv
import json
import sys
from typing import Sequence

import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import get_op, list_ops
from flyexplore.ops.base import PublishedSuite
from flyexplore.paths import published_dir
from flyexplore.results import table as R

DEVICE = "AMD Instinct MI355X"
ARCH = "gfx950"


def suites() -> dict[str, PublishedSuite]:
    """The published kernel tables, each registered by its operator family
    (``Operator.published`` in ``flyexplore/ops/<family>.py``): ``{name: PublishedSuite}``."""

    return {t.name: t for n in list_ops() for t in get_op(n).published}


def suite_names() -> tuple[str, ...]:
    """Every name ``flyexplore published --suite`` accepts: the kernel tables, ``vllm``, ``ranges``."""
    return (*suites(), "vllm", "ranges")


def __getattr__(name):  # SUITES / SUITE_NAMES as before, read from the registry
    if name == "SUITES":
        return suites()
    if name == "SUITE_NAMES":
        return suite_names()
    raise AttributeError(name)


VLLM = PublishedSuite("vllm", "vllm_e2e.csv", "vllm", "the FlyDSL blog's vLLM A/B",
                      "vllm bench serve, one MI355X, TP=1, ISL 256 / OSL 512 with --ignore-eos, "
                      "concurrency 8..256, max_num_batched_tokens=2048, piecewise graphs, prefix "
                      "caching off; BF16 arms ATEN,TRITON vs ATEN,TRITON,FLYDSL (ABBA, medians, "
                      "noise floor 1.79%); MXFP8 ATen vs ATen+FlyDSL, one run per cell; "
                      "speedup = 1 + whole_request_speedup_pct/100")

#: Every name ``flyexplore published --suite`` accepts.

#: Figures public only as ranges (no per-case values exist); never mix them with per-case rows.
RANGES = (
    {"what": "MXFP4 vLLM whole-request speedup", "subject": "Qwen3-32B", "low": 1.53, "high": 3.01},
    {"what": "MXFP4 vLLM whole-request speedup", "subject": "Llama-3.1-8B", "low": 1.25, "high": 1.85},
    {"what": "MXFP4 vLLM whole-request speedup", "subject": "Llama-3.3-70B (lm_head unquantized)",
     "low": 1.50, "high": 2.82},
    {"what": "AOTriton 0.14.2b vs 0.13b on gfx950", "subject": "SDPA forward", "low": 0.92, "high": 2.34},
    {"what": "AOTriton 0.14.2b vs 0.13b on gfx950", "subject": "SDPA backward", "low": 0.93, "high": 2.47},
)


def ranges() -> pd.DataFrame:
    """The published figures known only as ranges: columns ``what, subject, low, high, unit,
    kind`` (``kind`` is always ``"range only"``: no per-case values are public; the AOTriton
    per-case table is on the AOTriton 0.14b release page, which flyexplore does not carry),
    ``source``."""
    rows = [{**r, "unit": "x", "kind": "range only",
             "source": "data/published/SOURCES.md (not per-case public)"} for r in RANGES]
    return pd.DataFrame(rows)


def read_table(suite: PublishedSuite) -> list[dict]:
    with open(published_dir() / suite.file, newline="") as f:
        return list(csv.DictReader(f))


def published_row(suite: PublishedSuite, op: str, case: str, params: dict, dtype: str, backend: str, *,
         time_ms: float, flops: float | None, nbytes: float | None, message: str,
         extra: dict | None = None) -> dict:
    sec = time_ms / 1e3
    row = {"schema_version": R.SCHEMA_VERSION, "run_id": f"published:{suite.name}",
           "op": op, "case": case, "params": json.dumps(params, sort_keys=True), "dtype": dtype,
           "backend": backend, "status": "published", "source": "published",
           "timing_mode": suite.timing_mode, "time_ms": time_ms,
           "flops": flops or None, "bytes": nbytes,
           "tflops": flops / sec / 1e12 if flops else None,
           "gbps": nbytes / sec / 1e9 if nbytes else None,
           "message": message, "platform": "rocm", "device": DEVICE, "arch": ARCH,
           "provenance": suite.provenance, "published_in": suite.publication}
    row.update(params)
    row.update(extra or {})
    return row


TFLOPS_MSG = ("published as TFLOP/s ({v} TFLOP/s); time_ms derived as {f} / throughput; "
               "not measured by flyexplore")
US_MSG = ("published as {v} us; tflops/gbps (where set) derived with flyexplore's FLOP and byte "
           "counts; not measured by flyexplore")


def throughput_rows(suite: PublishedSuite, op_name: str, case, dtype: str, r: dict,
                     backends: tuple[str, ...], flops: float, nbytes: float, formula: str,
                     extra: dict | None = None) -> list[dict]:
    """One row per backend of a CSV row published as ``<backend>_tflops``: ``time_ms`` is derived
    as ``flops`` / throughput, and ``message`` says so (``formula`` names the FLOP count)."""
    rows = []
    for be in backends:
        v = float(r[f"{be}_tflops"])
        rows.append(published_row(suite, op_name, case.label, case.p, dtype, be,
                         time_ms=flops / (v * 1e12) * 1e3, flops=flops, nbytes=nbytes,
                         message=TFLOPS_MSG.format(v=r[f"{be}_tflops"], f=formula), extra=extra))
    return rows


def _names(suite: str | Sequence[str] | None, allowed: Sequence[str]) -> list[str]:
    if suite is None:
        return list(allowed)
    names = [s.strip() for s in suite.split(",")] if isinstance(suite, str) else list(suite)
    names = [n for n in names if n]
    if not names:
        raise UsageError(f"no published suite given (valid: {', '.join(allowed)})")
    for n in names:
        if n not in allowed:
            raise bad_choice("published suite", n, allowed)
    return names


def load(suite: str | Sequence[str] | None = None) -> pd.DataFrame:
    """The published per-case kernel figures as one result set.

    ``suite``: ``None`` (all of :data:`SUITES`), a name, a comma-separated text or a list.
    Returns a normalized result set (:func:`flyexplore.results.table.normalize`) with one row per
    (case, dtype, backend): ``status="published"``, ``source="published"``, times in ms, and
    the extra columns ``provenance``, ``published_in`` and the case parameters (``m``, ``n``,
    ``k``, ...; grouped: ``g``, ``ms``, ``total_m``, ``subset``, ``published_label``; topk:
    ``family``, ``k_band``). Raises :class:`UsageError` for an unknown suite name (``vllm`` and ``ranges``
    are not kernel rows: use :func:`vllm_published` and :func:`ranges`).
    """
    rows: list[dict] = []
    tables = suites()
    for n in _names(suite, tuple(tables)):
        rows.extend(tables[n].load(tables[n], sys.modules[__name__]))
    return R.frame(rows)


def vllm_published() -> pd.DataFrame:
    """The published vLLM whole-request A/B (``vllm_e2e.csv``) as a serving A/B table in the
    format of :func:`flyexplore.results.vllm.ab_table`: one row per (precision, model, concurrency)
    with ``metric="whole_request"``, ``speedup = 1 + whole_request_speedup_pct/100`` (> 1: the
    FlyDSL arm is faster), ``a``/``b`` arm names, ``a_value``/``b_value`` empty (not
    published), ``noise_pct`` (the published noise floor of the BF16 A/B, 1.79%; not given for
    MXFP8, one run per cell), ``source="published"`` and ``provenance``."""
    rows = []
    for r in read_table(VLLM):
        pct = float(r["whole_request_speedup_pct"])
        bf16 = r["precision"] == "bf16"
        rows.append({
            "model": r["model"], "precision": r["precision"], "concurrency": int(r["concurrency"]),
            "request_rate": "inf", "metric": "whole_request",
            "a": "ATEN,TRITON" if bf16 else "ATen", "b": "ATEN,TRITON,FLYDSL" if bf16 else "ATen+FlyDSL",
            "a_value": float("nan"), "b_value": float("nan"), "pct": pct, "speedup": 1.0 + pct / 100.0,
            "higher_is_better": True, "noise_pct": 1.79 if bf16 else float("nan"),
            "source": "published", "device": DEVICE,
            "provenance": VLLM.provenance,
        })
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Rows, cases, dtypes and backends per published suite (what ``flyexplore published``
    prints first)."""
    df = load() if df is None else df
    out = []
    for name, s in suites().items():
        d = df[df["run_id"] == f"published:{name}"]
        out.append({"suite": name, "op": s.op, "rows": len(d), "cases": d[["case", "dtype"]].drop_duplicates().shape[0],
                    "dtypes": ",".join(sorted(d["dtype"].dropna().unique())),
                    "backends": ",".join(sorted(d["backend"].dropna().unique())),
                    "published in": s.publication})
    return pd.DataFrame(out)


def headlines(df: pd.DataFrame | None = None) -> pd.DataFrame:
    """The headline numbers, recomputed from the per-case rows with
    :func:`flyexplore.results.table.speedup` and :func:`~flyexplore.results.table.geomean`, beside the
    value printed in the publication (``printed``). Columns ``headline, value, printed,
    cases, how``. Ratios within +-1% (:data:`flyexplore.results.table.TIE_BAND`) are ties; ties
    count in the geometric mean like any other case (``SOURCES.md``)."""
    df = load() if df is None else df
    out = []

    def add(name, value, printed, cases, how):
        out.append({"headline": name, "value": value, "printed": printed, "cases": cases, "how": how})

    d = df[df["run_id"] == "published:dense"]
    s = R.speedup(d, ["aten", "triton"])
    s = s[s["backend"] == "flydsl"]
    wins, ties = int((~s["tie"] & (s["speedup"] > 1)).sum()), int(s["tie"].sum())
    add("dense BF16 GEMM, FlyDSL over the faster of ATen/Triton (geomean)", R.geomean(s["speedup"]),
        "1.1027 (1.10x)", len(s), f"{wins} wins, {ties} ties (within 1%), {len(s) - wins - ties} losses")
    d = df[df["run_id"] == "published:mxfp"]
    s = R.speedup(d, "aten")
    for fmt, printed in (("mxfp8", "1.5755"), ("mxfp4", "1.6804")):
        x = s[s["dtype"] == fmt]
        add(f"{fmt.upper()} scaled GEMM, FlyDSL over ATen (geomean)", R.geomean(x["speedup"]), printed,
            len(x), "graph-replay TFLOP/s ratio per shape")
    d = df[df["run_id"] == "published:grouped"]
    for base, printed in (("triton", "1.2000"), ("aten", "1.9505")):
        x = R.speedup(d[d["backend"].isin([base, "flydsl"])], base)
        add(f"grouped BF16 GEMM, FlyDSL over {base} (geomean)", R.geomean(x["speedup"]), printed,
            len(x), "all 24 cases")
    d = df[df["run_id"] == "published:rmsnorm"]
    s = R.speedup(d, "aten")
    top = s.loc[s["speedup"].idxmax()]
    add("RMSNorm, FlyDSL over ATen (lowest case)", s["speedup"].min(), "1.17x", len(s), "per-case range")
    add("RMSNorm, FlyDSL over ATen (highest case)", s["speedup"].max(), "3.66x", len(s),
        f"peak: {top['dtype']} {top['case']}")
    d = df[df["run_id"] == "published:topk"]
    det = d["deterministic"].astype(bool)
    for on, printed in ((False, "4.8157 (4.82x)"), (True, "4.02x")):
        x = R.speedup(d[(d["family"] == "register") & (det == on)], "aten")
        add(f"TopK register family, FlyDSL over ATen, determinism {'on' if on else 'off'} (geomean)",
            R.geomean(x["speedup"]), printed, len(x), "K in {2,4,8,16}")
    band_printed = {"64-256": "1.69x", "257-383": "1.81x", "384-831": "1.97x", "832-1024": "1.63x"}
    rad = d[(d["family"] == "radix") & ~det]
    for band, printed in band_printed.items():
        x = R.speedup(rad[rad["k_band"] == band], "aten")
        add(f"TopK radix band {band}, FlyDSL over ATen, determinism off (geomean)",
            R.geomean(x["speedup"]), printed, len(x), "K band")
    v = vllm_published()
    for prec, printed in (("bf16", "1.13x"), ("mxfp8", "2.04x")):
        x = v[v["precision"] == prec]
        top = x.loc[x["speedup"].idxmax()]
        add(f"vLLM {prec.upper()} whole-request speedup (peak)", top["speedup"], printed, len(x),
            f"{top['model']}, concurrency {top['concurrency']}")
    return pd.DataFrame(out)
