"""Worker processes, time limits, sharding (flyexplore.run.engine), with injected faults; Ray's
own faults are in tests/run/test_ray.py.

The operator is tests/fault_ops.py's FAULTS, which the spawned workers import
by name: a case option says whether its ``faulty`` backend segfaults, hangs, raises, runs out
of memory or waits to be killed with SIGKILL from outside (by the test).
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flyexplore.results import table as R
from flyexplore.run.engine import STICKY_ERRORS, pin_env, sticky
from flyexplore.errors import UsageError
from flyexplore.run.plan import resolve_op
from flyexplore.run.spec import SweepSpec, choose_engine
from flyexplore.run.sweep import case_cost, journal_path, run_sweep

HERE = Path(__file__).resolve().parents[1]  # tests/: fault_ops.py
ROOT = HERE.parent
FAST = {"rep": 5, "warmup": 1}
OP = "fault_ops:FAULTS"
#: 7 healthy cases and 5 faulty ones; the faulty are the most expensive, so they are handed
#: out first and their replacements start while the other worker goes on.
HEALTHY = [f"{m}x8" for m in range(1, 8)]
FAULTY = {"64x64:fault=hang": "timeout", "60x60:fault=segv": "crashed", "56x56:fault=kill": "crashed",
          "52x52:fault=raise": "error", "48x48:fault=oom": "oom"}
SHAPES = ";".join(list(FAULTY) + HEALTHY)
#: Cases a local worker runs before it is replaced: the 2 + 7 cases after the three that end
#: their workers need at least three workers (ceil(9 / 4)), so the rule is always exercised;
#: without it the two workers left would run them all and one would run 5 or more.
MAX_CASES = 4


def _killer(fault_dir: Path):
    """Kill -9 the worker that reaches the ``kill`` case, from outside (this test)."""
    def run():
        p = fault_dir / "kill.pid"
        deadline = time.time() + 300
        while not p.exists() and time.time() < deadline:
            time.sleep(0.05)
        if p.exists():
            os.kill(int(p.read_text()), signal.SIGKILL)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _check_faulty_sweep(df, faulty=FAULTY, healthy=HEALTHY, max_cases=None, ray=False):
    """Every row is there once, the injected faults (``faulty``: case -> status) are labelled,
    every other row is ok."""
    assert len(df) == 2 * (len(healthy) + len(faulty))
    assert not df.duplicated(subset=list(R.KEY)).any()
    R.validate(df)
    st = df.set_index(["case", "backend"])["status"]
    msg = df.set_index(["case", "backend"])["message"]
    for case, want in faulty.items():
        assert st[(case, "faulty")] == want, (case, msg[(case, "faulty")])
        # a crash or a time-out takes the whole case (one worker times all its backends)
        assert st[(case, "good")] == (want if want in ("crashed", "timeout") else "ok"), case
    # the signal (local workers) and faulthandler's report from the worker's stderr
    assert "Fatal Python error: Segmentation fault" in msg[("60x60:fault=segv", "faulty")]
    if not ray:
        assert "SIGSEGV" in msg[("60x60:fault=segv", "faulty")]
    if "56x56:fault=kill" in faulty:
        assert "SIGKILL" in msg[("56x56:fault=kill", "good")]
    assert "--case-timeout" in msg[("64x64:fault=hang", "faulty")]
    if "52x52:fault=raise" in faulty:
        assert msg[("52x52:fault=raise", "faulty")] == "ValueError: injected exception in 52x52:fault=raise"
    ok = df[df["case"].isin(healthy)]
    assert (ok.status == "ok").all() and (ok.time_ms > 0).all()
    assert df.worker.notna().all()
    if max_cases is not None:  # a worker is replaced after max_cases cases
        per_pid = df.drop_duplicates(["case"]).groupby("worker").size()
        assert (per_pid <= max_cases).all(), per_pid
    return st


def test_engine_options_are_checked_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="torch sees no CUDA/ROCm GPU"):
        choose_engine("auto", devices="all")
    with pytest.raises(UsageError, match="--workers must be an integer >= 1, got 0"):
        choose_engine("auto", workers=0)
    with pytest.raises(UsageError, match="--case-timeout must be a number of seconds >= 0"):
        choose_engine("auto", case_timeout=-1)
    with pytest.raises(UsageError, match="--workers needs worker processes"):
        choose_engine("in-process", workers=2)
    with pytest.raises(UsageError, match="unknown engine 'threads'"):
        choose_engine("threads")
    # the CPU default is in-process; asking for workers, a time limit or a GPU means workers
    assert choose_engine("auto") == "in-process"
    assert choose_engine("auto", workers=2) == "local" == choose_engine("auto", case_timeout=5)
    out = tmp_path / "r.parquet"
    with pytest.raises(UsageError, match="needs --resume"):
        run_sweep(SweepSpec(OP, shapes="4x4", out=out, retry_failed=True), progress=False)
    from tests.run.test_sweep import toy_op  # an operator made in a function: no import path
    with pytest.raises(UsageError, match="not importable by a worker process"):
        run_sweep(SweepSpec(toy_op(), shapes="4x4", out=out, workers=1), progress=False)
    assert not out.exists() and not journal_path(out).exists()
    with pytest.raises(UsageError, match="cannot import operator 'no_such_mod:X'"):
        resolve_op("no_such_mod:X")
    assert case_cost(resolve_op(OP), resolve_op(OP).case("64x64"), "fp32") == 64 * 64


def test_pinning_sets_one_visible_gpu_and_never_rocr():
    assert pin_env(1, {}, rocm=False) == {"CUDA_VISIBLE_DEVICES": "1"}
    # an inherited list is mapped through: torch's index 1 is physical GPU 5
    assert pin_env(1, {"CUDA_VISIBLE_DEVICES": "4,5"}, rocm=False) == {"CUDA_VISIBLE_DEVICES": "5"}
    amd = pin_env(0, {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1,0"}, rocm=True)
    assert amd == {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": None}
    assert "ROCR_VISIBLE_DEVICES" not in pin_env(3, {}, rocm=True)
    assert sticky({"status": "error", "message": "RuntimeError: HIP error: an illegal memory access"})
    assert not sticky({"status": "error", "message": "ValueError: bad"}) and STICKY_ERRORS


@pytest.mark.slow
def test_faults_in_two_cpu_workers_every_other_row_kept_and_resume(tmp_path, monkeypatch):
    """12 cases on two CPU worker processes (sharding), each replaced after MAX_CASES cases: a
    segfault, a hang, a Python exception, an OOM and a worker killed with SIGKILL from outside;
    then --resume and --retry-failed."""
    fd = tmp_path / "faults"
    fd.mkdir()
    monkeypatch.setenv("FAULT_DIR", str(fd))
    out = tmp_path / "r.parquet"
    _killer(fd)
    t0 = time.time()
    df = run_sweep(SweepSpec(OP, shapes=SHAPES, out=out, workers=2, case_timeout=15,
                             max_cases_per_worker=MAX_CASES, timer=FAST), progress=False)
    _check_faulty_sweep(df, max_cases=MAX_CASES)
    assert time.time() - t0 < 240
    # two CPU worker places shared the cases; the crashed ones were replaced (new pids)
    assert {w.split("/")[0] for w in df.worker} == {"cpu0", "cpu1"}
    assert df.worker.nunique() >= 5
    assert R.load(out).shape[0] == len(df) and not journal_path(out).exists()
    # --resume keeps crashed/timeout rows: nothing left to run
    ran = []
    df2 = run_sweep(SweepSpec(OP, shapes=SHAPES, out=out, resume=True, workers=2, timer=FAST), progress=False,
                    on_row=ran.append)
    assert ran == [] and len(df2) == len(df)
    # --retry-failed runs exactly the crashed and timeout cases again (faults off now)
    (fd / "off").write_text("")
    df3 = run_sweep(SweepSpec(OP, shapes=SHAPES, out=out, resume=True, retry_failed=True, workers=1,
                              timer=FAST), progress=False, on_row=ran.append)
    again = {c for c, w in FAULTY.items() if w in ("crashed", "timeout")}
    assert {r["case"] for r in ran} == again and len(ran) == 2 * len(again)
    assert len(df3) == len(df) and not df3.duplicated(subset=list(R.KEY)).any()
    assert set(df3.status) == {"ok", "error", "oom"}
    assert len(R.load(out)) == len(df3)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in state


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_keeps_rows_and_says_resume(tmp_path, monkeypatch, capsys):
    """Ctrl-C to ``flyexplore sweep`` (a process of its own, as a terminal has it): exit 130,
    every worker gone, the finished rows kept, the resume hint; the same command with --resume
    (run here, in this process: no second interpreter) runs only the cases left."""
    fd = tmp_path / "faults"
    fd.mkdir()
    out = tmp_path / "r.csv"
    env = dict(os.environ, FAULT_DIR=str(fd),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-m", "flyexplore", "sweep", "--op", OP, "--shapes", "1x8;2x8;3x8;4x4:fault=hang;5x8",
            "--out", str(out), "--workers", "1", "--case-timeout", "0", "--rep", "5", "--quiet"]
    # a suite started from a background job hands its children SIGINT ignored: restore the
    # default so the sweep sees Ctrl-C as a terminal would send it
    p = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = fd / "pids"
    deadline = time.time() + 240
    while time.time() < deadline and not (pids.exists() and "hang" in pids.read_text()):
        time.sleep(0.1)
    assert pids.exists() and "hang" in pids.read_text(), p.stderr.read() if p.poll() is not None else ""
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "re-run the same command with --resume" in err
    for line in pids.read_text().splitlines():
        pid = int(line.split()[0])
        deadline = time.time() + 10
        while not _gone(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert _gone(pid), f"worker {pid} still running after Ctrl-C"
    kept = R.load(out)
    assert sorted(kept["case"].unique()) == ["1x8", "2x8", "3x8"] and len(kept) == 6
    assert not journal_path(out).exists()
    (fd / "off").write_text("")
    from flyexplore.cli import main as cli

    monkeypatch.setenv("FAULT_DIR", str(fd))
    capsys.readouterr()
    assert cli(args[3:] + ["--resume"]) == 0, capsys.readouterr().err
    assert "10 rows written to" in capsys.readouterr().out
    done = R.load(out)
    assert len(done) == 10 and (done.status == "ok").all()
    assert sorted(done[done.worker != kept.worker.iloc[0]]["case"].unique()) == ["4x4:fault=hang", "5x8"]
    assert not done.duplicated(subset=list(R.KEY)).any()
