"""RMSNorm: ``y = x / sqrt(mean(x**2, -1) + eps) * weight`` over the last dim, through
``torch.nn.functional.rms_norm`` (which reaches ``aten::_fused_rms_norm``, the op torch 2.15's
FlyDSL override replaces on gfx950).

Shape ``MxN`` (M rows of N); options ``eps`` (default 1e-6; ``eps=None`` is torch's default:
the machine epsilon of the computation type, ``torch.finfo(torch.float32).eps`` for fp16, bf16
and fp32 inputs -- ``torch.nn.RMSNorm``'s documentation, torch 2.15) and ``weight`` (default on).
FLOPs about 4*M*N (square, sum, scale, weight: about 4 an element); bytes 2*M*N*b_x + N*b_w (x
read once, y written once, the weight read once).

Backends: ``aten`` (eager, FlyDSL overrides off), ``inductor`` (``torch.compile`` default; Triton
on GPU, C++ on CPU), ``flydsl`` (eager with FlyDSL overrides on; needs ROCm torch >= 2.15,
flydsl 0.3.x and gfx950; whether a given shape is taken is the explainer's job).

Check (:func:`error`): every element within
``2((2 u_out + gamma_{N+8}(u_acc) + gamma_{N+8}(u_ref)) |ref| + tiny(out))``: the sum of N
squares (non-negative terms: relative error gamma_N, Higham 2002 eq. 3.5), the mean, eps,
rsqrt, two products in the fp32 computation type, and up to two roundings to the output dtype
(``x * rstd`` rounded before the weight is applied, as some implementations do). NaN/Inf must
match the reference's (``eps=0`` and an all-zero row give NaN in both). The worst row is
reported as ``err_row_max_rel``.
"""
from __future__ import annotations

import csv

from flyexplore.errors import UsageError
from flyexplore.ops import checks
from flyexplore.ops.base import DTYPE_BYTES, ERR_TOL, Operator, PublishedSuite, TensorSize, compile_context, torch_dtype
from flyexplore.ops.rmsnorm.flydsl import FLYDSL as RMSNORM_FLYDSL
from flyexplore.ops.rmsnorm.model import MODEL as RMSNORM_MODEL
from flyexplore.paths import published_dir
from flyexplore.world.switches import flydsl_eager

RMSNORM = Operator(
    name="rmsnorm",
    doc="RMSNorm over the last dim (F.rms_norm); shape MxN, options eps=, weight=0/1",
    dims=("m", "n"),
    options={"eps": 1e-6, "weight": True},
    dtypes=("bf16", "fp16", "fp32"),
    flydsl=RMSNORM_FLYDSL,
    model=RMSNORM_MODEL,
)


def _validate(p):
    import math

    if p["eps"] is not None and not (isinstance(p["eps"], (int, float)) and not isinstance(p["eps"], bool)
                                     and math.isfinite(p["eps"]) and p["eps"] >= 0):
        raise UsageError(f"rmsnorm eps must be None or a finite number >= 0, got {p['eps']!r}")


def effective_eps(case, dtype) -> float:
    """The eps the operator uses: the case's, or for ``eps=None`` torch's default, the machine
    epsilon of the computation type (``torch.finfo(torch.float32).eps`` for fp16/bf16/fp32,
    float64's for fp64; ``torch.nn.RMSNorm`` documentation, torch 2.15)."""
    import torch

    if case["eps"] is not None:
        return float(case["eps"])
    return float(torch.finfo(torch.float64 if dtype == "fp64" else torch.float32).eps)


def _inputs(case, dtype, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(dtype)
    x = torch.randn(case["m"], case["n"], generator=g, device=device, dtype=dt)
    w = (1.0 + 0.1 * torch.randn(case["n"], generator=g, device=device, dtype=dt)) if case["weight"] else None
    return {"x": x, "w": w}


def _tensors(case, dtype):
    """What :func:`_inputs` allocates and one call returns: x [M, N], the weight [N] (when on) and
    the output [M, N], all in ``dtype``."""
    m, n, b = case["m"], case["n"], int(DTYPE_BYTES[dtype])
    w = (TensorSize("w", "input", (n,), b),) if case["weight"] else ()
    return (TensorSize("x", "input", (m, n), b), *w, TensorSize("out", "output", (m, n), b))


def _reference(case, dtype, inputs):
    import torch

    hi = torch.float64 if inputs["x"].device.type == "cpu" else torch.float32
    x = inputs["x"].to(hi)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + effective_eps(case, dtype))
    return y * inputs["w"].to(hi) if inputs["w"] is not None else y


def error(out, ref, case, dtype):
    """Error columns and ``accuracy_ok`` for an RMSNorm output [M, N]: every element within the
    bound in the module docstring, NaN/Inf only where ``ref`` has them, and
    ``err_rel <= err_tol``; ``err_row_max_rel`` is the worst row."""
    import torch

    n = case["n"]
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    u_out, u_acc = checks.unit_roundoff(out.dtype), checks.unit_roundoff(acc)
    u_ref = checks.unit_roundoff(ref.dtype)
    c = 2 * u_out + checks.gamma(n + 8, u_acc) + checks.gamma(n + 8, u_ref)
    bound = checks.SAFETY * (c * ref.double().abs().nan_to_num(0.0, posinf=0.0)
                             + float(torch.finfo(out.dtype).tiny))
    rule = (f"elementwise |out-ref| <= {checks.SAFETY:g}*((2u_out + gamma_{{N+8}}(u_acc) + "
            f"gamma_{{N+8}}(u_ref))|ref| + tiny), u_out={checks.fmt_u(u_out)}, "
            f"u_acc={checks.fmt_u(u_acc)}, u_ref={checks.fmt_u(u_ref)}, N={n}")
    return checks.with_tol(checks.bounded(out, ref, bound, rule=rule), ERR_TOL[dtype])


def _rms(x, w, n, eps):
    import torch
    return torch.nn.functional.rms_norm(x, (n,), w, eps)


RMSNORM.validate = _validate
RMSNORM.make_inputs = _inputs
RMSNORM.reference = _reference
RMSNORM.error = error
RMSNORM.flops = lambda case: 4.0 * case["m"] * case["n"]
RMSNORM.tensors = _tensors
RMSNORM.bytes = lambda case, dtype: float(
    2 * case["m"] * case["n"] * DTYPE_BYTES[dtype] + (case["n"] * DTYPE_BYTES[dtype] if case["weight"] else 0))


def _flydsl_available(ctx, case, dtype):
    r = ctx.env.flydsl_eager
    if not r.ready:
        return "; ".join(c.detail for c in r.failed)
    return None


@RMSNORM.backend("aten", "eager F.rms_norm with FlyDSL overrides off", baseline=True,
                 context=lambda ctx, case: flydsl_eager(False, ("rmsnorm",)))
def _aten(case, dtype, inputs, ctx):
    x, w, n, eps = inputs["x"], inputs["w"], case["n"], case["eps"]
    return lambda: _rms(x, w, n, eps)


@RMSNORM.backend("inductor", "torch.compile default (Triton on GPU, C++ on CPU)",
                 context=compile_context)
def _inductor(case, dtype, inputs, ctx):
    import torch

    f = torch.compile(_rms, dynamic=False)
    x, w, n, eps = inputs["x"], inputs["w"], case["n"], case["eps"]
    return lambda: f(x, w, n, eps)


@RMSNORM.backend("flydsl", "eager F.rms_norm with FlyDSL overrides on (gfx950)",
                 available=_flydsl_available, context=lambda ctx, case: flydsl_eager(True, ("rmsnorm",)))
def _flydsl(case, dtype, inputs, ctx):
    x, w, n, eps = inputs["x"], inputs["w"], case["n"], case["eps"]
    return lambda: _rms(x, w, n, eps)


def _published():
    with open(published_dir() / "rmsnorm.csv") as f:
        return [(f"{r['m']}x{r['n']}", r["dtype"]) for r in csv.DictReader(f)]


RMSNORM.add_suite("published", _published(), ["fp16", "bf16", "fp32"],
                  "the 22 RMSNorm cases published for MI355X (dtype per case)",
                  "pytorch/pytorch PR 191447 (data/published/rmsnorm.csv)")
RMSNORM.add_suite("llm", [f"{m}x{n}" for n in (4096, 8192) for m in (16, 2048, 8192)], ["bf16"],
                  "hidden sizes of Llama-3.1-8B (4096) and Llama-3.3-70B (8192) at M=16/2048/8192 tokens",
                  "Llama-3.1-8B and Llama-3.3-70B configs (hidden_size)")
RMSNORM.add_suite("cpu-small", ["256x1024", "1024x4096", "64x8192"], ["fp32"],
                  "small RMSNorm cases for a 2-core CPU", "flyexplore")


def _published_rows(suite, P) -> list[dict]:
    """Result rows of the published table ``suite`` (:class:`~flyexplore.ops.base.PublishedSuite`),
    made with the row builders ``P`` that the results layer hands over
    (:mod:`flyexplore.results.published`: ``read_table``, ``published_row``, ``throughput_rows``)."""

    op = RMSNORM
    rows = []
    for r in P.read_table(suite):
        case, dt = op.case(f"{r['m']}x{r['n']}"), r["dtype"]
        for be in ("aten", "flydsl"):
            rows.append(P.published_row(suite, "rmsnorm", case.label, case.p, dt, be,
                             time_ms=float(r[f"{be}_us"]) / 1e3, flops=op.flops(case),
                             nbytes=op.bytes(case, dt), message=P.US_MSG.format(v=r[f"{be}_us"]),
                             extra={"flydsl": "0.3.0"} if be == "flydsl" else None))
    return rows


RMSNORM.published = (PublishedSuite(
    "rmsnorm", "rmsnorm.csv", "rmsnorm",
    "pytorch/pytorch PR 191447",
    "MI355X, FlyDSL 0.3.0, GPU events, 10 warm-up + 50 timed iterations, one run per "
    "case; ATen measured with FlyDSL disabled", "event",
    load=_published_rows),)
