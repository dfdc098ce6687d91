"""Grouped GEMM (MoE expert FFNs): ``torch._grouped_mm`` / ``F.grouped_mm`` with a 2-D
A [total_M, K], a 3-D B [G, K, N] and int32 cumulative row offsets ``offs`` (``offs[g]`` is the
end row of group g). Group g computes ``out[rows_g] = A[rows_g] @ B[g]``.

Shape ``GxMxNxK``: G groups (experts), M rows per group, N and K of each group's GEMM.
Options:

- ``ms=r0/r1/...``: ragged M, the row count of each group (G numbers, '/'-separated, zeros
  allowed for empty groups); M must then be the largest of them. Uniform lists are written
  without ``ms`` so that labels stay canonical.
- ``layout``: ``NN`` (default; B stored [G, K, N] row-major, the only layout torch 2.15's FlyDSL
  grouped template takes) or ``NT`` (B stored [G, N, K] as ``nn.Linear`` experts, passed as
  ``B.transpose(-2, -1)``, the column-major B that CUDA's grouped kernels prefer).

FLOPs 2 * total_M * N * K. Bytes (total_M*K + G_used*K*N + total_M*N) * element size + 4*G
(offs), where G_used counts the non-empty groups (an ideal kernel never reads an empty
group's B).

Backends: ``aten`` (eager ``F.grouped_mm``; on CPU torch >= 2.9 runs a per-group fallback --
seen working with torch 2.15 here; torch 2.9-2.12 need 16-byte aligned strides, per the
per-version check in huggingface/transformers PR 46743), ``triton`` (``torch.compile``
max-autotune, Triton grouped-GEMM template only; GPU only, sm_90+ on NVIDIA --
``torch._inductor.kernel.mm_grouped.has_grouped_mm_triton_support``), ``flydsl``
(max-autotune with ``max_autotune_gemm_backends="FLYDSL"``; ROCm torch >= 2.15 on gfx950,
template ``grouped_gemm_flydsl``: fp16/bf16, N % 32 == 0, K % 32 == 0, row-major B, no bias --
``torch/_inductor/kernel/mm_grouped.py::use_flydsl_grouped_mm_template``), and ``reference``
(a Python loop of one dense ``torch.mm`` per group: what grouped GEMM replaces).
"""
from __future__ import annotations

import csv
import re

from flyexplore.errors import UsageError
from flyexplore.ops import checks
from flyexplore.ops.base import (DTYPE_BYTES, ERR_TOL, Operator, PublishedSuite, TensorSize, compile_context,
                                 exported_shapes, torch_dtype)
from flyexplore.ops.grouped_gemm.flydsl import FLYDSL as GROUPED_GEMM_FLYDSL
from flyexplore.ops.grouped_gemm.model import MODEL as GROUPED_GEMM_MODEL
from flyexplore.ops.grouped_gemm.flydsl import group_sizes, total_rows
from flyexplore.ops.grouped_gemm.flydsl import parse_ms as _parse_ms
from flyexplore.paths import published_dir

GROUPED_GEMM = Operator(
    name="grouped_gemm",
    doc="grouped GEMM (F.grouped_mm, 2-D A x 3-D B with int32 offsets); shape GxMxNxK "
        "(M rows per group), options ms=r0/r1/... (ragged M), layout NN/NT",
    dims=("g", "m", "n", "k"),
    options={"layout": "NN", "ms": ""},
    choices={"layout": ("NN", "NT")},
    dtypes=("bf16", "fp16", "fp32"),
    flydsl=GROUPED_GEMM_FLYDSL,
    model=GROUPED_GEMM_MODEL,
)


#: The most rows A may have in all: ``offs`` is int32 (``torch._grouped_mm`` takes no other), so
#: its last entry, total_M, must fit int32.
MAX_TOTAL_ROWS = 2 ** 31 - 1


def _validate(p):
    """Check ``ms`` against G and M (a uniform list is dropped: canonical label) and total_M
    against :data:`MAX_TOTAL_ROWS`."""
    if p["ms"] in ("", None):
        p["ms"] = ""
        _check_total(p, p["g"] * p["m"])
        return
    if isinstance(p["ms"], (list, tuple)):
        p["ms"] = "/".join(str(v) for v in p["ms"])
    ms = _parse_ms(p["ms"])
    if len(ms) != p["g"]:
        raise UsageError(f"grouped_gemm ms lists {len(ms)} groups but G={p['g']}")
    if max(ms) != p["m"]:
        raise UsageError(f"grouped_gemm M={p['m']} must be the largest group of ms "
                         f"({max(ms)}) for ragged cases")
    _check_total(p, sum(ms))
    p["ms"] = "" if all(v == p["m"] for v in ms) else "/".join(str(v) for v in ms)


def _check_total(p, total: int) -> None:
    if total > MAX_TOTAL_ROWS:
        raise UsageError(f"grouped_gemm total rows {total} (G={p['g']} groups, M={p['m']}"
                         f"{', ms' if p['ms'] else ''}) do not fit the int32 offsets torch._grouped_mm "
                         f"takes (at most {MAX_TOTAL_ROWS})")


GROUPED_GEMM.validate = _validate


def offsets(sizes) -> list[int]:
    """Cumulative end rows (what ``offs`` holds): ``[2, 0, 3] -> [2, 2, 5]``."""
    out, acc = [], 0
    for s in sizes:
        acc += s
        out.append(acc)
    return out


def _inputs(case, dtype, device, seed):
    """A [total_M, K], B [G, K, N] (a transposed [G, N, K] tensor for layout NT), offs int32."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(dtype)
    sizes = group_sizes(case)
    total, n, k, G = sum(sizes), case["n"], case["k"], case["g"]
    a = torch.randn(total, k, generator=g, device=device, dtype=dt)
    if case["layout"] == "NN":
        b = torch.randn(G, k, n, generator=g, device=device, dtype=dt)
    else:
        b = torch.randn(G, n, k, generator=g, device=device, dtype=dt).transpose(-2, -1)
    offs = torch.tensor(offsets(sizes), dtype=torch.int32, device=device)
    return {"a": a, "b": b, "offs": offs, "sizes": tuple(sizes)}


def _tensors(case, dtype):
    """What :func:`_inputs` allocates and one call returns: A [total_M, K], B as stored ([G, K, N],
    or [G, N, K] for layout NT) in ``dtype``, int32 offs [G]; the output [total_M, N] in ``dtype``."""
    total, n, k, G = total_rows(case), case["n"], case["k"], case["g"]
    b = int(DTYPE_BYTES[dtype])
    return (TensorSize("a", "input", (total, k), b),
            TensorSize("b", "input", (G, k, n) if case["layout"] == "NN" else (G, n, k), b),
            TensorSize("offs", "input", (G,), 4), TensorSize("out", "output", (total, n), b))


def _reference(case, dtype, inputs):
    """Per-group products in float64 (CPU) or float32 (GPU): [total_M, N]. Attached:
    ``.abs_product`` (the per-group ``|A| @ |B|``) and ``.group`` (the group of each row,
    int64 [total_M])."""
    import torch

    a, b = inputs["a"], inputs["b"]
    hi = torch.float64 if a.device.type == "cpu" else torch.float32
    out = torch.zeros(a.shape[0], b.shape[-1], dtype=hi, device=a.device)
    absp = torch.zeros_like(out)
    start = 0
    for gi, rows in enumerate(inputs["sizes"]):
        if rows:
            ag, bg = a[start:start + rows].to(hi), b[gi].to(hi)
            out[start:start + rows] = ag @ bg
            absp[start:start + rows] = ag.abs() @ bg.abs()
        start += rows
    out.abs_product = absp
    out.group = torch.repeat_interleave(torch.arange(len(inputs["sizes"]), device=a.device),
                                        torch.tensor(inputs["sizes"], device=a.device))
    return out


def error(out, ref, case, dtype):
    """Error columns and ``accuracy_ok`` for a grouped GEMM output [total_M, N]: every element
    within :func:`flyexplore.ops.checks.gemm_bound` of ``ref``, NaN/Inf only where ``ref`` has
    them, and ``err_rel <= err_tol``; ``err_row_max_rel``: the worst row, ``err_block_max_rel``:
    the worst group (empty groups have no rows)."""
    bound, rule = checks.gemm_bound(ref, ref.abs_product, case["k"], out.dtype, torch_dtype(dtype))
    cols = checks.bounded(out, ref, bound, row_blocks=(ref.group, case["g"]), rule=rule + "; blocks = groups")
    return checks.with_tol(cols, ERR_TOL[dtype])


def _bytes(case, dtype):
    sizes = group_sizes(case)
    total, n, k = sum(sizes), case["n"], case["k"]
    used = sum(1 for s in sizes if s)
    return float((total * k + used * k * n + total * n) * DTYPE_BYTES[dtype] + 4 * case["g"])


GROUPED_GEMM.make_inputs = _inputs
GROUPED_GEMM.tensors = _tensors
# a memory probe (flyexplore.run.memory) scales M, N and K with G kept and even groups: a ragged
# ms list names rows per group, which a probe's M would not match (memory follows total rows)
GROUPED_GEMM.memory_dims = lambda case: ((("m",), ("n",), ("k",)), {"ms": ""})
GROUPED_GEMM.reference = _reference
GROUPED_GEMM.error = error
GROUPED_GEMM.flops = lambda case: 2.0 * sum(group_sizes(case)) * case["n"] * case["k"]
GROUPED_GEMM.bytes = _bytes


def _grouped_mm(a, b, offs):
    import torch

    fn = getattr(torch.nn.functional, "grouped_mm", None)
    if fn is not None:
        return fn(a, b, offs=offs)
    return torch._grouped_mm(a, b, offs=offs)


def _aten_available(ctx, case, dtype):
    import torch

    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm (added in torch 2.8)"
    return alignment_reason(case, dtype)


def alignment_reason(case, dtype) -> str | None:
    """torch._grouped_mm's stride rule (its meta check ``check_valid_strides``, on every device):
    the leading strides of A and B -- K and N elements here -- must be multiples of 16 bytes.
    torch itself raises "strides should be multiple of 16 bytes"."""
    b = DTYPE_BYTES[dtype]
    bad = [f"{d.upper()}={case[d]}" for d in ("k", "n") if (case[d] * b) % 16]
    if bad:
        return (f"torch._grouped_mm needs 16-byte aligned strides ({', '.join(bad)} x {b} bytes "
                "is not a multiple of 16); torch says: strides should be multiple of 16 bytes")
    return None


def _triton_available(ctx, case, dtype):
    if not ctx.gpu:
        return ("Inductor's Triton grouped-GEMM template needs a CUDA or ROCm GPU "
                "(torch._inductor.kernel.mm_grouped.has_grouped_mm_triton_support)")
    if ctx.env.platform == "cuda":
        import torch
        cap = torch.cuda.get_device_capability(ctx.device)
        if cap < (9, 0):
            return (f"Inductor's Triton grouped-GEMM template needs sm_90+ on NVIDIA, this GPU "
                    f"is sm_{cap[0]}{cap[1]} (has_grouped_mm_triton_support)")
    return None


def flydsl_reasons(case, dtype) -> list[str]:
    """Why torch 2.15's FlyDSL grouped-GEMM template would refuse this case, from its gate
    ``use_flydsl_grouped_mm_template`` (empty list: the case passes those rules; the
    environment is checked separately)."""
    why = []
    if dtype not in ("fp16", "bf16"):
        why.append(f"FlyDSL grouped GEMM takes fp16/bf16 only, not {dtype}")
    if case["n"] % 32 or case["k"] % 32:
        why.append(f"FlyDSL grouped GEMM needs N % 32 == 0 and K % 32 == 0 (N={case['n']}, K={case['k']})")
    if case["layout"] != "NN":
        why.append("FlyDSL grouped GEMM needs a row-major B [G, K, N] (layout NN)")
    return why


def _flydsl_available(ctx, case, dtype):
    r = ctx.env.flydsl_compile
    why = [c.detail for c in r.failed] + flydsl_reasons(case, dtype)
    return "; ".join(why) or None


@GROUPED_GEMM.backend("aten", "eager F.grouped_mm (CUTLASS / CK / hipBLASLt / CPU fallback)",
                      baseline=True, available=_aten_available)
def _aten(case, dtype, inputs, ctx):
    a, b, offs = inputs["a"], inputs["b"], inputs["offs"]
    return lambda: _grouped_mm(a, b, offs)


TRITON_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON",
                  "triton.cudagraphs": False}
FLYDSL_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "FLYDSL",
                  "triton.cudagraphs": False}


def _compiled(options, inputs):
    import torch

    f = torch.compile(_grouped_mm, dynamic=False, options=options)
    a, b, offs = inputs["a"], inputs["b"], inputs["offs"]
    return lambda: f(a, b, offs)


@GROUPED_GEMM.backend("triton", "torch.compile max-autotune, Triton grouped-GEMM template only",
                      available=_triton_available, context=compile_context)
def _triton(case, dtype, inputs, ctx):
    return _compiled(TRITON_OPTIONS, inputs)


@GROUPED_GEMM.backend("flydsl", "torch.compile max-autotune with max_autotune_gemm_backends=FLYDSL",
                      available=_flydsl_available, context=compile_context)
def _flydsl(case, dtype, inputs, ctx):
    return _compiled(FLYDSL_OPTIONS, inputs)


@GROUPED_GEMM.backend("reference", "a Python loop of one dense torch.mm per non-empty group")
def _loop(case, dtype, inputs, ctx):
    import torch

    a, b, sizes = inputs["a"], inputs["b"], inputs["sizes"]
    spans = []
    start = 0
    for gi, rows in enumerate(sizes):
        if rows:
            spans.append((gi, start, start + rows))
        start += rows

    def run():
        out = torch.empty(a.shape[0], b.shape[-1], dtype=a.dtype, device=a.device)
        for gi, s, e in spans:
            torch.mm(a[s:e], b[gi], out=out[s:e])
        return out
    return run


# -- suites -----------------------------------------------------------------------------------

_KN = re.compile(r"^K(\d+) x N(\d+)")


def published_case_label(suite: str, case: str) -> str:
    """The flyexplore case label of a row of ``data/published/grouped_gemm_bf16.csv``.

    ``standard`` labels are ``g{G}x{M}x{N}x{K}`` as printed in pytorch/pytorch PR 194032 (the
    order of N and K is taken as printed; SOURCES.md notes it is unconfirmed -- the FLOP count
    does not depend on it); ``kn_variants`` are G=8, M=512 with the named K and N; ``ragged_m``
    rows are per-group M lists at G=8, K=N=4096. Raises :class:`UsageError` for an unknown form.
    """
    if suite == "standard" and case.startswith("g"):
        return GROUPED_GEMM.case(case[1:]).label
    if suite == "kn_variants":
        m = _KN.match(case)
        if m:
            k, n = int(m.group(1)), int(m.group(2))
            return GROUPED_GEMM.case(f"8x512x{n}x{k}").label
    if suite == "ragged_m":
        ms = [int(x) for x in case.strip("[]").split(",")]
        return GROUPED_GEMM.case(f"{len(ms)}x{max(ms)}x4096x4096:ms={'/'.join(map(str, ms))}").label
    raise UsageError(f"unknown published grouped GEMM case {suite}/{case!r}")


def _published():
    with open(published_dir() / "grouped_gemm_bf16.csv") as f:
        return [published_case_label(r["suite"], r["case"]) for r in csv.DictReader(f)]


GROUPED_GEMM.add_suite(
    "published", _published(), ["bf16"],
    "the 24 BF16 grouped GEMM cases published for MI355X: 14 uniform (label order G x M x N x K "
    "as printed, unconfirmed), 5 K/N variants at G=8 M=512, 5 ragged-M at G=8 K=N=4096",
    "pytorch/pytorch PR 194032 (data/published/grouped_gemm_bf16.csv)")

# Mixtral-8x7B experts: hidden 4096, intermediate 14336, 8 experts, top-2. gate+up fused
# (N = 2 x 14336, K = 4096) and down (N = 4096, K = 14336); 512 and 4096 tokens routed evenly
# (128 and 1024 rows per expert), plus 4096 tokens routed unevenly (8192 rows, skewed).
_MIX_SKEW = "2048/1536/1152/1024/896/768/512/256"
GROUPED_GEMM.add_suite(
    "mixtral-8x7b",
    [f"8x{m}x{n}x{k}" for m in (128, 1024) for n, k in ((28672, 4096), (4096, 14336))]
    + [f"8x2048x{n}x{k}:ms={_MIX_SKEW}" for n, k in ((28672, 4096), (4096, 14336))],
    ["bf16"],
    "Mixtral-8x7B expert FFN (gate_up N=28672 K=4096, down N=4096 K=14336), 512 and 4096 "
    "tokens x top-2 routed evenly, and 4096 tokens routed unevenly; expert weights stored [G, K, N] "
    "(NN, the layout FlyDSL's template takes): Hugging Face transformers stores them [G, N, K] and passes "
    "B transposed (NT), see hf-mixtral-8x7b",
    "Mixtral-8x7B config: hidden_size 4096, intermediate_size 14336, num_local_experts 8, "
    "num_experts_per_tok 2")
# Qwen3-30B-A3B experts: hidden 2048, moe_intermediate_size 768, 128 experts, top-8.
GROUPED_GEMM.add_suite(
    "qwen3-30b-a3b",
    [f"128x{m}x{n}x{k}" for m in (32, 256) for n, k in ((1536, 2048), (2048, 768))],
    ["bf16"],
    "Qwen3-30B-A3B expert FFN (gate_up N=1536 K=2048, down N=2048 K=768), 512 and 4096 "
    "tokens x top-8 over 128 experts, routed evenly (32 and 256 rows per expert); expert weights stored "
    "[G, K, N] (NN): Hugging Face transformers passes them NT, see hf-qwen3-30b-a3b",
    "Qwen3-30B-A3B config: hidden_size 2048, moe_intermediate_size 768, num_experts 128, "
    "num_experts_per_tok 8")
for _model, _title in (("qwen3-30b-a3b", "Qwen3-30B-A3B"), ("mixtral-8x7b", "Mixtral-8x7B"),
                       ("gpt-oss-20b", "gpt-oss-20b")):
    GROUPED_GEMM.add_suite(
        f"hf-{_model}", exported_shapes(_model, "grouped_gemm"), ["bf16"],
        f"{_title}'s expert GEMMs as Hugging Face transformers 5.23 calls torch._grouped_mm (weights as it "
        "stores them: layout=NT where B is passed transposed), prefill 1x2048 and decode 32 at 2048 context, "
        "routed uniformly",
        f"captured by flyexplore model (data/models/shapes/{_model}.csv)")
GROUPED_GEMM.add_suite(
    "cpu-small",
    [("4x64x128x128", "fp32"), ("4x96x128x256:ms=0/96/32/64", "fp32"),
     ("8x32x256x128:NT", "fp32"), ("4x64x128x128", "bf16")],
    ["fp32", "bf16"],
    "small grouped GEMMs (one with an empty group, one column-major B) for a 2-core CPU",
    "flyexplore")


def _published_rows(suite, P) -> list[dict]:
    """Result rows of the published table ``suite`` (:class:`~flyexplore.ops.base.PublishedSuite`),
    made with the row builders ``P`` that the results layer hands over
    (:mod:`flyexplore.results.published`: ``read_table``, ``published_row``, ``throughput_rows``)."""

    op = GROUPED_GEMM
    rows = []
    for r in P.read_table(suite):
        case = op.case(published_case_label(r["suite"], r["case"]))
        rows += P.throughput_rows(suite, "grouped_gemm", case, "bf16", r, ("aten", "triton", "flydsl"),
                                 op.flops(case), op.bytes(case, "bf16"), "2*sum(M_g)*N*K",
                                 extra={"subset": r["suite"], "published_label": r["case"],
                                        "total_m": sum(group_sizes(case))})
    return rows


GROUPED_GEMM.published = (PublishedSuite(
    "grouped", "grouped_gemm_bf16.csv", "grouped_gemm",
    "pytorch/pytorch PR 194032",
    "BF16 gfx950 F.grouped_mm; isolated process and fresh cache per backend/shape; "
    "steady-state TFLOP/s excluding compilation",
    load=_published_rows),)
