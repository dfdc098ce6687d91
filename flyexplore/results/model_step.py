"""A measured model step as tables, beside the capture's modelled answer.

The rows come from a sweep of the ``model`` family (:mod:`flyexplore.run.model_step`); every
table says what each number is (``kind`` per column in ``attrs["kind"]``):

- ``measured``: a step's time (ms, median of paired rounds, its 95% interval), speedups against
  ``eager`` (paired rounds, interval and label), the first call (compile and autotune), the peak
  memory, and one profiled step's time by kernel category (:mod:`flyexplore.insight.breakdown`);
- ``modelled``: the capture's roofline shares (:func:`flyexplore.results.model.shares`, MI355X
  datasheet peaks, pointwise calls unfused);
- ``projection``: the capture's Amdahl projection over published per-op FlyDSL speedups
  (:func:`flyexplore.results.model.projection`).

A modelled or projected number is never put in a measured column; where two disagree the
difference is a column of its own.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from flyexplore.measure import stats as S
from flyexplore.ops import model_hooks
from flyexplore.results import peaks as PK

#: Which capture view a variant's step is the real run of: eager variants run what the eager view
#: captured, compiled variants what Inductor lowers (the compiled view).
VIEW_OF = {"eager": "eager", "eager_flydsl": "eager", "eager_ck": "eager", "compile": "compiled",
           "max_autotune": "compiled", "max_autotune_flydsl": "compiled"}
#: The measured FlyDSL speedup that stands beside each view's projection: (FlyDSL variant, its
#: baseline variant).
FLYDSL_PAIRS = {"eager": ("eager_flydsl", "eager"), "compiled": ("max_autotune_flydsl", "max_autotune")}

STEP_COLUMNS = ("model", "phase", "batch", "seq", "layers", "dtype", "variant", "status", "step_ms", "step_lo_ms",
                "step_hi_ms", "speedup", "speedup_lo", "speedup_hi", "verdict", "first_call_s", "peak_gb", "rounds",
                "timing_mode", "device", "note")


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame.iloc[0:0]


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def step_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per variant of the measured step(s) in ``frame`` (a ``model`` sweep's rows):
    ``step_ms`` with ``step_lo_ms``/``step_hi_ms`` (the median's 95% interval), ``speedup`` over
    the baseline variant (``eager``) with its interval and ``verdict``, ``first_call_s`` (the first
    call: compile and autotune included), ``peak_gb`` (GPU peak during build and first call),
    ``rounds``, ``timing_mode``, ``device``; ``status`` and ``note`` (why a variant did not run,
    or the row's notes). ``attrs["kind"]``: every time column is measured."""
    out = []
    for r in frame.to_dict("records"):
        ok = r.get("status") == "ok"
        out.append({"model": r.get("model"), "phase": r.get("phase"), "batch": r.get("batch"), "seq": r.get("seq"),
                    "layers": r.get("layers"), "dtype": r.get("dtype"), "variant": r.get("backend"),
                    "status": r.get("status"),
                    "step_ms": _num(r.get("time_ms")) if ok else math.nan,
                    "step_lo_ms": _num(r.get("time_ci_lo_ms")) if ok else math.nan,
                    "step_hi_ms": _num(r.get("time_ci_hi_ms")) if ok else math.nan,
                    "speedup": _num(r.get("speedup")), "speedup_lo": _num(r.get("speedup_lo")),
                    "speedup_hi": _num(r.get("speedup_hi")),
                    "verdict": r.get("verdict") if ok and isinstance(r.get("verdict"), str) else
                    ("baseline" if ok and r.get("baseline") == r.get("backend") else None),
                    "first_call_s": _num(r.get("first_call_ms")) / 1e3 if ok else math.nan,
                    "peak_gb": _num(r.get("peak_mem_bytes")) / 1e9, "rounds": r.get("rounds"),
                    "timing_mode": r.get("timing_mode"), "device": r.get("device"),
                    "note": r.get("message") if isinstance(r.get("message"), str) else ""})
    df = pd.DataFrame(out, columns=list(STEP_COLUMNS))
    df.attrs["kind"] = {c: "measured" for c in ("step_ms", "step_lo_ms", "step_hi_ms", "speedup", "speedup_lo",
                                                "speedup_hi", "first_call_s", "peak_gb")}
    return df


def breakdown_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One profiled step of each measured variant by kernel category: ``variant, category, us,
    share`` (of the profiled span on a GPU, idle included; of the attributed CPU time on the CPU),
    ``kernel_share`` (of kernel time, idle left out: what the modelled shares compare with),
    ``launches``, ``top`` (largest kernels); ``attrs``: ``span_us``, ``kernel_us``, ``idle_us``,
    ``measured_ms`` (the variant's median step) per variant, and ``kind`` (measured)."""
    rows, spans = [], {}
    for r in _ok(frame).to_dict("records"):
        raw = r.get("breakdown")
        if not isinstance(raw, str) or not raw:
            continue
        bd = json.loads(raw)
        v = r["backend"]
        spans[v] = {"span_us": bd.get("span_us"), "kernel_us": bd.get("kernel_us"), "idle_us": bd.get("idle_us"),
                    "measured_ms": _num(r.get("time_ms")), "device": bd.get("device"),
                    "notes": bd.get("notes", []), "attribution": bd.get("attribution", [])}
        busy = sum(x["us"] for x in bd["rows"] if x["category"] != "idle") or math.nan
        for x in bd["rows"]:
            rows.append({"variant": v, "category": x["category"], "us": x["us"], "share": x.get("share"),
                         "kernel_share": x["us"] / busy if x["category"] != "idle" else math.nan,
                         "launches": x.get("launches"), "top": ", ".join(x.get("top") or [])})
    df = pd.DataFrame(rows, columns=["variant", "category", "us", "share", "kernel_share", "launches", "top"])
    df.attrs.update({"spans": spans, "kind": {"us": "measured", "share": "measured", "kernel_share": "measured"}})
    return df


def breakdown_check(frame: pd.DataFrame) -> pd.DataFrame:
    """Does the profiled breakdown account for the measured step? Per variant: ``measured_ms``
    (the median step), ``profiled_ms`` (the breakdown's total: kernels plus idle on a GPU,
    attributed CPU time on the CPU), ``kernel_ms``, ``idle_ms`` and ``difference``
    (``profiled / measured - 1``), ``kernel_difference`` (``kernel / measured - 1``). The profiled
    step is one step under the profiler, whose own cost per launch lengthens the launch gaps of a
    step of many short kernels (a decode): there the kernels alone are the closer account."""
    sp = breakdown_table(frame).attrs["spans"]
    out = []
    for v, s in sp.items():
        total = (s["kernel_us"] or 0) + (s["idle_us"] or 0)
        m = s["measured_ms"]
        k = (s["kernel_us"] or 0) / 1e3
        out.append({"variant": v, "measured_ms": m, "profiled_ms": total / 1e3, "kernel_ms": k,
                    "idle_ms": (s["idle_us"] or 0) / 1e3,
                    "difference": total / 1e3 / m - 1 if m and m == m else math.nan,
                    "kernel_difference": k / m - 1 if m and m == m else math.nan})
    return pd.DataFrame(out, columns=["variant", "measured_ms", "profiled_ms", "kernel_ms", "idle_ms", "difference",
                                      "kernel_difference"])


def modelled_on(frame: pd.DataFrame, table: pd.DataFrame | None) -> tuple[pd.Series | None, str]:
    """The capture's modelled time per row of ``table`` (µs, every call of the row) on the device
    the step was measured on, where :mod:`flyexplore.results.peaks` has its datasheet peaks (H200,
    MI300X, MI355X...): the same roofline as the table's (``max(FLOPs / peak, bytes / bandwidth)``,
    the matrix peak of the call's dtype for families whose hooks say ``matrix``, else FP32), so that
    modelled and measured shares are of one device. Else the table's own modelled time (the
    target's: MI355X for gfx950). Returns ``(times or None, the device and source in words)``."""
    if table is None or not len(table):
        return None, "no capture"
    names = [d for d in frame.get("device", pd.Series(dtype=object)).dropna().unique()] if len(frame) else []
    dev = next((d for d in (PK.find_device(str(n)) for n in names) if d is not None), None)
    if dev is None:
        return table["modelled_total_us"], f"the target's datasheet peaks ({table.attrs.get('peaks') or 'MI355X'})"

    def one(r):
        h = model_hooks(r["family"]) if isinstance(r["family"], str) else None
        cls = r["dtype"] if (h is not None and h.matrix and r["dtype"] in PK.DTYPE_CLASS) else "fp32"
        tf, bw = dev.peak(cls)
        if not (r["total_flops"] == r["total_flops"] and r["total_bytes"] == r["total_bytes"]):
            return math.nan
        return max(r["total_flops"] / (tf * 1e12), r["total_bytes"] / (bw * 1e9)) * 1e6

    return table.apply(one, axis=1), f"the measuring device's datasheet peaks ({dev.name}: {dev.source})"


def beside_modelled(frame: pd.DataFrame, table: pd.DataFrame | None) -> pd.DataFrame:
    """The measured shares beside the capture's modelled ones, per variant and category:
    ``measured_share`` (of the profiled kernel time, idle left out), ``modelled_share`` (of the
    capture's roofline time in the view the variant runs, :data:`VIEW_OF`, on the measuring
    device's datasheet peaks where flyexplore has them, :func:`modelled_on`; categories are the
    families with model hooks and ``other``) and ``difference`` (measured - modelled, in share
    points). ``table``: :func:`flyexplore.results.model.coverage_table` of the same model and phase
    (``None``: no modelled column). ``attrs["modelled_on"]`` says which peaks."""
    bd = breakdown_table(frame)
    bd = bd[bd["category"] != "idle"]
    modelled: dict[tuple[str, str], float] = {}
    times, on = modelled_on(frame, table)
    if times is not None:
        t = table.assign(family=table["family"].astype(object).where(table["family"].notna(), "other"), _t=times)
        for view, g in t.groupby("view", sort=False):
            tot = g["_t"].sum()
            for fam, gg in g.groupby("family", sort=False):
                modelled[(view, fam)] = gg["_t"].sum() / tot if tot else math.nan
    out = []
    for v, g in bd.groupby("variant", sort=False):
        view = VIEW_OF.get(v, "eager")
        cats = list(dict.fromkeys(list(g["category"]) + [f for (vw, f) in modelled if vw == view]))
        for c in cats:
            ms = float(g.loc[g["category"] == c, "kernel_share"].sum()) if c in set(g["category"]) else 0.0
            mo = modelled.get((view, c), 0.0 if modelled else math.nan)
            out.append({"variant": v, "view": view, "category": c, "measured_share": ms, "modelled_share": mo,
                        "difference": ms - mo if mo == mo else math.nan})
    df = pd.DataFrame(out, columns=["variant", "view", "category", "measured_share", "modelled_share", "difference"])
    df.attrs["kind"] = {"measured_share": "measured", "modelled_share": "modelled", "difference": "measured - modelled"}
    df.attrs["modelled_on"] = on
    return df


def _rounds(r) -> list:
    raw = r.get("samples_ms")
    return json.loads(raw) if isinstance(raw, str) and raw else []


def flydsl_measured(frame: pd.DataFrame, view: str, band: float = S.BAND) -> dict:
    """The measured FlyDSL speedup that stands beside ``view``'s projection (:data:`FLYDSL_PAIRS`):
    ``{"pair", "speedup", "lo", "hi", "verdict"}`` from the two variants' paired rounds
    (:func:`flyexplore.measure.stats.paired_ratio`), or ``{"pair", "reason"}`` when one did not
    run (its row's message)."""
    fly, base = FLYDSL_PAIRS[view]
    rows = {r["backend"]: r for r in frame.to_dict("records")}
    pair = f"{fly} over {base}"
    for v in (fly, base):
        r = rows.get(v)
        if r is None:
            return {"pair": pair, "reason": f"{v} was not among the variants asked for"}
        if r.get("status") != "ok":
            return {"pair": pair, "reason": f"{v} {r.get('status')}: {r.get('message')}"}
    try:
        est, lo, hi = S.paired_ratio(_rounds(rows[base]), _rounds(rows[fly]))
    except ValueError as exc:
        return {"pair": pair, "reason": f"not timed together: {exc}"}
    return {"pair": pair, "speedup": est, "lo": lo, "hi": hi, "verdict": S.verdict(lo, hi, band)}


def projection_vs_measured(frame: pd.DataFrame, projection: pd.DataFrame | None) -> pd.DataFrame:
    """Per view: the capture's ``projected`` FlyDSL speedup (kind projection: published MI355X
    per-op figures through Amdahl's law; ``projected_lo``/``_hi``) beside the ``measured`` one
    (:func:`flyexplore_measured`: kind measured, on this device, with its interval and label) and
    their ``difference`` (measured / projected - 1), or ``reason`` where one is missing."""
    out = []
    views = list(FLYDSL_PAIRS) if projection is None or not len(projection) else list(dict.fromkeys(projection["view"]))
    for view in views:
        p = projection[projection["view"] == view] if projection is not None and len(projection) else None
        pr = p.iloc[0] if p is not None and len(p) else None
        m = flydsl_measured(frame, view)
        row = {"view": view, "projected": _num(pr["speedup"]) if pr is not None else math.nan,
               "projected_lo": _num(pr["speedup_lo"]) if pr is not None else math.nan,
               "projected_hi": _num(pr["speedup_hi"]) if pr is not None else math.nan,
               "measured_pair": m["pair"], "measured": m.get("speedup", math.nan), "measured_lo": m.get("lo", math.nan),
               "measured_hi": m.get("hi", math.nan), "verdict": m.get("verdict"),
               "reason": m.get("reason") or ("" if pr is not None else "no projection (capture without project=)")}
        row["difference"] = (row["measured"] / row["projected"] - 1
                             if np.isfinite(row["measured"]) and np.isfinite(row["projected"]) else math.nan)
        out.append(row)
    df = pd.DataFrame(out, columns=["view", "projected", "projected_lo", "projected_hi", "measured_pair", "measured",
                                    "measured_lo", "measured_hi", "verdict", "difference", "reason"])
    df.attrs["kind"] = {"projected": "projection", "measured": "measured", "difference": "measured / projected - 1"}
    return df


def isolated_sum(rows: pd.DataFrame, op: str = "gemm", backend: str = "aten") -> pd.DataFrame:
    """The product's estimate of a step's ``op`` kernel time from isolated per-call measurements:
    a sweep of the exported shapes (``flyexplore model --export-shapes`` then ``flyexplore sweep
    --shapes-from``, rows carrying ``model_uses``), per model and step the sum over the swept cases
    of ``count x time_ms`` of ``backend`` -- ``isolated_ms``, with ``cases`` and ``calls``. Each
    case was timed alone (inputs cold in L2 where the timer flushes, one call at a time): what a
    real step does not see (warm caches, back-to-back kernels, launch gaps). ``kind``: measured
    per call, summed (an estimate of the step)."""
    ok = rows[(rows["op"] == op) & (rows["backend"] == backend) & (rows["status"] == "ok")]
    acc: dict[tuple, dict] = {}
    for r in ok.itertuples(index=False):
        uses = getattr(r, "model_uses", None)
        if not isinstance(uses, str) or not uses:
            continue
        for use in json.loads(uses):
            if use.get("variant"):
                continue
            a = acc.setdefault((use.get("model", getattr(r, "model", "")), use.get("step") or use.get("phase")),
                               {"ms": 0.0, "cases": set(), "calls": 0})
            a["ms"] += use["count"] * float(r.time_ms)
            a["cases"].add(r.case)
            a["calls"] += int(use["count"])
    out = pd.DataFrame([{"model": m, "step": s, "op": op, "backend": backend, "isolated_ms": a["ms"],
                         "cases": len(a["cases"]), "calls": a["calls"], "kind": "measured per call, summed"}
                        for (m, s), a in acc.items()],
                       columns=["model", "step", "op", "backend", "isolated_ms", "cases", "calls", "kind"])
    return out
