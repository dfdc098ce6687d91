"""The memory probe's child process (``python -m flyexplore.run.memprobe``): runs cases exactly as
a sweep runs them (:func:`flyexplore.run.cases.run_case`) and reports each one's peak memory.

Started by :func:`flyexplore.run.memory.measure_cases`, which writes one JSON request on stdin
(``op``: a catalogue name or ``module:attribute``; ``device``; ``timer``; ``jobs``: ``[case label,
dtype, [backends]]``) and reads one line per job from stdout, each :data:`~flyexplore.run.memory.MARK`
and a JSON object (``index``, ``peak`` bytes, ``status`` per backend, ``how``, ``context``,
``seconds``, ``message``), flushed as each job ends (a job that kills the child is known by
its missing line).

The peak of a job (:class:`PeakProbe`):

- CPU: ``VmHWM - VmRSS`` of this process (``/proc/self/status``), the high-water mark reset
  before each job by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), after the
  garbage collector and ``malloc_trim(0)`` (glibc) gave back what earlier jobs freed. Where it cannot
  be reset (not Linux), ``ru_maxrss`` (``resource.getrusage``) after the job less the resident
  set before, for the first job only: the others get no line, and the parent starts a new child
  for them.
- GPU: ``torch.cuda.max_memory_reserved()`` after the garbage collector, ``empty_cache`` and
  ``reset_peak_memory_stats``
  (``allocated``: ``max_memory_allocated`` beside it); ``context``: the device's free memory
  before and after this process created its CUDA/HIP context
  (:func:`flyexplore.measure.devstate.free_memory`: NVML on NVIDIA); ``held``: what the driver
  says this process holds after the job (context and the allocator's cache), the same way.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import resource
import sys
import threading
import time

from flyexplore.measure.devstate import free_memory
from flyexplore.ops.base import RunContext
from flyexplore.run.cases import run_case
from flyexplore.run.memory import MARK
from flyexplore.run.plan import resolve_op
from flyexplore.world import env as ENV


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _maxrss() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


class PeakProbe:
    """The peak memory of one job: :meth:`start` before it, :meth:`peak` (bytes) after it;
    ``how`` names what was read; ``resettable``: whether another job can follow in this process."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device
        self.gpu = device.type == "cuda"
        if self.gpu:
            self.how = "torch.cuda.max_memory_reserved (+ context)"
            self.resettable = True
        else:
            self.resettable = self._reset()
            self.how = ("peak RSS growth (VmHWM after clear_refs)" if self.resettable
                        else "peak RSS growth (ru_maxrss, one job per process)")
        self.base = self.base_allocated = 0

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return _status_bytes("VmHWM") is not None
        except OSError:
            return False

    @staticmethod
    def _trim() -> None:
        """Hand back to the system what glibc keeps of freed memory (no-op elsewhere)."""
        gc.collect()
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    def start(self) -> None:
        if self.gpu:
            # an earlier job's tensors held only by reference cycles would be freed by an automatic
            # collection in the middle of this job, and this job would then reuse their blocks and
            # read a peak near 0 (2 MB for an 8192x4096x8192 GEMM, H200): collect them now
            gc.collect()
            c = self.torch.cuda
            c.synchronize(self.device)
            c.empty_cache()
            c.reset_peak_memory_stats(self.device)
            self.base = c.memory_reserved(self.device)
            self.base_allocated = c.memory_allocated(self.device)
        elif self.resettable:
            self._trim()
            self.base = _status_bytes("VmRSS") or 0
            self._reset()
        else:
            self.base = _status_bytes("VmRSS") or _maxrss()

    def peak(self) -> tuple[int, int | None]:
        """``(peak bytes over the job, allocated peak bytes on a GPU else None)``."""
        if self.gpu:
            c = self.torch.cuda
            c.synchronize(self.device)
            return (max(c.max_memory_reserved(self.device) - self.base, 0),
                    max(int(c.max_memory_allocated(self.device)) - self.base_allocated, 0))
        top = _status_bytes("VmHWM") if self.resettable else _maxrss()
        return max(int(top or 0) - self.base, 0), None


def _say(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _watch_parent(ppid: int) -> None:
    """Exit when the parent is gone (killed mid-probe): nobody reads the lines any more."""
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(3)


def main() -> int:
    """Read the request on stdin, run its jobs, write one line per job (see the module text)."""
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        import torch

        req = json.loads(sys.stdin.read())
        op = resolve_op(req["op"])
        dev = torch.device(req["device"])
        if dev.type == "cuda" and dev.index is None:   # "cuda": the current device, 0 in a fresh process
            dev = torch.device("cuda", 0)
        before = None
        if dev.type == "cuda":
            before = free_memory(dev)[0]
            torch.cuda.set_device(dev)
            torch.empty(1, device=dev)
        env = ENV.collect()
        ctx = RunContext(dev, env)
        context = 0
        if before is not None:
            after = free_memory(dev)[0]
            context = max(before - after, 0) if after is not None else 0
        torch.ones(2, 2) @ torch.ones(2, 2)  # the CPU BLAS loaded before the first job, as a sweep worker does
        probe = PeakProbe(dev)
    except Exception as exc:  # noqa: BLE001 - told to the parent, one line
        _say({"fatal": f"{type(exc).__name__}: {str(exc).strip()[:300]}"})
        return 1
    for i, (label, dtype, backends) in enumerate(req["jobs"]):
        if i and not probe.resettable:
            break
        case = op.case(label)
        probe.start()
        t0 = time.perf_counter()
        rows = list(run_case(op, case, dtype, backends, ctx, timer_opts=req.get("timer") or {}))
        seconds = time.perf_counter() - t0
        peak, allocated = probe.peak()
        held = None
        if before is not None:    # the driver's view: what this process holds on the device now
            now = free_memory(dev)[0]
            held = max(before - now, 0) if now is not None else None
        statuses = [cols.get("status") for _, cols in rows]
        msg = "; ".join(f"{b}: {str(cols.get('message') or '')[:200]}" for b, cols in rows if cols.get("status") != "ok")
        _say({"index": i, "peak": peak, "allocated": allocated, "held": held, "status": statuses, "how": probe.how,
              "context": context, "seconds": round(seconds, 3), "message": msg,
              "torch": torch.__version__, "threads": torch.get_num_threads()})
        del rows
    return 0


if __name__ == "__main__":
    sys.exit(main())
