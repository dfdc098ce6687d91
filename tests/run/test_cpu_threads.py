"""On the CPU a case runs with the timing's intra-op threads (:data:`flyexplore.measure.timing.CPU_TIMING_THREADS`)
from its first call on: Dynamo guards on the thread count, so a first call (the compile) made with
the process's own count compiled code that was never timed, and the timed code was compiled again
in the warm-up -- each compiled case of an in-process sweep twice. Both orders, one compile each,
and the process's thread count is as it was after."""
import pytest
import torch

import flyexplore as fx
from flyexplore.measure.timing import CPU_TIMING_THREADS

TIMER = {"interleaved": {"min_rounds": 3, "max_rounds": 4}, "block": {"rep": 3, "warmup": 1}}


# block order in the full suite only (the fast lane keeps the default order: 3 CPU-s a compile)
@pytest.mark.parametrize("order", ["interleaved", pytest.param("block", marks=pytest.mark.slow)])
def test_a_compiled_cpu_case_is_compiled_once_with_the_timing_threads(order):
    from torch._dynamo.utils import counters   # here, not at collection: Dynamo's import is 1.2 CPU-s a worker

    before = torch.get_num_threads()
    torch.set_num_threads(CPU_TIMING_THREADS + 1)   # a process whose own count is not the timing's
    try:
        counters.clear()
        df = fx.sweep("gemm", shapes="128x128x128", dtypes="fp32", backends="aten,inductor", engine="in-process",
                      order=order, timer=TIMER[order], progress=False)
        assert df.set_index("backend")["status"].to_dict() == {"aten": "ok", "inductor": "ok"}
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])   # 2 before: first call, then timed
        assert torch.get_num_threads() == CPU_TIMING_THREADS + 1                   # put back
    finally:
        torch.set_num_threads(before)
