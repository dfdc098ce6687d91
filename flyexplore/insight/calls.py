"""The recorded calls of one forward step: :class:`Call`, :class:`Capture`, and what a call costs.

A :class:`Call` is one ATen call (or one call a family keeps as one: SDPA, a decomposed RMSNorm)
as :mod:`flyexplore.insight.capture` records it: its tensor arguments as
:class:`~flyexplore.world.conditions.TensorDesc`, its scalars, the module that made it, its FLOPs
and bytes (:func:`call_cost`: the operator family's count, else one FLOP per output element and
each tensor read or written once). A :class:`Capture` holds the calls of one view of a step.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import model_families, model_hooks
from flyexplore.ops.base import io_bytes, tensor_bytes
from flyexplore.world.conditions import TensorDesc, short_dtype


#: The two views of a forward step (module docstring).
VIEWS = ("eager", "compiled")
#: The names the built-in families record their kept-as-one calls under (the attention family's
#: SDPA, the RMSNorm family's decomposed module), for callers that look for them.
SDPA = "F.scaled_dot_product_attention"
DECOMPOSED_RMSNORM = "RMSNorm module (decomposed)"


def family_of() -> dict[str, str]:
    """``{ATen overload or kept-call name: family}`` over every family with model hooks
    (:func:`flyexplore.ops.model_families`; their ``aten_ops``, kept modules and functions)."""
    out: dict[str, str] = {}
    for name, op in model_families().items():
        hooks = op.model
        for a in hooks.aten_ops:
            out.setdefault(a, name)
        if hooks.keep_function is not None:
            out.setdefault(hooks.keep_function[1], name)
    return out

#: Calls a FakeTensor makes that a real tensor does not (``tensor.device`` goes through dispatch).
_FAKE_ONLY = frozenset({"prim.device.default"})

_LAYER = re.compile(r"\.(\d+)(?=\.|$)")


@dataclass(frozen=True)
class Call:
    """One recorded call.

    ``op``: the ATen overload (``"aten.mm.default"``) or a kept-as-one call (:data:`SDPA`,
    :data:`DECOMPOSED_RMSNORM`); ``family``: the flyexplore operator it belongs to (``gemm``,
    ``grouped_gemm``, ``scaled_gemm``, ``rmsnorm``, ``topk``, ``attention``) or ``None``;
    ``inputs``: the tensor arguments in order (``None`` for an absent optional tensor);
    ``scalars``: the other arguments by name; ``outputs``: the output tensors; ``module``: the
    dotted module path (``""`` = the top module) and ``module_type`` its class; ``layer``: the
    first list index in the path (``model.layers.3.mlp`` -> 3) or ``None``; ``flops`` and
    ``bytes``: per call (:func:`cost`); ``inner``: recorded inside a kept-as-one call (not judged,
    not counted in shares); ``note``: why it is listed as it is; ``names``: the tensor
    arguments' names; ``kept``: a kept-as-one call (a family's function or module, not an ATen
    call); ``count``: how many calls of the step this one stands for (the recorder folds calls
    that differ in nothing a verdict reads: :class:`_Recorder`; a loop over a sequence, as a
    reference scan is, gives one call per step of the loop, listed once with their count);
    ``fused``: in the eager view, what a ``torch.compile`` run makes of this call -- ``"addmm"`` for
    an ``aten.mm`` whose output is added into an ``aten.addmm`` by Inductor's post-grad pass
    (:mod:`flyexplore.insight.fusion`), else ``""``; part of :meth:`key`."""

    op: str
    family: str | None
    inputs: tuple
    scalars: Mapping[str, Any]
    outputs: tuple
    module: str
    module_type: str
    layer: int | None
    flops: float
    bytes: float
    inner: bool = False
    note: str = ""
    names: tuple = ()
    kept: bool = False
    count: int = 1
    fused: str = ""

    def arg(self, name: str):
        """The :class:`TensorDesc` (or ``None``) of tensor argument ``name``, else its scalar value."""
        if name in self.names:
            return self.inputs[self.names.index(name)]
        return self.scalars.get(name)

    @property
    def dtype(self) -> str:
        """The short dtype name of the first floating tensor argument (``bf16``), else of the first."""
        ts = [t for t in self.inputs if t is not None]
        for t in ts:
            if t.dtype.is_floating_point:
                return short_dtype(t.dtype)
        return short_dtype(ts[0].dtype) if ts else ""

    @property
    def is_view(self) -> bool:
        """A metadata-only call (view, reshape of strides, device query): no kernel runs."""
        return self.op in _VIEW_OPS

    def shapes(self) -> str:
        """The tensor arguments' shapes, ``"[2048, 4096] x [4096, 1024]"`` (``-`` for an absent one)."""
        return " x ".join("-" if t is None else "[" + ", ".join(map(str, t.shape)) + "]" for t in self.inputs)

    def key(self) -> tuple:
        """What makes two calls identical: op, arguments (shapes, dtypes, strides, devices, and
        of each storage offset only :func:`offset_class`), scalars and the module path with list
        indices replaced by ``*``.

        A storage offset is read by torch 2.15's FlyDSL rules only as zero-or-not and as the
        16-byte alignment of the tensor's origin ("16-byte aligned origins" for the GEMM and
        grouped-GEMM templates, "zero storage offsets" for the MXFP scaled GEMMs), so calls
        whose offsets differ in nothing else -- the slices a loop over a sequence takes, one
        offset per step -- are one distinct call with their count."""
        return (self.op, tuple(None if t is None else desc_class(t) for t in self.inputs),
                tuple(sorted((k, repr(v)) for k, v in self.scalars.items())),
                module_pattern(self.module), self.inner, self.fused)


def views_of(view: str | Sequence[str]) -> tuple[str, ...]:
    """The capture views a ``view`` argument names: ``"eager"``, ``"compiled"``, ``"both"`` (both
    :data:`VIEWS`) or a list of views. Raises :class:`UsageError` naming an unknown view."""
    vs = VIEWS if view == "both" else ((view,) if isinstance(view, str) else tuple(view))
    for v in vs:
        if v not in VIEWS:
            raise bad_choice("capture view", v, (*VIEWS, "both"))
    if not vs:
        raise UsageError("no capture view given (valid: eager, compiled, both)")
    return vs


def offset_class(offset: int, itemsize: int) -> tuple[bool, int]:
    """What a verdict reads of a storage offset (``offset`` elements of ``itemsize`` bytes):
    ``(offset == 0, origin's byte offset modulo 16)`` -- torch 2.15's FlyDSL rules ask for
    "zero storage offsets" (MXFP scaled GEMM) and "16-byte aligned origins" (GEMM templates),
    nothing finer (:meth:`Call.key`)."""
    return offset == 0, (offset * itemsize) % 16


def desc_class(t: TensorDesc) -> tuple:
    """A :class:`TensorDesc` as :meth:`Call.key` compares it: shape, dtype, strides, device and
    the :func:`offset_class` of its storage offset."""
    return (t.shape, t.dtype, t.stride, t.device, offset_class(t.storage_offset, t.itemsize))


def module_pattern(path: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``model.layers.*.mlp.down_proj``."""
    return _LAYER.sub(".*", path)


@dataclass
class Capture:
    """The calls of one forward step in one view (:func:`capture`).

    ``calls``: every recorded call in order (views included, ``inner`` ones included);
    ``uncaptured``: ``{"op", "module", "reason"}`` for what could not be captured;
    ``assumptions``: sentences saying what the capture assumed (device, routing, logits);
    ``layers``: :func:`layer_kinds` of the step; ``label``: what was captured
    (``"Llama-3.1-8B prefill 1x2048"``); ``phase``, ``view``, ``device``, ``arch``."""

    label: str
    phase: str
    view: str
    device: str
    arch: str
    calls: list[Call] = field(default_factory=list)
    uncaptured: list[dict] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    layers: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def step(self) -> str:
        """The captured step in words: ``prefill 1x2048`` (batch x tokens), ``decode 32x2048``
        (batch x context), or the phase (or label) alone for a module run on given inputs."""
        b, s = self.meta.get("batch"), self.meta.get("seq")
        if self.phase and b and s:
            return f"{self.phase} {b}x{s}"
        return self.phase or "step"

    def kernel_calls(self) -> list[Call]:
        """The calls that run a kernel and are judged: not views, not inner. Each stands for
        ``call.count`` calls of the step (:class:`Call`)."""
        return [c for c in self.calls if not c.inner and not c.is_view]

    def n_calls(self) -> int:
        """How many calls the step made (every recorded call, folded ones counted)."""
        return sum(c.count for c in self.calls)

    def distinct(self) -> list[tuple[Call, int]]:
        """Identical :meth:`kernel_calls` (:meth:`Call.key`) folded: ``(first call, count)`` in
        first-seen order, ``count`` the number of calls of the step. A row that folds calls at
        different storage offsets says so in its ``note``."""
        seen: dict[tuple, list] = {}
        for c in self.kernel_calls():
            k = c.key()
            if k in seen:
                seen[k][1] += c.count
                if not seen[k][2] and (c.inputs != seen[k][0].inputs or _MOVED in c.note):
                    seen[k][2] = True
            else:
                seen[k] = [c, c.count, _MOVED in c.note]
        return [(_offsets_noted(c, n) if moved else c, n) for c, n, moved in seen.values()]

    def aten_counts(self) -> Counter:
        """``Counter`` of ``(op, input shapes)`` over every ATen call (inner ones included, kept-as-one
        calls left out; folded calls by their count): what a ``TorchDispatchMode`` on a real run
        of the same step sees."""
        out: Counter = Counter()
        for c in self.calls:
            if not c.kept and c.op not in _FAKE_ONLY:
                out[(c.op, tuple(t.shape for t in c.inputs if t is not None))] += c.count
        return out


#: The note of a distinct call whose calls took slices at different storage offsets.
OFFSETS_NOTE = "{n:,} calls of one loop (a scan over the sequence): slices at different storage offsets"


def _offsets_noted(c: Call, n: int) -> Call:
    note = OFFSETS_NOTE.format(n=n)
    if note in c.note:
        return c
    base = re.sub(r"[\d,]+ calls of one loop \(a scan over the sequence\): slices at different storage offsets",
                  "", c.note).strip("; ")
    return replace(c, note="; ".join(x for x in (base, note) if x))


# -- FLOPs and bytes -----------------------------------------------------------------------------

#: Lookups whose first operand is a table: they read the rows they gather, not the table.
_GATHERS = frozenset({"aten.embedding.default", "aten.index_select.default"})


def call_cost(c: "Call") -> tuple[float, float]:
    """FLOPs and bytes of one captured call. A family's calls are counted by the family
    (:attr:`flyexplore.ops.base.ModelHooks.cost`: a GEMM [M, K] x [K, N] is 2MNK, SDPA
    4 x B x H x Sq x Skv x D, halved when causal, ...); views cost nothing; anything else is one
    FLOP per output element and each tensor read or written once (a lower bound for an unfused
    eager op); a lookup (``aten.embedding``, ``index_select``) reads the rows it gathers and its
    indices, not its whole table."""
    if c.op in _VIEW_OPS:
        return 0.0, 0.0
    hooks = model_hooks(c.family)
    if hooks is not None and hooks.cost is not None:
        return hooks.cost(c)
    ins = [t for t in c.inputs if t is not None]
    outs = [t for t in c.outputs if t is not None]
    if c.op in _GATHERS and len(ins) >= 2 and outs:
        # a lookup reads the rows it gathers (as many bytes as it writes) and its indices, not the table
        return 0.0, 2 * sum(tensor_bytes(t) for t in outs) + sum(tensor_bytes(t) for t in ins[1:])
    return float(sum(math.prod(t.shape) for t in outs)), io_bytes(c)


def cost(op: str, inputs: Sequence, outputs: Sequence, scalars: Mapping[str, Any],
         names: Sequence[str] = ()) -> tuple[float, float]:
    """FLOPs and bytes of a call given by its parts (:func:`call_cost`); ``inputs`` /
    ``outputs``: :class:`TensorDesc` or ``None``; ``names``: the tensor arguments' names (a
    family's count may read them, e.g. ``addmm``'s ``mat1``)."""
    fam = family_of().get(op)
    return call_cost(Call(op, fam, tuple(inputs), dict(scalars), tuple(outputs), "", "", None, 0.0, 0.0,
                          names=tuple(names)))


# ATen calls that only make views or read metadata (no kernel); plus device queries.
_VIEW_OPS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.expand.default", "aten.t.default",
    "aten.transpose.int", "aten.permute.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.slice.Tensor", "aten.select.int",
    "aten.alias.default", "aten.detach.default", "aten.as_strided.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.chunk.default", "aten.narrow.default",
    "aten.reshape.default", "aten.flatten.using_ints", "aten.unflatten.int", "aten.diagonal.default",
    "aten.lift_fresh.default", "aten.view_as_real.default", "aten.view_as_complex.default",
    "aten._reshape_alias.default", "aten.unfold.default", "prim.device.default", "aten.sym_size.int",
    "aten.sym_stride.int", "aten.sym_numel.default", "aten.sym_storage_offset.default",
    "aten.is_same_size.default", "aten.empty.memory_format", "aten.empty_strided.default",
    "aten.empty_like.default", "aten._local_scalar_dense.default", "aten.dim.default",
})


def _desc(t) -> TensorDesc | None:
    import torch

    if not isinstance(t, torch.Tensor):
        return None
    try:
        return TensorDesc.of(t)
    except (TypeError, ValueError, RuntimeError):
        return None


def _symbolic(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and any(not isinstance(s, int) for s in (*t.shape, *t.stride()))


#: Scalar argument types compared by value (anything else by ``repr``) in the recorder's fold key.
_PLAIN = (int, float, bool, str, type(None))
#: Substring of the note of a call folded from slices at different storage offsets.
_MOVED = "slices at different storage offsets"
