"""The worker process of one environment in an environment A/B: ``python -m
flyexplore.run.envworker --in FD --out FD --name NAME --device DEVICE``, started by the driver
(:mod:`flyexplore.run.envab`) with that environment's interpreter and variables.

It imports only what measuring needs -- torch, numpy and flyexplore's measuring, operator and
environment layers -- never pandas or plotly (its hello message lists the top-level modules it
loaded). It reads one command at a time from the file descriptor ``--in`` and answers each on
``--out`` (8-byte big-endian length, then UTF-8 JSON: the messages cross Python and torch
versions, so no pickle), and never acts on its own. Besides its ``hello`` (sent once, unasked:
pid, interpreter, which flyexplore -- version and folder --, the environment
(:func:`flyexplore.world.env.collect`: torch with its git version, HIP/CUDA, Triton, AOTriton,
flydsl, the BLAS library torch prefers and TunableOp's state, the variables that change a path),
the physical GPU and the modules loaded) and ``stop``, the commands are the one protocol of every
place a case runs (:mod:`flyexplore.run.place`: ``case``, ``warm``, ``turn``, ``finish``,
``drop``, ``modules``), answered by the same :class:`~flyexplore.run.place.CaseHost` that runs a
sweep's in-process cases. Every command ends with a device synchronize before it answers, so a
worker that waits for its turn has nothing queued on the GPU (on ROCm too: the HIP queues of an
idle worker are empty, so no ``GPU_MAX_HW_QUEUES`` setting is needed for two or three
environments).

A command that raises is answered ``{"kind": "error", ...}`` (its first line, whether it is an
out-of-memory error); the worker goes on. The worker exits when the driver goes away.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import threading
import time

import flyexplore
from flyexplore._version import __version__
from flyexplore.measure.devstate import sampler_for
from flyexplore.ops.base import RunContext
from flyexplore.run import build as B
from flyexplore.run import frames
from flyexplore.run.place import CaseHost, loaded_modules
from flyexplore.world import env as ENV

#: Longest wait of a worker for its next command before it checks that the driver is alive, s.
POLL_S = 1.0


def send(fd: int, msg: dict) -> None:
    """Write one message (JSON, NaN allowed) to ``fd`` as a frame (:func:`flyexplore.run.frames.send`)."""
    frames.send(fd, json.dumps(msg, allow_nan=True, default=str).encode())


def recv(fd: int) -> dict:
    """Read one message from ``fd`` (blocking). Raises ``EOFError`` when the other end is closed."""
    return json.loads(frames.recv(fd).decode())


def Reader(fd: int) -> frames.Inbox:
    """Driver side: the messages of one worker, read from its pipe without blocking
    (:class:`flyexplore.run.frames.Inbox` of JSON)."""
    return frames.Inbox(fd, lambda b: json.loads(b.decode()))


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(POLL_S)
        if os.getppid() != ppid:
            os._exit(3)


class Worker(CaseHost):
    """An environment's worker: a :class:`~flyexplore.run.place.CaseHost` on this process's device,
    with its CUDA/HIP context made and its environment read at start, and its hello."""

    def __init__(self, name: str, device: str):
        import torch

        self.name = name
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
            torch.ones(1, device=dev).add_(1)   # the context now: a GPU that refuses it fails here
            torch.cuda.synchronize(dev)
        torch.ones(2, 2) @ torch.ones(2, 2)   # the CPU BLAS loaded now, not in the first case
        self.env = ENV.collect()
        super().__init__(RunContext(dev, self.env))

    def hello(self) -> dict:
        fp = {**self.env.fingerprint(), **self.env.code_columns(), "flyexplore": __version__}
        return {"kind": "hello", "pid": os.getpid(), "name": self.name, "python": sys.version.split()[0],
                "executable": sys.executable,
                "flyexplore": {"version": __version__,
                               "file": os.path.realpath(os.path.dirname(flyexplore.__file__))},
                "fingerprint": fp, "versions": dict(self.env.versions), "env_vars": dict(self.env.env_vars),
                "device_id": sampler_for(self.device).device_id if self.gpu else None, "modules": loaded_modules(),
                "ready_at": time.time()}   # wall clock: the driver times the start from its launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flyexplore.run.envworker")
    p.add_argument("--in", dest="fd_in", type=int, required=True)
    p.add_argument("--out", dest="fd_out", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cpus", default="", help="comma-separated CPU numbers this worker runs on (sched_setaffinity)")
    a = p.parse_args(argv)
    faulthandler.enable(all_threads=True)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        w = Worker(a.name, a.device)
        # pinned once started: its start (torch's import) ran on the other cores (envab._off_core)
        if a.cpus and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
            except (OSError, ValueError):   # not allowed here: the worker runs where the OS puts it
                pass
        hello = w.hello()
    except BaseException as exc:  # noqa: BLE001 - told to the driver, which names the environment
        msg = str(exc).strip().splitlines()
        send(a.fd_out, {"kind": "fatal", "error": f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500]})
        return 1
    send(a.fd_out, hello)
    while True:
        try:
            msg = recv(a.fd_in)
        except (EOFError, OSError):
            return 0
        cmd = msg.get("cmd")
        if cmd == "stop":
            w.drop()
            send(a.fd_out, {"kind": "ok"})
            return 0
        try:
            send(a.fd_out, w.answer(msg))
        except Exception as exc:  # noqa: BLE001 - the driver turns it into rows

            B.debug_trace()
            send(a.fd_out, {"kind": "error", "error": B.first_line(exc), "oom": B.is_oom(exc)})


if __name__ == "__main__":
    sys.exit(main())
