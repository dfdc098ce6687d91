"""The fake-tensor mode a capture runs in, and answers to its repeated calls made without it.

:func:`fake_mode` makes the ``FakeTensorMode`` (with a ``ShapeEnv``: data-dependent sizes become
unbacked symbols); :class:`_FastFake` answers the calls that mode has answered before (a loop
over a sequence repeats the same few calls thousands of times) without going through it.
"""
from __future__ import annotations

from typing import Any

from flyexplore.insight.calls import _VIEW_OPS


def fake_mode():
    """A ``FakeTensorMode`` for capturing (real tensors allowed as inputs; a ``ShapeEnv`` so that
    data-dependent sizes become unbacked symbols, listed as uncaptured, instead of errors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


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
