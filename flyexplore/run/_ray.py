"""The Ray executor of :mod:`flyexplore.run.engine`: the same case function in Ray actors.

One actor per worker place (``num_gpus=1`` each when the cluster has GPUs -- Ray then pins the
actor's process to its GPU with ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` -- else
``num_cpus=1``), long-lived, killed and replaced after a crash, a time-out, a sticky device
error or ``max_cases`` cases, exactly as local workers are; an actor not ready within the
start limit, or whose start raises or dies, is retried and its place given up after
:data:`flyexplore.run.engine.START_ATTEMPTS` failed starts, as local workers' are. The driver
alone writes the journal and the result file. Needs ``pip install 'flyexplore[ray]'``.
"""
from __future__ import annotations

import os
import re

from flyexplore.run import engine
from flyexplore.run.engine import CaseRunner, CaseSettings, Task, _tail, sticky


class RayWorker:
    """A Ray actor (wrapped with ``ray.remote`` at run time) around a
    :class:`~flyexplore.run.engine.CaseRunner`; it collects its own environment (its node's)."""

    def __init__(self, settings: CaseSettings, device: str, label: str):
        import faulthandler

        import ray

        faulthandler.enable(all_threads=True)
        import os

        node = ray.util.get_node_ip_address()
        self.runner = CaseRunner(settings, device, None, None, f"ray:{node}:{label}")
        try:  # Ray writes each worker's stderr to a log file of its node; the driver quotes its end
            self.runner.info["stderr"] = os.readlink("/proc/self/fd/2")
        except OSError:
            pass

    def info(self) -> dict:
        return self.runner.info

    def run(self, task: Task):
        rows, retire = [], False
        for b, cols in self.runner.run(task):
            rows.append((b, cols))
            retire = retire or sticky(cols)
        return rows, retire


def _first_lines(exc: BaseException, n: int = 2) -> str:
    """Ray's words for a dead actor: its first lines and any line about the exit."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = lines[:n] + [ln for ln in lines[n:] if "exit" in ln.lower()]
    return " | ".join(keep)[:800]


def _start_error(exc: BaseException) -> str:
    """Why an actor's start failed, one line: the exception its ``__init__`` raised (the last
    line of Ray's text, as ``raised UsageError: ...``, the way a local worker's ``fatal`` reads),
    else Ray's words for its death (:func:`_first_lines`)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if getattr(exc, "actor_init_failed", False) and lines:
        name, sep, rest = lines[-1].partition(": ")
        if sep and re.fullmatch(r"[\w.]+", name):
            return f"raised {name.rsplit('.', 1)[-1]}: {rest}"
        return f"raised {lines[-1]}"
    return _first_lines(exc)


#: Longest a ``ray.get`` of a result that ``ray.wait`` said is ready may take, s (fetching it
#: from another node's object store).
GET_TIMEOUT_S = 120.0


def run_ray(tasks, settings: CaseSettings, *, device, workers, case_timeout: float, max_cases: int,
            address, emit, should_stop=None, status=None, use_gpus: bool | None = None,
            start_timeout: float | None = None) -> list[str]:
    """Run ``tasks`` on Ray actors; arguments, start retries and the returned problems (one line
    each, ``[]`` when every actor started) as :func:`flyexplore.run.engine.run_tasks`:
    ``start_timeout`` (s, > 0; None = :data:`flyexplore.run.engine.WORKER_START_TIMEOUT_S`)
    bounds an actor's creation up to its answer to ``info`` (a place Ray cannot schedule counts
    as hung), and an actor whose ``__init__`` raises or dies is a failed start. Connects to
    ``address`` (or starts a local Ray instance, shut down at the end) unless Ray is already
    initialised in this process. ``use_gpus`` (default: whether the cluster has GPU resources
    and the sweep's device is not the CPU): one actor per GPU (``workers`` caps it), else
    ``workers`` (default 1) CPU actors. Raises ``ValueError`` for a ``start_timeout`` <= 0 and
    ``KeyboardInterrupt`` after killing every actor; a worker's failure never raises."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    start_limit = engine.start_limit(start_timeout)
    if not tasks:
        return []
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
    try:
        ngpu = int(ray.cluster_resources().get("GPU", 0))
        if use_gpus is None:
            use_gpus = ngpu > 0 and getattr(device, "type", "cuda") == "cuda"
        n = (min(workers or ngpu, ngpu) if use_gpus else (workers or 1))
        n = max(1, n)
        remote = ray.remote(num_gpus=1 if use_gpus else 0, num_cpus=1, max_restarts=0,
                            max_task_retries=0)(RayWorker)
        dev = "cuda:0" if use_gpus else "cpu"
        queue = list(tasks)
        if n > 1:
            queue.sort(key=lambda t: -t.cost)
        slots = [{"label": f"w{i}", "actor": None, "given_up": False} for i in range(n)]
        starts = engine.StartTracker("Ray worker")

        def start(s):
            s["actor"] = remote.remote(settings, dev, s["label"])
            s.update(info=None, info_ref=s["actor"].info.remote(), task=None, ref=None, cases=0,
                     spawned=engine._clock())

        def kill(s):
            if s["actor"] is not None:
                try:
                    ray.kill(s["actor"], no_restart=True)
                except Exception:  # noqa: BLE001, S110 - already gone
                    pass
            s["actor"] = None
            s["task"] = s["ref"] = s["info_ref"] = None

        def start_failed(s, why):
            kill(s)
            s["given_up"] = starts.failed(s["label"], why)

        def fail(s, st, msg):
            t = s["task"]
            for b in t.backends:
                emit(t, b, {"status": st, "message": msg}, s["info"] or {})

        stopping = False
        try:
            while True:
                if not stopping and should_stop is not None and queue and should_stop():
                    stopping = True
                for s in slots:  # a place without an actor gets one while there is work
                    if s["actor"] is None and not s["given_up"] and queue and not stopping:
                        start(s)
                for s in slots:
                    if s["actor"] is not None and s["info"] is not None and s["task"] is None and queue and not stopping:
                        t = queue.pop(0)
                        s["task"], s["ref"], s["started"] = t, s["actor"].run.remote(t), engine._clock()
                        starts.started(s["label"])
                        if status:
                            status(f"{t.case.label} {t.dtype} on {s['info']['worker']}")
                busy = [s for s in slots if s["task"] is not None]
                if not busy and (not queue or stopping):
                    break
                refs = {}
                for s in slots:
                    r = s["ref"] if s["task"] is not None else s.get("info_ref")
                    if s["actor"] is not None and r is not None:
                        refs[r] = s
                if not refs:  # every place given up
                    break
                now = engine._clock()
                waits = [engine.POLL_S]
                for s in refs.values():
                    if s["info"] is None:
                        waits.append(s["spawned"] + start_limit - now)
                    elif case_timeout > 0:
                        waits.append(s["started"] + case_timeout - now)
                done, _ = ray.wait(list(refs), num_returns=1, timeout=min(engine.POLL_S, max(0.0, min(waits)) + 0.005))
                for r in done:
                    s = refs[r]
                    if s["task"] is None:  # the actor's start-up
                        try:
                            s["info"], s["info_ref"] = ray.get(r, timeout=GET_TIMEOUT_S), None
                        except GetTimeoutError:
                            pass  # not fetched yet: the start limit still applies
                        except Exception as exc:  # noqa: BLE001 - its __init__ raised, or it died
                            start_failed(s, _start_error(exc))
                        continue
                    try:
                        rows, retire = ray.get(r, timeout=GET_TIMEOUT_S)
                    except RayActorError as exc:
                        info = s["info"] or {}
                        err = info.get("stderr")
                        tail = _tail(err) if err and os.path.isfile(err) else ""  # on this node only
                        fail(s, "crashed", f"worker crashed (Ray actor died) in this case: {_first_lines(exc)}"
                             + (f"; last stderr: {tail}" if tail else ""))
                        kill(s)
                        continue
                    except GetTimeoutError:
                        continue  # not fetched yet: the case limit still applies
                    t = s["task"]
                    for b, cols in rows:
                        emit(t, b, cols, s["info"])
                    s["task"], s["ref"] = None, None
                    s["cases"] += 1
                    if retire or s["cases"] >= max_cases:
                        kill(s)
                now = engine._clock()
                for s in slots:
                    if s["actor"] is None:
                        continue
                    if s["info"] is None and now - s["spawned"] > start_limit:
                        start_failed(s, engine.hung_text(start_limit))
                    elif s["task"] is not None and case_timeout > 0 and now - s["started"] > case_timeout:
                        fail(s, "timeout", f"case ran past --case-timeout {case_timeout:g} s (compile "
                             "included); its Ray worker was killed and replaced")
                        kill(s)
            not_run = 0
            if queue and not stopping:
                message = starts.not_run_message()
                for t in queue:
                    for b in t.backends:
                        emit(t, b, {"status": "crashed", "message": message}, {})
                not_run = len(queue)
                queue.clear()
            return starts.problems(not_run)
        finally:
            for s in slots:
                kill(s)
    finally:
        if started:
            ray.shutdown()
