"""One local Ray instance for the Ray tests (all in tests/run/test_ray.py, one after the other):
starting Ray costs ~10 CPU-s and several processes on a 2-core machine, and an idle instance
about 2 CPU-s a minute, so it is started by the first test that asks for it and shut down after
the last one (:func:`pytest_runtest_teardown`: the next test of this pytest process does not ask
for it), not kept to the session's end.

Ray's workers (actors) take their environment from the instance's runtime environment, fixed
when Ray starts: ``PYTHONPATH`` (so that they import ``fault_ops``) and ``FAULT_DIR``, one
folder for the session that tests/fault_ops.py reads in every actor; :func:`ray_fault_dir`
empties it for the test that uses it.
"""
import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/: fault_ops.py and ray_start/
ROOT = HERE.parent
#: Tries of ``ray.init`` before the fixture gives up (see :func:`ray_session`).
RAY_INIT_TRIES = 3
#: CPUs the Ray instance offers: one per CPU actor of the Ray tests (at most two).
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
def _ray_faults(tmp_path_factory) -> Path:
    """The session's ``FAULT_DIR`` folder for Ray's actors (one, whichever instance reads it)."""
    return tmp_path_factory.mktemp("ray-faults")


@pytest.fixture
def ray_session(_ray_faults):
    """The local Ray instance of the Ray tests (:data:`RAY_CPUS` CPUs, no GPU), started if it is
    not running; the value is the ``FAULT_DIR`` folder its actors see. Skips when Ray is not
    installed."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        _start_ray(_ray_faults)
    return _ray_faults


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Shut this process's Ray instance down after a test when the next one does not ask for it
    (or there is none): pytest-xdist hands a worker its next test before it runs one, so
    ``nextitem`` is known, and the Ray tests, side by side in one module, share one start."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        if nextitem is None or "ray_session" not in getattr(nextitem, "fixturenames", ()):
            sys.modules["ray"].shutdown()


@pytest.fixture
def ray_fault_dir(ray_session):
    """The ``FAULT_DIR`` of the Ray actors, emptied for this test (no ``off``,
    ``pids`` or ``kill.pid`` left by another)."""
    for p in ray_session.iterdir():
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    return ray_session
