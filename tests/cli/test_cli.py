import json

import pytest

from flyexplore.results import table as R


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
def test_bad_input_is_one_line_exit_2_and_keeps_existing_file(cli, tmp_path, args, needle):
    out = tmp_path / "r.parquet"
    R.save(R.frame([{"schema_version": 1, "run_id": "x", "op": "gemm", "case": "1x1x1", "dtype": "bf16",
                     "backend": "aten", "status": "ok", "source": "measured", "time_ms": 1.0}]), out)
    before = out.read_bytes()
    args = [a.format(out=out, tmp=tmp_path) for a in args]
    p = cli(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("flyexplore: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in p.stderr
    assert out.read_bytes() == before


@pytest.mark.slow
def test_sweep_cli_writes_results_and_resumes(cli, tmp_path):
    out = tmp_path / "g.csv"
    p = cli("sweep", "--op", "gemm", "--shapes", "32x32x32;64x32x16:NN", "--backends", "aten,triton",
            "--dtypes", "fp32", "--out", str(out), "--rep", "5", "--quiet")
    assert p.returncode == 0, p.stderr
    df = R.load(out)
    assert len(df) == 4
    assert set(df.status) == {"ok", "unavailable"}
    assert "4 rows written" in p.stdout
    more = ("sweep", "--op", "gemm", "--shapes", "32x32x32;64x32x16:NN;16x16x16", "--backends", "aten",
            "--dtypes", "fp32", "--out", str(out), "--rep", "5", "--resume", "--quiet")
    before = out.read_bytes()
    p2 = cli(*more)  # another plan: a CSV keeps no plan, so its rows say it
    assert p2.returncode == 2 and p2.stderr.count("\n") == 1 and "--extend" in p2.stderr, p2.stderr
    assert "2 of its rows are not in this plan (e.g. 32x32x32 fp32 triton)" in p2.stderr
    assert out.read_bytes() == before
    p2 = cli(*more, "--extend")
    assert p2.returncode == 0, p2.stderr
    assert len(R.load(out)) == 5


@pytest.mark.slow
def test_env_json_and_suites(cli):
    p = cli("env", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["platform"] == "cpu"
    assert d["flydsl_eager"]["ready"] is False
    assert any("not ROCm" in c["detail"] for c in d["flydsl_eager"]["checks"])
    s = cli("suites")
    assert s.returncode == 0
    assert "published-bf16" in s.stdout and " 15 runs" in s.stdout and " 33 runs" in s.stdout
