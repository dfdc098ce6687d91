import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from flyexplore.results import table as R
from flyexplore.errors import UsageError
from flyexplore.ops.base import Operator
from flyexplore.run.plan import make_plan
from flyexplore.run.spec import SweepSpec
from flyexplore.run.journal import committed_rows
from flyexplore.run.sweep import journal_path, run_sweep

FAST = {"rep": 5, "warmup": 1}


def toy_op(fail_on=(), oom_on=(), interrupt_on=(), sleep_on=(), wait_on=(), wait_for=None):
    """A real Operator (the catalogue's own class) whose backends fail on chosen cases; the
    ``good`` build of a case in ``wait_on`` waits until the file ``wait_for`` exists (at most
    300 s: the test says when it may go on, no clock involved)."""
    op = Operator("toy", "y = x * 2", dims=("m", "n"), options={}, dtypes=("fp32", "bf16"))
    op.make_inputs = lambda c, d, dev, seed: {"x": torch.randn(c["m"], c["n"], generator=torch.Generator().manual_seed(seed))}
    op.reference = lambda c, d, x: x["x"].double() * 2
    op.error = lambda out, ref, c, d: {"err_rel": float((out.double() - ref).norm() / ref.norm()), "err_tol": 1e-6}
    op.flops = lambda c: float(c["m"] * c["n"])
    op.bytes = lambda c, d: float(8 * c["m"] * c["n"])

    @op.backend("good", "x * 2", baseline=True)
    def _good(case, dtype, inputs, ctx):
        if case.label in interrupt_on:
            raise KeyboardInterrupt
        if case.label in sleep_on:
            time.sleep(60)
        if case.label in wait_on:
            end = time.monotonic() + 300
            while not os.path.exists(wait_for) and time.monotonic() < end:
                time.sleep(0.05)
        x = inputs["x"]
        return lambda: x * 2

    @op.backend("flaky", "fails on chosen cases")
    def _flaky(case, dtype, inputs, ctx):
        if case.label in fail_on:
            raise RuntimeError(f"compile error for {case.label}\nsecond line")
        if case.label in oom_on:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        x = inputs["x"]
        return lambda: x * 2.0001

    @op.backend("never", "unavailable", available=lambda ctx, c, d: "needs hardware we lack")
    def _never(case, dtype, inputs, ctx):
        raise AssertionError("must not build")

    return op


def test_plan_validation_names_bad_values():
    with pytest.raises(UsageError, match="unknown backend for gemm 'cublas'"):
        make_plan("gemm", shapes="8x8x8", backends="aten,cublas")
    with pytest.raises(UsageError, match="unknown dtype for gemm 'int4'"):
        make_plan("gemm", shapes="8x8x8", dtypes="int4")
    with pytest.raises(UsageError, match="exactly one"):
        make_plan("gemm")
    p = make_plan("gemm", shapes="8x8x8;16x16x16", dtypes="fp32,bf16", backends="aten")
    assert len(p) == 4


def test_failures_become_rows_and_sweep_goes_on(tmp_path):
    op = toy_op(fail_on={"4x4"}, oom_on={"8x8"})
    out = tmp_path / "r.parquet"
    df = run_sweep(SweepSpec(op, shapes="4x4;8x8;16x16", out=out, timer=FAST), progress=False)
    assert len(df) == 9
    st = df.set_index(["case", "backend"])["status"]
    assert st[("4x4", "flaky")] == "error" and st[("8x8", "flaky")] == "oom"
    assert st[("16x16", "flaky")] == "ok" and st[("4x4", "good")] == "ok"
    assert (df[df.backend == "never"]["status"] == "unavailable").all()
    msg = df.set_index(["case", "backend"])["message"][("4x4", "flaky")]
    assert msg == "RuntimeError: compile error for 4x4"  # first line only
    ok = df[df.status == "ok"]
    assert (ok.time_ms > 0).all() and (ok.timing_mode == "cpu-thread").all()
    # interleaved (the default): rep = 5 rounds, each of calls_per_round calls
    assert (ok.rounds == 5).all() and (ok.n_samples == 5 * ok.calls_per_round).all()
    assert (ok.order == "interleaved").all() and ok.tflops.notna().all()
    assert bool(ok.set_index(["case", "backend"]).loc[("16x16", "flaky"), "accuracy_ok"]) is False
    assert (ok[ok.backend == "good"].accuracy_ok).all()
    assert (df.source == "measured").all() and (df.platform == "cpu").all()
    assert df["torch"].iloc[0] == torch.__version__
    R.validate(df)
    assert len(R.load(out)) == 9 and not journal_path(out).exists()


def test_stop_keeps_rows_and_resume_finishes(tmp_path):
    op = toy_op()
    out = tmp_path / "r.csv"
    seen = []
    # interleaved: a case's backends are timed together, so Stop is honoured between cases
    df = run_sweep(SweepSpec(op, shapes="4x4;8x8;16x16", backends="good,flaky", out=out, timer=FAST),
                   progress=False, on_row=seen.append, should_stop=lambda: len(seen) >= 3)
    assert len(df) == 4 and len(R.load(out)) == 4
    assert [r["case"] for r in seen] == ["4x4", "4x4", "8x8", "8x8"]
    with pytest.raises(UsageError, match="exists"):
        run_sweep(SweepSpec(op, shapes="4x4", out=out), progress=False)
    ran = []
    df2 = run_sweep(SweepSpec(op, shapes="4x4;8x8;16x16", backends="good,flaky", out=out, resume=True,
                              timer=FAST), progress=False, on_row=ran.append)
    assert [(r["case"], r["backend"]) for r in ran] == [("16x16", "good"), ("16x16", "flaky")]
    assert len(df2) == 6 and len(R.load(out)) == 6
    assert not df2.duplicated(subset=list(R.KEY)).any()


def test_keyboard_interrupt_keeps_finished_rows(tmp_path):
    op = toy_op(interrupt_on={"16x16"})
    out = tmp_path / "r.parquet"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SweepSpec(op, shapes="4x4;8x8;16x16", backends="good", out=out, timer=FAST), progress=False)
    kept = R.load(out)
    assert kept["case"].tolist() == ["4x4", "8x8"]
    assert not journal_path(out).exists()


CRASH_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    sys.path.insert(0, {root!r})
    from test_sweep import toy_op, FAST
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep
    run_sweep(SweepSpec(toy_op(sleep_on={{"16x16"}}), shapes="4x4;8x8;16x16", backends="good", out={out!r},
                        resume={resume}, timer=FAST), progress=False)
""")


@pytest.mark.slow
def test_hard_crash_loses_no_finished_row(tmp_path):
    """SIGKILL mid-sweep: the journal holds the finished rows and --resume uses them."""
    out = tmp_path / "r.parquet"
    here = os.path.dirname(__file__)
    root = os.path.dirname(os.path.dirname(here))
    script = CRASH_SCRIPT.format(tests=here, root=root, out=str(out), resume=False)
    p = subprocess.Popen([sys.executable, "-c", script])
    jp = journal_path(out)
    deadline = time.time() + 120
    while time.time() < deadline:
        if jp.exists() and len(committed_rows(out)) >= 2:
            break
        time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not out.exists()
    assert [r for r in committed_rows(out)["case"]] == ["4x4", "8x8"]
    ran = []
    df = run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8;16x16", backends="good", out=out, resume=True,
                             timer=FAST), progress=False, on_row=ran.append)
    assert [r["case"] for r in ran] == ["16x16"]
    assert sorted(df["case"]) == ["16x16", "4x4", "8x8"]
    assert not jp.exists()


def test_real_catalogue_sweep_on_cpu(tmp_path):
    df = run_sweep(SweepSpec("topk", shapes="64x512x8;32x1024x4:largest=0", backends="aten,flydsl",
                             timer=FAST), progress=False)
    ok = df[df.backend == "aten"]
    assert (ok.status == "ok").all() and (ok.err_max_abs == 0).all() and ok.gbps.notna().all()
    fly = df[df.backend == "flydsl"]
    assert (fly.status == "unavailable").all() and fly.message.str.contains("ROCm").all()
    assert set(df.m) == {64, 32}


def test_progress_bar_shows_current_case(tmp_path, capsys):
    run_sweep(SweepSpec(toy_op(), shapes="4x4;8x8", backends="good", timer=FAST), progress=True)
    err = capsys.readouterr().err
    assert "toy sweep" in err and "2/2" in err and "8x8 fp32" in err
