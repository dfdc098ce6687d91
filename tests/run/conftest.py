"""One local Ray instance per pytest process, for every Ray test of tests/run (test_engine.py,
test_worker_start.py): starting Ray costs ~10 CPU-s and several processes on a 2-core machine,
so it is started the first time a test asks for it and shut down when the session ends.

Ray's workers (actors) take their environment from the instance's runtime environment, fixed
when Ray starts: ``PYTHONPATH`` (so that they import ``fault_ops``) and ``FAULT_DIR``, one
folder for the session that tests/fault_ops.py reads in every actor; :func:`ray_fault_dir`
empties it for the test that uses it.
"""
import os
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/: fault_ops.py and ray_start/
ROOT = HERE.parent
#: Tries of ``ray.init`` before the fixture gives up (see :func:`ray_session`).
RAY_INIT_TRIES = 3
#: CPUs the session's Ray instance offers: one per CPU actor of the Ray tests (at most two).
RAY_CPUS = 2


def _start_ray(fault_dir: Path) -> None:
    """``ray.init`` of a local instance whose actors import the tests' fault operators and see
    ``FAULT_DIR=fault_dir``. Ray's raylet gives its Python agents ~15 s to start; on a 2-core
    machine several of them importing at once can miss that (the raylet then aborts).
    tests/ray_start keeps a 3-s optional import out of them (see the file there), and the start
    is tried :data:`RAY_INIT_TRIES` times. The raylet and its agents take this process's
    ``PYTHONPATH`` when they start; it is put back right after, so that no other test's
    subprocess sees tests/ray_start."""
    import ray

    path = os.pathsep.join([str(HERE / "ray_start"), str(ROOT), str(HERE)])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        for attempt in range(RAY_INIT_TRIES):
            try:
                ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": path, "FAULT_DIR": str(fault_dir)}})
                return
            except Exception:
                ray.shutdown()
                if attempt == RAY_INIT_TRIES - 1:
                    raise
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """The session's local Ray instance (:data:`RAY_CPUS` CPUs, no GPU); the value is the
    ``FAULT_DIR`` folder its actors see. Skips when Ray is not installed."""
    ray = pytest.importorskip("ray")
    fault_dir = tmp_path_factory.mktemp("ray-faults")
    _start_ray(fault_dir)
    try:
        yield fault_dir
    finally:
        ray.shutdown()


@pytest.fixture
def ray_fault_dir(ray_session):
    """The ``FAULT_DIR`` of the session's Ray actors, emptied for this test (no ``off``,
    ``pids`` or ``kill.pid`` left by another)."""
    for p in ray_session.iterdir():
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    return ray_session
