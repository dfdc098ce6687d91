"""``flyexplore compare`` as a CI gate (issue 24): the terminal summary, ``--json``,
``--summary-md``, ``--fail-on SLOWER[:THRESHOLD]`` and ``--out`` left out. The result files are
built from a committed H200 sweep (``data/h200/model_coverage/llama-3.1-8b_gemm.parquet``: 10
GEMM cases x 2 backends, interleaved, with samples); side B of the regression is the same sweep
3x slower (every time and every stored sample times 3, another run). In-process
(:func:`flyexplore.cli.main`), as the other compare tests."""
import dataclasses
import json
import shutil

import pandas as pd
import pytest
from conftest import ROOT

import flyexplore as fx
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.results import compare as C
from flyexplore.results import table as R

SWEEP = ROOT / "data/h200/model_coverage/llama-3.1-8b_gemm.parquet"
SLOW_CASE = "gemm 2048x4096x4096 bf16 aten"   # one of the 20 pairs, all 3x slower in B


def slowed(df: pd.DataFrame, factor: float) -> pd.DataFrame:
    """``df`` as another run whose every time is ``factor`` x longer: ``time_ms`` and each round
    of ``samples_ms`` (a JSON list of rounds, each a list of times in ms) scaled; the carried
    ``speedup*`` columns (within-run ratios) cleared."""
    b = df.copy()
    b["time_ms"] = b["time_ms"] * factor
    b["samples_ms"] = [s if not isinstance(s, str) else json.dumps([[t * factor for t in r] for r in json.loads(s)])
                       for s in b["samples_ms"]]
    for c in ("speedup", "speedup_lo", "speedup_hi"):
        b[c] = pd.NA
    b["run_id"] = "slowed-run"
    return b


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ab")
    base = R.load(SWEEP)
    main_f = R.save(base, d / "main.parquet")
    copy_f = d / "copy.parquet"
    shutil.copy(main_f, copy_f)
    slow_f = R.save(slowed(base, 3.0), d / "pr.parquet")
    return {"main": str(main_f), "copy": str(copy_f), "slow": str(slow_f)}


def test_the_constructed_regression_is_what_the_gate_sees(files):
    ab = C.sides(files["main"], files["slow"]).ab
    assert len(ab.pairs) == 20 and (ab.pairs["verdict"] == "SLOWER").all()
    assert ab.pairs["ratio"].to_numpy() == pytest.approx(1 / 3)
    # intervals well below 1/2 and well above 1/6: the thresholds below are far from any edge
    assert (ab.pairs["ratio_hi"] < 0.45).all() and (ab.pairs["ratio_lo"] > 0.25).all()


def test_a_3x_regression_fails_the_gate_and_names_a_case(files, capsys):
    rc = main(["compare", files["main"], files["slow"], "--names", "main,pr", "--fail-on", "SLOWER"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    gate = out[out.index("gate --fail-on SLOWER: FAILED"):]
    assert "20 pairs and the geometric mean are pr slower" in gate
    assert SLOW_CASE in gate and "... and 15 more" in gate and "geometric mean" in gate
    assert "SLOWER (pr slower) 20" in out            # the counts say which side is slower
    assert all(len(line) <= 100 for line in out.splitlines()), out


@pytest.mark.parametrize("other", ["main", "copy"])
def test_an_identical_pair_passes(files, capsys, other):
    rc = main(["compare", files["main"], files[other], "--fail-on", "SLOWER"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "SAME 20" in out and "gate --fail-on SLOWER: passed" in out
    assert "geometric mean: 1.000x [1.000, 1.000] SAME" in out


@pytest.mark.parametrize("fail_on,rc", [("SLOWER:500%", 0), ("SLOWER:5", 2), ("SLOWER:100%", 1),
                                        ("slower:0.05", 1), ("SLOWER:0.9", 1), ("SLOWER:200%", 0)])
def test_the_threshold_is_the_slowdown_at_the_intervals_favourable_end(files, capsys, fail_on, rc):
    """3x slower: ratio 1/3, its interval's upper end < 0.45. 100% (limit 1/2) and 90% trip;
    200% (limit 1/3: the interval reaches above it) and 500% (limit 1/6) do not."""
    assert main(["compare", files["main"], files["slow"], "--fail-on", fail_on]) == rc
    out, err = capsys.readouterr()
    if rc == 0:
        assert ": passed: no pair, nor the geometric mean, is B slower by more than" in out
    elif rc == 1:
        assert ": FAILED: 20 pairs" in out and SLOW_CASE in out
    else:   # a bare 5 could mean 5% or 500%: refused
        assert "write 5% for 5 percent" in err and out == ""


def test_json_to_stdout_is_pure_json_and_the_summary_goes_to_stderr(files, capsys):
    rc = main(["compare", files["main"], files["slow"], "--fail-on", "SLOWER:5%", "--json", "-"])
    out, err = capsys.readouterr()
    assert rc == 1

    def no_nan(c):
        raise AssertionError(f"{c} in the JSON")

    d = json.loads(out, parse_constant=no_nan)
    assert d["counts"] == {"FASTER": 0, "SAME": 0, "SLOWER": 20, "AMBIGUOUS": 0, "none": 0}
    assert d["pairs_count"] == len(d["pairs"]) == 20 and d["only_a"] == d["only_b"] == 0
    assert d["geomean"]["label"] == "SLOWER" and d["geomean"]["ratio"] == pytest.approx(1 / 3)
    assert d["geomean"]["lo"] < d["geomean"]["ratio"] < d["geomean"]["hi"]
    p = next(p for p in d["pairs"] if p["case_key"] == SLOW_CASE)
    assert p["case"] == "2048x4096x4096" and p["backend"] == "aten" and p["verdict"] == "SLOWER"
    assert p["time_b_ms"] == pytest.approx(3 * p["time_a_ms"]) and p["interval"] == "unpaired+run"
    assert p.get("allowance") is not None   # a cross-run pair: the allowance it used, as a fraction
    g = d["gate"]
    assert g["failed"] is True and g["fail_on"] == "SLOWER:5%" and g["threshold"] == pytest.approx(0.05)
    assert g["limit"] == pytest.approx(1 / 1.05) and g["geomean_tripped"] is True and len(g["tripped"]) == 20
    assert "gate --fail-on SLOWER:5%: FAILED" in err and "labels:" in err


def test_json_file_writes_null_for_a_missing_interval(tmp_path, capsys):
    """The synthetic AOTriton example keeps no samples: no interval, no label -> null, not NaN."""
    a, b = (str(ROOT / "data/examples/aotriton" / f"aotriton_{v}_synthetic.jsonl") for v in ("0.13b", "0.14.2b"))
    out = tmp_path / "sub" / "ab.json"
    assert main(["compare", a, b, "--json", str(out)]) == 0
    text = out.read_text()
    assert "NaN" not in text
    d = json.loads(text)
    assert d["counts"]["none"] == 10 and d["only_b"] == 1
    assert d["geomean"]["lo"] is None and d["geomean"]["label"] is None and d["gate"] is None
    assert all(p["ratio_lo"] is None and p["verdict"] is None for p in d["pairs"])
    assert len(d["notes"]) == 1 and d["notes"][0].endswith("10 of 10 attention pairs within it")
    assert "labels:" in capsys.readouterr().out


def test_summary_md_writes_a_counts_table_and_appends(files, tmp_path, capsys):
    md = tmp_path / "step_summary.md"
    assert main(["compare", files["main"], files["slow"], "--names", "main,pr", "--fail-on", "SLOWER:5%",
                 "--summary-md", str(md)]) == 1
    first = md.read_text()
    assert first.startswith("## flyexplore compare: pr vs main (gate FAILED)\n")
    assert "| label | pairs |" in first and "| SLOWER (pr slower) | 20 |" in first and "| SAME | 0 |" in first
    assert "**Geometric mean:** 0.333x [" in first and "### Largest changes" in first
    assert f"`{SLOW_CASE}`" in first and "### Gate `--fail-on SLOWER:5%`: FAILED" in first
    assert main(["compare", files["main"], files["copy"], "--summary-md", str(md)]) == 0
    both = md.read_text()
    assert both.startswith(first) and both.count("## flyexplore compare:") == 2
    assert "| SAME | 20 |" in both[len(first):]
    capsys.readouterr()


@pytest.mark.parametrize("value,needle", [
    ("FASTER", "only SLOWER (B slower than A) can gate"),
    ("AMBIGUOUS", "only SLOWER (B slower than A) can gate"),
    ("SLOWER:abc", "the threshold is no number"),
    ("SLOWER:-3%", "a negative threshold"),
    ("SLOWER:", "the threshold is no number"),
    ("SLOWER:5", "a bare threshold is a fraction below 1"),
])
def test_a_bad_fail_on_is_one_usage_line_before_anything_is_read_or_written(tmp_path, capsys, value, needle):
    missing = tmp_path / "no-such-file.parquet"   # read first, it would be the error
    rc = main(["compare", str(missing), str(missing), "--fail-on", value, "--out", str(tmp_path / "rep"),
               "--json", str(tmp_path / "ab.json"), "--summary-md", str(tmp_path / "s.md")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, (out, err)
    assert err.startswith(f"flyexplore: error: bad --fail-on {value!r}: {needle}"), err
    assert list(tmp_path.iterdir()) == []


def test_without_out_nothing_is_written(files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", files["main"], files["copy"]]) == 0
    out = capsys.readouterr().out
    assert "report:" not in out and "labels:" in out
    assert list(tmp_path.iterdir()) == []


def test_with_out_the_report_is_written_and_the_summary_follows(files, tmp_path, capsys):
    assert main(["compare", files["main"], files["slow"], "--out", str(tmp_path / "rep"), "--no-images"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"report: {tmp_path / 'rep' / 'report.html'}" and lines[1].startswith("flyexplore compare:")
    assert (tmp_path / "rep" / "tables" / "pairs.csv").exists()


def test_vllm_ab_gets_a_short_summary_and_refuses_a_gate(tmp_path, capsys):
    a, b = (str(ROOT / "data/examples/vllm" / n) for n in ("flydsl_off", "flydsl_on"))
    assert main(["compare", a, b, "--json", str(tmp_path / "v.json"), "--summary-md", str(tmp_path / "v.md")]) == 0
    out = capsys.readouterr().out
    # the example files are made up, and the summary says so first (issue 36)
    assert out.startswith("SYNTHETIC EXAMPLE: the inputs are marked made-up; no number here is a measurement\n"
                          "flyexplore compare (vllm serve): B vs A, 3 (model, concurrency, request rate) pairs")
    assert "TTFT median (ms): geomean" in out and "no gate" in out
    assert json.loads((tmp_path / "v.json").read_text())["kind"] == "vllm"
    assert json.loads((tmp_path / "v.json").read_text())["synthetic"] is True
    md = (tmp_path / "v.md").read_text()
    assert md.startswith("## flyexplore compare (vllm serve)") and "**SYNTHETIC EXAMPLE: the inputs" in md
    rc = main(["compare", a, b, "--fail-on", "SLOWER", "--json", str(tmp_path / "g.json")])
    out, err = capsys.readouterr()
    assert rc == 2 and "vllm bench results carry no per-case interval" in err
    assert not (tmp_path / "g.json").exists()


def test_a_doubled_time_ms_is_refused_by_compare_and_the_api_not_read_as_same(files, tmp_path, capsys):
    """Issue 33, 5: every time_ms of B doubled by hand (samples untouched) showed time B = 2x
    time A beside "1.000x SAME", and the gate passed. Now ``compare`` refuses the file in one line
    naming it, the column, the first row, the stored and the recomputed time; ``fx.compare`` and
    ``fx.report`` refuse it in the same line, and a DataFrame with the same problem likewise."""
    base = R.load(files["main"])
    doubled = base.assign(time_ms=base["time_ms"] * 2)
    p = R.save(doubled, tmp_path / "doubled.parquet")
    rc = main(["compare", files["main"], str(p), "--fail-on", "SLOWER", "--out", str(tmp_path / "ab")])
    out, err = capsys.readouterr()
    t = float(base["time_ms"].iloc[0])
    problem = (f"column time_ms, row 0 (gemm 2048x4096x4096 bf16 aten, run {base['run_id'].iloc[0]}): stored "
               f"{2 * t:.6g} ms is not the median of its samples_ms ({t:.6g} ms recomputed) (20 rows like it)")
    assert rc == 2 and out == "" and err == f"flyexplore: error: {str(p)!r} is not a valid result file: {problem}\n"
    for call in (lambda: fx.compare(files["main"], p), lambda: fx.report(p, tmp_path / "rep")):
        with pytest.raises(UsageError) as e:
            call()
        assert f"flyexplore: error: {e.value}\n" == err
    with pytest.raises(UsageError) as e:
        fx.compare(base, doubled, names=("main", "pr"))
    assert str(e.value) == f"the DataFrame of side pr is not a valid result set: {problem}"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["doubled.parquet"]


# -- the library side: fx.compare's result, the gate on the geometric mean, the allowance ------

def test_fx_compare_result_has_the_summary_and_the_gate(files):
    ab = fx.compare(files["main"], files["slow"])
    assert ab.gate("SLOWER:5%").failed and not ab.gate("SLOWER:500%").failed
    assert ab.gate().tripped["ratio"].to_numpy() == pytest.approx(1 / 3)
    lines = ab.summary_lines("SLOWER")
    assert lines[2] == "labels: FASTER (B faster) 0, SAME 0, SLOWER (B slower) 20, AMBIGUOUS 0"
    gate = next(i for i, line in enumerate(lines) if line.startswith("gate --fail-on SLOWER: FAILED"))
    assert lines[gate + 1].strip().startswith("gemm ") and lines[-1].strip().startswith("geometric mean")
    assert not fx.compare(files["main"], files["copy"]).gate().failed


def test_the_geometric_mean_alone_can_trip_the_gate(files):
    """20 pairs 3% slower, each interval [0.93, 1.01] (AMBIGUOUS): no pair trips it, their
    geometric mean's narrower interval lies below 0.99 (SLOWER) and does."""
    ab = C.sides(files["main"], files["copy"]).ab
    p = ab.pairs.assign(ratio=0.97, ratio_lo=0.93, ratio_hi=1.01, verdict="AMBIGUOUS")
    g = C.gate(dataclasses.replace(ab, pairs=p), "SLOWER")
    assert g.failed and g.geomean_tripped and g.tripped.empty and g.geomean_label == "SLOWER"
    assert g.lines[0] == "gate --fail-on SLOWER: FAILED: the geometric mean is B slower (SLOWER)"
    assert not C.gate(dataclasses.replace(ab, pairs=p), "SLOWER:3%").failed   # 0.97 > 1/1.03 at the hi end


def test_the_allowance_is_shown_when_the_pairs_carry_it(files):
    ab = C.sides(files["main"], files["slow"]).ab
    p = ab.pairs.assign(allowance=0.008, allowance_basis="the files' between-process variation")
    ab2 = dataclasses.replace(ab, pairs=p)
    assert "cross-run allowance ±0.8% (from the files' between-process variation)" in C.summary_lines(ab2)
    d = C.summary_dict(ab2)
    assert d["pairs"][0]["allowance"] == pytest.approx(0.008) and d["allowance"].startswith("cross-run allowance")
    assert "Cross-run allowance ±0.8%" in C.summary_markdown(ab2)
    p.loc[0, "allowance"] = float("nan")   # NaN: no allowance for that pair -> null in JSON
    assert C.summary_dict(dataclasses.replace(ab, pairs=p))["pairs"][0]["allowance"] is None
    assert any("cross-run allowance" in line for line in C.summary_lines(ab))   # pair() adds it


def test_parse_fail_on():
    assert C.parse_fail_on("SLOWER") == C.FailOn("SLOWER", 0.0)
    assert C.parse_fail_on("SLOWER:5%").threshold == pytest.approx(0.05)
    assert C.parse_fail_on("SLOWER:0.05").threshold == pytest.approx(0.05)
    assert C.parse_fail_on("SLOWER:150%").limit == pytest.approx(1 / 2.5)
    assert C.parse_fail_on("SLOWER:5%").text == "SLOWER:5%"
    for bad in ("SLOWER:inf", "SLOWER:nan", "SLOWER:5%%", "SAME", ""):
        with pytest.raises(UsageError, match="bad --fail-on"):
            C.parse_fail_on(bad)


def test_the_summary_says_why_the_aotriton_range_is_not_shown_on_an_h200(tmp_path, capsys):
    h200 = str(ROOT / "data/h200/layers_smoke/attention.parquet")   # flash, efficient, cudnn, math on sm_90
    md = tmp_path / "s.md"
    assert main(["compare", h200, h200, "--fail-on", "SLOWER", "--summary-md", str(md)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    why = "not shown: arch sm_90 on both sides, not gfx950; no AOTriton version recorded on either side"
    assert "published AOTriton range (0.14.2b vs 0.13b on gfx950" in out and why in out
    assert why in md.read_text()


def test_ambiguous_pairs_still_state_the_band_they_fit(files, tmp_path, capsys):
    """Another run of the same sweep (times unchanged, a new run id): cross-run pairs carry the
    default allowance, so they read AMBIGUOUS at the 1% band; each says the narrowest band at
    which it would read SAME, and the summary, the JSON and the Markdown give the bound."""
    again = R.save(slowed(R.load(SWEEP), 1.0), tmp_path / "again.parquet")
    ab = C.sides(files["main"], str(again)).ab
    p = ab.pairs
    assert (p["verdict"] == "AMBIGUOUS").all()
    sw = p["same_within"].to_numpy(dtype=float)
    assert sw == pytest.approx(np_max(1 - p["ratio_lo"], p["ratio_hi"] - 1))
    assert (sw > 0.01).all()
    # the pair reads SAME at its own same_within band, not just below it
    from flyexplore.measure.stats import verdict
    for lo, hi, b in zip(p["ratio_lo"], p["ratio_hi"], sw):
        assert verdict(lo, hi, b * (1 + 1e-9)) == "SAME" and verdict(lo, hi, b * 0.99) == "AMBIGUOUS"
    text = C.same_within_text(p)
    assert text.startswith(f"AMBIGUOUS pairs: each 95% interval lies within ±{C._pct(sw.max())} of 1")
    js = tmp_path / "ab.json"
    md = tmp_path / "ab.md"
    assert main(["compare", files["main"], str(again), "--json", str(js), "--summary-md", str(md)]) == 0
    out = capsys.readouterr().out
    assert "AMBIGUOUS pairs: each 95% interval lies within" in out
    d = json.loads(js.read_text())
    assert [r["same_within"] for r in d["pairs"]] == pytest.approx(list(sw))
    assert "AMBIGUOUS pairs: each 95% interval lies within" in md.read_text()
    # an identical file: every pair SAME, no such line
    assert C.same_within_text(C.sides(files["main"], files["copy"]).ab.pairs) is None


def np_max(a, b):
    import numpy as np
    return np.maximum(a.to_numpy(dtype=float), b.to_numpy(dtype=float))
