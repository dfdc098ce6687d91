import math

import pandas as pd
import pytest

from flyexplore.results import table as R
from flyexplore.errors import UsageError


def _row(case, backend, t, status="ok", run="r1", **kw):
    return {"schema_version": R.SCHEMA_VERSION, "run_id": run, "op": "gemm", "case": case,
            "dtype": "bf16", "backend": backend, "status": status, "source": "measured",
            "time_ms": t, **kw}


def test_frame_has_every_core_column_with_types():
    df = R.frame([_row("8x8x8", "aten", 1.0, m=8)])
    assert list(df.columns[: len(R.COLUMNS)]) == list(R.COLUMNS)
    assert "m" in df.columns  # operator parameters follow the core columns
    assert str(df["time_ms"].dtype) == "Float64"
    assert str(df["noisy"].dtype) == "boolean"
    R.validate(df)


def test_validate_catches_schema_violations():
    with pytest.raises(ValueError, match="unknown status"):
        R.validate(R.frame([_row("a", "aten", 1.0, status="great")]))
    with pytest.raises(ValueError, match="unknown source"):
        R.validate(R.frame([_row("a", "aten", 1.0, source="guessed")]))
    with pytest.raises(ValueError, match="positive time"):
        R.validate(R.frame([_row("a", "aten", None)]))
    with pytest.raises(ValueError, match="duplicate"):
        R.validate(R.frame([_row("a", "aten", 1.0), _row("a", "aten", 2.0)]))
    with pytest.raises(ValueError, match="missing columns"):
        R.validate(pd.DataFrame({"op": ["gemm"]}))


@pytest.mark.parametrize("ext", [".parquet", ".csv", ".jsonl"])
def test_save_load_roundtrip(tmp_path, ext):
    df = R.frame([_row("8x4096x4096", "aten", 0.02, noisy=True, m=8, layout="NT"),
                  _row("8x4096x4096", "triton", None, status="unavailable", message="no GPU")])
    p = R.save(df, tmp_path / f"r{ext}")
    back = R.load(p)
    assert back["case"].tolist() == ["8x4096x4096"] * 2
    assert back["time_ms"].iloc[0] == pytest.approx(0.02)
    assert pd.isna(back["time_ms"].iloc[1])
    assert bool(back["noisy"].iloc[0]) is True
    assert back["message"].iloc[1] == "no GPU"
    assert back["layout"].iloc[0] == "NT"
    R.validate(back)


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "r.parquet"
    R.save(R.frame([_row("a", "aten", 1.0)]), p)
    before = p.read_bytes()

    def boom(self, *a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(RuntimeError):
        R.save(R.frame([_row("b", "aten", 2.0)]), p)
    assert p.read_bytes() == before
    assert [f.name for f in tmp_path.iterdir()] == ["r.parquet"]  # no temp file left


def test_check_path_errors_name_the_path(tmp_path):
    with pytest.raises(UsageError, match="extension '.txt'"):
        R.check_path(tmp_path / "r.txt")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="cannot write output file"):
        R.check_path(blocker / "sub" / "r.parquet")
    with pytest.raises(UsageError, match="not found"):
        R.load(tmp_path / "missing.parquet")


def test_geomean():
    assert R.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert R.geomean([2.0, 8.0, 4.0]) == pytest.approx(4.0)
    assert math.isnan(R.geomean([]))
    with pytest.raises(ValueError):
        R.geomean([1.0, 0.0])


def test_speedup_single_and_faster_of_several():
    df = R.frame([
        _row("A", "aten", 2.0), _row("A", "triton", 1.0), _row("A", "flydsl", 0.5),
        _row("B", "aten", 1.0), _row("B", "triton", 4.0), _row("B", "flydsl", 1.005),
        _row("C", "aten", 1.0), _row("C", "flydsl", None, status="unavailable"),
    ])
    s = R.speedup(df, "aten")
    fly = s[s.backend == "flydsl"].set_index("case")
    assert fly.loc["A", "speedup"] == pytest.approx(4.0)
    assert fly.loc["B", "speedup"] == pytest.approx(1 / 1.005)
    assert bool(fly.loc["B", "tie"]) and not bool(fly.loc["A", "tie"])
    assert "C" not in fly.index  # unavailable rows never become speedups
    best = R.speedup(df, ["aten", "triton"])
    fb = best[best.backend == "flydsl"].set_index("case")
    assert fb.loc["A", "baseline"] == "triton" and fb.loc["A", "speedup"] == pytest.approx(2.0)
    assert fb.loc["B", "baseline"] == "aten"
    g = R.geomean_speedup(df, ["aten", "triton"])
    assert g.set_index("backend").loc["flydsl", "geomean"] == pytest.approx(math.sqrt(2.0 / 1.005))
    with pytest.raises(UsageError, match="no rows for baseline"):
        R.speedup(df, "cublas")


def test_speedup_uses_median_over_runs():
    df = R.frame([_row("A", "aten", 1.0, run="r1"), _row("A", "aten", 3.0, run="r2"),
                  _row("A", "aten", 2.0, run="r3"), _row("A", "x", 1.0)])
    assert R.speedup(df)["speedup"].iloc[0] == pytest.approx(2.0)


def test_newer_schema_is_refused(tmp_path):
    df = R.frame([_row("a", "aten", 1.0)])
    df["schema_version"] = R.SCHEMA_VERSION + 1
    df.to_csv(tmp_path / "new.csv", index=False)
    with pytest.raises(UsageError, match="newer than this"):
        R.load(tmp_path / "new.csv")
