"""A toy operator whose ``faulty`` backend injects faults, for the engine tests.

Worker processes (and Ray actors) import it by name: ``run_sweep("fault_ops:FAULTS", ...)``
(the tests folder is on ``sys.path``; spawn passes it on, Ray gets it through PYTHONPATH).
The case option ``fault`` chooses what the ``faulty`` backend's build does:

- ``none``: builds ``x * 2``; ``segv``: the process gets SIGSEGV; ``hang``: sleeps an hour;
- ``raise``: a Python exception; ``oom``: an out-of-memory error (the text torch's CUDA
  allocator raises); ``kill``: sleeps after writing its pid to ``$FAULT_DIR/kill.pid``, so that
  the test can ``kill -9`` it from outside.

Every build of ``faulty`` appends ``pid fault`` to ``$FAULT_DIR/pids`` when ``FAULT_DIR`` is
set. ``FAULTS_OFF=1``, or a file ``$FAULT_DIR/off``, turns every fault off (a retry that
succeeds).
"""
import os
import signal
import time

import torch

from flyexplore.ops.base import Operator

FAULTS = Operator("faults", "y = x * 2, with injected faults", dims=("m", "n"),
                  options={"fault": "none"}, dtypes=("fp32",))
FAULTS.make_inputs = lambda c, d, dev, seed: {
    "x": torch.randn(c["m"], c["n"], generator=torch.Generator().manual_seed(seed)).to(dev)}
FAULTS.reference = lambda c, d, x: x["x"].double() * 2
FAULTS.error = lambda out, ref, c, d: {"err_rel": float((out.double() - ref).norm() / ref.norm()),
                                       "err_tol": 1e-6}
FAULTS.flops = lambda c: float(c["m"] * c["n"])
FAULTS.bytes = lambda c, d: float(8 * c["m"] * c["n"])


@FAULTS.backend("good", "x * 2", baseline=True)
def _good(case, dtype, inputs, ctx):
    x = inputs["x"]
    return lambda: x * 2


@FAULTS.backend("faulty", "x * 2, or the fault the case names")
def _faulty(case, dtype, inputs, ctx):
    fault = case["fault"]
    d = os.environ.get("FAULT_DIR")
    if d:
        with open(os.path.join(d, "pids"), "a") as f:
            f.write(f"{os.getpid()} {fault}\n")
    off = os.environ.get("FAULTS_OFF") == "1" or bool(d and os.path.exists(os.path.join(d, "off")))
    if not off:
        if fault == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif fault == "hang":
            time.sleep(3600)
        elif fault == "raise":
            raise ValueError(f"injected exception in {case.label}")
        elif fault == "oom":
            raise RuntimeError("CUDA out of memory. Tried to allocate 64.00 GiB (injected)")
        elif fault == "kill":
            with open(os.path.join(d, "kill.pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.replace(os.path.join(d, "kill.pid.tmp"), os.path.join(d, "kill.pid"))
            time.sleep(3600)
    x = inputs["x"]
    return lambda: x * 2
