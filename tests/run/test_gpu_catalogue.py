"""benchmarks/gpu/gpu_catalogue.py in CPU mode: the cpu-small suites of grouped GEMM, scaled GEMM
and attention swept through run_sweep, with result files, the environment and a summary."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from flyexplore.results import table as R

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # every test reads one module-wide sweep of three suites


def _script():
    if "gpu_catalogue" in sys.modules:
        return sys.modules["gpu_catalogue"]
    spec = importlib.util.spec_from_file_location("gpu_catalogue", ROOT / "benchmarks" / "gpu" / "gpu_catalogue.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_catalogue"] = mod           # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("catalogue")
    summary = _script().run(out, device="cpu", progress=False)
    return out, summary


def test_files_and_summary(run_dir):
    out, summary = run_dir
    for f in ("results.parquet", "results.csv", "env.json", "env.txt", "summary.json",
              "grouped_cpu.parquet", "scaled_cpu.parquet", "attention_cpu.parquet"):
        assert (out / f).exists(), f
    s = json.loads((out / "summary.json").read_text())
    assert [p["part"] for p in s["parts"]] == ["grouped_cpu", "scaled_cpu", "attention_cpu"]
    assert s["rows"] == summary["rows"] == 16 + 24 + 30
    env = json.loads((out / "env.json").read_text())
    assert env["platform"] == "cpu"
    prov = env["provenance"]   # which code and machine made the files (issue 36)
    assert prov["script"] == "benchmarks/gpu/gpu_catalogue.py" and prov["platform"] == "cpu"
    assert prov["flyexplore_commit"] == env["flyexplore_commit"] and "host" not in prov
    assert "flyexplore commit:" in (out / "env.txt").read_text()


def test_rows_are_measured_emulated_or_explained(run_dir):
    out, _ = run_dir
    df = R.load(out / "results.parquet")
    R.validate(df)
    assert set(df["status"]) == {"ok", "unavailable"}                  # no errors
    assert df.loc[df["status"] == "unavailable", "message"].str.len().min() > 20
    ok = df[df["status"] == "ok"]
    assert ok["accuracy_ok"].all() and (ok["time_ms"] > 0).all() and (ok["flops"] > 0).all()
    emu = df[df["backend"] == "emulated"]
    assert (emu["source"] == "emulated").all()
    assert (df.loc[df["backend"] != "emulated", "source"] == "measured").all()
    # what runs on CPU with torch 2.15
    ran = {(o, b) for o, b in ok[["op", "backend"]].itertuples(index=False)}
    assert ran == {("grouped_gemm", "aten"), ("grouped_gemm", "reference"),
                   ("scaled_gemm", "emulated"), ("scaled_gemm", "aten"),
                   ("attention", "flash"), ("attention", "math"), ("attention", "default")}
    assert set(ok.loc[(ok["op"] == "scaled_gemm") & (ok["backend"] == "aten"), "dtype"]) == {"fp8_e4m3"}
    att = df[df["op"] == "attention"]
    assert (att["aotriton"] == "not present").all()                     # recorded on every row
    sg = ok[(ok["op"] == "scaled_gemm") & (ok["backend"] == "emulated")].groupby("dtype")["err_rel"].max()
    assert sg["mxfp4"] > sg["mxfp8"]


def test_csv_keeps_labels_and_extra_columns(run_dir):
    out, _ = run_dir
    a, b = R.load(out / "results.parquet"), R.load(out / "results.csv")
    assert a["case"].tolist() == b["case"].tolist()
    assert "4x96x128x256:ms=0/96/32/64" in set(b["case"])
    assert b["err_rel_dequant"].notna().sum() == 8                      # every ok scaled GEMM row


def test_bad_part_is_a_usage_error(tmp_path, capsys):
    assert _script().main([str(tmp_path), "--device", "cpu", "--parts", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_gpu_plan_is_valid():
    """Every GPU part names a real suite or shapes, dtypes and backends (checked without a GPU)."""
    from flyexplore.run.plan import make_plan

    mod = _script()
    rows = 0
    for p in mod.GPU_PARTS:
        plan = make_plan(p.op, p.suite, list(p.shapes) if p.shapes else None, p.dtypes, p.backends)
        rows += len(plan)
    names = [p.name for p in mod.GPU_PARTS]
    assert len(set(names)) == len(names)
    assert {p.op for p in mod.GPU_PARTS} == {"grouped_gemm", "scaled_gemm", "attention"}
    assert rows == 24 * 2 + 2 * 3 + 17 * 6 + 34 + 34 * 3 + 6 * 2 + 4 * 2


def test_a_failing_part_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    import flyexplore.run.sweep

    def boom(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(flyexplore.run.sweep, "run_sweep", boom)
    s = _script().run(tmp_path, device="cpu", parts=["scaled_cpu", "attention_cpu"], progress=False)
    assert [p["part"] for p in s["parts"]] == ["scaled_cpu", "attention_cpu"]
    assert all(p["failed"].startswith("RuntimeError: CUDA error") for p in s["parts"])
    assert s["rows"] == 0 and (tmp_path / "results.csv").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["parts"][1]["failed"]
