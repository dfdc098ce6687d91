"""Issue 44, part 4: the model capture on DBRX-like expert loops, VLM text decoders, per-layer
config lists, what-if counts equal to the compiled view's, and the compiled view traced as
Dynamo traces the model. Tiny configs with the published architectures' structure."""
from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.insight import capture as C  # noqa: E402
from flyexplore.insight import coverage as CV  # noqa: E402
from flyexplore.insight import hf as H  # noqa: E402
from flyexplore.insight.expert_routing import expert_rows  # noqa: E402


def _tiny(mt: str, **kw) -> dict:
    base = dict(model_type=mt, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=256)
    base.update(kw)
    return base


DBRX = dict(model_type="dbrx", d_model=64, n_heads=4, n_layers=2, max_seq_len=256, vocab_size=256,
            attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
            ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2))


def test_expert_rows_sum_to_the_routed_rows_by_largest_remainder():
    assert expert_rows("uniform", 4, 64) == [16] * 4
    assert expert_rows("uniform", 3, 10) == [4, 3, 3]
    z = expert_rows("zipf:1.0", 4, 100)
    assert sum(z) == 100 and z == sorted(z, reverse=True) and z[0] > z[-1]


def test_no_expert_gets_more_rows_than_there_are_tokens():
    """A token's top-k experts are distinct, so one expert gets at most the token count: 64 tokens
    x top-2 under a steep zipf give the first expert 64 rows (its share is 68), the rest shared out
    by the others' shares."""
    assert expert_rows("zipf:1.2", 4, 128) == [68, 29, 18, 13]        # uncapped: past the 64 tokens
    z = expert_rows("zipf:1.2", 4, 128, cap=64)
    assert z[0] == 64 and sum(z) == 128 and z == sorted(z, reverse=True) and max(z) <= 64
    assert expert_rows("zipf:3", 8, 32, cap=4) == [4] * 8                # every expert at the cap
    with pytest.raises(ValueError, match="cannot go to 4 experts"):
        expert_rows("uniform", 4, 100, cap=20)


def test_dbrx_expert_loop_is_captured_under_the_routing_assumption():
    caps = H.capture_model(config=DBRX, seq=32, say=False)
    for cap in caps:
        # 32 tokens x top-2 = 64 rows; uniform: every expert 16 rows, each expert's GEMMs with M = 16
        note = next(a for a in cap.assumptions if "DbrxExperts loops over the experts" in a)
        assert note.startswith("MoE routing: uniform") and "all 4 experts hit, 16 rows each" in note
        gemms = [c for c in cap.kernel_calls() if ".experts" in c.module and c.family == "gemm"]
        assert sum(c.count for c in gemms) == 2 * 4 * 3     # 2 layers x 4 experts x (w1, v1, w2)
        assert {c.inputs[0].shape[0] for c in gemms} == {16}
        assert not [u for u in cap.uncaptured if "depends on data" in u["reason"]]
        # DBRX's attn_config / ffn_config are parts of the decoder, not towers
        assert not cap.uncaptured
        assert any("the experts modules called aten.mm.default x 24" in a for a in cap.assumptions)


def test_dbrx_under_zipf_routing_gives_the_experts_unequal_rows():
    cap = H.capture_model(config=DBRX, seq=32, say=False, views=("eager",), routing="zipf:1.0")[0]
    ms = sorted((c.inputs[0].shape[0] for c in cap.kernel_calls()
                 if c.module.endswith("experts.mlp") and c.family == "gemm" and c.layer == 0), reverse=True)
    want = expert_rows("zipf:1.0", 4, 64, cap=32)
    assert sorted(set(ms), reverse=True) == sorted(set(want), reverse=True) and max(ms) <= 32


def test_dbrx_under_a_steep_zipf_gives_no_expert_more_rows_than_tokens():
    cap = H.capture_model(config=DBRX, seq=32, say=False, views=("eager",), routing="zipf:1.2")[0]
    ms = [c.inputs[0].shape[0] for c in cap.kernel_calls() if c.module.endswith("experts.mlp") and c.family == "gemm"]
    assert max(ms) == 32


@pytest.mark.parametrize("cfg, tower, cls", [
    (dict(model_type="gemma3", text_config=_tiny("gemma3_text", sliding_window=32),
          vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8)),
     "SiglipVisionModel", "Gemma3ForCausalLM"),
    (dict(model_type="qwen2_5_vl",
          text_config=_tiny("qwen2_5_vl_text", rope_scaling=dict(type="mrope", mrope_section=[2, 3, 3])),
          vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                             patch_size=14)),
     # the vision config's class is named so in transformers 5.25; 5.17 names it Qwen2_5_VLVisionModel
     ("Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VLVisionModel"), "Qwen2_5_VLForConditionalGeneration"),
    (dict(model_type="llava", text_config=_tiny("llama"),
          vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8)),
     "CLIPVisionModel", "LlamaForCausalLM"),
], ids=["gemma3", "qwen2_5_vl", "llava"])
def test_a_vlm_captures_its_text_decoder_and_names_its_tower(cfg, tower, cls):
    cap = H.capture_model(config=cfg, seq=32, say=False, views=("eager",))[0]
    towers = tower if isinstance(tower, tuple) else (tower,)
    assert [u["op"] for u in cap.uncaptured] == ["vision tower"] and cap.uncaptured[0]["module_type"] in towers
    assert any("transformers 5" in a and f" {cls}, parameters fake" in a for a in cap.assumptions), cap.assumptions
    assert cap.layers["count"] == 2
    assert sum(c.count for c in cap.kernel_calls() if c.op == C.SDPA) == 2
    # the decoder's GEMMs: q, k, v, o, gate, up, down in each layer, and the LM head (Qwen2.5's q, k, v
    # have a bias: addmm)
    assert sum(c.count for c in cap.kernel_calls() if c.op in ("aten.mm.default", "aten.addmm.default")) == 2 * 7 + 1


GEMMA3N_TEXT = _tiny("gemma3n_text", intermediate_size=[128, 96], layer_types=["sliding_attention", "full_attention"],
                     sliding_window=32, num_kv_shared_layers=0, hidden_size_per_layer_input=16, laurel_rank=8,
                     altup_num_inputs=4, activation_sparsity_pattern=[0.0, 0.0], vocab_size_per_layer_input=256)


def test_gemma3n_per_layer_intermediate_size_is_accepted_and_captured():
    cap = H.capture_model(config=dict(model_type="gemma3n", text_config=GEMMA3N_TEXT), seq=32, say=False,
                          views=("eager",))[0]
    # each layer's MLP has its own width: [.., 64] x [64, 128] in layer 0, x [64, 96] in layer 1
    widths = {c.layer: c.inputs[1].shape[1] for c in cap.kernel_calls()
              if c.module.endswith("mlp.gate_proj") and c.op == "aten.mm.default"}
    assert widths == {0: 128, 1: 96}
    # the layer count is the decoder layers', not altup_projections.N's
    assert cap.layers["count"] == 2
    # the altup projections counted from their first are named as such, not as decoder layers
    reuse = next((a for a in cap.assumptions if a.startswith("identical layers recorded once")), "")
    assert "altup_projections items 1,2 as item 0" in reuse and "layers 1,1" not in reuse, cap.assumptions
    H.check_config(H.load_config(config=GEMMA3N_TEXT))   # the text config alone passes too


def test_a_per_layer_list_of_the_wrong_length_or_values_is_one_line():
    with pytest.raises(UsageError, match=r"intermediate_size lists 3 values, but num_hidden_layers is 2"):
        H.check_config(H.load_config(config={**GEMMA3N_TEXT, "intermediate_size": [128, 128, 128]}))
    with pytest.raises(UsageError, match=r"intermediate_size must be a positive integer or a list of them"):
        H.check_config(H.load_config(config={**GEMMA3N_TEXT, "intermediate_size": [128, 0]}))
    with pytest.raises(UsageError, match=r"hidden_size must be a positive integer, got \[64\]"):
        H.check_config(H.load_config(config={**GEMMA3N_TEXT, "hidden_size": [64]}))


ERNIE = _tiny("ernie4_5_moe", moe_intermediate_size=32, moe_num_experts=4, moe_k=2, moe_num_shared_experts=1,
              moe_layer_start_index=0, moe_layer_interval=1)


def test_ernie_whatif_counts_what_the_compiled_view_shows():
    eager, compiled = H.capture_model(config=ERNIE, seq=32, say=False)
    je, jc = CV.judge_capture(eager), CV.judge_capture(compiled)
    tc = next(a for a in je.advice if a["rule"] == "torch_compile")
    gemm_ops = ("aten.mm.default", "aten.addmm.default", "aten._grouped_mm.default")
    rows = [(c, n, v) for c, n, v in jc.rows if c.op in gemm_ops]
    assert tc["calls"] == sum(n for _, n, _ in rows)
    assert tc["eligible_after"] == sum(n for _, n, v in rows if v.status == "eligible")
    # the shared experts' down_proj: an addmm (residual add fused) in the compiled view, said as such
    fused = [(c, v) for c, _, v in jc.rows if c.op == "aten.addmm.default"]
    assert fused and all(c.module.endswith("shared_experts.down_proj") for c, _ in fused)
    for c, v in fused:
        assert "bias given" not in v.reason, v.reason
        assert "residual add fused into addmm (Inductor post-grad addmm fusion): addmm has no FlyDSL template" \
            in v.reason
    # eager: the same mm calls, marked, and their aten counts unchanged (what a real eager run dispatches)
    marked = [c for c in eager.kernel_calls() if c.fused == "addmm"]
    assert marked and all(c.op == "aten.mm.default" and c.module.endswith("shared_experts.down_proj") for c in marked)
    # no call without a bias is said to have one
    for j in (je, jc):
        for c, _, v in j.rows:
            if c.op == "aten.mm.default":
                assert "bias given" not in v.reason


def _sdpa_masks_of_a_dynamo_trace(model, **kw) -> list:
    """The ``attn_mask`` shapes (``None`` for none) of every SDPA call in the FX graph Dynamo
    traces of ``model(**kw)`` on the CPU (a backend that keeps the graph and runs it as traced)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=keep, fullgraph=True)(**kw)
    finally:
        torch._dynamo.reset()
    out = []
    for gm in graphs:
        for n in gm.graph.nodes:
            if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target):
                m = n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None)
                out.append(None if m is None else tuple(m.meta["example_value"].shape))
    return out


@pytest.mark.parametrize("with_mask", [True, False], ids=["attention_mask", "no_mask"])
def test_compiled_view_sdpa_mask_is_what_a_dynamo_trace_passes(with_mask):
    import transformers

    cfg = transformers.AutoConfig.for_model(**{**_tiny("llama"), "num_hidden_layers": 1})
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.zeros(2, 16, dtype=torch.long)
    kw = {"input_ids": ids, "use_cache": False}
    if with_mask:
        kw["attention_mask"] = torch.ones(2, 16, dtype=torch.long)
    want = _sdpa_masks_of_a_dynamo_trace(model, **kw)
    cap = C.capture(model, kwargs=kw, view="compiled", device="cpu")
    # the SDPA call keeps its mask as the mask's shape (the attention family's scalars)
    got = [None if c.scalars.get("attn_mask") is None else tuple(c.scalars["attn_mask"])
           for c in cap.calls if c.op == C.SDPA for _ in range(c.count)]
    assert got == want and len(want) == 1, (got, want)
    # transformers 5.25 on torch 2.15 builds an explicit [B, 1, S, S] mask under compile, given a padding
    # mask or not; the eager view (no compile) passes none for plain sequences, as an eager run does
    assert want == [(2, 1, 16, 16)]
    if not with_mask:
        eager = C.capture(model, kwargs=kw, view="eager", device="cpu")
        sd = [c for c in eager.calls if c.op == C.SDPA]
        assert sd and all(c.scalars.get("attn_mask") is None and c.scalars.get("is_causal") for c in sd), \
            [c.scalars for c in sd]
    assert any("torch.compiler.is_compiling() answered True" in a for a in cap.assumptions)
    assert not torch.compiler.is_compiling()   # put back
