"""Issue 34: what of a Hugging Face model ``flyexplore model`` captures, said in the output.

An independent check found five defects: a BERT config captured as "decode" with no cache and a
Llama-3.2-Vision reported whole with its vision tower and cross-attention layers missing (scope);
positions past GPT-2's ``wpe`` table captured silently while rotary Pythia was refused (positions);
a ``quantization_config`` dropped without a word; transformers' reference code for want of
``mamba_ssm`` / ``flash-linear-attention`` not named; a custom ``model_type`` answered with a
truncated transformers list after 24-42 s. Each is held here to real transformers/torch behaviour
on tiny configs (hidden 64, 2 layers)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import ROOT, run_cli  # noqa: E402
from flyexplore.cli import main  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.insight import hf as HF  # noqa: E402
from flyexplore.insight.capture import SDPA  # noqa: E402
from tests.cli.test_damaged_cli import one_line  # noqa: E402

T = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
     "vocab_size": 512}
LLAMA = dict(T, model_type="llama", num_key_value_heads=2, max_position_embeddings=4096)
BERT = dict(T, model_type="bert", max_position_embeddings=128)
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 128,
        "bos_token_id": 0, "eos_token_id": 0}
OPT = dict(T, model_type="opt", ffn_dim=128, max_position_embeddings=128, word_embed_proj_dim=64)
NEOX = dict(T, model_type="gpt_neox", max_position_embeddings=128)
MLLAMA = {"model_type": "mllama",
          "text_config": dict(T, num_hidden_layers=5, num_key_value_heads=2, pad_token_id=0,
                              cross_attention_layers=[1, 3]),
          "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                            "num_global_layers": 1, "attention_heads": 4, "image_size": 56, "patch_size": 14}}
LLAVA = {"model_type": "llava", "text_config": dict(LLAMA),
         "vision_config": {"model_type": "clip_vision_model", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 56, "patch_size": 14}}
MAMBA = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512, "state_size": 8}
QWEN3_NEXT = dict(T, model_type="qwen3_next", num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
                  linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                  layer_types=["linear_attention", "full_attention"])
#: DeepSeek-V3's published quantization_config (huggingface.co/deepseek-ai/DeepSeek-V3, config.json).
DSV3_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def _cap(cfg, phase="prefill", batch=2, seq=64, view="eager"):
    (cap,) = HF.capture_phases(config=cfg, phases=[(phase, batch, seq)], views=(view,), say=False)
    return cap


def _write(tmp_path, name, cfg):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


# -- 1. scope ---------------------------------------------------------------------------------------

def test_a_decoder_only_model_is_captured_as_before():
    s = HF.model_scope(HF.load_config(config=LLAMA))
    assert (s["kind"], s["notes"], s["uncaptured"], s["no_decode"]) == ("decoder", [], [], None)
    cap = _cap(LLAMA, "decode", 2, 64)
    assert cap.uncaptured == [] and not any("encoder" in a or "multimodal" in a for a in cap.assumptions)


def test_bert_decode_is_refused_in_one_line_and_its_prefill_says_it_is_one_encoder_pass(capsys, tmp_path):
    # the defect: "decode 8x256" ran with no cache (SDPA key [8, 12, 1, 64]) and was labelled decode
    with pytest.raises(UsageError, match=r"^decode: model_type 'bert' is an encoder \(is_decoder false: "
                                         r"BertLMHeadModel keeps no KV cache\)") as e:
        _cap(BERT, "decode", 8, 64)
    assert "\n" not in str(e.value)
    rc = main(["model", "--config", str(_write(tmp_path, "bert.json", BERT)), "--phase", "decode:8x64"])
    one_line(capsys, rc, "model_type 'bert' is an encoder", "prefill")
    cap = _cap(BERT, "prefill", 2, 64)
    assert any(a.startswith("encoder model 'bert' (is_decoder false): transformers' BertLMHeadModel runs one "
                            "bidirectional pass") for a in cap.assumptions), cap.assumptions
    q, k = [c for c in cap.calls if c.op == SDPA][0].inputs[:2]
    assert q.shape[-2] == k.shape[-2] == 64                       # the whole sequence, both sides
    # the generic guard under it: a model whose prefill returns no cache cannot make a decode step
    model, mode, _ = HF.build(HF.load_config(config=BERT))
    with pytest.raises(UsageError, match=r"^decode: BertLMHeadModel returns no KV cache"):
        HF._step(model, mode, "decode", 2, 16, "cuda:0", "gfx950")


@pytest.mark.parametrize("cfg,mt", [({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4}, "t5"),
                                    (dict(T, model_type="bart"), "bart")])
def test_an_encoder_decoder_model_is_refused_in_one_line_before_the_build(cfg, mt, monkeypatch):
    monkeypatch.setattr(HF, "build", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(UsageError) as e:
        _cap(cfg)
    msg = str(e.value)
    assert msg.startswith(f"model_type {mt!r} is an encoder-decoder model (is_encoder_decoder true): flyexplore "
                          "captures decoder-only causal LMs") and "\n" not in msg, msg


def test_a_model_type_with_no_causal_lm_class_is_refused_naming_it():
    with pytest.raises(UsageError, match=r"^model_type 'clip' has no causal-LM class in transformers .*, nor has "
                                         r"its text config \('clip_text_model'\)"):
        HF.model_scope(HF.load_config(config={"model_type": "clip"}))


def test_mllama_lists_its_vision_tower_and_cross_attention_layers_as_not_captured():
    # the defect: Llama-3.2-11B-Vision said "32 layers captured, all identical", silently
    cap = _cap(MLLAMA)
    unc = {u["op"]: u for u in cap.uncaptured}
    assert unc["vision tower"]["module_type"] == "MllamaVisionModel"
    assert unc["vision tower"]["reason"] == "not captured -- flyexplore captures the text decoder (no image input)"
    cross = unc["cross-attention layers 1, 3 (of 5)"]
    assert cross["module_type"] == "MllamaCrossAttentionDecoderLayer" and "no image input" in cross["reason"]
    # and that is what the step really holds: SDPA in layers 0, 2, 4 only
    assert {c.layer for c in cap.calls if c.op == SDPA} == {0, 2, 4}
    assert "multimodal model 'mllama'" in " ".join(cap.assumptions)
    # the layer line does not read as the whole model either
    assert cap.layers["text"].endswith("; not captured: cross-attention layers 1, 3 (of 5)"), cap.layers["text"]


def test_llava_builds_its_text_decoder_and_lists_the_clip_tower():
    cap = _cap(LLAVA, "decode", 2, 32)
    assert "transformers' LlamaForCausalLM) is built and fed text only" in " ".join(cap.assumptions)
    assert [(u["op"], u["module_type"]) for u in cap.uncaptured] == [("vision tower", "CLIPVisionModel")]


# -- 2. positions ------------------------------------------------------------------------------------

def _real(cfg):
    """The model of ``cfg`` built for real on the CPU (fp32, random weights) -- what a run does."""
    c = HF.model_scope(HF.load_config(config=cfg))["config"]
    return transformers.AutoModelForCausalLM.from_config(c).eval()


@pytest.mark.parametrize("cfg,table,usable", [(GPT2, "transformer.wpe [128, 64]", 128),
                                              (OPT, "model.decoder.embed_positions [130, 64] (128 usable positions)",
                                               128)])
def test_positions_past_a_learned_table_are_refused_naming_it_as_a_real_run_fails(cfg, table, usable):
    real = _real(cfg)
    with torch.no_grad():
        real(input_ids=torch.zeros(1, usable, dtype=torch.long))          # fits: runs
        with pytest.raises(IndexError):
            real(input_ids=torch.zeros(1, usable + 1, dtype=torch.long))  # one past: a real run fails
    assert [t["positions"] for t in HF.position_tables(real)] == [usable]
    cap = _cap(cfg, "prefill", 1, usable)
    assert not any(a.startswith("positions:") for a in cap.assumptions)
    with pytest.raises(UsageError) as e:
        _cap(cfg, "prefill", 1, usable + 1)
    assert table in str(e.value) and f"needs {usable + 1} positions" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UsageError, match=f"decode at seq {usable} needs {usable + 1} positions"):
        _cap(cfg, "decode", 1, usable)


def test_rotary_positions_past_max_position_embeddings_are_captured_and_said_not_checked():
    # the defect: Pythia (gpt_neox, rotary) was refused at 2,049 though a real run works
    real = _real(NEOX)
    assert HF.position_tables(real) == []
    with torch.no_grad():
        real(input_ids=torch.zeros(1, 200, dtype=torch.long))               # past 128: a real run works
    cap = _cap(NEOX, "prefill", 1, 200)
    assert ("positions: prefill at seq 200 uses 200 positions, past max_position_embeddings 128; "
            "GPTNeoXForCausalLM has no position table (rotary or ALiBi positions are computed), so they are "
            "captured as computed and not checked against a table -- the model's quality there is not judged"
            ) in cap.assumptions
    assert not any(a.startswith("positions:") for a in _cap(NEOX, "prefill", 1, 128).assumptions)
    with pytest.raises(UsageError, match="past the model's max_position_embeddings 128"):
        HF.check_phase("prefill", 1, 129, 128)                              # the signature others call


# -- 3. quantization_config ------------------------------------------------------------------------

def test_deepseek_v3_fp8_is_named_with_no_flydsl_path_and_captured_unquantized():
    cap = _cap(dict(LLAMA, quantization_config=DSV3_FP8))
    assert ("quantization_config: quant_method 'fp8', block-wise FP8 (float8_e4m3fn, fp32 weight scales per "
            "128x128 block) -- the GEMMs are captured unquantized, as bfloat16: no weights or quantizer are "
            "loaded; in torch 2.15 there is no FlyDSL path for block-wise FP8 with fp32 scales") in \
        " ".join(cap.assumptions)
    assert {c.dtype for c in cap.calls if c.op == "aten.mm.default"} == {"bf16"}


def test_gpt_oss_mxfp4_says_dense_has_a_path_and_the_experts_none():
    n = HF.quantization_note(HF.load_config(hf="gpt-oss-20b")["config"])
    assert n.startswith("quantization_config: quant_method 'mxfp4', MXFP4 (float4_e2m1fn_x2 values, a "
                        "float8_e8m0fnu scale per 32 elements); not quantized: model.layers.*.self_attn")
    assert "expert (grouped) GEMMs have none (aten._scaled_grouped_mm has no FlyDSL path)" in n
    assert HF.quantization_note({"quantization_config": {"quant_method": "gptq", "bits": 4}}).endswith(
        "whether torch 2.15 has a FlyDSL path for it is not judged")
    assert "per-tensor FP8" in HF.quantization_note({"quantization_config": {"quant_method": "fp8"}})
    assert HF.quantization_note(LLAMA) is None


def test_the_quantization_table_holds_to_torch():
    import inspect

    from torch._inductor.kernel import mm, mm_grouped

    # a scaled grouped GEMM never takes the FlyDSL template (checked before any argument is read)
    assert mm_grouped.use_flydsl_grouped_mm_template(None, None, None, True, False, None, None, True,
                                                     scaled=True) is False
    src = inspect.getsource(mm.get_flydsl_mxfp_template_kwargs)
    assert "k % 128 != 0" in src and "float8_e8m0fnu" in src and "k // 32" in src
    assert set(HF.QUANT_FLYDSL) == {"mxfp4", "fp8:block", "fp8", "fbgemm_fp8"}


# -- 4. reference code paths -------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,cls,pkgs", [
    (MAMBA, "MambaMixer", "causal_conv1d and mamba_ssm are"),
    (QWEN3_NEXT, "Qwen3NextGatedDeltaNet", "flash-linear-attention is"),
])
def test_transformers_reference_code_for_want_of_a_kernel_package_is_named(cfg, cls, pkgs):
    from transformers.utils import import_utils as IU

    assert not (IU.is_mamba_ssm_available() or IU.is_causal_conv1d_available()
                or IU.is_flash_linear_attention_available())                 # the packages are missing here
    for view in ("eager", "compiled"):   # transformers warns once a process: the second view still says it
        cap = _cap(cfg, "prefill", 2, 64, view)
        (note,) = [a for a in cap.assumptions if a.startswith(f"{cls} runs transformers' reference PyTorch code (")]
        assert note.endswith(f"{pkgs} not installed here -- the captured calls are the reference path's, which a "
                             "GPU run with those kernels would not make"), note
    assert not any("reference PyTorch code" in a for a in _cap(LLAMA).assumptions)


# -- 5. model types transformers does not know --------------------------------------------------------

CUSTOM = {"model_type": "my_custom", "auto_map": {"AutoConfig": "x.Y", "AutoModelForCausalLM": "x.Z"},
          "hidden_size": 64}


def test_a_custom_model_type_is_one_line_naming_its_auto_map(tmp_path, capsys):
    rc = main(["model", "--config", str(_write(tmp_path, "c.json", CUSTOM))])
    line = one_line(capsys, rc)
    assert line.endswith(": cannot build a config of model_type 'my_custom': it is not a transformers "
                         f"{transformers.__version__} model type; its config names custom code (auto_map x.Y, x.Z), "
                         "which flyexplore never runs"), line
    rc = main(["model", "--config", str(_write(tmp_path, "n.json", {"model_type": "nope_x", "hidden_size": 64}))])
    line = one_line(capsys, rc)
    assert line.endswith(f"cannot build a config of model_type 'nope_x': it is not a transformers "
                         f"{transformers.__version__} model type"), line
    # the reader of transformers' table agrees with transformers' own
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert HF.transformers_model_types() == (transformers.__version__, frozenset(CONFIG_MAPPING_NAMES))


@pytest.mark.slow
def test_a_custom_model_type_exits_2_fast_without_importing_torch(tmp_path):
    cfg = _write(tmp_path, "c.json", CUSTOM)
    t0 = time.perf_counter()
    r = run_cli("model", "--config", str(cfg))
    took = time.perf_counter() - t0
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot build a config of model_type 'my_custom': it is not a transformers" in r.stderr
    assert "(auto_map x.Y, x.Z), which flyexplore never runs" in r.stderr
    assert took < 15, took                                                  # was 24-42 s
    probe = ("import sys; from flyexplore.cli import main; rc = main(['model', '--config', sys.argv[1]]); "
             "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe, str(cfg)], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr)
