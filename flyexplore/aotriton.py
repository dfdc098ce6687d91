"""AOTriton inside ROCm torch: which of its backends ran an SDPA call (Triton, aiter or FlyDSL
"flyc"), what AOTriton 0.13b and 0.14.2b build, and the A/B view of two result files.

On ROCm, SDPA's ``flash`` and ``efficient`` backends call AOTriton (unless
``torch.backends.cuda.preferred_rocm_fa_library("ck")``). AOTriton 0.14 then dispatches each
call, by its own operator tuning table, to one of its backends: its Triton kernels, aiter's
prebuilt fmha v3 assembly, or -- new in 0.14 -- FlyDSL kernels it compiles ahead of time
("flyc"). torch has no switch for that choice (AOTriton's ``attn_options.force_backend_index``
is not reachable from ``F.scaled_dot_product_attention``), so what ran is known only from the
kernel names in a trace (:mod:`flyexplore.trace`: ``observed`` shows ``AOTriton[FlyDSL]``,
``AOTriton[Triton]``, ``AOTriton[aiter]``) and from an A/B of two torch builds
(:func:`ab_view`).

Facts, read from ROCm/aotriton (no code copied):

- Tag 0.13b (commit 6e00ef3e): ``modules/flash/aot/__init__.py`` -- ``op_attn_fwd`` backends
  triton (0) and aiter (1); ``op_attn_bwd`` triton_split (0), bwd_kernel_fuse (1), aiter (2);
  no FlyDSL anywhere in the tree. Head dims compiled: ``modules/flash/aot/_common.py::
  block_dmodel_values`` (:data:`OPERATOR_HEAD_DIMS`); a call's head dim is rounded up to the next
  of them (``include/aotriton/_internal/util.h::round_value``, ``v3src/flash/attn_fwd.cc`` /
  ``attn_bwd.cc``), and on gfx950 the forward's 16 becomes 32 and the backward's 48 / 80 become
  64 / 96 (:data:`GFX950_RUNG_FIX`). aiter: ``modules/flash/aot/aiter_fwd.py`` / ``aiter_bwd.py``
  (:data:`AITER_RULES`).
- Tag 0.14.2b is **not** in the fetched snapshot of ROCm/aotriton (its newest commit,
  30ae9671 of 2026-08-20, is 0.14.0 in development and has no flyc code). The FlyDSL facts come
  from the 0.14 development files in the public code index and the merged PRs: ROCm/aotriton
  PR 230 ("FlyDSL Integration PR5": flyc is ``op_attn_fwd`` backend 2 and ``op_attn_bwd``
  backend 3), PR 239 ("0.14 Final Tuning": the operator tuning database picks flyc on
  gfx950/gfx1201; flyc only for non-fp32), ``modules/flash/aot/flyc_attn_fwd.py`` (@030ab7f9:
  the gfx950 forward head-dim ladder, fp16/bf16; "the shipped schedule targets long sequences
  and short ones fall to the Triton backend"), ``flyc_bwd_dkdv.py`` / ``flyc_bwd_dq.py`` /
  ``_flyc_common.py::flyc_bwd_disabled`` (backward ladders; off-ladder head dims rejected, not
  rounded), ``modules/flash/csrc/attn_fwd.cc`` (@26df6086: same rounding, then
  ``lookup_optimal`` in the tuning table unless ``force_backend_index``), and pytorch/pytorch
  PR 197747 ("Bump AOTriton to 0.14b": "flyc backend: FlyDSL SDPA fp16/bf16 kernels for gfx950
  and gfx1201"). A public harness citing the 0.14.2b tag confirms ``op_attn_fwd``'s three
  backends (triton, aiter, flyc with ``_FLYC_FWD_LADDERS`` for gfx1201 and gfx950). Treat the
  ladders as those of the 0.14 cycle; a GPU trace is the proof for a given build.
- The published range (``data/published/SOURCES.md``): AOTriton 0.14.2b vs 0.13b on gfx950,
  forward 0.92x-2.34x, backward 0.93x-2.47x across head dimensions and causal modes.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from .errors import UsageError

#: Head dims AOTriton compiles its Triton kernels for (the operator's BLOCK_DMODEL axis): tag
#: 0.13b ``modules/flash/aot/_common.py::block_dmodel_values``; the 0.14 development
#: ``modules/flash/aot/op_attn_fwd.py`` lists the same.
OPERATOR_HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 512)

#: gfx950 compiler work-arounds after rounding (``v3src/flash/attn_fwd.cc`` / ``attn_bwd.cc`` at
#: 0.13b, ``modules/flash/csrc/attn_fwd.cc`` / ``attn_bwd.cc`` in the 0.14 tree): rung -> rung used.
GFX950_RUNG_FIX = {"fwd": {16: 32}, "bwd": {48: 64, 80: 96}}

#: The head-dim rungs AOTriton builds FlyDSL ("flyc") kernels for, per (arch, pass). gfx950
#: forward: ``flyc_attn_fwd.py::FLYC_GFX950_HEAD_DIMS``; backward: the dK/dV and dQ ladders
#: (``flyc_bwd_dkdv.py`` / ``flyc_bwd_dq.py``), identical on gfx950. gfx1201: ``FLYC_HEAD_DIMS``
#: forward; backward the dQ ladder (dK/dV also has 320 and 448, unused by the operator's rungs).
FLYC_HEAD_DIMS: dict[tuple[str, str], frozenset[int]] = {
    ("gfx950", "fwd"): frozenset({32, 64, 96, 128, 160, 192, 224, 256, 384, 512}),
    ("gfx950", "bwd"): frozenset({32, 64, 96, 128, 160, 192, 224, 256, 384, 512}),
    ("gfx1201", "fwd"): frozenset({16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 384, 512}),
    ("gfx1201", "bwd"): frozenset({16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 384, 512}),
}
#: Input dtypes flyc kernels exist for (``flyc_attn_fwd.py``: f16/bf16; fp32 is disabled).
FLYC_DTYPES = ("fp16", "bf16")
#: The first AOTriton release with the flyc backend.
FLYC_FIRST = (0, 14)
#: FlyDSL kernel names AOTriton launches, per pass (see :data:`flyexplore.trace.AOTRITON_KERNELS`).
FLYC_KERNELS = {"fwd": "flyc_attn_fwd", "bwd": "flyc_bwd_dkdv + flyc_bwd_dq (after the Triton bwd_preprocess)"}

#: aiter fmha v3 as AOTriton declares it (tag 0.13b ``modules/flash/aot/aiter_fwd.py`` /
#: ``aiter_bwd.py``; unchanged in the 0.14 tree): archs, dtypes, head-dim rungs, no bias, no dropout.
AITER_RULES = {"arches": ("gfx942", "gfx950"), "dtypes": ("fp16", "bf16"),
               "fwd": frozenset({128, 192}), "bwd": frozenset({64, 80, 96, 128, 160, 192})}

#: The version torch main pins (``shared/reference/pytorch-flydsl.md``), assumed by what-if
#: explanations when no version is given and this torch bundles none.
PINNED_BY_TORCH_MAIN = "0.14.2"

#: A field of the example result files that marks them as made up (as in :mod:`flyexplore.vllm`).
SYNTHETIC_FIELD = "synthetic_example"
#: The two synthetic example files (``data/examples/aotriton/``), relative to the data folder.
EXAMPLE_FILES = ("examples/aotriton/aotriton_0.13b_synthetic.jsonl",
                 "examples/aotriton/aotriton_0.14.2b_synthetic.jsonl")


# -- versions ----------------------------------------------------------------------------------

def parse_version(v: Any) -> tuple[int, int, int] | None:
    """``"0.14.2"``, ``"0.14.2b"`` or ``"0.13b"`` -> ``(0, 14, 2)`` / ``(0, 13, 0)``; ``None`` for
    ``"not present"``, empty or unparsable text."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(v or ""))
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def release_name(v: Any) -> str:
    """The release tag of a library version: ``"0.14.2"`` -> ``"0.14.2b"``, ``"0.13.0"`` ->
    ``"0.13b"`` (AOTriton tags its releases ``X.Yb`` / ``X.Y.Zb``; the bundled library is named
    ``libaotriton_v2.so.X.Y.Z``). Text that is no version is returned unchanged."""
    t = parse_version(v)
    if t is None:
        return str(v) if v is not None else ""
    return f"{t[0]}.{t[1]}b" if t[2] == 0 else f"{t[0]}.{t[1]}.{t[2]}b"


def has_flyc(v: Any) -> bool | None:
    """Whether AOTriton version ``v`` has the FlyDSL (flyc) backend (0.14 and later); ``None``
    when ``v`` is no version (e.g. ``"not present"``)."""
    t = parse_version(v)
    return None if t is None else t[:2] >= FLYC_FIRST


# -- head dims and eligibility ----------------------------------------------------------------

def head_dim_rung(d: int, arch: str | None = None, pass_: str = "fwd") -> int | None:
    """The head-dim rung AOTriton dispatches a call with head dim ``d`` on: the smallest of
    :data:`OPERATOR_HEAD_DIMS` >= ``d``, then the gfx950 fixes (:data:`GFX950_RUNG_FIX`).
    ``None`` above 512 (AOTriton has no kernel). ``pass_``: ``fwd`` or ``bwd``."""
    if pass_ not in ("fwd", "bwd"):
        raise UsageError(f"unknown attention pass {pass_!r} (valid: fwd, bwd)")
    r = next((x for x in OPERATOR_HEAD_DIMS if x >= int(d)), None)
    if r is not None and arch == "gfx950":
        r = GFX950_RUNG_FIX[pass_].get(r, r)
    return r


def flyc_support(arch: str | None, dtype: str, d: int, pass_: str = "fwd",
                 version: Any = PINNED_BY_TORCH_MAIN) -> tuple[bool | None, str]:
    """Does AOTriton ``version`` build FlyDSL kernels for an SDPA call on ``arch`` with input
    ``dtype`` (``bf16``/``fp16``/``fp32``) and head dim ``d`` (``pass_`` ``fwd``/``bwd``)?
    Returns ``(answer, reason)``: ``True`` / ``False``, or ``None`` when the version or arch is
    unknown. True means a flyc kernel exists for the call, not that AOTriton's tuning table
    picks it. Rules and sources: :data:`FLYC_HEAD_DIMS`, :data:`FLYC_DTYPES`, :func:`head_dim_rung`."""
    flyc = has_flyc(version)
    if flyc is None:
        return None, f"AOTriton version unknown ({version or 'not given'})"
    rel = release_name(version)
    if not flyc:
        return False, f"AOTriton {rel} has no FlyDSL backend (flyc is new in 0.14b; 0.13b has Triton and aiter only)"
    if not arch:
        return None, "arch unknown: AOTriton builds FlyDSL kernels for gfx950 and gfx1201 only"
    if (arch, pass_) not in FLYC_HEAD_DIMS:
        return False, f"AOTriton {rel} builds FlyDSL kernels for gfx950 and gfx1201 only, not {arch}"
    if dtype not in FLYC_DTYPES:
        return False, f"AOTriton's FlyDSL kernels take fp16/bf16 only, not {dtype} (fp32 stays on Triton)"
    r = head_dim_rung(d, arch, pass_)
    if r is None:
        return False, f"head dim {d} > 512: AOTriton has no kernel for it"
    ladder = FLYC_HEAD_DIMS[(arch, pass_)]
    what = "forward" if pass_ == "fwd" else "backward"
    if r not in ladder:
        return False, (f"head dim {d} is dispatched on rung {r}, which has no FlyDSL {what} kernel on {arch} "
                       f"(FlyDSL rungs: {', '.join(map(str, sorted(ladder)))})")
    pad = "" if r == d else f", padded to rung {r}"
    return True, f"AOTriton {rel} builds a FlyDSL {what} kernel for head dim {d}{pad}, {dtype}, {arch}"


def flyc_table(arch: str = "gfx950", dtype: str = "bf16", head_dims: Sequence[int] | None = None,
               version: Any = PINNED_BY_TORCH_MAIN) -> pd.DataFrame:
    """Which head dims get FlyDSL kernels in AOTriton ``version`` on ``arch`` for ``dtype``, per
    pass: one row per (head dim, pass) with ``head_dim, pass, rung`` (:func:`head_dim_rung`),
    ``flyc`` (:func:`flyc_support`) and ``reason``. ``head_dims`` default: 16..256 in steps of
    16, and 512. Raises :class:`UsageError` for a non-positive head dim."""
    dims = list(head_dims) if head_dims is not None else [*range(16, 257, 16), 512]
    rows = []
    for d in dims:
        if int(d) <= 0:
            raise UsageError(f"head dims must be positive integers, got {d!r}")
        for pas in ("fwd", "bwd"):
            ok, why = flyc_support(arch, dtype, int(d), pas, version)
            rows.append({"head_dim": int(d), "pass": pas, "rung": head_dim_rung(int(d), arch, pas),
                         "flyc": ok, "reason": why})
    return pd.DataFrame(rows, columns=["head_dim", "pass", "rung", "flyc", "reason"])


def aiter_support(arch: str | None, dtype: str, d: int, pass_: str = "fwd") -> tuple[bool | None, str]:
    """Does AOTriton (0.13b and the 0.14 tree) declare its aiter backend for the call?
    ``(answer, reason)`` by :data:`AITER_RULES` (no bias and no dropout assumed, as in SDPA
    calls without a mask and with ``dropout_p=0``); ``None`` when ``arch`` is unknown."""
    if not arch:
        return None, "arch unknown"
    if arch not in AITER_RULES["arches"]:
        return False, f"aiter is declared for {', '.join(AITER_RULES['arches'])} only, not {arch}"
    if dtype not in AITER_RULES["dtypes"]:
        return False, f"aiter takes fp16/bf16 only, not {dtype}"
    r = head_dim_rung(d, arch, pass_)
    if r is None or r not in AITER_RULES[pass_]:
        return False, f"head dim {d} (rung {r}) is outside aiter's {pass_} head dims"
    return True, f"aiter fmha v3 is declared for head dim {d} (rung {r}), {dtype}, {arch}"


# -- what a traced row says ------------------------------------------------------------------

def row_columns(tr, case, dtype: str) -> dict[str, Any]:
    """``flydsl_taken`` / ``flydsl_reason`` for a traced ``attention`` row (called by
    :func:`flyexplore.trace.row_columns`). Only when AOTriton's kernels ran: FlyDSL (flyc)
    kernels -> ``flydsl_taken=True`` and their names; otherwise ``flydsl_reason`` names the
    AOTriton backend that ran and whether this build has a FlyDSL kernel for the call
    (:func:`flyc_support` with this machine's arch and AOTriton version), and ``flydsl_taken``
    stays unset -- False would drop the row from :func:`flyexplore.results.speedup`, yet it
    is a valid time of the SDPA backend it asked for. Rows where AOTriton did not run (CUDA,
    CK, math, CPU) get nothing."""
    bes = tr.aotriton_backends
    if not bes:
        return {}
    if "FlyDSL" in bes:
        names = sorted({k.name for k in tr.kernels if k.backend == "FlyDSL"})
        return {"flydsl_taken": True, "flydsl_reason": "taken: AOTriton FlyDSL (flyc) kernels " + ", ".join(names)}
    ran = "; ".join(f"{be} ({', '.join(sorted({k.name for k in tr.kernels if k.backend == be}))})"[:200]
                    for be in bes)
    p = case.p if hasattr(case, "p") else dict(case)
    try:
        from .env import collect
        env = collect()
        arch, ver = (env.device.arch if env.platform == "rocm" else None), env.versions.get("aotriton")
    except Exception:  # the reason is a courtesy; never break a sweep for it
        arch, ver = None, None
    ok, why = flyc_support(arch, dtype, p.get("d", 0), p.get("pass", "fwd"), ver)
    if ok:
        why = "a FlyDSL kernel exists for this call, so AOTriton's tuning table chose the other backend (" + why + ")"
    return {"flydsl_reason": f"not taken: AOTriton ran {ran}; {why}"[:1000]}


def backends_in(observed: Any = None, kernels: Any = None) -> tuple[str, ...]:
    """AOTriton backends named by a row: from its ``observed`` text (``AOTriton[FlyDSL],...``),
    else from its ``kernels`` JSON column (names classified by :func:`flyexplore.trace.classify`).
    Empty when neither names one."""
    if isinstance(observed, str) and observed:
        found = re.findall(r"AOTriton\[(\w+)\]", observed)
        if found:
            return tuple(dict.fromkeys(found))
    names = _kernel_names(kernels)
    if names:
        from .trace import classify
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
        from .trace import classify
        tri = {n for n in _kernel_names(kernels) if classify(n).backend == "Triton"}
        if tri and all(n.startswith("bwd_preprocess") for n in tri):
            return " + ".join(b if b != "Triton" else "Triton bwd_preprocess" for b in order)
    return " + ".join(order)


# -- the A/B view -----------------------------------------------------------------------------

def published_range(pass_: str) -> tuple[float, float]:
    """The published AOTriton 0.14.2b vs 0.13b range on gfx950 for ``fwd`` / ``bwd`` (low, high)
    (:data:`flyexplore.published.RANGES`)."""
    from .published import RANGES

    subject = {"fwd": "SDPA forward", "bwd": "SDPA backward"}[pass_]
    r = next(r for r in RANGES if r["what"].startswith("AOTriton") and r["subject"] == subject)
    return float(r["low"]), float(r["high"])


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
    """Per paired attention case of a :class:`flyexplore.compare.ABResult` (``ab``, from
    ``compare.pair(a, b, ...)``): which AOTriton backend ran on each side, the paired speedup
    and the published range beside it.

    ``a`` / ``b``: the two result sets ``ab`` was paired from (their ``observed`` / ``kernels``
    columns say what ran; ``aotriton`` / ``arch`` which build). Returns one row per attention
    pair: ``case, dtype, backend, pass, d, causal, aotriton_a, aotriton_b`` (release names),
    ``arch_a, arch_b, ran_a, ran_b`` (:func:`ran_text`), ``flyc_b`` (FlyDSL kernels existed for
    the call in build B, :func:`flyc_support`), ``time_a_ms, time_b_ms, speedup`` (time A / time
    B: > 1 means B faster), ``speedup_lo``/``speedup_hi`` (its 95% interval) and ``label``
    (FASTER/SAME/SLOWER/AMBIGUOUS, :func:`flyexplore.stats.verdict`; from ``ab.pairs``),
    ``published_range`` (text), ``in_published_range``, ``published_setup`` (True when both
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
            from .ops import get_op
            prm = get_op("attention").case(str(r["case"])).p
        pas = prm.get("pass", "fwd")
        lo, hi = published_range(pas)
        ver_a, ver_b = r.get("aotriton_a"), r.get("aotriton_b")
        arch_a, arch_b = r.get("arch_a"), r.get("arch_b")
        ok_b, _ = flyc_support(arch_b, str(r["dtype"]), int(prm.get("d", 0)), pas, ver_b)
        sp = float(r["ratio"])
        ta, tb = parse_version(ver_a), parse_version(ver_b)
        row = {"case": r["case"], "dtype": r["dtype"], "backend": r.get("backend"), "pass": pas,
               "d": prm.get("d"), "causal": bool(prm.get("causal", False)),
               "aotriton_a": release_name(ver_a), "aotriton_b": release_name(ver_b),
               "arch_a": arch_a, "arch_b": arch_b,
               "ran_a": ran_text(r.get("observed_a"), r.get("kernels_a")),
               "ran_b": ran_text(r.get("observed_b"), r.get("kernels_b")), "flyc_b": ok_b,
               "time_a_ms": float(r["time_a_ms"]), "time_b_ms": float(r["time_b_ms"]), "speedup": sp,
               "published_range": f"{lo:.2f}x-{hi:.2f}x", "in_published_range": bool(lo <= sp <= hi),
               "published_setup": bool(arch_a == arch_b == "gfx950" and ta is not None and tb is not None
                                       and ta[:2] == (0, 13) and tb == (0, 14, 2)),
               "source": "synthetic example" if synthetic else "measured"}
        row.update(speedup_lo=r.get("ratio_lo"), speedup_hi=r.get("ratio_hi"), label=r.get("verdict"))
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols)
    out.attrs["names"] = tuple(ab.names)
    return out


def example_paths() -> tuple[Path, Path]:
    """The two synthetic example result files (AOTriton "0.13b" and "0.14.2b" sides, made-up
    numbers; ``data/examples/README.md``), as paths."""
    from .paths import data_dir

    return tuple(data_dir() / f for f in EXAMPLE_FILES)  # type: ignore[return-value]


def compare_files(path_a, path_b, names: Sequence[str] | None = None, backend: str | None = None):
    """Load two result files, pair their attention rows by case (:func:`flyexplore.compare.pair`)
    and return ``(ab, view)`` (:func:`ab_view`). ``names`` default to the AOTriton releases the
    files record (``AOTriton 0.13b``, ``AOTriton 0.14.2b``); ``backend`` keeps one SDPA backend
    (e.g. ``flash``). Raises :class:`UsageError` for a missing file, a file without attention
    rows, or when no case pairs."""
    from . import results as R
    from .compare import pair

    sides = []
    for path in (path_a, path_b):
        if not Path(path).exists():
            raise UsageError(f"result file not found: {str(path)!r}")
        d = R.load(path)
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


_RAN_COLORS = {"FlyDSL": "#2CA02C", "aiter": "#FF7F0E", "Triton": "#1F77B4"}


def _ran_color(text: str) -> str:
    return next((c for k, c in _RAN_COLORS.items() if str(text).startswith(k)), "#7F7F7F")


def ab_figure(view: pd.DataFrame, title: str | None = None):
    """The A/B view as a figure: per pass (forward, backward) one panel of bars, the paired
    speedup (time A / time B; > 1: B faster) per case, coloured by the AOTriton backend that ran
    on side B, each bar labelled with its verdict (``label``) when the view has one, else its
    value; the published range (0.14.2b vs 0.13b on gfx950) shaded behind, and a dashed 1.0x
    line. Titles of synthetic views start with ``SYNTHETIC EXAMPLE``. Raises
    :class:`UsageError` for an empty view."""
    from plotly.subplots import make_subplots

    from .plot_style import style_figure

    if view is None or view.empty:
        raise UsageError("ab_figure needs a non-empty AOTriton A/B view (no attention case paired)")
    na, nb = view.attrs.get("names", ("A", "B"))
    passes = [x for x in ("fwd", "bwd") if (view["pass"] == x).any()]
    titles = [{"fwd": "forward", "bwd": "backward"}[x] for x in passes]
    fig = make_subplots(rows=1, cols=len(passes), subplot_titles=titles, horizontal_spacing=0.08)
    seen = set()
    for i, pas in enumerate(passes, start=1):
        g = view[view["pass"] == pas]
        lo, hi = published_range(pas)
        for ran, h in g.groupby("ran_b", sort=False):
            text = [f"{s:.2f}x {v}" if isinstance(v, str) and v else f"{s:.2f}x"
                    for v, s in zip(h["label"] if "label" in h else [None] * len(h), h["speedup"])]
            err = {}
            if "speedup_lo" in h and h["speedup_lo"].notna().any():
                from .plot_style import whiskers
                err = {"error_y": whiskers(h.assign(speedup_lo=pd.to_numeric(h["speedup_lo"], errors="coerce"),
                                                    speedup_hi=pd.to_numeric(h["speedup_hi"], errors="coerce")))}
            fig.add_bar(x=h["case"] + " " + h["dtype"], y=h["speedup"], name=f"{nb} ran {ran}", legendgroup=ran,
                        **err,
                        showlegend=ran not in seen, marker_color=_ran_color(ran), text=text, textposition="outside",
                        customdata=list(zip(h["ran_a"], h["time_a_ms"] * 1e3, h["time_b_ms"] * 1e3)),
                        hovertemplate=(f"%{{x}}<br>{na}/{nb} %{{y:.3f}}x<br>{na} ran %{{customdata[0]}}, "
                                       f"%{{customdata[1]:.1f}} µs<br>{nb} ran {ran}, %{{customdata[2]:.1f}} µs"
                                       "<extra></extra>"), row=1, col=i)
            seen.add(ran)
        # shapes after the bars: plotly skips shapes on subplots that have no trace yet
        fig.add_hrect(y0=lo, y1=hi, fillcolor="#BBBBBB", opacity=0.25, line_width=0, layer="below", row=1, col=i)
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", line_width=1.5, row=1, col=i)
        fig.add_annotation(text=f"published {lo:.2f}x-{hi:.2f}x (gfx950, range only)", xref=f"x{i if i > 1 else ''} domain",
                           yref=f"y{i if i > 1 else ''}", x=0.0, y=hi, xanchor="left", yanchor="bottom",
                           showarrow=False, font=dict(size=11, color="#555"))
    fig.add_scatter(x=[None], y=[None], mode="lines", name="1.0x (no change)",
                    line=dict(color="#555", dash="dash", width=1.5), hoverinfo="skip", row=1, col=1)
    synthetic = (view["source"] == "synthetic example").any()
    ttl = title or f"AOTriton A/B: {nb} vs {na}, per case"
    if synthetic and not ttl.startswith("SYNTHETIC EXAMPLE"):
        ttl = "SYNTHETIC EXAMPLE (made-up numbers): " + ttl
    ttl += (f"<br><sup>time {na} / time {nb} (> 1: {nb} faster); bar colour: the AOTriton backend {nb} ran; "
            "grey band: the published range</sup>")
    style_figure(fig, ttl, "", f"time {na} / time {nb} (x)", legend_title="")
    fig.update_layout(margin=dict(t=110))
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(type="category")
    return fig


def report_section(page, ab, a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Add the AOTriton section to an A/B report page (:func:`flyexplore.report.write_compare_report`):
    nothing when no attention case paired; else which AOTriton backend ran on each side, the
    speedups with their labels and the published range (:func:`ab_view`, :func:`ab_figure`)."""
    view = ab_view(ab, a, b)
    if view.empty:
        return
    page.h2("Attention: which AOTriton backend ran")
    if (view["source"] == "synthetic example").any():
        page.p("SYNTHETIC EXAMPLE: at least one input file is marked made-up; no number here is a measurement.",
               cls="note")
    page.p("AOTriton picks Triton, aiter or FlyDSL (flyc, 0.14 and later) per call from its own tuning table; "
           "torch has no switch for it. 'ran' is read from the kernel names each row recorded (sweep with "
           "--trace on ROCm); 'not traced' means the row has no kernel record. The published range (AOTriton "
           "0.14.2b vs 0.13b on gfx950, forward 0.92x-2.34x, backward 0.93x-2.47x) applies where "
           "published_setup is true.")
    page.fig("aotriton_ab", ab_figure(view))
    page.table("aotriton_backends", view)
