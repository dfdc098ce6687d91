"""Where the cases of a sweep run: this process, worker processes (one per GPU), or Ray actors.

A FlyDSL JIT build or a Triton autotune candidate can segfault or fault the GPU, a compile can
hang, and on ROCm a deferred HIP error surfaces in a later, unrelated call. So on a GPU the
cases of :func:`flyexplore.run.sweep.run_sweep` run in **worker processes** by default:

- One long-lived worker per device (``spawn`` start method: CUDA/HIP cannot be used after
  ``fork``), each pinned so that it sees exactly one GPU, and replaced after a crash, a
  time-out, a sticky device error (:data:`STICKY_ERRORS`: the context is unusable after one) or
  :data:`MAX_CASES` cases (against leaks). The unit of work is one case
  (:func:`flyexplore.run.cases.run_case`): all backends of a case run in one worker, because they
  are timed interleaved.
- A worker that dies mid-case gives each backend of its case not yet written a ``crashed`` row
  (the signal or exit code and the last lines of its stderr); a case that runs past
  ``case_timeout`` seconds (compile included; default :data:`CASE_TIMEOUT_S`, 0 = none) gives
  ``timeout`` rows and its worker is killed (its whole process group: Inductor's and Triton's
  compile subprocesses too) and replaced. The sweep goes on.
- Only the driver (the calling process) writes: one journal, one result file, one progress bar.
- Cases are handed out dynamically, most expensive first (:func:`flyexplore.run.cases.case_cost`:
  FLOPs, else bytes): an idle worker takes the next most expensive case, so shards balance by
  cost, not by count (with one worker the plan's order is kept).
- Ctrl-C (``KeyboardInterrupt`` in the driver) stops every worker; the finished rows are kept.

Pinning (``devices``): on NVIDIA each worker gets ``CUDA_VISIBLE_DEVICES`` = its GPU; on ROCm
``HIP_VISIBLE_DEVICES`` = its GPU and ``CUDA_VISIBLE_DEVICES`` removed, and
``ROCR_VISIBLE_DEVICES`` is never set: HIP masks devices *after* ROCr, relative to the ROCr-visible
list, so setting both to the same physical index can leave no GPU at all (Parsl/parsl#3858:
``ROCR_VISIBLE_DEVICES=1 CUDA_VISIBLE_DEVICES=1`` -> torch sees 0 GPUs; the same trap is
ray-project/ray#46563, and Ray itself moved to ``HIP_VISIBLE_DEVICES`` in ray-project/ray#51104
and refuses ``ROCR_VISIBLE_DEVICES``, ray-project/ray#53737). Device numbers are torch's indices
in the driver: a ``CUDA_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES`` the driver already has is
mapped through (``--devices 1`` under ``CUDA_VISIBLE_DEVICES=4,5`` pins physical GPU 5); an
inherited ``ROCR_VISIBLE_DEVICES`` is left as it is (HIP indices are relative to it). Every
row carries the physical GPU in ``device_id`` (NVML UUID or PCI bus id,
:func:`flyexplore.run.cases.physical_device_id`) and the worker in ``worker``.

On the CPU the default is in-process: starting a process that imports torch takes 5-10 s on a
small machine (measured: ~8 s for ``import torch`` on the 2-core CI machine) while a CPU sweep
is short and its backends (ATen, Inductor's C++) do not fault a device. ``workers=N`` (CLI
``--workers N``) runs N CPU worker processes (sharding and fault isolation on the CPU, used by
the tests); their times share the machine's cores.

``engine="ray"`` runs the same case function in Ray actors (``num_gpus=1`` each on GPUs) on an
existing cluster (``ray_address``) or a local Ray instance, with the same row semantics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flyexplore.ops.base import RunContext
from flyexplore.run.cases import physical_device_id, run_case
from flyexplore.run.spec import SweepSpec, gpu_indices, op_ref, resolve_op
from flyexplore.world import env as ENV

#: Default limit of one case in a worker, compile and autotune included, s: generous (an
#: Inductor max-autotune GEMM compile takes minutes; a hang takes forever).
CASE_TIMEOUT_S = 900.0
#: Default limit from a worker's start to its ready message, s (``--worker-start-timeout``):
#: sized for a GPU worker's ``import torch`` plus CUDA/HIP initialisation, which on a loaded
#: 8-GPU host can take a minute or more; a worker stuck there is killed and started again.
WORKER_START_TIMEOUT_S = 300.0
#: Attempts to start a worker place before its remaining cases become ``crashed`` rows.
START_ATTEMPTS = 3
#: Default number of cases a worker runs before it is replaced (against leaks of device memory,
#: compile caches and file handles).
MAX_CASES = 50
#: Texts of errors after which a GPU context cannot be trusted (CUDA/HIP errors are sticky; on
#: ROCm a deferred one surfaces in a later call, pytorch/pytorch#194498): the worker that saw
#: one in a row's message is replaced after that case.
STICKY_ERRORS = ("cuda error", "hip error", "hiperror", "illegal memory access",
                 "device-side assert", "unspecified launch failure", "memory access fault")
#: Lines of a dead worker's stderr kept in its ``crashed`` rows.
STDERR_LINES = 5


@dataclass(frozen=True)
class CaseSettings:
    """What every worker needs, the same for every case: the operator's import reference
    (:func:`flyexplore.run.spec.op_ref`) and :func:`flyexplore.run.cases.run_case`'s options,
    from a :class:`~flyexplore.run.spec.SweepSpec` (:meth:`of`)."""

    op: str
    order: str
    timer_opts: dict
    trace: bool
    seed: int
    band: float
    baseline: str | None

    @classmethod
    def of(cls, spec: SweepSpec) -> CaseSettings:
        """The settings of ``spec``'s workers. Raises :class:`~flyexplore.errors.UsageError` for
        an operator a worker cannot import (:func:`flyexplore.run.spec.op_ref`)."""
        return cls(op_ref(spec.plan.op), spec.order, dict(spec.timer), spec.trace, spec.seed, spec.band,
                   spec.baseline)


@dataclass(frozen=True)
class Task:
    """One case to run: its position in the plan, the :class:`~flyexplore.ops.base.Case`,
    dtype, backends (all timed together) and expected cost (FLOPs or bytes)."""

    index: int
    case: Any
    dtype: str
    backends: tuple[str, ...]
    cost: float


def pin_env(index: int, environ=None, rocm: bool | None = None) -> dict[str, str | None]:
    """Environment changes that make a worker see only torch GPU ``index`` of this process
    (``None`` = remove the variable). NVIDIA: ``CUDA_VISIBLE_DEVICES``; ROCm:
    ``HIP_VISIBLE_DEVICES`` and no ``CUDA_VISIBLE_DEVICES`` (HIP reads both), never
    ``ROCR_VISIBLE_DEVICES`` (see the module text). A list already set in ``environ`` (default
    ``os.environ``) is mapped through, so the index stays torch's."""
    import torch

    env = os.environ if environ is None else environ
    if rocm is None:
        rocm = bool(getattr(torch.version, "hip", None))
    if rocm:
        parent = env.get("HIP_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES")
        ids = [x.strip() for x in parent.split(",") if x.strip()] if parent else None
        return {"HIP_VISIBLE_DEVICES": ids[index] if ids else str(index), "CUDA_VISIBLE_DEVICES": None}
    parent = env.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in parent.split(",") if x.strip()] if parent else None
    return {"CUDA_VISIBLE_DEVICES": ids[index] if ids else str(index)}


@contextlib.contextmanager
def _environ(changes: dict[str, str | None]):
    def apply(values: dict[str, str | None]) -> None:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    old = {k: os.environ.get(k) for k in changes}
    try:
        apply(changes)
        yield
    finally:
        apply(old)


# -- the worker side ----------------------------------------------------------------------------

class CaseRunner:
    """Runs cases in a worker (a process or a Ray actor): resolves the operator, sets up the
    device and environment once, and answers :meth:`run` for each :class:`Task`."""

    def __init__(self, settings: CaseSettings, device: str = "cpu", env=None, threads: int | None = None,
                 label: str = "worker"):
        import torch


        if threads:
            torch.set_num_threads(threads)
        self.settings = settings
        self.op = resolve_op(settings.op)
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.env = env if env is not None else ENV.collect()
        self.ctx = RunContext(self.device, self.env)
        torch.ones(2, 2) @ torch.ones(2, 2)  # loads the CPU BLAS now, not in the first case's time limit
        self.info = {"pid": os.getpid(), "device_id": physical_device_id(self.device),
                     "fp": {**self.env.fingerprint(), "flyexplore": self.env.versions.get("flyexplore", "")},
                     "worker": f"{label}/pid{os.getpid()}"}

    def run(self, task: Task):
        """Yield ``(backend, row columns)`` for ``task`` (:func:`flyexplore.run.cases.run_case`)."""

        s = self.settings
        yield from run_case(self.op, task.case, task.dtype, task.backends, self.ctx, order=s.order,
                            timer_opts=s.timer_opts, trace=s.trace, seed=s.seed, band=s.band,
                            baseline=s.baseline)


def sticky(cols: dict) -> bool:
    """Whether a row's message shows an error after which the worker's GPU context cannot be
    trusted (:data:`STICKY_ERRORS`)."""
    msg = str(cols.get("message") or "").lower()
    return cols.get("status") in ("error", "oom") and any(s in msg for s in STICKY_ERRORS)


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(3)


def _worker_main(conn, settings: CaseSettings, device: str, env, threads, label: str, log_path: str,
                 ppid: int) -> None:
    """Entry point of a local worker process (spawned): its own process group (the driver
    kills the group; a terminal's Ctrl-C goes to the driver only), stderr into ``log_path``
    (the driver quotes its tail in ``crashed`` rows), faulthandler on (a segfault writes the
    Python stack there; with ``FLYEXPLORE_DEBUG`` set, stderr stays the driver's), exit when
    the driver goes away."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    faulthandler.enable(all_threads=True)
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True).start()
    try:
        runner = CaseRunner(settings, device, env, threads, label)
    except BaseException as exc:  # noqa: BLE001 - told to the driver, which stops the sweep
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", runner.info))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        retire = False
        for b, cols in runner.run(task):
            retire = retire or sticky(cols)
            conn.send(("row", task.index, b, cols))
        conn.send(("done", task.index, retire))
        if retire:
            return


# -- the driver side ----------------------------------------------------------------------------

def _exit_text(code) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _tail(path: str | None, n: int = STDERR_LINES) -> str:
    """The informative end of a dead worker's stderr: after a fatal signal, faulthandler's
    ``Fatal Python error`` line and the innermost frames; else the last ``n`` lines; each line
    cut to 200 characters (faulthandler's list of extension modules is left out)."""
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f.read()[-50000:].splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln[:200] for ln in lines if not ln.startswith("Extension modules:")]
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")]
    if fatal:
        i = fatal[-1]
        frames = [ln for ln in lines[i + 1:] if ln.startswith("File ")]
        return " | ".join([lines[i], *frames[:n - 1]])
    return " | ".join(lines[-n:])


class _Slot:
    """One local worker place: a device (and its pinning) that a process is started for."""

    def __init__(self, label, device, env_changes, env, threads):
        self.label, self.device, self.env_changes, self.env, self.threads = label, device, env_changes, env, threads
        self.proc = self.conn = self.info = self.task = None
        self.started = 0.0
        self.pending: list[str] = []
        self.cases = 0
        self.log = None
        self.spawns = 0


def _slots(device, devices, workers, env) -> list[_Slot]:
    """The local worker places of a sweep: one per GPU of ``devices`` (or the sweep's GPU), or
    ``workers`` CPU places."""

    if devices is not None or device.type == "cuda":
        idx = gpu_indices(devices) if devices is not None else [device.index or 0]
        out = []
        for i in idx:
            e = env
            if env is not None and env.platform != "cpu" and i < len(env.devices):
                e = dataclasses.replace(env, devices=(env.devices[i],))
            out.append(_Slot(f"cuda:{i}", "cuda:0", pin_env(i), e, None))
        return out
    n = workers or 1
    threads = max(1, (os.cpu_count() or 1) // n)
    return [_Slot(f"cpu{i}", "cpu", {}, env, threads) for i in range(n)]


def limits(case_timeout: float | None, max_cases: int | None) -> tuple[float, int]:
    """``(case time limit s, cases per worker)`` with the defaults :data:`CASE_TIMEOUT_S` and
    :data:`MAX_CASES` for ``None`` (a limit of 0 means none)."""
    return (CASE_TIMEOUT_S if case_timeout is None else float(case_timeout),
            MAX_CASES if max_cases is None else int(max_cases))


def run_tasks(tasks: Sequence[Task], settings: CaseSettings, kind: str, *, device, env, devices=None,
              workers=None, case_timeout=None, max_cases=None,
              emit: Callable, should_stop: Callable | None = None,
              status: Callable[[str], Any] | None = None) -> None:
    """Run ``tasks`` on local worker processes (``kind="local"``; Ray actors are
    :func:`flyexplore.run._ray.run_ray`'s, which the sweep calls itself), calling
    ``emit(task, backend, row columns, worker info)`` in the driver for every row, including the
    ``crashed`` and ``timeout`` rows made here. ``case_timeout`` None = :data:`CASE_TIMEOUT_S`,
    0 = no limit; ``max_cases`` None = :data:`MAX_CASES`. ``should_stop()`` is checked before
    each case is handed out. Raises ``RuntimeError`` when a worker cannot start (its stderr
    tail in the message); ``KeyboardInterrupt`` after stopping every worker."""
    if not tasks:
        return
    limit, max_cases = limits(case_timeout, max_cases)
    if kind != "local":
        raise ValueError(f"run_tasks runs local workers; executor {kind!r} is flyexplore.run._ray.run_ray's")
    slots = _slots(device, devices, workers, env)
    queue = list(tasks)
    if len(slots) > 1:  # most expensive first, to whichever worker is free (LPT, dynamic)
        queue.sort(key=lambda t: -t.cost)
    _Pool(slots, settings, limit, max_cases, emit, should_stop, status).run(queue)


class _Pool:
    def __init__(self, slots, settings, limit, max_cases, emit, should_stop, status):
        import multiprocessing as mp

        self.mp = mp.get_context("spawn")
        self.slots, self.settings, self.limit, self.max_cases = slots, settings, limit, max_cases
        self.emit, self.should_stop, self.status = emit, should_stop, status
        self.logdir = tempfile.TemporaryDirectory(prefix="flyexplore-workers-")
        self.debug = bool(os.environ.get("FLYEXPLORE_DEBUG"))

    def start(self, s: _Slot) -> None:
        parent, child = self.mp.Pipe()
        s.spawns += 1
        s.log = None if self.debug else os.path.join(self.logdir.name, f"{s.label.replace(':', '')}-{s.spawns}.log")
        p = self.mp.Process(target=_worker_main, name=f"flyexplore-{s.label}",
                            args=(child, self.settings, s.device, s.env, s.threads, s.label, s.log or "",
                                  os.getpid()))
        with _environ(s.env_changes):
            p.start()
        child.close()
        s.proc, s.conn, s.info, s.task, s.cases, s.pending = p, parent, None, None, 0, []

    def kill(self, s: _Slot) -> None:
        p = s.proc
        if p is None:
            return
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        p.join(10)
        with contextlib.suppress(OSError):
            s.conn.close()
        s.proc = s.conn = None

    def retire(self, s: _Slot, queue) -> None:
        """Stop a worker that finished normally (it exits on ``None``); start another if work is left."""
        with contextlib.suppress(OSError):
            s.conn.send(None)
        s.proc.join(2)
        self.kill(s)
        if queue and not self.stopping:
            self.start(s)

    def fail_case(self, s: _Slot, status: str, message: str) -> None:
        t = s.task
        info = s.info or {}
        for b in s.pending:
            self.emit(t, b, {"status": status, "message": message}, info)
        s.task, s.pending = None, []

    def handle(self, s: _Slot, msg, queue) -> None:
        kind = msg[0]
        if kind == "ready":
            s.info = msg[1]
        elif kind == "fatal":
            raise RuntimeError(f"worker {s.label} could not start: {msg[1]}")
        elif kind == "row":
            _, _, b, cols = msg
            if b in s.pending:
                s.pending.remove(b)
                self.emit(s.task, b, cols, s.info)
        elif kind == "done":
            s.task, s.pending = None, []
            s.cases += 1
            if msg[2] or s.cases >= self.max_cases:
                self.retire(s, queue)

    def run(self, queue: list) -> None:
        from multiprocessing.connection import wait

        self.stopping = False
        try:
            for s in self.slots:
                self.start(s)
            while True:
                if not self.stopping and self.should_stop is not None and queue and self.should_stop():
                    self.stopping = True
                for s in self.slots:
                    if s.proc is not None and s.info is not None and s.task is None and queue and not self.stopping:
                        t = queue.pop(0)
                        try:
                            s.conn.send(t)
                        except OSError:  # died just now: the case goes back, the death is handled below
                            queue.insert(0, t)
                            continue
                        s.task, s.pending, s.started = t, list(t.backends), time.monotonic()
                        if self.status:
                            self.status(f"{t.case.label} {t.dtype} on {s.label}")
                busy = [s for s in self.slots if s.task is not None]
                if not busy and (not queue or self.stopping):
                    break
                live = [s for s in self.slots if s.proc is not None]
                if not live:
                    break
                now = time.monotonic()
                waits = [s.started + self.limit - now for s in busy] if self.limit > 0 else []
                timeout = max(0.0, min(waits)) if waits else None
                ready = wait([s.conn for s in live] + [s.proc.sentinel for s in live], timeout)
                for s in live:
                    if s.proc is None:
                        continue
                    if s.conn in ready or s.proc.sentinel in ready:
                        try:
                            while s.conn is not None and s.conn.poll():
                                self.handle(s, s.conn.recv(), queue)
                        except (EOFError, OSError):
                            pass
                    if s.proc is not None and not s.proc.is_alive():
                        self.dead(s, queue)
                now = time.monotonic()
                for s in self.slots:
                    if s.task is not None and self.limit > 0 and now - s.started > self.limit:
                        self.kill(s)
                        self.fail_case(s, "timeout", f"case ran past --case-timeout {self.limit:g} s "
                                       "(compile included); its worker was killed and replaced")
                        if queue and not self.stopping:
                            self.start(s)
        finally:
            for s in self.slots:
                self.kill(s)
            self.logdir.cleanup()

    def dead(self, s: _Slot, queue) -> None:
        code = s.proc.exitcode
        tail = _tail(s.log)
        if s.info is None and s.task is None:
            self.kill(s)
            raise RuntimeError(f"worker {s.label} died while starting ({_exit_text(code)})"
                               + (f": {tail}" if tail else ""))
        if s.task is not None:
            self.fail_case(s, "crashed", f"worker crashed ({_exit_text(code)}) in this case"
                           + (f"; last stderr: {tail}" if tail else ""))
        self.kill(s)
        if queue and not self.stopping:
            self.start(s)
