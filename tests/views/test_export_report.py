"""Real exports (kaleido + Chromium): valid PNG, SVG, PDF and offline HTML; tables as CSV,
Markdown and LaTeX; the report, compare and demo outputs. Static export must run in CI (the
CI script installs chromium): without a browser these tests skip locally but fail when the
CI environment variable is set."""
import json
import os
import struct
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from flyexplore.results import published as P
from flyexplore.results import table as R
from flyexplore.cli import main
from flyexplore.errors import UsageError
from flyexplore.views.export import save_figure, save_figures, save_table, static_export_problem
from flyexplore.views.plots import speedup_figure
from flyexplore.views.report import write_compare_report, write_report

from tests.results.test_vllm_ab import result
from tests.views.test_plots import rows


def need_static():
    why = static_export_problem()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"static export must work in CI: {why}")
        pytest.skip(why)


@pytest.fixture
def measured():
    return rows({("8x4096x4096", "aten"): 0.0185, ("8x4096x4096", "triton"): 0.057,
                 ("64x4096x4096", "aten"): 0.018, ("64x4096x4096", "triton"): 0.0316,
                 ("1024x4096x4096", "aten"): 0.048, ("1024x4096x4096", "triton"): 0.0503})


def _check_png(p, width):
    b = p.read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", b[16:24])  # IHDR
    assert w == width and h > 0


def _check_svg(p, text):
    root = ET.parse(p).getroot()
    assert root.tag.endswith("svg")
    assert text in "".join(root.itertext())


def _check_pdf(p):
    b = p.read_bytes()
    assert b[:5] == b"%PDF-" and b"%%EOF" in b[-64:] and len(b) > 1000


@pytest.mark.slow
def test_static_and_html_export(tmp_path, measured):
    need_static()
    fig = speedup_figure(measured, "aten", title="export check")
    paths = save_figures({"s": fig}, tmp_path, ["png", "svg", "pdf", "html"])
    assert sorted(p.name for p in paths) == ["s.html", "s.pdf", "s.png", "s.svg"]
    _check_png(tmp_path / "s.png", 1100 * 2)
    _check_svg(tmp_path / "s.svg", "export check")
    _check_svg(tmp_path / "s.svg", "64x4096x4096")
    _check_pdf(tmp_path / "s.pdf")
    html = (tmp_path / "s.html").read_text()
    assert "<script src=" not in html and "plotly.js v" in html  # plotly.js embedded: opens offline
    assert len(html) > 1_000_000 and "export check" in html
    one = save_figure(fig, tmp_path / "one.svg")
    _check_svg(one, "export check")


def test_bad_export_names(tmp_path, measured):
    fig = speedup_figure(measured, "aten")
    with pytest.raises(UsageError, match="unknown figure file extension '.gif'"):
        save_figure(fig, tmp_path / "x.gif")
    with pytest.raises(UsageError, match="unknown figure format 'jpg'"):
        save_figures({"x": fig}, tmp_path, ["jpg"])
    with pytest.raises(UsageError, match="unknown table file extension '.xlsx'"):
        save_table(pd.DataFrame({"a": [1]}), tmp_path / "t.xlsx")


def test_tables_csv_markdown_latex(tmp_path):
    t = P.load("grouped")[["published_label", "case", "backend", "time_ms", "tflops", "subset"]]
    t = t[t["backend"] == "flydsl"]
    save_table(t, tmp_path / "t.csv")
    back = pd.read_csv(tmp_path / "t.csv")
    assert list(back["case"]) == list(t["case"]) and back["tflops"].iloc[0] == pytest.approx(t["tflops"].iloc[0])
    md = save_table(t, tmp_path / "t.md").read_text()
    assert md.splitlines()[0].startswith("| published_label") and "K4096 x N14336 (MoE up)" in md
    tex = save_table(t, tmp_path / "t.tex").read_text()
    assert "\\begin{tabular}" in tex and "time\\_ms" in tex and "kn\\_variants" in tex
    assert "ms=0/1024/0/512/2048/128/0/896" in tex
    assert "1016" in tex  # float formatted with 4 significant digits
    nul = R.frame([{"op": "gemm", "case": "1x1x1", "dtype": "bf16", "backend": "aten", "status": "unavailable"}])
    md = save_table(nul[["case", "time_ms", "accuracy_ok"]], tmp_path / "n.md").read_text()
    assert "nan" not in md.lower() and "<NA>" not in md


@pytest.mark.slow
def test_write_report_without_images(tmp_path, measured):
    pub = P.load("dense")
    path = write_report(R.concat([measured, pub]), tmp_path / "rep", static=False, published=pub)
    html = path.read_text()
    assert path.name == "report.html"
    # one section per device, never mixed: 2 speedup + 2 sweep figures, a roofline per device,
    # measured vs published
    assert "gemm on NVIDIA H200" in html and "gemm on AMD Instinct MI355X" in html
    assert html.count('<div id="fig-') == 7
    assert "Roofline on H200 SXM" in html and "Roofline on MI355X" in html
    # plotly.js once, beside the page (offline, and report.html stays small)
    assert html.count('src="plotly.min.js"') == 1 and "plotly.js v" not in html
    assert "plotly.js v" in (tmp_path / "rep" / "plotly.min.js").read_text()[:2000]
    assert len(html) < 1_000_000
    assert "did not measure them" in html and "Measured vs published" in html
    assert "<td>None</td>" not in html
    tables = {p.name for p in (tmp_path / "rep" / "tables").iterdir()}
    assert {"results.csv", "results.md", "results.tex", "environments.csv"} <= tables
    assert not (tmp_path / "rep" / "figures").exists()
    res = pd.read_csv(tmp_path / "rep" / "tables" / "results.csv")
    assert len(res) == len(measured) + len(pub)


@pytest.mark.slow
def test_cli_report_with_static_images(tmp_path, measured):
    need_static()
    f = tmp_path / "m.parquet"
    R.save(measured, f)
    out = tmp_path / "rep"
    assert main(["report", str(f), "--out", str(out), "--with-published"]) == 0
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert "00_gemm_speedup.png" in figs and "published_vs_measured.pdf" in figs and "roofline.svg" in figs
    _check_png(out / "figures" / "00_gemm_speedup.png", 2200)
    _check_pdf(out / "figures" / "roofline.pdf")
    _check_svg(out / "figures" / "published_vs_measured.svg", "8x4096x4096")
    assert "figures/roofline.png" in (out / "report.html").read_text()


def test_compare_report_and_cli(tmp_path, measured):
    a = measured
    b = rows({("8x4096x4096", "aten"): 0.0185, ("8x4096x4096", "triton"): 0.019,
              ("64x4096x4096", "aten"): 0.009, ("64x4096x4096", "triton"): 0.0316,
              ("4096x4096x4096", "aten"): 0.2}, run="r2", torch="2.15.0")
    path = write_compare_report(a, b, tmp_path / "cmp", ("2.11", "2.15"), static=False)
    html = path.read_text()
    assert "Only in 2.11 (2)" in html and "Only in 2.15 (1)" in html
    assert "class='diff'" in html  # the torch version differs
    pairs = pd.read_csv(tmp_path / "cmp" / "tables" / "pairs.csv")
    r = pairs.set_index(["case", "backend"])["ratio"]
    assert r[("64x4096x4096", "aten")] == pytest.approx(2.0) and r[("8x4096x4096", "triton")] == pytest.approx(3.0)
    fa, fb = tmp_path / "a.parquet", tmp_path / "b.parquet"
    R.save(a, fa)
    R.save(b, fb)
    # one sweep, aten vs triton, as an A/B
    assert main(["compare", str(fa), str(fa), "--a-backend", "aten", "--b-backend", "triton",
                 "--out", str(tmp_path / "c2"), "--no-images"]) == 0
    p2 = pd.read_csv(tmp_path / "c2" / "tables" / "pairs.csv")
    assert p2.set_index("case").loc["8x4096x4096", "ratio"] == pytest.approx(0.0185 / 0.057)
    assert main(["compare", str(fa), str(fb), "--out", str(tmp_path / "c3"), "--names", "only-one"]) == 2
    assert main(["compare", str(fa), str(fa), "--a-backend", "flydsl", "--out", str(tmp_path / "c4")]) == 2


def test_cli_compare_vllm(tmp_path):
    a, b = tmp_path / "off", tmp_path / "on"
    a.mkdir()
    b.mkdir()
    for c in (8, 16):
        (a / f"c{c}.json").write_text(json.dumps(result(conc=c, ttft=60.0)))
        (b / f"c{c}.json").write_text(json.dumps(result(conc=c, ttft=30.0)))
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "v"), "--names", "off,on", "--no-images"]) == 0
    pairs = pd.read_csv(tmp_path / "v" / "tables" / "vllm_pairs.csv")
    assert set(pairs.loc[pairs["metric"] == "median_ttft_ms", "speedup"]) == {2.0}
    html = (tmp_path / "v" / "report.html").read_text()
    assert "Published MI355X whole-request A/B" in html
    f = tmp_path / "r.parquet"
    R.save(rows({("8x8x8", "aten"): 1.0}), f)
    assert main(["compare", str(a / "c8.json"), str(f), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.slow
def test_demo_writes_the_same_report(tmp_path, monkeypatch, measured):
    """flyexplore demo's glue: its sweeps go into report.write_report, with or without static
    images. The sweeps and the X-ray are stubbed here (each has its own tests, and
    tests/cli/test_demo.py runs the whole demo once); the X-ray's answer reaches the report."""
    import flyexplore.cli.demo_job as D

    monkeypatch.setattr(D, "run_sweep", lambda spec, **kw: measured if spec.op == "gemm" else R.empty_frame())
    monkeypatch.setattr(D, "run_xrays", lambda: "the kernel X-ray cannot run here (a stub for this test)")
    path = D.run_demo(tmp_path / "demo", progress=False, static=False)
    html = path.read_text()
    assert path == tmp_path / "demo" / "report.html" and "gemm: speedup over aten" in html
    assert "the kernel X-ray cannot run here (a stub for this test)" in html
    assert (tmp_path / "demo" / "results.parquet").exists() and not (tmp_path / "demo" / "figures").exists()


def test_report_without_a_browser_still_writes_html(tmp_path, monkeypatch, measured, capsys):
    """No Chromium: the HTML report and tables are written, the report and the CLI say why
    the static images are missing."""
    import flyexplore.views.export as X

    monkeypatch.setattr(X, "static_export_problem", lambda: "no Chromium/Chrome for kaleido (test)")
    f = tmp_path / "m.parquet"
    R.save(measured, f)
    assert main(["report", str(f), "--out", str(tmp_path / "r")]) == 0
    assert "PNG/SVG/PDF figures skipped: no Chromium" in capsys.readouterr().err
    html = (tmp_path / "r" / "report.html").read_text()
    assert "Static images not written" in html and not (tmp_path / "r" / "figures").exists()
    with pytest.raises(RuntimeError, match="static figure export unavailable"):
        X.save_figures({"x": speedup_figure(measured)}, tmp_path / "x", ["png"])


def test_export_figures_skips_static_formats_without_a_browser(tmp_path, monkeypatch, measured):
    """export_figures never fails for want of a browser: HTML is written, PNG/SVG/PDF are
    listed as skipped with the reason (the notebooks rely on it on GPU nodes)."""
    import flyexplore.views.export as X

    figs = {"a": speedup_figure(measured), "b": speedup_figure(measured, title="b")}
    monkeypatch.setattr(X, "static_export_problem", lambda: "no Chromium/Chrome for kaleido (test)")
    t = X.export_figures(figs, tmp_path / "f", ["png", "html"])
    assert list(t["status"]) == ["skipped", "written", "skipped", "written"]
    assert t.loc[t["format"] == "png", "note"].str.contains("no Chromium/Chrome for kaleido").all()
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["a.html", "b.html"]
    assert X.files_table(tmp_path / "f").to_dict("list") == {
        "path": ["a.html", "b.html"], "bytes": [(tmp_path / "f" / n).stat().st_size for n in ("a.html", "b.html")]}
    # a browser that is found but fails to render: skipped with kaleido's error, not raised
    monkeypatch.setattr(X, "static_export_problem", lambda: None)

    def broken(*a, **k):
        raise RuntimeError("static figure export failed: BrowserFailedError: boom")
    monkeypatch.setattr(X, "save_figures", broken)
    t = X.export_figures({"a": figs["a"]}, tmp_path / "g", ["svg"])
    assert list(t["status"]) == ["skipped"] and "boom" in t["note"][0]
    with pytest.raises(UsageError, match="unknown figure format 'gif'"):
        X.export_figures(figs, tmp_path, ["gif"])
    assert X.files_table(tmp_path / "missing").empty


def test_an_image_sent_before_kaleidos_page_was_ready_is_rendered_again(tmp_path, monkeypatch):
    """kaleido's page answered ``kaleido_scopes is not defined`` (its scripts not loaded yet, seen
    under load on the CI machine): the browser is restarted and that image rendered once more;
    an image that fails for another reason is not retried."""
    import flyexplore.views.export as X

    calls, restarts = [], []
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 64

    def render_into(items, temps, timeout, kaleido):
        calls.append([p.name for _, p, *_ in items])
        out = {}
        for _, p, *_ in items:
            if p.name == "a.png" and len(calls) == 1:
                out[p] = "JavascriptError: ReferenceError: kaleido_scopes is not defined"
            elif p.name == "b.png":
                out[p] = "JavascriptError: something else"
            else:
                temps[p].write_bytes(png)
                X.A.commit(temps[p], p)
        return out

    monkeypatch.setattr(X, "_render_into", render_into)
    monkeypatch.setattr(X, "kaleido_session", lambda timeout: restarts.append(timeout))
    monkeypatch.setattr(X, "close_kaleido_session", lambda: None)
    items = [(None, tmp_path / n, "png", 10, 10, 1.0) for n in ("a.png", "b.png", "c.png")]
    failed = X._render(items, 5.0)
    assert calls == [["a.png", "b.png", "c.png"], ["a.png"]] and len(restarts) == 2
    assert set(failed) == {tmp_path / "b.png"} and (tmp_path / "a.png").read_bytes() == png


def _raised(exc, cause):
    """``exc`` as raised ``from cause`` (its ``__cause__`` set as Python sets it)."""
    try:
        raise exc from cause
    except BaseException as e:   # noqa: BLE001 - returned to the caller
        return e


@pytest.mark.parametrize("cause,timed_out", [("cancelled", True), ("executor closed", False)])
def test_a_timeout_seen_as_a_closed_channel_is_a_timeout(tmp_path, monkeypatch, cause, timed_out):
    """kaleido's per-image timeout (``asyncio.wait_for``) cancels the render; when that lands while
    choreographer writes to the browser, the image's error is ``ChannelClosedError: Executor is
    closed.`` raised from the ``CancelledError`` (about a third of the images at ``timeout=0.001``
    on a loaded 2-core machine), and the export said so instead of the timeout. It is named as the
    timeout now; the same error from a browser that really closed (from choreographer's
    ``ExecutorClosedError``) is still named as itself."""
    import asyncio

    kaleido = pytest.importorskip("kaleido")
    from choreographer.channels import ChannelClosedError
    from choreographer.utils._manual_thread_pool import ExecutorClosedError

    import flyexplore.views.export as X

    why = asyncio.CancelledError() if cause == "cancelled" else ExecutorClosedError()
    closed = []

    def write(specs, cancel_on_error=False):   # what kaleido returns: the files of failed images removed
        for s in specs:
            os.unlink(s["path"])
        return tuple(_raised(ChannelClosedError("Executor is closed."), why) for _ in specs)

    monkeypatch.setattr(kaleido, "write_fig_from_object_sync", write)
    monkeypatch.setattr(X, "kaleido_session", lambda timeout: None)
    monkeypatch.setattr(X, "close_kaleido_session", lambda: closed.append(True))
    items = [(None, tmp_path / n, "png", 10, 10, 1.0) for n in ("a.png", "b.png")]
    failed = X._render(items, 0.001)
    said = "no image within 0.001 s (kaleido timeout)" if timed_out else "ChannelClosedError: Executor is closed."
    assert failed == {p: said for _, p, *_ in items}
    assert bool(closed) is timed_out     # a timed-out session is not reused
    assert list(tmp_path.iterdir()) == []
