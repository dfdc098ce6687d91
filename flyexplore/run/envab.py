"""An environment A/B: the arms of each case -- a backend in an environment, ``flash@0.13b`` --
timed round by round across worker processes of two or more environments on one device, the
workers taking turns, so that what the device does over time (its clock under the power limit,
its temperature) is shared by every arm and cancels in the paired ratio.

Why: the A/Bs users need are between builds (AOTriton 0.13b vs 0.14.2b is two torch builds;
torch A vs B; flydsl versions; ``TORCH_BLAS_PREFER_HIPBLASLT`` or TunableOp, read when torch
starts), and two separate runs on a GPU differ by more than the effect: on an H200 the same GEMM
read 1.9-3.1% apart in two processes run one after the other, seconds apart, while two processes
taking turns round by round read it within 0.03-0.43% for calls of 40 µs or more (issue 32).
Prior art alternates whole processes (Chromium Pinpoint's pairwise A/B, asv continuous's
``--interleave-rounds``, torch.utils.benchmark's ``examples/end_to_end.py``); here the rounds
alternate inside one clock regime.

How (:func:`run_passes`, called by :func:`flyexplore.run.sweep.run_sweep` for a
:class:`~flyexplore.run.spec.SweepSpec` with ``envs``):

- **One worker per environment** (:class:`EnvWorker`): ``python -m flyexplore.run.envworker`` with
  that environment's interpreter and variables (:mod:`flyexplore.run.envs`), pinned to the A/B's
  one GPU. It imports only what measuring needs and reports its environment at start (torch and
  its git version, HIP/CUDA, Triton, AOTriton, flydsl, the BLAS library, TunableOp, the variables
  that differ); the driver prints it and every row carries it.
- **A case** (:func:`run_case`): the pair's workers are places of the one case driver
  (:func:`flyexplore.run.driver.drive_case`, which also runs every in-process case): each
  environment builds the case in turn from the same seed (the base environment first; the digests
  of the inputs must agree, and each checked output is compared with the base environment's);
  then warm-up turns, then timed rounds: in each round every environment takes one turn, in
  rotated order (A B, B A, ...), and only the worker whose turn it is has work queued (each
  answers after a device synchronize; every worker emptied its allocator cache after the build).
  In its turn a worker makes one untimed call, then times its arms as an in-process interleaved
  round (the family's timing mode: event-gated on a GPU unless the family asks for another, the
  cache flushed before each call, at least :data:`flyexplore.run.driver.MIN_CALLS` calls an arm).
  The driver reads the clock once per round (NVML/amdsmi, no GPU context of its own), takes each
  speedup over paired rounds and stops by the sweep's own sequential rule
  (:func:`flyexplore.measure.interleaved.sequential_rounds`). A worker's arms are taken against the
  same backend in the base environment (``flash@B`` against ``flash@A``), else against the A/B's
  baseline arm.
- **Fresh pairs** (:func:`run_passes`, through :func:`flyexplore.run.processes.pass_loop`): the
  plan runs in passes, each with newly started workers and the case order rotated; each pass's
  rows are journaled as its case finishes (:meth:`flyexplore.run.journal.Journal.add_passes`).
  ``--pairs auto`` (the default) gives every case :data:`flyexplore.run.envs.PAIRS` pairs, then one
  more at a time while a label is AMBIGUOUS, up to ``--max-pairs``
  (:class:`flyexplore.run.processes.PassRule`, with its correction for looking again); ``--pairs
  K`` exactly K. A case's rows are combined over its pairs
  (:func:`flyexplore.run.processes.combine`, ``kind="pairs"``) when it wants no more: the
  speedup's interval is the interval of the mean over the pairs (each pair paired round by round;
  a per-process offset of short calls is in it), the time's a prediction interval of another run
  as ``--processes`` gives. The next pass's pair is launched while a pass measures (a spare). A
  resume goes on with the passes still wanted.
- **Faults**: a worker that dies or hangs gives its environment's arms ``crashed``/``timeout``
  rows (exit code or signal, its last stderr lines) and the case's other arms the same status,
  saying which environment cut the case short (so the case has no ratio, and ``--retry-failed``
  runs it again); the pair is replaced by a fresh one and the A/B goes on. A GPU in
  exclusive-process compute mode refuses a second context: said in one line before anything
  starts (:func:`exclusive_mode`).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from flyexplore._version import __version__
from flyexplore.errors import UsageError
from flyexplore.measure.devstate import _nvml_handle
from flyexplore.results import table as R
from flyexplore.run.driver import CaseJob, drive_case, how_for
from flyexplore.run.engine import (CASE_TIMEOUT_S, START_ATTEMPTS, WORKER_START_TIMEOUT_S,
                                   _exit_text, cpu_malloc, pin_env)
from flyexplore.run.envs import Env, driver_package, extra_paths_for, worker_environ
from flyexplore.run.envworker import Reader, send
from flyexplore.run.frames import Garbage
from flyexplore.run.place import WorkerDied, WorkerFailed, WorkerHung
from flyexplore.run.processes import PassRule, pass_loop
from flyexplore.run.plan import op_ref
from flyexplore.run.spec import interleaved_kwargs

#: Lines of a dead worker's stderr kept in its ``crashed`` rows.
STDERR_LINES = 5
#: Longest single wait of the driver for a worker's answer, s (every wait is bounded).
POLL_S = 1.0
#: Seconds a worker gets to exit after ``stop`` before it is killed.
STOP_S = 5.0
#: Longest wait for a worker's exit status once its pipe has closed, s (:meth:`EnvWorker.exit_text`).
EXIT_WAIT_S = 5.0

#: The least time a later pair of workers gets to start, s (:func:`pair_start_limit`).
PAIR_START_MIN_S = 30.0
#: A later pair's start limit in multiples of what the first pair took (:func:`pair_start_limit`).
PAIR_START_FACTOR = 3.0

_clock = time.monotonic


def pair_start_limit(first_s: float | None, start_timeout: float) -> float:
    """How long a pair of workers after the first may take to start, s, counted from when its
    pass needs it (:meth:`Pair.ready`): three times what the A/B's first pair took (``first_s``,
    launch to ready; it started cold, before anything was written), at least
    :data:`PAIR_START_MIN_S`, at most ``start_timeout`` (``--worker-start-timeout``, which the first
    pair gets). Measured (issue 45), from launch until its pass took it (for a spare an upper bound
    of its start: its pass may still have been measuring): on the H100 7.6 s (median of 26;
    largest 10.4 s, ``data/h100/aa_pairs/``); on this project's 2-core CPU with other jobs beside
    it 7.5 s (median of 143; 95th percentile 17.7 s, largest 19.8 s, ``data/cpu/aa/``). So the limit is 30 s on both, and a worker stopped or stuck at its start
    costs that and a fresh pair's start, not ``--worker-start-timeout``'s 300 s
    (``benchmarks/evidence/stalled_start.py``: 34 s more than the same A/B without the stop on the
    H100, 44 s on the CPU)."""
    if first_s is None or not math.isfinite(first_s):
        return start_timeout
    return min(start_timeout, max(PAIR_START_MIN_S, PAIR_START_FACTOR * first_s))


def _proc_state(pid: int | None) -> str:
    """`` (its process is stopped: state T)`` where Linux's ``/proc/PID/stat`` says the process is
    stopped or traced, else ''."""
    if pid is None:
        return ""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return f" (its process is stopped: state {state}, e.g. SIGSTOP or a debugger)" if state in ("T", "t") else ""


def exclusive_mode(device) -> str | None:
    """Why the GPU of ``device`` cannot hold two environments' workers, or None: on NVIDIA, an
    exclusive-process compute mode (NVML ``nvmlDeviceGetComputeMode``; ``nvidia-smi -c``) refuses
    a second process's context. Never raises (None where NVML cannot be read; ROCm has no such
    mode)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or getattr(torch.version, "hip", None):
        return None
    try:
        import pynvml

        props = torch.cuda.get_device_properties(dev.index or 0)
        pynvml.nvmlInit()
        try:
            h = _nvml_handle(pynvml, getattr(props, "uuid", None), dev.index or 0)
            mode = pynvml.nvmlDeviceGetComputeMode(h)
            excl = getattr(pynvml, "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", 3)
            prohibited = getattr(pynvml, "NVML_COMPUTEMODE_PROHIBITED", 2)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML: the workers' start tells
        return None
    if mode == excl:
        return (f"GPU {device} is in exclusive-process compute mode (nvidia-smi -c EXCLUSIVE_PROCESS): it refuses a "
                "second process's context, and an environment A/B runs one worker per environment on it; ask for "
                "the DEFAULT compute mode, or compare two separate sweeps (flyexplore compare)")
    if mode == prohibited:
        return f"GPU {device} is in prohibited compute mode: no process may create a context on it"
    return None


def _busy_text(text: str) -> bool:
    t = text.lower()
    return "busy or unavailable" in t or "exclusive" in t


def shared_cpus() -> str:
    """The CPU every worker of a CPU A/B runs on (text for ``envworker --cpus``): the last of the
    CPUs this process may use, so that the workers taking turns share one core's state as GPU
    workers share the device's (two processes left to the scheduler sit on two cores of a shared
    machine, whose speeds differ by a few percent for minutes); '' where affinity cannot be read."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return ""
    return str(cpus[-1]) if len(cpus) > 1 else ""


def _off_core(cpus: str):
    """For a CPU worker: a ``preexec_fn`` that keeps its start (``import torch``, the environment
    read) off the core the workers measure on (``cpus``, :func:`shared_cpus`), so that a spare pair
    starting while a pair measures does not share that core; the worker pins itself to it once
    started. None where there is no other core, or on a GPU."""
    if not cpus or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        others = set(os.sched_getaffinity(0)) - {int(c) for c in cpus.split(",")}
    except (OSError, ValueError):
        return None
    if not others:
        return None
    return lambda: os.sched_setaffinity(0, others)


class EnvWorker:
    """One environment's worker process, seen from the driver: started with the environment's
    interpreter and variables (:func:`flyexplore.run.envs.worker_environ`), talked to over two
    pipes (:func:`flyexplore.run.envworker.send` / :class:`~flyexplore.run.envworker.Reader`),
    its stderr in a log file whose last lines a ``crashed`` row quotes. ``label``: the pair it
    belongs to (``pair2``)."""

    def __init__(self, env: Env, device: str, pin: dict, worker_code: str, extra_paths, log_dir: str,
                 label: str):
        self.env, self.device, self.pin, self.worker_code = env, device, pin, worker_code
        self.extra_paths, self.log_dir, self.label = tuple(extra_paths), log_dir, label
        self.proc: subprocess.Popen | None = None
        self.reader: Reader | None = None
        self.cmd_fd: int | None = None
        self.log_path = os.path.join(log_dir, f"{label}-{env.name}.log")
        self.info: dict | None = None
        self.pending: list[dict] = []
        self.cpus = shared_cpus() if device == "cpu" else ""
        self.garbage = ""

    @property
    def name(self) -> str:
        return self.env.name

    def start(self) -> None:
        """Start the process (without waiting for its hello: :meth:`hello`)."""
        c_in, d_out = os.pipe()   # driver -> worker
        d_in, c_out = os.pipe()   # worker -> driver
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [self.env.interpreter, "-m", "flyexplore.run.envworker", "--in", str(c_in), "--out", str(c_out),
                 "--name", self.env.name, "--device", self.device, "--cpus", self.cpus],
                env=self.environ(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(c_in, c_out), start_new_session=True,
                preexec_fn=_off_core(self.cpus))
        except OSError:
            for fd in (c_in, d_out, d_in, c_out):
                os.close(fd)
            raise
        finally:
            log.close()
        os.close(c_in)
        os.close(c_out)
        self.cmd_fd, self.reader, self.pending, self.info = d_out, Reader(d_in), [], None

    def environ(self) -> dict:
        """The variables the worker starts with: its environment's
        (:func:`flyexplore.run.envs.worker_environ`), and on the CPU glibc's fixed heap
        (:func:`flyexplore.run.engine.cpu_malloc`) unless the environment sets those variables."""
        env = worker_environ(self.env, self.worker_code, self.extra_paths, self.pin)
        if self.device == "cpu":
            env.update(cpu_malloc(env))
        return env

    def tail(self, n: int = STDERR_LINES) -> str:
        """The last ``n`` non-empty lines of the worker's stderr, joined with `` | ``."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 16384))
                lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])[:1500]

    def exit_text(self) -> str:
        """How the worker ended (``killed by signal SIGKILL``, ``exit code 1``), once its pipe has
        closed: its exit status is waited for up to :data:`EXIT_WAIT_S` (a loaded machine reaps a
        killed process after its pipe is seen closed; without the wait the row said ``no exit
        code``)."""
        if self.proc is None:
            return _exit_text(None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(EXIT_WAIT_S)
        return _exit_text(self.proc.poll())

    def _next(self, deadline: float) -> dict:
        """The next message, waiting until ``deadline`` (driver clock, s) at most."""
        while True:
            if self.pending:
                return self.pending.pop(0)
            got = self._read()
            if got:
                self.pending += got
                continue
            if self.reader.eof or self.proc.poll() is not None:
                got = self._read()
                if got:
                    self.pending += got
                    continue
                raise WorkerDied(self.exit_text())
            left = deadline - _clock()
            if left <= 0:
                raise WorkerHung()
            with contextlib.suppress(OSError, ValueError):
                select.select([self.reader.fd], [], [], min(POLL_S, left))

    def _read(self) -> list:
        """:meth:`flyexplore.run.frames.Inbox.read`; bytes that are no message make the worker
        :class:`WorkerDied` with the garbage quoted (``garbage`` keeps the text): a process that
        writes text to the pipe is not a worker, and is never waited for."""
        try:
            return self.reader.read()
        except Garbage as exc:
            self.garbage = str(exc)
            raise WorkerDied(self.garbage) from None

    def hello(self, deadline: float) -> dict:
        """Wait for the worker's hello (until ``deadline``); its ``fatal`` answer raises
        :class:`WorkerFailed`."""
        msg = self._next(deadline)
        if msg.get("kind") == "fatal":
            raise WorkerFailed(str(msg.get("error")))
        if msg.get("kind") != "hello":
            raise WorkerFailed(f"sent {msg.get('kind')!r} before its hello")
        self.info = msg
        return msg

    def request(self, msg: dict, deadline: float) -> dict:
        """Send one command and wait for its answer until ``deadline``. Raises
        :class:`WorkerDied`, :class:`WorkerHung` or :class:`WorkerFailed` (the command raised)."""
        try:
            send(self.cmd_fd, msg)
        except (BrokenPipeError, OSError):
            raise WorkerDied(self.exit_text()) from None
        got = self._next(deadline)
        if got.get("kind") == "error":
            raise WorkerFailed(str(got.get("error")), bool(got.get("oom")))
        return got

    def stop(self) -> None:
        """Ask the worker to exit; kill its process group after :data:`STOP_S`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                send(self.cmd_fd, {"cmd": "stop"})
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_S)
        self.kill()

    def kill(self) -> None:
        """Kill the worker's process group (its compile subprocesses too) and close its pipes."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        for fd in (self.cmd_fd, self.reader.fd if self.reader else None):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.proc, self.cmd_fd, self.reader = None, None, None


@dataclass
class Setup:
    """What every case of one A/B needs (:meth:`of` a spec): the operator and its reference
    for the workers, the environments, each environment's backends, the baseline arm, the seed,
    trace, band, timer keywords and effective mode, the device, the number of pairs, the limits,
    how workers find flyexplore, and where their logs go."""

    op: Any
    op_ref: str
    envs: tuple
    arms: dict            # env name -> tuple of backend names
    base_arm: str
    seed: int
    trace: bool
    band: float
    timer: dict           # measure_interleaved's keywords (interleaved_kwargs)
    how: str
    device: Any           # torch.device of the driver (cuda:N or cpu)
    worker_device: str    # the device a worker sees (cuda:0 when pinned, or cpu)
    pin: dict
    pairs: int            # the pairs every case gets (--pairs N, or the PAIRS that --pairs auto starts with)
    case_timeout: float
    start_timeout: float
    worker_code: str
    extra_paths: tuple
    log_dir: str = ""
    mode_fixed: bool = False   # the timing mode was asked for (kernel mode without device time is an error)
    auto: bool = False         # --pairs auto: one more pair at a time until every label is decided
    max_pairs: int = 0         # the most pairs a case gets (auto), else pairs
    hellos: dict = field(default_factory=dict)
    start_s: list = field(default_factory=list)   # how long each pass waited for its pair, s
    launch_s: list = field(default_factory=list)  # how long each pair took from launch to ready, s
    failed_starts: list = field(default_factory=list)   # (pair label, why) of every start that failed

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def base_env(self) -> str:
        return R.split_arm(self.base_arm)[1]

    def arm_names(self) -> list[str]:
        return [R.arm_name(b, e.name) for e in self.envs for b in self.arms[e.name]]


class Pair:
    """The workers of one pass: one per environment, started together."""

    def __init__(self, st: Setup, label: str):
        self.st, self.label = st, label
        self.workers = [EnvWorker(e, st.worker_device, st.pin, st.worker_code, st.extra_paths, st.log_dir, label)
                        for e in st.envs]
        self.failed_starts: list[str] = []   # the starts this pass lost before this pair started

    def launch(self) -> None:
        """Start every worker's process, without waiting (:meth:`ready` waits for their hellos): a
        spare pair is launched while the current one measures, so that the next pass finds it
        ready. Raises :class:`UsageError` when a process cannot be started at all."""
        self.launched, self.launched_wall = _clock(), time.time()
        try:
            for w in self.workers:
                w.start()
        except OSError as exc:
            self.stop()
            raise UsageError(f"a worker process could not be started: {exc}") from None

    def ready(self) -> None:
        """Wait for each worker's hello, for at most :meth:`limit` from this call. Raises
        :class:`UsageError` naming the environment whose worker did not start, and why (the workers
        are killed). Sets ``start_s`` (how long this call waited: a spare launched earlier costs only
        what was left of its start) and ``launch_s`` (launch to the last hello, :meth:`_took`; the
        A/B's first pair's sets the later pairs' limit)."""
        t0 = _clock()
        limit = self.limit()
        try:
            # from now, not from the launch: a spare launched while a pass measured started beside that
            # work (on the H100 a model step's spare took 46 s beside its case, 10 s alone)
            deadline = t0 + limit
            for w in self.workers:
                try:
                    info = w.hello(deadline)
                except WorkerFailed as exc:
                    raise UsageError(self._why(w, f"raised {exc.text}")) from None
                except WorkerDied as exc:
                    if w.garbage:
                        raise UsageError(self._why(w, w.garbage)) from None
                    raise UsageError(self._why(w, f"died ({exc}){': ' + w.tail() if w.tail() else ''}")) from None
                except WorkerHung:
                    what = ("--worker-start-timeout" if limit == self.st.start_timeout else
                            f"the pair-start limit ({PAIR_START_FACTOR:g}x the first pair's start, at least "
                            f"{PAIR_START_MIN_S:g} s)")
                    held = len(w.reader.buf) if w.reader is not None else 0
                    part = (f"; its pipe holds {held} byte(s) that are no message: {bytes(w.reader.buf[:60])!r}"
                            if held else "")
                    raise UsageError(self._why(w, f"was not ready within {what} of {limit:.0f} s"
                                                  f"{_proc_state(w.proc.pid if w.proc else None)}{part}")) from None
                self._check(w, info)
        except BaseException:
            for w in self.workers:   # none of them is measuring: killed at once, not asked to stop
                w.kill()
            raise
        self.start_s = _clock() - t0
        self.launch_s = self._took()
        self.st.launch_s.append(self.launch_s)

    def _took(self) -> float:
        """How long the pair took from its launch to its last worker's hello, s: from the hellos'
        own wall-clock time (``ready_at``; a spare's hello may have waited in its pipe while a pass
        measured), else until now."""
        at = [(w.info or {}).get("ready_at") for w in self.workers]
        if at and all(isinstance(x, (int, float)) for x in at):
            return max(0.0, max(at) - self.launched_wall)
        return _clock() - self.launched

    def limit(self) -> float:
        """This pair's start limit, s: ``--worker-start-timeout`` for the A/B's first pair (it
        starts cold), :func:`pair_start_limit` of the first pair's start for every later one."""
        return pair_start_limit(self.st.launch_s[0] if self.st.launch_s else None, self.st.start_timeout)

    def start(self) -> None:
        """:meth:`launch`, then :meth:`ready` (the starts of the workers overlap)."""
        self.launch()
        self.ready()

    def _why(self, w: EnvWorker, what: str) -> str:
        if _busy_text(what) and self.st.gpu:
            excl = exclusive_mode(self.st.device)
            if excl:
                return excl
            return (f"env {w.name!r} ({w.env.interpreter}): its worker could not create a context on GPU "
                    f"{self.st.device} ({what[:300]}): is the GPU in exclusive-process mode, or held by another job?")
        return f"env {w.name!r} ({w.env.interpreter}): its worker {what[:600]}"

    def _check(self, w: EnvWorker, info: dict) -> None:
        fx = info.get("flyexplore") or {}
        if self.st.worker_code == "driver" and fx.get("file") != driver_package():
            raise UsageError(f"env {w.name!r}: its worker imported flyexplore from {fx.get('file')}, not the "
                             f"driver's {driver_package()}")
        if fx.get("version") != __version__:
            raise UsageError(f"env {w.name!r}: its worker runs flyexplore {fx.get('version')}, the driver "
                             f"{__version__}: install the same version there, or use --worker-code driver")
        self.st.hellos[w.name] = info

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


# -- one case ---------------------------------------------------------------------------------------

def run_case(pair: Pair, case, dtype: str, st: Setup, sampler, clock: Callable[[], float] = time.perf_counter
             ) -> tuple[dict, bool]:
    """Run one case of the A/B on ``pair``'s workers, the base environment's first, with the one
    case driver (:func:`flyexplore.run.driver.drive_case`); returns ``({arm: row columns},
    retire)`` -- ``retire``: the pair must be replaced (a worker died, hung or saw a sticky device
    error). Never raises for a worker's fault (it becomes rows); ``KeyboardInterrupt`` propagates."""
    deadline = _clock() + st.case_timeout if st.case_timeout > 0 else math.inf
    by_env = {w.name: w for w in pair.workers}
    order = [by_env[st.base_env]] + [w for w in pair.workers if w.name != st.base_env]
    job = CaseJob(op=st.op, op_ref=st.op_ref, case=case, dtype=dtype, arms={w.name: st.arms[w.name] for w in order},
                  how=st.how, gpu=st.gpu, base_arm=st.base_arm, seed=st.seed, trace=st.trace, band=st.band,
                  timer=st.timer, named=True, mode_fixed=st.mode_fixed)
    save_dir = tempfile.mkdtemp(prefix="case-", dir=st.log_dir)
    try:
        return drive_case(order, job, sampler=sampler, deadline=deadline, clock=clock, save_dir=save_dir)
    except (WorkerDied, WorkerHung) as exc:
        w = getattr(exc, "worker", None)
        who = w.name if w is not None else "?"
        if isinstance(exc, WorkerHung):
            status = "timeout"
            own = (f"case ran past --case-timeout {st.case_timeout:g} s (compile included) in env {who!r}; the "
                   "workers were killed and a fresh pair started")
            other = f"not measured to the end: env {who!r}'s worker hung past --case-timeout {st.case_timeout:g} s"
        else:
            tail = w.tail() if w is not None else ""
            status = "crashed"
            own = f"worker of env {who!r} crashed ({exc}) in this case" + (f"; last stderr: {tail}" if tail else "")
            other = f"not measured to the end: the worker of env {who!r} crashed ({exc}); no ratio"
        mine = [R.arm_name(b, who) for b in st.arms.get(who, ())]
        return {a: {"status": status, "message": own if a in mine else other} for a in st.arm_names()}, True
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)


def env_columns(st: Setup, arm: str) -> dict:
    """The columns a row of ``arm`` gets from its environment: ``env``, ``env_python``,
    ``env_changes`` (JSON)."""
    e = next(x for x in st.envs if x.name == R.split_arm(arm)[1])
    hello = st.hellos.get(e.name) or {}
    return {"env": e.name, "env_python": hello.get("executable") or e.interpreter,
            "env_changes": json.dumps(dict(e.changes), sort_keys=True)}


def env_report(st: Setup) -> list[str]:
    """What each environment's worker reported at start, one line each, and the variables the
    environments change: torch (with its git version), HIP/CUDA, Triton, AOTriton, flydsl, the
    BLAS library, TunableOp, the interpreter and which flyexplore."""
    out = []
    for e in st.envs:
        h = st.hellos.get(e.name) or {}
        v = h.get("versions") or {}
        runtime = f"HIP {v['hip']}" if v.get("hip") else f"CUDA {v.get('cuda')}" if v.get("cuda") else "no GPU runtime"
        fx = (h.get("flyexplore") or {}).get("version")
        out.append(f"env {e.name}: python {h.get('python')} ({h.get('executable') or e.interpreter}); torch "
                   f"{v.get('torch')} (git {str(v.get('torch_git') or '?')[:10]}), {runtime}, "
                   f"triton {v.get('triton')}, aotriton {v.get('aotriton')}, flydsl {v.get('flydsl')}, "
                   f"blas {v.get('blas')}, tunableop {v.get('tunableop')}; changes: {e.changes_text()}; "
                   f"flyexplore {fx} from {'the driver' if st.worker_code == 'driver' else 'the environment'}")
    return out


def check_hellos_differ(st: Setup) -> list[str]:
    """Notes on environments that report the same versions and variables (an A/A, or an env
    change torch does not read): nothing wrong, said once."""
    seen: dict[str, str] = {}
    notes = []
    for e in st.envs:
        h = st.hellos.get(e.name) or {}
        key = json.dumps([h.get("versions"), h.get("env_vars")], sort_keys=True)
        if key in seen:
            notes.append(f"env {e.name!r} reports the same versions and path variables as env {seen[key]!r}")
        else:
            seen[key] = e.name
    return notes


# -- passes of fresh pairs ----------------------------------------------------------------------------

def run_passes(st: Setup, work: list, pass_rows: dict, *, first_pair: Pair | None, make_row: Callable,
               add_passes: Callable, add_final: Callable, sampler, bar, should_stop=None, status=None,
               platform: str | None = None, run_id: str = "", clock=time.perf_counter) -> list[str]:
    """Run the A/B's passes (see the module text) through the one pass loop
    (:func:`flyexplore.run.processes.pass_loop`): ``work``, the plan's ``(case, dtype)`` in order
    whose arms are not all final; ``pass_rows``: ``{(case label, dtype): {pass: {arm: row}}}``
    already journaled (a resume's). Pass ``k`` runs, on a pair of fresh workers, the cases that
    want pass ``k`` (:class:`flyexplore.run.processes.PassRule`: the first ``st.pairs`` for every
    case; with ``--pairs auto`` one more at a time for each case whose labels are undecided, up to
    ``st.max_pairs``), in the order rotated by ``k``. ``first_pair``: already started, used for
    the first pass that runs; the next pass's pair is launched while a pass runs (a spare: its
    start overlaps the measuring). ``make_row(case, dtype, arm, cols, info)`` makes a full row,
    ``add_passes([(k, row), ...])`` journals a case's pass rows (one transaction) and
    ``add_final(case, dtype, arm, row)`` writes a combined row once a case wants no more passes.
    ``should_stop()`` is read between cases. Returns the problems (one line each: a pair that
    could not start; its cases got ``crashed`` rows). Workers are stopped on any exit."""
    rule = PassRule(st.pairs, st.max_pairs, st.band, platform, auto=st.auto, kind="pairs")
    arms = st.arm_names()
    have = {key: dict(v) for key, v in pass_rows.items()}
    cases = {(c.label, d): (c, d) for c, d in work}
    pairs = {"now": first_pair, "spare": None, "first": first_pair}

    def finalize(key) -> None:
        for a, row in rule.final_rows(have.get(key, {}), arms).items():
            row["run_id"] = run_id or row.get("run_id")
            add_final(*cases[key], a, row)

    def run_pass(k: int, todo: list, close: Callable) -> tuple[list, bool]:
        problems: list[str] = []
        todo = [cases[key] for key in todo]
        if bar is not None and k >= rule.first:   # a pass --pairs auto added: its rows were not counted
            bar.total = (bar.total or 0) + len(todo) * len(arms)
            bar.refresh()
        pair = _next_pair(st, pairs, k, problems, todo, make_row, add_passes, have)
        if pair is None:
            for c, d in todo:
                close((c.label, d))
            return problems, False
        if k + 1 < rule.most and pairs["spare"] is None:   # the next pass's workers start while this one measures
            pairs["spare"] = _spare(st, f"pair{k + 2}")
        _set_desc(bar, k, rule)
        try:
            for n, (case, dtype) in enumerate(todo):
                if should_stop is not None and should_stop():
                    return problems, True
                if status is not None:
                    status(f"{case.label} {dtype} (pair {k + 1}/{rule.text()})")
                got, retire = run_case(pair, case, dtype, st, sampler, clock)
                infos = {w.name: w.info or {} for w in pair.workers}
                rows = []
                for a in arms:
                    e = R.split_arm(a)[1]
                    cols = {**got.get(a, {"status": "error", "message": "no row came back"}), **env_columns(st, a)}
                    if pair.failed_starts:
                        cols["message"] = "; ".join(x for x in (cols.get("message"),
                                                                f"{_starts_text(pair.failed_starts)} before this "
                                                                "pair started") if x)
                    rows.append((k, make_row(case, dtype, a, cols, _info(infos.get(e), pair.label, e))))
                add_passes(rows)
                if bar is not None:
                    bar.update(len(rows))
                have.setdefault((case.label, dtype), {})[k] = {r["backend"]: r for _, r in rows}
                close((case.label, dtype))
                if retire and n + 1 < len(todo):
                    pair.stop()
                    pair = pairs["now"] = _fresh_pair(st, f"pair{k + 1}r{n + 1}", problems, todo[n + 1:], k,
                                                      make_row, add_passes, have)
                    if pair is None:
                        for c, d in todo[n + 1:]:
                            close((c.label, d))
                        break
        finally:
            if pairs["now"] is not None:
                pairs["now"].stop()
            pairs["now"] = None
        return problems, False

    try:
        return pass_loop(list(cases), rule, have, lambda key: arms, run_pass, finalize, should_stop)
    finally:
        for p in pairs.values():
            if p is not None:
                p.stop()


def _next_pair(st: Setup, pairs: dict, k: int, problems: list, todo: list, make_row, add_passes, have) -> Pair | None:
    """The pair of pass ``k``: the one started before the output was opened (first pass that runs),
    else the spare launched during the last pass (once ready), else a fresh one
    (:func:`_fresh_pair`); None when none starts (``todo`` then has ``crashed`` rows)."""
    label = f"pair{k + 1}"
    t0 = _clock()
    pair = pairs["first"]
    pairs["first"] = None
    if pair is not None:   # started before the output was opened: its start is the sweep's first note
        pairs["now"] = pair
        pair.label = label
        return pair
    failed: list[str] = []
    if pair is None and pairs["spare"] is not None:
        pair, pairs["spare"] = pairs["spare"], None
        try:
            pair.ready()
        except UsageError as exc:
            failed.append(str(exc))
            st.failed_starts.append((label, str(exc)))
            pair = None
    if pair is None:
        pair = _fresh_pair(st, label, problems, todo, k, make_row, add_passes, have, failed)
    if pair is not None:
        pair.label = label
        st.start_s.append(_clock() - t0)   # what this pass waited, failed starts included
    pairs["now"] = pair
    return pair


def _starts_text(failed: list[str]) -> str:
    """``1 pair start failed (env 'b' ...: was not ready within ...)`` for the starts ``failed``."""
    n = len(failed)
    return f"{n} pair start{'s' if n != 1 else ''} failed ({failed[-1][:400]})"


def _spare(st: Setup, label: str) -> Pair | None:
    """A pair launched now, to be :meth:`Pair.ready` for the next pass (None when its processes
    cannot be started: the next pass starts one itself)."""
    p = Pair(st, label)
    try:
        p.launch()
    except UsageError:
        return None
    return p


def _info(hello: dict | None, label: str, env: str) -> dict:
    h = hello or {}
    return {"worker": f"{label}/{env}/pid{h.get('pid')}", "device_id": h.get("device_id"),
            "fp": h.get("fingerprint")}


def _set_desc(bar, k: int, rule) -> None:
    if bar is None:
        return
    base = str(getattr(bar, "desc", "") or "A/B").split(" (pair")[0]
    bar.set_description(f"{base} (pair {k + 1}/{rule.text()})")


def _fresh_pair(st: Setup, label: str, problems: list, todo: list, k: int, make_row, add_passes, have,
                failed: list | None = None) -> Pair | None:
    """A newly started pair, trying :data:`flyexplore.run.engine.START_ATTEMPTS` times; every
    failed start is kept (``st.failed_starts``, and ``failed``, the starts this pass lost before,
    which the pair then carries in ``failed_starts``: its rows say them) and said in ``problems``;
    when none starts, ``todo``'s cases get ``crashed`` pass rows saying why and None is returned."""
    failed = [] if failed is None else failed
    why = ""
    for attempt in range(START_ATTEMPTS):
        name = label if not attempt else f"{label}a{attempt + 1}"
        p = Pair(st, name)
        try:
            p.start()
        except UsageError as exc:
            why = str(exc)
            failed.append(why)
            st.failed_starts.append((name, why))
            continue
        p.failed_starts = list(failed)
        if failed:
            problems.append(f"pass {k + 1}: {_starts_text(failed)}; it ran on the pair started after")
        return p
    msg = f"not run: no pair of workers could start ({START_ATTEMPTS} attempts; last: {why})"
    for case, dtype in todo:
        rows = [(k, make_row(case, dtype, a, {"status": "crashed", "message": msg, **env_columns(st, a)}, {}))
                for a in st.arm_names()]
        add_passes(rows)
        have.setdefault((case.label, dtype), {})[k] = {r["backend"]: r for _, r in rows}
    problems.append(f"pass {k + 1}: no pair of workers could start after {START_ATTEMPTS} attempts (last: {why}); "
                    f"{len(todo)} case{'s' if len(todo) != 1 else ''} got crashed rows")
    return None


def setup_of(spec, device, log_dir: str) -> Setup:
    """The :class:`Setup` of a spec with ``envs`` (checked there) on ``device`` (a torch device),
    worker logs in ``log_dir``."""

    op = spec.plan.op
    ref = op_ref(op)
    arms: dict[str, list[str]] = {e.name: [] for e in spec.environments}
    for a in spec.plan.backends:
        b, e = R.split_arm(a)
        arms[e].append(b)
    gpu = device.type == "cuda"
    pin = pin_env(device.index or 0) if gpu else {}
    kw = interleaved_kwargs(spec.timer)
    how, t = how_for(op, kw, gpu)   # the family's timing mode (a model step: event) unless one is asked for
    return Setup(op=op, op_ref=ref, envs=tuple(spec.environments), arms={k: tuple(v) for k, v in arms.items()},
                 base_arm=spec.ab_baseline, seed=spec.seed, trace=spec.trace, band=spec.band, timer=t, how=how,
                 mode_fixed=kw.get("mode") == "kernel", device=device, worker_device="cuda:0" if gpu else "cpu",
                 pin=pin, pairs=spec.pairs_or_default, auto=spec.pairs_auto, max_pairs=spec.pairs_max,
                 case_timeout=CASE_TIMEOUT_S if spec.case_timeout is None else float(spec.case_timeout),
                 start_timeout=(WORKER_START_TIMEOUT_S if spec.worker_start_timeout is None
                                else float(spec.worker_start_timeout)),
                 worker_code=spec.worker_code, extra_paths=extra_paths_for(ref), log_dir=log_dir)


def start_first_pair(st: Setup) -> Pair:
    """Start the A/B's first pair before any file is opened: an exclusive-process GPU, an
    environment whose worker cannot start (no torch, a crash at import) or reports another
    flyexplore is a :class:`UsageError` (one line) with nothing written."""
    if st.gpu:
        why = exclusive_mode(st.device)
        if why:
            raise UsageError(why)
    p = Pair(st, "pair1")
    p.start()
    st.start_s.append(p.start_s)
    return p
