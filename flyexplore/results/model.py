"""A model's coverage as tables: shares, a modelled time, a projection, shapes to sweep, measured weights.

Every number here says what it is (the ``kind`` column and the table's ``attrs["kind"]``):

- **captured from the model** (``kind="captured"``): FLOPs and bytes of each captured call
  (:func:`flyexplore.insight.capture.cost`), and their shares per call, module and category.
- **modelled** (``kind="modelled"``): a roofline time per call on the target, ``max(FLOPs /
  (peak FLOP/s x achieved), bytes / (peak bandwidth x achieved))``, with the datasheet peaks of
  :mod:`flyexplore.results.peaks` (gfx950: MI355X; sources named there) and the fraction of them
  the call's kernel class achieves (:data:`flyexplore.results.peaks.ACHIEVED`: GEMMs, SDPA by
  kernel, fused and unfused pointwise). GEMM-like calls (mm, grouped mm, attention) use the
  matrix peak of their dtype, the rest the FP32 vector peak. In the compiled view, pointwise calls
  count the bytes of Inductor's fused kernels (:mod:`flyexplore.results.fusion`).
- **projection** (``kind="projection"``): a whole-model speedup by Amdahl's law over the modelled
  time, if every eligible call ran at a per-operator FlyDSL speedup taken from a source the user
  picks (:data:`PROJECTION_SOURCES`), with an interval carried from the per-operator intervals.
  It is never a measurement.
- **measured** (``kind="measured"``): :func:`weighted_estimate` weights a sweep of the exported
  shapes (``flyexplore sweep --shapes-from``) by the model's call counts: the measured
  whole-model kernel-time estimate over the calls that were measured.
"""
from __future__ import annotations

import json
import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.capture import Call, module_pattern
from flyexplore.insight.coverage import Judged, nt_expert_weight
from flyexplore.insight.expert_routing import expert_rows
from flyexplore.ops import get_op, model_hooks
from flyexplore.results import fusion as FU
from flyexplore.results import published as P
from flyexplore.results import peaks as PK
from flyexplore.results import table as R

#: The device whose peaks model the time on each target arch.
TARGET_DEVICE = {"gfx950": "MI355X", "gfx942": "MI300X"}
#: Where a projection's per-operator speedups come from.
PROJECTION_SOURCES = ("published", "results")


def deciding_view(family: str) -> str:
    """The capture view that decides ``family`` (its hooks' ``view``; ``eager`` without hooks):
    exported shapes take the family's calls from it."""
    h = model_hooks(family)
    return h.view if h is not None else "eager"
#: Columns of :func:`coverage_table`.
COLUMNS = ("model", "step", "phase", "batch", "seq", "view", "op", "family", "module", "module_type", "count", "shapes",
           "args", "dtype", "status", "category", "reason", "kernel", "flops", "bytes", "total_flops", "total_bytes",
           "flops_share", "bytes_share", "kernel_class", "fusion_group", "fused_bytes", "kernel_category", "modelled_us",
           "modelled_total_us", "modelled_share", "notes")


def _peaks(arch: str):
    dev = PK.find_device(TARGET_DEVICE.get(arch, "MI355X"), required=True)
    return dev


def kernel_class(c: Call, fused: bool = False) -> str:
    """The kernel class of a captured call (:data:`flyexplore.results.peaks.KERNEL_CLASSES`), which
    picks its achieved fraction of peak: ``gemm`` for the GEMM families (dense, grouped, scaled:
    hooks saying ``matrix``) and ATen's GEMM ops; SDPA by the kernel torch's SDPA takes for it
    (torch 2.15 ``sdp_utils``: flash needs fp16/bf16 and no ``attn_mask``; an explicit mask or fp32
    takes the memory-efficient kernel): ``sdpa_flash`` / ``sdpa_efficient``; else ``fused`` when the
    call is part of one of Inductor's fused kernels (``fused``: the compiled view,
    :mod:`flyexplore.results.fusion`) or ``unfused`` (ATen's own kernel per call, the eager view)."""
    if c.family == "attention":
        return "sdpa_efficient" if (c.arg("attn_mask") is not None or c.dtype == "fp32") else "sdpa_flash"
    h = model_hooks(c.family) if c.family else None
    if (h is not None and h.matrix) or c.op in FU.GEMM_OPS:
        return "gemm"
    return "fused" if fused else "unfused"


def modelled_us(c: Call, arch: str = "gfx950", *, nbytes: float | None = None, kclass: str | None = None) -> float:
    """The modelled time of one call on ``arch``'s device, µs (module docstring): ``max(FLOPs /
    (peak x achieved), bytes / (bandwidth x achieved))`` with the fraction of peak its kernel class
    achieves there (:func:`kernel_class`, :func:`flyexplore.results.peaks.achieved`). ``nbytes``:
    the bytes to count (a fused call's share of its kernel, :mod:`flyexplore.results.fusion`;
    default the call's own); ``kclass``: the class (default :func:`kernel_class` unfused). NaN when
    the call's cost is unknown."""
    return roofline_on(_peaks(arch), c.family, c.dtype, c.flops, c.bytes if nbytes is None else nbytes,
                       kclass or kernel_class(c))


def roofline_on(dev: PK.DevicePeaks, family: str | None, dtype: str, flops: float, nbytes: float,
                kclass: str) -> float:
    """The modelled time, µs, of ``flops`` FLOPs and ``nbytes`` bytes on ``dev``: ``max(FLOPs /
    (peak x achieved), bytes / (bandwidth x achieved))`` (:func:`flyexplore.results.peaks.roofline_us`)
    with the matrix peak of ``dtype`` for a family whose hooks say ``matrix``, else the FP32 peak,
    and the fraction of peak ``kclass`` (:data:`flyexplore.results.peaks.KERNEL_CLASSES`) achieves
    on ``dev``. NaN when a cost is unknown. The one rule of :func:`modelled_us` (the target) and
    :func:`flyexplore.results.model_step.modelled_on` (the measuring device)."""
    h = model_hooks(family) if isinstance(family, str) else None
    cls = dtype if (h is not None and h.matrix and dtype in PK.DTYPE_CLASS) else "fp32"
    tf, bw = dev.peak(cls)
    return PK.roofline_us(flops, nbytes, tf, bw, PK.achieved(dev.name, kclass))


def _args_text(c: Call) -> str:
    """The call's arguments as the explainer prints them: ``self=bf16[2048, 4096], mat2=bf16[4096, 1024]
    stride (1, 4096)``, then its scalars."""
    parts = [f"{n}={'None' if t is None else t.text()}" for n, t in zip(c.names, c.inputs)] if c.names else \
        [("None" if t is None else t.text()) for t in c.inputs]
    parts += [f"{k}={v!r}" for k, v in c.scalars.items() if k != "ops"]
    return ", ".join(parts)


def coverage_table(judged: Iterable[Judged]) -> pd.DataFrame:
    """One row per distinct call and view (:data:`COLUMNS`): where it was made (``module`` with
    list indices as ``*``), ``count``, shapes, the verdict (``status``, ``category``, ``reason``,
    ``kernel``), FLOPs and bytes per call and in total (``kind`` captured), their shares within
    the capture (phase and view), and the modelled roofline time (µs, per call and in total) and
    its share (``kind`` modelled). The modelled time is the call's kernel class
    (``kernel_class``, :func:`kernel_class`) at its achieved fraction of peak
    (:data:`flyexplore.results.peaks.ACHIEVED`); in the compiled view pointwise calls are fused as
    Inductor fuses them (:mod:`flyexplore.results.fusion`): ``fusion_group`` numbers a call's
    fused kernel within its capture (empty for extern calls and in the eager view),
    ``fused_bytes`` are the bytes per call it adds to that kernel (the call's own ``bytes``
    elsewhere) and the modelled time counts those; ``kernel_category`` is the category of the
    kernel the call runs in, as the measured breakdown names it (a residual add fused into an
    RMSNorm is rmsnorm's). ``attrs``: ``kind`` per column group, ``peaks`` (the device and
    source of the modelled time), ``assumptions`` and ``layers`` per capture, ``uncaptured``."""
    rows, assumptions, layers, uncaptured = [], {}, {}, []
    peaks_src = None
    for j in judged:
        cap = j.capture
        m = cap.meta
        key = f"{m.get('model', cap.label)} {cap.step} {cap.view}"
        assumptions[key] = list(dict.fromkeys(cap.assumptions))
        layers[key] = cap.layers.get("text", "")
        uncaptured += [{**u, "view": cap.view, "step": cap.step} for u in cap.uncaptured]
        dev = _peaks(cap.arch)
        peaks_src = f"{dev.name}: {dev.source}"
        calls = [c for c, _, _ in j.rows]
        fused = FU.fuse(calls) if cap.view == "compiled" else [None] * len(calls)
        cats = FU.kernel_categories(calls, fused)
        for (c, n, v), fu, kcat in zip(j.rows, fused, cats):
            fb = fu.bytes if fu is not None else c.bytes
            kc = kernel_class(c, fused=fu is not None and fu.kind == "fused")
            t = modelled_us(c, cap.arch, nbytes=fb, kclass=kc)
            rows.append({"model": m.get("model", cap.label), "step": cap.step, "phase": cap.phase,
                         "batch": m.get("batch"),
                         "seq": m.get("seq"), "view": cap.view, "op": c.op, "family": c.family,
                         "module": module_pattern(c.module), "module_type": c.module_type, "count": n,
                         "shapes": c.shapes(), "args": _args_text(c), "dtype": c.dtype, "status": v.status, "category": v.category,
                         "reason": v.reason, "kernel": v.kernel, "flops": c.flops, "bytes": c.bytes,
                         "total_flops": c.flops * n, "total_bytes": c.bytes * n, "kernel_class": kc,
                         "fusion_group": fu.group if fu is not None else None, "fused_bytes": fb,
                         "kernel_category": kcat, "modelled_us": t,
                         "modelled_total_us": t * n,
                         "notes": "; ".join(([c.note] if c.note and c.note not in v.reason else []) + list(v.notes))})
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("flops_share", "bytes_share", "modelled_share")])
    if len(df):
        g = df.groupby(["model", "step", "view"], sort=False)
        df["flops_share"] = df["total_flops"] / g["total_flops"].transform("sum")
        df["bytes_share"] = df["total_bytes"] / g["total_bytes"].transform("sum")
        df["modelled_share"] = df["modelled_total_us"] / g["modelled_total_us"].transform("sum")
    else:
        for c in ("flops_share", "bytes_share", "modelled_share"):
            df[c] = pd.Series(dtype="float64")
    df = df[list(COLUMNS)]
    df.attrs.update({"kind": {"flops": "captured", "bytes": "captured", "flops_share": "captured",
                              "bytes_share": "captured", "modelled_us": "modelled", "modelled_share": "modelled"},
                     "peaks": peaks_src, "assumptions": assumptions, "layers": layers, "uncaptured": uncaptured})
    return df


def shares(table: pd.DataFrame, by: str = "category") -> pd.DataFrame:
    """FLOP, byte and modelled-time shares of ``table`` (:func:`coverage_table`) per ``by``
    (``category``, ``status``, ``module``, ``family``, ``op``) within each model, step and view:
    columns ``model, step, view, <by>, calls, flops_share, bytes_share, modelled_share,
    modelled_us`` (the total, µs), largest modelled share first."""
    if by not in table.columns:
        raise bad_choice("share grouping", by, ("category", "status", "module", "family", "op"))
    keys = ["model", "step", "view", by]
    table = table.assign(**{by: table[by].astype(object).where(table[by].notna(), "none")})
    g = table.groupby(keys, sort=False, dropna=False).agg(
        calls=("count", "sum"), flops=("total_flops", "sum"), bytes=("total_bytes", "sum"),
        modelled_us=("modelled_total_us", "sum")).reset_index()
    tot = g.groupby(["model", "step", "view"], sort=False)
    g["flops_share"] = g["flops"] / tot["flops"].transform("sum")
    g["bytes_share"] = g["bytes"] / tot["bytes"].transform("sum")
    g["modelled_share"] = g["modelled_us"] / tot["modelled_us"].transform("sum")
    g["_order"] = range(len(g))
    first = g.groupby(["model", "step", "view"], sort=False)["_order"].transform("min")
    g = g.assign(_first=first).sort_values(["_first", "modelled_share"], ascending=[True, False], kind="stable")
    out = g[[*keys, "calls", "flops_share", "bytes_share", "modelled_share", "modelled_us"]].reset_index(drop=True)
    out.attrs["kind"] = {"flops_share": "captured", "bytes_share": "captured", "modelled_share": "modelled",
                         "modelled_us": "modelled"}
    return out


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, phase and view: calls, eligible calls, and the eligible share of FLOPs, bytes and
    modelled time (``eligible_*``)."""
    el = table["status"] == "eligible"
    t = table.assign(_ef=np.where(el, table["total_flops"], 0.0), _eb=np.where(el, table["total_bytes"], 0.0),
                     _et=np.where(el, table["modelled_total_us"], 0.0), _ec=np.where(el, table["count"], 0))
    g = t.groupby(["model", "step", "view"], sort=False).agg(
        calls=("count", "sum"), eligible_calls=("_ec", "sum"), flops=("total_flops", "sum"),
        ef=("_ef", "sum"), bytes=("total_bytes", "sum"), eb=("_eb", "sum"), modelled_us=("modelled_total_us", "sum"),
        et=("_et", "sum")).reset_index()
    g["eligible_flops_share"] = g["ef"] / g["flops"]
    g["eligible_bytes_share"] = g["eb"] / g["bytes"]
    g["eligible_modelled_share"] = g["et"] / g["modelled_us"]
    return g[["model", "step", "view", "calls", "eligible_calls", "eligible_flops_share", "eligible_bytes_share",
              "eligible_modelled_share", "modelled_us"]]


# -- per-operator speedups and the projection ------------------------------------------------------

def call_dims(family: str, c: Call) -> dict | None:
    """The catalogue dims of a captured call, as its family's hooks give them
    (:attr:`flyexplore.ops.base.ModelHooks.dims`: gemm m,n,k; grouped_gemm g,m,n,k with M per
    group under uniform routing; rmsnorm m,n; topk m,n,k), ``None`` when it has none."""
    h = model_hooks(family)
    if h is None or h.dims is None:
        return None
    try:
        return h.dims(c)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def _speedup_table(source: str, results: pd.DataFrame | None, baseline: str | Sequence[str]) -> pd.DataFrame:
    if source == "published":
        df, label = P.load(), "published MI355X"
    else:
        if results is None:
            raise UsageError("a projection from results needs a result file measured with flydsl rows "
                             "(--speedups FILE)")
        df, label = results, "measured"
    s = R.speedup(df, baseline=baseline)
    s = s[s["backend"] == "flydsl"].copy()
    if s.empty:
        raise UsageError(f"the {label} rows hold no flydsl speedup against {baseline if isinstance(baseline, str) else ' / '.join(baseline)}")
    dims = []
    for op, case in zip(s["op"], s["case"]):
        try:
            p = get_op(op).case(case).p
        except (UsageError, KeyError):
            p = {}
        dims.append(p)
    s["dims"] = dims
    s["label"] = label
    return s


def _nearest(s: pd.DataFrame, family: str, dims: Mapping, dtype: str, k: int = 3) -> list[dict]:
    """The ``k`` nearest measured/published cases of ``family`` by log-distance over the dims."""
    cand = s[(s["op"] == family)]
    same = cand[cand["dtype"] == dtype]
    cand = same if len(same) else cand
    out = []
    for _, r in cand.iterrows():
        p = r["dims"]
        if not all(d in p for d in dims):
            continue
        dist = sum(abs(math.log(max(dims[d], 1) / max(p[d], 1))) for d in dims if isinstance(p[d], (int, float)))
        out.append({"case": r["case"], "dtype": r["dtype"], "speedup": float(r["speedup"]),
                    "lo": float(r["speedup_lo"]) if r["speedup_lo"] == r["speedup_lo"] else math.nan,
                    "hi": float(r["speedup_hi"]) if r["speedup_hi"] == r["speedup_hi"] else math.nan,
                    "distance": dist, "label": r["label"]})
    out.sort(key=lambda x: x["distance"])
    return out[:k]


#: What a projected FlyDSL call is compared with: the faster of ATen and Triton at each case (the
#: published dense suite's rule; under max-autotune Triton's templates compete too).
PROJECTION_BASELINE = ("aten", "triton")


def projection(judged: Iterable[Judged], source: str = "published", *, results: pd.DataFrame | None = None,
               baseline: str | Sequence[str] = PROJECTION_BASELINE) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A whole-model speedup by Amdahl's law, per model, phase and view (module docstring).

    ``source``: ``published`` (the MI355X per-case figures, flydsl against ``baseline`` -- by default
    the faster of ATen and Triton at each case, :data:`PROJECTION_BASELINE` -- by nearest shape: the
    nearest case's speedup, its interval the range of the three nearest cases) or
    ``results`` (``results``, a result frame measured on MI350: an exact case match where one
    exists with its 95% interval, else the nearest as above). Only ``eligible`` calls get a
    speedup; everything else keeps its modelled time (speedup 1). Returns ``(calls, summary)``:
    per eligible call its ``speedup``, ``speedup_lo``, ``speedup_hi``, ``matched`` case,
    ``distance``; per capture ``speedup`` with ``speedup_lo`` / ``speedup_hi`` (the Amdahl sum
    at every per-op bound at once), ``covered_share`` (the modelled time share that got a
    speedup), ``kind="projection"`` and ``assumptions``. Raises :class:`UsageError` for an
    unknown source or a source without flydsl rows."""
    if source not in PROJECTION_SOURCES:
        raise bad_choice("projection source", source, PROJECTION_SOURCES)
    s = _speedup_table(source, results, baseline)
    per, summ = [], []
    for j in judged:
        cap = j.capture
        total = lo_t = hi_t = base = covered = 0.0
        for c, n, v in j.rows:
            t = modelled_us(c, cap.arch) * n
            if not t == t:
                continue
            base += t
            sp = None
            fam = c.family
            if v.status == "eligible" and fam:
                dims = call_dims(fam, c)
                near = _nearest(s, fam, dims, c.dtype) if dims else []
                if near:
                    exact = [x for x in near if x["distance"] == 0]
                    best = exact[0] if exact else near[0]
                    sp = best["speedup"]
                    if exact and best["lo"] == best["lo"]:
                        lo, hi = best["lo"], best["hi"]
                    else:
                        lo, hi = min(x["speedup"] for x in near), max(x["speedup"] for x in near)
                    per.append({"model": cap.meta.get("model", cap.label), "step": cap.step, "view": cap.view,
                                "op": c.op, "module": module_pattern(c.module), "count": n, "shapes": c.shapes(),
                                "modelled_total_us": t, "speedup": sp, "speedup_lo": lo, "speedup_hi": hi,
                                "matched": best["case"], "distance": best["distance"], "source": best["label"]})
                    covered += t
                    total += t / sp
                    lo_t += t / hi   # fastest bound
                    hi_t += t / lo   # slowest bound
                    continue
            total += t
            lo_t += t
            hi_t += t
        if base:
            summ.append({"model": cap.meta.get("model", cap.label), "step": cap.step, "view": cap.view,
                         "speedup": base / total, "speedup_lo": base / hi_t, "speedup_hi": base / lo_t,
                         "covered_share": covered / base, "modelled_us": base, "projected_us": total,
                         "source": s["label"].iloc[0], "kind": "projection"})
    calls = pd.DataFrame(per)
    out = pd.DataFrame(summ)
    base_txt = " or ".join(baseline) if not isinstance(baseline, str) else baseline
    note = ("a projection, not a measurement: Amdahl's law over the modelled roofline time; eligible calls at the "
            f"{s['label'].iloc[0]} flydsl speedup against the faster of {base_txt} of the nearest case (interval: the range "
            "of the three nearest, or a measured case's 95% interval where the case matches exactly); other "
            "calls unchanged; eligible means FlyDSL is a candidate, and autotuning may choose another kernel")
    out.attrs.update({"kind": "projection", "assumptions": note})
    calls.attrs["kind"] = "projection"
    return calls, out


# -- from capture to measurement ------------------------------------------------------------------------

#: Columns of an exported shapes file (``flyexplore model --export-shapes``).
SHAPE_COLUMNS = ("op", "shape", "dtype", "model", "phase", "step", "view", "module", "count", "status", "variant",
                 "replaces", "note")


def split_rows(total: int, g: int, routing: str = "uniform") -> list[int]:
    """``total`` routed rows over ``g`` experts under ``routing``, as integers summing to
    ``total`` (largest remainders): :func:`flyexplore.insight.expert_routing.expert_rows`, the rule
    the capture's expert loops use."""
    return expert_rows(routing, g, total)


def call_shape(c: Call, routing: str = "uniform") -> tuple[str, str, str] | None:
    """``(op, shape text, note)`` of a captured call in its family's catalogue syntax
    (:attr:`flyexplore.ops.base.ModelHooks.case`: gemm ``MxNxK:<layout>`` from the strides, ``x @
    w.T`` is ``NT``; grouped_gemm ``GxMxNxK[:layout=NT]`` with M per expert, ``ms=`` with the rows
    per expert when ``routing`` or the row count makes them uneven (:func:`split_rows`); rmsnorm
    ``MxN:eps=..``; topk ``MxNxK``; attention ``BxHxSQxSKVxD[:hkv=..,causal=1]``), or ``None``
    when flyexplore has no operator case for it (bmm, pointwise)."""
    h = model_hooks(c.family)
    if h is None or h.case is None:
        return None
    used = []

    def split(rows: int, groups: int) -> list[int]:
        used.append(True)
        return split_rows(rows, groups, routing)

    try:
        got = h.case(c, split)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    if got is None:
        return None
    shape, note = got
    if used and note:   # the case depends on the routing assumption: say which
        note = f"{routing} routing: {note}"
    return c.family, shape, note


def export_shapes(judged: Iterable[Judged], routing: str = "uniform") -> pd.DataFrame:
    """The captured calls as sweep input (:data:`SHAPE_COLUMNS`): one row per model, phase,
    operator, shape, dtype and module, with the call ``count``. Each family is taken from the
    view that decides it (:func:`deciding_view`; the other view when only one was captured).
    Calls flyexplore has no operator for are left out of the file (they are in the coverage
    table). ``status`` is the call's verdict. What-if variants are rows of their own, ``variant``
    naming the change and ``replaces`` the shape they stand for: grouped GEMMs passed with B
    transposed get the same call with B stored [G, K, N] (``expert_weights_gkn``), so that a sweep
    measures what the advice would bring (:func:`variant_estimate`)."""
    js = list(judged)
    views = {(j.capture.meta.get("model"), j.capture.step): set() for j in js}
    for j in js:
        views[(j.capture.meta.get("model"), j.capture.step)].add(j.capture.view)
    rows: dict[tuple, dict] = {}
    for j in js:
        cap = j.capture
        have = views[(cap.meta.get("model"), cap.step)]
        for c, n, v in j.rows:
            got = call_shape(c, routing)
            if got is None:
                continue
            op, shape, note = got
            want = deciding_view(op)
            if cap.view != want and want in have:
                continue
            dt = c.dtype if c.dtype in ("bf16", "fp16", "fp32") else "bf16"
            key = (cap.meta.get("model"), cap.step, op, shape, dt, module_pattern(c.module))
            if key in rows:
                rows[key]["count"] += n
                continue
            rows[key] = {"op": op, "shape": shape, "dtype": dt, "model": cap.meta.get("model", cap.label),
                         "phase": cap.phase, "step": cap.step, "view": cap.view, "module": module_pattern(c.module),
                         "count": n, "status": v.status, "variant": "", "replaces": "", "note": note}
            if op == "grouped_gemm" and cap.view == "compiled" and nt_expert_weight(c.arg("mat2")):
                # the what-if of expert weights stored [G, K, N]: the same call with a contiguous B
                nn_shape = ",".join(x for x in shape.replace(":", ",", 1).split(",")[1:] if x != "layout=NT")
                nn_shape = shape.split(":", 1)[0] + (":" + nn_shape if nn_shape else "")
                vkey = key + ("expert_weights_gkn",)
                if vkey in rows:
                    rows[vkey]["count"] += n
                else:
                    rows[vkey] = {**rows[key], "shape": nn_shape, "status": "what-if",
                                  "variant": "expert_weights_gkn", "replaces": shape,
                                  "note": "what-if: expert weights stored [G, K, N] (B contiguous)"}
    return pd.DataFrame(list(rows.values()), columns=list(SHAPE_COLUMNS))


def _need_model_uses(df: pd.DataFrame) -> None:
    if "model_uses" not in df.columns:
        raise UsageError("these rows carry no model_uses column: sweep the shapes exported by "
                         "flyexplore model --export-shapes with --shapes-from")


def weighted_estimate(df: pd.DataFrame, baseline: str = "aten", backend: str | None = None) -> pd.DataFrame:
    """The measured whole-model kernel-time estimate from a sweep of exported shapes: per model,
    step (``prefill 1x2048``: the phase with its batch and tokens) and backend (``backend``, default every one but ``baseline``; on an MI350 ``flydsl``),
    the sum over measured cases of ``count x time`` for ``baseline`` (``baseline_ms``) and for the
    backend (``time_ms``: each case's baseline time over its measured speedup, so that paired
    speedups count as measured), their ratio ``speedup`` and an interval (every case at its 95%
    bound at once), ``cases`` (cases measured with both), ``kind="measured"``. Cases not
    measured with both are not in it. For ``flydsl``, a call the coverage judged not eligible
    (its use's ``status``: e.g. a GEMM with a bias sharing its shape with one without) keeps the
    baseline time (``calls_kept_at_baseline``); what-if variant shapes (``variant``) are left out
    (:func:`variant_estimate`). Raises :class:`UsageError` when the rows carry no ``model_uses``
    (not a sweep of exported shapes)."""
    _need_model_uses(df)
    s = R.speedup(df, baseline=baseline)
    if backend is not None:
        s = s[s["backend"] == backend]
    uses = df.dropna(subset=["model_uses"]).drop_duplicates(["op", "case", "dtype"]).set_index(["op", "case", "dtype"])
    acc: dict[tuple, dict] = {}
    for r in s.itertuples(index=False):
        key = (r.op, r.case, r.dtype)
        if key not in uses.index:
            continue
        u = uses.loc[key]
        model = u["model"] if "model" in uses.columns else ""
        for use in json.loads(u["model_uses"]):
            if use.get("variant"):
                continue  # a what-if shape: not a call the model makes as it is
            a = acc.setdefault((model, use.get("step") or use["phase"], r.backend),
                               {"base": 0.0, "new": 0.0, "lo": 0.0, "hi": 0.0, "cases": set(), "kept": 0})
            n = use["count"]
            sp = r.speedup
            lo = r.speedup_lo if r.speedup_lo == r.speedup_lo else r.speedup
            hi = r.speedup_hi if r.speedup_hi == r.speedup_hi else r.speedup
            if r.backend == "flydsl" and use.get("status") not in (None, "", "eligible"):
                sp = lo = hi = 1.0      # the coverage says this call does not take FlyDSL: baseline time
                a["kept"] += n
            a["base"] += n * r.baseline_ms
            a["new"] += n * r.baseline_ms / sp
            a["lo"] += n * r.baseline_ms / lo
            a["hi"] += n * r.baseline_ms / hi
            a["cases"].add(key)
    rows = [{"model": m, "step": p, "backend": b, "baseline": baseline, "cases": len(a["cases"]),
             "baseline_ms": a["base"], "time_ms": a["new"], "speedup": a["base"] / a["new"],
             "speedup_lo": a["base"] / a["lo"], "speedup_hi": a["base"] / a["hi"],
             "calls_kept_at_baseline": a["kept"], "kind": "measured"}
            for (m, p, b), a in acc.items()]
    out = pd.DataFrame(rows)
    out.attrs["kind"] = "measured"
    out.attrs["note"] = ("measured kernel time of the model's captured calls that were swept, each weighted by its "
                         "call count; calls not swept are not in it")
    return out


def variant_estimate(df: pd.DataFrame, baseline: str = "aten", backend: str = "flydsl") -> pd.DataFrame:
    """What a what-if would bring, measured: for each exported what-if variant (``variant`` in
    ``model_uses``, e.g. expert weights stored [G, K, N]), per model, step and variant, the model's
    calls as they are (the ``replaces`` case at ``baseline``: what runs today) against the changed
    calls at ``backend`` (the variant case), weighted by call count: ``as_is_ms``, ``what_if_ms``,
    ``speedup`` (as is / what-if), ``cases``, ``kind="measured"``. Empty when nothing was measured
    with both."""
    _need_model_uses(df)
    ok = df[df["status"].isin(["ok"]) & df["time_ms"].notna()]
    med = ok.groupby(["op", "case", "dtype", "backend"])["time_ms"].median()
    uses = df.dropna(subset=["model_uses"]).drop_duplicates(["op", "case", "dtype"])
    acc: dict[tuple, dict] = {}
    for r in uses.itertuples(index=False):
        for use in json.loads(r.model_uses):
            if not use.get("variant"):
                continue
            try:
                as_is_case = get_op(r.op).case(use["replaces"]).label
            except (UsageError, KeyError):
                continue
            before = med.get((r.op, as_is_case, r.dtype, baseline))
            after = med.get((r.op, r.case, r.dtype, backend))
            if before is None or after is None:
                continue
            k = (getattr(r, "model", ""), use.get("step") or use.get("phase", ""), use["variant"])
            a = acc.setdefault(k, {"as_is": 0.0, "what_if": 0.0, "cases": set()})
            a["as_is"] += use["count"] * before
            a["what_if"] += use["count"] * after
            a["cases"].add(r.case)
    rows = [{"model": m, "step": st, "variant": v, "as_is": f"{baseline} on the calls as they are",
             "what_if": f"{backend} on the changed calls", "cases": len(a["cases"]), "as_is_ms": a["as_is"],
             "what_if_ms": a["what_if"], "speedup": a["as_is"] / a["what_if"], "kind": "measured"}
            for (m, st, v), a in acc.items()]
    out = pd.DataFrame(rows)
    out.attrs["kind"] = "measured"
    return out
