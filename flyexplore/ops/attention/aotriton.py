"""AOTriton inside ROCm torch: what AOTriton 0.13b and 0.14.2b build (Triton, aiter or FlyDSL
"flyc" kernels, by arch, dtype and head dim), and the columns a traced attention row gets. The
A/B view of two result files is :mod:`flyexplore.results.aotriton_ab`, its figure and report
section :mod:`flyexplore.views.aotriton`.

On ROCm, SDPA's ``flash`` and ``efficient`` backends call AOTriton (unless
``torch.backends.cuda.preferred_rocm_fa_library("ck")``). AOTriton 0.14 then dispatches each
call, by its own operator tuning table, to one of its backends: its Triton kernels, aiter's
prebuilt fmha v3 assembly, or -- new in 0.14 -- FlyDSL kernels it compiles ahead of time
("flyc"). torch has no switch for that choice (AOTriton's ``attn_options.force_backend_index``
is not reachable from ``F.scaled_dot_product_attention``), so what ran is known only from the
kernel names in a trace (:mod:`flyexplore.insight.trace`: ``observed`` shows ``AOTriton[FlyDSL]``,
``AOTriton[Triton]``, ``AOTriton[aiter]``) and from an A/B of two torch builds
(:func:`flyexplore.results.aotriton_ab.ab_view`).

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

import re
from typing import TYPE_CHECKING, Any, Sequence

from flyexplore.errors import UsageError
from flyexplore.world import env as ENV

if TYPE_CHECKING:
    import pandas as pd

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
#: FlyDSL kernel names AOTriton launches, per pass (see :data:`flyexplore.insight.kernels.AOTRITON_KERNELS`).
FLYC_KERNELS = {"fwd": "flyc_attn_fwd", "bwd": "flyc_bwd_dkdv + flyc_bwd_dq (after the Triton bwd_preprocess)"}

#: aiter fmha v3 as AOTriton declares it (tag 0.13b ``modules/flash/aot/aiter_fwd.py`` /
#: ``aiter_bwd.py``; unchanged in the 0.14 tree): archs, dtypes, head-dim rungs, no bias, no dropout.
AITER_RULES = {"arches": ("gfx942", "gfx950"), "dtypes": ("fp16", "bf16"),
               "fwd": frozenset({128, 192}), "bwd": frozenset({64, 80, 96, 128, 160, 192})}

#: The version torch main pins (pytorch/pytorch ``.ci/docker/aotriton_version.txt``, which
#: ``cmake/External/aotriton.cmake`` reads), assumed by what-if
#: explanations when no version is given and this torch bundles none.
PINNED_BY_TORCH_MAIN = "0.14.2"

#: A field of the example result files that marks them as made up (as in :mod:`flyexplore.results.vllm`).


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
    import pandas as pd  # here: the catalogue (and so `flyexplore --help`) imports this module

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

def aotriton_trace_columns(tr, case, dtype: str) -> dict[str, Any]:
    """``flydsl_taken`` / ``flydsl_reason`` for a traced ``attention`` row (called by
    :func:`flyexplore.insight.case_trace.trace_columns`). Only when AOTriton's kernels ran: FlyDSL (flyc)
    kernels -> ``flydsl_taken=True`` and their names; otherwise ``flydsl_reason`` names the
    AOTriton backend that ran and whether this build has a FlyDSL kernel for the call
    (:func:`flyc_support` with this machine's arch and AOTriton version), and ``flydsl_taken``
    stays unset -- False would drop the row from :func:`flyexplore.results.table.speedup`, yet it
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
        env = ENV.collect()
        arch, ver = (env.device.arch if env.platform == "rocm" else None), env.versions.get("aotriton")
    except Exception:  # the reason is a courtesy; never break a sweep for it
        arch, ver = None, None
    ok, why = flyc_support(arch, dtype, p.get("d", 0), p.get("pass", "fwd"), ver)
    if ok:
        why = "a FlyDSL kernel exists for this call, so AOTriton's tuning table chose the other backend (" + why + ")"
    return {"flydsl_reason": f"not taken: AOTriton ran {ran}; {why}"[:1000]}
