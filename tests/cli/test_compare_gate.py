"""``flyexplore compare`` as a CI gate (issue 24): the terminal summary, ``--json``,
``--summary-md``, ``--fail-on SLOWER[:THRESHOLD]`` and ``--out`` left out; ``AMBIGUOUS[:WIDTH]``
rules, ``:warn`` and the pairs of workers that would decide an AMBIGUOUS reading, on environment
A/B files built by hand (issue 43), and picking two of three environments of one A/B file. The result files are
built from a committed H200 sweep (``data/h200/model_coverage/llama-3.1-8b_gemm.parquet``: 10
GEMM cases x 2 backends, interleaved, with samples); side B of the regression is the same sweep
3x slower (every time and every stored sample times 3, another run). In-process
(:func:`flyexplore.cli.main`), as the other compare tests."""
import dataclasses
import json
import math
import shutil

import pandas as pd
import pytest
from conftest import ROOT

import flyexplore as fx
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import compare as C
from flyexplore.results import gate as G
from flyexplore.results import pairtext as P
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
    ("FASTER", "'FASTER': only SLOWER (B slower than A) and AMBIGUOUS (undecided) can gate"),
    ("SAME:5%", "'SAME:5%': only SLOWER (B slower than A) and AMBIGUOUS (undecided) can gate"),
    ("SLOWER:abc", "'SLOWER:abc': the threshold is no number"),
    ("SLOWER:-3%", "'SLOWER:-3%': a negative threshold"),
    ("SLOWER:", "'SLOWER:': the threshold is no number"),
    ("SLOWER:5", "'SLOWER:5': a bare threshold is a fraction below 1"),
    ("AMBIGUOUS:wide", "'AMBIGUOUS:wide': the width is no number"),
    ("AMBIGUOUS:-5%", "'AMBIGUOUS:-5%': a negative width"),
    ("AMBIGUOUS:5", "'AMBIGUOUS:5': a bare width is a fraction below 1; write 5% for 5 percent"),
    ("AMBIGUOUS:5%:warm", "'AMBIGUOUS:5%:warm': too many ':' parts"),
    ("SLOWER:5%,AMBIGUOUS:x%", "'AMBIGUOUS:x%': the width is no number"),
    ("SLOWER:5%,", "'SLOWER:5%,': an empty rule between commas"),
])
def test_a_bad_fail_on_is_one_usage_line_before_anything_is_read_or_written(tmp_path, capsys, value, needle):
    missing = tmp_path / "no-such-file.parquet"   # read first, it would be the error
    rc = main(["compare", str(missing), str(missing), "--fail-on", value, "--out", str(tmp_path / "rep"),
               "--json", str(tmp_path / "ab.json"), "--summary-md", str(tmp_path / "s.md")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, (out, err)
    assert err.startswith(f"flyexplore: error: bad --fail-on {needle}"), err
    if "," in value:   # the bad rule of several is named, and the whole value after it
        assert f"in {value!r}" in err or needle.startswith(repr(value)), err
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
    g = G.gate(dataclasses.replace(ab, pairs=p), "SLOWER")
    assert g.failed and g.geomean_tripped and g.tripped.empty and g.geomean_label == "SLOWER"
    assert g.lines[0] == "gate --fail-on SLOWER: FAILED: the geometric mean is B slower (SLOWER)"
    assert not G.gate(dataclasses.replace(ab, pairs=p), "SLOWER:3%").failed   # 0.97 > 1/1.03 at the hi end


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
    assert G.parse_fail_on("SLOWER") == G.FailOn("SLOWER", 0.0)
    assert G.parse_fail_on("SLOWER:5%").threshold == pytest.approx(0.05)
    assert G.parse_fail_on("SLOWER:0.05").threshold == pytest.approx(0.05)
    assert G.parse_fail_on("SLOWER:150%").limit == pytest.approx(1 / 2.5)
    assert G.parse_fail_on("SLOWER:5%").text == "SLOWER:5%"
    for bad in ("SLOWER:inf", "SLOWER:nan", "SLOWER:5%%", "SAME", "", "warn", "SLOWER:5%,AMBIGUOUS"):
        with pytest.raises(UsageError, match="bad --fail-on"):
            G.parse_fail_on(bad)


def test_parse_rules_reads_ambiguous_widths_and_warn():
    amb = G.parse_fail_on("ambiguous:5%:WARN")
    assert amb == G.FailOn("AMBIGUOUS", 0.05, warn=True) and amb.text == "AMBIGUOUS:5%:warn"
    assert amb.limit == pytest.approx(1.05)   # the widest hi/lo that passes
    assert G.parse_fail_on("AMBIGUOUS") == G.FailOn("AMBIGUOUS", 0.0) and G.parse_fail_on("SLOWER:warn").warn
    rules = G.parse_rules(" SLOWER:5% , AMBIGUOUS:0.02:warn")
    assert rules == (G.FailOn("SLOWER", 0.05), G.FailOn("AMBIGUOUS", 0.02, True))
    assert G.parse_rules(["SLOWER", G.FailOn("AMBIGUOUS", 0.05)]) == (G.FailOn(), G.FailOn("AMBIGUOUS", 0.05))
    assert G.parse_rules(G.FailOn("AMBIGUOUS", 0.05)) == (G.FailOn("AMBIGUOUS", 0.05),)
    for bad in ("", " , ", "SLOWER,,AMBIGUOUS", "SLOWER:5%,FASTER"):
        with pytest.raises(UsageError, match="^bad --fail-on"):
            G.parse_rules(bad)
    with pytest.raises(UsageError, match="label must be SLOWER or AMBIGUOUS"):
        G.parse_rules(G.FailOn("FASTER"))


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
    assert text.startswith(f"AMBIGUOUS pairs: each 95% interval lies within ±{P._pct(sw.max())} of 1")
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


# -- AMBIGUOUS in the gate, and how many pairs would decide it (issue 43, 3) ---------------------

def ab_rows(per_pair: dict, base: str = "a", case: str = "64x64x64") -> pd.DataFrame:
    """An environment A/B's rows built by hand, as ``sweep --env`` writes them: aten in the base
    environment ``base`` and in each other environment of ``per_pair`` (env -> that arm's speedup
    over the base arm in each pair of workers), one run, ``processes`` pairs; each arm's speedup
    and interval those of the mean over the pairs (between_process, prediction=False)."""
    n = len(next(iter(per_pair.values())))
    common = {"op": "gemm", "case": case, "dtype": "fp32", "status": "ok", "source": "measured", "run_id": "r1",
              "order": "interleaved", "platform": "cpu", "processes": n}
    rows = [{**common, "backend": f"aten@{base}", "env": base, "time_ms": 1.0, "baseline": f"aten@{base}",
             "process_estimates": json.dumps([{"time_ms": 1.0, "time_se": 0.001}] * n)}]
    for env, sp in per_pair.items():
        e, lo, hi = S.between_process(sp, [0.001] * n, prediction=False)
        pe = [{"time_ms": 1.0 / s, "time_se": 0.001, "speedup": s, "speedup_se": 0.001} for s in sp]
        rows.append({**common, "backend": f"aten@{env}", "env": env, "time_ms": 1.0 / e, "baseline": f"aten@{base}",
                     "speedup": e, "speedup_lo": lo, "speedup_hi": hi, "verdict": S.verdict(lo, hi),
                     "process_estimates": json.dumps(pe)})
    return R.frame(rows)


#: The issue's case: B 2x slower (0.503x) read with 3 pairs on a loaded CPU as [0.234, 1.080]
#: AMBIGUOUS. Three per-pair speedups whose log sample sd is 0.3076 give exactly that interval.
SD_2X = 0.3076
SLOW_2X = [0.503 * math.exp(-SD_2X), 0.503, 0.503 * math.exp(SD_2X)]


@pytest.fixture(scope="module")
def ab_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("envab")
    return {"2x": str(R.save(ab_rows({"b": SLOW_2X}), d / "ab_2x.parquet")),
            # 1.1% slower, pairs 0.3% apart: AMBIGUOUS (the interval crosses 0.99), 1.5% wide
            "narrow": str(R.save(ab_rows({"b": [0.986, 0.989, 0.992]}), d / "ab_narrow.parquet"))}


def test_the_2x_slowdown_is_the_issues_ambiguous_reading(ab_files):
    p = C.sides(ab_files["2x"]).ab.pairs.iloc[0]
    assert (round(p["ratio_lo"], 3), round(p["ratio_hi"], 3)) == (0.234, 1.080) and p["verdict"] == "AMBIGUOUS"
    assert p["interval"] == "between-pair" and p["worker_pairs"] == 3
    assert p["pair_sd"] == pytest.approx(SD_2X)   # the per-pair speedups' log sd, from process_estimates


def test_a_2x_slowdown_read_ambiguous_fails_the_ambiguous_rule_and_names_the_pairs(ab_files, capsys):
    """Issue 43: the 2x slowdown read AMBIGUOUS and ``--fail-on SLOWER:5%`` exited 0. With
    ``AMBIGUOUS:5%`` it fails (width 1.080/0.234 - 1 = 3.6 > 5%), and says how many pairs of
    workers would decide it: at sd 0.3076, 4 pairs clear 0.99 from 0.503
    (tests/measure/test_verdicts.py works it by hand) and 614 bring the width within 5%
    (the smallest n with t(n-1) * 0.3076 / sqrt(n) <= log(1.05) / 2 = 0.024395: at 613 it is
    1.96392 * 0.3076 / 24.759 = 0.024399)."""
    assert main(["compare", ab_files["2x"], "--fail-on", "SLOWER:5%"]) == 0   # what the issue saw
    assert "gate --fail-on SLOWER:5%: passed" in capsys.readouterr().out
    rc = main(["compare", ab_files["2x"], "--fail-on", "SLOWER:5%,AMBIGUOUS:5%"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    gate = " ".join(out[out.index("gate --fail-on SLOWER:5%,AMBIGUOUS:5%: FAILED"):].split())
    assert "SLOWER:5%: no pair, nor the geometric mean, is b slower by more than 5%" in gate
    assert ("AMBIGUOUS:5%: 1 pair and the geometric mean are AMBIGUOUS with a 95% interval wider than 5% "
            "(hi/lo - 1 above 0.05)") in gate
    assert "up to about 4 pairs would decide them if the estimates held (sweep --pairs 4)" in gate
    assert "up to about 614 would bring them within 5%" in gate
    assert "gemm 64x64x64 fp32 aten 0.503x [0.234, 1.080] AMBIGUOUS about 4 pairs" in gate
    assert all(len(line) <= 100 for line in out.splitlines()), out


def test_the_gate_json_and_markdown_carry_the_pairs_needed(ab_files, tmp_path, capsys):
    js, md = tmp_path / "g.json", tmp_path / "g.md"
    assert main(["compare", ab_files["2x"], "--fail-on", "SLOWER:5%,AMBIGUOUS:5%", "--json", str(js),
                 "--summary-md", str(md)]) == 1
    capsys.readouterr()
    g = json.loads(js.read_text())["gate"]
    assert g["fail_on"] == "SLOWER:5%,AMBIGUOUS:5%" and g["failed"] is True and g["outcome"] == "FAILED"
    assert g["label"] is None and [r["fail_on"] for r in g["rules"]] == ["SLOWER:5%", "AMBIGUOUS:5%"]
    slower, amb = g["rules"]
    assert slower["hit"] is False and slower["tripped"] == [] and amb["hit"] is True
    t = amb["tripped"][0]
    assert t["width"] == pytest.approx(1.079994 / 0.234269 - 1, rel=1e-5) and t["worker_pairs"] == 3
    assert (t["pairs_to_decide"], t["pairs_to_narrow"]) == (4, 614)
    assert (amb["geomean_pairs_to_decide"], amb["geomean_pairs_to_narrow"]) == (4, 614)   # one pair: the same
    assert g["tripped"] == amb["tripped"] and g["geomean_tripped"] is True
    text = md.read_text()
    assert "(gate FAILED)" in text and "### Gate `--fail-on SLOWER:5%,AMBIGUOUS:5%`: FAILED" in text
    assert "`AMBIGUOUS:5%` (fails):" in text and "about 4 pairs would decide them" in text


def test_a_narrow_ambiguous_passes_and_a_narrower_width_fails_it(ab_files, capsys):
    ab = C.sides(ab_files["narrow"]).ab
    p = ab.pairs.iloc[0]
    width = p["ratio_hi"] / p["ratio_lo"] - 1
    assert p["verdict"] == "AMBIGUOUS" and p["ratio_lo"] < 0.99 < p["ratio_hi"] and 0.01 < width < 0.02
    assert main(["compare", ab_files["narrow"], "--fail-on", "SLOWER:5%,AMBIGUOUS:5%"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("gate --fail-on SLOWER:5%,AMBIGUOUS:5%: passed: SLOWER:5%: no pair, nor the geometric mean, is b "
            "slower by more than 5%") in out
    assert "AMBIGUOUS:5%: no pair, nor the geometric mean, is AMBIGUOUS with a 95% interval wider than 5%" in out
    assert main(["compare", ab_files["narrow"], "--fail-on", "AMBIGUOUS:1%"]) == 1   # 1.5% wide > 1%
    out = " ".join(capsys.readouterr().out.split())
    assert "gate --fail-on AMBIGUOUS:1%: FAILED: 1 pair and the geometric mean are AMBIGUOUS" in out
    g = ab.gate("AMBIGUOUS:1%").results[0]
    want = S.pairs_to_decide(S.pair_spread([0.986, 0.989, 0.992], [0.001] * 3), estimate=p["ratio"])
    assert g.tripped["pairs_to_decide"].tolist() == [want] and want > 3
    assert f"about {want} pairs would decide" in out


def test_warn_only_prints_a_warning_and_exits_0(ab_files, capsys):
    rc = main(["compare", ab_files["2x"], "--fail-on", "SLOWER:5%,AMBIGUOUS:5%:warn"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    gate = " ".join(out[out.index("gate --fail-on"):].split())
    assert gate.startswith("gate --fail-on SLOWER:5%,AMBIGUOUS:5%:warn: WARNING: SLOWER:5%: no pair")
    assert "AMBIGUOUS:5%:warn: 1 pair and the geometric mean are AMBIGUOUS" in gate and "about 4 pairs" in gate
    assert "AMBIGUOUS:5%:warn (warns): gemm 64x64x64 fp32 aten 0.503x [0.234, 1.080] AMBIGUOUS" in gate
    g = fx.compare(ab_files["2x"]).gate("AMBIGUOUS:5%:warn")
    assert not g.failed and g.warned and g.outcome == "WARNING" and g.tripped.empty and not g.geomean_tripped
    assert g.lines[0].startswith("gate --fail-on AMBIGUOUS:5%:warn: WARNING: 1 pair")
    # a failing rule beside a warning one still fails
    assert fx.compare(ab_files["2x"]).gate("AMBIGUOUS:5%:warn,AMBIGUOUS:400%").failed is False
    assert fx.compare(ab_files["2x"]).gate("AMBIGUOUS:5%:warn,AMBIGUOUS:300%").failed is True


def test_fx_compare_gate_takes_the_same_rule_text(ab_files):
    ab = fx.compare(ab_files["2x"])
    g = ab.gate("SLOWER:5%,AMBIGUOUS:5%")
    assert g.failed and g.text == "SLOWER:5%,AMBIGUOUS:5%" and [r.hit for r in g.results] == [False, True]
    assert g.results[1].tripped["pairs_to_decide"].tolist() == [4]
    assert not ab.gate("SLOWER:5%").failed
    assert ab.gate(["SLOWER:5%", G.FailOn("AMBIGUOUS", 0.05)]).failed
    assert any(line.startswith("gate --fail-on AMBIGUOUS:5%: FAILED") for line in ab.summary_lines("AMBIGUOUS:5%"))
    with pytest.raises(UsageError, match=r"^bad --fail-on 'AMBIGUOUS:5'"):
        ab.gate("SLOWER:5%,AMBIGUOUS:5")


def test_without_a_spread_between_pairs_the_gate_says_a_quieter_machine_or_more_rounds(files, tmp_path, capsys):
    """Two runs of one sweep: unpaired+run intervals, AMBIGUOUS at the 1% band, with no pairs of
    workers to count from."""
    again = R.save(slowed(R.load(SWEEP), 1.0), tmp_path / "again.parquet")
    ab = C.sides(files["main"], str(again)).ab
    assert ab.pairs["worker_pairs"].isna().all() and ab.pairs["pair_sd"].isna().all()
    rc = main(["compare", files["main"], str(again), "--fail-on", "SLOWER:5%,AMBIGUOUS:1%"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 1
    assert ("AMBIGUOUS:1%: 20 pairs and the geometric mean are AMBIGUOUS with a 95% interval wider than 1% "
            "(hi/lo - 1 above 0.01); "
            "they have no spread between pairs of workers to count from: a quieter machine or more rounds "
            "would narrow them") in out
    assert "pairs would decide" not in out
    res = ab.gate("AMBIGUOUS:1%").results[0]
    assert res.tripped["pairs_to_decide"].isna().all()
    w = res.tripped["width"].to_numpy(dtype=float)
    assert (w > 0.01).all() and (w[:-1] >= w[1:]).all()   # the widest first


def test_the_geometric_mean_s_pairs_needed_adds_the_pairs_spreads_in_quadrature(tmp_path):
    """Two cases of one A/B, each 3 pairs: the geometric mean's interval (delta method) has the
    half-width t(2)/sqrt(3) * sqrt(sd1**2 + sd2**2) / 2, so its spread is that root sum over 2,
    the one interval_spread reads back from the geomean interval."""
    one = ab_rows({"b": [0.95, 1.00, 1.06]}, case="64x64x64")
    two = ab_rows({"b": [0.90, 1.02, 0.99]}, case="128x128x128")
    ab = C.sides(R.concat([one, two])).ab
    sd1, sd2 = ab.pairs["pair_sd"].tolist()
    assert sd1 == pytest.approx(S.pair_spread([0.95, 1.00, 1.06])) and sd2 == pytest.approx(
        S.pair_spread([0.90, 1.02, 0.99]))
    gm, glo, ghi = ab.geomean_ci
    sd_g = math.hypot(sd1, sd2) / 2
    assert S.interval_spread(glo, ghi, 3) == pytest.approx(sd_g, rel=1e-9)
    res = ab.gate("AMBIGUOUS:2%").results[0]
    assert res.geomean_tripped
    assert res.geomean_needs == (S.pairs_to_decide(sd_g, estimate=gm), S.pairs_to_decide(sd_g, 0.02))


def test_the_pairs_spread_read_from_a_committed_ab_file_is_its_intervals():
    """data/h200/ab/aa.parquet (an H200 A/A of 5 pairs): each pair's spread, read from its
    per-pair speedups, is the one its between-pair interval was built from."""
    ab = C.sides(str(ROOT / "data/h200/ab/aa.parquet")).ab
    p = ab.pairs
    assert (p["interval"] == "between-pair").all() and (p["worker_pairs"] == 5).all()
    back = [S.interval_spread(lo, hi, 5) for lo, hi in zip(p["ratio_lo"], p["ratio_hi"])]
    assert p["pair_sd"].to_numpy(dtype=float) == pytest.approx(back, rel=1e-9)


# -- an A/B file of three environments: any two of them ------------------------------------------

@pytest.fixture(scope="module")
def three_envs(tmp_path_factory):
    """aten in environments a (the base), b (20% slower) and c (as fast as a), 3 pairs each."""
    df = ab_rows({"b": [0.80, 0.81, 0.805], "c": [1.0, 1.01, 0.99]})
    assert R.ab_envs(df) == ["a", "b", "c"]
    return str(R.save(df, tmp_path_factory.mktemp("three") / "abc.parquet"))


@pytest.mark.parametrize("a_env,b_env,ratio,label", [
    ("a", "b", 0.805, "SLOWER"), ("b", "a", 1 / 0.805, "FASTER"),
    ("b", "c", 1.0 / 0.805, "FASTER"), ("c", "b", 0.805, "SLOWER")])
def test_compare_picks_any_two_environments_of_one_ab_file(three_envs, capsys, a_env, b_env, ratio, label):
    """b against c: neither is the base, so the pair's interval is built from the two arms' per-pair
    times (each pair timed both, round by round: between-pair), and its spread from their ratios."""
    rc = main(["compare", three_envs, "--a-env", a_env, "--b-env", b_env, "--json", "-"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    d = json.loads(out)
    assert d["names"] == [a_env, b_env] and len(d["pairs"]) == 1
    p = d["pairs"][0]
    assert p["ratio"] == pytest.approx(ratio, rel=0.01) and p["verdict"] == label
    assert p["interval"] == "between-pair" and p["worker_pairs"] == 3
    assert p["pair_sd"] == pytest.approx(S.interval_spread(p["ratio_lo"], p["ratio_hi"], 3), rel=1e-9)
    assert err.startswith(f"flyexplore compare: {b_env} vs {a_env}, 1 pairs")


def test_three_environments_need_b_env_and_default_a_env_to_the_base(three_envs, capsys):
    assert main(["compare", three_envs]) == 2
    err = capsys.readouterr().err
    assert err == ("flyexplore: error: the A/B has 3 environments: name the one to compare with a by --b-env "
                   "(b, c)\n")
    assert main(["compare", three_envs, "--a-env", "b"]) == 2
    assert "name the one to compare with b by --b-env (a, c)" in capsys.readouterr().err
    assert main(["compare", three_envs, "--b-env", "c"]) == 0
    assert capsys.readouterr().out.startswith("flyexplore compare: c vs a, 1 pairs")
    assert main(["compare", three_envs, "--a-env", "d", "--b-env", "c"]) == 2
    assert "--a-env 'd' is not an environment of the rows (environments: a, b, c)" in capsys.readouterr().err
    assert fx.compare(three_envs, a_env="c", b_env="b").names == ("c", "b")
