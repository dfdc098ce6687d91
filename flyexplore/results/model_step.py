"""A measured model step as tables, beside the capture's modelled answer.

The rows come from a sweep of the ``model`` family (:mod:`flyexplore.run.model_step`); every
table says what each number is (``kind`` per column in ``attrs["kind"]``):

- ``measured``: a step's time (ms, median of paired rounds, its 95% interval), speedups against
  ``eager`` (paired rounds, interval and label), the first call (compile and autotune), the peak
  memory, and one profiled step's time by kernel category (:mod:`flyexplore.insight.breakdown`);
- ``modelled``: the capture's roofline shares (:func:`flyexplore.results.model.shares`, datasheet
  peaks at each kernel class's achieved fraction, the compiled view's pointwise calls fused as
  Inductor fuses them);
- ``projection``: the capture's Amdahl projection over published per-op FlyDSL speedups
  (:func:`flyexplore.results.model.projection`).

A modelled or projected number is never put in a measured column; where two disagree the
difference is a column of its own.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from flyexplore.measure import stats as S
from flyexplore.ops import model_hooks
from flyexplore.ops.model import operator as MO
from flyexplore.results import model as RM
from flyexplore.results import peaks as PK
from flyexplore.world.readiness import version_tuple

#: Which capture view a variant's step is the real run of: eager variants run what the eager view
#: captured, compiled variants what Inductor lowers (the compiled view).
VIEW_OF = {"eager": "eager", "eager_flydsl": "eager", "eager_ck": "eager", "compile": "compiled",
           "max_autotune": "compiled", "max_autotune_flydsl": "compiled", "eager_graph": "eager",
           "eager_flydsl_graph": "eager", "compile_graph": "compiled", "max_autotune_graph": "compiled",
           "max_autotune_flydsl_graph": "compiled"}
#: The measured FlyDSL speedup that stands beside each view's projection: (FlyDSL variant, its
#: baseline variant).
FLYDSL_PAIRS = {"eager": ("eager_flydsl", "eager"), "compiled": ("max_autotune_flydsl", "max_autotune")}
#: The same pairs with both variants in CUDA/HIP graphs: shown beside the projection too where
#: either of them was measured (in graphs, the launch gaps a FlyDSL kernel's speedup is diluted by
#: are gone).
FLYDSL_GRAPH_PAIRS = {"eager": ("eager_flydsl_graph", "eager_graph"),
                      "compiled": ("max_autotune_flydsl_graph", "max_autotune_graph")}

STEP_COLUMNS = ("model", "phase", "batch", "seq", "layers", "dtype", "variant", "status", "step_ms", "step_lo_ms",
                "step_hi_ms", "speedup", "speedup_lo", "speedup_hi", "verdict", "first_call_s", "peak_gb", "rounds",
                "timing_mode", "device", "err_rel", "graphs", "restore_bytes", "note")
#: The step table's status of a variant that ran but whose logits failed the check against eager's
#: (``accuracy_ok`` false): its row in the result file keeps status ``ok`` (it was measured; the
#: ``accuracy_ok`` column says it is wrong, as for every family), but the step's answer never calls
#: it ``ok``.
CHECK_FAILED = "check failed"


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame.iloc[0:0]


def check_failed(row) -> bool:
    """Whether a result row (a dict) ran but failed its check: status ``ok`` and ``accuracy_ok``
    false (a bool, or ``"False"`` as a CSV reads back)."""
    v = row.get("accuracy_ok")
    return row.get("status") == "ok" and (v is False or (isinstance(v, (bool, np.bool_)) and not v)
                                          or str(v).strip().lower() == "false")


def _status(row) -> str:
    return CHECK_FAILED if check_failed(row) else row.get("status")


def _check_note(row) -> str:
    """``check failed: err_rel X > tolerance T`` for a row that failed its check, else ``""``."""
    if not check_failed(row):
        return ""
    tol = _num(row.get("err_tol"))
    return (f"check failed: logits err_rel {_num(row.get('err_rel')):.3g} against eager's"
            + (f" > tolerance {tol:.3g}" if math.isfinite(tol) else ""))


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
    ``rounds``, ``timing_mode``, ``device``; ``status`` (the row's, except :data:`CHECK_FAILED`
    for a variant that ran but whose logits failed the check: its times stay, measured, and
    ``note`` says by how much) and ``note`` (why a variant did not run, or the row's notes);
    ``err_rel`` (the logits against eager's), ``graphs`` (what the variant does with CUDA/HIP
    graphs, :data:`flyexplore.ops.model.operator.GRAPHS`) and ``restore_bytes`` (a decode step:
    the bytes of state each call restores before it runs). ``attrs["kind"]``: every time column
    is measured."""
    out = []
    for r in frame.to_dict("records"):
        ok = r.get("status") == "ok"
        notes = [n for n in (_check_note(r), r.get("message") if isinstance(r.get("message"), str) else "") if n]
        out.append({"model": r.get("model"), "phase": r.get("phase"), "batch": r.get("batch"), "seq": r.get("seq"),
                    "layers": r.get("layers"), "dtype": r.get("dtype"), "variant": r.get("backend"),
                    "status": _status(r), "err_rel": _num(r.get("err_rel")),
                    "graphs": MO.graphs_text(str(r.get("backend"))),
                    "restore_bytes": _num(r.get("state_restore_bytes")),
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
                    "note": "; ".join(notes)})
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
    step of many short kernels (a decode): there the kernels alone are the closer account.

    ``bounded_ms`` and ``bounded_difference``: the kernels plus ``min(profiled idle, measured -
    kernels)`` (``bounded_idle_ms``). The kernels' durations do not change under the profiler
    (the README's decode: kernels within 0.6-3% of the step), so the idle of an unprofiled step is at
    most the measured median less the kernels; a profiled gap past that is the profiler's. This
    bounds only the idle: the kernels themselves still have to account for the step (a kernel sum
    5% short stays 5% short, one past the measured step stays past it)."""
    sp = breakdown_table(frame).attrs["spans"]
    out = []
    for v, s in sp.items():
        idle = s["idle_us"] or 0
        total = (s["kernel_us"] or 0) + idle
        m = s["measured_ms"]
        k = (s["kernel_us"] or 0) / 1e3
        ok = bool(m and m == m)
        bidle = min(idle / 1e3, max(m - k, 0.0)) if ok else idle / 1e3
        out.append({"variant": v, "measured_ms": m, "profiled_ms": total / 1e3, "kernel_ms": k,
                    "idle_ms": idle / 1e3,
                    "difference": total / 1e3 / m - 1 if ok else math.nan,
                    "kernel_difference": k / m - 1 if ok else math.nan,
                    "bounded_idle_ms": bidle, "bounded_ms": k + bidle,
                    "bounded_difference": (k + bidle) / m - 1 if ok else math.nan})
    return pd.DataFrame(out, columns=["variant", "measured_ms", "profiled_ms", "kernel_ms", "idle_ms", "difference",
                                      "kernel_difference", "bounded_idle_ms", "bounded_ms", "bounded_difference"])


#: transformers builds an explicit causal mask while Dynamo traces the model on torch before this
#: version, so a compiled step's SDPA takes the memory-efficient kernel where eager takes flash
#: (transformers 5.17-5.25 ``masking_utils._ignore_causal_mask_sdpa``: "This requires
#: torch>=2.14 ... older versions keep the previous behavior of never skipping while compiling").
MASK_UNDER_COMPILE_BEFORE = (2, 14)


def _torch_version(frame: pd.DataFrame) -> tuple[int, ...] | None:
    """The (major, minor) torch release of the rows (:func:`flyexplore.world.readiness.version_tuple`
    of the first that parses), ``None`` where none does."""
    vs = frame.get("torch", pd.Series(dtype=object)).dropna().unique() if len(frame) else ()
    return next((t for t in (version_tuple(str(v)) for v in vs) if t is not None), None)


def modelled_on(frame: pd.DataFrame, table: pd.DataFrame | None) -> tuple[pd.Series | None, str]:
    """The capture's modelled time per row of ``table`` (µs, every call of the row) on the device
    the step was measured on, where :mod:`flyexplore.results.peaks` has its datasheet peaks (H200,
    MI300X, MI355X...): the same model as the table's -- ``max(FLOPs / (peak x achieved), bytes /
    (bandwidth x achieved))``, the matrix peak of the call's dtype for families whose hooks say
    ``matrix``, else FP32; the fraction of peak of the row's ``kernel_class`` on that device
    (:data:`flyexplore.results.peaks.ACHIEVED`); a compiled row's ``fused_bytes`` -- so that
    modelled and measured shares are of one device. One rule of the measuring environment: on torch
    older than :data:`MASK_UNDER_COMPILE_BEFORE` (the rows' ``torch``) a compiled step's causal
    SDPA call gets an explicit mask, so it is modelled as the memory-efficient kernel computing
    every score (twice the causal FLOPs). Else the table's own modelled time (the target's:
    MI355X for gfx950). Returns ``(times or None, the device, fractions and rules in words)``."""
    if table is None or not len(table):
        return None, "no capture"
    names = [d for d in frame.get("device", pd.Series(dtype=object)).dropna().unique()] if len(frame) else []
    dev = next((d for d in (PK.find_device(str(n)) for n in names) if d is not None), None)
    if dev is None:
        return table["modelled_total_us"], f"the target's datasheet peaks ({table.attrs.get('peaks') or 'MI355X'})"
    tv = _torch_version(frame)
    masked = tv is not None and tv < MASK_UNDER_COMPILE_BEFORE
    hit = []

    def one(r):
        h = model_hooks(r["family"]) if isinstance(r["family"], str) else None
        kc = r.get("kernel_class")
        if not isinstance(kc, str):
            kc = "gemm" if h is not None and h.matrix else "unfused"
        flops = r["total_flops"]
        nbytes = r["fused_bytes"] * r["count"] if "fused_bytes" in r and r["fused_bytes"] == r["fused_bytes"] \
            else r["total_bytes"]
        if (masked and r.get("view") == "compiled" and kc == "sdpa_flash"
                and "is_causal=True" in str(r.get("args", ""))):
            kc, flops = "sdpa_efficient", 2 * flops
            hit.append(r["count"])
        return RM.roofline_on(dev, r["family"], r["dtype"], flops, nbytes, kc)

    times = table.apply(one, axis=1)
    text = (f"the measuring device's datasheet peaks ({dev.name}: {dev.source}) at each kernel class's "
            f"{PK.achieved_text(dev.name)}; compiled view: pointwise calls fused as Inductor fuses them")
    if hit:
        text += (f"; torch {'.'.join(map(str, tv))} < {'.'.join(map(str, MASK_UNDER_COMPILE_BEFORE))}: "
                 "the compiled step's causal SDPA gets transformers' explicit mask, so it is modelled as the "
                 "memory-efficient kernel computing every score")
    return times, text


def beside_modelled(frame: pd.DataFrame, table: pd.DataFrame | None) -> pd.DataFrame:
    """The measured shares beside the capture's modelled ones, per variant and category:
    ``measured_share`` (of the profiled kernel time, idle left out), ``modelled_share`` (of the
    capture's modelled time in the view the variant runs, :data:`VIEW_OF`, on the measuring
    device's peaks at each kernel class's achieved fraction where flyexplore has them,
    :func:`modelled_on`; categories are the families with model hooks and ``other``, a row counted
    in the category of the kernel it runs in, ``kernel_category``: a residual add fused into an
    RMSNorm is rmsnorm's, as the measured breakdown counts Inductor's kernel) and ``difference`` (measured - modelled, in share
    points). ``table``: :func:`flyexplore.results.model.coverage_table` of the same model and phase
    (``None``: no modelled column). ``attrs["modelled_on"]`` says which peaks."""
    bd = breakdown_table(frame)
    bd = bd[bd["category"] != "idle"]
    modelled: dict[tuple[str, str], float] = {}
    times, on = modelled_on(frame, table)
    if times is not None:
        cat = table["kernel_category"] if "kernel_category" in table else table["family"]
        t = table.assign(_cat=cat.astype(object).where(cat.notna(), "other"), _t=times)
        for view, g in t.groupby("view", sort=False):
            tot = g["_t"].sum()
            for fam, gg in g.groupby("_cat", sort=False):
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


def _top(text: str) -> list[tuple[str, float]]:
    """``"name (123.4), other (5.0)"`` -> ``[("name", 123.4), ("other", 5.0)]`` (a breakdown row's
    ``top``, µs)."""
    out = []
    for part in re.findall(r"(.+?) \(([\d.]+)\)(?:, |$)", text or ""):
        out.append((part[0].strip(), float(part[1])))
    return out


#: What a kernel name says of its SDPA kind (the names the breakdown's attention rule reads).
_SDPA_KIND = ((r"^triton_(poi|red|per)_", "an Inductor-fused kernel"),
              (r"^triton_tem_", "an Inductor template"),
              (r"^pytorch_flash::|^flash(::|_fwd|_bwd|_attn)", "a flash-attention kernel"),
              (r"(?i)^fmha_cutlass|efficient_attention", "a memory-efficient kernel"),
              (r"^cudnn_generated_fort_native_sdpa", "a cuDNN SDPA kernel"),
              (r"^at::native::", "an ATen kernel"))


def _kind_of(name: str) -> str:
    return next((w for pat, w in _SDPA_KIND if re.search(pat, name)), "")


def largest_gap(frame: pd.DataFrame, table: pd.DataFrame | None) -> dict | None:
    """The category whose measured share most exceeds its modelled one, and the kernels behind it
    (:func:`beside_modelled`'s ``difference``, every variant; the largest absolute difference when
    none is positive): shares add up to 1, so time the model misses in one category shows as
    surplus in the others, and the missed time is where to look. ``variant``, ``view``,
    ``category``, ``measured_share``, ``modelled_share``, ``difference`` (points, measured -
    modelled), ``measured_ms`` (that category's kernel time in the profiled step) and
    ``modelled_ms`` (its modelled share of the profiled kernel time, ms); ``kernels`` (the
    category's top kernels in that variant: ``(name, ms)``), ``others`` (per other variant that
    ran: its top kernels of the category, where they differ by name) and ``text``, one line
    saying it (``compile attention: measured 31.3% (19.26 ms) vs modelled 2.4% ...;
    fmha_cutlassF_... (a memory-efficient kernel) 19.26 ms, where eager ran
    pytorch_flash::flash_fwd_kernel (a flash-attention kernel) 5.675 ms``). ``None`` when no
    variant has both shares."""
    bm = beside_modelled(frame, table)
    bm = bm[bm["difference"].notna()]
    if not len(bm):
        return None
    pos = bm[bm["difference"] > 0]
    r = pos.loc[pos["difference"].idxmax()] if len(pos) else bm.loc[bm["difference"].abs().idxmax()]
    bd = breakdown_table(frame)
    spans = bd.attrs["spans"]

    def tops(v):
        g = bd[(bd["variant"] == v) & (bd["category"] == r["category"])]
        return [(n, us / 1e3) for n, us in _top(g["top"].iloc[0])] if len(g) else []

    k_ms = (spans.get(r["variant"], {}).get("kernel_us") or math.nan) / 1e3
    meas_ms = float(bd[(bd["variant"] == r["variant"]) & (bd["category"] == r["category"])]["us"].sum()) / 1e3
    mine = tops(r["variant"])
    names = {n for n, _ in mine[:1]}
    others = {v: tops(v) for v in spans if v != r["variant"]}
    others = {v: t for v, t in others.items() if t and t[0][0] not in names}
    txt = (f"{r['variant']} {r['category']}: measured {100 * r['measured_share']:.1f}% ({meas_ms:.4g} ms) vs "
           f"modelled {100 * r['modelled_share']:.1f}% ({r['modelled_share'] * k_ms:.4g} ms of the kernel time), "
           f"{100 * r['difference']:+.1f} points")
    if mine:
        n, ms = mine[0]
        kind = _kind_of(n)
        txt += f"; {n}{f' ({kind})' if kind else ''} {ms:.4g} ms"
        if len(mine) > 1:
            txt += ", then " + ", ".join(f"{a} {b:.4g} ms" for a, b in mine[1:])
    for v, t in others.items():
        n, ms = t[0]
        kind = _kind_of(n)
        txt += f", where {v} ran {n}{f' ({kind})' if kind else ''} {ms:.4g} ms"
    return {"variant": r["variant"], "view": r["view"], "category": r["category"],
            "measured_share": float(r["measured_share"]), "modelled_share": float(r["modelled_share"]),
            "difference": float(r["difference"]), "measured_ms": meas_ms, "modelled_ms": float(r["modelled_share"]) * k_ms,
            "kernels": mine, "others": others, "text": txt}


def _rounds(r) -> list:
    raw = r.get("samples_ms")
    return json.loads(raw) if isinstance(raw, str) and raw else []


def flydsl_measured(frame: pd.DataFrame, view: str, band: float = S.BAND, graphs: bool = False) -> dict:
    """The measured FlyDSL speedup that stands beside ``view``'s projection (:data:`FLYDSL_PAIRS`;
    ``graphs``: :data:`FLYDSL_GRAPH_PAIRS`): ``{"pair", "speedup", "lo", "hi", "verdict"}`` from the
    two variants' paired rounds (:func:`flyexplore.measure.stats.paired_ratio`), or ``{"pair",
    "reason"}`` when one did not run (its row's message) or failed its check (a wrong step's speedup
    is no speedup)."""
    fly, base = (FLYDSL_GRAPH_PAIRS if graphs else FLYDSL_PAIRS)[view]
    rows = {r["backend"]: r for r in frame.to_dict("records")}
    pair = f"{fly} over {base}"
    for v in (fly, base):
        r = rows.get(v)
        if r is None:
            return {"pair": pair, "reason": f"{v} was not among the variants asked for"}
        if r.get("status") != "ok":
            return {"pair": pair, "reason": f"{v} {r.get('status')}: {r.get('message')}"}
        if check_failed(r):
            return {"pair": pair, "reason": f"{v} {_check_note(r)}"}
    try:
        est, lo, hi = S.paired_ratio(_rounds(rows[base]), _rounds(rows[fly]))
    except ValueError as exc:
        return {"pair": pair, "reason": f"not timed together: {exc}"}
    return {"pair": pair, "speedup": est, "lo": lo, "hi": hi, "verdict": S.verdict(lo, hi, band)}


def projection_vs_measured(frame: pd.DataFrame, projection: pd.DataFrame | None) -> pd.DataFrame:
    """Per view: the capture's ``projected`` FlyDSL speedup (kind projection: published MI355X
    per-op figures through Amdahl's law; ``projected_lo``/``_hi``) beside the ``measured`` one
    (:func:`flyexplore_measured`: kind measured, on this device, with its interval and label) and
    their ``difference`` (measured / projected - 1), or ``reason`` where one is missing. A view
    has a second row, its pair in CUDA/HIP graphs (:data:`FLYDSL_GRAPH_PAIRS`), where either of
    those variants is among ``frame``'s rows."""
    out = []
    views = list(FLYDSL_PAIRS) if projection is None or not len(projection) else list(dict.fromkeys(projection["view"]))
    asked = set(frame["backend"]) if "backend" in frame else set()
    todo = [(v, False) for v in views]
    todo += [(v, True) for v in views if v in FLYDSL_GRAPH_PAIRS and asked & set(FLYDSL_GRAPH_PAIRS[v])]
    todo.sort(key=lambda t: views.index(t[0]))
    for view, graphs in todo:
        p = projection[projection["view"] == view] if projection is not None and len(projection) else None
        pr = p.iloc[0] if p is not None and len(p) else None
        m = flydsl_measured(frame, view, graphs=graphs)
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


#: Where the serving rule comes from: vLLM's design page on CUDA graphs (its V1 ``cudagraph_mode``
#: default ``FULL_AND_PIECEWISE``: full graphs for uniform decode batches, piecewise graphs --
#: attention left out -- for prefill and mixed batches; capture sizes cut to ``max_num_seqs``,
#: ``vllm/v1/worker/gpu/cudagraph_utils.py``) and SGLang's server arguments
#: (``--cuda-graph-max-bs``: decode batches up to it replay CUDA graphs; prefill runs without).
SERVING_SOURCE = ("vLLM docs, 'CUDA Graphs' (docs.vllm.ai/en/latest/design/cuda_graphs/); SGLang server "
                  "arguments (--cuda-graph-max-bs)")
#: The variants that stand for what a serving stack runs, per phase, in order of preference:
#: decode -- the graph variants (vLLM compiles with Inductor and replays full graphs: compile_graph;
#: SGLang replays CUDA graphs of its eager model: eager_graph); prefill -- no full graphs.
SERVING_VARIANTS = {"decode": ("compile_graph", "eager_graph", "max_autotune_graph", "max_autotune_flydsl_graph",
                               "eager_flydsl_graph"),
                    "prefill": ("compile", "max_autotune", "eager")}
#: The largest decode batch taken as replayed in a graph by default: vLLM caps its default CUDA
#: graph capture sizes at 512 (``max_cudagraph_capture_size``; a deployment may raise it), and
#: SGLang's ``--cuda-graph-max-bs`` default is smaller. A larger batch runs without full graphs.
MAX_GRAPH_BATCH = 512


def serving_variant(phase: str, batch: int, rows: pd.DataFrame | None = None,
                    max_graph_batch: int = MAX_GRAPH_BATCH) -> dict:
    """Which measured variant stands for what a serving stack runs in ``phase`` at ``batch``
    sequences: ``{"phase", "batch", "variants", "measured", "text"}``. ``variants``: the ones that
    stand for serving (:data:`SERVING_VARIANTS`); ``measured``: those of them among ``rows`` (a
    ``model`` sweep's) that ran with their check passed; ``text``: the rule in one line, naming
    its source (:data:`SERVING_SOURCE`).

    decode: vLLM and SGLang replay CUDA/HIP graphs for decode batches (vLLM up to its largest
    capture size -- ``cudagraph_capture_sizes``, at most ``max_num_seqs`` --, SGLang up to
    ``--cuda-graph-max-bs``); a batch past ``max_graph_batch`` (:data:`MAX_GRAPH_BATCH`) runs
    without them, as a prefill does. prefill: neither replays a full graph (vLLM's piecewise graphs
    at most), so the variants without graphs stand for serving. Raises ``ValueError`` for an
    unknown phase."""
    if phase not in SERVING_VARIANTS:
        raise ValueError(f"unknown phase {phase!r} (valid: {', '.join(SERVING_VARIANTS)})")
    graphs = phase == "decode" and int(batch) <= int(max_graph_batch)
    want = SERVING_VARIANTS["decode" if graphs else "prefill"]
    done = []
    if rows is not None and len(rows):
        by = {r.get("backend"): r for r in rows.to_dict("records")}
        done = [v for v in want if v in by and by[v].get("status") == "ok" and not check_failed(by[v])]
    got = f" (measured here: {', '.join(done)})" if done else " (none of them measured here)"
    if graphs:
        text = (f"serving: a decode batch of {batch} is replayed as CUDA/HIP graphs by vLLM (full graphs for decode "
                f"batches up to its largest capture size, {max_graph_batch} by default) and SGLang (up to "
                f"--cuda-graph-max-bs): the graph variants ({', '.join(want[:2])}) are what serving runs{got}; "
                f"source: {SERVING_SOURCE}")
    elif phase == "decode":
        text = (f"serving: a decode batch of {batch} is past the largest batch serving stacks capture in CUDA/HIP "
                f"graphs by default ({max_graph_batch}): it runs without full graphs, so the variants without graphs "
                f"({', '.join(want)}) are what serving runs{got}; source: {SERVING_SOURCE}")
    else:
        text = (f"serving: prefill runs without full CUDA/HIP graphs (vLLM: piecewise graphs around attention at most; "
                f"SGLang: none): the variants without graphs ({', '.join(want)}) are what serving runs{got}; "
                f"source: {SERVING_SOURCE}")
    return {"phase": phase, "batch": int(batch), "variants": list(want), "measured": done, "text": text}
