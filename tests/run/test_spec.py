"""Issue 20: one SweepSpec (flyexplore.run.spec) that the command line, the panel and fx.sweep build
and run_sweep takes; every option checked once there, with one-line errors naming the value; the
spec travels with the rows (attrs["sweeps"]) without a new result column."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flyexplore as fx
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.run.spec import FILE_FIELDS, SweepSpec
from flyexplore.run.sweep import run_sweep

from conftest import ROOT
from tests.run.test_sweep import FAST, toy_op


def test_a_spec_is_normalized_frozen_and_read_only():
    s = SweepSpec("gemm", shapes=["8x8x8", "16x8x8"], dtypes="fp32, bf16", backends=["aten"], timer=FAST,
                  out="r.parquet")
    assert s.shapes == ("8x8x8", "16x8x8") and s.dtypes == ("fp32", "bf16") and s.backends == ("aten",)
    assert s.out == Path("r.parquet")
    assert len(s.plan) == 4 and s.plan.op.name == "gemm" and s.engine_kind == "in-process"
    assert s.band == S.BAND and s.order == "interleaved" and s.seed == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.band = 0.02
    with pytest.raises(TypeError):
        s.timer["rep"] = 1  # the spec's timer is a read-only view of its own copy
    t = dict(FAST)
    s2 = SweepSpec("gemm", shapes="8x8x8", timer=t)
    t["rep"] = 99
    assert s2.timer["rep"] == FAST["rep"]


@pytest.mark.parametrize("kw,needle", [
    ({"order": "zigzag"}, "unknown order 'zigzag' (valid: interleaved, block)"),
    ({"backends": "aten,cublas"}, "unknown backend for gemm 'cublas'"),
    ({"dtypes": "int4"}, "unknown dtype for gemm 'int4'"),
    ({"shapes": "8x8"}, "malformed gemm shape '8x8'"),
    ({"suite": "cpu-small"}, "give exactly one of a suite and shapes"),
    ({"timer": {"reps": 3}}, "unknown timer option 'reps'"),
    ({"timer": {"rep": 0}}, "timer option rep must be an integer >= 1, got 0"),
    ({"timer": {"mode": "graph"}}, "timing mode 'graph' works in block order only"),
    ({"timer": {"mode": "kernel"}}, "timing mode 'kernel' needs a GPU; on the CPU use auto, cpu-thread or cpu-wall"),
    ({"order": "block", "timer": {"target": 0.01}}, "unknown timer option 'target'"),
    ({"resume": True, "overwrite": True}, "--resume and --overwrite exclude each other"),
    ({"retry_failed": True}, "--retry-failed runs the crashed and timeout rows of a file again: it needs --resume"),
    ({"band": 0.5}, f"band must be a fraction in (0, 0.5), e.g. {S.BAND:g} for ±1%, got 0.5"),
    ({"baseline": "triton", "backends": "aten"}, "baseline 'triton' is not among the backends (aten)"),
    ({"seed": -1}, "--seed must be an integer in [0, 2**64), got -1"),
    ({"device": "meta"}, "unknown device type 'meta' (valid: cpu, cuda)"),
    ({"ray_address": "ray://x:1"}, "--ray-address needs --executor ray"),
    ({"engine": "threads"}, "unknown engine 'threads'"),
    ({"workers": 0}, "--workers must be an integer >= 1, got 0"),
    ({"trace": "yes"}, "trace must be True or False, got 'yes'"),
])
def test_every_option_is_checked_by_the_spec_in_one_line(kw, needle):
    kw = {"shapes": "8x8x8", **kw}
    with pytest.raises(UsageError) as ei:
        SweepSpec("gemm", **kw)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg, msg


def test_flags_name_the_options_as_the_command_line_does():
    with pytest.raises(UsageError, match=r"^--rep must be an integer >= 1, got 0$"):
        SweepSpec("gemm", shapes="8x8x8", timer={"rep": 0}, flags=True)
    with pytest.raises(UsageError, match=r"^--ci-target must be a fraction in \(0, 0.5\)"):
        SweepSpec("gemm", shapes="8x8x8", timer={"target": 0.7}, flags=True)
    with pytest.raises(UsageError, match=r"^--ci-target and --budget-s apply to --order interleaved only$"):
        SweepSpec("gemm", shapes="8x8x8", order="block", timer={"budget_s": 1.0}, flags=True)
    with pytest.raises(UsageError, match=r"^--band must be"):
        SweepSpec("gemm", shapes="8x8x8", band=0.0, flags=True)


def test_names_are_checked_before_torch_is_imported():
    code = ("import sys\nfrom flyexplore.errors import UsageError\nfrom flyexplore.run.spec import SweepSpec\n"
            "try:\n    SweepSpec('gemm', shapes='8x8x8', backends='cublas')\n"
            "except UsageError as e:\n    print('ERR', e)\n"
            "print('torch' in sys.modules, 'pandas' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd="/tmp", capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert "ERR unknown backend for gemm 'cublas'" in p.stdout and p.stdout.split()[-2:] == ["False", "False"]


def test_to_dict_rebuilds_the_spec_and_the_fingerprint_is_what_is_measured():
    s = SweepSpec("gemm", shapes="8x8x8", dtypes="fp32", timer=FAST, out="a.parquet")
    d = s.to_dict()
    assert d["dtypes"] == ["fp32"] and d["timer"] == FAST and d["out"] == "a.parquet" and "plan" not in d
    assert SweepSpec(**d) == s and SweepSpec(**d).fingerprint() == s.fingerprint()
    assert set(FILE_FIELDS) <= set(d)
    moved = dataclasses.replace(s, out="b.csv", overwrite=True)
    assert moved.fingerprint() == s.fingerprint() and moved != s  # where the rows go is not what is measured
    assert dataclasses.replace(s, band=0.02).fingerprint() != s.fingerprint()
    assert dataclasses.replace(s, timer={"rep": 6, "warmup": 1}).fingerprint() != s.fingerprint()


def test_run_sweep_takes_a_spec_and_the_spec_travels_with_the_rows(tmp_path):
    with pytest.raises(UsageError, match="run_sweep takes a SweepSpec"):
        run_sweep("gemm")
    out = tmp_path / "r.parquet"
    spec = SweepSpec(toy_op(), shapes="4x4", backends="good", out=out, timer=FAST)
    df = run_sweep(spec, progress=False)
    (rec,) = df.attrs["sweeps"]
    assert rec["fingerprint"] == spec.fingerprint() and rec["spec"] == spec.to_dict()
    assert rec["run_id"] == df["run_id"].iloc[0]
    assert list(df.columns) == list(R.frame([dict(df.iloc[0])]).columns)  # no new column
    assert "sweeps" not in df.columns and R.load(out).attrs["sweeps"] == [rec]  # Parquet keeps it
    more = dataclasses.replace(spec, shapes="4x4;8x8", resume=True, extend=True)  # another plan: --extend
    df2 = run_sweep(more, progress=False)
    assert [r["run_id"] for r in df2.attrs["sweeps"]] == [rec["run_id"], df2["run_id"].iloc[-1]]
    assert df2.attrs["sweeps"][-1]["fingerprint"] == more.fingerprint() != spec.fingerprint()
    assert len(df2) == 2 and R.load(out).attrs["sweeps"] == df2.attrs["sweeps"]


def test_fx_sweep_builds_the_spec_from_the_same_keywords(tmp_path):
    with pytest.raises(UsageError, match="unknown sweep option 'bnad'"):
        fx.sweep("gemm", shapes="8x8x8", bnad=0.01)
    seen = []
    df = fx.sweep(toy_op(), shapes="4x4", backends="good", timer=FAST, progress=False, on_row=seen.append)
    assert len(df) == len(seen) == 1 and df.attrs["sweeps"][0]["spec"]["timer"] == FAST
    spec = SweepSpec(toy_op(), shapes="4x4", backends="good", timer=FAST)
    assert len(fx.sweep(spec, progress=False)) == 1
    with pytest.raises(UsageError, match="runs the spec as it is; give suite"):
        fx.sweep(spec, suite="cpu-small")


def test_the_command_line_builds_the_spec(monkeypatch, tmp_path, capsys):
    import flyexplore.run.sweep as SW
    from flyexplore.cli import main

    got = []

    def fake(spec, **kw):
        got.append((spec, kw))
        raise KeyboardInterrupt  # stop there: the spec is what this test looks at
    monkeypatch.setattr(SW, "run_sweep", fake)
    out = tmp_path / "r.csv"
    assert main(["sweep", "--op", "gemm", "--shapes", "8x8x8", "--backends", "aten", "--out", str(out),
                 "--rep", "5", "--band", "0.02", "--quiet"]) == 130
    assert f"interrupted before any case finished; nothing was written to {out}" in capsys.readouterr().err
    assert not out.exists()
    (spec, kw), = got
    assert kw == {"progress": False}
    assert spec == SweepSpec("gemm", shapes="8x8x8", dtypes="fp32", backends="aten", out=out, band=0.02,
                             timer={"mode": "auto", "rep": 5, "warmup": 1})


def test_the_panel_builds_the_spec():
    pytest.importorskip("ipywidgets")
    from flyexplore.ui.panel import SweepPanel

    p = SweepPanel("gemm", shapes="32x32x32", dtypes="fp32", backends="aten", timer=FAST)
    assert p.spec() == SweepSpec("gemm", shapes="32x32x32", dtypes="fp32", backends="aten", timer=FAST)
    assert len(p.plan()) == 1
    bad = SweepPanel("gemm", shapes="32x32x32", dtypes="fp32", backends="aten", timer={"rep": 0})
    assert bad.start() is False and not bad.running
    assert "timer option rep must be an integer &gt;= 1, got 0" in bad.message.value  # HTML-escaped
