"""A place where a case runs, seen from inside: the one protocol every place speaks.

A *place* is a process in an environment that builds a case and times its backends when told
to. This interpreter is one (:class:`LocalPlace`: the sweep's in-process cases, each sweep worker,
each ``--processes`` pass and each memory probe run their cases here); an environment A/B's
worker process is another (:mod:`flyexplore.run.envworker` serves :class:`CaseHost` over a pipe,
:class:`flyexplore.run.envab.EnvWorker` is its driver side). One case driver
(:func:`flyexplore.run.driver.drive_case`) talks to any of them with the same commands, so an
:class:`~flyexplore.ops.base.Operator` hook (``timing_mode``, ``breakdown``, ``fresh_recheck``,
``check_output``) or a row column is honoured wherever a case runs, written once.

The commands (each a dict with ``cmd``; each answer a dict; a command that raises is an error
answer, never a dead place):

- ``case``: inputs from the seed, their digest (:func:`flyexplore.run.build.inputs_digest`), the
  reference, and every backend built with its first call checked, its peak memory on a GPU
  (``peak_mem_bytes``). With ``save_dir`` the checked output (:attr:`Operator.check_output`: the
  tensors a check needs, e.g. a model step's logits, never a whole output object such as a KV
  cache) is saved as a list of CPU tensors; with ``compare`` it is compared with the one saved
  by the base place (:func:`flyexplore.run.build.output_difference`).
- ``warm``: one warm-up round of ``calls`` calls per backend.
- ``turn``: ``rounds`` timed rounds (default 1) from round number ``round`` (which rotates the
  order of the backends; :class:`flyexplore.measure.interleaved.RoundRunner`), ``calls`` calls per
  backend; with ``lead_call`` (set at ``case``) one untimed call first, since the first call
  after another place held the device is not timed. Answers ``restart`` when the timing mode
  fell back (the profiler gave no device time in ``kernel`` mode).
- ``finish``: optionally one profiled round (which kernels ran), then per backend what ran (trace
  columns), the recheck on fresh inputs (where the operator's ``fresh_recheck`` allows) and the
  family's profiled breakdown (:attr:`Operator.breakdown`); the case is dropped after.
- ``drop``: free the case in hand. ``modules``: the top-level modules loaded.

This module imports torch, numpy and the measuring, operator and environment layers only, never
pandas (an environment's worker process loads it).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import types

from flyexplore.insight.breakdown import profile_step
from flyexplore.measure import interleaved as IL
from flyexplore.measure.timing import KernelTime, cpu_threads
from flyexplore.ops.base import RunContext, reset_dynamo
from flyexplore.run import build as B
from flyexplore.run.plan import resolve_op


class WorkerDied(Exception):
    """A place's process ended (or closed its pipe) while the driver waited for it."""


class WorkerHung(Exception):
    """A place did not answer before its deadline."""


class WorkerFailed(Exception):
    """A place answered a command with an error (``oom``: out of memory)."""

    def __init__(self, text: str, oom: bool = False):
        super().__init__(text)
        self.text, self.oom = text, oom


#: The commands of the protocol (see the module text).
COMMANDS = ("case", "warm", "turn", "finish", "drop", "modules")


@contextlib.contextmanager
def peak_memory(ctx: RunContext):
    """Yields a dict that gets ``bytes``: on a GPU the peak of ``torch.cuda.max_memory_allocated``
    while the block ran (its counter reset on entry); nothing on the CPU."""
    out: dict = {}
    if not ctx.gpu:
        yield out
        return
    import torch

    torch.cuda.synchronize(ctx.device)
    torch.cuda.reset_peak_memory_stats(ctx.device)
    yield out
    torch.cuda.synchronize(ctx.device)
    out["bytes"] = float(torch.cuda.max_memory_allocated(ctx.device))


def checked_tensors(op, out) -> list:
    """What a cross-place check of ``out`` compares: the operator's ``check_output(out)`` (a model
    step: its logits) or ``out`` itself, as its list of tensors (:func:`flyexplore.run.build.tensors_of`),
    detached and moved to the CPU: a list ``torch.load(..., weights_only=True)`` reads back."""
    pick = getattr(op, "check_output", None)
    return [t.detach().cpu() for t in B.tensors_of(pick(out) if pick is not None else out)]


def loaded_modules() -> list[str]:
    """The top-level modules this process has loaded (a worker's never include pandas)."""
    return sorted({m.split(".")[0] for m in list(sys.modules) if not m.startswith("_")})


class CaseHost:
    """The case in hand at one place, answering the protocol's commands (the module text).

    ``ctx``: the place's :class:`~flyexplore.ops.base.RunContext` (device and environment);
    ``sampler``: a device-state sampler read once per timed round (:mod:`flyexplore.measure.devstate`;
    None where the driver reads the clock itself, as it does for an A/B's several places)."""

    def __init__(self, ctx: RunContext, sampler=None):
        self.ctx, self.device, self.gpu = ctx, ctx.device, ctx.gpu
        self.sampler = sampler
        self.state: dict | None = None

    # -- case -------------------------------------------------------------------------------------

    def case(self, msg: dict) -> dict:
        """Build the case of ``msg``: ``op`` (an :class:`~flyexplore.ops.base.Operator` or its import
        reference), ``case`` (a :class:`~flyexplore.ops.base.Case` or its label), ``dtype``,
        ``backends``, ``seed``, ``trace``, ``how`` (the effective timing mode), ``lead_call``;
        ``inputs``/``ref`` already made (this process only); ``save_dir``, ``compare`` and
        ``base_dir`` for the cross-place output check. Answers ``digest``, ``flush_bytes`` and per
        backend (``arms``) ``status`` (``ok``/``unavailable``/``error``/``oom``), ``message``,
        ``first_call_ms``, ``errs``, ``peak_mem_bytes`` and the ``cross_env_*`` columns."""
        import torch

        self.drop()
        op = msg["op"] if not isinstance(msg["op"], str) else resolve_op(msg["op"])
        case = msg["case"] if not isinstance(msg["case"], str) else op.case(msg["case"])
        dtype, seed = msg["dtype"], int(msg["seed"])
        reset_dynamo()
        arms: dict[str, dict] = {}
        try:
            if msg.get("inputs") is not None:
                inputs, ref = msg["inputs"], msg.get("ref")
            else:
                inputs = op.make_inputs(case, dtype, self.device, seed)
                ref = op.reference(case, dtype, inputs)
            digest = B.inputs_digest(inputs) if msg.get("digest", True) else None
        except Exception as exc:  # noqa: BLE001 - every backend of this place fails alike
            fail = B.failure(exc, self.ctx)
            return {"digest": None, "arms": {b: dict(fail) for b in msg["backends"]}, "flush_bytes": 0}
        fns, meta = {}, {}
        for b in msg["backends"]:
            bk = op.get_backend(b)
            why = bk.available(self.ctx, case, dtype)
            if why:
                arms[b] = {"status": "unavailable", "message": why}
                continue
            try:
                want = B.traced(bool(msg.get("trace")), b, op, self.ctx)
                cross = bool(msg.get("save_dir") or msg.get("compare"))
                with bk.context(self.ctx, case), peak_memory(self.ctx) as peak:
                    fn, first_ms, errs, decisions, out = B.build_first(op, case, dtype, bk, self.ctx, inputs, ref,
                                                                       want, keep_output=cross)
                cols = {"status": "ok", "first_call_ms": first_ms, "errs": B.jsonable(errs),
                        "peak_mem_bytes": peak.get("bytes")}
                if cross:
                    self._cross(op, b, out, dtype, msg, cols)
                del out
                fns[b] = fn
                meta[b] = (bk, decisions, want)
                arms[b] = cols
            except Exception as exc:  # noqa: BLE001 - this backend's row says why
                arms[b] = B.failure(exc, self.ctx)
        if self.gpu:   # every place starts its rounds from an empty allocator cache: the output
            torch.cuda.synchronize(self.device)   # comparison's temporaries would otherwise decide where
            torch.cuda.empty_cache()              # one side's outputs land (a memory-bound call can tell)
        runner = None
        if fns:
            runner = IL.RoundRunner(fns, self.device, msg["how"], sampler=self.sampler,
                                    enter=lambda nm: meta[nm][0].context(self.ctx, case),
                                    lead_call=bool(msg.get("lead_call")))
            runner.mode_fixed = msg["how"] == "kernel" and bool(msg.get("mode_fixed"))
        self.state = {"op": op, "case": case, "dtype": dtype, "seed": seed, "inputs": inputs, "ref": ref,
                      "fns": fns, "meta": meta, "runner": runner, "kern": {}, "timed_calls": 0}
        if self.gpu:
            torch.cuda.synchronize(self.device)
        return {"digest": digest, "arms": arms, "flush_bytes": runner.flush_bytes if runner is not None else 0}

    def _cross(self, op, b: str, out, dtype: str, msg: dict, cols: dict) -> None:
        """Save ``out``'s checked tensors (base place) or compare them with the base place's."""
        import torch

        mine = checked_tensors(op, out)
        if msg.get("save_dir"):
            torch.save(mine, os.path.join(msg["save_dir"], f"{b}.pt"))
        base_b = (msg.get("compare") or {}).get(b)
        if base_b is not None:
            path = os.path.join(msg["base_dir"], f"{base_b}.pt")
            if os.path.exists(path):
                cols.update(B.output_difference(mine, torch.load(path, weights_only=True), dtype))

    def _runner(self) -> IL.RoundRunner:
        st = self.state
        if st is None or st["runner"] is None:
            raise RuntimeError("no case with a timed backend in hand (send 'case' first)")
        return st["runner"]

    # -- rounds -----------------------------------------------------------------------------------

    def warm(self, msg: dict) -> dict:
        """One warm-up round of ``calls`` calls per backend: ``times`` (per backend, ms)."""
        got = self._runner().warm(int(msg["calls"]))
        return {"times": got}

    def turn(self, msg: dict) -> dict:
        """``rounds`` timed rounds (default 1) from round number ``round``, ``calls`` calls per
        backend: ``rounds`` (per backend, a list of rounds, each its call times in ms), ``events``
        (per backend, ms), ``kernels`` (``kernel`` mode: per backend, kernel name -> durations, ms),
        ``clocks`` (MHz per round, None without a sampler), ``busy_ms``; or ``restart`` with the
        new ``how`` when the timing mode fell back (:class:`~flyexplore.measure.interleaved.RestartRounds`)."""
        r = self._runner()
        r.calls_per_round = int(msg["calls"])
        t0 = time.perf_counter()
        try:
            c = r.run(int(msg.get("rounds", 1)), int(msg["round"]))
        except IL.RestartRounds:
            self.state["kern"], self.state["timed_calls"] = {}, 0
            return {"restart": True, "how": r.how}
        self.state["timed_calls"] += len(c.clocks) * r.calls_per_round
        for nm, per in c.kernels.items():
            for k, d in per.items():
                self.state["kern"].setdefault(nm, {}).setdefault(k, []).extend(d)
        return {"rounds": c.rounds, "events": c.events, "kernels": c.kernels, "clocks": c.clocks,
                "busy_ms": (time.perf_counter() - t0) * 1e3}

    def finish(self, msg: dict) -> dict:
        """After the last round: with ``profile`` one profiled round of ``calls`` calls (numbered
        ``round``), then per backend (``arms``): ``kernels`` (the profiled round's, name -> durations
        in ms), ``trace`` (what ran, where the row records it), ``recheck_ok`` and ``accuracy_ok``
        (the recheck on fresh inputs), ``breakdown`` (the family's, JSON) and ``message``; ``how``
        (the mode the rounds ended in), ``notes`` (the runner's), ``kcalls`` (calls in the profiled
        round; None without one) and ``profile_s``. The case is dropped after."""
        st = self.state
        if st is None or not st["fns"]:
            self.drop()
            return {"arms": {}, "how": None, "notes": [], "kcalls": None, "profile_s": 0.0}
        r = st["runner"]
        kern: dict = {}
        calls = int(msg.get("calls") or 1)
        kcalls = None
        t0 = time.perf_counter()
        if msg.get("profile"):
            r.calls_per_round = calls
            try:
                kern = r.run(1, int(msg.get("round", 0)), "kernel").kernels
                kcalls = calls
            except Exception as exc:  # noqa: BLE001 - no profiler: the times stand, kernels unknown
                r.notes.append(f"kernel names not recorded: {type(exc).__name__}")
                kcalls = 0
        profile_s = time.perf_counter() - t0
        op, case, dtype, inputs = st["op"], st["case"], st["dtype"], st["inputs"]
        recheck = st["ref"] is not None and getattr(op, "fresh_recheck", True)
        ref2 = None
        if recheck:
            try:
                ref2 = B.fresh_inputs(op, case, dtype, inputs, self.device, st["seed"])
            except Exception as exc:  # noqa: BLE001 - the recheck is skipped, with the reason
                B.debug_trace()
                ref2 = exc
        out: dict[str, dict] = {}
        for b, fn in st["fns"].items():
            bk, decisions, want = st["meta"][b]
            seen, n = (kern.get(b), kcalls) if kcalls else (st["kern"].get(b), max(st["timed_calls"], 1))
            kts = tuple(KernelTime(k, len(d) / n, sum(d) * 1e3 / n)
                        for k, d in sorted((seen or {}).items(), key=lambda kv: -sum(kv[1])))
            row: dict = {"message": None}
            cols: dict = {"kernels": {k: list(d) for k, d in (kern.get(b) or {}).items()}}
            if want:   # what ran: from the kernels seen (trace_of profiles one call when there are none)
                tr = B.trace_of(types.SimpleNamespace(kernels=kts), fn, self.ctx, decisions, bk, case)
                cols["trace"] = B.jsonable(B.trace_cols(op, case, dtype, b, tr))
            if recheck:
                cols["recheck_ok"] = B.recheck(op, case, dtype, bk, self.ctx, inputs, ref2, row)
                if row.get("accuracy_ok") is False:
                    cols["accuracy_ok"] = False
            if op.breakdown is not None:
                cols["breakdown"] = self._breakdown(op, b, bk, fn, case, inputs, row)
            cols["message"] = row.get("message")
            out[b] = cols
        how, rnotes = r.how, list(r.notes)
        self.drop()
        return {"arms": out, "how": how, "notes": rnotes, "kcalls": kcalls, "profile_s": profile_s}

    def _breakdown(self, op, name: str, bk, fn, case, inputs: dict, row: dict) -> str | None:
        """One profiled call of a timed backend by kernel category
        (:func:`flyexplore.insight.breakdown.profile_step` with the family's ``breakdown`` keywords),
        as JSON; a profiler that fails leaves a note and no breakdown (the time stands)."""
        try:
            with bk.context(self.ctx, case):
                bd = profile_step(fn, self.device, **op.breakdown(name, inputs))
            return json.dumps(bd.to_dict())
        except Exception as exc:  # noqa: BLE001 - no profiler here: the time stands
            B.note(row, f"breakdown not profiled: {B.first_line(exc)}")
            return None

    # -- the rest ---------------------------------------------------------------------------------

    def modules(self, msg: dict | None = None) -> dict:
        """The top-level modules this place has loaded (what a test checks: never pandas)."""
        return {"modules": loaded_modules()}

    def drop(self, msg: dict | None = None) -> dict:
        """Free the case in hand (inputs, built backends, compiled code's state)."""
        import torch

        if self.state is not None:
            self.state = None
            reset_dynamo()
            if self.gpu:
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
        return {}

    def answer(self, msg: dict) -> dict:
        """The answer to one command: ``{"kind": "ok", ...}``. Raises ``ValueError`` for an unknown
        command and whatever the command raises (the caller makes it an error answer)."""
        cmd = msg.get("cmd")
        if cmd not in COMMANDS:
            raise ValueError(f"unknown command {cmd!r}")
        # every command with the timing's intra-op threads on the CPU (:func:`cpu_threads`), the
        # first call's compile included: Dynamo guards on the thread count, so a first call made
        # with another count compiled code that was never timed, and the timed code compiled again
        # in the warm-up
        with cpu_threads(self.gpu):
            return {"kind": "ok", **getattr(self, cmd)(msg)}


class LocalPlace:
    """This interpreter as a place: a :class:`CaseHost` whose commands are method calls, with the
    same answers and the same :class:`WorkerFailed` for a command that raised as a worker process
    (``KeyboardInterrupt`` propagates). ``name``: the place's name in its rows (an environment's
    name, or ``""`` for a plain sweep, whose arms are its backends)."""

    #: The driver hands this place objects (the operator, the case, inputs already made), not their names.
    local = True

    def __init__(self, ctx: RunContext, sampler=None, name: str = ""):
        self.host = CaseHost(ctx, sampler)
        self.name = name
        self.info: dict = {}

    def request(self, msg: dict, deadline: float | None = None) -> dict:
        """Answer ``msg`` here (``deadline`` is not needed in this process). Raises
        :class:`WorkerFailed` (with ``oom``) for a command that raised."""
        try:
            return self.host.answer(msg)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the driver makes it rows, as for a worker
            fail = B.failure(exc, self.host.ctx)   # its traceback with FLYEXPLORE_DEBUG; a GPU's cache emptied
            raise WorkerFailed(fail["message"], fail["status"] == "oom") from None
