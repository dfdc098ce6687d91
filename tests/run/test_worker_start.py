"""Workers that cannot hang or abort a sweep (flyexplore.run.engine, issue 22): the start-up
limit, the retries of a place whose start fails, the ``crashed`` rows of the cases no worker is
left for, and the problems ``run_tasks`` returns instead of raising.

The faults are tests/fault_ops.py's start faults: a file in ``$FAULT_DIR`` says what each
worker start does at its import of the operator (``stop``: SIGSTOP, ``exit``: exit code 1,
``raise``: the operator cannot be imported, the worker's ``fatal`` message); the driver, which
imports the operator too, is never hit. No test depends on the machine's speed: the one start
limit a healthy worker must beat is the default (300 s, far over a ~8 s start), and the hung
test reaches it through a clock that jumps once the worker is seen stopped.
"""
import contextlib
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from flyexplore.run import engine as E
from flyexplore.run.cases import case_cost
from flyexplore.run.engine import (
    START_ATTEMPTS,
    WORKER_START_TIMEOUT_S,
    CaseSettings,
    Task,
    run_tasks,
)
from flyexplore.run.plan import resolve_op
from flyexplore.run.spec import SweepSpec
from flyexplore.world import env as ENV

OP = "fault_ops:FAULTS"
FAST = {"rep": 5, "warmup": 1}
BACKENDS = ("good", "faulty")
#: Wall-clock bound of one run_tasks call here, s: >= 10x what its healthy starts and cases
#: take on an idle 2-core machine (at most four ~8 s starts in a row).
BOUND_S = 330.0
#: Start attempts of a place in the tests that start workers: the engine's START_ATTEMPTS (3) is
#: set to 2 there (:func:`attempts`), one worker start (~3 CPU-s: torch's import) less per place
#: given up. The engine reads it at each failed start; test_start_limit_and_problem_texts checks
#: the count at its real value.
ATTEMPTS = 2


@pytest.fixture
def attempts(monkeypatch):
    """:data:`flyexplore.run.engine.START_ATTEMPTS` set to :data:`ATTEMPTS` for this test."""
    assert ATTEMPTS < START_ATTEMPTS  # a count that the engine's own constant would not give
    monkeypatch.setattr(E, "START_ATTEMPTS", ATTEMPTS)
    return ATTEMPTS


@pytest.fixture(scope="module")
def env():
    return ENV.collect()


@pytest.fixture
def fault_dir(tmp_path, monkeypatch):
    """``$FAULT_DIR`` for the workers; afterwards any of their processes still there (a
    stopped worker left by a failing test) is killed, by its pid."""
    d = tmp_path / "faults"
    d.mkdir()
    monkeypatch.setenv("FAULT_DIR", str(d))
    yield d
    for pid in _fault_pids(d):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"multiprocessing" in cmd:
                os.kill(pid, signal.SIGKILL)


def _fault_pids(d: Path, what: str | None = None) -> list[int]:
    p = d / "pids"
    if not p.exists():
        return []
    return [int(ln.split()[0]) for ln in p.read_text().splitlines()
            if ln.strip() and (what is None or ln.split()[1] == what)]


def _state(pid: int) -> str:
    """The process state letter of ``pid`` (``T``: stopped, ``Z``: zombie), ``""`` when gone."""
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("State:"):
                return ln.split()[1]
    except OSError:
        pass
    return ""


def _gone(pid: int) -> bool:
    return _state(pid) in ("", "Z")


def _tasks(shapes):
    op = resolve_op(OP)
    return [Task(i, op.case(s), "fp32", BACKENDS, case_cost(op, op.case(s), "fp32")) for i, s in enumerate(shapes)]


def _run(tasks, env, **kw):
    """``run_tasks`` on CPU workers, in a thread that must end within :data:`BOUND_S`; its rows
    (case, backend, columns, worker) and the problems it returned."""
    settings = CaseSettings.of(SweepSpec(OP, shapes="1x8", workers=1, timer=FAST))
    rows, out = [], {}

    def emit(t, b, cols, info):
        rows.append({"case": t.case.label, "backend": b, **cols, "worker": info.get("worker")})

    def go():
        try:
            out["problems"] = run_tasks(tasks, settings, "local", device=torch.device("cpu"), env=env,
                                        emit=emit, **kw)
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            out["error"] = exc

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(BOUND_S)
    assert not th.is_alive(), f"run_tasks still running after {BOUND_S:g} s"
    if "error" in out:
        raise out["error"]
    return rows, out["problems"]


class _StopClock:
    """``time.monotonic`` plus an hour for every worker seen stopped by its ``stop`` start
    fault (state ``T`` in /proc): a stopped worker passes any start limit at once, a worker
    still importing torch never meets it, however loaded the machine."""

    def __init__(self, d: Path):
        self.d, self.seen = d, set()

    def __call__(self) -> float:
        for pid in _fault_pids(self.d, "start-stop"):
            if pid not in self.seen and _state(pid) == "T":
                self.seen.add(pid)
        return time.monotonic() + 3600.0 * len(self.seen)


def test_inbox_reads_whole_messages_and_never_waits_for_a_partial_one():
    r, w = os.pipe()
    box = E._Inbox(r)
    try:
        assert box.read() == []  # nothing there: back at once
        E._send_msg(w, ("row", 1, "good", {"status": "ok"}))
        data = pickle.dumps(("done", 1, False))
        frame = len(data).to_bytes(8, "big") + data
        os.write(w, frame[:5])  # a worker stopped inside a message: half a length
        assert box.read() == [("row", 1, "good", {"status": "ok"})]
        os.write(w, frame[5:-1])
        assert box.read() == [] and not box.eof
        os.write(w, frame[-1:])
        assert box.read() == [("done", 1, False)]
        # a message larger than the pipe holds arrives in pieces, whole in the end
        big = ("row", 2, "good", {"samples": list(range(100_000))})
        sender = threading.Thread(target=E._send_msg, args=(w, big))
        sender.start()
        got, deadline = [], time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got = box.read()
        sender.join(60)
        assert got == [big]
    finally:
        os.close(w)
    assert box.read() == [] and box.eof
    os.close(r)


def test_start_limit_and_problem_texts():
    assert E.start_limit(None) == WORKER_START_TIMEOUT_S == 300 and E.start_limit(5) == 5.0
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="start_timeout must be a number of seconds > 0"):
            E.start_limit(bad)
    with pytest.raises(ValueError, match="start_timeout"):
        run_tasks([], None, "local", device=torch.device("cpu"), env=None, emit=print, start_timeout=0)
    assert run_tasks([], None, "local", device=torch.device("cpu"), env=None, emit=print) == []
    st = E.StartTracker()
    assert not st.failed("cpu0", "exit code 1: boom") and not st.failed("cpu0", "exit code 1: boom")
    st.started("cpu0")  # a worker that took a case: the count starts again
    assert [st.failed("cpu0", "x") for _ in range(START_ATTEMPTS)] == [False] * (START_ATTEMPTS - 1) + [True]
    assert st.failed("cpu1", "a" * 1000) is False and len(st.why["cpu1"]) == 600
    for _ in range(START_ATTEMPTS - 1):
        st.failed("cpu1", E.hung_text(300))
    assert st.given_up == ["cpu0", "cpu1"]
    assert st.not_run_message() == ("not run: worker cpu0 could not start (3 attempts; last: x); worker cpu1 could "
                                    "not start (3 attempts; last: hung past --worker-start-timeout 300 s)")
    assert st.problems(4) == [
        "worker cpu0 could not start after 3 attempts (last: x); the other workers took its cases",
        ("worker cpu1 could not start after 3 attempts (last: hung past --worker-start-timeout 300 s); "
        "4 cases got crashed rows")]
    assert E.StartTracker().problems(0) == []


@pytest.mark.slow
def test_a_worker_stopped_at_every_start_gives_crashed_rows_and_a_problem(fault_dir, env, monkeypatch,
                                                                           attempts):
    """The issue's SIGSTOP right after spawn, at every attempt: each is killed at the start
    limit (the default, reached through the clock), the place is given up after
    ATTEMPTS, the cases get crashed rows saying why, and run_tasks returns."""
    (fault_dir / "start").write_text("stop " * (ATTEMPTS + 2))
    monkeypatch.setattr(E, "_clock", _StopClock(fault_dir))
    rows, problems = _run(_tasks(["1x8", "2x8"]), env, workers=1, case_timeout=20)
    why = f"hung past --worker-start-timeout {WORKER_START_TIMEOUT_S:g} s"
    assert problems == [(f"worker cpu0 could not start after {ATTEMPTS} attempts (last: {why}); "
                        "2 cases got crashed rows")]
    assert sorted((r["case"], r["backend"]) for r in rows) == sorted((c, b) for c in ("1x8", "2x8") for b in BACKENDS)
    for r in rows:
        assert r["status"] == "crashed" and r["worker"] is None
        assert r["message"] == f"not run: worker cpu0 could not start ({ATTEMPTS} attempts; last: {why})"
    stopped = _fault_pids(fault_dir, "start-stop")
    assert len(stopped) == ATTEMPTS  # exactly that many starts, each one stopped ...
    assert (fault_dir / "start").read_text().split() == ["stop", "stop"]
    assert all(_gone(p) for p in stopped)  # ... and killed


@pytest.mark.slow
def test_a_replacement_that_dies_while_starting_is_retried_and_every_case_runs(fault_dir, env):
    """The issue's replacement worker that dies while starting (it aborted the sweep with a
    RuntimeError): the first worker runs two cases and is replaced (max_cases=2), the
    replacement exits at its import, the next one runs the last case."""
    (fault_dir / "start").write_text("ok exit")
    rows, problems = _run(_tasks(["1x8", "2x8", "3x8"]), env, workers=1, max_cases=2)
    assert problems == []
    assert len(rows) == 6 and all(r["status"] == "ok" and r["time_ms"] > 0 for r in rows), rows
    assert (fault_dir / "start").read_text().split() == []  # both starts took their word
    died = _fault_pids(fault_dir, "start-exit")
    assert len(died) == 1
    by_case = {r["case"]: r["worker"] for r in rows}
    assert by_case["1x8"] == by_case["2x8"] != by_case["3x8"]
    assert by_case["3x8"].startswith("cpu0/pid") and by_case["3x8"] != f"cpu0/pid{died[0]}"


@pytest.mark.slow
def test_a_worker_that_cannot_import_the_operator_gives_crashed_rows_not_an_exception(fault_dir, env, attempts):
    """The worker's ``fatal`` message (its CaseRunner raised: the operator cannot be imported
    there) used to raise RuntimeError; now each start is retried, then the cases get crashed rows."""
    (fault_dir / "start").write_text("raise " * ATTEMPTS)
    rows, problems = _run(_tasks(["1x8", "2x8"]), env, workers=1)
    why = ("raised UsageError: cannot import operator 'fault_ops:FAULTS' (ImportError: injected start fault: "
           "this worker cannot import fault_ops)")
    assert problems == [(f"worker cpu0 could not start after {ATTEMPTS} attempts (last: {why}); "
                        "2 cases got crashed rows")]
    assert len(rows) == 4
    for r in rows:
        assert r["status"] == "crashed"
        assert r["message"] == f"not run: worker cpu0 could not start ({ATTEMPTS} attempts; last: {why})"
    assert len(_fault_pids(fault_dir, "start-raise")) == ATTEMPTS


@pytest.mark.slow
def test_a_place_given_up_leaves_its_cases_to_the_other_worker(fault_dir, env, attempts):
    """Two CPU places; every worker of cpu1 exits at its import. cpu0 holds its first case
    (``fault=wait``) until cpu1 has failed ATTEMPTS times, so cpu1 is given up while
    cases are left; cpu0 runs them all."""
    (fault_dir / "start.cpu1").write_text("exit " * (ATTEMPTS + 2))

    def release():  # the wait case ends once cpu1's last attempt is dead
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            died = _fault_pids(fault_dir, "start-exit")
            if len(died) >= ATTEMPTS and all(_gone(p) for p in died):
                break
            time.sleep(0.1)
        (fault_dir / "go").write_text("")

    threading.Thread(target=release, daemon=True).start()
    rows, problems = _run(_tasks(["64x64:fault=wait", "2x8", "3x8"]), env, workers=2)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"worker cpu1 could not start after {ATTEMPTS} attempts (last: exit code 1: ")
    assert "injected start fault: exit at import" in problems[0]
    assert problems[0].endswith("; the other workers took its cases")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows
    assert all(r["worker"].startswith("cpu0/") for r in rows)
    assert len(_fault_pids(fault_dir, "start-exit")) == ATTEMPTS
    assert (fault_dir / "start.cpu1").read_text().split() == ["exit", "exit"]
