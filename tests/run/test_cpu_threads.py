"""On the CPU a case runs with the timing's intra-op threads (:data:`flyexplore.measure.timing.CPU_TIMING_THREADS`)
from its first call on: Dynamo guards on the thread count, so a first call (the compile) made with
the process's own count compiled code that was never timed, and the timed code was compiled again
in the warm-up -- each compiled case of an in-process sweep twice. Both orders, one compile each,
and the process's thread count is as it was after."""
import pytest
import torch
from torch._dynamo.utils import counters

import flyexplore as fx
from flyexplore.measure.timing import CPU_TIMING_THREADS

TIMER = {"interleaved": {"min_rounds": 3, "max_rounds": 4}, "block": {"rep": 3, "warmup": 1}}


@pytest.mark.parametrize("order", ["interleaved", "block"])
def test_a_compiled_cpu_case_is_compiled_once_with_the_timing_threads(order):
    before = torch.get_num_threads()
    torch.set_num_threads(CPU_TIMING_THREADS + 1)   # a process whose own count is not the timing's
    try:
        counters.clear()
        df = fx.sweep("gemm", shapes="64x96x128", dtypes="fp32", backends="aten,inductor", engine="in-process",
                      order=order, timer=TIMER[order], progress=False)
        assert df.set_index("backend")["status"].to_dict() == {"aten": "ok", "inductor": "ok"}
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])   # 2 before: first call, then timed
        assert torch.get_num_threads() == CPU_TIMING_THREADS + 1                   # put back
    finally:
        torch.set_num_threads(before)
