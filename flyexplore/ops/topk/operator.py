"""TopK: ``torch.topk(x, k, dim=-1, largest, sorted)`` over rows of a [M, N] tensor.

Shape ``MxNxK``; options ``largest`` and ``sorted`` (default on, as torch 2.15's FlyDSL
override requires) and ``deterministic`` (``torch.use_deterministic_algorithms`` during the
run; the published MI355X table has both). Bytes M*N*b + M*K*(b + 8) (values and int64
indices); FLOPs are not counted (0).

Backends: ``aten`` (eager, FlyDSL overrides off), ``inductor`` (``torch.compile`` default),
``flydsl`` (eager with overrides on; fp32, gfx950; register kernel for K in {2,4,8,16},
radix kernels for K bands 64-1024 -- ``torch/_native/ops/topk/flydsl_impl.py``).

Check (:func:`error`), from ``torch.topk``'s definition: the values equal the float64
reference's exactly (NaN counts as larger than every number, as in torch.topk; NaN matches
NaN), position by position when ``sorted`` and as a multiset otherwise; every index is in
``[0, N)``, unique in its row, and gathers its value (``x.gather(-1, idx) == values``); with
``sorted`` every row is in order. An index that differs from the reference's only among equal
values is a tie and is allowed: it is counted in ``tie_order_diffs``, never failed.
"""
from __future__ import annotations

import contextlib
import csv

from flyexplore.errors import UsageError
from flyexplore.ops import checks
from flyexplore.ops.base import DTYPE_BYTES, Operator, PublishedSuite, TensorSize, compile_context, torch_dtype
from flyexplore.ops.topk.flydsl import FLYDSL as TOPK_FLYDSL
from flyexplore.ops.topk.model import MODEL as TOPK_MODEL
from flyexplore.paths import published_dir
from flyexplore.world.switches import flydsl_eager

TOPK = Operator(
    name="topk",
    doc="torch.topk over the last dim; shape MxNxK (rows, row width, k), options largest=, sorted=, deterministic=",
    dims=("m", "n", "k"),
    options={"largest": True, "sorted": True, "deterministic": False},
    dtypes=("fp32", "bf16", "fp16"),
    flydsl=TOPK_FLYDSL,
    model=TOPK_MODEL,
)


def _validate(p):
    if p["k"] > p["n"]:
        raise UsageError(f"topk k={p['k']} is larger than the row width n={p['n']}")


def _inputs(case, dtype, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(case["m"], case["n"], generator=g, device=device, dtype=torch_dtype(dtype))}


def _reference(case, dtype, inputs):
    """The top-k values of the float64 input, sorted ([M, K]); the reference's indices are
    attached as ``.indices`` and the input itself as ``.x`` (for :func:`error`)."""
    import torch

    x = inputs["x"].to(torch.float64)
    r = torch.topk(x, case["k"], dim=-1, largest=case["largest"], sorted=True)
    ref = r.values
    ref.indices, ref.x = r.indices, inputs["x"]
    return ref


def _eq(a, b):
    """Elementwise equality with NaN equal to NaN."""
    import torch

    return (a == b) | (torch.isnan(a) & torch.isnan(b))


def _sorted(v, largest: bool):
    """Rows of ``v`` in topk order (NaN first when largest, last otherwise), stable."""
    import torch

    return torch.sort(v, dim=-1, descending=largest, stable=True).values


def error(out, ref, case, dtype):
    """Error columns and ``accuracy_ok`` for a ``torch.topk`` result ``(values, indices)``
    against :func:`_reference` (module docstring for the rule). Counts: ``err_fail_count``
    (value positions that differ from the reference), ``index_errors`` (indices out of range,
    repeated in a row, or gathering another value), ``order_errors`` (rows out of order with
    ``sorted``), ``tie_order_diffs`` (allowed: indices differing from the reference's among
    equal values), ``nonfinite_matched`` (NaN/Inf values matching the reference's) and
    ``nonfinite_mismatch``. ``err_rel`` is max |diff| / max |ref| over finite values;
    ``err_row_max_rel`` the same per row, the worst."""
    import torch


    vals, idx = (out[0], out[1]) if isinstance(out, tuple) else (out.values, out.indices)
    m, n, k = case["m"], case["n"], case["k"]
    rule = ("topk: values == float64 reference exactly (NaN == NaN"
            + (", position by position" if case["sorted"] else ", as a multiset")
            + "); indices in [0, N), unique per row, x.gather(idx) == values"
            + ("; rows in order" if case["sorted"] else "") + "; ties allowed (tie_order_diffs)")
    if tuple(vals.shape) != (m, k) or tuple(idx.shape) != (m, k):
        return {"err_rel": float("inf"), "err_max_abs": float("inf"), "err_tol": 0.0,
                "err_fail_count": m * k, "index_errors": m * k, "accuracy_ok": False,
                "accuracy_rule": rule + f"; got shapes {tuple(vals.shape)}, {tuple(idx.shape)}"}
    v = vals.to(torch.float64)
    largest = case["largest"]
    cmp = v if case["sorted"] else _sorted(v, largest)
    same = _eq(cmp, ref)
    value_errors = int((~same).sum())
    matched, mismatch, fin = checks.nonfinite_masks(cmp, ref)
    diff = torch.where(fin, (cmp - ref).abs(), torch.zeros_like(ref))
    scale = float(torch.where(fin, ref, torch.zeros_like(ref)).abs().max()) if ref.numel() else 0.0
    row_scale = torch.where(fin, ref, torch.zeros_like(ref)).abs().amax(dim=-1)
    row_rel = diff.amax(dim=-1) / torch.where(row_scale > 0, row_scale, torch.ones_like(row_scale))
    # indices: range, uniqueness, gather
    idx = idx.long()
    in_range = (idx >= 0) & (idx < n)
    safe = torch.where(in_range, idx, torch.zeros_like(idx))
    gathered = ref.x.gather(-1, safe).to(torch.float64)
    bad_gather = in_range & ~_eq(gathered, v)
    si = torch.sort(safe, dim=-1).values
    dup = (si[:, 1:] == si[:, :-1]).sum() if k > 1 else torch.zeros((), dtype=torch.long)
    index_errors = int((~in_range).sum()) + int(bad_gather.sum()) + int(dup)
    order_errors = 0
    if case["sorted"]:
        order_errors = int((~_eq(_sorted(v, largest), v).all(dim=-1)).sum())
    # ties: a valid index differing from the reference's where the value is the same
    good = in_range & ~bad_gather
    if case["sorted"]:   # the same value at a position, from another (equal) element
        ties = int((good & same & (idx != ref.indices)).sum())
    else:                # an index outside the reference's set, its value still right
        rows = torch.arange(m, device=idx.device).view(-1, 1) * n
        ties = int((good & ~torch.isin(rows + idx, rows + ref.indices)).sum()) if value_errors == 0 else 0
    ok = value_errors == 0 and index_errors == 0 and order_errors == 0
    return {"err_rel": float(diff.max()) / (scale or 1.0) if diff.numel() else 0.0,
            "err_max_abs": float(diff.max()) if diff.numel() else 0.0, "err_tol": 0.0,
            "err_row_max_rel": float(row_rel.max()) if row_rel.numel() else 0.0,
            "err_fail_count": value_errors, "nonfinite_matched": int(matched.sum()),
            "nonfinite_mismatch": int(mismatch.sum()), "index_errors": index_errors,
            "order_errors": order_errors, "tie_order_diffs": ties,
            "accuracy_ok": ok, "accuracy_rule": rule}


def _topk(x, k, largest, sorted_):
    import torch
    return torch.topk(x, k, dim=-1, largest=largest, sorted=sorted_)


def _tensors(case, dtype):
    """What :func:`_inputs` allocates and one call returns: x [M, N] in ``dtype``; the values
    [M, K] in ``dtype`` and the int64 indices [M, K]."""
    m, n, k, b = case["m"], case["n"], case["k"], int(DTYPE_BYTES[dtype])
    return (TensorSize("x", "input", (m, n), b), TensorSize("values", "output", (m, k), b),
            TensorSize("indices", "output", (m, k), 8))


TOPK.validate = _validate
TOPK.make_inputs = _inputs
TOPK.tensors = _tensors
# a memory probe (flyexplore.run.memory) scales M and N; K stays the case's (it picks the kernel)
TOPK.memory_dims = lambda case: ((("m",), ("n",)), {})
TOPK.reference = _reference
TOPK.error = error
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


def _published_rows(suite, P) -> list[dict]:
    """Result rows of the published table ``suite`` (:class:`~flyexplore.ops.base.PublishedSuite`),
    made with the row builders ``P`` that the results layer hands over
    (:mod:`flyexplore.results.published`: ``read_table``, ``published_row``, ``throughput_rows``)."""

    op = TOPK
    rows = []
    for r in P.read_table(suite):
        for det in (False, True):
            case = op.make_case(m=int(r["m"]), n=int(r["n"]), k=int(r["k"]), deterministic=det)
            word = "deterministic" if det else "nondeterministic"
            for be in ("aten", "flydsl"):
                v = r[f"{be}_{word}_us"]
                rows.append(P.published_row(suite, "topk", case.label, case.p, "fp32", be,
                                 time_ms=float(v) / 1e3, flops=None, nbytes=op.bytes(case, "fp32"),
                                 message=P.US_MSG.format(v=v),
                                 extra={"family": r["family"], "k_band": r["k_band"]}))
    return rows


TOPK.published = (PublishedSuite(
    "topk", "topk.csv", "topk",
    "pytorch/pytorch PR 193548",
    "fp32, MI355X, GPU events, 20 warm-up + 100 timed iterations, median of 3 runs "
    "for each torch.use_deterministic_algorithms setting", "event",
    load=_published_rows),)
