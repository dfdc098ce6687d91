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
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.ops import get_op, model_families
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


def kept_names() -> frozenset:
    """The names kept-as-one calls are recorded under (not ATen calls: left out of
    :meth:`Capture.aten_counts`)."""
    out = {DECOMPOSED_RMSNORM, SDPA}
    for op in model_families().values():
        h = op.model
        if h.keep_function is not None:
            out.add(h.keep_function[1])
    return frozenset(out)

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
    call)."""

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
        """What makes two calls identical: op, arguments (shapes, dtypes, strides, offsets),
        scalars and the module path with list indices replaced by ``*``."""
        return (self.op, self.inputs, tuple(sorted((k, repr(v)) for k, v in self.scalars.items())),
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
        """The calls that run a kernel and are judged: not views, not inner."""
        return [c for c in self.calls if not c.inner and not c.is_view]

    def distinct(self) -> list[tuple[Call, int]]:
        """Identical :meth:`kernel_calls` folded: ``(first call, count)`` in first-seen order."""
        seen: dict[tuple, list] = {}
        for c in self.kernel_calls():
            k = c.key()
            if k in seen:
                seen[k][1] += 1
            else:
                seen[k] = [c, 1]
        return [(c, n) for c, n in seen.values()]

    def aten_counts(self) -> Counter:
        """``Counter`` of ``(op, input shapes)`` over every ATen call (inner ones included, kept-as-one
        calls left out): what a ``TorchDispatchMode`` on a real run of the same step sees."""
        kept = kept_names() | {c.op for c in self.calls if c.kept}
        return Counter((c.op, tuple(t.shape for t in c.inputs if t is not None))
                       for c in self.calls if c.op not in kept and c.op not in _FAKE_ONLY)


# -- FLOPs and bytes -----------------------------------------------------------------------------

def _nbytes(t: TensorDesc | None) -> float:
    if t is None:
        return 0.0
    isz = t.dtype.itemsize if hasattr(t.dtype, "itemsize") else 4
    return float(math.prod(t.shape)) * isz


def call_cost(c: "Call") -> tuple[float, float]:
    """FLOPs and bytes of one captured call. A family's calls are counted by the family
    (:attr:`flyexplore.ops.base.ModelHooks.cost`: a GEMM [M, K] x [K, N] is 2MNK, SDPA
    4 x B x H x Sq x Skv x D, halved when causal, ...); views cost nothing; anything else is one
    FLOP per output element and each tensor read or written once (a lower bound for an unfused
    eager op)."""
    if c.op in _VIEW_OPS:
        return 0.0, 0.0
    if c.family:
        try:
            hooks = get_op(c.family).model
        except UsageError:
            hooks = None
        if hooks is not None and hooks.cost is not None:
            return hooks.cost(c)
    ins = [t for t in c.inputs if t is not None]
    outs = [t for t in c.outputs if t is not None]
    io = sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs)
    return float(sum(math.prod(t.shape) for t in outs)), io


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


class _Recorder:
    """The shared state of one capture: the module stack, the calls, what could not be captured."""

    def __init__(self):
        self.stack: list[tuple[str, str]] = [("", "")]
        self.calls: list[Call] = []
        self.uncaptured: list[dict] = []
        self.inner = 0
        self.marks: list[int] = []
        self.host_answers: list[tuple] = []
        self.assumed: list[str] = []
        self.failed_at: tuple[str, str] | None = None
        self.family_of: dict[str, str] = family_of()
        self.mm_out = None      # compiled view: the output tensor of each aten.mm -> its call's index
        self.pending_bias = {}  # compiled view: a bias add's sum -> its mm, until a user decides
        self.add_index: dict[int, int] = {}   # id of such a sum -> the index of its add call

    @property
    def module(self) -> tuple[str, str]:
        return self.stack[-1]

    def add(self, op: str, named: Sequence[tuple[str, Any]], out, *, family=None, note="",
            flops_bytes=None, why_uncaptured: str | None = None, kept: bool = False) -> Call:
        """Record one call: ``named`` its arguments as ``(name, value)`` in schema order;
        ``kept``: a family's kept-as-one call."""
        import torch
        from torch.utils._pytree import tree_leaves

        path, typ = self.module
        ins, names, scal = [], [], {}
        fam = family if family is not None else self.family_of.get(op)
        keep_none = fam is not None
        for name, a in named:
            if isinstance(a, torch.Tensor):
                ins.append(_desc(a))
                names.append(name)
            elif isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
                for j, x in enumerate(a):
                    ins.append(_desc(x))
                    names.append(f"{name}[{j}]")
            elif a is None and keep_none:
                ins.append(None)
                names.append(name)
            else:
                scal[name] = a
        outs = tuple(_desc(o) for o in tree_leaves(out) if isinstance(o, torch.Tensor))
        sym = [x for x in tree_leaves(([v for _, v in named], out)) if _symbolic(x)]
        why = [why_uncaptured] if why_uncaptured else []
        if sym:
            why.append("shape depends on data (unbacked size from a data-dependent operator such as nonzero): "
                       "not judged")
        if why and not self.inner:
            self.uncaptured.append({"op": op, "module": path, "module_type": typ, "reason": "; ".join(why)})
        layer = _LAYER.search(path)
        c = Call(op, fam, tuple(ins), scal, outs, path, typ, int(layer.group(1)) if layer else None, 0.0, 0.0,
                 inner=self.inner > 0, note=note, names=tuple(names), kept=kept)
        if flops_bytes is None:
            flops_bytes = call_cost(c) if not sym else (math.nan, math.nan)
        c = replace(c, flops=flops_bytes[0], bytes=flops_bytes[1])
        self.calls.append(c)
        return c


def _bind(func, args, kwargs) -> list[tuple[str, Any]]:
    """``(name, value)`` of an ATen call's arguments in schema order (kwargs by their names)."""
    try:
        schema = func._schema.arguments
    except AttributeError:
        return [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    out = [(schema[i].name if i < len(schema) else f"arg{i}", a) for i, a in enumerate(args)]
    out += list(kwargs.items())
    return out


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
    """Put the fused ``aten.addmm(inp, m1, m2)`` where the ``mm`` was recorded (its module)."""
    mm_call = rec.calls[idx]
    c = rec.add("aten.addmm.default", [("self", inp), ("mat1", m1), ("mat2", m2)], out,
                note="mm + add fused into addmm by Inductor's post-grad pass "
                     "(torch/_inductor/fx_passes/post_grad.py::addmm)")
    rec.calls.pop()
    rec.calls[idx] = replace(c, module=mm_call.module, module_type=mm_call.module_type, layer=mm_call.layer)


def _use_of_pending(rec: _Recorder, func, args) -> None:
    """A call using the sum of a pending bias add (:func:`_fuse_addmm`): a user that is neither
    pointwise (``torch.Tag.pointwise``) nor a view makes Inductor fuse it after all: the ``mm``
    becomes ``addmm`` and the recorded add is dropped."""
    import torch

    if not rec.pending_bias:
        return
    pointwise = torch.Tag.pointwise in getattr(func, "tags", ()) or str(func) in _VIEW_OPS
    for a in args:
        if isinstance(a, torch.Tensor) and a in rec.pending_bias and not pointwise:
            idx, inp, m1, m2 = rec.pending_bias.pop(a)
            add_idx = rec.add_index.pop(id(a), None)
            _record_addmm(rec, idx, inp, m1, m2, a)
            if add_idx is not None:
                rec.calls[add_idx] = None


def _modes(rec: _Recorder, decompose: bool):
    """The dispatch mode (records every ATen call; in the compiled view decomposes as Inductor
    does and fuses ``mm + add`` into ``addmm``) and the function mode (keeps the families' kept
    functions, SDPA, one call)."""
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

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = str(func)
            if decompose and func in table and not rec.inner:
                mark, umark = len(rec.calls), len(rec.uncaptured)
                with self:
                    r = table[func](*args, **kwargs)
                if r is not NotImplemented:
                    return r
                # a decomposition that declined (NotImplemented) may have run casts first
                # (pw_cast_for_opmath): they are not part of what Inductor lowers
                del rec.calls[mark:]
                del rec.uncaptured[umark:]
            if func is torch.ops.aten._local_scalar_dense.default and rec.host_answers:
                answer, why = rec.host_answers[-1]
                if why not in rec.assumed:
                    rec.assumed.append(why)
                rec.add(name, _bind(func, args, kwargs), None, note=why)
                return answer
            out = func(*args, **kwargs)
            pending = None
            if rec.mm_out is not None and not rec.inner:
                _use_of_pending(rec, func, args)
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
                rec.add_index[id(out)] = len(rec.calls) - 1
            if func is mm and rec.mm_out is not None and not rec.inner and isinstance(out, torch.Tensor):
                rec.mm_out[out] = (len(rec.calls) - 1, args[0], args[1])
            return out

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            k = kept.get(func)
            if k is not None and not rec.inner:
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
                sc = scalars_of(args, kwargs)
                rec.add(cname, list(named), out, family=fam, kept=True)
                c = rec.calls[-1]
                c = replace(c, scalars=sc)
                rec.calls[-1] = replace(c, flops=call_cost(c)[0], bytes=call_cost(c)[1])
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
                if any(c.op in own for c in inner):  # it reached the family's own op: that is the call
                    rec.calls[start:] = [replace(c, inner=rec.inner > 0) for c in inner]
                else:
                    fl = sum(c.flops for c in inner if not c.is_view)
                    by = sum(c.bytes for c in inner if not c.is_view)
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
             assumptions: Iterable[str] = ()) -> Capture:
    """Record ``step()`` (one forward step of ``model``, which must already hold fake or real
    tensors) in ``view`` (:data:`VIEWS`), inside ``mode`` (a ``FakeTensorMode``; default a new
    :func:`fake_mode`). Raises :class:`CaptureError` naming the module where the step failed,
    :class:`UsageError` for an unknown view."""
    import torch

    if view not in VIEWS:
        raise bad_choice("capture view", view, VIEWS)
    check_target(arch)
    rec = _Recorder()
    handles = _hooks(model, rec)
    dispatch, function = _modes(rec, decompose=view == "compiled")
    mode = mode or fake_mode()
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
    if view == "compiled":
        fused = sum(1 for c in rec.calls if c is not None and c.op == "aten.addmm.default" and "post-grad" in c.note)
        notes.append("compiled view: the calls after Inductor's decompositions "
                     "(torch._inductor.decomposition.select_decomp_table) and its post-grad mm + add -> addmm "
                     f"fusion ({fused} fused here); its other post-grad passes are not applied "
                     "(Inductor's pad_mm may still pad a GEMM)")
    notes += [a for a in rec.assumed if a not in notes]
    calls = [c for c in rec.calls if c is not None]   # adds fused late leave a gap
    cap = Capture(label or type(model).__name__, phase, view, device, arch, calls, rec.uncaptured, notes)
    cap.layers = layer_kinds(cap)
    return cap


def layer_kinds(cap: Capture, layer_types: Sequence[str] | None = None) -> dict:
    """Which list-indexed layers made the same calls: ``{"count": n, "kinds": [{"layers": [...],
    "calls": k}, ...], "text": "..."}``, from each layer's sequence of (op, argument descs,
    scalars, module pattern). One kind = every layer identical; a hybrid model (sliding and full
    attention, dense and MoE MLPs, linear attention) has several. Layers are taken from the
    first list index of each module path. ``layer_types``: the config's name per layer
    (``layer_types`` of a hybrid config: ``sliding_attention``, ``full_attention``,
    ``linear_attention``), added to each kind (``types``) and to the text."""
    seqs: dict[int, list] = {}
    for c in cap.kernel_calls():
        if c.layer is not None:
            seqs.setdefault(c.layer, []).append(c.key())
    kinds: list[dict] = []
    for i in sorted(seqs):
        sig = tuple(seqs[i])
        for k in kinds:
            if k["sig"] == sig:
                k["layers"].append(i)
                break
        else:
            kinds.append({"sig": sig, "layers": [i], "calls": len(sig)})
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
