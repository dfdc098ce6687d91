"""Issue 44, part 3 on the CPU: the CUDA/HIP graph variants of the ``model`` family -- their list,
why they are unavailable off a GPU, what each row says of graphs, and the capture's structure:
the step captured holds the decode rewind, so each replay rewinds and steps (run here through a
stand-in for torch's graph calls that replays the captured step on the CPU)."""
from __future__ import annotations

import json

import pytest
import torch

from flyexplore.ops import get_op
from flyexplore.ops.base import RunContext
from flyexplore.ops.model import graph as G
from flyexplore.ops.model import operator as M
from tests.ops.test_model_state import CPU, _case

GRAPH_VARIANTS = ("eager_graph", "eager_flydsl_graph", "compile_graph", "max_autotune_graph",
                  "max_autotune_flydsl_graph")


class ReplayOnCpu:
    """A stand-in for :class:`flyexplore.ops.model.graph.CudaGraphs`: ``capture`` runs the step
    once and keeps it as the "graph"; ``replay`` runs the kept step again and copies its output
    into the captured output's memory, as a replay writes the same buffers. Records its calls."""

    def __init__(self):
        self.calls = []

    def warm_up(self, step, calls):
        self.calls.append(("warm_up", calls))
        for _ in range(calls):
            step()

    def capture(self, step):
        self.calls.append(("capture",))
        out = step()
        return (step, out), out

    def replay(self, graph):
        self.calls.append(("replay",))
        step, out = graph
        with torch.no_grad():
            M.logits(out).copy_(M.logits(step()))   # a replay writes the captured output's memory


def test_the_graph_variants_are_backends_unavailable_on_the_cpu_with_one_line_reasons():
    op = get_op("model")
    assert set(GRAPH_VARIANTS) <= set(op.backends) and list(M.VARIANTS)[-5:] == list(GRAPH_VARIANTS)
    case = _case("llama")
    env = type("Env", (), {"platform": "cpu"})()
    ctx = RunContext(torch.device("cpu"), env)
    for v in GRAPH_VARIANTS:
        why = op.get_backend(v).available(ctx, case, "fp32")
        assert why == "CUDA/HIP graphs need a GPU (torch.cuda.CUDAGraph); this case runs on cpu", (v, why)


def test_every_variant_says_what_it_does_with_graphs():
    assert set(M.GRAPHS) == set(M.VARIANTS)
    for v in M.VARIANTS:
        text = M.graphs_text(v)
        assert text.startswith("none:") == (v not in M.GRAPH_TWINS), (v, text)
    assert "replay" in M.graphs_text("eager_graph") and "graph trees" in M.graphs_text("compile_graph")
    assert M.graphs_text("module-variant") == "not known"
    # compile_graph is mode="reduce-overhead" (torch.compile takes a mode or options, not both)
    from torch._inductor import list_mode_options

    assert M.COMPILE_OPTIONS["compile_graph"] == list_mode_options("reduce-overhead")
    for twin, base in M.GRAPH_TWINS.items():
        if base in M.COMPILE_OPTIONS:
            assert M.COMPILE_OPTIONS[twin] == {**M.COMPILE_OPTIONS[base], "triton.cudagraphs": True}
    assert all(not M.COMPILE_OPTIONS[v]["triton.cudagraphs"] for v in ("compile", "max_autotune", "max_autotune_flydsl"))


def test_a_graph_variants_breakdown_takes_no_module_and_keeps_its_replay_gaps():
    inputs = {"model": torch.nn.Linear(2, 2)}
    assert M.breakdown_kwargs("eager", inputs) == {"module": inputs["model"]}
    assert M.breakdown_kwargs("compile", inputs) == {}
    for v in ("eager_graph", "eager_flydsl_graph", "compile_graph", "max_autotune_flydsl_graph"):
        assert M.breakdown_kwargs(v, inputs) == {"graph": True}


def test_the_captured_step_holds_the_rewind_so_each_replay_is_the_same_step():
    """A Bamba decode (Mamba conv and SSM states) built as ``eager_graph`` over the CPU stand-in:
    warm-up, one capture, then a replay per call, each equal to the eager step; the captured
    callable is the whole step -- a capture of the model call alone (no rewind) drifts."""
    op = get_op("model")
    case = _case("bamba")
    inputs = op.make_inputs(case, "fp32", "cpu", 0)
    ref = op.reference(case, "fp32", inputs)
    api = ReplayOnCpu()
    fn = M._eager_graph_build(case, "fp32", inputs, CPU, api=api)
    assert api.calls == []                                   # captured on the first call, not when built
    outs = [M.logits(fn()).clone() for _ in range(3)]
    assert api.calls == [("warm_up", G.WARMUP_CALLS), ("capture",), ("replay",), ("replay",), ("replay",)]
    assert all(torch.equal(o, ref) for o in outs)
    assert len({id(fn()) for _ in range(2)}) == 1           # the captured output object, overwritten per replay
    # the counterfactual: captured with only the attention counters reset (the rewind before
    # issue 44), the Mamba states advance and each replay is another step
    cache = inputs["kwargs"]["past_key_values" if "past_key_values" in inputs["kwargs"] else "cache"]
    counters = [la.cumulative_length for la in cache.layers if torch.is_tensor(getattr(la, "cumulative_length", None))]

    def counters_only():
        for t in counters:
            t.fill_(case["seq"])
        with torch.no_grad():
            return inputs["model"](**inputs["kwargs"])

    inputs["rewind"]()
    bare = G.graph_replay(counters_only, "cpu", api=ReplayOnCpu())
    drift = [M.logits(bare()).clone(), M.logits(bare()).clone()]
    assert not torch.equal(drift[0], drift[1]) and not torch.equal(drift[0], ref)


def test_a_failed_capture_says_so_in_one_line():
    class Refuses(ReplayOnCpu):
        def capture(self, step):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    fn = G.graph_replay(lambda: torch.zeros(1), "cpu", api=Refuses())
    with pytest.raises(RuntimeError) as e:
        fn()
    assert str(e.value) == ("CUDA/HIP graph capture of the step failed: RuntimeError: CUDA error: operation not "
                            "permitted when stream is capturing")


def test_a_graph_trees_step_returns_a_replay_from_its_first_call():
    n = []

    def step():
        n.append(1)
        return len(n)

    fn = G.trees_step(step)
    assert fn() == G.TREES_CALLS + 1 and fn() == G.TREES_CALLS + 2


def test_a_graph_trees_step_that_inductor_skipped_is_an_error_not_a_graph_row():
    """Where Inductor's counter of CUDA graph skips grows during the first calls, the variant would
    time plain launches under a graph name: its first call raises, saying so (the row is an error)."""
    seen = {"skips": 0}

    def step():
        seen["skips"] += 1          # every call here is one skip
        return 0

    with pytest.raises(RuntimeError, match=r"Inductor skipped CUDA graphs for this step \(3 cudagraph skip"):
        G.trees_step(step, skips=lambda: seen["skips"])()
    # the real counter: compiling on the CPU records no skip, so it stays as it was
    before = G.inductor_skips()
    assert isinstance(before, int) and G.trees_step(lambda: 1)() == 1 and G.inductor_skips() == before


def test_an_eager_graph_of_a_full_sliding_window_is_unavailable_with_the_reason(tmp_path):
    """Gemma-2 (window 16): a decode at context 8 can be captured; at 16 and past it the window rolls
    through a CPU tensor (transformers' StaticSlidingWindowLayer), which a graph capture refuses --
    seen on the lent H100 -- so the eager graph variants say so before anything is built. A prefill,
    and a config whose window is off (Qwen2's use_sliding_window false), are not affected."""
    from types import SimpleNamespace

    cfg = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 16,
           "vocab_size": 256, "max_position_embeddings": 512}
    (tmp_path / "g.json").write_text(json.dumps(cfg))
    (tmp_path / "q.json").write_text(json.dumps({**cfg, "model_type": "qwen2", "use_sliding_window": False}))
    case = lambda f, shape, phase=",decode": get_op("model").case(f"{shape}:model={tmp_path / f}{phase}")  # noqa: E731
    assert M.rolling_window(case("g.json", "2x8")) is None
    why = M.rolling_window(case("g.json", "2x16"))
    assert why.startswith("an eager decode at context 16 fills the sliding window (16)") and "CUDA/HIP graph" in why
    assert M.rolling_window(case("g.json", "2x64", phase="")) is None
    assert M.rolling_window(case("q.json", "2x64")) is None
    gpu = SimpleNamespace(gpu=True, device=torch.device("cuda"))
    op = get_op("model")
    for v in ("eager_graph", "eager_flydsl_graph"):
        assert op.get_backend(v).available(gpu, case("g.json", "2x64"), "bf16") == M.rolling_window(case("g.json", "2x64"))
    assert op.get_backend("compile_graph").available(gpu, case("g.json", "2x64"), "bf16") is None
