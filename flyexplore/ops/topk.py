"""TopK: ``torch.topk(x, k, dim=-1, largest, sorted)`` over rows of a [M, N] tensor.

Shape ``MxNxK``; options ``largest`` and ``sorted`` (default on, as torch 2.15's FlyDSL
override requires) and ``deterministic`` (``torch.use_deterministic_algorithms`` during the
run; the published MI355X table has both). Bytes M*N*b + M*K*(b + 8) (values and int64
indices); FLOPs are not counted (0).

Backends: ``aten`` (eager, FlyDSL overrides off), ``inductor`` (``torch.compile`` default),
``flydsl`` (eager with overrides on; fp32, gfx950; register kernel for K in {2,4,8,16},
radix kernels for K bands 64-1024 -- ``torch/_native/ops/topk/flydsl_impl.py``).
"""
from __future__ import annotations

import contextlib
import csv

from ..paths import published_dir
from .base import DTYPE_BYTES, Operator, compile_context, flydsl_eager, torch_dtype

TOPK = Operator(
    name="topk",
    doc="torch.topk over the last dim; shape MxNxK (rows, row width, k), options largest=, sorted=, deterministic=",
    dims=("m", "n", "k"),
    options={"largest": True, "sorted": True, "deterministic": False},
    dtypes=("fp32", "bf16", "fp16"),
)


def _validate(p):
    if p["k"] > p["n"]:
        from ..errors import UsageError
        raise UsageError(f"topk k={p['k']} is larger than the row width n={p['n']}")


def _inputs(case, dtype, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(case["m"], case["n"], generator=g, device=device, dtype=torch_dtype(dtype))}


def _reference(case, dtype, inputs):
    import torch

    x = inputs["x"].to(torch.float64)
    return torch.topk(x, case["k"], dim=-1, largest=case["largest"], sorted=True).values


def _error(out, ref, case, dtype):
    """Values only (indices may differ between equal values): sorted, then compared exactly
    to the float64 reference; ``err_rel`` is max |diff| / max |ref|."""
    import torch

    vals = out[0] if isinstance(out, tuple) else out.values
    vals = torch.sort(vals.to(torch.float64), dim=-1, descending=case["largest"]).values
    diff = (vals - ref).abs()
    scale = float(ref.abs().max()) or 1.0
    return {"err_rel": float(diff.max()) / scale, "err_max_abs": float(diff.max()), "err_tol": 0.0}


def _topk(x, k, largest, sorted_):
    import torch
    return torch.topk(x, k, dim=-1, largest=largest, sorted=sorted_)


TOPK.validate = _validate
TOPK.make_inputs = _inputs
TOPK.reference = _reference
TOPK.error = _error
TOPK.flops = lambda case: 0.0
TOPK.bytes = lambda case, dtype: float(case["m"] * case["n"] * DTYPE_BYTES[dtype]
                                       + case["m"] * case["k"] * (DTYPE_BYTES[dtype] + 8))


@contextlib.contextmanager
def deterministic(on: bool):
    """``torch.use_deterministic_algorithms(on)`` for the block, restoring the previous state."""
    import torch

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


@contextlib.contextmanager
def _ctx(flydsl_on: bool, case):
    with flydsl_eager(flydsl_on, ("topk",)), deterministic(case["deterministic"]):
        yield


def _flydsl_available(ctx, case, dtype):
    r = ctx.env.flydsl_eager
    if not r.ready:
        return "; ".join(c.detail for c in r.failed)
    return None


def _args(case, inputs):
    return inputs["x"], case["k"], case["largest"], case["sorted"]


@TOPK.backend("aten", "eager torch.topk with FlyDSL overrides off", baseline=True,
              context=lambda ctx, case: _ctx(False, case))
def _aten(case, dtype, inputs, ctx):
    args = _args(case, inputs)
    return lambda: _topk(*args)


@contextlib.contextmanager
def _compile_ctx(ctx, case):
    with compile_context(ctx, case), deterministic(case["deterministic"]):
        yield


@TOPK.backend("inductor", "torch.compile default", context=_compile_ctx)
def _inductor(case, dtype, inputs, ctx):
    import torch

    f = torch.compile(_topk, dynamic=False)
    args = _args(case, inputs)
    return lambda: f(*args)


@TOPK.backend("flydsl", "eager torch.topk with FlyDSL overrides on (gfx950, fp32)",
              available=_flydsl_available, context=lambda ctx, case: _ctx(True, case))
def _flydsl(case, dtype, inputs, ctx):
    args = _args(case, inputs)
    return lambda: _topk(*args)


def _published():
    with open(published_dir() / "topk.csv") as f:
        return [f"{r['m']}x{r['n']}x{r['k']}" for r in csv.DictReader(f)]


TOPK.add_suite("published", _published(), ["fp32"],
               "the 33 TopK cases published for MI355X (10 register-kernel, 23 radix-kernel)",
               "pytorch/pytorch PR 193548 (data/published/topk.csv)")
TOPK.add_suite("llm", ["1x128256x50", "64x128256x50", "256x128256x50", "4096x256x8", "16384x256x8"],
               ["fp32"], "sampling top-50 over the Llama-3 vocabulary (128256) and MoE routing "
               "top-8 of 256 experts (DeepSeek-V3) at 4096/16384 tokens",
               "Llama-3.1 vocab_size 128256; DeepSeek-V3 n_routed_experts 256, num_experts_per_tok 8")
TOPK.add_suite("cpu-small", ["256x1024x8", "1024x4096x16", "64x32768x64"], ["fp32"],
               "small TopK cases for a 2-core CPU", "flyexplore")
