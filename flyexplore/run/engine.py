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
- A case near the memory limit (a :class:`~flyexplore.run.memory.Guard` on its :class:`Task`:
  on the CPU, an estimate over half the limit, :func:`flyexplore.run.memory.memory_check`) has its
  worker's resident set read every :data:`~flyexplore.run.memory.WATCH_S` s: grown past the
  limit, the worker is killed and the case gets ``oom`` rows naming its estimate and the limit. A
  worker killed by SIGKILL in a guarded case, or while the kernel's OOM-kill count
  (``/proc/vmstat``) rose, gives ``oom`` rows too, not ``crashed``.
- A worker has ``start_timeout`` seconds (default :data:`WORKER_START_TIMEOUT_S`, CLI
  ``--worker-start-timeout``) from its spawn to its ready message: on a GPU its start is
  ``import torch`` plus CUDA/HIP initialisation, which can hang. A worker past it is killed (its
  process group) and started again; so is one that dies while starting or whose
  :class:`CaseRunner` raises (its ``fatal`` message). A place is tried :data:`START_ATTEMPTS`
  times in a row (a worker that takes a case resets the count), then given up; the other places
  go on. When no place is left, every case not yet run gets ``crashed`` rows whose message
  says why (``not run: worker cpu0 could not start (3 attempts; last: hung past
  --worker-start-timeout 300 s)``). A failed start never raises: :func:`run_tasks` (and
  :func:`flyexplore.run._ray.run_ray`) return the sweep's problems, one line per given-up place,
  for the sweep to print and exit non-zero on.
- No wait of the driver is unbounded: it waits for its workers at most :data:`POLL_S` at a time,
  and reads their messages without blocking (:class:`_Inbox`: a worker stopped halfway through
  a message cannot stall it), so every limit is seen when it passes.
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
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flyexplore.ops.base import RunContext
from flyexplore.run import frames
from flyexplore.run.build import STICKY_ERRORS  # noqa: F401 - named here too
from flyexplore.run.build import sticky as sticky_text
from flyexplore.run.cases import physical_device_id, run_case
from flyexplore.run.memory import WATCH_S, Guard, oom_death_text, oom_kills, resident_bytes
from flyexplore.run.plan import op_ref, resolve_op
from flyexplore.run.spec import SweepSpec, gpu_indices
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
#: Lines of a dead worker's stderr kept in its ``crashed`` rows.
STDERR_LINES = 5
#: Longest wait for a worker told to stop to exit by itself, s, before it is killed: its exit
#: shuts down what it started (Inductor's pool of compile processes, whose semaphores are
#: registered with the sweep's ``multiprocessing`` resource tracker); a worker killed before
#: then leaves them behind, and the tracker warns of "leaked semaphore objects" at the end.
RETIRE_S = 10.0
#: Longest single wait of the driver for its workers, and of an idle worker for its next case,
#: s: every wait is bounded, so a limit, ``should_stop`` or a vanished driver is seen within it.
POLL_S = 1.0

#: glibc's heap settings for every worker process that measures on the CPU (a sweep's workers,
#: ``--processes``, an environment A/B's workers), unless the environment already sets them: no
#: block from ``mmap`` (``MALLOC_MMAP_MAX_=0``) and no heap returned to the system
#: (``MALLOC_TRIM_THRESHOLD_``), so a call's outputs reuse memory the process already holds. Why: by
#: default glibc serves a block of 128 KiB-32 MiB from fresh pages or from its heap depending on
#: what the process freed before (its mmap threshold moves with each freed block), and fresh pages
#: cost a page fault each 4 KiB, counted in the call's time. Measured on this project's 2-core CPU
#: (issue 45): rmsnorm 2048x2048 fp32 took 4.6 ms a call in a fresh process and 20.5 ms after one
#: earlier 64 MiB allocation was freed (8,160 page faults a call against 0), and two identical A/A
#: workers read 18.3 ms and 3.8 ms for a whole pass; with these settings both read 4-7 ms with
#: no page fault after warm-up. A GPU's caching allocator does the same for device memory.
#: glibc only (musl and macOS ignore the variables); the memory probes set their own.
CPU_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 46)}


def cpu_malloc(environ=None) -> dict[str, str]:
    """The :data:`CPU_MALLOC` variables that ``environ`` (default ``os.environ``) does not set
    already: what a CPU worker's environment gets added."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in CPU_MALLOC.items() if k not in env}


#: The driver's clock for every limit (the tests replace it with one they can move on).
_clock = time.monotonic


@dataclass(frozen=True)
class CaseSettings:
    """What every worker needs, the same for every case: the operator's import reference
    (:func:`flyexplore.run.plan.op_ref`) and :func:`flyexplore.run.cases.run_case`'s options,
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
        an operator a worker cannot import (:func:`flyexplore.run.plan.op_ref`)."""
        return cls(op_ref(spec.plan.op), spec.order, dict(spec.timer), spec.trace, spec.seed, spec.band,
                   spec.baseline)


@dataclass(frozen=True)
class Task:
    """One case to run: its position in the plan, the :class:`~flyexplore.ops.base.Case`,
    dtype, backends (all timed together) and expected cost (FLOPs or bytes); ``guard``: a
    :class:`~flyexplore.run.memory.Guard` when the case is near the memory limit (its worker is
    watched: see :func:`run_tasks`)."""

    index: int
    case: Any
    dtype: str
    backends: tuple[str, ...]
    cost: float
    guard: Guard | None = None


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
                     "fp": {**self.env.fingerprint(), **self.env.code_columns()},
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
    return cols.get("status") in ("error", "oom") and sticky_text(cols.get("message"))


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(3)


def _send_msg(fd: int, msg) -> None:
    """Worker side: one message (a pickle) to the driver's pipe ``fd``, as a frame
    (:func:`flyexplore.run.frames.send`)."""
    frames.send(fd, pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _Inbox(fd: int) -> frames.Inbox:
    """Driver side: the messages of one worker, read from its pipe without ever blocking
    (:class:`flyexplore.run.frames.Inbox` of pickles)."""
    return frames.Inbox(fd, pickle.loads)


def _thread_lock_for_tqdm() -> None:
    """Give tqdm a thread lock in this worker (``tqdm.set_lock``, its public hook). Left alone,
    the first progress bar made here (Inductor's compile bar, even when hidden) creates a
    ``multiprocessing`` RLock that is never freed: its semaphore stays registered with the
    sweep's resource tracker, which warns at the sweep's end that "There appear to be 1 leaked
    semaphore objects" (seen on every ``--workers`` run with ``inductor``, issue 33). A worker
    makes no processes that draw bars, so a thread lock is all it needs."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return
    tqdm.set_lock(threading.RLock())


def _worker_main(tasks, msgs, settings: CaseSettings, device: str, env, threads, label: str, log_path: str,
                 ppid: int) -> None:
    """Entry point of a local worker process (spawned): its own process group (the driver
    kills the group; a terminal's Ctrl-C goes to the driver only), stderr into ``log_path``
    (the driver quotes its tail in ``crashed`` rows), faulthandler on (a segfault writes the
    Python stack there; with ``FLYEXPLORE_DEBUG`` set, stderr stays the driver's), exit when
    the driver goes away. Reads :class:`Task` objects (``None``: stop) from the ``tasks``
    connection and sends its messages (``ready``/``fatal``/``row``/``done``) on ``msgs``
    (:func:`_send_msg`)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    faulthandler.enable(all_threads=True)
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True).start()
    _thread_lock_for_tqdm()
    out = msgs.fileno()
    try:
        runner = CaseRunner(settings, device, env, threads, label)
    except BaseException as exc:  # noqa: BLE001 - told to the driver, which retries the start
        _send_msg(out, ("fatal", f"{type(exc).__name__}: {exc}"))
        return
    _send_msg(out, ("ready", runner.info))
    while True:
        try:
            if not tasks.poll(POLL_S):
                if os.getppid() != ppid:
                    return
                continue
            task = tasks.recv()  # the driver sends a task whole: it is there once poll says so
        except (EOFError, OSError):
            return
        if task is None:
            return
        retire = False
        for b, cols in runner.run(task):
            retire = retire or sticky(cols)
            _send_msg(out, ("row", task.index, b, cols))
        _send_msg(out, ("done", task.index, retire))
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


def start_limit(start_timeout: float | None) -> float:
    """The start-up limit of a worker, s: :data:`WORKER_START_TIMEOUT_S` for ``None``. Raises
    ``ValueError`` for a value that is not a number > 0 (a start always has a limit)."""
    limit = WORKER_START_TIMEOUT_S if start_timeout is None else float(start_timeout)
    if not limit > 0:
        raise ValueError(f"start_timeout must be a number of seconds > 0, got {start_timeout!r}")
    return limit


def hung_text(limit: float) -> str:
    """Why a worker's start failed when it sent no ready message within ``limit`` s."""
    return f"hung past --worker-start-timeout {limit:g} s"


class StartTracker:
    """The start-up failures of a sweep's worker places, local or Ray (one tracker per sweep):
    up to :data:`START_ATTEMPTS` failed starts in a row per place, then the place is given up.
    Gives the ``crashed`` message of the cases no place is left for (:meth:`not_run_message`)
    and the sweep's one-line problems (:meth:`problems`)."""

    def __init__(self, noun: str = "worker"):
        self.noun = noun
        self.fails: dict[str, int] = {}
        self.why: dict[str, str] = {}
        self.given_up: list[str] = []

    def failed(self, label: str, why: str) -> bool:
        """Count a failed start of place ``label`` (``why``: one line, cut to 600 characters);
        True when that was its last attempt (the place is given up)."""
        self.fails[label] = self.fails.get(label, 0) + 1
        self.why[label] = why if len(why) <= 600 else why[:597] + "..."
        if self.fails[label] >= START_ATTEMPTS and label not in self.given_up:
            self.given_up.append(label)
        return label in self.given_up

    def started(self, label: str) -> None:
        """Place ``label`` started (its worker took a case): its count of failures starts again."""
        self.fails[label] = 0

    def not_run_message(self) -> str:
        """The message of the ``crashed`` rows of cases that no place was left to run."""
        why = "; ".join(f"{self.noun} {p} could not start ({self.fails[p]} attempts; last: {self.why[p]})"
                        for p in self.given_up)
        return f"not run: {why or 'no ' + self.noun + ' left'}"

    def problems(self, not_run: int) -> list[str]:
        """One line per given-up place; the last also says how many cases (``not_run``) got
        ``crashed`` rows because of it, the others that the remaining places took their cases."""
        out = []
        for i, p in enumerate(self.given_up):
            text = f"{self.noun} {p} could not start after {self.fails[p]} attempts (last: {self.why[p]})"
            if not_run and i == len(self.given_up) - 1:
                text += f"; {not_run} case{'s' if not_run != 1 else ''} got crashed rows"
            else:
                text += f"; the other {self.noun}s took its cases"
            out.append(text)
        if not_run and not self.given_up:
            out.append(f"{not_run} case{'s' if not_run != 1 else ''} got crashed rows: no {self.noun} left")
        return out


class _Slot:
    """One local worker place: a device (and its pinning) that a process is started for."""

    def __init__(self, label, device, env_changes, env, threads):
        self.label, self.device, self.env_changes, self.env, self.threads = label, device, env_changes, env, threads
        self.proc = self.tasks = self.msgs = self.inbox = self.info = self.task = None
        self.started = self.spawned = 0.0
        self.pending: list[str] = []
        self.cases = 0
        self.log = None
        self.spawns = 0
        self.given_up = False
        self.rss0 = self.oom0 = None


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
    return [_Slot(f"cpu{i}", "cpu", cpu_malloc(), env, threads) for i in range(n)]


def limits(case_timeout: float | None, max_cases: int | None) -> tuple[float, int]:
    """``(case time limit s, cases per worker)`` with the defaults :data:`CASE_TIMEOUT_S` and
    :data:`MAX_CASES` for ``None`` (a limit of 0 means none)."""
    return (CASE_TIMEOUT_S if case_timeout is None else float(case_timeout),
            MAX_CASES if max_cases is None else int(max_cases))


def run_tasks(tasks: Sequence[Task], settings: CaseSettings, kind: str, *, device, env, devices=None,
              workers=None, case_timeout=None, max_cases=None,
              emit: Callable, should_stop: Callable | None = None,
              status: Callable[[str], Any] | None = None, start_timeout: float | None = None) -> list[str]:
    """Run ``tasks`` on local worker processes (``kind="local"``; Ray actors are
    :func:`flyexplore.run._ray.run_ray`'s, which the sweep calls itself), calling
    ``emit(task, backend, row columns, worker info)`` in the driver for every row, including the
    ``crashed`` and ``timeout`` rows made here. ``case_timeout`` (s) None = :data:`CASE_TIMEOUT_S`,
    0 = no limit; ``max_cases`` None = :data:`MAX_CASES`; ``start_timeout`` (s, > 0) from a
    worker's spawn to its ready message, None = :data:`WORKER_START_TIMEOUT_S`. ``should_stop()``
    is checked before each case is handed out and at least every :data:`POLL_S` s.

    A task with a ``guard`` is watched: its worker's resident set grown past the guard's limit
    over the case gets it killed and ``oom`` rows (so does a SIGKILL during a guarded case, or
    one the kernel's OOM killer gave; see the module text).

    A worker place whose start fails (the process died, sent no ready message within
    ``start_timeout``, or its :class:`CaseRunner` raised) is started again, up to
    :data:`START_ATTEMPTS` times in a row, then given up; the other places go on. When no place
    is left, every case not yet run gets ``crashed`` rows (each backend) saying why.

    Returns the sweep's problems, one line each (``[]`` when every place started): e.g.
    ``"worker cpu0 could not start after 3 attempts (last: exit code 1: ...); 4 cases got
    crashed rows"``. Raises ``ValueError`` for an unknown ``kind`` or a ``start_timeout`` <= 0,
    and ``KeyboardInterrupt`` after stopping every worker; a worker's failure never raises."""
    sl = start_limit(start_timeout)
    if kind != "local":
        raise ValueError(f"run_tasks runs local workers; executor {kind!r} is flyexplore.run._ray.run_ray's")
    if not tasks:
        return []
    limit, max_cases = limits(case_timeout, max_cases)
    slots = _slots(device, devices, workers, env)
    queue = list(tasks)
    if len(slots) > 1:  # most expensive first, to whichever worker is free (LPT, dynamic)
        queue.sort(key=lambda t: -t.cost)
    return _Pool(slots, settings, limit, max_cases, emit, should_stop, status, sl).run(queue)


class _Pool:
    def __init__(self, slots, settings, limit, max_cases, emit, should_stop, status, start_limit):
        import multiprocessing as mp

        self.mp = mp.get_context("spawn")
        self.slots, self.settings, self.limit, self.max_cases = slots, settings, limit, max_cases
        self.emit, self.should_stop, self.status = emit, should_stop, status
        self.start_limit = start_limit
        self.starts = StartTracker()
        self.logdir = tempfile.TemporaryDirectory(prefix="flyexplore-workers-")
        self.debug = bool(os.environ.get("FLYEXPLORE_DEBUG"))
        self.stopping = False

    def start(self, s: _Slot) -> None:
        task_r, task_w = self.mp.Pipe(duplex=False)
        msg_r, msg_w = self.mp.Pipe(duplex=False)
        s.spawns += 1
        s.log = None if self.debug else os.path.join(self.logdir.name, f"{s.label.replace(':', '')}-{s.spawns}.log")
        p = self.mp.Process(target=_worker_main, name=f"flyexplore-{s.label}",
                            args=(task_r, msg_w, self.settings, s.device, s.env, s.threads, s.label,
                                  s.log or "", os.getpid()))
        try:
            with _environ(s.env_changes):
                p.start()
        finally:
            task_r.close()
            msg_w.close()
        s.proc, s.tasks, s.msgs, s.inbox = p, task_w, msg_r, _Inbox(msg_r.fileno())
        s.info, s.task, s.cases, s.pending, s.spawned = None, None, 0, [], _clock()

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
        for c in (s.tasks, s.msgs):
            with contextlib.suppress(OSError):
                c.close()
        s.proc = s.tasks = s.msgs = s.inbox = None

    def retire(self, s: _Slot) -> None:
        """Stop a worker that finished normally (it exits on ``None``); the loop starts another
        if work is left."""
        with contextlib.suppress(OSError):
            s.tasks.send(None)
        s.proc.join(RETIRE_S)
        self.kill(s)

    def start_failed(self, s: _Slot, why: str) -> None:
        """The start of ``s``'s worker failed (``why``): kill what is left of it; after the
        last attempt the place is given up, else the loop starts it again."""
        self.kill(s)
        s.info = None
        s.given_up = self.starts.failed(s.label, why)

    def fail_case(self, s: _Slot, status: str, message: str) -> None:
        t = s.task
        info = s.info or {}
        for b in s.pending:
            self.emit(t, b, {"status": status, "message": message}, info)
        s.task, s.pending = None, []

    def handle(self, s: _Slot, msg) -> None:
        kind = msg[0]
        if kind == "ready":
            s.info = msg[1]
        elif kind == "fatal":
            self.start_failed(s, f"raised {msg[1]}")
        elif kind == "row":
            _, _, b, cols = msg
            if b in s.pending:
                s.pending.remove(b)
                self.emit(s.task, b, cols, s.info)
        elif kind == "done":
            s.task, s.pending = None, []
            s.cases += 1
            if msg[2] or s.cases >= self.max_cases:
                self.retire(s)

    def receive(self, s: _Slot) -> None:
        """Handle every complete message ``s``'s worker has sent (never blocks). Bytes that are no
        message (:class:`flyexplore.run.frames.Garbage`) end the worker: its case (or its start)
        fails with the garbage's first bytes quoted."""
        try:
            got = s.inbox.read()
        except frames.Garbage as exc:
            if s.task is not None:
                self.fail_case(s, "crashed", f"worker {exc} in this case; it was killed")
                self.kill(s)
            else:
                self.start_failed(s, str(exc))
            return
        for msg in got:
            self.handle(s, msg)
            if s.proc is None:  # retired or given up: the rest of its messages are moot
                return

    def hand_out(self, queue: list) -> None:
        for s in self.slots:
            if s.proc is not None and s.info is not None and s.task is None and queue and not self.stopping:
                t = queue.pop(0)
                try:
                    s.tasks.send(t)
                except OSError:  # died just now: the case goes back, the death is handled below
                    queue.insert(0, t)
                    continue
                s.task, s.pending, s.started = t, list(t.backends), _clock()
                # the kernel's OOM kills so far (a worker killed by SIGKILL after more is an oom row),
                # and for a case near the memory limit the worker's resident set now (watched)
                s.oom0 = oom_kills()
                s.rss0 = resident_bytes(s.proc.pid) if t.guard is not None else None
                self.starts.started(s.label)
                if self.status:
                    self.status(f"{t.case.label} {t.dtype} on {s.label}")

    def next_wait(self, live: list[_Slot]) -> float:
        """Seconds until the nearest limit (a case's, a start's), at most :data:`POLL_S`."""
        now = _clock()
        waits = [POLL_S]
        for s in live:
            if s.info is None:
                waits.append(s.spawned + self.start_limit - now)
            elif s.task is not None and self.limit > 0:
                waits.append(s.started + self.limit - now)
            if s.task is not None and s.task.guard is not None:
                waits.append(WATCH_S)
        return min(POLL_S, max(0.0, min(waits)) + 0.005)

    def check_limits(self) -> None:
        now = _clock()
        for s in self.slots:
            if s.proc is None:
                continue
            if s.info is None and now - s.spawned > self.start_limit:
                self.start_failed(s, hung_text(self.start_limit))
            elif s.task is not None and self.limit > 0 and now - s.started > self.limit:
                self.kill(s)
                self.fail_case(s, "timeout", f"case ran past --case-timeout {self.limit:g} s "
                               "(compile included); its worker was killed and replaced")
            elif s.task is not None and s.task.guard is not None and s.rss0 is not None:
                grown = (resident_bytes(s.proc.pid) or 0) - s.rss0
                if grown > s.task.guard.limit:
                    guard = s.task.guard
                    self.kill(s)
                    self.fail_case(s, "oom", guard.killed_text(grown))

    def run(self, queue: list) -> list[str]:
        from multiprocessing.connection import wait

        try:
            while True:
                if not self.stopping and self.should_stop is not None and queue and self.should_stop():
                    self.stopping = True
                for s in self.slots:  # a place without a worker gets one while there is work
                    if s.proc is None and not s.given_up and queue and not self.stopping:
                        try:
                            self.start(s)
                        except OSError as exc:  # no process to be had (fork limit, no memory)
                            s.given_up = self.starts.failed(s.label, f"spawn failed: {type(exc).__name__}: {exc}")
                self.hand_out(queue)
                busy = [s for s in self.slots if s.task is not None]
                if not busy and (not queue or self.stopping):
                    break
                live = [s for s in self.slots if s.proc is not None]
                if not live:  # every place given up
                    break
                wait([s.msgs for s in live if not s.inbox.eof] + [s.proc.sentinel for s in live],
                     self.next_wait(live))
                for s in live:
                    if s.proc is None:
                        continue
                    alive = s.proc.is_alive()  # before reading: a dead worker's last messages are all there
                    self.receive(s)
                    if s.proc is not None and not alive:
                        self.dead(s)
                self.check_limits()
            not_run = 0
            if queue and not self.stopping:
                message = self.starts.not_run_message()
                for t in queue:
                    for b in t.backends:
                        self.emit(t, b, {"status": "crashed", "message": message}, {})
                not_run = len(queue)
                queue.clear()
            return self.starts.problems(not_run)
        finally:
            for s in self.slots:
                self.kill(s)
            self.logdir.cleanup()

    def dead(self, s: _Slot) -> None:
        code = s.proc.exitcode
        tail = _tail(s.log)
        exit_text = _exit_text(code) + (f": {tail}" if tail else "")
        if s.task is not None:
            rose = (oom_kills() or 0) - s.oom0 if s.oom0 is not None else 0
            if code == -signal.SIGKILL and (s.task.guard is not None or rose > 0):
                self.fail_case(s, "oom", oom_death_text(rose, s.task.guard))
            else:
                self.fail_case(s, "crashed", f"worker crashed ({_exit_text(code)}) in this case"
                               + (f"; last stderr: {tail}" if tail else ""))
            self.kill(s)
        elif s.info is None:
            self.start_failed(s, exit_text)
        else:  # ready, then dead before it took a case: a start that did not hold
            self.start_failed(s, f"died after its ready message, before a case ({exit_text})")
