"""Ray's own faults (flyexplore.run._ray): an actor that dies in a case or hangs past the case
limit, and actors that cannot start. Every Ray test of the suite is here, one after the other,
so that one local Ray instance serves them all (tests/run/conftest.py starts it for the first and
shuts it down after the last: an idle instance costs about 2 CPU-s a minute on the 2-core
machine, a start about 10).

The operator is tests/fault_ops.py's FAULTS, which the actors import by name (Ray's runtime
environment puts the tests folder on their path).
"""
import dataclasses

import pytest
import torch

from flyexplore.results import table as R
from flyexplore.run.engine import CaseSettings
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import run_sweep
from tests.run.test_engine import FAST, OP, _check_faulty_sweep
from tests.run.test_worker_start import ATTEMPTS, _tasks, attempts  # noqa: F401 - attempts: a fixture

pytestmark = pytest.mark.slow  # Ray's processes and actors

#: Ray's own handling of a worker's end: an actor that dies in a case (a segfault: Ray's words
#: and the end of the actor's stderr log) and one past --case-timeout (killed by the driver).
#: The other faults are the case function's, the same in every engine: the local-worker sweep of
#: tests/run/test_engine.py has them all.
RAY_FAULTY = {"64x64:fault=hang": "timeout", "60x60:fault=segv": "crashed"}
RAY_HEALTHY = ["2x8", "1x8"]


def test_faults_on_ray_same_rows(tmp_path, ray_fault_dir):
    """A hang and a segfault on two Ray actors (the local Ray instance of the Ray tests on the CPU,
    tests/run/conftest.py): the same rows as local workers give; then --retry-failed."""
    fd = ray_fault_dir
    out = tmp_path / "r.jsonl"
    shapes = ";".join(list(RAY_FAULTY) + RAY_HEALTHY)
    df = run_sweep(SweepSpec(OP, shapes=shapes, out=out, engine="ray", workers=2, case_timeout=15, timer=FAST),
                   progress=False)
    _check_faulty_sweep(df, RAY_FAULTY, RAY_HEALTHY, ray=True)
    assert all(w.startswith("ray:") for w in df.worker)
    # the segfaulted actor was replaced: the healthy cases ran on another one
    assert not set(df[df["case"].isin(RAY_HEALTHY)].worker) & set(df[df["case"] == "60x60:fault=segv"].worker)
    (fd / "off").write_text("")
    ran = []
    df2 = run_sweep(SweepSpec(OP, shapes=shapes, out=out, resume=True, retry_failed=True, engine="ray",
                              workers=1, timer=FAST), progress=False, on_row=ran.append)
    assert {r["case"] for r in ran} == set(RAY_FAULTY) and len(ran) == 2 * len(RAY_FAULTY)
    assert len(df2) == len(df) and not df2.duplicated(subset=list(R.KEY)).any()
    assert not set(df2.status) & {"crashed", "timeout"}


def test_ray_actors_that_cannot_start_give_crashed_rows_and_problems(ray_session, attempts):
    """run_ray, the same rules: an actor whose start raises (the operator cannot be imported
    there) and an actor Ray can never place (a GPU asked of a CPU-only instance: hung, whatever
    the machine's load) are each tried ATTEMPTS times; the cases get crashed rows. On the
    local Ray instance of the Ray tests (tests/run/conftest.py)."""
    from flyexplore.run._ray import run_ray

    settings = CaseSettings.of(SweepSpec(OP, shapes="1x8", workers=1, timer=FAST))
    rows = []

    def emit(t, b, cols, info):
        rows.append((t.case.label, b, cols, info))

    missing = dataclasses.replace(settings, op="no_such_module_here:OP")
    problems = run_ray(_tasks(["1x8", "2x8"]), missing, device=torch.device("cpu"), workers=1,
                       case_timeout=0, max_cases=50, address=None, emit=emit)
    why = ("raised UsageError: cannot import operator 'no_such_module_here:OP' (ModuleNotFoundError: "
           "No module named 'no_such_module_here')")
    assert problems == [(f"Ray worker w0 could not start after {ATTEMPTS} attempts (last: {why}); "
                        "2 cases got crashed rows")]
    assert len(rows) == 4 and all(c["status"] == "crashed" for _, _, c, _ in rows)
    assert {c["message"] for _, _, c, _ in rows} == {
        f"not run: Ray worker w0 could not start ({ATTEMPTS} attempts; last: {why})"}
    rows.clear()
    problems = run_ray(_tasks(["1x8"]), settings, device=torch.device("cpu"), workers=1, case_timeout=0,
                       max_cases=50, address=None, emit=emit, use_gpus=True, start_timeout=1)
    why = "hung past --worker-start-timeout 1 s"
    assert problems == [(f"Ray worker w0 could not start after {ATTEMPTS} attempts (last: {why}); "
                        "1 case got crashed rows")]
    assert [(c, b) for c, b, _, _ in rows] == [("1x8", "good"), ("1x8", "faulty")]
    assert {cols["message"] for _, _, cols, _ in rows} == {
        f"not run: Ray worker w0 could not start ({ATTEMPTS} attempts; last: {why})"}
