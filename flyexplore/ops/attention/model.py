"""Attention in a captured model step: ``F.scaled_dot_product_attention`` kept as one call.

The eager view decides it: on ROCm, SDPA's flash and efficient backends are AOTriton, whose
tuning table picks the backend (FlyDSL in AOTriton 0.14.2b); away from the GPU the verdict is at
best ``unverified``. The capture keeps SDPA as one call (its math decomposition is not what a
GPU runs; the inner ATen calls are recorded, marked inner, and not judged) and gives its output
the layout a fused kernel gives it: the query's dimension order, as torch 2.15's meta functions
of the flash and efficient kernels allocate it (``torch/_meta_registrations.py::
alloc_with_matching_layout``, and ``meta__scaled_dot_product_efficient_attention``'s [B, M, H, K]
transposed). The math fallback returns a contiguous [B, H, S, D] instead, which made a phantom
``aten.clone`` appear after every attention on a GPU device (``transpose(1, 2).contiguous()``
copies it; after a fused kernel it is a view).
"""
from __future__ import annotations

from flyexplore.ops.base import ModelCall, ModelHooks, io_bytes

#: The name an SDPA call is recorded under.
SDPA = "F.scaled_dot_product_attention"


def shape_text(c) -> str:
    """The attention catalogue's shape text of a captured SDPA call,
    ``BxHxSQxSKVxD[:hkv=N,causal=1]`` (leading dims folded into B)."""
    q, k = c.inputs[0], c.inputs[1]
    b = 1
    for s in q.shape[:-3]:
        b *= s
    h, sq, d = q.shape[-3], q.shape[-2], q.shape[-1]
    hkv, skv = k.shape[-3], k.shape[-2]
    opts = []
    if hkv != h:
        opts.append(f"hkv={hkv}")
    if c.scalars.get("is_causal"):
        opts.append("causal=1")
    return f"{b}x{h}x{sq}x{skv}x{d}" + (":" + ",".join(opts) if opts else "")


def judge(c, view: str):
    """:attr:`ModelHooks.judge`: the attention explainer's front door on :func:`shape_text`."""
    dt = c.dtype
    notes = ()
    if c.scalars.get("attn_mask") is not None:
        notes = (f"called with an explicit attn_mask {c.scalars['attn_mask']}: the rules above judge the shapes; "
                 "a mask can change SDPA's backend choice on the device",)
    return ModelCall(args={"shape": shape_text(c), "dtype": dt if dt in ("bf16", "fp16", "fp32") else "bf16"},
                     notes=notes)


def cost(c):
    """q [B, H, Sq, D], k [B, Hkv, Skv, D]: 4 x B x H x Sq x Skv x D FLOPs (causal with
    Sq == Skv: half); bytes q + k + v + out."""
    q, k = c.inputs[0], c.inputs[1]
    b = 1
    for s in q.shape[:-3]:
        b *= s
    h, sq, d = q.shape[-3], q.shape[-2], q.shape[-1]
    f = 4.0 * b * h * sq * k.shape[-2] * d
    if c.scalars.get("is_causal") and sq == k.shape[-2]:
        f /= 2
    return f, io_bytes(c)


def case(c, split=None):
    """:func:`shape_text`."""
    return shape_text(c), ""


def _args(args, kwargs):
    names = ("query", "key", "value")
    got = list(args[:3]) + [kwargs.get(n) for n in names[len(args[:3]):]]
    return tuple(zip(names, got))


def _scalars(args, kwargs):
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    return {"is_causal": bool(kwargs.get("is_causal", args[5] if len(args) > 5 else False)),
            "attn_mask": None if mask is None else list(getattr(mask, "shape", ())),
            "enable_gqa": bool(kwargs.get("enable_gqa", False)), "scale": kwargs.get("scale")}


def output_layout(inputs, out):
    """The strides of a fused kernel's output for ``out``'s shape: the query's dimension order
    (module docstring); ``None`` when the query is missing or of another rank."""
    q = inputs[0] if inputs else None
    if q is None or q.ndim != len(out.shape):
        return None
    order = sorted(range(q.ndim), key=lambda i: q.stride[i] if q.stride[i] else float("inf"))
    strides = [0] * q.ndim
    step = 1
    for i in order:
        strides[i] = step
        step *= out.shape[i]
    return tuple(strides)


def _sdpa():
    import torch

    return torch.nn.functional.scaled_dot_product_attention


MODEL = ModelHooks(aten_ops=(SDPA,), view="eager", judge=judge, cost=cost, case=case, dims=None, matrix=True,
                   keep_function=(_sdpa, SDPA, _args, _scalars), output_layout=output_layout)
