"""A toy operator whose ``faulty`` backend injects faults, for the engine tests.

Worker processes (and Ray actors) import it by name: ``run_sweep("fault_ops:FAULTS", ...)``
(the tests folder is on ``sys.path``; spawn passes it on, Ray gets it through PYTHONPATH).
The case option ``fault`` chooses what the ``faulty`` backend's build does:

- ``none``: builds ``x * 2``; ``segv``: the process gets SIGSEGV; ``hang``: sleeps an hour;
- ``raise``: a Python exception; ``oom``: an out-of-memory error (the text torch's CUDA
  allocator raises); ``kill``: sleeps after writing its pid to ``$FAULT_DIR/kill.pid``, so that
  the test can ``kill -9`` it from outside;
- ``wait``: sleeps until a file ``$FAULT_DIR/go`` exists (at most 10 minutes), then builds
  ``x * 2``: the test decides when the case ends.

Every build of ``faulty`` appends ``pid fault`` to ``$FAULT_DIR/pids`` when ``FAULT_DIR`` is
set. ``FAULTS_OFF=1``, or a file ``$FAULT_DIR/off``, turns every fault off (a retry that
succeeds).

**Start faults** hit a worker process while it starts, at its import of this module (a
worker's ``CaseRunner`` resolves the operator before it reports ready); the driver, which
imports it too, is never hit (only a process with a ``multiprocessing`` parent is, so neither
are Ray actors). A file ``$FAULT_DIR/start.<place>`` (the worker place, e.g. ``start.cpu1``:
only that place's workers) or ``$FAULT_DIR/start`` (any worker) holds words, one taken per
worker start (the place's file first; the file is locked, so concurrent starts each take
their own word): ``ok`` starts normally, ``exit`` writes a line to stderr and exits with code
1, ``stop`` stops the process with SIGSTOP (a worker hung at start, as in a CUDA/HIP
initialisation that never returns), ``raise`` raises ``ImportError`` (the operator cannot be
imported: the worker's ``fatal`` message). No word left: a normal start. Each start fault
appends ``pid start-<word>`` to ``$FAULT_DIR/pids`` first.
"""
import fcntl
import multiprocessing
import os
import signal
import sys
import time

import torch

from flyexplore.ops.base import Operator


def _take_start_fault(d: str) -> str | None:
    """The next start-fault word for this worker process (see the module text), or None."""
    place = multiprocessing.current_process().name.removeprefix("flyexplore-")
    for name in (f"start.{place}", "start"):
        path = os.path.join(d, name)
        if not os.path.exists(path):
            continue
        with open(path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            words = f.read().split()
            if not words:
                continue
            f.seek(0)
            f.truncate()
            f.write(" ".join(words[1:]))
        return words[0]
    return None


def _start_fault() -> None:
    d = os.environ.get("FAULT_DIR")
    if not d or multiprocessing.parent_process() is None:
        return
    word = _take_start_fault(d)
    if word in (None, "ok"):
        return
    with open(os.path.join(d, "pids"), "a") as f:
        f.write(f"{os.getpid()} start-{word}\n")
    if word == "exit":
        print("injected start fault: exit at import", file=sys.stderr, flush=True)
        os._exit(1)
    elif word == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif word == "raise":
        raise ImportError("injected start fault: this worker cannot import fault_ops")
    else:
        raise ValueError(f"unknown start fault {word!r} in {d}")


_start_fault()

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
        elif fault == "wait":
            go = os.path.join(d, "go")
            deadline = time.monotonic() + 600
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.05)
        elif fault == "kill":
            with open(os.path.join(d, "kill.pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.replace(os.path.join(d, "kill.pid.tmp"), os.path.join(d, "kill.pid"))
            time.sleep(3600)
    x = inputs["x"]
    return lambda: x * 2
