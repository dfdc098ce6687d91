"""A model step as CUDA/HIP graph replays: the ``*_graph`` variants of the ``model`` family.

- :func:`graph_replay` (``eager_graph``, ``eager_flydsl_graph``): the eager step captured once in a
  ``torch.cuda.CUDAGraph`` -- warmed up on a side stream, then captured under ``torch.cuda.graph``
  (torch's public API; on ROCm the same calls make HIP graphs). The step captured is the whole
  zero-argument step, the decode cache rewind included (its ``torch._foreach_copy_`` becomes part
  of the graph), so every replay rewinds and steps. A call is ``graph.replay()`` and returns the
  captured (static) output, which the next replay overwrites.
- :func:`trees_step` (``compile_graph``, ``max_autotune_flydsl_graph``): a step compiled with
  Inductor's CUDA graph trees (``triton.cudagraphs=True``; the step calls
  ``torch.compiler.cudagraph_mark_step_begin()`` before the model); its first call runs the
  trees' warm-up and recording runs, so that the output it returns -- the one the check sees --
  is a replay's.

Both capture on the first call, not when built, so a row's ``first_call_ms`` holds the capture
(and the compile) as it holds a compiled variant's compile. The graph calls go through
:class:`CudaGraphs`, the one place torch's graph API is called: a test replaces it with a stand-in
that runs on the CPU (``api=``) to check what is captured.
"""
from __future__ import annotations

from typing import Any, Callable

#: Calls of the step on the side stream before the capture (torch's CUDA graph notes: warm up on
#: a side stream, so that lazy initialisation -- cuBLAS handles, autotuning -- is not captured).
WARMUP_CALLS = 3
#: Calls a CUDA-graph-trees step makes in its first call before the one it returns: Inductor's
#: trees run a new graph once eagerly (warm-up), then record it; the third call replays.
TREES_CALLS = 2


class CudaGraphs:
    """torch's CUDA graph calls (``torch.cuda.Stream``, ``torch.cuda.CUDAGraph``,
    ``torch.cuda.graph``, ``CUDAGraph.replay``) on ``device``: HIP graphs under ROCm torch."""

    def __init__(self, device):
        import torch

        self.device = torch.device(device)

    def warm_up(self, step: Callable[[], Any], calls: int) -> None:
        """Run ``step`` ``calls`` times on a side stream, the current stream waiting for it after."""
        import torch

        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for _ in range(calls):
                step()
        torch.cuda.current_stream(self.device).wait_stream(s)

    def capture(self, step: Callable[[], Any]) -> tuple[Any, Any]:
        """``(graph, static output)``: ``step`` captured once."""
        import torch

        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step()
        return g, out

    def replay(self, graph) -> None:
        """Launch the captured graph once."""
        graph.replay()


def graph_replay(step: Callable[[], Any], device, *, api=None, warmup: int = WARMUP_CALLS) -> Callable[[], Any]:
    """A zero-argument callable whose first call warms ``step`` up (``warmup`` calls on a side
    stream), captures it once and replays it, and each later call replays it: every call returns
    the captured output object, overwritten by each replay (copy what must outlive the next call).
    ``step`` must hold all the work of a call, the decode rewind included: Python code in it runs
    only while capturing, and a replay repeats the kernels it launched then, on the same memory.
    ``api``: the graph calls (default :class:`CudaGraphs` of ``device``). A capture that fails (a
    step that synchronises with the CPU, or makes a CPU tensor, cannot be captured) raises
    ``RuntimeError`` naming the capture and torch's first line."""
    api = api if api is not None else CudaGraphs(device)
    held: dict = {}

    def call():
        if "graph" not in held:
            api.warm_up(step, warmup)
            try:
                held["graph"], held["out"] = api.capture(step)
            except Exception as exc:  # noqa: BLE001 - torch's capture errors are RuntimeErrors of several kinds
                lines = str(exc).strip().splitlines()
                raise RuntimeError(f"CUDA/HIP graph capture of the step failed: {type(exc).__name__}: "
                                   f"{lines[0] if lines else ''}") from None
        api.replay(held["graph"])
        return held["out"]
    return call


def inductor_skips() -> int:
    """How many times Inductor has skipped CUDA graphs in this process
    (``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]``: a mutated input, a CPU
    tensor, an op it cannot capture)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def trees_step(step: Callable[[], Any], calls: int = TREES_CALLS, skips: Callable[[], int] = inductor_skips
               ) -> Callable[[], Any]:
    """A zero-argument callable for a step compiled with Inductor's CUDA graph trees: its first call
    makes ``calls`` calls first (the trees' warm-up and recording runs) and returns the next one's
    output, a replay's; later calls are ``step()``. The output lives in the trees' memory pool
    until the next call (``torch.compiler.cudagraph_mark_step_begin``): the check reads it at once.
    Where Inductor skipped CUDA graphs during those first calls (``skips``: :func:`inductor_skips`
    grew), the first call raises ``RuntimeError`` saying so: the variant would time plain launches
    under a graph variant's name."""
    held = {"first": True}

    def call():
        if held["first"]:
            held["first"] = False
            before = skips()
            for _ in range(calls):
                step()
            out = step()
            n = skips() - before
            if n > 0:
                raise RuntimeError(f"Inductor skipped CUDA graphs for this step ({n} cudagraph skip(s): a mutated or "
                                   "CPU input, or an op it cannot capture): it would run as compile does, without "
                                   "graphs")
            return out
        return step()
    return call
