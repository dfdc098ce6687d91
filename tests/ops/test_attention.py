"""Attention (SDPA): cases, FLOPs, the reference against torch's own math in float64, backward,
and the reasons SDPA backends are unavailable, in torch's words."""
from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from flyexplore.errors import UsageError
from flyexplore.ops import get_op
from flyexplore.ops.attention import operator as at
from flyexplore.ops.base import RunContext

OP = get_op("attention")
CPU = torch.device("cpu")


def test_labels_are_canonical():
    assert OP.case("1x32x4096x4096x128:causal=1,hkv=8").label == "1x32x4096x4096x128:hkv=8,causal=1"
    assert OP.case("1x32x4096x4096x128:hkv=8,causal=1").label == "1x32x4096x4096x128:hkv=8,causal=1"
    assert OP.case("1x8x64x64x64:hkv=8").label == "1x8x64x64x64"          # hkv == h is MHA
    assert OP.case("1x8x64x64x64:bwd")["pass"] == "bwd"
    assert OP.case("1x8x64x64x64:bwd").label == "1x8x64x64x64:bwd"
    with pytest.raises(UsageError, match="sq == skv"):
        OP.case("1x8x1x64x64:causal=1")
    with pytest.raises(UsageError, match="multiple of hkv=3"):
        OP.case("1x8x64x64x64:hkv=3")
    with pytest.raises(UsageError, match="fwd"):
        OP.case("1x8x64x64x64:fwdbwd")


def test_flops_convention():
    c = OP.case("2x32x2048x2048x128")
    f = 4.0 * 2 * 32 * 2048 * 2048 * 128
    assert OP.flops(c) == f
    assert OP.flops(OP.case("2x32x2048x2048x128:causal=1")) == f / 2
    assert OP.flops(OP.case("2x32x2048x2048x128:causal=1,bwd")) == f / 2 * 2.5
    assert OP.flops(OP.case("32x32x1x4096x128:hkv=8")) == 4.0 * 32 * 32 * 1 * 4096 * 128
    q, kv = 32 * 1 * 128, 32 * 8 * 4096 * 128
    assert OP.bytes(OP.case("32x32x1x4096x128:hkv=8"), "bf16") == (2 * q * 32 + 2 * kv) * 2


@pytest.mark.parametrize("shape", ["1x8x48x48x32:hkv=2,causal=1", "2x4x1x80x64", "1x4x40x40x16:causal=1"])
def test_reference_matches_torch_math_in_float64(shape):
    c = OP.case(shape)
    inp = OP.make_inputs(c, "fp32", CPU, 0)
    ref = OP.reference(c, "fp32", inp)
    q, k, v = (inp[n].double() for n in ("q", "k", "v"))
    gqa = at.kv_heads(c) != c["h"]
    with sdpa_kernel([SDPBackend.MATH]):
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=c["causal"], **({"enable_gqa": True} if gqa else {}))
    assert torch.allclose(ref, want, rtol=1e-10, atol=1e-12)


def test_backward_reference_and_error():
    c = OP.case("1x8x48x48x32:hkv=2,causal=1,bwd")
    inp = OP.make_inputs(c, "fp32", CPU, 0)
    ref = OP.reference(c, "fp32", inp)
    q, k, v = (inp[n].double().requires_grad_() for n in ("q", "k", "v"))
    with sdpa_kernel([SDPBackend.MATH]):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(o, (q, k, v), inp["do"].double())])
    assert ref.shape == (8 * 48 * 32 + 2 * 2 * 48 * 32,) and torch.allclose(ref, want, atol=1e-10)
    ctx = RunContext(CPU, SimpleNamespace(platform="cpu"))
    assert torch._C._is_multithreading_enabled()
    with at._context("flash")(ctx, c):
        # the backward runs on the calling thread (profiler attribution on GPUs)
        assert not torch._C._is_multithreading_enabled()
        grads = OP.get_backend("flash").build(c, "fp32", inp, ctx)()
    assert torch._C._is_multithreading_enabled()
    assert [g.shape for g in grads] == [inp["q"].shape, inp["k"].shape, inp["v"].shape]
    e = OP.error(grads, ref, c, "fp32")
    assert e["err_rel"] < 1e-5
    broken = (grads[0], grads[1] * 1.1, grads[2])          # one wrong gradient is caught
    assert OP.error(broken, ref, c, "fp32")["err_rel"] == pytest.approx(0.1, rel=1e-3)


def test_cpu_reasons_quote_torch():
    c = OP.case("1x4x64x64x64:causal=1")
    assert at.explain("flash", c, "bf16", CPU, "cpu") is None           # torch's CPU flash kernel
    assert at.explain("math", c, "bf16", CPU, "cpu") is None
    why = at.explain("efficient", c, "bf16", CPU, "cpu")
    assert "FLASH_ATTENTION (its CPU flash kernel) and MATH" in why
    assert "No viable backend for scaled_dot_product_attention" in why     # torch's dispatcher
    assert "All tensors need to be on cuda device" in why                  # can_use_efficient_attention
    assert "NVIDIA GPU" in at.explain("cudnn", c, "bf16", CPU, "cpu")
    assert "ROCm-only" in at.explain("ck", c, "bf16", CPU, "cpu")


def test_gpu_reason_capture_reads_c10_warnings():
    """The GPU path asks torch.backends.cuda.can_use_*_attention(params, debug=True), which
    prints its reasons through c10 (file descriptor 2). Given CPU tensors it refuses with the
    device rule, so the capture is exercised for real on this machine."""
    c = OP.case("1x8x64x64x64:hkv=2,bwd")
    for name, fn in (("flash", "can_use_flash_attention"), ("efficient", "can_use_efficient_attention")):
        why = at.explain(name, c, "bf16", CPU, "cuda")
        assert why.startswith(f"torch.backends.cuda.{fn} says no: ")
        assert "All tensors need to be on cuda device. Got query on device: cpu" in why
    assert at.explain("ck", c, "bf16", CPU, "cuda").startswith("CK flash attention is ROCm-only")
    assert at.explain("cudnn", c, "bf16", CPU, "rocm") == "cuDNN attention is NVIDIA-only"
    # ROCm: the CK row asks torch whether the build has CK; the library preference is restored
    before = torch.backends.cuda.preferred_rocm_fa_library()
    assert "is_ck_sdpa_available() is False" in at.explain("ck", c, "bf16", CPU, "rocm")
    assert "can_use_flash_attention says no" in at.explain("flash", c, "bf16", CPU, "rocm")
    assert torch.backends.cuda.preferred_rocm_fa_library() == before


def test_llm_suite_covers_head_dims_masks_passes_and_decode():
    s = OP.get_suite("llm")
    assert {c["d"] for c in s.cases} == {64, 128, 256}
    assert {c["causal"] for c in s.cases} == {True, False}
    assert {c["pass"] for c in s.cases} == {"fwd", "bwd"}
    assert any(c["sq"] == 1 and c["skv"] == 4096 for c in s.cases)
    assert sum(1 for c in s.cases if c["hkv"]) == 15                    # GQA models ...
    assert {c.label for c in s.cases if not c["hkv"]} == {             # ... and one MHA model
        "1x32x4096x4096x128:causal=1", "1x32x4096x4096x128:causal=1,bwd"}
    assert len({c.label for c in s.cases}) == len(s.cases) == 17


def test_attention_rows_on_a_gpu_record_what_ran_as_a_property_of_the_operator():
    # which AOTriton backend ran is in the kernels only, so every attention row on a GPU is
    # traced; the sweep reads that from the Operator, not from the operator's name
    import torch

    from flyexplore.ops import get_op
    from flyexplore.ops.base import RunContext
    from flyexplore.run.cases import _traced

    gpu, cpu = RunContext(torch.device("cuda", 0), None), RunContext(torch.device("cpu"), None)
    att, gemm = get_op("attention"), get_op("gemm")
    assert att.trace_on_gpu and not gemm.trace_on_gpu
    assert _traced(False, "flash", att, gpu) and not _traced(False, "flash", att, cpu)
    assert not _traced(False, "aten", gemm, gpu) and _traced(False, "flydsl", gemm, cpu)
    assert _traced(True, "aten", gemm, cpu)
