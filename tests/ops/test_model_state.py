"""Issue 44, part 1: every state a decode step changes is rewound before each call. Tiny hybrid
configs on the CPU (Mamba/SSM, linear attention, short-conv layers beside attention): two calls
give identical logits, equal to a fresh model's one decode step, and the eager check passes --
where, without the rewind, the second call computes another step."""
from __future__ import annotations

import pytest
import torch

from flyexplore.errors import UsageError
from flyexplore.ops import get_op
from flyexplore.ops.base import RunContext
from flyexplore.ops.model import operator as M
from flyexplore.ops.model import state as S
from flyexplore.run.model_step import model_value

_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=16)
CONFIGS = {
    "llama": dict(model_type="llama"),
    "bamba": dict(model_type="bamba", attn_layer_indices=[1], **_MAMBA2),
    "jamba": dict(model_type="jamba", attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=2, mamba_d_state=8, mamba_expand=2),
    "falcon_h1": dict(model_type="falcon_h1", **{k: v for k, v in _MAMBA2.items() if k != "mamba_d_head"}),
    "lfm2": dict(model_type="lfm2", layer_types=["conv", "full_attention"]),
    "qwen3_next": dict(model_type="qwen3_next", layer_types=["linear_attention", "full_attention"],
                       linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                       linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, head_dim=16),
    "granitemoehybrid": dict(model_type="granitemoehybrid", layer_types=["mamba", "attention"], num_local_experts=0,
                             shared_intermediate_size=128, **_MAMBA2),
    "mamba": dict(model_type="mamba", state_size=8, expand=2),
}
CPU = RunContext(torch.device("cpu"), None)


def _case(name, seq=16, batch=2):
    return get_op("model").case(f"{batch}x{seq}:model={model_value(config={**_BASE, **CONFIGS[name]})},decode")


def _fresh_decode(case, inputs):
    """One decode step of a model built anew from the same seed: a fresh StaticCache, the same
    context prefill, the same new token -- what every rewound call must equal."""
    from transformers import StaticCache

    model = M.build_model(case, "fp32", "cpu", 0)
    extra, name = M._forward_kw(model)
    kw = dict(inputs["kwargs"])
    b, s = case["batch"], case["seq"]
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (b, s), generator=g)
    cache = StaticCache(config=model.config, max_cache_len=s + 1)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{name: cache}, **extra)
        kw[name] = cache
        return M.logits(model(**kw)).float()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_decode_state_is_rewound_and_the_step_repeats(name):
    op = get_op("model")
    case = _case(name)
    inputs = op.make_inputs(case, "fp32", "cpu", 0)
    rw = inputs["rewind"]
    ref = op.reference(case, "fp32", inputs)
    step = op.get_backend("eager").build(case, "fp32", inputs, CPU)
    a, b, c = (M.logits(step()).clone() for _ in range(3))
    assert torch.equal(a, b) and torch.equal(b, c)
    assert torch.equal(a, _fresh_decode(case, inputs))       # the state is the prefill's, not a later step's
    e = op.error(c, ref, case, "fp32")
    assert e["accuracy_ok"] and e["err_rel"] == 0.0
    cols = M.input_columns(case, "fp32", inputs)
    assert cols["state_restore_bytes"] == rw.bytes > 0 and "restored per call" in cols["state_restore"]
    hybrid = name != "llama"
    assert any("conv_states" in n or "recurrent_states" in n for n in rw.names) == hybrid, rw.names
    if name == "llama":                                      # attention only: counters reset, KV not copied
        assert rw.counters == len(rw.dst) == 2 and rw.bytes == 16 and len(rw.kv_slots) == 4


def test_without_the_rewind_a_hybrids_second_call_is_another_step():
    """What the rewind fixes (Bamba's eager variant failed its own check, err_rel 1.17 on the H200):
    with only the attention layers' position counters reset between calls (the rewind before issue
    44), the Mamba layer's conv and SSM states advance and the second call computes another step."""
    op = get_op("model")
    case = _case("bamba")
    inputs = op.make_inputs(case, "fp32", "cpu", 0)
    cache = inputs["kwargs"]["past_key_values" if "past_key_values" in inputs["kwargs"] else "cache"]
    counters = [layer.cumulative_length for layer in cache.layers if torch.is_tensor(getattr(layer, "cumulative_length",
                                                                                             None))]

    def counters_only():
        for t in counters:
            t.fill_(case["seq"])
        with torch.no_grad():
            return M.logits(inputs["model"](**inputs["kwargs"])).clone()

    a, b = counters_only(), counters_only()
    ref = _fresh_decode(case, inputs)
    assert torch.equal(a, ref) and not torch.equal(b, ref)
    assert op.error(b, ref, case, "fp32")["accuracy_ok"] is False   # the check caught it; the rewind fixes it
    inputs["rewind"]()
    step = M.step_fn(inputs["model"], inputs)
    assert torch.equal(M.logits(step()), ref) and torch.equal(M.logits(step()), ref)


class _Cache:
    """A cache object of the test's own: a state updated in place, a counter, a Python position."""

    def __init__(self):
        self.state = torch.ones(4)
        self.counter = torch.tensor(3)
        self.pos = 3
        self.layers = [{"conv": torch.zeros(2)}]


def test_plan_rewind_restores_states_counters_and_python_values():
    c = _Cache()

    def step():
        c.state.mul_(0.5).add_(1.0)
        c.counter.add_(1)
        c.pos += 1
        c.layers[0]["conv"].add_(c.state[:2])
        return c.state * 2 + c.layers[0]["conv"].sum()

    rw = S.plan_rewind(c, step)
    assert sorted(rw.names) == ["counter", "layers[0][conv]", "pos", "state"]
    assert rw.bytes == 4 * 4 + 8 + 2 * 4 and rw.counters == 1
    assert c.pos == 3 and torch.equal(c.state, torch.ones(4))     # left as the prefill left it
    rw()
    first = step()
    rw()
    assert torch.equal(step(), first) and c.pos == 4


def test_a_state_outside_the_cache_or_replaced_is_refused_naming_it():
    c = _Cache()
    outside = torch.zeros(1)

    def drifts():
        outside.add_(1)
        return c.state + outside

    with pytest.raises(UsageError, match="does not repeat.*no cache state moves") as e:
        S.plan_rewind(c, drifts)
    assert "\n" not in str(e.value)

    def replaces():
        c.state = c.state + 1
        return c.state

    with pytest.raises(UsageError, match="decode state state is replaced by a new tensor"):
        S.plan_rewind(c, replaces)
