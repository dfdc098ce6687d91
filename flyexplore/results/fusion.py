"""Inductor's fusion of pointwise calls, modelled on a capture's recorded calls (the compiled view).

Under ``torch.compile`` a chain of pointwise calls -- and the reductions fused with them (RMSNorm's
pow / mean / rsqrt / mul, the residual add before it, SwiGLU's silu and mul, rope's mul / neg / cat
/ add, the casts between) -- runs as one Triton kernel: one pass over memory that reads the
chain's inputs from HBM once and writes only what outlives it. The compiled view records them
one ATen call at a time, so counting each call's own bytes (:func:`flyexplore.ops.base.io_bytes`)
overstates them several times over. :func:`fuse` groups the calls as Inductor's scheduler would
and gives each call the bytes it adds to its group's kernel; the eager view is never grouped
(eager runs each ATen call as its own kernel).

The rules (facts from torch 2.15's ``torch/_inductor/scheduler.py``, none of its code):

- **Extern kernels end nothing by themselves, consumers do.** GEMMs (``mm``/``addmm``/``bmm``,
  grouped and scaled mm: Inductor's templates or ATen's extern calls), SDPA and TopK (families whose
  hooks say ``matrix``, and ``topk``) are kernels of their own that a pointwise chain is never fused
  into (the scheduler's ``can_fuse`` refuses extern and template nodes as vertical-fusion partners
  except template epilogues, which this model leaves out). An extern call that reads a tensor the
  open group produced closes the group (its input must be in memory first). One that reads nothing
  of the group does not: the scheduler may fuse nodes that are not adjacent in program order as
  long as no dependency cycle forms (``will_fusion_create_cycle``) -- SwiGLU's ``silu(gate)`` and
  the ``mul`` by ``up`` are one kernel although the ``up`` GEMM runs between them.
- **Pointwise and reductions fuse vertically** (a consumer with its producer, the scheduler's
  ``fuse_nodes`` over pairs sharing a buffer, ``score_fusion_memory``), so a maximal run of
  non-extern calls is one group; views (no kernel) are skipped and do not break it.
- **One layer at a time.** A group closes where the call's ``layer`` changes: the recorder folds
  identical calls of every layer into the first occurrence with a count
  (:class:`flyexplore.insight.capture.Call`), so calls of two layers side by side in the record
  never ran side by side.

Bytes of a group (recorded calls carry shapes, not tensor identities, so a tensor is known by its
element count and dtype -- views keep both):

- an input is read from memory unless an earlier call of the group produced a tensor with its
  element count and dtype (then it is in registers); a call reading two tensors of one key of which
  the group made one (SwiGLU's ``mul(silu(gate), up)``) reads the other from memory;
- an output is written unless a later call of the group reads a tensor with its element count and
  dtype (an intermediate); outputs of calls made in a decoder layer's own scope (module path
  ``...layers.N``: the residual adds of a pre-norm layer) are always written, since the residual
  stream is read again by the layer's next add, which the folded record cannot show.

A call never adds more than it moves alone (its recorded ``bytes``: a gather such as the embedding
reads the rows it indexes, not its whole table). Each call keeps its row and count; its fused
bytes are what it adds to its group's kernel, so a
group's bytes are the sum over its calls (each times its count). Approximations, stated: a slice of
an input (rope's half of q) counts as a read of its own; two distinct tensors of one element count
and dtype inside a group are taken for one; template epilogues (a pointwise fused into a GEMM's
output under max-autotune) are not modelled.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from flyexplore.insight.capture import Call
from flyexplore.ops import model_hooks
from flyexplore.ops.base import tensor_bytes

#: Families whose calls are extern kernels (never fused with pointwise calls), beside the ``matrix``
#: families (GEMMs, SDPA): TopK is an ATen fallback under Inductor.
EXTERN_FAMILIES = ("topk",)
#: ATen's GEMM-like ops: extern kernels (or GEMM templates) even in a call recorded without a family.
GEMM_OPS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
            "aten._grouped_mm.default", "aten._scaled_mm.default", "aten.convolution.default")
#: ATen ops that are extern kernels whatever their family: the GEMMs, and sort / topk (ATen fallbacks).
EXTERN_OPS = GEMM_OPS + ("aten.sort.default", "aten.sort.stable", "aten.topk.default")
#: A decoder layer's own scope: the module path ends at the layer's list index.
_LAYER_SCOPE = re.compile(r"(^|\.)\d+$|(^|\.)\*$")


@dataclass(frozen=True)
class Fused:
    """One recorded call in the fused model: ``group`` (the fusion group's number within the
    capture, ``None`` for an extern call or a view), ``bytes`` (per call: what it adds to its
    group's kernel; an extern call its own bytes; a view 0) and ``kind`` (``"extern"``,
    ``"fused"``, ``"view"``)."""

    group: int | None
    bytes: float
    kind: str


def is_extern(c: Call) -> bool:
    """Is ``c`` a kernel of its own that Inductor never fuses pointwise calls into (module
    docstring): a ``matrix`` family's call (GEMMs, SDPA), TopK, or an op of :data:`EXTERN_OPS`."""
    h = model_hooks(c.family) if c.family else None
    return bool((h is not None and h.matrix) or c.family in EXTERN_FAMILIES or c.op in EXTERN_OPS)


def _key(t) -> tuple:
    n = 1
    for s in t.shape:
        n *= s
    return n, str(t.dtype)


def _layer_scope(module: str) -> bool:
    return bool(_LAYER_SCOPE.search(module or ""))


def fuse(calls: Sequence[Call]) -> list[Fused]:
    """The fusion groups of ``calls`` (one capture's distinct calls in first-occurrence order, as
    :meth:`flyexplore.insight.capture.Capture.distinct` gives them), one :class:`Fused` per call in
    the same order, by the module docstring's rules."""
    out: list[Fused | None] = [None] * len(calls)
    groups: list[list[int]] = []
    cur: list[int] = []
    made: set = set()
    layer = None

    def close():
        nonlocal cur, made
        if cur:
            groups.append(cur)
        cur, made = [], set()

    for i, c in enumerate(calls):
        if c.is_view:
            out[i] = Fused(None, 0.0, "view")
            continue
        if is_extern(c):
            if cur and any(t is not None and _key(t) in made for t in c.inputs):
                close()
            out[i] = Fused(None, float(c.bytes), "extern")
            continue
        if cur and c.layer != layer:
            close()
        cur.append(i)
        layer = c.layer
        made |= {_key(t) for t in c.outputs if t is not None}
    close()
    for g, idx in enumerate(groups):
        for pos, i in enumerate(idx):
            c = calls[i]
            before = Counter(_key(t) for j in idx[:pos] for t in calls[j].outputs if t is not None)
            after = {_key(t) for j in idx[pos + 1:] for t in calls[j].inputs if t is not None}
            reads = 0.0
            for t in c.inputs:   # as many of a key in registers as the group made of it
                if t is None:
                    continue
                if before[_key(t)] > 0:
                    before[_key(t)] -= 1
                else:
                    reads += tensor_bytes(t)
            keep = _layer_scope(c.module)
            writes = sum(tensor_bytes(t) for t in c.outputs if t is not None and (keep or _key(t) not in after))
            out[i] = Fused(g, float(min(reads + writes, c.bytes) if c.bytes == c.bytes else reads + writes), "fused")
    return out  # type: ignore[return-value]


def kernel_categories(calls: Sequence[Call], fused: Sequence[Fused | None]) -> list[str]:
    """The category of the kernel each call runs in, as the measured breakdown names kernels
    (:mod:`flyexplore.insight.breakdown`): a call's family (``other`` without one), except that
    every call of a fusion group with a call of a non-extern family in it (RMSNorm) takes that
    family -- Inductor's kernel that fuses a residual add into an RMSNorm reduction is named after
    ``mean``/``pow``/``rsqrt`` and counted as rmsnorm there. ``fused``: :func:`fuse`'s answer, or
    ``None`` per call (eager: every call its own kernel)."""
    own = [c.family or "other" for c in calls]
    lead: dict[int, str] = {}
    for c, f in zip(calls, fused):
        if f is not None and f.group is not None and c.family and not is_extern(c):
            lead.setdefault(f.group, c.family)
    return [lead.get(f.group, o) if f is not None and f.group is not None else o for o, f in zip(own, fused)]
