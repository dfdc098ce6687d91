import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# no test reads the history store of the machine it runs on (flyexplore compare learns its
# cross-run allowance from the default store when there is one): the default is a folder no one has
os.environ["FLYEXPLORE_HISTORY"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"flyexplore-no-history-{os.getpid()}")

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
