"""A toy operator for the environment A/B tests: its one backend's work grows with an environment
variable, so an A/B of two environments has an effect known in advance.

``SLOW`` (``ab_ops:SLOW``; workers import it by that name, the tests folder on their path): case
``N`` is a vector of N float32 values, ``work`` computes ``sin`` of it ``REPS`` times (a loop
inside one call, so each call takes about a millisecond on a 2-core machine), where ``REPS`` is
``round(BASE_REPS * (1 + AB_SLOWDOWN))`` and ``AB_SLOWDOWN`` is read from the environment when the
backend is built: ``AB_SLOWDOWN=0.2`` does 20% more work, a 20% regression (``1 / 1.2 = 0.833x``).
The output is the last ``sin``, the same in every environment. Faults, from the environment:
``AB_CRASH=1`` makes the build kill its own process (SIGKILL), ``AB_CRASH=turn`` the 20th call
(a worker that dies mid-case); ``AB_CRASH_ONCE=PATH`` makes the 20th call do it only while the
file ``PATH`` exists, removing it first (one case crashes, the next runs); ``AB_HANG_ONCE=PATH`` makes the build
sleep an hour while ``PATH`` exists (removing it first); ``AB_HANG=1`` always.
"""
import os
import signal
import time

import torch

from flyexplore.ops.base import Operator

BASE_REPS = 40

SLOW = Operator(name="ab_slow", doc="sin of an N-vector, repeated (work grows with AB_SLOWDOWN)",
                dims=("n",), options={}, dtypes=("fp32",))


def _inputs(case, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(case["n"], generator=g, device=device)}


def _error(out, ref, case, dtype):
    rel = float((out.double() - ref).norm() / ref.norm())
    return {"err_rel": rel, "err_tol": 1e-5, "accuracy_ok": rel <= 1e-5}


SLOW.make_inputs = _inputs
SLOW.reference = lambda case, dtype, inputs: torch.sin(inputs["x"].double())
SLOW.error = _error
SLOW.flops = lambda case: float(case["n"])
SLOW.bytes = lambda case, dtype: float(8 * case["n"])


def _once(var: str) -> bool:
    """Whether the file named by ``$var`` exists; it is removed (a fault that happens once)."""
    path = os.environ.get(var)
    if not path or not os.path.exists(path):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


@SLOW.backend("work", "sin, repeated REPS times", baseline=True)
def _work(case, dtype, inputs, ctx):
    if os.environ.get("AB_CRASH") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("AB_HANG") == "1" or _once("AB_HANG_ONCE"):
        time.sleep(3600)

    reps = round(BASE_REPS * (1 + float(os.environ.get("AB_SLOWDOWN", "0"))))
    x = inputs["x"]
    calls = [0]

    def fn():
        calls[0] += 1
        if calls[0] == 20 and (os.environ.get("AB_CRASH") == "turn" or _once("AB_CRASH_ONCE")):
            os.kill(os.getpid(), signal.SIGKILL)
        y = None
        for _ in range(reps):
            y = torch.sin(x)
        return y
    return fn


@SLOW.backend("other", "sin, repeated REPS times (a second backend, for arms named per environment)")
def _other(case, dtype, inputs, ctx):
    return _work(case, dtype, inputs, ctx)
