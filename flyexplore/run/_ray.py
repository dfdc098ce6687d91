"""The Ray executor of :mod:`flyexplore.run.engine`: the same case function in Ray actors.

One actor per worker place (``num_gpus=1`` each when the cluster has GPUs -- Ray then pins the
actor's process to its GPU with ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` -- else
``num_cpus=1``), long-lived, killed and replaced after a crash, a time-out, a sticky device
error or ``max_cases`` cases, exactly as local workers are. The driver alone writes the journal
and the result file. Needs ``pip install 'flyexplore[ray]'``.
"""
from __future__ import annotations

import os
import time

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


def run_ray(tasks, settings: CaseSettings, *, device, workers, case_timeout: float, max_cases: int,
            address, emit, should_stop=None, status=None, use_gpus: bool | None = None) -> None:
    """Run ``tasks`` on Ray actors; arguments as :func:`flyexplore.run.engine.run_tasks`.
    Connects to ``address`` (or starts a local Ray instance, shut down at the end) unless Ray is
    already initialised in this process. ``use_gpus`` (default: whether the cluster has GPU
    resources and the sweep's device is not the CPU): one actor per GPU (``workers`` caps it),
    else ``workers`` (default 1) CPU actors."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

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
        slots = [{"label": f"w{i}", "actor": None} for i in range(n)]

        def start(s):
            s["actor"] = remote.remote(settings, dev, s["label"])
            s.update(info=None, info_ref=s["actor"].info.remote(), task=None, ref=None, cases=0)

        def kill(s):
            if s["actor"] is not None:
                ray.kill(s["actor"], no_restart=True)
            s["actor"] = None
            s["task"] = s["ref"] = s["info_ref"] = None

        def fail(s, st, msg):
            t = s["task"]
            for b in t.backends:
                emit(t, b, {"status": st, "message": msg}, s["info"] or {})

        stopping = False
        try:
            for s in slots:
                start(s)
            while True:
                if not stopping and should_stop is not None and queue and should_stop():
                    stopping = True
                for s in slots:
                    if s["actor"] is not None and s["info"] is not None and s["task"] is None and queue and not stopping:
                        t = queue.pop(0)
                        s["task"], s["ref"], s["started"] = t, s["actor"].run.remote(t), time.monotonic()
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
                if not refs:
                    break
                now = time.monotonic()
                waits = [s["started"] + case_timeout - now for s in busy] if case_timeout > 0 else []
                done, _ = ray.wait(list(refs), num_returns=1, timeout=max(0.0, min(waits)) if waits else None)
                for r in done:
                    s = refs[r]
                    if s["task"] is None:  # the actor's start-up
                        try:
                            s["info"], s["info_ref"] = ray.get(r), None
                        except Exception as exc:  # noqa: BLE001
                            raise RuntimeError(f"Ray worker {s['label']} could not start: {_first_lines(exc)}") from None
                        continue
                    try:
                        rows, retire = ray.get(r)
                    except RayActorError as exc:
                        info = s["info"] or {}
                        err = info.get("stderr")
                        tail = _tail(err) if err and os.path.isfile(err) else ""  # on this node only
                        fail(s, "crashed", f"worker crashed (Ray actor died) in this case: {_first_lines(exc)}"
                             + (f"; last stderr: {tail}" if tail else ""))
                        kill(s)
                        if queue and not stopping:
                            start(s)
                        continue
                    except GetTimeoutError:
                        continue
                    t = s["task"]
                    for b, cols in rows:
                        emit(t, b, cols, s["info"])
                    s["task"], s["ref"] = None, None
                    s["cases"] += 1
                    if retire or s["cases"] >= max_cases:
                        kill(s)
                        if queue and not stopping:
                            start(s)
                now = time.monotonic()
                for s in slots:
                    if s["task"] is not None and case_timeout > 0 and now - s["started"] > case_timeout:
                        fail(s, "timeout", f"case ran past --case-timeout {case_timeout:g} s (compile "
                             "included); its Ray worker was killed and replaced")
                        kill(s)
                        if queue and not stopping:
                            start(s)
        finally:
            for s in slots:
                if s["actor"] is not None:
                    try:
                        ray.kill(s["actor"], no_restart=True)
                    except Exception:  # noqa: BLE001 - already gone
                        pass
    finally:
        if started:
            ray.shutdown()
