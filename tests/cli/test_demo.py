"""``flyexplore demo``, the whole main job on this machine, in-process (:mod:`tests.cli.inproc`):
the sweeps, the X-ray and the static figures run as they do for a user, once in the suite
(tests/views/test_export_report.py checks the demo's glue with the sweeps and the X-ray stubbed)."""
import pytest

from flyexplore.results import table as R
from tests.cli.inproc import run_main


@pytest.mark.slow
def test_demo_writes_results_env_and_report(tmp_path, capfd):
    out = tmp_path / "demo"
    # capfd: torch's C++ messages and the browser's go to the stderr fd. Kineto prints gpuGetDeviceCount
    # once per process: a fresh one's silencing is checked by test_newcomer.py::test_harmless_cpu_messages_are_silenced
    p = run_main(capfd, "demo", "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    assert "report:" in p.stdout
    # issue 36: the verdicts on the terminal, one line per comparison, before the report's path
    said = p.stdout.splitlines()
    assert said[-1].startswith("report: ")
    v = next(i for i, ln in enumerate(said) if ln.startswith("verdicts: speedup = aten time / backend time"))
    cmp = [ln for ln in said[v + 1:] if ln.startswith("  ")]
    assert len(cmp) == 9 and all(" inductor vs aten " in ln for ln in cmp)   # 3 cases of each op
    assert all(ln.rstrip().endswith(("FASTER", "SAME", "SLOWER", "AMBIGUOUS")) for ln in cmp)
    df = R.load(out / "results.parquet")
    R.validate(df)
    assert set(df.op) == {"gemm", "rmsnorm", "topk"}
    assert set(df[df.status == "ok"].backend) >= {"aten", "inductor"}
    un = df[df.status == "unavailable"]
    assert len(un) and un.message.notna().all()
    assert (df.status != "error").all(), df[df.status == "error"][["op", "case", "backend", "message"]]
    html = (out / "report.html").read_text()
    assert "Plotly.newPlot" in html and "speedup" in html.lower()
    assert "platform: cpu" in html
    assert (out / "env.json").exists() and (out / "results.csv").exists()
    # issue 14: the FlyDSL section (explainer verdicts, X-ray resources or how to get them, published
    # figures), tables a reader can scan, plotly.js once beside the page, no alarming CPU messages
    assert "FlyDSL on MI355X (gfx950): explainer and kernel X-ray" in html
    assert html.count("FlyDSL YES") >= 3 and "26.7 µs" in html and "43.6 TFLOP/s" in html
    from flyexplore.insight.xray import unavailable_reason
    if unavailable_reason() is None:
        assert "waves per SIMD" in html and "VGPRs" in html and "8 of 8 (100%)" in html
    else:
        assert "apt-get install lld-22" in html
    assert "time_us" in html and "time_ms" not in html.split("<h2>Results</h2>")[1]
    assert "e+0" not in html.split("<h2>Results</h2>")[1]
    res = html.split("<h2>Results</h2>")[1]
    assert res.count("is a CUDA build, not ROCm") <= 2  # a footnote, not once per row
    assert len(html) < 1_000_000 and (out / "plotly.min.js").exists()
    assert "gpuGetDeviceCount" not in p.stderr and "No CUDA runtime is found" not in p.stderr, p.stderr
