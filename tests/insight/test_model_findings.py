"""Issue 34: findings of an independent check of ``flyexplore model``, each held to what torch does.

- finding 4: the compiled view applies Inductor's post-grad ``mm + add -> addmm`` fusion (held to
  the post-grad graph of a real ``torch.compile`` on the CPU, read with Inductor's own
  ``post_grad_custom_post_pass`` hook);
- finding 9: on a GPU device, SDPA's output has the layout of a fused kernel, so no phantom
  ``aten.clone`` follows every attention.
"""
from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")

from flyexplore.insight import capture as C  # noqa: E402
from flyexplore.insight import coverage as CV  # noqa: E402


class SharedExpertTail(torch.nn.Module):
    """Llama-4's MoE tail (transformers' ``Llama4TextMoe``: ``out = shared_expert(x);
    out.add_(routed)``), plus a GEMM whose bias is added apart (``Linear(bias=False) + b``)."""

    def __init__(self, n: int = 64):
        super().__init__()
        self.down_proj = torch.nn.Linear(n, n, bias=False)
        self.bias_proj = torch.nn.Linear(n, n, bias=False)
        self.b = torch.nn.Parameter(torch.zeros(n))
        self.viewed = torch.nn.Linear(n, n, bias=False)
        self.fed_proj = torch.nn.Linear(n, n, bias=False)

    def forward(self, x, routed):
        out = self.down_proj(x)
        out.add_(routed * 2)
        y = self.bias_proj(x) + self.b
        z = self.fed_proj(x) + self.b      # bias-like too, but its sum feeds a GEMM: fused on a GPU as well
        return (out, y.relu(), self.viewed(x).view(2, -1, x.shape[-1]) + routed.view(2, -1, x.shape[-1]),
                z @ self.viewed.weight)


def _post_grad_gemms(m, *inputs) -> collections.Counter:
    """The GEMM ops of Inductor's post-grad graph for ``m(*inputs)`` on the CPU: the graph handed
    to ``torch._inductor.config.post_grad_custom_post_pass`` (run after Inductor's own post-grad
    passes), the compile stopped there (no C++ compiler needed)."""
    from torch._inductor import config as ic

    seen: dict = {}

    class Stop(Exception):
        pass

    def grab(g):
        seen["ops"] = collections.Counter(str(n.target) for n in g.nodes if n.op == "call_function"
                                          and "mm" in str(n.target))
        raise Stop

    torch._dynamo.reset()
    with ic.patch(post_grad_custom_post_pass=grab):
        with pytest.raises(Exception):
            torch.compile(m, backend="inductor")(*inputs)
    torch._dynamo.reset()
    return seen["ops"]


def test_compiled_view_fuses_mm_add_into_addmm_as_inductor_does():
    m = SharedExpertTail()
    x, r = torch.randn(32, 64), torch.randn(32, 64)
    want = _post_grad_gemms(m, x, r)
    cap = C.capture(m, (x, r), view="compiled", device="cpu")
    got = collections.Counter(c.op for c in cap.kernel_calls() if "mm" in c.op)
    assert got == want, (got, want)
    assert want["aten.addmm.default"] == 3 and want["aten.mm.default"] == 2   # the view blocks one
    fused = [c for c in cap.kernel_calls() if c.op == "aten.addmm.default"]
    # the fused call stays where the GEMM was made, and says why it is an addmm
    assert {c.module for c in fused} == {"down_proj", "bias_proj", "fed_proj"}
    assert all("post-grad" in c.note for c in fused)
    # the add it absorbed is gone; eager keeps mm and add apart
    assert not any(c.op.startswith("aten.add") and c.module == "" for c in cap.kernel_calls()
                   if c.inputs and c.inputs[0] is not None and c.inputs[0].shape == (32, 64))
    eager = C.capture(m, (x, r), view="eager", device="cpu")
    assert not any(c.op == "aten.addmm.default" for c in eager.kernel_calls())


def test_on_a_gpu_the_fused_addmm_is_not_eligible_and_a_bias_like_add_stays_apart():
    # fake cuda:0: Inductor keeps a broadcast bias apart on a GPU when the sum feeds pointwise code
    # (post_grad.py::should_prefer_unfused_addmm); a full-shape operand fuses
    m = SharedExpertTail(256).to(torch.bfloat16)
    x, r = torch.empty(512, 256, dtype=torch.bfloat16), torch.empty(512, 256, dtype=torch.bfloat16)
    cap = C.capture(m, (x, r), view="compiled")
    by_mod = {(c.module, c.op) for c in cap.kernel_calls() if "mm" in c.op}
    assert by_mod == {("down_proj", "aten.addmm.default"), ("bias_proj", "aten.mm.default"),
                      ("viewed", "aten.mm.default"), ("fed_proj", "aten.addmm.default"), ("", "aten.mm.default")}, by_mod
    # the bias add kept apart is still there; the one fused late is gone
    adds = [c for c in cap.kernel_calls() if c.op == "aten.add.Tensor" and c.inputs[1] is not None
            and c.inputs[1].shape == (256,)]
    assert len(adds) == 1
    rows = CV.judge_capture(cap, advice=False).rows
    v = {(c.module, c.op): v for c, n, v in rows}
    assert v[("down_proj", "aten.addmm.default")].status == "not eligible"
    assert v[("bias_proj", "aten.mm.default")].status == "eligible"


TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
              "max_position_embeddings": 4096}


def test_no_phantom_clone_after_sdpa_on_a_gpu_device():
    pytest.importorskip("transformers")
    from flyexplore.insight import hf as HF

    cap = HF.capture_model(config=TINY_LLAMA, phase="prefill", seq=16, views=("eager",), say=False)[0]
    clones = [c for c in cap.kernel_calls() if c.op == "aten.clone.default" and c.module_type == "LlamaAttention"]
    assert not clones, [(c.module, c.shapes()) for c in clones]
    sdpa = [c for c in cap.calls if c.op == C.SDPA]
    q, out = sdpa[0].inputs[0], sdpa[0].outputs[0]
    # the query's dimension order (torch/_meta_registrations.py::alloc_with_matching_layout)
    order = lambda t: sorted(range(4), key=lambda i: t.stride[i])   # noqa: E731
    assert order(out) == order(q) and out.stride != (1024, 256, 16, 1)


#: DeepSeek-V2-like (MLA, shared experts, an fp32 router ``mlp.gate``) and Llama-4-like (experts as bmm)
TINY_DEEPSEEK_V2 = {"model_type": "deepseek_v2", "hidden_size": 256, "intermediate_size": 512,
                    "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "kv_lora_rank": 64, "q_lora_rank": None, "qk_rope_head_dim": 32,
                    "qk_nope_head_dim": 32, "v_head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096,
                    "topk_method": "greedy", "n_group": 1, "topk_group": 1}
TINY_LLAMA4 = {"model_type": "llama4_text", "hidden_size": 256, "intermediate_size": 512, "intermediate_size_mlp": 512,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
               "num_local_experts": 4, "num_experts_per_tok": 1, "vocab_size": 512, "max_position_embeddings": 4096,
               "interleave_moe_layer_step": 1}


def test_fp32_router_in_a_bf16_model_is_an_island_not_advice():
    # finding 8: "run the model in bf16" was advised for DeepSeek's fp32 router in a bf16 model
    pytest.importorskip("transformers")
    import flyexplore as fx

    cov = fx.model(config=TINY_DEEPSEEK_V2, phase="prefill", seq=64, views="compiled")
    rules = {a["rule"]: a for a in cov.advice}
    assert "bf16_gemm" not in rules
    isl = rules["fp32_islands"]
    assert isl["kind"] == "note" and "mlp.gate" in isl["text"] and "runs in bf16" in isl["text"]
    # the router's GEMM really is fp32 in the capture
    gate = cov.table[cov.table["module"].str.endswith("mlp.gate") & cov.table["op"].str.contains("mm")]
    assert len(gate) and set(gate["dtype"]) == {"fp32"}
    # an fp32 model still gets the advice, re-judged
    cov32 = fx.model(config=TINY_DEEPSEEK_V2 | {"torch_dtype": "float32"}, phase="prefill", seq=64, views="compiled")
    rules32 = {a["rule"]: a for a in cov32.advice}
    assert "fp32_islands" not in rules32 and rules32["bf16_gemm"]["kind"] == "what-if"


def test_experts_running_as_bmm_over_every_expert_are_said_from_the_capture():
    # finding 6: Llama-4's experts see every token (bmm [E, T, H] x [E, H, 2I]); nothing said it
    pytest.importorskip("transformers")
    import flyexplore as fx

    cov = fx.model(config=TINY_LLAMA4, phase="prefill", seq=64, views="compiled")
    note = next(a for a in cov.advice if a["rule"] == "experts_bmm_all_tokens")
    assert "all 4 experts with all 64 tokens" in note["text"] and "4x the work of its top-1 routing" in note["text"]
    bmm = cov.table[(cov.table["op"] == "aten.bmm.default") & cov.table["module_type"].str.endswith("Experts")]
    share = (bmm["total_flops"].sum() / cov.table["total_flops"].sum())
    assert abs(note["flops_share"] - share) < 1e-9 and share > 0.5
    assert "note: the experts (Llama4TextExperts)" in cov.text()
    # a model whose experts run through torch._grouped_mm gets no such note
    from tests.insight.test_capture import TINY_QWEN_MOE

    q = fx.model(config=TINY_QWEN_MOE, phase="prefill", seq=64, views="compiled")
    assert not any(a["rule"] == "experts_bmm_all_tokens" for a in q.advice)


def test_expert_assumption_lines_follow_what_the_capture_saw():
    # finding 6: "experts run through torch._grouped_mm with uniform routing" was written for Llama-4,
    # whose experts call bmm over every expert; the lines now come from the captured calls
    pytest.importorskip("transformers")
    from flyexplore.insight import hf as HF
    from tests.insight.test_capture import TINY_QWEN_MOE

    l4 = HF.capture_model(config=TINY_LLAMA4, phase="prefill", seq=64, views=("compiled",), say=False)[0]
    text = " | ".join(l4.assumptions)
    assert "MoE routing" not in text and "torch._grouped_mm" not in text, text
    assert "the experts modules called aten.bmm.default x 4" in text, text   # 2 layers x gate_up and down
    q = HF.capture_model(config=TINY_QWEN_MOE, phase="prefill", seq=64, views=("compiled",), say=False)[0]
    text = " | ".join(q.assumptions)
    assert "the experts modules called aten._grouped_mm.default x 4" in text and "MoE routing: uniform" in text, text
    assert q.meta["dtype"] == "bf16" and l4.meta["dtype"] == "bf16"


# -- a newcomer's review of the above (issue 34) ---------------------------------------------------

def test_what_a_newcomer_found_is_said_where_they_read():
    pytest.importorskip("transformers")
    import flyexplore as fx
    from tests.insight.test_capture_speed import TINY_MAMBA
    from tests.insight.test_model_scope import MLLAMA

    # a folded scan's note reaches the table (not only the capture)
    cov = fx.model(config=TINY_MAMBA, phase="prefill", seq=64, views="eager")
    assert cov.table["notes"].str.contains("64 calls of one loop").any()
    # what was not captured is listed once over steps and views, in the text and in the Markdown
    cov = fx.model(config=MLLAMA, phases=[("prefill", 1, 32), ("decode", 1, 32)])
    text, md = cov.text(), cov.markdown()
    assert "not captured (2):" in text, text
    assert "## Not captured" in md and md.count("vision tower in vision_config") == 1, md
    # no "keep the bias out" advice for an addmm Inductor fused from Linear(bias=False) + add
    cov = fx.model(config=TINY_LLAMA4, phase="prefill", seq=64, views="compiled")
    assert "no_gemm_bias" not in {a["rule"] for a in cov.advice}
    # decode says which KV cache it updates; the embedding lookup reads rows, not its table
    from tests.insight.test_capture import TINY_LLAMA

    cov = fx.model(config=TINY_LLAMA, phase="decode", batch=4, seq=32, views="eager")
    assert "decode: the KV cache is transformers' DynamicCache" in cov.text()
    emb = cov.table[cov.table["op"] == "aten.embedding.default"].iloc[0]
    assert emb["bytes"] == 2 * 4 * 64 * 2 + 4 * 8, emb["bytes"]   # 4 rows of 64 bf16 read and written, int64 ids


def test_a_model_library_warning_does_not_spill_onto_the_error(capfd):
    pytest.importorskip("transformers")
    from flyexplore.errors import UsageError
    from flyexplore.insight import hf as HF
    from tests.insight.test_model_scope import BERT

    with pytest.raises(UsageError, match="position table"):
        HF.capture_phases(config=BERT, phases=[("prefill", 1, 1024)], say=False)
    err = capfd.readouterr().err
    assert "[transformers]" not in err and "is_decoder" not in err, err


def test_the_estimate_counts_a_reference_scan_over_the_sequence():
    import importlib.util

    from flyexplore.errors import UsageError

    if importlib.util.find_spec("mamba_ssm") is not None:
        pytest.skip("mamba_ssm is installed: transformers runs its kernels, not the reference scan")
    from flyexplore.insight import hf as HF

    d = HF.load_config(config={"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "state_size": 16,
                               "vocab_size": 50280})
    short = HF.estimate_model(d, [("prefill", 1, 2048)], ("eager", "compiled"))
    assert "4,096 token steps of transformers' reference scan" in short["text"] and short["seconds"] < 60
    with pytest.raises(UsageError, match="past the limit of 30 min .*reference scan"):
        HF.check_model(d, [("prefill", 1, 1_048_576)], ("eager", "compiled"))
