"""Issue 36, a newcomer working from the README alone: what the terminal says (demo verdicts,
the synthetic example's A/B), shapes typed as ``flyexplore explain --help`` shows them."""
import pytest

from flyexplore.cli import main
from flyexplore.cli._shared import EXIT_NO, EXIT_USAGE


@pytest.mark.parametrize("shape,want", [
    ("1x32x4096x4096x128:causal=1,bwd", "pass=bwd"),     # as --help shows it
    ("1x32x4096x4096x128:causal=1,bwd=1", "pass=bwd"),
    ("1x32x4096x4096x128:causal=1,bwd=0", "pass=fwd"),
    ("1x32x4096x4096x128:causal,bwd", "pass=bwd"),
])
def test_explain_takes_boolean_words_as_help_shows_them(capsys, shape, want):
    rc = main(["explain", "--op", "attention", "--shape", shape, "--dtype", "bf16"])
    out = capsys.readouterr().out
    assert rc == EXIT_NO and want in out   # a CUDA/CPU torch: not eligible, but the call was read


def test_explain_names_a_bad_boolean_value_in_one_line(capsys):
    rc = main(["explain", "--op", "attention", "--shape", "1x32x4096x4096x128:bwd=2", "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE
    assert err == ("flyexplore: error: bad value '2' for attention option bwd "
                   "(expected 1/0/true/false/yes/no/on/off)\n")


# -- flyexplore demo: the verdicts on the terminal ----------------------------------------------

def _demo_rows():
    from tests.views.test_plots import rows
    gemm = rows({("64x64x64", "aten"): 0.020, ("64x64x64", "inductor"): 0.010,
                 ("128x128x128", "aten"): 0.030, ("128x128x128", "inductor"): 0.060,
                 ("128x128x128", "triton"): 0.05}, dtype="fp32", device="cpu", samples=True)
    tri = gemm.backend == "triton"
    gemm.loc[tri, ["status", "message"]] = ["unavailable", "needs a GPU"]
    gemm.loc[tri, ["time_ms", "tflops", "gbps"]] = float("nan")
    gemm.loc[tri, "samples_ms"] = None
    return gemm


def test_verdict_lines_one_per_comparison_then_not_run():
    from flyexplore.views.report import verdict_lines

    lines = verdict_lines(_demo_rows())
    assert lines[0].startswith("verdicts: speedup = aten time / backend time, [95% interval], label")
    assert lines[1].split()[:6] == ["gemm", "64x64x64", "fp32", "inductor", "vs", "aten"]
    assert lines[1].split()[6] == "2.000x" and lines[1].endswith("FASTER")
    assert lines[2].split()[6] == "0.500x" and lines[2].endswith("SLOWER")
    assert lines[1].index("2.000x") == lines[2].index("0.500x")   # the numbers in one column
    assert lines[3] == "not run: 1 row(s): triton unavailable (1); the report says why"
    assert max(map(len, lines)) <= 100
    # past the limit: one line per (op, dtype, backend)
    short = verdict_lines(_demo_rows(), limit=1)
    assert "2 comparisons, per backend here" in short[0]
    assert short[1].startswith("  gemm fp32 inductor vs aten, geomean of 2 cases") and "(1 FASTER, 1 SLOWER)" in short[1]


def test_demo_prints_the_verdicts_before_the_report_path(monkeypatch, tmp_path, capsys):
    from flyexplore.cli import demo_job
    from flyexplore.results import table as R

    def fake_demo(out, progress=True, static=True):
        R.save(_demo_rows(), tmp_path / "results.parquet")
        (tmp_path / "report.html").write_text("<html></html>")
        return tmp_path / "report.html"

    monkeypatch.setattr(demo_job, "run_demo", fake_demo)
    assert main(["demo", "--out", str(tmp_path), "--quiet", "--no-images"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"report: {tmp_path / 'report.html'}"
    v = out.index(next(ln for ln in out if ln.startswith("verdicts:")))
    assert [ln.split()[3] for ln in out[v + 1:v + 3]] == ["inductor", "inductor"]
    assert out[v + 1].endswith("FASTER") and out[v + 2].endswith("SLOWER")


# -- the synthetic AOTriton example: said on the terminal, at the report's top ---------------------

def test_synthetic_example_says_so_on_the_terminal_json_and_report_top(tmp_path, capsys):
    import json

    from flyexplore.results.aotriton_ab import example_paths

    a, b = map(str, example_paths())
    out = tmp_path / "ab"
    assert main(["compare", a, b, "--out", str(out), "--no-images", "--json", str(tmp_path / "ab.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "report: " + str(out / "report.html")
    assert lines[1] == "SYNTHETIC EXAMPLE: the inputs are marked made-up; no number here is a measurement"
    assert json.loads((tmp_path / "ab.json").read_text())["synthetic"] is True
    html = (out / "report.html").read_text()
    banner = html.index("SYNTHETIC EXAMPLE: the inputs are marked made-up")
    assert banner < html.index("<h2>") and html.count("the inputs are marked made-up") == 1   # at the top, once
    # the A/B chart: no pair has an interval, so it promises no whiskers and says why
    sub = html[html.index('id="fig-ab"'):].split("\\u003csup\\u003e", 1)[1].split("\\u003c\\u002fsup\\u003e")[0]
    assert "whiskers: 95%" not in sub and "no 95% intervals (the rows carry no samples)" in sub
    # from code alike: fx.compare and the AOTriton view's A/B say it first
    import flyexplore as fx
    assert fx.compare(a, b).summary_lines()[0].startswith("SYNTHETIC EXAMPLE")
    assert fx.aotriton_ab(a, b)[0].summary_lines()[0].startswith("SYNTHETIC EXAMPLE")


def test_measured_inputs_get_no_synthetic_line(tmp_path, capsys):
    from tests.views.test_plots import rows
    from flyexplore.results import table as R

    a = rows({("64x4096x4096", "aten"): 0.02}, samples=True)
    b = rows({("64x4096x4096", "aten"): 0.01}, run="r2", samples=True)
    R.save(a, tmp_path / "a.parquet")
    R.save(b, tmp_path / "b.parquet")
    assert main(["compare", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]) == 0
    assert "SYNTHETIC" not in capsys.readouterr().out
