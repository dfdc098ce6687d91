"""The worker process of one environment in an environment A/B: ``python -m
flyexplore.run.envworker --in FD --out FD --name NAME --device DEVICE``, started by the driver
(:mod:`flyexplore.run.envab`) with that environment's interpreter and variables.

It imports only what measuring needs -- torch, numpy and flyexplore's measuring, operator and
environment layers -- never pandas or plotly (its hello message lists the top-level modules it
loaded). It reads one command at a time from the file descriptor ``--in`` and answers each on
``--out`` (8-byte big-endian length, then UTF-8 JSON: the messages cross Python and torch
versions, so no pickle), and never acts on its own:

- ``hello`` (sent once, unasked): pid, interpreter, which flyexplore (version and folder), the
  environment (:func:`flyexplore.world.env.collect`: torch with its git version, HIP/CUDA, Triton,
  AOTriton, flydsl, the BLAS library torch prefers and TunableOp's state, the variables that
  change a path), the physical GPU and the modules loaded;
- ``case``: make the inputs from the seed, their digest (:func:`flyexplore.run.build.inputs_digest`),
  the reference, and build every backend with its first call and check; the base environment
  saves each output, another compares its output with the base's (:func:`flyexplore.run.build.output_difference`);
- ``warm`` / ``turn``: one warm-up round / one timed round of its backends
  (:class:`flyexplore.measure.interleaved.RoundRunner`: the cache flush before each call, an
  event pair around it and, ``event-gated``, a spin kernel holding the stream while the round is
  enqueued; in a turn, first one untimed call -- the first call after the GPU was handed over is
  not timed). Every command ends with a device synchronize before it answers, so a worker that
  waits for its turn has nothing queued on the GPU (on ROCm too: the HIP queues of an idle worker
  are empty, so no ``GPU_MAX_HW_QUEUES`` setting is needed for two or three environments);
- ``finish``: one profiled round (which kernels ran), what ran (trace columns), the recheck on
  fresh inputs; then the case is dropped;
- ``stop``: exit.

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
import types

import flyexplore
from flyexplore._version import __version__
from flyexplore.measure.devstate import sampler_for
from flyexplore.measure.interleaved import RoundRunner
from flyexplore.measure.timing import KernelTime, cpu_threads
from flyexplore.ops.base import RunContext, reset_dynamo
from flyexplore.run import build as B
from flyexplore.run import frames
from flyexplore.run.spec import resolve_op
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


class Worker:
    """The state of one environment's worker: the device, the environment, and the case in hand."""

    def __init__(self, name: str, device: str):
        import torch

        self.name = name
        self.device = torch.device(device)
        self.gpu = self.device.type == "cuda"
        if self.gpu:
            torch.cuda.set_device(self.device)
            torch.ones(1, device=self.device).add_(1)   # the context now: a GPU that refuses it fails here
            torch.cuda.synchronize(self.device)
        torch.ones(2, 2) @ torch.ones(2, 2)   # the CPU BLAS loaded now, not in the first case
        self.env = ENV.collect()

        self.ctx = RunContext(self.device, self.env)
        self.case_state: dict | None = None

    def hello(self) -> dict:
        fp = {**self.env.fingerprint(), **self.env.code_columns(), "flyexplore": __version__}
        mods = sorted({m.split(".")[0] for m in list(sys.modules) if not m.startswith("_")})
        return {"kind": "hello", "pid": os.getpid(), "name": self.name, "python": sys.version.split()[0],
                "executable": sys.executable,
                "flyexplore": {"version": __version__,
                               "file": os.path.realpath(os.path.dirname(flyexplore.__file__))},
                "fingerprint": fp, "versions": dict(self.env.versions), "env_vars": dict(self.env.env_vars),
                "device_id": sampler_for(self.device).device_id if self.gpu else None, "modules": mods}

    # -- a case ----------------------------------------------------------------------------------

    def case(self, msg: dict) -> dict:
        """Build the case of ``msg`` (``op``, ``case``, ``dtype``, ``backends``, ``seed``,
        ``trace``, ``how``; ``save_dir``: save each output there as ``<backend>.pt``;
        ``compare``: ``{backend: the base's backend}`` with ``base_dir``, compare each output
        with the base environment's). Answers ``digest`` and, per backend, ``status``
        (``ok``/``unavailable``/``error``/``oom``), ``message``, ``first_call_ms``, ``errs`` and the
        ``cross_env_*`` columns."""
        import torch

        self.drop()
        op = resolve_op(msg["op"])
        case = op.case(msg["case"])
        dtype, seed = msg["dtype"], int(msg["seed"])
        reset_dynamo()
        arms: dict[str, dict] = {}
        try:
            inputs = op.make_inputs(case, dtype, self.device, seed)
            ref = op.reference(case, dtype, inputs)
            digest = B.inputs_digest(inputs)
        except Exception as exc:  # noqa: BLE001 - every backend of this environment fails alike
            fail = B.failure(exc, self.ctx)
            return {"digest": None, "arms": {b: dict(fail) for b in msg["backends"]}}
        fns, meta = {}, {}
        for b in msg["backends"]:
            bk = op.get_backend(b)
            why = bk.available(self.ctx, case, dtype)
            if why:
                arms[b] = {"status": "unavailable", "message": why}
                continue
            try:
                want = B.traced(bool(msg.get("trace")), b, op, self.ctx)
                with bk.context(self.ctx, case):
                    fn, first_ms, errs, decisions, out = B.build_first(op, case, dtype, bk, self.ctx, inputs, ref,
                                                                       want, keep_output=True)
                cols = {"status": "ok", "first_call_ms": first_ms, "errs": B.jsonable(errs)}
                if msg.get("save_dir"):
                    torch.save(_cpu(out), os.path.join(msg["save_dir"], f"{b}.pt"))
                base_b = (msg.get("compare") or {}).get(b)
                if base_b is not None:
                    path = os.path.join(msg["base_dir"], f"{base_b}.pt")
                    if os.path.exists(path):
                        cols.update(B.output_difference(out, torch.load(path, weights_only=True), dtype))
                del out
                fns[b] = fn
                meta[b] = (bk, decisions, want)
                arms[b] = cols
            except Exception as exc:  # noqa: BLE001 - this backend's row says why
                arms[b] = B.failure(exc, self.ctx)
        if self.gpu:   # every environment starts its rounds from an empty allocator cache: the output
            torch.cuda.synchronize(self.device)   # comparison's temporaries would otherwise decide where
            torch.cuda.empty_cache()              # one side's outputs land (a memory-bound call can tell)
        runner = None
        if fns:
            runner = RoundRunner(fns, self.device, msg["how"],
                                 enter=lambda nm: meta[nm][0].context(self.ctx, case), lead_call=True)
        self.case_state = {"op": op, "case": case, "dtype": dtype, "seed": seed, "inputs": inputs, "ref": ref,
                           "fns": fns, "meta": meta, "runner": runner}
        if self.gpu:
            torch.cuda.synchronize(self.device)
        return {"digest": digest, "arms": arms, "flush_bytes": runner.flush_bytes if runner is not None else 0}

    def _runner(self):
        st = self.case_state
        if st is None or st["runner"] is None:
            raise RuntimeError("no case with a timed backend in hand (send 'case' first)")
        return st["runner"]

    def warm(self, msg: dict) -> dict:
        """One warm-up round of ``calls`` calls per backend: their times (ms)."""

        with cpu_threads(self.gpu):
            got = self._runner().warm(int(msg["calls"]))
        return {"times": got}

    def turn(self, msg: dict) -> dict:
        """One timed round (``round``: its number, which rotates the order; ``calls`` per
        backend): ``rounds`` (per backend, the round's call times, ms) and ``events``."""

        r = self._runner()
        r.calls_per_round = int(msg["calls"])
        t0 = time.perf_counter()
        with cpu_threads(self.gpu):
            c = r.run(1, int(msg["round"]))
        return {"rounds": {nm: v[0] for nm, v in c.rounds.items()}, "events": c.events,
                "busy_ms": (time.perf_counter() - t0) * 1e3}

    def finish(self, msg: dict) -> dict:
        """After the last round: with ``profile`` (``event-gated``) one profiled round of ``calls``
        calls (which kernels each backend ran), then per backend the kernels (``[name, launches
        per call, us per call]``), what ran (``trace``: the trace columns, where the row records
        it) and the recheck on fresh inputs (``recheck_ok``, ``accuracy_ok`` where it failed,
        ``notes``). The case is dropped after."""

        st = self.case_state
        out: dict[str, dict] = {}
        if st is None or not st["fns"]:
            self.drop()
            return {"arms": out}
        r = st["runner"]
        kern: dict = {}
        notes: list[str] = []
        calls = int(msg.get("calls") or 1)
        r.calls_per_round = calls
        t0 = time.perf_counter()
        if msg.get("profile"):
            try:
                with cpu_threads(self.gpu):
                    kern = r.run(1, int(msg.get("round", 0)), "kernel").kernels
            except Exception as exc:  # noqa: BLE001 - no profiler: the times stand, kernels unknown
                notes.append(f"kernel names not recorded: {type(exc).__name__}")
        profile_s = time.perf_counter() - t0
        op, case, dtype = st["op"], st["case"], st["dtype"]
        try:
            ref2 = (B.fresh_inputs(op, case, dtype, st["inputs"], self.device, st["seed"])
                    if st["ref"] is not None else None)
        except Exception as exc:  # noqa: BLE001 - the recheck is skipped, with the reason
            B.debug_trace()
            ref2 = exc
        for b, fn in st["fns"].items():
            bk, decisions, want = st["meta"][b]
            kts = tuple(KernelTime(k, len(d) / calls, sum(d) * 1e3 / calls)
                        for k, d in sorted(kern.get(b, {}).items(), key=lambda kv: -sum(kv[1])))
            row: dict = {"message": "; ".join(notes) or None}
            cols: dict = {"kernels": [[k.name, k.calls_per_iter, round(k.us_per_iter, 3)] for k in kts]}
            if want:   # what ran: from the profiled round's kernels (trace_of reads a measurement's)
                tr = B.trace_of(types.SimpleNamespace(kernels=kts), fn, self.ctx, decisions, bk, case)
                cols["trace"] = B.jsonable(B.trace_cols(op, case, dtype, b, tr))
            if st["ref"] is not None:
                cols["recheck_ok"] = B.recheck(op, case, dtype, bk, self.ctx, st["inputs"], ref2, row)
                if row.get("accuracy_ok") is False:
                    cols["accuracy_ok"] = False
            cols["message"] = row.get("message")
            out[b] = cols
        self.drop()
        return {"arms": out, "profile_s": profile_s}

    def modules(self, msg: dict | None = None) -> dict:
        """The top-level modules this worker has loaded (what a test checks: never pandas)."""
        return {"modules": sorted({m.split(".")[0] for m in list(sys.modules) if not m.startswith("_")})}

    def drop(self, msg: dict | None = None) -> dict:
        """Free the case in hand (inputs, built backends, compiled code's state)."""
        import torch

        if self.case_state is not None:
            self.case_state = None

            reset_dynamo()
            if self.gpu:
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
        return {}


def _cpu(value):
    """An output moved to the CPU (tensors in nested tuples, lists and dicts), for ``torch.save``."""
    import torch

    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value) if isinstance(value, list) else tuple(_cpu(v) for v in value)
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flyexplore.run.envworker")
    p.add_argument("--in", dest="fd_in", type=int, required=True)
    p.add_argument("--out", dest="fd_out", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cpus", default="", help="comma-separated CPU numbers this worker runs on (sched_setaffinity)")
    a = p.parse_args(argv)
    if a.cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
        except (OSError, ValueError):   # not allowed here: the worker runs where the OS puts it
            pass
    faulthandler.enable(all_threads=True)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        w = Worker(a.name, a.device)
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
            if cmd not in ("case", "warm", "turn", "finish", "drop", "modules"):
                raise ValueError(f"unknown command {cmd!r}")
            reply = getattr(w, cmd)(msg)
            send(a.fd_out, {"kind": "ok", **reply})
        except Exception as exc:  # noqa: BLE001 - the driver turns it into rows

            B.debug_trace()
            send(a.fd_out, {"kind": "error", "error": B.first_line(exc), "oom": B.is_oom(exc)})


if __name__ == "__main__":
    sys.exit(main())
