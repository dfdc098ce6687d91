"""Issue 44: the ``model`` step's memory estimate from the model itself (meta-device parameters and
StaticCache), the config-dims estimate within 0.8-1.5x of it, and ``layers=N`` on hybrids keeping
a layer of each kind or saying what it dropped."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from flyexplore.ops import get_op  # noqa: E402
from flyexplore.ops.model import layers as L  # noqa: E402
from flyexplore.ops.model import memory as MM  # noqa: E402
from flyexplore.ops.model import operator as M  # noqa: E402
from tests.insight.test_model_agreement import ARCHS  # noqa: E402

_A = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096}
_MAMBA2 = {"mamba_n_heads": 8, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_chunk_size": 32}
#: More architectures: the issue's (DBRX, ERNIE-4.5-MoE, StarCoder2, Nemotron = Minitron's type,
#: Cohere2 = Command-R7B) and hybrids marking layer kinds each their own way.
MORE = {
    "dbrx": {"model_type": "dbrx", "d_model": 128, "n_heads": 4, "n_layers": 2, "vocab_size": 512, "max_seq_len": 4096,
             "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 256, "moe_num_experts": 4, "moe_top_k": 2}},
    "ernie4_5_moe": {"model_type": "ernie4_5_moe", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                     "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 64, "moe_num_shared_experts": 1,
                     "moe_layer_start_index": 1, **_A},
    "starcoder2": {"model_type": "starcoder2", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
                   **_A},
    "nemotron": {"model_type": "nemotron", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
                 "head_dim": 32, **_A},
    "cohere2": {"model_type": "cohere2", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
                "sliding_window": 16, **_A},
    "bamba": {"model_type": "bamba", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
              "attn_layer_indices": [2], **_MAMBA2, **_A},
    "lfm2": {"model_type": "lfm2", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
             "layer_types": ["conv", "conv", "full_attention", "conv"], **_A},
    "granitemoehybrid": {"model_type": "granitemoehybrid", "hidden_size": 128, "intermediate_size": 256,
                         "num_hidden_layers": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
                         "shared_intermediate_size": 128, "layer_types": ["mamba", "mamba", "attention", "mamba"],
                         **_MAMBA2, **_A},
    "jamba8": {**ARCHS["jamba"][0], "num_hidden_layers": 8, "attn_layer_period": 4, "attn_layer_offset": 2},
    "deepseek_v2_4": {**ARCHS["deepseek_v2"][0], "num_hidden_layers": 4, "first_k_dense_replace": 2},
}
ALL = {**{k: v[0] for k, v in ARCHS.items()}, **MORE}
HYBRIDS = ("bamba", "jamba", "jamba8", "lfm2", "qwen3_next", "granitemoehybrid", "deepseek_v2_4")


def _case(tmp_path, name, shape="2x16", phase=",decode", layers=""):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(ALL[name]))
    return get_op("model").case(f"{shape}:model={p}{phase}{layers}")


def _meta_count(case, dtype):
    model, why = MM.meta_model(M.config_of(case), dtype)
    assert model is not None, why
    return model


@pytest.mark.parametrize("name", sorted(ALL))
def test_weights_are_the_meta_models_bytes_and_the_dims_estimate_is_near(tmp_path, name):
    case = _case(tmp_path, name)
    t = M.memory_terms(case, "bf16")
    model = _meta_count(case, "bf16")
    params = list(model.parameters())
    # parameters in bf16 unless the model keeps one in fp32 (DeepSeek's router bias), buffers in their own dtype
    assert sum(p.numel() for p in params if p.dtype == torch.bfloat16) > 0.9 * sum(p.numel() for p in params)
    expect = sum(p.numel() * p.element_size() for p in params) + sum(b.numel() * b.element_size()
                                                                     for b in model.buffers())
    assert t["weights"] == expect and "from the config's dims (transformers" not in t["how"].split(";")[0]
    assert t["total"] == t["weights"] + t["kv_cache"] + t["activations"] and t["kv_cache"] > 0
    ratio = M.model_dims(ALL[name])["params"] / sum(p.numel() for p in params)
    assert 0.8 <= ratio <= 1.5, ratio


@pytest.mark.parametrize("name", ["qwen2", "gpt2", "gemma2", "mamba", "bamba", "lfm2", "qwen3_next", "nemotron"])
def test_real_cpu_build_and_cache_match_the_meta_counts(tmp_path, name):
    """A real fp32 build on the CPU has the meta count's bytes, and the decode step's StaticCache
    after the real prefill (the operator's own inputs) has the cache term's bytes."""
    case = _case(tmp_path, name, shape="2x12")
    t = M.memory_terms(case, "fp32")
    inputs = M._inputs(case, "fp32", "cpu", 0)
    assert MM.module_bytes(inputs["model"]) == t["weights"]
    cache = inputs["kwargs"].get("cache", inputs["kwargs"].get("past_key_values"))
    assert MM._tensor_bytes(MM.cache_tensors(cache)) == t["kv_cache"] > 0


def test_a_config_the_meta_step_cannot_run_falls_back_and_says_so(tmp_path):
    """DBRX with ``clip_qkv`` null clamps with neither bound (transformers raises): the KV cache
    term comes from the dims and the text says why."""
    ALL["dbrx_noclip"] = {**MORE["dbrx"], "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0}}
    case = _case(tmp_path, "dbrx_noclip")
    t = M.memory_terms(case, "bf16")
    assert "KV cache from the config's dims" in t["how"] and t["kv_cache"] == 2 * 2 * 2 * 2 * 17 * 32 * 2
    total, text = M.MODEL.memory(case, "bf16")
    assert total == t["total"] and text.startswith("weights ") and "KV cache from the config's dims" in text


def test_the_issues_dims_fixes():
    d = {n: M.model_dims(ALL[n]) for n in ("starcoder2", "nemotron", "dbrx", "ernie4_5_moe", "cohere2")}
    assert not d["starcoder2"]["gated"] and not d["nemotron"]["gated"] and d["cohere2"]["gated"]
    assert (d["dbrx"]["hidden"], d["dbrx"]["layers"], d["dbrx"]["kv_heads"], d["dbrx"]["experts"],
            d["dbrx"]["top_k"], d["dbrx"]["moe_inter"]) == (128, 2, 2, 4, 2, 256)
    e = d["ernie4_5_moe"]
    assert (e["experts"], e["top_k"], e["moe_inter"], e["shared_inter"], e["moe_layers"]) == (8, 2, 64, 64, 1)
    # Cohere2 ties its embeddings by its config class's default (the raw dict says nothing)
    assert d["cohere2"]["params"] == 4 * (128 * 32 * (2 * 4 + 2 * 2) + 3 * 128 * 256) + 512 * 128


@pytest.mark.parametrize("name", HYBRIDS)
@pytest.mark.parametrize("n", [1, 2])
def test_layers_on_a_hybrid_keep_each_kind_or_say_what_was_dropped(tmp_path, name, n):
    """Each part of a layer (its type, its attention or Mamba mixer, its MoE or dense MLP) of the full
    model is held by some layer of the cut, or the note names it; a cut that drops attention is
    only one where no cut of n layers can hold it and everything else."""
    case = _case(tmp_path, name, phase="", layers=f",layers={n}")
    full = set().union(*map(L._parts, L.layer_kinds(ALL[name])))
    cfg = M.config_of(case)
    got_kinds = L.layer_kinds(cfg)
    got = set().union(*map(L._parts, got_kinds))
    note = M.layers_note(case)
    assert len(got_kinds) == n
    if full <= got:
        if note:
            assert "to hold one of each" in note
    else:
        assert note and "dropping" in note and all(k in note.split("dropping", 1)[1] for k in full - got), note
    assert L._attends(got) or not L._attends(full), (got_kinds, note)   # attention kept (a decode needs it)
    model = M.build_model(case, "fp32", "meta")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_layers_two_keeps_attention_and_mamba_on_bamba_and_experts_on_deepseek(tmp_path):
    bamba = M.config_of(_case(tmp_path, "bamba", phase="", layers=",layers=2"))
    assert bamba["attn_layer_indices"] == [1] and bamba["num_hidden_layers"] == 2
    ds = _case(tmp_path, "deepseek_v2_4", phase="", layers=",layers=2")
    assert M.config_of(ds)["first_k_dense_replace"] == 1 and "first_k_dense_replace=1" in M.layers_note(ds)
    desc = __import__("flyexplore.run.model_step", fromlist=["x"]).capture_config(ds)
    assert any("first_k_dense_replace=1" in s for s in desc["notes"])
    assert "first_k_dense_replace=1" in desc["layers_note"]


def test_two_jamba_layers_hold_attention_mamba_moe_and_mlp(tmp_path):
    """Jamba (attention every 8th layer from offset 4 by default; here 4 layers, attention at 1,
    experts at 1 and 3) cut to 2 layers: attention and Mamba, MoE and dense MLP all fit in two
    layers, so none is dropped."""
    cfg = {**ARCHS["jamba"][0], "num_hidden_layers": 4, "attn_layer_period": 4, "attn_layer_offset": 3,
           "expert_layer_period": 2, "expert_layer_offset": 1}
    (tmp_path / "j.json").write_text(json.dumps(cfg))
    case = get_op("model").case(f"2x16:model={tmp_path / 'j.json'},decode,layers=2")
    kinds = L.layer_kinds(M.config_of(case))
    parts = set().union(*map(L._parts, kinds))
    assert {"JambaAttentionDecoderLayer", "JambaMambaDecoderLayer", "JambaSparseMoeBlock", "JambaMLP"} <= parts, kinds
    assert "dropping" not in (M.layers_note(case) or "")


def test_one_layer_of_a_hybrid_keeps_attention_so_its_decode_runs(tmp_path):
    """Bamba cut to 1 layer keeps its attention layer (the Mamba mixer is named as dropped), and the
    decode step's inputs -- a prefill into the static cache, the rewind planned -- are made: a cut
    with Mamba alone failed there in transformers (``get_mask_sizes`` on linear-attention layers)."""
    case = _case(tmp_path, "bamba", shape="2x8", layers=",layers=1")
    note = M.layers_note(case)
    assert "dropping" in note and "BambaMixer" in note.split("dropping", 1)[1], note
    inputs = M._inputs(case, "fp32", "cpu", 0)
    assert inputs["rewind"] is not None


@pytest.mark.parametrize("interval, start", [(1, 0), (2, 0), (2, 1), (3, 1)])
def test_the_expert_layers_counted_from_the_config_are_the_ones_transformers_builds(interval, start):
    """ERNIE-4.5-MoE places experts where (layer + 1) % moe_layer_interval == 0 within
    moe_layer_start_index..end (transformers 5.25 modeling_ernie4_5_moe.py): the config-dims count
    of expert layers equals the meta model's layers that hold experts."""
    cfg = {**ALL["ernie4_5_moe"], "num_hidden_layers": 5, "moe_layer_interval": interval,
           "moe_layer_start_index": start}
    model, why = MM.meta_model(cfg, "bf16")
    assert model is not None, why
    built = sum(1 for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    g = MM._reader(cfg)
    assert MM._moe_layers(g, 5) == built, (interval, start, built)
