"""Issue 45, the break-it trial's messages: ``model --measure --out F`` goes on after Ctrl-C (its
own ``--resume`` / ``--overwrite``, and every message it prints names only ``model``'s flags);
``--max-memory -5GB`` reaches the option's own check; no profiler ``USDT`` lines on stderr; a
result file without rows is refused by ``report``; a refused or failed sweep leaves no lock file;
a resume refused for a changed ``--env`` variable names the variable and both values. In-process
(:func:`flyexplore.cli.main`) on the CPU, with a tiny Llama config, except where a fresh process
or a full disk is the point."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

import flyexplore.views.model_step as VS
from flyexplore.cli import build_parser, main
from flyexplore.cli._shared import dash_values
from flyexplore.errors import UsageError
from flyexplore.results import table as R
from flyexplore.run.journal import Journal, WriterLock, lock_path, plan_difference
from flyexplore.run.spec import SweepSpec
from tests.cli.test_damaged_cli import one_line

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
        "torch_dtype": "float32"}


def _model_flags() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {o for a in sub.choices["model"]._actions for o in a.option_strings}


def _only_model_flags(line: str) -> None:
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
    assert named <= _model_flags(), (named - _model_flags(), line)


def _model(tmp_path, out, *extra) -> list[str]:
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    return ["model", "--config", str(cfg), "--seq", "16", "--layers", "1", "--measure", "--measure-device", "cpu",
            "--variants", "eager", "--out", str(out), *extra]


def _last_error(capsys, rc) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err and err[-1].startswith("flyexplore: error: "), err
    assert not any("Traceback" in x for x in err), err
    return err[-1]


@pytest.mark.slow
def test_model_measure_out_goes_on_after_ctrl_c_with_its_own_flags(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.csv"
    real = VS.run_sweep

    def ctrl_c(*_a, **_k):   # Ctrl-C before the first case: what a real one raises there
        raise KeyboardInterrupt

    # the measurement stopped before its first row, as by Ctrl-C: the journal's rows (none) are kept in F
    monkeypatch.setattr(VS, "run_sweep", lambda spec, progress=True: real(spec, progress=progress,
                                                                          should_stop=ctrl_c))
    assert main(_model(tmp_path, out)) == 130
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith(f"flyexplore: interrupted; finished rows kept in {out}") and "--resume" in said, said
    _only_model_flags(said)
    assert len(R.load(out)) == 0 and not lock_path(out).exists()
    monkeypatch.setattr(VS, "run_sweep", real)

    # the plain re-run names model's own ways on, and both work
    line = one_line(capsys, main(_model(tmp_path, out)), "exists", "--resume", "--overwrite")
    _only_model_flags(line)
    assert len(R.load(out)) == 0
    assert main(_model(tmp_path, out, "--resume")) == 0
    capsys.readouterr()
    first = R.load(out)
    assert list(first["backend"]) == ["eager"] and list(first["status"]) == ["ok"]
    # another plan: no --extend (model has none), --overwrite instead
    line = _last_error(capsys, main(_model(tmp_path, out, "--resume", "--variants", "eager,compile")))
    assert "with another plan" in line and "--overwrite" in line and "--extend" not in line, line
    _only_model_flags(line)
    assert main(_model(tmp_path, out, "--overwrite")) == 0
    capsys.readouterr()
    again = R.load(out)
    assert len(again) == 1 and again["run_id"].iloc[0] != first["run_id"].iloc[0]
    # without --out, or both at once: one line each, in model's flags
    _only_model_flags(one_line(capsys, main(_model(tmp_path, out, "--resume", "--overwrite")), "exclude each other"))
    cfg = str(tmp_path / "tiny.json")
    one_line(capsys, main(["model", "--config", cfg, "--measure", "--resume"]), "--resume", "--out FILE")
    one_line(capsys, main(["model", "--config", cfg, "--overwrite"]), "--overwrite is for --measure")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "tiny.json"]   # no lock, no journal
    # the API takes the same two: fx.model(..., measure=True, out=F, overwrite=True / resume=True)
    import flyexplore as fx

    kw = dict(config=str(tmp_path / "tiny.json"), phase="prefill", batch=1, seq=16, layers=1, measure=True,
              measure_device="cpu", variants="eager", out=out, progress=False)
    with pytest.raises(UsageError, match="exists"):
        fx.model(**kw)
    fx.model(**kw, overwrite=True)
    assert len(R.load(out)) == 1 and R.load(out)["run_id"].iloc[0] != again["run_id"].iloc[0]
    with pytest.raises(UsageError, match="resume and overwrite are for measure=True"):
        fx.model(config=str(tmp_path / "tiny.json"), phase="prefill", batch=1, seq=16, resume=True)


def test_a_size_that_starts_with_a_dash_reaches_the_option_check(tmp_path, capsys):
    out = tmp_path / "s.csv"
    for argv in (["sweep", "--op", "gemm", "--shapes", "8x8x8", "--out", str(out), "--max-memory", "-5GB"],
                 _model(tmp_path, out, "--max-memory", "-5GB"),
                 _model(tmp_path, out, "--max-mem", "-5GB")):   # an abbreviation, as argparse takes it
        one_line(capsys, main(argv), "--max-memory must be a positive size", "'-5GB'")
    assert not out.exists()
    # a forgotten value is still argparse's own words; '-' and everything after '--' are left alone
    one_line(capsys, main(["sweep", "--op", "gemm", "--shapes", "8x8x8", "--out", "--quiet"]),
             "--out: expected one argument")
    p = build_parser()
    assert dash_values(p, ["compare", "a", "b", "--json", "-"]) == ["compare", "a", "b", "--json", "-"]
    assert dash_values(p, ["sweep", "--seed", "-1", "--", "--max-memory", "-5GB"]) == \
        ["sweep", "--seed=-1", "--", "--max-memory", "-5GB"]


@pytest.mark.slow
def test_model_measure_writes_no_profiler_usdt_lines(tmp_path):
    """A fresh process: Kineto reads its log level once, when the profiler first starts."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    # the profiler of this torch does print them when nothing silences them: the test can fail
    loud = subprocess.run([sys.executable, "-c", "import torch\nfrom torch.profiler import profile\n"
                           "with profile():\n    torch.ones(2) + 1\n"], capture_output=True, text=True, env=env,
                          timeout=300)
    if "USDT" not in loud.stderr:
        pytest.skip("this torch's profiler prints no USDT lines")
    p = subprocess.run([sys.executable, "-m", "flyexplore", *_model(tmp_path, tmp_path / "r.csv")],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "profiled step" in p.stdout or "breakdown" in p.stdout.lower() or "Measured step" in p.stdout
    assert not [x for x in p.stderr.splitlines() if "USDT" in x], p.stderr


def test_a_result_file_without_rows_is_no_report(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    R.save(R.frame([{"op": "gemm", "case": "8x8x8", "dtype": "fp32", "backend": "aten", "status": "ok",
                     "run_id": "x", "source": "measured", "time_ms": 1.0}]).head(0), empty)
    assert empty.read_text().count("\n") == 1   # a header only
    rep = tmp_path / "rep"
    one_line(capsys, main(["report", str(empty), "--out", str(rep), "--no-images"]),
             f"result file {str(empty)!r} holds no result rows")
    assert not rep.exists()
    # the API refuses it alike (a path, or the empty DataFrame itself)
    import flyexplore as fx

    with pytest.raises(UsageError, match=f"result file {re.escape(repr(str(empty)))} holds no result rows"):
        fx.report(str(empty), rep)
    with pytest.raises(UsageError, match="the DataFrame given to fx.report holds no result rows"):
        fx.report(R.load(empty), rep)
    assert not rep.exists()
    # compare and export refuse it too (exit 2, one line), as they did before
    one_line(capsys, main(["compare", str(empty), str(empty)]), "no case is in both A and B")
    one_line(capsys, main(["export", str(empty), "--out", str(tmp_path / "f.html")]), "no case has both")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.csv"]


def test_the_writer_lock_is_removed_when_let_go_and_refuses_a_second_writer(tmp_path):
    from flyexplore.run.sweep import run_sweep

    out = tmp_path / "r.csv"
    run_sweep(SweepSpec("gemm", shapes="8x8x8", backends="aten", dtypes="fp32", device="cpu", out=out,
                        timer={"rep": 2, "warmup": 1}), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv"]   # no .r.csv.lock left
    a, b = WriterLock(lock_path(out)), WriterLock(lock_path(out))
    a.acquire()
    with pytest.raises(Exception) as e:
        b.acquire()
    assert type(e.value).__name__ == "Timeout" and not b.is_locked
    a.release()
    assert not lock_path(out).exists()
    b.acquire()   # the next writer takes a new file
    assert b.is_locked and lock_path(out).exists()
    b.release()
    # a refusal (a file there, no --resume) leaves no lock either
    with pytest.raises(UsageError, match="exists"):
        Journal.open(out, resume=False, overwrite=False, extend=False, retry_failed=False, plan_fingerprint="x",
                     plan={}, op="gemm", keys=[])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv"]


@pytest.mark.slow
def test_a_journal_a_full_disk_keeps_from_being_created_leaves_no_lock(tmp_path):
    from full_disk import run_cases

    got = run_cases(tmp_path, ["sweep-journal:new"])
    r = got["sweep-journal:new"]
    err = r["err"].splitlines()
    assert r["rc"] == 2 and len(err) == 1 and err[0].endswith("; nothing was left behind"), r["err"]
    assert r["after"] == r["before"], (r["before"], r["after"])   # the lock file too


def test_a_resume_with_a_changed_env_variable_names_it(tmp_path):
    long = "a:" + ",".join(f"FLYEXPLORE_TEST_VARIABLE_{i}=some-long-value-{i}" for i in range(6))
    spec = {n: SweepSpec("gemm", shapes="8x8x8", backends="aten", dtypes="fp32", device="cpu",
                         envs=[f"{long},X={n}", "b"]) for n in (1, 2)}
    old, new = spec[1].plan_dict(), spec[2].plan_dict()
    assert plan_difference(old, new) == "envs['a'].changes.X '1' -> '2'"
    # as the resume says it, through the journal of a file swept under the first
    out = tmp_path / "ab.parquet"
    j = Journal.open(out, resume=False, overwrite=False, extend=False, retry_failed=False,
                     plan_fingerprint=spec[1].plan_fingerprint(), plan=old, op="gemm", keys=[])
    j.close()
    with pytest.raises(UsageError) as e:
        Journal.open(out, resume=True, overwrite=False, extend=False, retry_failed=False,
                     plan_fingerprint=spec[2].plan_fingerprint(), plan=new, op="gemm", keys=[])
    assert "with another plan (envs['a'].changes.X '1' -> '2')" in str(e.value), str(e.value)
    # a long value is cut around its first difference, not at its start
    a, b = {"envs": [{"name": "a", "python": "/opt/" + "x" * 80 + "/py3.11"}]}, \
        {"envs": [{"name": "a", "python": "/opt/" + "x" * 80 + "/py3.12"}]}
    said = plan_difference(a, b)
    assert "3.11" in said and "3.12" in said, said
