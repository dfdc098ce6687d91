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
  GEMM). This is where the GEMM templates (``aten.mm``, ``aten._grouped_mm``) are decided. The
  model's code runs as Dynamo traces it: ``torch.compiler.is_compiling()`` answers True while the
  compiled view is captured (:func:`~flyexplore.insight.step_env.compiling`), so code that branches
  on it -- transformers' masking (``masking_utils``) and SDPA integration -- takes the branch a
  ``torch.compile`` run takes (held to a real Dynamo trace in
  ``tests/insight/test_model_capture_more.py``).

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

Parts live in their own modules, re-exported here: the recorded calls and their cost
(:mod:`~flyexplore.insight.calls`), the fake-tensor mode (:mod:`~flyexplore.insight.fakemode`),
the addmm fusion (:mod:`~flyexplore.insight.fusion`), identical layers recorded once
(:mod:`~flyexplore.insight.layer_reuse`), and what model code is told while capturing
(:mod:`~flyexplore.insight.step_env`).
"""
from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from flyexplore.errors import UsageError, bad_choice
from flyexplore.insight.calls import (  # noqa: F401  (re-exported: the capture's public names)
    _FAKE_ONLY, _GATHERS, _LAYER, _MOVED, _PLAIN, _VIEW_OPS, DECOMPOSED_RMSNORM, OFFSETS_NOTE, SDPA, VIEWS, Call,
    Capture, _desc, _offsets_noted, _symbolic, call_cost, cost, desc_class, family_of, module_pattern, offset_class,
    views_of)
from flyexplore.insight.expert_routing import ExpertLoop
from flyexplore.insight.fakemode import _PURE_VIEWS, _FastFake, fake_mode  # noqa: F401
from flyexplore.insight.fusion import _ADDS, _follow_noop_cast, _fuse_addmm, _use_of_pending  # noqa: F401
from flyexplore.insight.layer_reuse import (  # noqa: F401
    INDEX_ATTRS, _LayerReuse, _layer_count, _module_sig, _ranges, layer_kinds)
from flyexplore.insight.step_env import (  # noqa: F401
    ARCH_CAPABILITY, HOST_READ_ANSWERS, QUIET_LOGGERS, check_target, compiling, quiet_torch_logs, real_run_branches,
    target_device)
from flyexplore.ops import model_families


class CaptureError(UsageError):
    """The forward step could not be captured; the message names the module where it failed."""


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
        self.mark_fusion = False  # eager view: mark the mm calls a compiled run fuses, fuse nothing
        self.experts = None       # an ExpertLoop answering data-dependent expert loops, or None

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
            flops_bytes=None, why_uncaptured: str | None = None, kept: bool = False, fused: str = "") -> Call:
        """Record one call: ``named`` its arguments as ``(name, value)`` in schema order;
        ``kept``: a family's kept-as-one call; ``fused``: :attr:`Call.fused`. Returns the call (the earlier identical one when
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
                 inner=self.inner > 0, note=note, names=tuple(names), kept=kept, fused=fused)
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


def _modes(rec: _Recorder, decompose: bool, fake=None):
    """The dispatch mode (records every ATen call; in the compiled view decomposes as Inductor
    does and fuses ``mm + add`` into ``addmm``) and the function mode (keeps the families' kept
    functions, SDPA, one call). ``fake``: the ``FakeTensorMode`` the step runs in, whose repeated
    calls :class:`_FastFake` answers (``None``: every call goes to it)."""
    import torch
    from torch._ops import HigherOrderOperator
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.weak import WeakIdKeyDictionary

    table = {}
    if decompose:
        from torch._inductor.decomposition import select_decomp_table

        table = select_decomp_table()
    # both views follow mm outputs into adds: the compiled view fuses them into addmm, the eager
    # view marks the mm calls a compiled run would fuse (flyexplore.insight.fusion)
    rec.mm_out = WeakIdKeyDictionary()
    rec.pending_bias = WeakIdKeyDictionary()
    rec.mark_fusion = not decompose
    kept = _kept_functions()
    mm = torch.ops.aten.mm.default
    nonzero, scalar = torch.ops.aten.nonzero.default, torch.ops.aten._local_scalar_dense.default
    fast = _FastFake(fake) if fake is not None else None
    run = fast.call if fast is not None else (lambda f, a, k: f(*a, **k))
    names: dict = {}
    # decompositions that declined (NotImplemented) for a call's layout (:meth:`_FastFake.key`):
    # not tried again for the same layout (Inductor's bmm, under pw_cast_for_opmath, declines
    # on a GPU after casting its inputs: a scan's every step paid for it)
    declined: set = set()

    class Dispatch(TorchDispatchMode):
        # a higher-order operator (associative_scan, which transformers' Mamba calls under compile)
        # is recorded as one call: Inductor lowers it as one kernel
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if rec.silent:
                return run(func, args, kwargs)
            if isinstance(func, HigherOrderOperator):
                out = func(*args, **kwargs)
                if not rec.inner:
                    named = [(f"arg{i}", getattr(a, "__qualname__", type(a).__name__) if callable(a) else a)
                             for i, a in enumerate(args)] + list(kwargs.items())
                    rec.add(f"higher_order.{func.name()}", named, out,
                            note="a higher-order operator: Inductor lowers it as one kernel; its body is not recorded")
                return out
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
            if rec.experts is not None and (func is nonzero or func is scalar) and not rec.inner:
                got = rec.experts.answer(func, args)
                if got is not None:
                    rec.add(name, _bind(func, args, kwargs), got if func is nonzero else None,
                            note=f"answered under the MoE routing assumption ({rec.experts.routing})")
                    return got
            if func is scalar and rec.host_answers:
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
                if pending == "fused" and not rec.mark_fusion:
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
            if rec.experts is not None and type(m).__name__.endswith("Experts"):
                rec.experts.enter(m, args)
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
            if rec.experts is not None and type(m).__name__.endswith("Experts"):
                rec.experts.leave()
            rec.stack.pop()
            return None
        return f

    for path, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(pre(path, mod)))
        handles.append(mod.register_forward_hook(post(path, mod)))
    return handles


def run_step(model, step: Callable[[], Any], *, view: str = "eager", label: str = "", phase: str = "",
             device: str = "cuda:0", arch: str = "gfx950", mode=None,
             assumptions: Iterable[str] = (), progress: "bool | Progress" = False,
             routing: str | None = None) -> Capture:
    """Record ``step()`` (one forward step of ``model``, which must already hold fake or real
    tensors) in ``view`` (:data:`VIEWS`), inside ``mode`` (a ``FakeTensorMode``; default a new
    :func:`fake_mode`). Identical calls are folded as they are recorded (:class:`_Recorder`), and
    calls the fake mode has answered before are answered without it (:class:`_FastFake`), so a
    loop over the sequence costs little per step. ``progress``: on a capture running past 5 s,
    one line on stderr at most every 5 s (:class:`Progress`; or pass your own). Raises
    :class:`CaptureError` naming the module where the step failed, :class:`UsageError` for an
    unknown view. ``routing``: a MoE routing assumption
    (:data:`~flyexplore.insight.expert_routing.ROUTINGS`) under which experts modules that loop
    over the experts their router hit are answered (:class:`~flyexplore.insight.expert_routing.
    ExpertLoop`; ``None``: such a loop is not answered, and its data-dependent sizes stop the step)."""
    import torch

    if view not in VIEWS:
        raise bad_choice("capture view", view, VIEWS)
    check_target(arch)
    what = f"{label or type(model).__name__} ({view})"
    prog = progress if isinstance(progress, Progress) else (Progress(what, _layer_count(model)) if progress else None)
    rec = _Recorder(prog)
    rec.experts = ExpertLoop(routing) if routing is not None else None
    handles = _hooks(model, rec)
    every = os.environ.get("FLYEXPLORE_CAPTURE_EVERY_LAYER", "").strip().lower() in ("1", "true", "yes", "on")
    reuse = _LayerReuse(model, rec) if REUSE_LAYERS and not every else None
    mode = mode or fake_mode()
    dispatch, function = _modes(rec, decompose=view == "compiled", fake=mode if FAST_FAKE else None)
    notes = list(assumptions)
    try:
        with target_device(arch, device) as patched, quiet_torch_logs(), real_run_branches(rec), \
                compiling(view == "compiled"), mode, torch.no_grad(), function, dispatch:
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
        notes.append("compiled view: the model's code ran as Dynamo traces it (torch.compiler.is_compiling() "
                     "answered True while capturing): where it branches on compiling, the compiled branch is "
                     "captured")
    notes += [a for a in rec.assumed if a not in notes]
    en = rec.experts.note() if rec.experts is not None else None
    if en and en not in notes:
        notes.append(en)
    rn = reuse.note() if reuse is not None else None
    if rn:
        notes.append(rn)
    cap = Capture(label or type(model).__name__, phase, view, device, arch, calls, rec.uncaptured, notes)
    cap.layers = layer_kinds(cap)
    return cap


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
