"""What a model really calls: every operator call of one forward step, with no GPU and no weights.

:func:`capture` runs one forward step of an ``nn.Module`` under ``FakeTensorMode`` (tensors carry
shape, dtype, strides and device, never data, so a "cuda:0" model needs no GPU and an 8B model
no memory) with a ``TorchDispatchMode`` that records each ATen call: the operator, its tensor
arguments (:class:`~flyexplore.world.conditions.TensorDesc`: shape, dtype, strides, storage
offset), its scalar arguments, the module path that made it (forward hooks), FLOPs and bytes.

Two views of the same step (``view=``):

- ``eager``: what ATen and the eager overrides see, the calls an eager run dispatches. This is
  where RMSNorm (``aten._fused_rms_norm``) and TopK (``aten.topk``) take FlyDSL or not.
- ``compiled``: what Inductor lowers. The step is recorded after Inductor's decompositions
  (``torch._inductor.decomposition.select_decomp_table()``, applied as ``make_fx`` applies a
  decomposition table), before Inductor's post-grad pattern passes (``pad_mm`` may still pad a
  GEMM). This is where the GEMM templates (``aten.mm``, ``aten._grouped_mm``) are decided.

Which family a call belongs to, its FLOPs and bytes, and what is kept as one call are the
operator families' own knowledge (:class:`flyexplore.ops.base.ModelHooks`, ``Operator.model``,
read through :func:`flyexplore.ops.model_families`): a family claims ATen overloads
(``aten_ops``), may keep a torch function as one call (attention: ``F.scaled_dot_product_attention``,
whose math decomposition is not what a GPU runs) or a module (RMSNorm: a module computing
pow / mean / rsqrt / mul, which never reaches the FlyDSL override); the inner ATen calls of a
kept call are recorded, marked ``inner``, and not judged. A family registered with
:func:`flyexplore.ops.register_op` is captured the same way.

In the compiled view Inductor's post-grad pattern ``add(mm(a, b), inp) -> addmm(inp, a, b)``
(torch 2.15 ``torch/_inductor/fx_passes/post_grad.py``: ``addmm`` with ``is_valid_addmm_fusion``)
is applied as the calls are recorded: an ``aten.add`` whose operand is the very output of an
``aten.mm`` (no view between) and whose other operand has the output's shape becomes the
``aten.addmm`` Inductor lowers (``addmm`` has no FlyDSL template). On a GPU a bias-like other
operand (a broadcast row) is left unfused while every user of the sum is pointwise or a view, as
Inductor does (``should_prefer_unfused_addmm``), and fused once a user is not; on the CPU it
fuses. An ``mm`` output used again after the add is not seen.

What cannot be captured is listed in :attr:`Capture.uncaptured` with the reason, never dropped:
custom operators (``torch.library`` ops outside ``aten``/``prims``: shapes from their fake
implementation, no FlyDSL route), and calls whose shapes depend on data (unbacked sizes from
``nonzero``-like operators, under a ``ShapeEnv``). A forward step that cannot go on raises
:class:`CaptureError` naming the module where it failed.

On a CPU-only machine the CUDA build of torch makes fake ``cuda:0`` tensors without a device;
code that asks the device what it is (``torch.cuda.get_device_capability``, as transformers'
grouped-GEMM gate does) is answered for the target (gfx950: 9.5, as a ROCm torch reports it)
while the capture runs, and the capture says so in :attr:`Capture.assumptions`.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import model_families, model_hooks
from flyexplore.ops.base import io_bytes, tensor_bytes
from flyexplore.world.conditions import TensorDesc, short_dtype

#: The two views of a forward step (module docstring).
VIEWS = ("eager", "compiled")
#: ``torch.cuda.get_device_capability`` as a ROCm torch reports each target arch (major, minor),
#: answered while capturing on a machine without that GPU (gfx950 = MI350/MI355X: 9.5).
ARCH_CAPABILITY = {"gfx950": (9, 5), "gfx942": (9, 4), "gfx90a": (9, 0), "gfx1201": (12, 0)}
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


def check_target(arch: str) -> None:
    """Raise :class:`UsageError` unless ``arch`` is a target the capture knows
    (:data:`ARCH_CAPABILITY`)."""
    if arch not in ARCH_CAPABILITY:
        raise bad_choice("target arch", arch, ARCH_CAPABILITY)


class CaptureError(UsageError):
    """The forward step could not be captured; the message names the module where it failed."""


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
    reference scan is, gives one call per step of the loop, listed once with their count)."""

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
                module_pattern(self.module), self.inner)


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


# -- recording --------------------------------------------------------------------------------------

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


class _Recorder:
    """The shared state of one capture: the module stack, the calls, what could not be captured.

    Calls are folded as they are recorded, so that memory and every later pass grow with the
    distinct calls of the step, not with its length: a call identical to an earlier one of the
    same module (its exact path, not the pattern), in everything but the storage offsets of its
    tensors (kept only as :func:`offset_class`), adds one to that call's count. A view or
    metadata call (no kernel, never judged) folds whatever its scalars (the index of a
    ``select``): what a real run is compared on (:meth:`Capture.aten_counts`: op and input
    shapes) stays exact. Kept-as-one calls made with their own ``family`` (SDPA, a decomposed
    RMSNorm) are never folded. Inside an RMSNorm module no call folds into one made before it
    (the hook reads the module's calls as ``calls[start:]``), and a declined Inductor
    decomposition takes back the counts it added (:meth:`rollback`)."""

    def __init__(self, progress: "Progress | None" = None):
        self.stack: list[tuple[str, str]] = [("", "")]
        self.calls: list[Call] = []
        self.counts: list[int] = []
        self.rowkeys: list[tuple | None] = []
        self.first_offsets: list[tuple] = []
        self.moved: list[bool] = []
        self.index: dict[tuple, int] = {}
        self.journal: list[int] = []
        self.depth = 0
        self.n = 0
        self.descs: dict[tuple, tuple] = {}
        self.uncaptured: list[dict] = []
        self.inner = 0
        self.marks: list[int] = []
        self.host_answers: list[tuple] = []
        self.assumed: list[str] = []
        self.failed_at: tuple[str, str] | None = None
        self.progress = progress
        self.silent = False     # a reused layer's outputs are being made: nothing is recorded
        self.family_of: dict[str, str] = family_of()
        self.last = -1          # the row the last call was recorded in (its own or the one it folded into)
        self.mm_out = None      # compiled view: the output tensor of each aten.mm -> its row
        self.pending_bias = {}  # compiled view: a bias add's sum -> its mm, until a user decides
        self.add_index: dict[int, int] = {}   # id of such a sum -> the row of its add call

    def desc(self, t) -> tuple:
        """``(TensorDesc or None, its fold class, storage offset, symbolic)`` of tensor ``t``,
        each distinct description made once."""
        try:
            if t._has_symbolic_sizes_strides:
                return _desc(t), None, None, True
            dev = t.device
            raw = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, dev)
        except (TypeError, ValueError, RuntimeError):
            return None, None, None, False
        got = self.descs.get(raw)
        if got is None:
            d = _desc(t)
            got = self.descs[raw] = (d, None if d is None else desc_class(d))
        return got[0], got[1], raw[2], False

    def add(self, op: str, named: Sequence[tuple[str, Any]], out, *, family=None, note="",
            flops_bytes=None, why_uncaptured: str | None = None, kept: bool = False) -> Call:
        """Record one call: ``named`` its arguments as ``(name, value)`` in schema order;
        ``kept``: a family's kept-as-one call. Returns the call (the earlier identical one when
        it folds; :attr:`last` is its row)."""
        import torch
        from torch.utils._pytree import tree_leaves

        Tensor = torch.Tensor
        self.n += 1
        if self.progress is not None and not self.n & 1023:
            self.progress.tick(self.n, self.stack[-1][0])
        path, typ = self.stack[-1]
        ins, names, scal, cls, offs = [], [], {}, [], []
        sym = False
        fam = family if family is not None else self.family_of.get(op)
        keep_none = fam is not None
        for name, a in named:
            if isinstance(a, Tensor):
                d, k, o, sy = self.desc(a)
                ins.append(d)
                cls.append(k)
                offs.append(o)
                names.append(name)
                sym = sym or sy
            elif isinstance(a, (list, tuple)) and a and all(isinstance(x, Tensor) for x in a):
                for j, x in enumerate(a):
                    d, k, o, sy = self.desc(x)
                    ins.append(d)
                    cls.append(k)
                    offs.append(o)
                    names.append(f"{name}[{j}]")
                    sym = sym or sy
            elif a is None and keep_none:
                ins.append(None)
                cls.append(None)
                offs.append(None)
                names.append(name)
            else:
                if not sym and isinstance(a, (list, tuple, dict)):
                    sym = any(_symbolic(x) for x in tree_leaves(a))
                scal[name] = a
        if out is None:
            leaves = ()
        elif isinstance(out, Tensor):
            leaves = (out,)
        elif isinstance(out, (list, tuple, dict)):
            leaves = [o for o in tree_leaves(out) if isinstance(o, Tensor)]
        else:   # a device, a number: what an ATen call returns besides tensors
            leaves = ()
        outs, ocls = [], []
        for o in leaves:
            d, k, _, sy = self.desc(o)
            outs.append(d)
            ocls.append(k)
            sym = sym or sy
        outs = tuple(outs)
        why = [why_uncaptured] if why_uncaptured else []
        if sym:
            why.append("shape depends on data (unbacked size from a data-dependent operator such as nonzero): "
                       "not judged")
        if why and not self.inner:
            self.uncaptured.append({"op": op, "module": path, "module_type": typ, "reason": "; ".join(why)})
        key = None
        if family is None and not sym:
            sk = () if op in _VIEW_OPS else tuple(
                (k, v if type(v) in _PLAIN else repr(v)) for k, v in scal.items())
            key = (op, tuple(cls), tuple(ocls), sk, path, typ, self.inner > 0, note, tuple(names))
            i = self.index.get(key)
            if i is not None and i >= (self.marks[-1] if self.marks else 0):
                self.counts[i] += 1
                if self.depth:
                    self.journal.append(i)
                if not self.moved[i] and tuple(offs) != self.first_offsets[i]:
                    self.moved[i] = True
                self.last = i
                return self.calls[i]
        layer = _LAYER.search(path)
        c = Call(op, fam, tuple(ins), scal, outs, path, typ, int(layer.group(1)) if layer else None, 0.0, 0.0,
                 inner=self.inner > 0, note=note, names=tuple(names), kept=kept)
        if flops_bytes is None:
            flops_bytes = call_cost(c) if not sym else (math.nan, math.nan)
        c = replace(c, flops=flops_bytes[0], bytes=flops_bytes[1])
        if key is not None:
            self.index[key] = len(self.calls)
        self.last = len(self.calls)
        self.calls.append(c)
        self.counts.append(1)
        self.rowkeys.append(key)
        self.first_offsets.append(tuple(offs))
        self.moved.append(False)
        return c

    def begin(self) -> int:
        """Start a part that may be taken back (:meth:`rollback`); returns its journal mark."""
        self.depth += 1
        return len(self.journal)

    def end(self) -> None:
        """End a part started by :meth:`begin` and kept."""
        self.depth -= 1
        if not self.depth:
            self.journal.clear()

    def rollback(self, mark: int, jmark: int) -> None:
        """Take back the part started by :meth:`begin` (journal mark ``jmark``) when the calls
        were ``mark`` long: the calls it made and the counts it added; ends it."""
        for i in self.journal[jmark:]:
            if i < mark:
                self.counts[i] -= 1
        del self.journal[jmark:]
        self.forget(mark)
        for lst in (self.calls, self.counts, self.rowkeys, self.first_offsets, self.moved):
            del lst[mark:]
        self.end()

    def forget(self, start: int) -> None:
        """No later call folds into calls ``start`` and after (their recorded form changed)."""
        for j in range(start, len(self.calls)):
            k = self.rowkeys[j]
            if k is not None and self.index.get(k) == j:
                del self.index[k]
            self.rowkeys[j] = None

    def finish(self) -> list[Call]:
        """The calls with their counts; a call folded from slices at different offsets says so."""
        out = []
        for c, n, moved in zip(self.calls, self.counts, self.moved):
            if n < 1:   # every call of the row was fused into another (addmm)
                continue
            if n > 1:
                c = replace(c, count=n)
                if moved:
                    c = _offsets_noted(c, n)
            out.append(c)
        return out


class _FastFake:
    """Outputs for calls ``FakeTensorMode`` has answered before, made without it.

    A fake call costs about 100 us in ``FakeTensorMode``'s Python (its cache key, its checks,
    the output's construction); a loop over a sequence repeats the same few calls thousands of
    times. Two cases are answered here, every other call goes to the mode as before:

    - a functional ATen call (no aliasing or mutation in its schema, no data-dependent output)
      whose operator and arguments (tensors by shape, strides, dtype and device -- a meta kernel's
      output does not depend on the storage offset -- scalars by value) match an earlier call
      the mode answered with fresh tensors: new fake tensors of the remembered shapes, strides,
      dtypes and devices (``torch.empty_strided`` on ``meta``, wrapped as the mode wraps);
    - a view (one of :data:`_PURE_VIEWS`: always a new view, never the input itself) of one fake tensor with plain
      scalar arguments: the meta kernel run as the mode runs it (``in_kernel_invocation_manager``),
      its output wrapped on the input's fake device (the view shares the input's storage).

    ``aten.view`` (whose strides of size-1 dimensions the mode sets otherwise than the meta kernel)
    is answered from the mode's own earlier answer for the same input layout and size: an
    ``as_strided`` view at the input's storage offset. Tensors with a constant, symbolic sizes,
    or of another mode always go to the mode.
    ``tests/insight/test_capture_speed.py`` holds captures made with and without it equal."""

    def __init__(self, mode):
        import torch
        from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

        self.mode, self.FakeTensor, self.kernel = mode, FakeTensor, in_kernel_invocation_manager
        self.torch = torch
        self.memo: dict[tuple, tuple] = {}
        self.kind: dict[Any, str] = {}
        self.plain = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format)
        self.hits = 0
        self.device_op = torch.ops.prim.device.default
        self.view_op, self.as_strided = torch.ops.aten.view.default, torch.ops.aten.as_strided.default
        self.views: dict[tuple, tuple] = {}

    def _kind(self, func) -> str:
        k = self.kind.get(func)
        if k is None:
            torch = self.torch
            try:
                sch = func._schema
                alias = any(a.alias_info for a in sch.arguments) or any(r.alias_info for r in sch.returns)
                tags = set(getattr(func, "tags", ()))
                data = bool(tags & {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output})
                ns = getattr(func, "namespace", "")
                if ns not in ("aten", "prims") or data or str(func) in _VIEW_OPS and not func.is_view:
                    k = "slow"
                elif func.is_view:
                    writes = any(a.alias_info is not None and a.alias_info.is_write for a in sch.arguments)
                    k = "view" if str(func) in _PURE_VIEWS and not writes else "slow"
                else:
                    k = "slow" if alias else "functional"
            except (AttributeError, RuntimeError):
                k = "slow"
            self.kind[func] = k
        return k

    def _arg(self, a):
        t = type(a)
        if t is self.FakeTensor:
            if a.fake_mode is not self.mode or a.constant is not None or a._has_symbolic_sizes_strides:
                return False
            return (tuple(a.shape), a.stride(), a.dtype, a.fake_device)
        if t in self.plain:
            return (t, a)
        if t is list or t is tuple:
            r = tuple(self._arg(x) for x in a)
            return False if any(x is False for x in r) else (t, r)
        return False

    def key(self, func, args, kwargs) -> tuple | None:
        """What a meta kernel or a decomposition reads of a call: the operator, tensors by shape,
        strides, dtype and device (not their storage offsets), scalars by value; ``None`` when an
        argument cannot be keyed (a constant, symbolic sizes, another mode, an unknown type)."""
        ak = self._arg(args)
        kk = self._arg(tuple(kwargs.items())) if kwargs else ()
        return None if ak is False or kk is False else (func, ak, kk)

    def call(self, func, args, kwargs):
        """``func(*args, **kwargs)`` under the fake mode, answered here when it can be."""
        if func is self.device_op:
            a0 = args[0] if len(args) == 1 and not kwargs else None
            if type(a0) is self.FakeTensor and not a0.fake_mode.in_kernel_invocation:
                return a0.fake_device
        if func is self.view_op and not kwargs and len(args) == 2:
            a0 = args[0]
            vk = self._arg(args)
            if vk is not False:
                got = self.views.get(vk)
                if got is not None:
                    self.hits += 1
                    with self.kernel(self.mode):
                        r = self.as_strided(a0, got[0], got[1], a0.storage_offset())
                    return self.FakeTensor(self.mode, r, a0.fake_device)
                out = func(*args)
                if (type(out) is self.FakeTensor and out.storage_offset() == a0.storage_offset()
                        and not out._has_symbolic_sizes_strides and out.fake_device == a0.fake_device):
                    self.views[vk] = (tuple(out.shape), out.stride())
                return out
        kind = self._kind(func)
        if kind == "view":
            a0 = args[0] if args else None
            if (not kwargs and type(a0) is self.FakeTensor and a0.fake_mode is self.mode and a0.constant is None
                    and not a0._has_symbolic_sizes_strides
                    and all(self._arg(x) is not False and type(x) is not self.FakeTensor for x in args[1:])):
                with self.kernel(self.mode):
                    r = func(*args)
                self.hits += 1
                dev, FT = a0.fake_device, self.FakeTensor
                if isinstance(r, self.torch.Tensor):
                    return FT(self.mode, r, dev)
                return type(r)(FT(self.mode, x, dev) for x in r)
        key = self.key(func, args, kwargs) if kind == "functional" else None
        spec = self.memo.get(key) if key is not None else None
        if spec is not None:
            self.hits += 1
            outs, typ = spec
            with self.torch._C._DisableTorchDispatch():
                made = [self.FakeTensor(self.mode, self.torch.empty_strided(sh, st, dtype=dt, device="meta"), dev)
                        for sh, st, dt, dev in outs]
            return made[0] if typ is None else typ(made)
        out = func(*args, **kwargs)
        if key is not None:
            leaves = [out] if isinstance(out, self.torch.Tensor) else out
            if isinstance(leaves, (list, tuple)) and leaves and all(
                    type(o) is self.FakeTensor and o.fake_mode is self.mode and o.constant is None
                    and not o._has_symbolic_sizes_strides and o.storage_offset() == 0 for o in leaves):
                self.memo[key] = ([(tuple(o.shape), o.stride(), o.dtype, o.fake_device) for o in leaves],
                                  None if isinstance(out, self.torch.Tensor) else type(out))
        return out


#: ATen views that always return a new view of their input, whose strides ``FakeTensorMode`` and
#: the meta kernel agree on (``to``, ``contiguous``, ``reshape`` may return the input or a copy;
#: ``alias``/``detach`` keep dispatch keys; ``view``/``_reshape_alias``: the mode's strides of
#: size-1 dimensions differ from the meta kernel's: none of them here).
_PURE_VIEWS = frozenset({
    "aten.expand.default", "aten.t.default", "aten.transpose.int", "aten.permute.default",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.slice.Tensor", "aten.select.int", "aten.as_strided.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.narrow.default", "aten.diagonal.default",
    "aten.unfold.default",
})

#: Whether :func:`run_step` answers repeated fake calls itself (:class:`_FastFake`); tests turn
#: it off to hold the two to the same capture.
FAST_FAKE = True
#: Record a decoder layer identical to an earlier one once and count its calls for each
#: (:class:`_LayerReuse`); ``FLYEXPLORE_CAPTURE_EVERY_LAYER=1`` records every layer.
REUSE_LAYERS = True


class Progress:
    """One line on ``stream`` (default stderr) at most every ``every`` seconds once a capture
    has run ``after`` seconds: ``flyexplore: capturing <what>: 180,000 calls, layer 11 of 24,
    21 s``. On a terminal a tqdm bar over the layers takes the lines' place. ``clock``: seconds
    (``time.monotonic``; tests pass a fake one). :meth:`tick` is called every 1,024 calls by the
    recorder; :meth:`close` ends the bar or says the total, once anything was said."""

    def __init__(self, what: str, layers: int = 0, *, clock: Callable[[], float] | None = None, stream=None,
                 every: float = 5.0, after: float = 5.0, tty: bool | None = None):
        import sys
        import time

        self.what, self.layers = what, layers
        self.clock = clock or time.monotonic
        self.stream = stream if stream is not None else sys.stderr
        self.every, self.after = every, after
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.t0 = self.clock()
        self.last: float | None = None
        self.said = 0
        self.bar = None
        self.calls = 0

    def line(self, calls: int, layer: int | None, elapsed: float) -> str:
        """The plain progress line."""
        where = f", layer {layer + 1} of {self.layers}" if layer is not None and self.layers else ""
        return f"flyexplore: capturing {self.what}: {calls:,} calls{where}, {elapsed:.0f} s"

    def tick(self, calls: int, path: str = "") -> None:
        """Say where the capture is, if ``after`` seconds have gone and ``every`` since the last."""
        self.calls = calls
        now = self.clock()
        el = now - self.t0
        if el < self.after or (self.last is not None and now - self.last < self.every):
            return
        self.last = now
        m = _LAYER.search(path)
        layer = int(m.group(1)) if m else None
        self.said += 1
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=self.layers or None, desc=f"flyexplore: capturing {self.what}", unit="layer",
                                file=self.stream, leave=False, mininterval=0)
            if layer is not None:
                self.bar.n = layer + 1
            self.bar.set_postfix_str(f"{calls:,} calls, {el:.0f} s", refresh=True)
            return
        print(self.line(calls, layer, el), file=self.stream, flush=True)

    def close(self, calls: int | None = None) -> None:
        """End the bar; once anything was said, one last line with the total calls and time."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.said:
            n = self.calls if calls is None else calls
            print(f"flyexplore: captured {self.what}: {n:,} calls in {self.clock() - self.t0:.0f} s",
                  file=self.stream, flush=True)


def _bind(func, args, kwargs) -> list[tuple[str, Any]]:
    """``(name, value)`` of an ATen call's arguments in schema order (kwargs by their names)."""
    names = _ARG_NAMES.get(func)
    if names is None:
        try:
            names = tuple(a.name for a in func._schema.arguments)
        except AttributeError:
            names = ()
        _ARG_NAMES[func] = names
    n = len(names)
    out = [(names[i] if i < n else f"arg{i}", a) for i, a in enumerate(args)]
    if kwargs:
        out += list(kwargs.items())
    return out


_ARG_NAMES: dict = {}


def _kept_functions() -> dict:
    """``{torch function: (name, family, args, scalars, output_layout)}`` of the families'
    :attr:`~flyexplore.ops.base.ModelHooks.keep_function`."""
    out = {}
    for fam, op in model_families().items():
        h = op.model
        if h.keep_function is not None:
            fn, name, args, scalars = h.keep_function
            out.setdefault(fn(), (name, fam, args, scalars, h.output_layout))
    return out


#: ``aten.add`` overloads the compiled view fuses with an ``aten.mm`` operand into ``aten.addmm``
#: (module docstring).
_ADDS = ("aten.add.Tensor", "aten.add_.Tensor")


def _expandable(shape, to) -> bool:
    """``shape`` broadcasts to ``to`` (torch's ``is_expandable_to``: right-aligned, each dim equal
    or 1)."""
    if len(shape) > len(to):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(to)))


def _bias_like(inp, out) -> bool:
    """``inp`` broadcasts over ``out`` rather than matching it (another rank, a 1 against a larger
    dim, or a zero stride): torch 2.15 ``post_grad.py::_is_bias_like_addmm_input``, re-derived."""
    if inp.dim() != out.dim():
        return True
    if tuple(inp.shape) != tuple(out.shape):
        return any(a == 1 and b != 1 for a, b in zip(inp.shape, out.shape))
    return any(st == 0 for st in inp.stride())


def _fuse_addmm(rec: _Recorder, func, args, kwargs, out) -> str | None:
    """In the compiled view, record ``add(mm(a, b), inp)`` as the ``aten.addmm(inp, a, b)``
    Inductor's post-grad pass makes of it (module docstring). Returns ``"fused"``, ``"pending"``
    (a bias-like ``inp`` on a GPU: fused only if a later user of the sum is not pointwise,
    :func:`_use_of_pending`) or ``None``."""
    import torch

    if rec.mm_out is None or kwargs.get("alpha", 1) != 1 or len(args) < 2:
        return None
    x, y = args[0], args[1]
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return None
    got = rec.mm_out.get(x)
    mm_t, inp = (x, y) if got is not None else (y, x)
    got = got if got is not None else rec.mm_out.get(y)
    if got is None:
        return None
    idx, m1, m2 = got
    if inp.dtype != mm_t.dtype or m1.dtype != inp.dtype or m2.dtype != inp.dtype or inp.device != mm_t.device:
        return None
    if not _expandable(tuple(inp.shape), tuple(mm_t.shape)):
        return None
    rec.mm_out.pop(mm_t, None)
    if mm_t.device.type != "cpu" and _bias_like(inp, mm_t):
        # on a GPU Inductor keeps a bias add apart when every user of the sum is pointwise
        # (post_grad.py::should_prefer_unfused_addmm): decided by the sum's users
        rec.pending_bias[out] = (idx, inp, m1, m2)
        return "pending"
    _record_addmm(rec, idx, inp, m1, m2, out)
    return "fused"


def _record_addmm(rec: _Recorder, idx: int, inp, m1, m2, out) -> None:
    """Record the fused ``aten.addmm(inp, m1, m2)`` under the module that made the ``mm`` (row
    ``idx``), which loses that call (a row whose calls are all fused is dropped)."""
    mm_call = rec.calls[idx]
    rec.counts[idx] -= 1
    rec.stack.append((mm_call.module, mm_call.module_type))
    try:
        rec.add("aten.addmm.default", [("self", inp), ("mat1", m1), ("mat2", m2)], out,
                note="mm + add fused into addmm by Inductor's post-grad pass "
                     "(torch/_inductor/fx_passes/post_grad.py::addmm)")
    finally:
        rec.stack.pop()


#: Casts that are no-ops when the dtype does not change (Inductor's post-grad ``remove_noop_ops``
#: drops them): a pending bias add's sum is followed through them (:func:`_follow_noop_cast`).
_NOOP_CASTS = frozenset({"aten.to.dtype", "aten._to_copy.default", "prims.convert_element_type.default",
                         "aten.to.dtype_layout"})


def _follow_noop_cast(rec: _Recorder, name: str, args, out) -> None:
    """The output of a same-dtype cast of a pending bias add's sum stands for the sum."""
    import torch

    if not rec.pending_bias or name not in _NOOP_CASTS or not args or not isinstance(out, torch.Tensor):
        return
    src = args[0]
    if isinstance(src, torch.Tensor) and src in rec.pending_bias and src.dtype == out.dtype:
        rec.pending_bias[out] = rec.pending_bias[src]
        if id(src) in rec.add_index:
            rec.add_index[id(out)] = rec.add_index[id(src)]


def _use_of_pending(rec: _Recorder, func, args) -> None:
    """A call using the sum of a pending bias add (:func:`_fuse_addmm`): a user that is neither
    pointwise (``torch.Tag.pointwise``) nor a view makes Inductor fuse it after all: the ``mm``
    becomes ``addmm`` and the add's row loses that call."""
    import torch

    if not rec.pending_bias:
        return
    if str(func) in _NOOP_CASTS:   # a cast to the same dtype (Inductor removes it as a no-op): see through it
        return
    pointwise = torch.Tag.pointwise in getattr(func, "tags", ()) or str(func) in _VIEW_OPS
    for a in args:
        if isinstance(a, torch.Tensor) and a in rec.pending_bias and not pointwise:
            entry = rec.pending_bias.pop(a)
            for other in [k for k, v in rec.pending_bias.items() if v is entry]:   # its no-op casts
                del rec.pending_bias[other]
            idx, inp, m1, m2 = entry
            add_idx = rec.add_index.pop(id(a), None)
            _record_addmm(rec, idx, inp, m1, m2, a)
            if add_idx is not None:
                rec.counts[add_idx] -= 1


def _modes(rec: _Recorder, decompose: bool, fake=None):
    """The dispatch mode (records every ATen call; in the compiled view decomposes as Inductor
    does and fuses ``mm + add`` into ``addmm``) and the function mode (keeps the families' kept
    functions, SDPA, one call). ``fake``: the ``FakeTensorMode`` the step runs in, whose repeated
    calls :class:`_FastFake` answers (``None``: every call goes to it)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.weak import WeakIdKeyDictionary

    table = {}
    if decompose:
        from torch._inductor.decomposition import select_decomp_table

        table = select_decomp_table()
        rec.mm_out = WeakIdKeyDictionary()
        rec.pending_bias = WeakIdKeyDictionary()
    kept = _kept_functions()
    mm = torch.ops.aten.mm.default
    fast = _FastFake(fake) if fake is not None else None
    run = fast.call if fast is not None else (lambda f, a, k: f(*a, **k))
    names: dict = {}
    # decompositions that declined (NotImplemented) for a call's layout (:meth:`_FastFake.key`):
    # not tried again for the same layout (Inductor's bmm, under pw_cast_for_opmath, declines
    # on a GPU after casting its inputs: a scan's every step paid for it)
    declined: set = set()

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if rec.silent:
                return run(func, args, kwargs)
            name = names.get(func)
            if name is None:
                name = names[func] = str(func)
            dk = fast.key(func, args, kwargs) if decompose and fast is not None and func in table else None
            if decompose and func in table and not rec.inner and (dk is None or dk not in declined):
                mark, umark = len(rec.calls), len(rec.uncaptured)
                jmark = rec.begin()
                try:
                    with self:
                        r = table[func](*args, **kwargs)
                except BaseException:
                    rec.end()
                    raise
                if r is not NotImplemented:
                    rec.end()
                    return r
                # a decomposition that declined (NotImplemented) may have run casts first
                # (pw_cast_for_opmath): they are not part of what Inductor lowers
                rec.rollback(mark, jmark)
                del rec.uncaptured[umark:]
                if dk is not None:
                    declined.add(dk)
            if func is torch.ops.aten._local_scalar_dense.default and rec.host_answers:
                answer, why = rec.host_answers[-1]
                if why not in rec.assumed:
                    rec.assumed.append(why)
                rec.add(name, _bind(func, args, kwargs), None, note=why)
                return answer
            out = run(func, args, kwargs)
            pending = None
            if rec.mm_out is not None and not rec.inner:
                _use_of_pending(rec, func, args)
                _follow_noop_cast(rec, name, args, out)
                pending = _fuse_addmm(rec, func, args, kwargs, out) if name in _ADDS else None
                if pending == "fused":
                    return out
                for a in args:   # any other use of an mm's output (a view too) rules its fusion out
                    if isinstance(a, torch.Tensor):
                        rec.mm_out.pop(a, None)
            ns = getattr(func, "namespace", "aten")
            custom = (f"custom operator {name}: shapes from its fake implementation; no FlyDSL route reads it"
                      if ns not in ("aten", "prims", "prim") else None)
            rec.add(name, _bind(func, args, kwargs), out, why_uncaptured=custom)
            if pending == "pending":
                rec.add_index[id(out)] = rec.last
            if func is mm and rec.mm_out is not None and not rec.inner and isinstance(out, torch.Tensor):
                rec.mm_out[out] = (rec.last, args[0], args[1])
            return out

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            k = kept.get(func)
            if k is not None and not rec.inner and not rec.silent:
                cname, fam, named_of, scalars_of, layout_of = k
                rec.inner += 1
                try:
                    out = func(*args, **kwargs)
                    named = named_of(args, kwargs)
                    if layout_of is not None and isinstance(out, torch.Tensor) and out.device.type != "cpu":
                        ins = tuple(_desc(v) for _, v in named if isinstance(v, torch.Tensor))
                        strides = layout_of(ins, _desc(out))
                        if strides is not None and tuple(strides) != tuple(out.stride()):
                            # the layout a fused GPU kernel gives its output (the family's output_layout)
                            out = torch.empty_strided(tuple(out.shape), strides, dtype=out.dtype, device=out.device)
                finally:
                    rec.inner -= 1
                # its scalars (an absent mask among them) are the family's, not tensor arguments:
                # set them, then count the call once
                rec.add(cname, list(named), out, family=fam, kept=True, flops_bytes=(0.0, 0.0))
                c = replace(rec.calls[-1], scalars=scalars_of(args, kwargs))
                fl, by = call_cost(c)
                rec.calls[-1] = replace(c, flops=fl, bytes=by)
                return out
            return func(*args, **kwargs)

    return Dispatch(), Function()


def _kept_modules(model) -> dict:
    """``{id(module): (name, family, args, family's aten_ops)}`` for the modules a family keeps as
    one call (:attr:`~flyexplore.ops.base.ModelHooks.keep_module`)."""
    hooks = [(fam, op.model) for fam, op in model_families().items() if op.model.keep_module is not None]
    out = {}
    for m in model.modules():
        for fam, h in hooks:
            got = h.keep_module(m)
            if got is not None:
                out[id(m)] = (got[0], fam, got[1], frozenset(h.aten_ops))
                break
    return out


def _hooks(model, rec: _Recorder):
    """Forward pre/post hooks on every submodule: the module stack, and the modules a family
    keeps as one call (:func:`_kept_modules`)."""
    handles = []
    kept = _kept_modules(model)

    def pre(path, mod):
        def f(m, args, kwargs=None):
            rec.stack.append((path, type(m).__name__))
            if id(m) in kept:
                rec.inner += 1
                rec.marks.append(len(rec.calls))
            return None
        return f

    def post(path, mod):
        def f(m, args, out):
            k = kept.get(id(m))
            if k is not None:
                cname, fam, args_of, own = k
                rec.inner -= 1
                start = rec.marks.pop()
                inner = rec.calls[start:]
                counts = rec.counts[start:]
                if any(c.op in own for c in inner):  # it reached the family's own op: that is the call
                    rec.forget(start)
                    rec.calls[start:] = [replace(c, inner=rec.inner > 0) for c in inner]
                else:
                    fl = sum(c.flops * n for c, n in zip(inner, counts) if not c.is_view)
                    by = sum(c.bytes * n for c, n in zip(inner, counts) if not c.is_view)
                    ops = sorted({c.op.split(".")[1] for c in inner if not c.is_view})
                    named, note = args_of(m, args, ops)
                    rec.add(cname, list(named), out, family=fam, note=note, flops_bytes=(fl, by), kept=True)
            rec.stack.pop()
            return None
        return f

    for path, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(pre(path, mod)))
        handles.append(mod.register_forward_hook(post(path, mod)))
    return handles


@contextlib.contextmanager
def target_device(arch: str, device: str):
    """While capturing fake ``cuda`` tensors on a machine without a GPU, answer
    ``torch.cuda.get_device_capability`` as a ROCm torch on ``arch`` would (:data:`ARCH_CAPABILITY`).
    Yields the sentence the capture adds to its assumptions, or ``None`` when nothing was patched."""
    import torch

    if not str(device).startswith("cuda") or torch.cuda.is_available():
        yield None
        return
    cap = ARCH_CAPABILITY.get(arch, (9, 5))
    orig = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: cap
    try:
        yield (f"no GPU here: fake {device} tensors; torch.cuda.get_device_capability answered {cap} "
               f"(a ROCm torch on {arch}) while capturing")
    finally:
        torch.cuda.get_device_capability = orig


#: Host reads (``bool(t)``, ``t.item()``) inside these transformers functions are answered as a
#: real run of plain sequences answers them: ``{module.function: (answer, what it means)}``.
HOST_READ_ANSWERS = {
    "transformers.masking_utils.find_packed_sequence_indices":
        (True, "transformers' packed-sequence check (masking_utils.find_packed_sequence_indices) reads "
               "position_ids on the host: answered as for plain, unpacked sequences"),
}


@contextlib.contextmanager
def real_run_branches(rec: "_Recorder"):
    """While capturing, let transformers take the branches of a real run.

    Its ``is_tracing`` counts a FakeTensor as tracing (``transformers.utils.import_utils.
    is_fake_tensor``) and then builds explicit attention masks as for ``torch.export``, where a
    real eager run passes ``is_causal=True`` to SDPA: answered ``False`` while capturing. The
    host reads of :data:`HOST_READ_ANSWERS` are answered as stated there (the dispatch mode
    records the read and returns the answer; the capture lists the assumption). Nothing is
    patched when transformers is not imported."""
    import importlib
    import sys

    iu = sys.modules.get("transformers.utils.import_utils")
    if iu is None or not hasattr(iu, "is_fake_tensor"):
        yield
        return
    undo = [(iu, "is_fake_tensor", iu.is_fake_tensor)]
    iu.is_fake_tensor = lambda t: False
    for name, (answer, why) in HOST_READ_ANSWERS.items():
        mod_name, _, fn = name.rpartition(".")
        mod = sys.modules.get(mod_name) or importlib.import_module(mod_name)
        orig = getattr(mod, fn, None)
        if orig is None:
            continue

        def wrapped(*a, _orig=orig, _answer=answer, _why=why, **k):
            rec.host_answers.append((_answer, _why))
            try:
                return _orig(*a, **k)
            finally:
                rec.host_answers.pop()
        undo.append((mod, fn, orig))
        setattr(mod, fn, wrapped)
    try:
        yield
    finally:
        for mod, fn, orig in reversed(undo):
            setattr(mod, fn, orig)


#: torch loggers that log a traceback for a call that fails under ``FakeTensorMode`` before it
#: raises (``log.exception("failed while attempting to run meta for ...")``); the capture raises
#: the failure as one :class:`CaptureError` line, so their records are dropped while capturing.
QUIET_LOGGERS = ("torch._subclasses.fake_tensor",)


@contextlib.contextmanager
def quiet_torch_logs():
    """Drop the records of :data:`QUIET_LOGGERS` while capturing (a filter on each logger, which
    ``TORCH_LOGS`` level settings do not undo); removed on exit."""
    import logging

    def drop(record):
        return False

    loggers = [logging.getLogger(n) for n in QUIET_LOGGERS]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


def fake_mode():
    """A ``FakeTensorMode`` for capturing (real tensors allowed as inputs; a ``ShapeEnv`` so that
    data-dependent sizes become unbacked symbols, listed as uncaptured, instead of errors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def run_step(model, step: Callable[[], Any], *, view: str = "eager", label: str = "", phase: str = "",
             device: str = "cuda:0", arch: str = "gfx950", mode=None,
             assumptions: Iterable[str] = (), progress: "bool | Progress" = False) -> Capture:
    """Record ``step()`` (one forward step of ``model``, which must already hold fake or real
    tensors) in ``view`` (:data:`VIEWS`), inside ``mode`` (a ``FakeTensorMode``; default a new
    :func:`fake_mode`). Identical calls are folded as they are recorded (:class:`_Recorder`), and
    calls the fake mode has answered before are answered without it (:class:`_FastFake`), so a
    loop over the sequence costs little per step. ``progress``: on a capture running past 5 s,
    one line on stderr at most every 5 s (:class:`Progress`; or pass your own). Raises
    :class:`CaptureError` naming the module where the step failed, :class:`UsageError` for an
    unknown view."""
    import torch

    if view not in VIEWS:
        raise bad_choice("capture view", view, VIEWS)
    check_target(arch)
    what = f"{label or type(model).__name__} ({view})"
    prog = progress if isinstance(progress, Progress) else (Progress(what, _layer_count(model)) if progress else None)
    rec = _Recorder(prog)
    handles = _hooks(model, rec)
    every = os.environ.get("FLYEXPLORE_CAPTURE_EVERY_LAYER", "").strip().lower() in ("1", "true", "yes", "on")
    reuse = _LayerReuse(model, rec) if REUSE_LAYERS and not every else None
    mode = mode or fake_mode()
    dispatch, function = _modes(rec, decompose=view == "compiled", fake=mode if FAST_FAKE else None)
    notes = list(assumptions)
    try:
        with target_device(arch, device) as patched, quiet_torch_logs(), real_run_branches(rec), mode, \
                torch.no_grad(), function, dispatch:
            step()
        if patched and patched not in notes:
            notes.append(patched)
    except CaptureError:
        raise
    except Exception as exc:  # the model's own code failed under capture: name where
        path, typ = rec.stack[-1] if len(rec.stack) > 1 else ("", type(model).__name__)
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CaptureError(f"capture of {label or type(model).__name__} failed in module "
                           f"{path or '(top)'} ({typ}): {type(exc).__name__}: {msg[:300]}") from None
    finally:
        for h in handles:
            h.remove()
        if reuse is not None:
            reuse.restore()
        if prog is not None:
            prog.close(rec.n)
    calls = rec.finish()
    if view == "compiled":
        fused = sum(c.count for c in calls if c.op == "aten.addmm.default" and "post-grad" in c.note)
        notes.append("compiled view: the calls after Inductor's decompositions "
                     "(torch._inductor.decomposition.select_decomp_table) and its post-grad mm + add -> addmm "
                     f"fusion ({fused} fused here); its other post-grad passes are not applied "
                     "(Inductor's pad_mm may still pad a GEMM)")
    notes += [a for a in rec.assumed if a not in notes]
    rn = reuse.note() if reuse is not None else None
    if rn:
        notes.append(rn)
    cap = Capture(label or type(model).__name__, phase, view, device, arch, calls, rec.uncaptured, notes)
    cap.layers = layer_kinds(cap)
    return cap


# -- identical layers recorded once ------------------------------------------------------------------

#: Attribute names under which a layer keeps its own index (transformers: ``layer_idx``).
INDEX_ATTRS = ("layer_idx", "layer_id", "layer_index", "layer_number", "idx", "index")


def _attr_sig(name: str, v, index: int):
    """What a layer's attribute says of its calls: plain values by value (the layer's own index,
    an int equal to it under one of :data:`INDEX_ATTRS`, as ``<index>``), lists of plain values
    by value, callables by name, anything else by type."""
    if isinstance(v, bool) or v is None or isinstance(v, (float, str)):
        return v
    if isinstance(v, int):
        return "<index>" if v == index and name in INDEX_ATTRS else v
    if isinstance(v, (list, tuple)) and all(isinstance(x, _PLAIN) for x in v):
        return tuple(v)
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    return type(v).__name__


def _module_sig(root, index: int) -> tuple:
    """A layer module as the calls it can make depend on it: for each submodule its relative
    name, class, public attributes (:func:`_attr_sig`) and its own parameters' and buffers'
    shapes, strides and dtypes."""
    out = []
    for name, sub in root.named_modules():
        attrs = tuple((a, _attr_sig(a, v, index)) for a, v in sorted(vars(sub).items())
                      if not a.startswith("_") and a != "training")
        params = tuple((n, tuple(p.shape), tuple(p.stride()), p.dtype)
                       for n, p in sub.named_parameters(recurse=False))
        bufs = tuple((n, tuple(b.shape), b.dtype) for n, b in sub.named_buffers(recurse=False) if b is not None)
        out.append((name, type(sub).__name__, attrs, params, bufs))
    return tuple(out)


class _LayerReuse:
    """Records each kind of decoder layer once (issue 34: capture time grows with the distinct
    calls, not with depth or, for a scan in reference code, with layers x sequence length).

    The elements of a model's top-level layer list (module paths ending in their first list
    index, ``model.layers.5``) are wrapped for the step. A layer whose module signature
    (:func:`_module_sig`: classes, attributes -- its own index (:data:`INDEX_ATTRS`) aside -- and parameter shapes of
    every submodule) and inputs (each tensor's shape, strides, dtype, device and
    :func:`offset_class`; other objects by value or type) equal those of a layer recorded before
    is not run: the earlier layer's rows are added again under this layer's path, with their
    counts, and its outputs are fresh fake tensors of the earlier outputs' shapes, strides and
    dtypes (made unrecorded). Per-layer differences that transformers decides at build time
    (sliding vs full attention, MoE vs dense MLP, layers without RoPE, linear attention) show in
    the signature; ``tests/insight/test_capture_speed.py`` holds captures with and without it
    equal. ``decode`` caches of reused layers are not updated (nothing of the step reads them
    again)."""

    def __init__(self, model, rec: "_Recorder"):
        self.rec, self.seen, self.sigs, self.undo = rec, {}, {}, []
        self.reused: list[tuple[int, int]] = []
        for path, m in model.named_modules():
            mt = _LAYER.search(path)
            if mt is None or mt.end() != len(path):
                continue
            k = int(mt.group(1))
            had = "forward" in vars(m)
            self.undo.append((m, had, vars(m).get("forward")))
            m.forward = self._wrap(path, k, m, m.forward)

    def restore(self) -> None:
        """Put every wrapped layer's ``forward`` back."""
        for m, had, fwd in self.undo:
            if had:
                m.forward = fwd
            else:
                del m.forward

    def _inputs_sig(self, args, kwargs) -> tuple | None:
        import torch
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        out = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                d = self.rec.desc(x)
                if d[1] is None:
                    return None   # symbolic or undescribable: record it
                out.append(d[1])
            elif isinstance(x, _PLAIN):
                out.append(x)
            else:
                out.append(type(x).__name__)
        return (str(spec), tuple(out))

    def _wrap(self, path: str, k: int, m, fwd):
        rec = self.rec

        def forward(*args, **kwargs):
            if rec.inner or rec.silent:
                return fwd(*args, **kwargs)
            ms = self.sigs.get(id(m))
            if ms is None:
                ms = self.sigs[id(m)] = _module_sig(m, k)
            ins = self._inputs_sig(args, kwargs)
            key = None if ins is None else (ms, ins)
            got = self.seen.get(key) if key is not None else None
            if got is not None:
                return self._reuse(got, path, k)
            start, ustart = len(rec.calls), len(rec.uncaptured)
            out = fwd(*args, **kwargs)
            if key is not None:
                self.seen[key] = {"path": path, "k": k, "start": start, "end": len(rec.calls),
                                  "ustart": ustart, "uend": len(rec.uncaptured), "out": out}
            return out
        return forward

    def _reuse(self, got: dict, path: str, k: int):
        import torch
        from torch.utils._pytree import tree_map

        rec = self.rec
        src = got["path"]

        def moved(p: str) -> str:
            return path + p[len(src):] if p == src or p.startswith(src + ".") else p

        n = 0
        for i in range(got["start"], got["end"]):
            c, cnt = rec.calls[i], rec.counts[i]
            if cnt < 1:
                continue
            rec.calls.append(replace(c, module=moved(c.module), layer=k if c.layer == got["k"] else c.layer))
            rec.counts.append(cnt)
            rec.rowkeys.append(None)
            rec.first_offsets.append(rec.first_offsets[i])
            rec.moved.append(rec.moved[i])
            n += cnt
        rec.uncaptured += [{**u, "module": moved(u["module"])} for u in rec.uncaptured[got["ustart"]:got["uend"]]]
        rec.n += n
        self.reused.append((k, got["k"]))

        def fresh(t):
            if not isinstance(t, torch.Tensor):
                return t
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)

        rec.silent = True
        try:
            return tree_map(fresh, got["out"])
        finally:
            rec.silent = False

    def note(self) -> str | None:
        """The assumption line saying which layers were counted from which (``None``: none)."""
        if not self.reused:
            return None
        by: dict[int, list[int]] = {}
        for k, src in self.reused:
            by.setdefault(src, []).append(k)
        parts = "; ".join(f"{'layers' if len(ks) > 1 else 'layer'} {_ranges(ks)} as layer {src}"
                          for src, ks in sorted(by.items()))
        return (f"identical layers recorded once: {parts} (same classes, attributes and parameter shapes, same "
                "input shapes and strides): their calls counted from the recorded layer "
                "(FLYEXPLORE_CAPTURE_EVERY_LAYER=1 records every layer)")


def _layer_count(model) -> int:
    """The number of list-indexed layers of ``model`` (first list index of its module paths)."""
    idx = set()
    for path, _ in model.named_modules():
        m = _LAYER.search(path)
        if m:
            idx.add(int(m.group(1)))
    return len(idx)


def layer_kinds(cap: Capture, layer_types: Sequence[str] | None = None) -> dict:
    """Which list-indexed layers made the same calls: ``{"count": n, "kinds": [{"layers": [...],
    "calls": k}, ...], "text": "..."}``, from each layer's sequence of kernel calls
    (:meth:`Call.key` and count; ``calls``: the kernel calls per layer, folded ones counted). One kind = every layer identical; a hybrid model (sliding and full
    attention, dense and MoE MLPs, linear attention) has several. Layers are taken from the
    first list index of each module path. ``layer_types``: the config's name per layer
    (``layer_types`` of a hybrid config: ``sliding_attention``, ``full_attention``,
    ``linear_attention``), added to each kind (``types``) and to the text."""
    seqs: dict[int, list] = {}
    for c in cap.kernel_calls():
        if c.layer is not None:
            seqs.setdefault(c.layer, []).append((c.key(), c.count))
    kinds: list[dict] = []
    for i in sorted(seqs):
        sig = tuple(seqs[i])
        for k in kinds:
            if k["sig"] == sig:
                k["layers"].append(i)
                break
        else:
            kinds.append({"sig": sig, "layers": [i], "calls": sum(n for _, n in sig)})
    for k in kinds:
        del k["sig"]
        if layer_types:
            k["types"] = sorted({str(layer_types[i]) for i in k["layers"] if i < len(layer_types)})
    n = len(seqs)
    if not n:
        text = "no list-indexed layers"
    elif len(kinds) == 1:
        text = f"{n} layers captured, all identical ({kinds[0]['calls']} kernel calls each)"
    else:
        text = (f"{n} layers captured, {len(kinds)} kinds: "
                + "; ".join(f"layers {_ranges(k['layers'])} ({len(k['layers'])} x {k['calls']} calls"
                            + (f", {'/'.join(k['types'])}" if k.get("types") else "") + ")"
                            for k in kinds))
    if layer_types and len(kinds) == 1 and len(set(layer_types)) > 1:
        text += (f" (the config's layer kinds {', '.join(sorted(set(map(str, layer_types))))} make the same calls "
                 "in this step)")
    return {"count": n, "kinds": kinds, "text": text}


def _ranges(xs: Sequence[int]) -> str:
    xs = sorted(xs)
    if len(xs) > 2 and all(b - a == xs[1] - xs[0] for a, b in zip(xs, xs[1:])):
        step = xs[1] - xs[0]
        return f"{xs[0]}-{xs[-1]}" + (f" every {step}" if step > 1 else "")
    return ",".join(map(str, xs))


# -- any nn.Module with example inputs -----------------------------------------------------------

def capture(model, inputs=None, *, view: str = "eager", phase: str = "", label: str = "",
            device: str | None = None, arch: str = "gfx950", kwargs: Mapping[str, Any] | None = None,
            assumptions: Iterable[str] = ()) -> Capture:
    """Capture one forward step of any ``nn.Module``: ``model(*inputs, **kwargs)``.

    ``inputs``: a tensor or a tuple of them (real, meta or fake); ``kwargs``: keyword inputs.
    The module's parameters and buffers are replaced by fake tensors on ``device`` for the step
    (``torch.func.functional_call``: the module itself is not changed, no memory is taken;
    default ``cuda:0``, where the FlyDSL routes are, whatever device the module is on; ``cpu``
    records what a CPU run dispatches); real inputs become fake the same way. ``view``: ``eager`` or ``compiled`` (module docstring); ``arch``: the target
    (gfx950). Returns a :class:`Capture`. Raises :class:`CaptureError` naming the module where the
    step failed, :class:`UsageError` for an unknown view or a non-module."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"capture needs a torch.nn.Module, got {type(model).__name__}")
    if view not in VIEWS:
        raise bad_choice("capture view", view, VIEWS)
    dev = str(device or "cuda:0")
    if dev == "cuda":
        dev = "cuda:0"
    mode = fake_mode()
    from torch._subclasses.fake_tensor import FakeTensor

    def fake(t):
        if isinstance(t, FakeTensor):
            return t
        with mode:
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=dev,
                                       requires_grad=False)

    state = {n: fake(t) for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    args = inputs if isinstance(inputs, tuple) else (() if inputs is None else (inputs,))
    args = tuple(fake(a) if isinstance(a, torch.Tensor) else a for a in args)
    kw = {k: fake(v) if isinstance(v, torch.Tensor) else v for k, v in (kwargs or {}).items()}

    def step():
        return torch.func.functional_call(model, state, args, kw)

    return run_step(model, step, view=view, label=label or type(model).__name__, phase=phase,
                    device=dev, arch=arch, mode=mode, assumptions=assumptions)
