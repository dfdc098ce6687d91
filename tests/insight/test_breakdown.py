"""The profiled breakdown of one model step by kernel category: a tiny Hugging Face Llama run for
real on the CPU under torch.profiler (eager with and without module ranges, compiled), the kernel
name rule on real CUDA/ROCm kernel names, and the GPU accounting (idle, overlapping streams,
launching op vs kernel name) on torch's own profiler event objects laid out as an H200 profile of
torch 2.11 showed them (a CPU op's ``kernels`` list, device events with their intervals)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.insight import breakdown as BD  # noqa: E402
from flyexplore.ops import model_families  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval().float()
    ids = torch.randint(0, 128, (1, 16))

    def step(m=model):
        with torch.no_grad():
            return m(input_ids=ids, use_cache=False)
    return model, step


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_categories_follow_the_families_with_model_hooks():
    cats = BD.categories()
    assert cats == tuple(model_families()) + ("other", "idle")
    assert set(cats[:-2]) >= {"gemm", "rmsnorm", "topk", "grouped_gemm", "scaled_gemm", "attention"}


#: Real kernel names (the H200 profiles of data/h200/trace, cuBLAS/CUTLASS/Tensile/Inductor/AOTriton
#: names as the profiler prints them) and the category the name alone gives.
KERNELS = {
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
    "kernel__5x_cublas": "gemm",
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
    "execute_kernel__5x_cublas": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(...)": "gemm",
    "triton_tem_fused_mm_0": "gemm",
    # seen on the H200 (compiled Llama prefill): a pointwise kernel named after the mm it reads is no GEMM
    "triton_poi_fused__scaled_dot_product_efficient_attention__to_copy_mm_view_2": "other",
    "triton_tem_fused__to_copy_add_embedding_mean_mm_mul_pow_rsqrt_3": "gemm",
    "triton_tem_fused_mm_t_0": "gemm",
    "triton_tem_fused_addmm_relu_2": "gemm",
    "Cijk_Alik_Bljk_BBS_BH_MT128x128x64": "gemm",
    "gemm_gfx950_kernel_3": "gemm",                      # FlyDSL, from the gemm family's KernelPattern
    "triton_tem_fused__scaled_mm_0": "scaled_gemm",
    "triton_tem_fused__grouped_mm_0": "grouped_gemm",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": "rmsnorm",
    "triton_per_fused__fused_rms_norm__to_copy_add_mean_mul_pow_rsqrt_0": "rmsnorm",
    "rmsnorm_kernel_0": "rmsnorm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t>>(Flash_fwd_params)": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0":
        "attention",
    "attn_fwd": "attention",
    "flyc_attn_fwd": "attention",
    "void at::native::(anonymous namespace)::gatherTopK<float, unsigned int, 2, false>(...)": "topk",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float "
    "const, unsigned int>)": "topk",
    "void at::native::radixSortKVInPlace<2, -1, 32, 4, float, long, unsigned int>(...)": "topk",
    "register_topk_kernel_1": "topk",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, ...>": "other",
    "triton_poi_fused_add_mul_0": "other",
    "Memset (Device)": "other",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int)": "other",
}


@pytest.mark.parametrize("name, category", list(KERNELS.items()))
def test_category_of_kernel_on_real_names(name, category):
    assert BD.category_of_kernel(name) == category


def test_eager_llama_with_module_ranges(llama):
    model, step = llama
    b = BD.profile_step(step, "cpu", module=model)
    cats = [r["category"] for r in b.rows]
    assert {"gemm", "attention", "rmsnorm", "other"} <= set(cats)
    assert cats == [c for c in BD.categories() if c in cats]          # category order
    assert "idle" not in cats and b.idle_us == 0 and b.device == "cpu"
    assert sum(r["share"] for r in b.rows) == pytest.approx(1.0, abs=1e-6)
    assert sum(r["us"] for r in b.rows) == pytest.approx(b.kernel_us)
    assert 0 < b.kernel_us <= b.span_us
    assert all(r["launches"] >= r["kernels"] > 0 and 1 <= len(r["top"]) <= 3 for r in b.rows)
    assert any("module ranges" in a and "5 modules" in a for a in b.attribution)   # 2 x 2 layer norms + final
    assert any("self time" in n for n in b.notes)
    assert _hooks(model) == 0                                          # hooks removed afterwards
    assert b.share("topk") == 0.0 and b.share("gemm") == next(r["share"] for r in b.rows if r["category"] == "gemm")
    text = b.text()
    assert "rmsnorm" in text and "%" in text and "aten::mm" in text

    again = BD.Breakdown.from_dict(json.loads(json.dumps(b.to_dict())))
    assert again == b


def test_eager_llama_without_module_leaves_rmsnorm_to_other(llama):
    model, step = llama
    b = BD.profile_step(step, "cpu", warmup=0)
    cats = {r["category"] for r in b.rows}
    assert {"gemm", "attention", "other"} <= cats and "rmsnorm" not in cats   # HF's RMSNorm is Python
    assert sum(r["share"] for r in b.rows) == pytest.approx(1.0, abs=1e-6)
    assert not any("module ranges" in a for a in b.attribution)
    assert _hooks(model) == 0


def test_module_hooks_removed_when_the_step_fails(llama):
    model, step = llama

    def failing():
        step()
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        BD.profile_step(failing, "cpu", module=model, warmup=0)
    assert _hooks(model) == 0


def test_a_kept_function_holds_what_runs_inside_it():
    """SDPA's math backend computes attention with bmm/matmul: as the capture keeps SDPA as one
    call, its inner GEMMs are attention, while a plain matmul beside it is gemm."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 32, 16)
    a, w = torch.randn(64, 64), torch.randn(64, 64)

    def step():
        with sdpa_kernel(SDPBackend.MATH):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return a @ w
    b = BD.profile_step(step, "cpu")
    rows = {r["category"]: r for r in b.rows}
    assert "attention" in rows and "gemm" in rows
    assert not any("bmm" in t for t in rows["gemm"]["top"])          # the plain matmul: aten::mm
    assert rows["gemm"]["kernels"] <= 3                                # aten::matmul, mm, resolve_conj
    assert any(t.startswith("aten::bmm ") for t in rows["attention"]["top"])


@pytest.mark.parametrize("fn, kw", [(42, {}), (None, {}), (lambda: None, {"device": "meta"}),
                                    (lambda: None, {"warmup": -1})])
def test_bad_input_raises_usage_error(fn, kw):
    with pytest.raises(UsageError):
        BD.profile_step(fn, **kw)


def _event(name, start, end, *, parent=None, kernels=(), device=False, annotation=False):
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    e = FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=end,
                      device_type=DeviceType.CUDA if device else DeviceType.CPU, is_user_annotation=annotation)
    if parent is not None:
        e.set_cpu_parent(parent)
        parent.append_cpu_child(e)
    for k, dur in kernels:
        e.append_kernel(k, 0, dur)
    return e


def test_gpu_accounting_on_profiler_events():
    """Kernels linked to their launching op (torch's FunctionEvent.kernels), one kernel with no
    op (rule 3), two streams overlapping (counted once in the busy time), a GPU-side annotation
    (not a kernel), an ``Activity Buffer Request`` holding the same kernel again (as the H200
    profile showed): idle = span - union of kernel intervals; shares of kernel + idle time."""
    root = _event(BD._STEP, 0, 100)
    lin = _event("aten::linear", 1, 5, parent=root)
    addmm = _event("aten::addmm", 2, 5, parent=lin, kernels=[("nvjet_sm90_tst_64x8_64x16_1x2_h_bz_bias_TNT", 3.0)])
    _event("Activity Buffer Request", 3, 4, parent=addmm, kernels=[("nvjet_sm90_tst_64x8_64x16_1x2_h_bz_bias_TNT", 3.0)])
    rng = _event("flyexplore::rmsnorm", 6, 9, parent=root)
    _event("aten::pow", 7, 8, parent=rng, kernels=[("void at::native::vectorized_elementwise_kernel<4>()", 1.0)])
    _event("aten::topk", 10, 12, parent=root, kernels=[("void at::native::sbtopk::gatherTopK<float>()", 10.0)])
    _event("aten::add", 13, 14, parent=root, kernels=[("void at::native::vectorized_elementwise_kernel<4>()", 2.0)])
    _event("aten::sort", 15, 16, parent=root, kernels=[("void at::native::radixSortKVInPlace<2>()", 4.0)])
    cpu = [root] + _descend(root)
    dev = [_event("nvjet_sm90_tst_64x8_64x16_1x2_h_bz_bias_TNT", 0, 3, device=True),
           _event("void at::native::vectorized_elementwise_kernel<4>()", 10, 11, device=True),
           _event("void at::native::sbtopk::gatherTopK<float>()", 20, 30, device=True),
           _event("triton_tem_fused_mm_0", 25, 35, device=True),            # no launching op: by name
           _event("void at::native::vectorized_elementwise_kernel<4>()", 40, 42, device=True),
           _event("void at::native::radixSortKVInPlace<2>()", 44, 48, device=True),   # a sort is no topk
           _event(BD._STEP, 0, 42, device=True, annotation=True)]
    b = BD._breakdown(cpu + dev, True, 3)
    rows = {r["category"]: r for r in b.rows}
    assert b.device == "cuda"
    assert b.span_us == pytest.approx(48) and b.kernel_us == pytest.approx(30)
    assert b.idle_us == pytest.approx(48 - (3 + 1 + 15 + 2 + 4))
    assert rows["gemm"]["us"] == pytest.approx(13) and rows["gemm"]["launches"] == 2
    assert rows["rmsnorm"]["us"] == pytest.approx(1) and rows["topk"]["us"] == pytest.approx(10)
    assert rows["other"]["us"] == pytest.approx(6) and rows["idle"]["us"] == pytest.approx(b.idle_us)
    assert [r["category"] for r in b.rows] == ["gemm", "rmsnorm", "topk", "other", "idle"]
    assert sum(r["share"] for r in b.rows) == pytest.approx(1.0, abs=1e-6)
    assert rows["topk"]["share"] == pytest.approx(10 / (30 + b.idle_us))
    assert any("overlapped" in n for n in b.notes)
    assert len(b.attribution) == 4 and "module ranges" in b.attribution[0]
    assert BD.Breakdown.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    assert "idle" in b.text()


def test_gpu_idle_row_present_without_gaps():
    root = _event(BD._STEP, 0, 10)
    _event("aten::mm", 1, 2, parent=root, kernels=[("nvjet_x", 4.0)])
    b = BD._breakdown([root] + _descend(root) + [_event("nvjet_x", 0, 4, device=True)], True, 0)
    assert [r["category"] for r in b.rows] == ["gemm", "idle"] and b.idle_us == 0
    assert b.share("gemm") == 1.0 and b.share("idle") == 0.0


def _descend(e):
    out = []
    for c in e.cpu_children:
        out += [c] + _descend(c)
    return out


@pytest.mark.slow
def test_compiled_llama_without_module(llama):
    model, _ = llama
    compiled = torch.compile(model)
    ids = torch.randint(0, 128, (1, 16))

    def step():
        with torch.no_grad():
            return compiled(input_ids=ids, use_cache=False)
    b = BD.profile_step(step, "cpu")
    assert b.share("gemm") > 0
    assert sum(r["share"] for r in b.rows) == pytest.approx(1.0, abs=1e-6)
    assert _hooks(model) == 0


def test_idle_less_the_profilers_cost_per_launch():
    """The gaps between kernels (two streams merged), each less the profiler's host cost per launch,
    floored at 0: a decode's many short gaps shrink, a long host stall keeps all but the cost."""
    dev = [_event("k", 0, 10, device=True), _event("k", 12, 20, device=True),   # gap 2
           _event("k", 15, 25, device=True),                                     # overlaps: no gap
           _event("k", 25.5, 30, device=True),                                   # gap 0.5
           _event("k", 40, 41, device=True)]                                     # gap 10
    assert BD._gaps(dev) == pytest.approx([2.0, 0.5, 10.0])
    assert BD.corrected_idle(BD._gaps(dev), 0.0) == pytest.approx(12.5)
    assert BD.corrected_idle(BD._gaps(dev), 1.0) == pytest.approx(1.0 + 0.0 + 9.0)
    assert BD.corrected_idle(BD._gaps(dev), -3.0) == pytest.approx(12.5)   # a negative cost is no cost
    # the H200 decode's arithmetic: ~1,300 launches whose gaps each lost ~3 us to the profiler -> ~4 ms
    gaps = [3.4] * 1300
    assert BD.corrected_idle(gaps, 3.1) == pytest.approx(1300 * 0.3)
    assert BD.launch_cost_us("cpu") == 0.0


def test_a_cuda_graph_replays_kernels_go_by_name():
    """In a CUDA graph replay the kernels hang under the ``cudaGraphLaunch`` runtime call, no ATen op
    above: each is attributed by its name (rule 3), none lost."""
    root = _event(BD._STEP, 0, 100)
    _event("cudaGraphLaunch", 1, 2, parent=root,
           kernels=[("nvjet_sm90_tst_128x32_64x10_4x1_v_bz_TNT", 5.0),
                    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3", 7.0),
                    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", 1.0),
                    ("triton_poi_fused__unsafe_view_mul_silu_8", 2.0)])
    dev = [_event("nvjet_sm90_tst_128x32_64x10_4x1_v_bz_TNT", 0, 5, device=True),
           _event("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3", 5, 12, device=True),
           _event("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", 12, 13, device=True),
           _event("triton_poi_fused__unsafe_view_mul_silu_8", 13, 15, device=True)]
    b = BD._breakdown([root] + _descend(root) + dev, True, 0)
    got = {r["category"]: r["us"] for r in b.rows}
    assert got == pytest.approx({"gemm": 5.0, "rmsnorm": 1.0, "attention": 7.0, "other": 2.0, "idle": 0.0})
    assert b.kernel_us == pytest.approx(15.0) and any("kernel name" in a for a in b.attribution)
