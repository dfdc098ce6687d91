"""Issue 34 finding 7: a capture grows with its distinct calls, not with the sequence length.

Folding at record time (a loop over the sequence, as transformers' reference Mamba scan is, is
one row per call of the loop body with its count), the offset classes of :meth:`Call.key`,
the fast answers to repeated fake calls (held equal to captures made without them), and the
progress lines (a fake clock: nothing here depends on the machine's speed)."""
from __future__ import annotations

import collections
import io

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flyexplore.insight import capture as C  # noqa: E402
from flyexplore.insight import hf as HF  # noqa: E402
from flyexplore.world.conditions import TensorDesc  # noqa: E402
from tests.insight.test_capture import TINY_LLAMA, TINY_QWEN_MOE  # noqa: E402

TINY_MAMBA = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "state_size": 16, "expand": 2,
              "conv_kernel": 4, "vocab_size": 128}


def _mamba(seq, views=("eager",)):
    return HF.capture_model(config=TINY_MAMBA, phase="prefill", batch=1, seq=seq, views=views, say=False)


def test_mamba_distinct_rows_do_not_grow_with_the_sequence():
    (a,), (b,) = _mamba(64), _mamba(256)
    da, db = a.distinct(), b.distinct()
    assert len(da) == len(db)
    # the scan's per-step calls are one row each, with one count per step and layer, and say so
    moved_a = [(c, n) for c, n in da if C._MOVED in c.note]
    moved = [(c, n) for c, n in db if C._MOVED in c.note]
    assert {c.op for c, _ in moved} >= {"aten.mul.Tensor", "aten.add.Tensor", "aten.bmm.default"}
    assert all(f"{n:,} calls of one loop" in c.note for c, n in moved)
    assert sum(n for _, n in moved) >= 3 * 255 * 2 and sum(n for _, n in moved) > 3.5 * sum(n for _, n in moved_a)
    # rows recorded (views included) do not grow either, while the calls counted do
    assert len(a.calls) == len(b.calls)
    assert b.n_calls() > 3 * a.n_calls()
    assert a.layers["count"] == b.layers["count"] == 2 and a.layers["kinds"][0]["calls"] < b.layers["kinds"][0]["calls"]


@pytest.mark.parametrize("seq", [7, 20])
def test_folded_mamba_capture_counts_the_scan_exactly(seq):
    """The counts stay exact when rows fold: a real CPU run dispatches the scan's per-step calls
    as often as the capture counts them. (Outside the scan a real CPU run and the fake one differ
    in how ``matmul`` lays out the dt projection, mm or bmm, before and after this change alike:
    those few calls are left out here.)"""
    from tests.insight.test_capture import _Count

    cfg = transformers.AutoConfig.for_model(**TINY_MAMBA)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 100, (1, seq))
    with torch.no_grad(), _Count() as real:
        model(input_ids=ids, use_cache=False)
    cap = C.capture(model, kwargs={"input_ids": ids, "use_cache": False}, device="cpu")
    got = cap.aten_counts()
    per_step = {k for k, n in real.c.items() if n >= seq * 2}
    assert {k[0] for k in per_step} >= {"aten.select.int", "aten.mul.Tensor", "aten.add.Tensor", "aten.bmm.default"}
    assert {k: got[k] for k in per_step} == {k: real.c[k] for k in per_step}
    assert sum(got.values()) > seq * 2 * 10 > len(cap.calls) / 4


def _flat(cap):
    return [(c.op, c.inputs, c.outputs, c.module, c.inner, c.count, c.flops, c.bytes) for c in cap.calls]


@pytest.mark.parametrize("config,seq", [(TINY_LLAMA, 40), (TINY_QWEN_MOE, 24), (TINY_MAMBA, 16)],
                         ids=["llama", "qwen3moe", "mamba"])
def test_fast_fake_answers_change_nothing(config, seq, monkeypatch):
    """Captures made with and without :class:`_FastFake` are the same, call for call, both views."""
    fast = HF.capture_model(config=config, phase="prefill", batch=1, seq=seq, say=False)
    monkeypatch.setattr(C, "FAST_FAKE", False)
    slow = HF.capture_model(config=config, phase="prefill", batch=1, seq=seq, say=False)
    for f, s in zip(fast, slow):
        assert _flat(f) == _flat(s)
        assert f.uncaptured == s.uncaptured and f.layers == s.layers


def test_fast_fake_is_used_and_its_memo_is_keyed_without_offsets():
    mode = C.fake_mode()
    ff = C._FastFake(mode)
    with mode:
        x = torch.empty(8, 16, device="cpu")
        a = ff.call(torch.ops.aten.select.int, (x, 0, 3), {})        # a view: answered here
        b = ff.call(torch.ops.aten.select.int, (x, 0, 5), {})
        assert ff.hits == 2 and a.storage_offset() == 48 and b.storage_offset() == 80
        m1 = ff.call(torch.ops.aten.mul.Tensor, (a, b), {})          # first: the mode answers
        assert ff.hits == 2
        m2 = ff.call(torch.ops.aten.mul.Tensor, (b, a), {})          # same shapes, other offsets
        assert ff.hits == 3 and m2.shape == m1.shape and m2.stride() == m1.stride()
        assert type(m2) is type(m1) and m2.device == m1.device and m2.dtype == m1.dtype
        ff.call(torch.ops.aten.add_.Tensor, (m2, m1), {})            # in place: always the mode
        assert ff.hits == 3


def test_call_key_reads_offsets_as_zero_or_not_and_16_byte_alignment():
    def call(off):
        t = TensorDesc((4, 8), torch.bfloat16, (8, 1), off)
        return C.Call("aten.mm.default", "gemm", (t, t), {}, (), "m.layers.0.x", "Linear", 0, 0.0, 0.0)

    assert call(8).key() == call(16).key()          # 16 and 32 bytes: both aligned, both non-zero
    assert call(0).key() != call(8).key()           # zero vs not
    assert call(8).key() != call(4).key()           # 16 vs 8 bytes: alignment differs
    assert C.offset_class(3, 4) == (False, 12)


def test_distinct_says_when_it_folds_offsets():
    t0 = TensorDesc((4,), torch.float32, (1,), 0)
    t1 = TensorDesc((4,), torch.float32, (1,), 4)
    t2 = TensorDesc((4,), torch.float32, (1,), 8)
    mk = lambda t: C.Call("aten.mul.Tensor", None, (t,), {}, (), "m.layers.0.x", "X", 0, 1.0, 1.0)  # noqa: E731
    cap = C.Capture("x", "", "eager", "cuda:0", "gfx950", calls=[mk(t1), mk(t2), mk(t0)])
    (c, n), (c0, n0) = cap.distinct()
    assert n == 2 and "2 calls of one loop" in c.note and C._MOVED in c.note
    assert n0 == 1 and not c0.note


def test_a_declined_decomposition_takes_back_its_folded_counts():
    rec = C._Recorder()
    x = torch.empty(4, 4, device="meta")
    rec.add("aten.mul.Tensor", [("self", x), ("other", x)], x)
    mark, jmark = len(rec.calls), rec.begin()
    rec.add("aten.mul.Tensor", [("self", x), ("other", x)], x)       # folds into the first
    rec.add("aten.add.Tensor", [("self", x), ("other", x)], x)       # a new row
    assert rec.counts == [2, 1]
    rec.rollback(mark, jmark)
    assert rec.counts == [1] and len(rec.calls) == 1 and rec.depth == 0
    rec.add("aten.add.Tensor", [("self", x), ("other", x)], x)
    assert rec.counts == [1, 1]


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_lines_wait_five_seconds_then_come_every_five():
    clock, out = _Clock(), io.StringIO()
    p = C.Progress("Mamba-130m prefill 1x2048 (eager)", 24, clock=clock, stream=out, tty=False)
    for t, calls, path in [(1, 1000, "backbone.layers.0.mixer"), (4.9, 5000, "backbone.layers.1.mixer"),
                           (5.0, 9000, "backbone.layers.2.mixer"), (7, 12000, "backbone.layers.3.mixer"),
                           (9.9, 15000, "backbone.layers.4"), (10.0, 180000, "backbone.layers.10.mixer"),
                           (21.0, 200000, "lm_head")]:
        clock.t = t
        p.tick(calls, path)
    clock.t = 23.0
    p.close(210000)
    lines = out.getvalue().splitlines()
    assert lines == ["flyexplore: capturing Mamba-130m prefill 1x2048 (eager): 9,000 calls, layer 3 of 24, 5 s",
                     "flyexplore: capturing Mamba-130m prefill 1x2048 (eager): 180,000 calls, layer 11 of 24, 10 s",
                     "flyexplore: capturing Mamba-130m prefill 1x2048 (eager): 200,000 calls, 21 s",
                     "flyexplore: captured Mamba-130m prefill 1x2048 (eager): 210,000 calls in 23 s"]


def test_a_short_capture_says_nothing_and_a_terminal_gets_a_bar():
    clock, out = _Clock(), io.StringIO()
    p = C.Progress("x", 2, clock=clock, stream=out, tty=False)
    clock.t = 4.0
    p.tick(10)
    p.close()
    assert out.getvalue() == ""
    clock2, out2 = _Clock(), io.StringIO()
    q = C.Progress("y (eager)", 4, clock=clock2, stream=out2, tty=True)
    clock2.t = 6.0
    q.tick(5000, "model.layers.1.mlp")
    assert q.bar is not None and q.bar.n == 2 and q.bar.total == 4
    q.close()
    assert "flyexplore: capturing y (eager)" in out2.getvalue() and "5,000 calls" in out2.getvalue()


def test_run_step_ticks_the_progress_it_is_given():
    ticks = collections.Counter()

    class Spy(C.Progress):
        def tick(self, calls, path=""):
            ticks["tick"] += 1

        def close(self, calls=None):
            ticks["close"] += 1
            ticks["calls"] = calls

    caps = HF.capture_model(config=TINY_MAMBA, phase="prefill", batch=1, seq=32, views=("eager",), say=False)
    n = caps[0].n_calls()
    assert n > 2048
    desc = HF.load_config(None, TINY_MAMBA)
    model, mode, _ = HF.build(desc)
    step = HF._step(model, mode, "prefill", 1, 32, "cuda:0", "gfx950")
    cap = C.run_step(model, step, mode=mode, progress=Spy("x", 2))
    assert ticks["close"] == 1 and ticks["calls"] == cap.n_calls() == n
    assert ticks["tick"] == n // 1024
    assert C._layer_count(model) == 2


# -- identical layers recorded once (capture._LayerReuse) ----------------------------------------------

def _deep(cfg: dict, layers: int = 6) -> dict:
    """``cfg`` with ``layers`` layers (a ``layer_types`` list repeated to that length)."""
    key = "n_layer" if "n_layer" in cfg else "num_hidden_layers"
    out = {**cfg, key: layers}
    if "layer_types" in cfg:
        out["layer_types"] = [cfg["layer_types"][i % len(cfg["layer_types"])] for i in range(layers)]
    return out


def _rows(cap) -> tuple:
    return (cap.aten_counts(), sorted((c.op, c.module, c.count, c.inner) for c in cap.calls),
            cap.layers["text"], sorted((u["op"], u["module"]) for u in cap.uncaptured))


def _both_ways(cfg, phase="prefill", seq=32, batch=1):
    from flyexplore.insight import hf as HF

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "REUSE_LAYERS", False)
        every = HF.capture_model(config=cfg, phase=phase, batch=batch, seq=seq, say=False)
    once = HF.capture_model(config=cfg, phase=phase, batch=batch, seq=seq, say=False)
    return every, once


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_identical_layers_recorded_once_give_the_capture_of_every_layer(phase):
    # Llama (every layer alike) and Gemma-2 (sliding and full attention alternating, decided at build)
    from tests.insight.test_capture import TINY_LLAMA

    gemma2 = {"model_type": "gemma2", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 6,
              "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 16, "num_attention_heads": 4,
              "max_position_embeddings": 4096, "vocab_size": 512}
    for cfg in (_deep(TINY_LLAMA), gemma2):
        every, once = _both_ways(cfg, phase)
        for a, b in zip(every, once):
            assert _rows(a) == _rows(b), (cfg["model_type"], a.view)
        notes = " ".join(once[0].assumptions)
        assert "identical layers recorded once" in notes, notes
        assert "identical layers recorded once" not in " ".join(every[0].assumptions)
    # gemma2's sliding (even) and full (odd) layers: the odd ones come from layer 1, never from an even one
    assert "layers 3,5 as layer 1" in notes, notes


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mistral", "qwen2", "phi3", "gpt2", "gpt_neox", "olmoe", "granitemoe", "qwen2_moe",
                                  "deepseek_v2", "llama4_text", "mamba", "qwen3_next", "falcon_h1", "jamba",
                                  "diffllama", "gpt_oss"])
def test_layer_reuse_equals_every_layer_on_many_architectures(arch):
    from tests.insight.test_model_agreement import ARCHS

    cfg, seq = ARCHS[arch]
    every, once = _both_ways(_deep(cfg), "prefill", seq)
    for a, b in zip(every, once):
        assert _rows(a) == _rows(b), (arch, a.view)
