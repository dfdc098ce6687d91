"""Whole-request A/B from ``vllm bench serve --save-result`` JSON files.

``vllm bench serve`` (``vllm/benchmarks/serve.py``) writes one JSON object per run: the setup
(``date``, ``backend``, ``label``, ``model_id``, ``num_prompts``, ``request_rate`` -- a number
or the text ``"inf"`` --, ``burstiness``, ``max_concurrency``, plus any ``--metadata KEY=VALUE``)
merged with the metrics: ``duration`` (s), ``completed``, ``failed``, ``total_input_tokens``,
``total_output_tokens``, ``request_throughput`` (req/s), ``output_throughput`` and
``total_token_throughput`` (tok/s), and per latency metric (``ttft``, ``tpot``, ``itl``, and
``e2el`` when selected with ``--percentile-metrics``) ``mean_<m>_ms``, ``median_<m>_ms``,
``std_<m>_ms`` and ``p<P>_<m>_ms`` for each ``--metric-percentiles`` P (default 99).
With ``--append-result`` a file holds several such objects, one per line; both forms load.

:func:`load_runs` reads files or folders of them into one row per run; :func:`ab_table` pairs
two arms (A = baseline, B = candidate, e.g. FlyDSL off / on) by (model, max_concurrency,
request_rate) and gives one row per pair and metric with ``speedup`` > 1 meaning B is better
(latency: A/B; throughput: B/A). The published MI355X A/B
(:func:`flyexplore.results.published.vllm_published`) has the same columns.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

import pandas as pd

from flyexplore.errors import UsageError

#: Metrics compared by default: column -> (label, higher is better).
METRICS = {
    "median_ttft_ms": ("TTFT median (ms)", False),
    "median_tpot_ms": ("TPOT median (ms)", False),
    "median_itl_ms": ("ITL median (ms)", False),
    "p99_ttft_ms": ("TTFT p99 (ms)", False),
    "mean_e2el_ms": ("E2E latency mean (ms)", False),
    "request_throughput": ("request throughput (req/s)", True),
    "output_throughput": ("output throughput (tok/s)", True),
}
#: Setup fields kept per run.
SETUP = ("date", "backend", "label", "model_id", "num_prompts", "request_rate", "burstiness",
         "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
         "total_output_tokens")
PAIR_KEY = ("model", "concurrency", "request_rate")
#: A field that marks a file as a made-up example (``data/examples/vllm``), not a measurement.
SYNTHETIC_FIELD = "synthetic_example"


def _files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(f for f in p.glob("*.json") if not f.name.endswith(".pytorch.json")))
        elif p.exists():
            out.append(p)
        else:
            raise UsageError(f"vllm result file not found: {str(p)!r}")
    if not out:
        raise UsageError(f"no vllm result JSON files in {', '.join(str(p) for p in paths)}")
    return out


def _objects(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
        objs = obj if isinstance(obj, list) else [obj]
    except json.JSONDecodeError:
        try:  # --append-result: one object per line
            objs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise UsageError(f"{str(path)!r} is not a vllm bench serve result (not JSON: {exc.msg})") from None
    for o in objs:
        if not isinstance(o, dict) or "request_throughput" not in o:
            raise UsageError(f"{str(path)!r} is not a vllm bench serve --save-result file "
                             "(no request_throughput field)")
    return objs


def looks_like_vllm(path: str | os.PathLike) -> bool:
    """True if ``path`` is a ``.json`` file (or a folder of them) written by
    ``vllm bench serve --save-result``."""
    p = Path(path)
    try:
        files = _files([p])
        return all(f.suffix == ".json" for f in files) and bool(_objects(files[0]))
    except (UsageError, OSError, UnicodeDecodeError):
        return False


def load_runs(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> pd.DataFrame:
    """One row per saved run: ``file``, the :data:`SETUP` fields present, ``model`` (last part
    of ``model_id``), ``concurrency`` (``max_concurrency``; NaN when unlimited) and every
    metric field (``*_ms``, ``*_throughput``). Folders are searched for ``*.json`` (vllm's
    ``*.pytorch.json`` side files are skipped); ``synthetic_example`` for files marked as made-up
    examples (:data:`SYNTHETIC_FIELD`). Raises :class:`UsageError` for a missing file
    or one that is not a vllm result."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows = []
    for f in _files(list(paths)):
        for o in _objects(f):
            r = {"file": str(f)}
            r.update({k: o.get(k) for k in SETUP if k in o})
            r.update({k: v for k, v in o.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                      and (k.endswith("_ms") or k.endswith("_throughput"))})
            mid = str(o.get("model_id") or "")
            r["model"] = mid.rstrip("/").split("/")[-1] or "?"
            mc = o.get("max_concurrency")
            r["concurrency"] = float(mc) if mc is not None else math.nan
            r["request_rate"] = str(o.get("request_rate", "inf"))
            if o.get(SYNTHETIC_FIELD):
                r[SYNTHETIC_FIELD] = str(o[SYNTHETIC_FIELD])
            rows.append(r)
    return pd.DataFrame(rows)


def ab_table(a: pd.DataFrame, b: pd.DataFrame, metrics: Iterable[str] | None = None,
             names: tuple[str, str] = ("A", "B"), source: str | None = None) -> pd.DataFrame:
    """Pair runs of arm A (baseline) and arm B (candidate) from :func:`load_runs` by
    (model, concurrency, request_rate); several runs of one key are reduced to their median.

    Returns one row per pair and metric: ``model, concurrency, request_rate, metric, label,
    a, b`` (arm names), ``a_value, b_value, speedup`` (> 1: B better; latency A/B, throughput
    B/A), ``pct`` ((speedup - 1) * 100), ``higher_is_better``, ``source`` (default:
    ``"synthetic example"`` when a run of either arm is marked with :data:`SYNTHETIC_FIELD`, as
    the files under ``data/examples/vllm`` are, else ``"measured"``; figures and reports show
    it). Keys
    present in one arm only are in ``df.attrs["only_a"]`` / ``["only_b"]`` (lists of
    "model c=N rate=R" strings). ``metrics`` default: those of :data:`METRICS` both arms have.
    Raises :class:`UsageError` when no key is in both arms."""
    key = list(PAIR_KEY)
    if source is None:
        marked = any(SYNTHETIC_FIELD in d and d[SYNTHETIC_FIELD].notna().any() for d in (a, b))
        source = "synthetic example" if marked else "measured"
    ms = [m for m in (metrics or METRICS) if m in a and m in b]
    if not ms:
        raise UsageError(f"no metric in both arms (wanted: {', '.join(metrics or METRICS)})")

    def red(d):
        d = d.copy()
        d["concurrency"] = d["concurrency"].fillna(-1)
        return d.groupby(key)[ms].median().reset_index()

    ra, rb = red(a), red(b)
    j = ra.merge(rb, on=key, how="outer", suffixes=("_a", "_b"), indicator=True)

    def lab(r):
        c = "unlimited" if r["concurrency"] < 0 else int(r["concurrency"])
        return f"{r['model']} c={c} rate={r['request_rate']}"

    only_a = [lab(r) for _, r in j[j["_merge"] == "left_only"].iterrows()]
    only_b = [lab(r) for _, r in j[j["_merge"] == "right_only"].iterrows()]
    both = j[j["_merge"] == "both"]
    if both.empty:
        raise UsageError(f"no (model, concurrency, request rate) in both arms "
                         f"({names[0]}: {', '.join(only_a) or 'none'}; {names[1]}: {', '.join(only_b) or 'none'})")
    rows = []
    for _, r in both.iterrows():
        for m in ms:
            label, hib = METRICS.get(m, (m, m.endswith("_throughput")))
            va, vb = float(r[f"{m}_a"]), float(r[f"{m}_b"])
            sp = (vb / va if hib else va / vb) if va > 0 and vb > 0 else math.nan
            rows.append({"model": r["model"], "concurrency": None if r["concurrency"] < 0 else int(r["concurrency"]),
                         "request_rate": r["request_rate"], "metric": m, "label": label,
                         "a": names[0], "b": names[1], "a_value": va, "b_value": vb,
                         "speedup": sp, "pct": (sp - 1) * 100, "higher_is_better": hib,
                         "source": source})
    out = pd.DataFrame(rows)
    out.attrs["only_a"], out.attrs["only_b"] = only_a, only_b
    return out
