import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bytecode caches for this checkout, even where PYTHONDONTWRITEBYTECODE is set (the 2-core
# development machine sets it): without them each pytest worker compiles and assertion-rewrites
# every test module again on every run (21 CPU-s a worker to collect instead of 8), and each of the
# several hundred interpreters the suite starts (workers, kernels, CLI runs) compiles the
# flyexplore modules it imports again. The caches go in __pycache__ folders
# beside the sources, which git ignores; this conftest is read before any test module is
# imported, and the pytest-xdist workers and every subprocess inherit the environment.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
if os.environ.get("PYTEST_XDIST_WORKER") is None:
    # once, before the workers start: flyexplore's and the tests' modules compiled (0.8 CPU-s on a
    # clean clone, a stat a file after that), so that no early worker or subprocess compiles them again
    import compileall

    for _folder in ("flyexplore", "tests"):
        compileall.compile_dir(str(ROOT / _folder), quiet=1)

# no test reads the history store of the machine it runs on (flyexplore compare learns its
# cross-run allowance from the default store when there is one): the default is a folder no one has
os.environ["FLYEXPLORE_HISTORY"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"flyexplore-no-history-{os.getpid()}")

# nor its disk cache (FLYEXPLORE_CACHE: the memory fits of flyexplore.run.memory): one temporary
# folder for the whole session, shared by the pytest-xdist workers (the fits are keyed by torch,
# flyexplore, device and probes, and written atomically), removed at the end. A test that needs an
# empty cache sets its own (tests/run/test_memory.py).
_SESSION_CACHE = None
if "FLYEXPLORE_CACHE" not in os.environ or os.environ.get("PYTEST_XDIST_WORKER") is None:
    import tempfile

    _SESSION_CACHE = tempfile.mkdtemp(prefix="flyexplore-test-cache-")
    os.environ["FLYEXPLORE_CACHE"] = _SESSION_CACHE

# Hypothesis: the README's commands run few examples a property (the "quick" profile, loaded
# here); ``pytest --hypothesis-profile=full`` runs each property's full count (its ``examples(n)``).
from hypothesis import settings as _hyp_settings  # noqa: E402

#: Examples a property runs in the quick profile (the suite's default), at most.
QUICK_EXAMPLES = 15
_hyp_settings.register_profile("quick", max_examples=QUICK_EXAMPLES)
_hyp_settings.register_profile("full", max_examples=1000)
_hyp_settings.load_profile("quick")


def examples(full: int, quick: int = QUICK_EXAMPLES) -> int:
    """How many examples a property test runs: ``full`` under ``--hypothesis-profile=full`` (the
    slow lane: any profile of more than :data:`QUICK_EXAMPLES` examples), else at most ``quick``
    (the default, quick profile). Read when the test module is imported, after pytest loaded the
    profile."""
    return full if _hyp_settings.default.max_examples > QUICK_EXAMPLES else min(full, quick)


#: The committed data files that the per-file checks against frozen old implementations run on in
#: the fast lane: one of each kind (a CPU sweep, a JSONL example, a GPU CSV, an environment A/B, a
#: ``--processes`` run, attention rows, a published table that is no result file). The full suite
#: checks every file under ``data/`` (:func:`data_file_params`).
FAST_DATA_FILES = frozenset({
    "data/bench/cpu_sweeps/topk.parquet",
    "data/examples/aotriton/aotriton_0.13b_synthetic.jsonl",
    "data/h200/journal/start_rows.csv",
    "data/h200/ab/aa.parquet",
    "data/h200/reproducible/processes8/run1.parquet",
    "data/h200/layers_smoke/attention.parquet",
    "data/published/topk.csv",
})


def data_file_params(files):
    """``files`` (paths relative to the repository) as pytest parameters: those in
    :data:`FAST_DATA_FILES` as they are, every other one marked ``slow``, so that the fast lane
    samples the committed data and the full suite checks all of it."""
    return [f if f in FAST_DATA_FILES else pytest.param(f, marks=pytest.mark.slow) for f in files]


@functools.cache
def result_file_facts(path: str) -> dict:
    """What the per-file tests need to know of a committed file, read cheaply at collection (its
    header, then only the columns ``status``, ``backend``, ``time_ms``, ``processes``):
    ``result`` (it has :data:`~flyexplore.results.table.IDENTITY_COLUMNS`: :func:`R.load` takes
    it), ``timed`` (an ``ok``/``published`` row with a backend and a time, rows of
    ``sweep --processes`` left out) and ``processes`` (a row measured with ``--processes`` >= 2).
    Read once a process (two test modules ask for every file). Do not modify the returned dict."""
    import warnings

    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    from flyexplore.errors import UsageError
    from flyexplore.results import table as R

    f = ROOT / path
    want = ["status", "backend", "time_ms", "processes"]
    if path.endswith(".parquet"):
        cols = pq.read_schema(f).names
        read = lambda use: pq.read_table(f, columns=use).to_pandas()   # noqa: E731
    elif path.endswith(".csv"):
        try:
            cols = list(pd.read_csv(f, nrows=0).columns)
        except (pd.errors.EmptyDataError, UnicodeDecodeError, pd.errors.ParserError):
            cols = []
        read = lambda use: pd.read_csv(f, usecols=use)   # noqa: E731
    else:   # JSONL: small files, read whole
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                df = R.load(f)
            cols = list(df.columns)
        except UsageError:
            cols = []
        read = lambda use: df[use]   # noqa: E731
    if not set(R.IDENTITY_COLUMNS) <= set(cols):
        return {"result": False, "timed": False, "processes": False}
    d = read([c for c in want if c in cols])
    for c in want:
        if c not in d:
            d[c] = np.nan
    procs = pd.to_numeric(d["processes"], errors="coerce").fillna(1).to_numpy() >= 2
    timed = (d["status"].isin(["ok", "published"]) & d["backend"].notna() & pd.to_numeric(
        d["time_ms"], errors="coerce").notna()).to_numpy(dtype=bool)
    return {"result": True, "timed": bool((timed & ~procs).any()), "processes": bool(procs.any())}


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run ``python -m flyexplore ARGS`` and return the CompletedProcess (text)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "flyexplore", *args], cwd=cwd or ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


def pytest_unconfigure(config):
    """The session's temporary ``FLYEXPLORE_CACHE`` goes, from the process that made it (the
    pytest-xdist controller, once every worker ended)."""
    if _SESSION_CACHE:
        import shutil

        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
