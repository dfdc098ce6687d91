"""The command line's messages, exit codes and files, in-process (:mod:`tests.cli.inproc`)."""
import json

import pytest

from flyexplore.results import table as R
from tests.cli.inproc import run_main


@pytest.mark.parametrize("args,needle", [
    (["sweep", "--op", "conv", "--shapes", "8x8x8", "--out", "{out}"], "unknown operator 'conv' (valid: gemm"),
    (["sweep", "--op", "gemm", "--suite", "huge", "--out", "{out}"], "unknown suite for gemm 'huge' (valid: published-bf16"),
    (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--backends", "aten,cublas", "--out", "{out}"], "unknown backend for gemm 'cublas' (valid: aten, triton, inductor, flydsl)"),
    (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--dtypes", "int4", "--out", "{out}"], "unknown dtype for gemm 'int4' (valid: bf16, fp16, fp32)"),
    (["sweep", "--op", "gemm", "--shapes", "8x8", "--out", "{out}"], "malformed gemm shape '8x8'"),
    (["sweep", "--op", "gemm", "--shapes", "8x0x8", "--out", "{out}"], "non-positive gemm n=0"),
    (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--out", "/proc/nope/r.parquet"], "cannot write output file '/proc/nope/r.parquet'"),
    (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--out", "{tmp}/r.xlsx"], "unknown result file extension '.xlsx'"),
    (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--timing", "fast", "--out", "{out}"], "unknown timing mode 'fast'"),
    (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--devices", "all", "--out", "{out}"], "--devices 'all': torch sees no CUDA/ROCm GPU"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_exit_2_and_keeps_existing_file(capsys, tmp_path, args, needle):
    out = tmp_path / "r.parquet"
    R.save(R.frame([{"schema_version": 1, "run_id": "x", "op": "gemm", "case": "1x1x1", "dtype": "bf16",
                     "backend": "aten", "status": "ok", "source": "measured", "time_ms": 1.0}]), out)
    before = out.read_bytes()
    args = [a.format(out=out, tmp=tmp_path) for a in args]
    p = run_main(capsys, *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("flyexplore: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in p.stderr
    assert out.read_bytes() == before


@pytest.mark.slow
def test_sweep_cli_writes_results_and_resumes(capsys, tmp_path):
    out = tmp_path / "g.csv"
    p = run_main(capsys, "sweep", "--op", "gemm", "--shapes", "32x32x32;64x32x16:NN", "--backends", "aten,triton",
            "--dtypes", "fp32", "--out", str(out), "--rep", "5", "--quiet")
    assert p.returncode == 0, p.stderr
    df = R.load(out)
    assert len(df) == 4
    assert set(df.status) == {"ok", "unavailable"}
    assert "4 rows written" in p.stdout
    more = ("sweep", "--op", "gemm", "--shapes", "32x32x32;64x32x16:NN;16x16x16", "--backends", "aten",
            "--dtypes", "fp32", "--out", str(out), "--rep", "5", "--resume", "--quiet")
    before = out.read_bytes()
    p2 = run_main(capsys, *more)  # another plan: a CSV keeps no plan, so its rows say it
    assert p2.returncode == 2 and p2.stderr.count("\n") == 1 and "--extend" in p2.stderr, p2.stderr
    assert "2 of its rows are not in this plan (e.g. 32x32x32 fp32 triton)" in p2.stderr
    assert out.read_bytes() == before
    p2 = run_main(capsys, *more, "--extend")
    assert p2.returncode == 0, p2.stderr
    assert len(R.load(out)) == 5


@pytest.mark.slow
def test_env_json_and_suites(capsys):
    p = run_main(capsys, "env", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["platform"] == "cpu"
    assert d["flydsl_eager"]["ready"] is False
    assert any("not ROCm" in c["detail"] for c in d["flydsl_eager"]["checks"])
    s = run_main(capsys, "suites")
    assert s.returncode == 0
    assert "published-bf16" in s.stdout and " 15 runs" in s.stdout and " 33 runs" in s.stdout


def test_the_in_process_command_leaves_the_process_as_it_was(capsys, monkeypatch, tmp_path):
    """tests/cli/inproc.py: a command run in this process sets KINETO_LOG_LEVEL and a logger's
    level (quiet_cpu_noise); the helper puts both back, with the working directory, so that a later
    test (a subprocess inheriting the environment, above all) sees the process as it was."""
    import logging
    import os

    from flyexplore.cli import main

    monkeypatch.setenv("KINETO_LOG_LEVEL", "0")   # so that monkeypatch restores the variable at the end,
    monkeypatch.delenv("KINETO_LOG_LEVEL")        # whatever the last line sets
    lg = logging.getLogger("torch.utils.cpp_extension")
    monkeypatch.setattr(lg, "level", logging.NOTSET)
    here = os.getcwd()
    p = run_main(capsys, "suites", cwd=tmp_path, env={"FLYEXPLORE_TEST_INPROC": "1"})
    assert p.returncode == 0 and "published-bf16" in p.stdout, p.stderr
    assert "KINETO_LOG_LEVEL" not in os.environ and "FLYEXPLORE_TEST_INPROC" not in os.environ
    assert lg.level == logging.NOTSET and os.getcwd() == here
    assert main(["suites"]) == 0 and "KINETO_LOG_LEVEL" in os.environ   # what the helper undid
