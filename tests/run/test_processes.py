"""--processes: rows measured in several fresh processes, combined so that their interval covers
another run (flyexplore.run.processes, flyexplore.measure.stats.between_process / between_runs),
and cross-run compare from the files' own between-process variation."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import compare as C
from flyexplore.results import table as R
from flyexplore.run.journal import committed_rows, journal_path
from flyexplore.run.processes import combine, rotated
from flyexplore.run.spec import SweepSpec


def test_rotated_starts_each_pass_elsewhere():
    items = list(range(6))
    assert rotated(items, 3, 0) == items
    assert rotated(items, 3, 1) == [2, 3, 4, 5, 0, 1]
    assert rotated(items, 3, 2) == [4, 5, 0, 1, 2, 3]
    assert rotated(items, 1, 0) == items and rotated([], 3, 1) == []


def test_between_process_is_a_prediction_interval_that_covers_the_next_run():
    """Simulated runs of 3 processes with a between-process spread 10x the within one: the
    prediction interval of one run holds the next run's estimate about 95% of the time, a
    within-process interval far less often."""
    rng = np.random.default_rng(7)
    hit = naive = 0
    n = 2000
    for _ in range(n):
        a = np.exp(rng.normal(0, 0.01, 3))
        b = np.exp(rng.normal(0, 0.01, 3))
        e, lo, hi = S.between_process(a, [0.001] * 3)
        nb = math.exp(np.mean(np.log(b)))
        hit += lo <= nb <= hi
        naive += math.exp(-1.96 * 0.001) * e <= nb <= math.exp(1.96 * 0.001) * e
    assert 0.92 <= hit / n <= 0.98
    assert naive / n < 0.3


def test_between_process_floor_and_shift():
    # identical estimates: the within-process error is the floor, not a zero-width interval
    e, lo, hi = S.between_process([1.0, 1.0, 1.0], [0.002] * 3)
    assert lo < 1.0 < hi and hi / lo - 1 > 0.01
    # a run-wide shift widens it
    _, lo2, hi2 = S.between_process([1.0, 1.0, 1.0], [0.002] * 3, shift=0.03)
    assert lo2 < lo and hi2 > hi
    # one process: no interval
    assert math.isnan(S.between_process([1.0])[1])


def test_between_runs_identical_builds_can_read_same_and_a_regression_reads_slower():
    a = [1.000, 1.002, 0.999]
    b = [1.001, 0.999, 1.000]
    r, lo, hi, half = S.between_runs(a, [0.0005] * 3, b, [0.0005] * 3)
    assert S.verdict(lo, hi) == "SAME" and 0 < half < 0.01
    r, lo, hi, _ = S.between_runs(a, [0.0005] * 3, [3 * x for x in b], [0.0005] * 3)
    assert r == pytest.approx(1 / 3, rel=0.01) and S.verdict(lo, hi) == "SLOWER"


def _proc_row(t, lo, hi, sp=None, slo=None, shi=None, rounds=20, worker="w"):
    r = {"status": "ok", "time_ms": t, "time_ci_lo_ms": lo, "time_ci_hi_ms": hi, "rounds": rounds,
         "n_samples": rounds, "samples_ms": json.dumps([[t]] * rounds), "wall_s": 0.3, "verdict_s": 0.1,
         "clock_mhz_min": 1900.0, "converged": True, "accuracy_ok": True, "recheck_ok": True,
         "flops": 2e12, "worker": worker, "message": None, "stop_reason": "target"}
    if sp is not None:
        r.update(speedup=sp, speedup_lo=slo, speedup_hi=shi, verdict=S.verdict(slo, shi))
    return r


def test_combine_keeps_each_process_and_widens_to_the_spread():
    rows = [_proc_row(1.00, 0.999, 1.001, 0.90, 0.899, 0.901, worker="a"),
            _proc_row(1.03, 1.029, 1.031, 0.93, 0.929, 0.931, worker="b"),
            _proc_row(0.98, 0.979, 0.981, 0.88, 0.879, 0.881, worker="c")]
    out = combine(rows, 3, platform="cuda")
    assert out["processes"] == 3
    per = json.loads(out["process_estimates"])
    assert [p["time_ms"] for p in per] == [1.00, 1.03, 0.98] and [p["worker"] for p in per] == ["a", "b", "c"]
    assert out["time_ms"] == pytest.approx(math.exp(np.mean(np.log([1.00, 1.03, 0.98]))))
    # the interval covers every process's estimate (each within-process interval alone did not)
    assert out["time_ci_lo_ms"] < 0.98 and out["time_ci_hi_ms"] > 1.03
    assert out["speedup_lo"] < 0.88 and out["speedup_hi"] > 0.93
    assert out["verdict"] == "AMBIGUOUS"   # 0.88..0.93 over 3 processes: t(2) cannot rule out 0.99
    assert out["rounds"] == 60 and len(json.loads(out["samples_ms"])) == 60
    assert out["ci_method"].startswith("between-process") and out["worker"] == "a,b,c"
    assert out["tflops"] == pytest.approx(2e12 / (out["time_ms"] * 1e-3) / 1e12)


def test_combine_names_failed_processes_and_keeps_a_lone_failure():
    rows = [_proc_row(1.0, 0.99, 1.01), {"status": "crashed", "message": "worker crashed (SIGSEGV)"},
            _proc_row(1.01, 1.0, 1.02)]
    out = combine(rows, 3)
    assert out["status"] == "ok" and out["processes"] == 2 and "1 of 3 processes failed (crashed" in out["message"]
    bad = combine([{"status": "error", "message": "boom"}] * 2, 2)
    assert bad["status"] == "error" and bad["processes"] == 0 and "2 of 2 processes gave no time" in bad["message"]
    with pytest.raises(ValueError):
        combine([], 3)


def test_combine_says_each_note_once_however_many_processes_carry_it():
    """Issue 33: after SIGINT a --processes row's message said the same thing 43 times."""
    stop = "stopped by the user: timed over the rounds before the stop"
    rows = [{**_proc_row(1.0, 0.99, 1.01), "message": f"{stop}; unconverged after {k + 3} rounds: a label still undecided"}
            for k in range(3)]
    rows[1]["message"] = stop
    out = combine(rows, 3)
    assert out["message"].count(stop) == 1, out["message"]
    assert "unconverged in 2 of 3 processes (process 1: a label still undecided; process 3: a label" in out["message"]
    again = combine([out, {**_proc_row(1.0, 0.99, 1.01), "message": stop}], 2)   # a combined row combined again
    assert again["message"].count(stop) == 1, again["message"]


@pytest.mark.parametrize("kw, bad", [({"processes": 0}, "0"), ({"processes": "3"}, "'3'"),
                                     ({"processes": 2, "engine": "in-process"}, "--in-process"),
                                     ({"processes": 2, "order": "block"}, "block"),
                                     ({"processes": 21}, "over its limit of 20")])
def test_processes_option_is_checked(kw, bad):
    with pytest.raises(UsageError, match=bad):
        SweepSpec("gemm", shapes="64x64x64", dtypes="fp32", backends="aten", device="cpu", **kw)


def test_processes_and_pairs_past_their_limit_and_a_day_long_plan_need_force(capsys):
    """Issue 33: ``--processes 1000`` was accepted (about 3.3 h for one CPU case, nothing said).
    Past :data:`MAX_PASSES` processes or pairs, or a time bound over a day, the spec is refused in
    one line that gives the limit and ``--force``; with force it is made, and its note says the
    bound and what it is made of. The command line refuses before anything runs."""
    from flyexplore.cli import main as cli
    from flyexplore.run.spec import MAX_PASSES, MAX_SWEEP_S

    kw = dict(shapes="64x64x64", dtypes="fp32", backends="aten", device="cpu")
    with pytest.raises(UsageError, match=f"processes 1000 is over its limit of {MAX_PASSES}.*force=True"):
        SweepSpec("gemm", processes=1000, **kw)
    big = SweepSpec("gemm", processes=1000, force=True, **kw)
    assert big.time_bound_s() == pytest.approx(1000 * (8.0 + 2.0))
    assert big.time_note() == ("up to 2.8 h of timing: 1000 passes x (8 s worker start + 1 case x 2 s budget); "
                               "compiles not counted")
    assert big.fingerprint() == SweepSpec("gemm", processes=1000, force=True, **kw).fingerprint()
    with pytest.raises(UsageError, match="pairs 21 is over its limit"):
        SweepSpec("gemm", aa=True, pairs=21, **kw)
    with pytest.raises(UsageError, match=r"could take up to 25\.\d h .*over the limit of 24\.0 h"):
        SweepSpec("gemm", processes=20, timer={"budget_s": 4500.0}, **kw)
    assert SweepSpec("gemm", processes=20, timer={"budget_s": 4500.0}, force=True, **kw).time_bound_s() > MAX_SWEEP_S
    assert cli(["sweep", "--op", "gemm", "--shapes", "64x64x64", "--backends", "aten", "--processes", "1000",
                "--out", "never.parquet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--processes 1000 is over its limit of 20" in err[0] and "--force" in err[0], err


def test_processes_picks_local_workers_and_enters_the_plan():
    one = SweepSpec("gemm", shapes="64x64x64", dtypes="fp32", backends="aten", device="cpu")
    three = SweepSpec("gemm", shapes="64x64x64", dtypes="fp32", backends="aten", device="cpu", processes=3)
    assert one.engine_kind == "in-process" and three.engine_kind == "local"
    assert "processes" not in one.plan_dict() and three.plan_dict()["processes"] == 3


def _file(run, times, backend="aten", platform="cuda"):
    rows = []
    for case, per in times.items():
        c = combine([_proc_row(t, t * 0.999, t * 1.001) for t in per], len(per), platform=platform)
        c.update(op="gemm", case=case, dtype="bf16", backend=backend, run_id=run, platform=platform,
                 source="measured", order="interleaved")
        rows.append(c)
    return R.frame(rows)


def test_cross_run_compare_uses_the_files_own_variation():
    a = _file("r1", {"c1": [1.000, 1.002, 0.999], "c2": [2.0, 2.004, 1.998]})
    b = _file("r2", {"c1": [1.001, 0.999, 1.000], "c2": [2.001, 1.999, 2.003]})
    ab = C.pair(a, b)
    assert list(ab.pairs["interval"]) == ["between-process"] * 2
    assert list(ab.pairs["verdict"]) == ["SAME", "SAME"]
    assert (ab.pairs["allowance"] < 0.01).all() and ab.pairs["allowance_basis"].str.contains("between-process").all()
    slow = _file("r3", {"c1": [3.0, 3.006, 2.997], "c2": [6.0, 6.01, 5.99]})
    assert list(C.pair(a, slow).pairs["verdict"]) == ["SLOWER", "SLOWER"]


def test_geomean_keeps_a_common_allowance_whole():
    """1,000 cross-run pairs, each 5% slower within a 10% allowance: every pair AMBIGUOUS, and the
    geometric mean too (the allowance is one machine change, not noise that averages out)."""
    n = 1000
    p = pd.DataFrame({"ratio": np.full(n, 1 / 1.05), "interval": "unpaired+run", "allowance": 0.10})
    p["ratio_lo"] = p["ratio"] * 0.995 / 1.10
    p["ratio_hi"] = p["ratio"] / 0.995 * 1.10
    gm, lo, hi = C.geomean_interval(p)
    assert S.verdict(lo, hi) == "AMBIGUOUS" and lo < 0.90 and hi > 1.0
    naive = S.geomean_ci(p["ratio"], p["ratio_lo"], p["ratio_hi"])
    assert S.verdict(naive[1], naive[2]) == "SLOWER"   # what the independent rule said


@pytest.mark.slow
def test_sweep_with_processes_on_cpu(tmp_path):
    """A real CPU sweep in 2 fresh worker processes a case: one row per backend, 2 process
    estimates from 2 different worker pids, a between-process interval -- and no warning on a
    fault-free run (issue 33: Inductor's progress bar in each worker left a semaphore that the
    resource tracker reported as "leaked" at the end of every such run)."""
    r = subprocess.run([sys.executable, "-m", "flyexplore", "sweep", "--op", "gemm", "--shapes", "64x64x64",
                        "--dtypes", "fp32", "--backends", "aten,inductor", "--device", "cpu", "--processes", "2",
                        "--rep", "5", "--out", str(tmp_path / "p.parquet"), "--quiet"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "leaked" not in r.stderr and "Warning" not in r.stderr, r.stderr[-3000:]
    df = R.load(tmp_path / "p.parquet")
    assert len(df) == 2 and (df["processes"] == 2).all()
    for _, row in df.iterrows():
        per = R.process_estimates(row["process_estimates"])
        assert len(per) == 2 and len({p["worker"] for p in per}) == 2
        assert row["ci_method"].startswith("between-process")
    import flyexplore as fx

    back = fx.load(tmp_path / "p.parquet")
    assert (back["processes"] == 2).all()


# 8192x8192x8192 bf16 aten on an H200, two sweeps of 8 processes each, minutes apart
# (data/h200/reproducible/processes8/run1.parquet, run2.parquet: process_estimates time_ms)
_RUN1 = [1.5253, 1.4801, 1.5289, 1.5093, 1.5252, 1.4261, 1.4478, 1.4797]
_RUN2 = [1.4376, 1.4224, 1.4495, 1.3816, 1.5065, 1.3892, 1.4142, 1.4580]


def test_a_run_shift_in_proportion_to_the_spread_keeps_a_power_limited_a_vs_a_from_reading_faster():
    ses = [0.004] * 8
    # without it, the Welch interval of 8 + 8 processes calls the same build 4% faster
    _, lo, hi, _ = S.between_runs(_RUN1, ses, _RUN2, ses)
    assert S.verdict(lo, hi) == "FASTER"
    per_sd = R.run_shift_per_sd("cuda")
    r, lo, hi, half = S.between_runs(_RUN1, ses, _RUN2, ses, shift_per_sd=per_sd)
    assert r == pytest.approx(1.04, abs=0.005) and S.verdict(lo, hi) == "AMBIGUOUS"
    sd = math.sqrt((np.var(np.log(_RUN1), ddof=1) + np.var(np.log(_RUN2), ddof=1)) / 2)
    assert half >= S.Z95 * math.sqrt(2) * per_sd * sd
    # a flat shift larger than the proportional one wins; the CPU has no proportional term
    assert S.between_runs(_RUN1, ses, _RUN2, ses, shift=0.05, shift_per_sd=per_sd)[3] > half
    assert R.run_shift_per_sd("cpu") == 0.0 and R.run_shift_per_sd(None) == 0.0
    # a shape that barely moves between processes keeps an interval narrow enough for SAME
    a, b = [1.000, 1.001, 0.999, 1.000], [1.0005, 0.9995, 1.000, 1.001]
    _, lo, hi, _ = S.between_runs(a, [0.0005] * 4, b, [0.0005] * 4, shift_per_sd=per_sd)
    assert S.verdict(lo, hi) == "SAME"


def test_combine_and_cross_run_compare_apply_the_proportional_shift():
    # the row interval of 8 processes covers the other run's estimate only with the shift
    rows = [_proc_row(t, t * 0.996, t * 1.004) for t in _RUN1]
    out = combine(rows, 8, platform="cuda")
    other = math.exp(np.mean(np.log(_RUN2)))
    assert out["time_ci_lo_ms"] < other
    t, lo, hi = S.between_process(_RUN1, [S.log_se(t * 0.996, t * 1.004) for t in _RUN1])
    assert lo > other                       # the bare prediction interval misses it
    # compare of the two files: AMBIGUOUS, not FASTER
    a, b = _file("r1", {"c": _RUN1}), _file("r2", {"c": _RUN2})
    assert list(C.pair(a, b).pairs["verdict"]) == ["AMBIGUOUS"]


class _Journal:
    """The journal's pass-row calls, in memory (what ``sweep._passes`` is given)."""

    def __init__(self, have=None):
        self.have, self.added, self.final = have or {}, [], []


def _store(j: _Journal):
    from flyexplore.run.sweep import _Passes

    def make_row(case, dtype, b, cols, info):
        return {"op": "gemm", "case": case.label, "dtype": dtype, "backend": b, **cols, "worker": info["worker"]}

    return _Passes(j.have, lambda rows: j.added.extend(rows), make_row, j.final.append, "run2")


class _Bar:
    desc = "gemm sweep"

    def update(self, n):
        pass

    def set_description(self, d):
        self.desc = d


def _tasks():
    from flyexplore.ops.base import Case
    from flyexplore.run.engine import Task

    return [Task(i, Case("gemm", (), f"c{i}"), "fp32", ("aten", "inductor"), 1.0) for i in range(3)]


def _one_pass(calls, times):
    def one_pass(tasks, sink):
        k = len(calls)
        calls.append([(t.case.label, t.backends) for t in tasks])
        for t in tasks:
            for b in t.backends:
                sink(t, b, {"status": "ok", "time_ms": times[(t.case.label, b)] * (1 + 0.001 * k), "time_ci_lo_ms":
                            0.99, "time_ci_hi_ms": 1.01, "run_id": "run2"}, {"worker": f"w{k}/{t.case.label}"})
        return []
    return one_pass


def test_processes_journal_each_pass_row_as_it_comes_and_a_resume_runs_only_what_is_missing():
    """Issue 33: ``--processes`` used to journal nothing until its last pass. Now every pass row is
    committed as it comes; a resume that finds passes 1 and (for one case) 2 already journaled runs
    pass 2 for the other cases only, pass 3 for all, and combines each row from the journaled
    passes and the new ones; a backend whose passes were all in is not run again."""
    from flyexplore.run.sweep import _passes

    tasks = _tasks()
    times = {(t.case.label, b): 1.0 + t.index + (b == "inductor") for t in tasks for b in t.backends}
    # a fresh run, stopped after its first pass: 6 pass rows committed, nothing combined
    j = _Journal()
    calls = []
    asks = iter([False])   # asked before each pass: go, then stop
    _passes(tasks, 3, _one_pass(calls, times), _store(j), 0.01, _Bar(), lambda: next(asks, True))
    assert len(calls) == 1 and len(j.added) == 6 and {k for k, _ in j.added} == {0} and j.final == []
    # the resume's journal: pass 0 of all, pass 1 of c1, and c2 inductor complete already
    old = {}
    for k, row in j.added:
        old.setdefault((row["case"], "fp32"), {}).setdefault(k, {})[row["backend"]] = row
    for k in (1, 2):
        old[("c2", "fp32")].setdefault(k, {})["inductor"] = {**old[("c2", "fp32")][0]["inductor"], "worker": f"old{k}"}
    old[("c1", "fp32")][1] = {b: {**r, "worker": "old1"} for b, r in old[("c1", "fp32")][0].items()}
    j2 = _Journal(old)
    calls2 = []
    _passes(tasks, 3, _one_pass(calls2, times), _store(j2), 0.01, _Bar(), lambda: False)
    assert sorted(calls2[0]) == [("c0", ("aten", "inductor")), ("c2", ("aten",))]
    assert sorted(calls2[1]) == [("c0", ("aten", "inductor")), ("c1", ("aten", "inductor")), ("c2", ("aten",))]
    assert len(calls2) == 2 and len(j2.added) == 3 + 5
    # c2's inductor was complete: not run again, combined from its journaled passes with c2's aten
    c2 = next(r for r in j2.final if r["case"] == "c2" and r["backend"] == "inductor")
    assert [p["worker"] for p in R.process_estimates(c2["process_estimates"])] == ["w0/c2", "old1", "old2"]
    assert len(j2.final) == 6 and all(r["processes"] == 3 and r["run_id"] == "run2" for r in j2.final)
    c1 = next(r for r in j2.final if r["case"] == "c1" and r["backend"] == "aten")
    assert [p["worker"] for p in R.process_estimates(c1["process_estimates"])] == ["w0/c1", "old1", "w1/c1"]


@pytest.mark.slow
def test_a_processes_sweep_killed_after_its_first_pass_keeps_that_pass_and_resume_goes_on(tmp_path):
    """Issue 33: ten kills of a ``--processes`` run each found 0 rows journaled, and every resume
    started from zero. A real CPU sweep with ``--processes 2`` is SIGKILLed once pass 1's rows are
    committed (nothing combined yet, no result file); the resume runs pass 2 only: each final row
    combines the killed run's pass-1 measurement (same worker, same time) with a new one from
    another worker, and no pass row is left behind."""
    out = tmp_path / "p.parquet"
    cmd = [sys.executable, "-m", "flyexplore", "sweep", "--op", "gemm", "--shapes", "16x16x16;32x32x32",
           "--dtypes", "fp32", "--backends", "aten", "--processes", "2", "--rep", "5", "--out", str(out), "--quiet"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 600
        while time.monotonic() < end and p.poll() is None:
            if journal_path(out).exists() and len(committed_rows(out, passes=True)) >= 2:
                break
            time.sleep(0.05)
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        p.kill()
        p.wait(60)
    finally:
        p.kill()
    first = committed_rows(out, passes=True)
    assert not out.exists() and len(committed_rows(out)) == 0
    # pass 1 only: pass 2 needs a new worker (an import of torch, seconds), the poll is 0.05 s
    assert len(first) == 2 and set(first["pass"]) == {0}
    r = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    df = R.load(out)
    assert len(df) == 2 and (df["processes"] == 2).all() and not journal_path(out).exists()
    for _, row in first.iterrows():
        fin = df[df["case"] == row["case"]].iloc[0]
        per = R.process_estimates(fin["process_estimates"])
        k = int(row["pass"])
        assert per[k]["worker"] == row["worker"] and per[k]["time_ms"] == pytest.approx(row["time_ms"])
        assert len({p["worker"] for p in per}) == 2
