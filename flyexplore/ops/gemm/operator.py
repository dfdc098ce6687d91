"""Dense GEMM: ``out[M, N] = A[M, K] @ B[K, N]`` through ``torch.mm``.

Layout is two letters for A and B: ``N`` = stored as used (row-major), ``T`` = stored
transposed. ``NT`` is ``A @ B.T`` with B stored [N, K] (``nn.Linear``; the published MI355X
suite). FLOPs 2*M*N*K; bytes (M*K + K*N + M*N) * element size.

Check (:func:`error`): every output element against the float64 (CPU) / float32 (GPU) product
within the GEMM rounding bound of :func:`flyexplore.ops.checks.gemm_bound`
(``2(u_out|ref| + gamma_K(u_acc)|A||B| + ...)``, Higham 2002 eq. 3.13), so one wrong element,
row or 32x32 tile fails the row; the worst row and tile are reported beside the global error.

Backends: ``aten`` (eager ``torch.mm``: cuBLAS/hipBLASLt/CPU BLAS), ``triton``
(``torch.compile`` max-autotune restricted to Triton templates; GPU only), ``inductor``
(``torch.compile`` default), ``flydsl`` (``torch.compile`` max-autotune with
``max_autotune_gemm_backends="FLYDSL"``; ROCm torch >= 2.15 on gfx950, fp16/bf16; the FlyDSL
gate is ``torch._inductor.utils.use_flydsl_gemm_template``).
"""
from __future__ import annotations

import csv

from flyexplore.ops import checks
from flyexplore.ops.base import (DTYPE_BYTES, ERR_TOL, Operator, PublishedSuite, TensorSize, compile_context,
                                 exported_shapes, torch_dtype)
from flyexplore.ops.gemm.flydsl import FLYDSL as GEMM_FLYDSL
from flyexplore.ops.gemm.model import MODEL as GEMM_MODEL
from flyexplore.paths import published_dir

GEMM = Operator(
    name="gemm",
    doc="dense GEMM out = A @ B (torch.mm); shape MxNxK, option layout NN/NT/TN/TT",
    dims=("m", "n", "k"),
    options={"layout": "NT"},
    choices={"layout": ("NN", "NT", "TN", "TT")},
    dtypes=("bf16", "fp16", "fp32"),
    flydsl=GEMM_FLYDSL,
    model=GEMM_MODEL,
)


def _inputs(case, dtype, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    m, n, k, lay = case["m"], case["n"], case["k"], case["layout"]
    dt = torch_dtype(dtype)
    a = (torch.randn(m, k, generator=g, device=device, dtype=dt) if lay[0] == "N"
         else torch.randn(k, m, generator=g, device=device, dtype=dt).t())
    b = (torch.randn(k, n, generator=g, device=device, dtype=dt) if lay[1] == "N"
         else torch.randn(n, k, generator=g, device=device, dtype=dt).t())
    return {"a": a, "b": b}


def _reference(case, dtype, inputs):
    """A @ B in float64 (CPU) / float32 (GPU); ``|A| @ |B|`` is attached as ``.abs_product``
    (the scale of each element's rounding bound)."""
    import torch

    a, b = inputs["a"], inputs["b"]
    hi = torch.float64 if a.device.type == "cpu" else torch.float32
    ref = a.to(hi) @ b.to(hi)
    ref.abs_product = a.to(hi).abs() @ b.to(hi).abs()
    return ref


def error(out, ref, case, dtype):
    """Error columns and ``accuracy_ok`` for a GEMM output [M, N]: every element within
    :func:`flyexplore.ops.checks.gemm_bound` (K = case K) of ``ref`` and NaN/Inf only where
    ``ref`` has them, and ``err_rel <= err_tol``; ``err_row_max_rel`` is the worst output row,
    ``err_block_max_rel`` the worst 32x32 output tile."""

    bound, rule = checks.gemm_bound(ref, ref.abs_product, case["k"], out.dtype, torch_dtype(dtype))
    cols = checks.bounded(out, ref, bound, tile=32, rule=rule)
    return checks.with_tol(cols, ERR_TOL[dtype])


def _tensors(case, dtype):
    """What :func:`_inputs` allocates and one call returns: A as stored ([M, K], or [K, M] for a
    transposed A), B as stored ([K, N], or [N, K]), the output [M, N]; all in ``dtype``."""
    m, n, k, lay = case["m"], case["n"], case["k"], case["layout"]
    b = int(DTYPE_BYTES[dtype])
    return (TensorSize("a", "input", (m, k) if lay[0] == "N" else (k, m), b),
            TensorSize("b", "input", (k, n) if lay[1] == "N" else (n, k), b),
            TensorSize("out", "output", (m, n), b))


GEMM.make_inputs = _inputs
GEMM.tensors = _tensors
GEMM.reference = _reference
GEMM.error = error
GEMM.flops = lambda case: 2.0 * case["m"] * case["n"] * case["k"]
GEMM.bytes = lambda case, dtype: float(
    (case["m"] * case["k"] + case["k"] * case["n"] + case["m"] * case["n"]) * DTYPE_BYTES[dtype])


def _mm(a, b):
    import torch
    return torch.mm(a, b)


def _needs_gpu(ctx, case, dtype):
    if not ctx.gpu:
        return "Triton GEMM templates need a CUDA or ROCm GPU (Inductor emits C++ on CPU)"
    return None


def _flydsl_available(ctx, case, dtype):
    r = ctx.env.flydsl_compile
    if not r.ready:
        return "; ".join(c.detail for c in r.failed)
    if dtype not in ("fp16", "bf16"):
        return f"FlyDSL GEMM templates take fp16/bf16 only, not {dtype}"
    return None


@GEMM.backend("aten", "eager torch.mm (cuBLAS / hipBLASLt / CPU BLAS)", baseline=True)
def _aten(case, dtype, inputs, ctx):
    a, b = inputs["a"], inputs["b"]
    return lambda: _mm(a, b)


def compiled(fn, options):
    """``torch.compile(fn, dynamic=False, options=options)``; each case compiles anew."""
    import torch
    return torch.compile(fn, dynamic=False, options=options)


TRITON_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON",
                  "triton.cudagraphs": False}
FLYDSL_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "FLYDSL",
                  "triton.cudagraphs": False}


@GEMM.backend("triton", "torch.compile max-autotune, Triton GEMM templates only",
              available=_needs_gpu, context=compile_context)
def _triton(case, dtype, inputs, ctx):
    f = compiled(_mm, TRITON_OPTIONS)
    a, b = inputs["a"], inputs["b"]
    return lambda: f(a, b)


@GEMM.backend("inductor", "torch.compile default (Inductor picks ATen or its own kernel)",
              context=compile_context)
def _inductor(case, dtype, inputs, ctx):
    f = compiled(_mm, {})
    a, b = inputs["a"], inputs["b"]
    return lambda: f(a, b)


@GEMM.backend("flydsl", "torch.compile max-autotune with max_autotune_gemm_backends=FLYDSL",
              available=_flydsl_available, context=compile_context)
def _flydsl(case, dtype, inputs, ctx):
    f = compiled(_mm, FLYDSL_OPTIONS)
    a, b = inputs["a"], inputs["b"]
    return lambda: f(a, b)


def _published_shapes():
    with open(published_dir() / "dense_gemm_bf16.csv") as f:
        return [f"{r['m']}x{r['n']}x{r['k']}:NT" for r in csv.DictReader(f)]


GEMM.add_suite("published-bf16", _published_shapes(), ["bf16"],
               "the 15 dense BF16 shapes published for MI355X (NT layout)",
               "pytorch/pytorch PR 190903 benchmark comment (data/published/dense_gemm_bf16.csv)")

# Llama-3.1-8B projections (hidden 4096, 32 q heads + 8 kv heads of 128 -> qkv 6144,
# intermediate 14336 -> gate_up 28672), at a decode batch (M=16) and a prefill chunk (M=2048).
_LLAMA8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
GEMM.add_suite("llama3.1-8b", [f"{m}x{n}x{k}:NT" for m in (16, 2048) for n, k in _LLAMA8B],
               ["bf16"], "Llama-3.1-8B linear layers as vLLM fuses them (qkv N=6144, o, gate_up N=28672, "
               "down), NT, at M=16 and M=2048; Hugging Face transformers calls q/k/v and gate/up unfused: "
               "see hf-llama-3.1-8b",
               "Llama-3.1-8B config (hidden 4096, intermediate 14336, 32 heads, 8 KV heads) with vLLM's fused "
               "QKVParallelLinear / MergedColumnParallelLinear widths")
GEMM.add_suite("hf-llama-3.1-8b", exported_shapes("llama-3.1-8b", "gemm"), ["bf16"],
               "Llama-3.1-8B's GEMMs as Hugging Face transformers 5.23 calls them under torch.compile "
               "(unfused q/k/v, gate/up; lm_head on the last position), prefill 1x2048 and decode 32 at "
               "2048 context",
               "captured by flyexplore model (data/models/shapes/llama-3.1-8b.csv)")
GEMM.add_suite("cpu-small", ["128x128x128", "256x256x256", "384x256x512"], ["fp32"],
               "small NT GEMMs that finish in seconds on a 2-core CPU", "flyexplore")


def _published_rows(suite, P) -> list[dict]:
    """Result rows of the published table ``suite`` (:class:`~flyexplore.ops.base.PublishedSuite`),
    made with the row builders ``P`` that the results layer hands over
    (:mod:`flyexplore.results.published`: ``read_table``, ``published_row``, ``throughput_rows``)."""

    op = GEMM
    rows = []
    for r in P.read_table(suite):
        case = op.case(f"{r['m']}x{r['n']}x{r['k']}:NT")
        rows += P.throughput_rows(suite, "gemm", case, "bf16", r, ("aten", "triton", "flydsl"),
                                 op.flops(case), op.bytes(case, "bf16"), "2*M*N*K")
    return rows


GEMM.published = (PublishedSuite(
    "dense", "dense_gemm_bf16.csv", "gemm",
    "pytorch/pytorch PR 190903, benchmark comment",
    "BF16, NT layout (A @ B.T), MI355 gfx950, graph replay, median of four "
    "accuracy-checked runs; FlyDSL and Triton with EXHAUSTIVE search, ATen default",
    "graph",
    load=_published_rows),)
