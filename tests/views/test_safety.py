"""Inputs that must never destroy results (issue 11): bad sweep options stop before any file is
opened, reports refuse foreign folders and replace earlier reports whole, JSONL keeps floats
exactly, and failed notebooks are written up to the failure."""
import importlib.util
import json
import math
import warnings

import pandas as pd
import pytest
import torch

from flyexplore.results import table as R
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.views.report import REPORT_MARKER, check_report_dir, write_report
from flyexplore.run.spec import SweepSpec, check_timer
from flyexplore.run.sweep import journal_path, run_sweep


def _rows(n=40):
    return R.frame([{"schema_version": 1, "run_id": "x", "op": "gemm", "case": f"{i}x8x8", "dtype": "bf16",
                     "backend": "aten", "status": "ok", "source": "measured", "time_ms": 1.0 + i / 7}
                    for i in range(n)])


@pytest.mark.parametrize("extra,needle", [
    (["--rep", "-5"], "--rep must be an integer >= 1, got -5"),
    (["--rep", "0"], "--rep must be an integer >= 1, got 0"),
    (["--rep-ms", "-1"], "--rep-ms must be a finite number > 0, got -1.0"),
    (["--rep-ms", "nan"], "--rep-ms must be a finite number > 0"),
    (["--warmup", "-2"], "--warmup must be an integer >= 0, got -2"),
    (["--seed", "-1"], "--seed must be an integer in [0, 2**64)"),
    (["--device", "tpu"], "bad --device 'tpu'"),
    (["--device", "meta"], "unknown device type 'meta' (valid: cpu, cuda)"),
    (["--device", "cuda:99"], "--device 'cuda:99': torch sees"),
    (["--resume"], "--resume and --overwrite exclude each other"),
])
def test_bad_sweep_option_exits_2_and_leaves_files_untouched(tmp_path, capsys, extra, needle):
    out = tmp_path / "r.parquet"
    R.save(_rows(), out)
    jp = journal_path(out)
    jp.write_text('{"op": "gemm"}\n')
    before, jbefore = out.read_bytes(), jp.read_bytes()
    rc = main(["sweep", "--op", "gemm", "--shapes", "8x8x8", "--out", str(out), "--overwrite",
               "--quiet", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("flyexplore: error: ") and needle in err[0], err
    assert out.read_bytes() == before and jp.read_bytes() == jbefore


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU timing modes are valid on a GPU")
def test_gpu_timing_mode_on_cpu_is_refused_before_the_sweep(tmp_path):
    out = tmp_path / "r.csv"
    R.save(_rows(3), out)
    before = out.read_bytes()
    with pytest.raises(UsageError, match="timing mode 'kernel' needs a GPU"):
        run_sweep(SweepSpec("gemm", shapes="8x8x8", out=out, overwrite=True, timer={"mode": "kernel"}), progress=False)
    assert out.read_bytes() == before


@pytest.mark.parametrize("timer,needle", [
    ({"rep": 0}, "rep must be an integer >= 1"), ({"rep_ms": -1.0}, "rep_ms must be a finite number > 0"),
    ({"warmup": 1.5}, "warmup must be an integer >= 0"), ({"reps": 3}, "unknown timer option 'reps'"),
    ({"min_rounds": 10, "max_rounds": 5}, "max_rounds (5) is below"), ({"mode": "fast"}, "unknown timing mode 'fast'"),
])
def test_run_sweep_checks_timer_options_first(tmp_path, timer, needle):
    out = tmp_path / "r.jsonl"
    R.save(_rows(3), out)
    before = out.read_bytes()
    with pytest.raises(UsageError) as ei:
        run_sweep(SweepSpec("gemm", shapes="8x8x8", out=out, overwrite=True, timer=timer), progress=False)
    assert needle in str(ei.value)
    assert out.read_bytes() == before
    assert check_timer({"rep": 3, "warmup": 0, "rep_ms": 5.0, "mode": "auto"}, "interleaved") == {
        "rep": 3, "warmup": 0, "rep_ms": 5.0, "mode": "auto"}


def test_warmup_alone_is_passed_on(tmp_path):
    out = tmp_path / "r.csv"
    assert main(["sweep", "--op", "gemm", "--shapes", "8x8x8", "--backends", "aten", "--dtypes", "fp32",
                 "--out", str(out), "--rep", "3", "--warmup", "0", "--quiet"]) == 0
    # interleaved (the default): --rep is a fixed number of rounds
    assert R.load(out)["rounds"].tolist() == [3]


# -- JSONL ----------------------------------------------------------------------------------------

def test_jsonl_roundtrips_floats_exactly_and_types(tmp_path):
    df = _rows(5)
    df["err_rel"] = [3.3e-12, 1 / 3, math.inf, None, 5e-324]
    df["time_ms"] = [0.1234567890123456789, 2 / 3, 1e-300, 123456.78901234567, math.pi]
    df["m"] = [1, 2, 3, 4, 5]
    for ext in (".jsonl", ".csv", ".parquet"):
        R.save(df, tmp_path / f"r{ext}")
        back = R.load(tmp_path / f"r{ext}")
        assert back["time_ms"].tolist() == df["time_ms"].tolist(), ext
        assert back["err_rel"].iloc[0] == 3.3e-12 and back["err_rel"].iloc[2] == math.inf, ext
        assert pd.isna(back["err_rel"].iloc[3]), ext
        assert back["err_rel"].iloc[4] == 5e-324, ext
        assert back.dtypes["time_ms"] == "Float64" and back.dtypes["case"] == "string", ext
    # the sweep's journal, loaded back
    line = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert line["err_rel"] == 3.3e-12


def test_categorical_order_kept_by_parquet_and_warned_for_text_formats(tmp_path):
    df = _rows(4)
    df["backend"] = pd.Categorical(["aten", "flydsl", "aten", "triton"], categories=["triton", "flydsl", "aten"],
                                   ordered=True)
    n = R.normalize(df)
    assert list(n["backend"].cat.categories) == ["triton", "flydsl", "aten"] and n["backend"].cat.ordered
    R.save(df, tmp_path / "r.parquet")
    back = R.load(tmp_path / "r.parquet")
    assert list(back["backend"].cat.categories) == ["triton", "flydsl", "aten"] and back["backend"].cat.ordered
    for ext in (".csv", ".jsonl"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            R.save(df, tmp_path / f"r{ext}")
        assert any("backend" in str(x.message) and "categorical" in str(x.message) for x in w), ext
        assert R.load(tmp_path / f"r{ext}")["backend"].tolist() == ["aten", "flydsl", "aten", "triton"]


# -- report folders --------------------------------------------------------------------------------

def _report(df, out, **kw):
    return write_report(df, out, static=False, **kw)


def test_report_refuses_a_foreign_folder_and_touches_nothing(tmp_path, capsys):
    f = tmp_path / "r.parquet"
    R.save(_rows(3), f)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    rc = main(["report", str(f), "--out", str(out), "--no-images"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "holds no earlier flyexplore report (notes.txt)" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    with pytest.raises(UsageError, match="is a file"):
        check_report_dir(f)


@pytest.mark.slow
def test_report_replaces_an_earlier_report_whole(tmp_path):
    out = tmp_path / "rep"
    _report(_rows(3), out, published=True, table_formats=("csv", "md"))
    first = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert "tables/published_headlines.md" in first and (out / REPORT_MARKER).exists()
    _report(_rows(2), out, table_formats=("csv",))
    second = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert "tables/published_headlines.csv" not in second and not any(p.endswith(".md") for p in second)
    assert "tables/results.csv" in second and "report.html" in second
    assert len(pd.read_csv(out / "tables" / "results.csv")) == 2
    assert not any(p.name.startswith(".flyexplore-staging") for p in out.iterdir())
    (out / "stray.txt").write_text("x")            # not the report's: now refused
    with pytest.raises(UsageError, match="not part of its earlier flyexplore report .stray.txt"):
        _report(_rows(2), out)


def test_report_replaces_a_report_written_before_the_marker(tmp_path):
    out = tmp_path / "old"
    (out / "tables").mkdir(parents=True)
    (out / "tables" / "old_table.csv").write_text("a\n1\n")
    (out / "report.html").write_text("<p>written by flyexplore 0.1.0 at ...</p>")
    _report(_rows(2), out)
    assert not (out / "tables" / "old_table.csv").exists() and (out / "tables" / "results.csv").exists()


def test_report_beside_its_inputs_and_demo_files(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    R.save(_rows(3), out / "results.parquet")
    assert main(["report", str(out / "results.parquet"), "--out", str(out), "--no-images"]) == 0
    assert json.loads((out / REPORT_MARKER).read_text())["kept"] == ["results.parquet"]
    R.save(_rows(3), tmp_path / "other.parquet")      # a later report from elsewhere keeps it too
    assert main(["report", str(tmp_path / "other.parquet"), "--out", str(out), "--no-images"]) == 0
    assert (out / "results.parquet").exists()


def test_failed_write_leaves_the_earlier_report(tmp_path, monkeypatch):
    out = tmp_path / "rep"
    _report(_rows(3), out)
    before = (out / "report.html").read_text()
    import flyexplore.views.report as REP

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(REP, "save_tables", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        _report(_rows(5), out)
    assert (out / "report.html").read_text() == before
    assert not any(p.name.startswith(".flyexplore-staging") for p in out.iterdir())


def test_demo_refuses_a_foreign_folder_before_running(tmp_path, capsys):
    out = tmp_path / "d"
    out.mkdir()
    (out / "gemm.parquet.bak").write_text("mine")
    assert main(["demo", "--out", str(out), "--quiet", "--no-images"]) == 2
    assert "holds no earlier flyexplore report" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["gemm.parquet.bak"]


# -- notebooks ---------------------------------------------------------------------------------------

needs_nb = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("nbclient", "nbformat", "ipykernel")),
                              reason="needs nbclient, nbformat, ipykernel")


@needs_nb
@pytest.mark.parametrize("src,exc", [("import time\ntime.sleep(120)", "CellTimeoutError"),
                                     ("import os\nos._exit(3)", "DeadKernelError"),
                                     ("1 / 0", "CellExecutionError")])
@pytest.mark.slow
def test_failed_notebook_is_written_up_to_the_failure(tmp_path, src, exc):
    import nbformat

    from flyexplore.ui import notebooks as N

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('first cell ran')"),
                                         nbformat.v4.new_code_cell(src), nbformat.v4.new_code_cell("print('never')")])
    path, out = tmp_path / "nb.ipynb", tmp_path / "out" / "nb.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(Exception) as ei:
        N.execute(path, out, timeout=4)
    assert type(ei.value).__name__ == exc
    got = nbformat.read(out, as_version=4)
    assert "first cell ran" in got.cells[0].outputs[0]["text"]
    assert not got.cells[2].get("outputs")
    assert got.metadata["flyexplore"]["failure"].startswith(exc)


def test_report_swap_failure_restores_the_earlier_report(tmp_path, monkeypatch):
    out = tmp_path / "rep"
    _report(_rows(3), out)
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    import flyexplore.views.report as REP

    real, calls = REP.os.replace, []

    def flaky(src, dst):           # the last move of the swap fails once
        if str(dst).endswith(REPORT_MARKER) and "-old-" not in str(src) + str(dst) and not calls:
            calls.append(src)
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(REP.os, "replace", flaky)
    with pytest.raises(OSError):
        _report(_rows(5), out)
    monkeypatch.setattr(REP.os, "replace", real)
    assert calls and ".flyexplore-staging-" in str(calls[0])     # failed moving the new report in
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
