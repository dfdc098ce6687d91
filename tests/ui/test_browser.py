"""A real browser: JupyterLab (token-less, 127.0.0.1, a free port, a temporary folder with a
copy of the quickstart and the dispatch walkthrough, each with ``SIZE="test"`` injected below its
parameters cell as the headless runner does; the dispatch walkthrough without the sections that
render nothing new here, :data:`LEFT_OUT`) driven by headless Chromium through Playwright. Runs
all cells from the Run menu and checks that the sweep panel renders, fills in from its worker
thread, and that plotly figures appear; and that the switch panel and the dispatch inspector
render and answer a click. One JupyterLab server and one Chromium serve the module's tests (each
test opens its own page and notebook, so its own kernel; the kernels a test started are shut
down after it). Keeps screenshots under ``$FLYEXPLORE_ARTIFACTS`` (else pytest's tmp) and copies
them to ``test-artifacts/`` (ignored by git).

Needs Debian's ``/usr/bin/chromium`` (installed by ``.ci/run``) and the ``playwright`` Python
package (the ``test`` extra; its own browser download is not used). Outside CI a missing
Chromium skips; in CI (``CI`` set) it fails.
"""
import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flyexplore.ui.notebooks import inject_parameters, kernel_env

from conftest import ROOT

pytestmark = pytest.mark.slow  # JupyterLab and a headless Chromium

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SERVER_START_S = 90
#: The walkthrough size of the notebook copies (:data:`flyexplore.ui.notebooks.SIZES`).
TEST_SIZE = "test"
PAGE_LOAD_S = 90
RUN_ALL_S = 240

# JupyterLab user settings: start the notebook's kernel without asking, render every cell (no
# virtualized notebook, so all outputs are in the page), no news requests or toasts.
LAB_SETTINGS = {
    "notebook-extension/tracker": {"windowingMode": "none", "autoStartDefaultKernel": True},
    "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False,
                                        "doNotDisturbMode": True},
}


def _need(ok: bool, why: str):
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {why}")
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server we started (its own process group: the server and its kernels)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass


def _kernels(url) -> list[str]:
    """The ids of the server's running kernels."""
    with urllib.request.urlopen(f"{url}/api/kernels", timeout=10) as r:
        return [k["id"] for k in json.loads(r.read())]


def _shut_down_kernels(url, keep=()) -> None:
    """Shut down the server's kernels but ``keep`` (ids), as the Kernel menu would: a DELETE with
    the ``_xsrf`` cookie the server sets and its value in ``X-XSRFToken``, as the page sends it."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{url}/lab", timeout=30).close()
    xsrf = {c.name: c.value for c in jar}.get("_xsrf", "")
    for kid in _kernels(url):
        if kid not in keep:
            req = urllib.request.Request(f"{url}/api/kernels/{kid}", method="DELETE",
                                         headers={"X-XSRFToken": xsrf})
            opener.open(req, timeout=30).close()


#: Sections of a walkthrough the browser copy leaves out, as (first heading, heading that ends them):
#: the dispatch walkthrough's sweep under the switches and its autotune decisions (sections 7 and 8)
#: render nothing the other pages here do not, and cost its kernel about 20 CPU-s; the whole
#: notebook runs, and is checked, in tests/ui/test_notebooks.py.
LEFT_OUT = {"dispatch_switches.ipynb": [("## 7.", "## Before you go")]}


def _without_sections(cells, first: str, until: str) -> list:
    """``cells`` without the Markdown cell that starts with ``first`` and every cell after it up to
    the Markdown cell that starts with ``until`` (kept). Fails the test if either is missing (the
    walkthrough changed)."""
    heads = [i for i, c in enumerate(cells) if c.cell_type == "markdown"]
    start = next((i for i in heads if cells[i].source.startswith(first)), None)
    end = next((i for i in heads if start is not None and i > start and cells[i].source.startswith(until)), None)
    assert start is not None and end is not None, f"no section {first!r} .. {until!r} in the walkthrough"
    return cells[:start] + cells[end:]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 for the module's tests; yields (base URL, working folder,
    log path)."""
    _need(Path(CHROMIUM).exists(), f"{CHROMIUM} not installed (apt-get install chromium)")
    tmp_path = tmp_path_factory.mktemp("jupyterlab")
    work = tmp_path / "work"
    work.mkdir()
    import nbformat

    for name in ("quickstart.ipynb", "dispatch_switches.ipynb"):
        nb = inject_parameters(nbformat.read(ROOT / "notebooks" / name, as_version=4), {"SIZE": TEST_SIZE})
        for first, until in LEFT_OUT.get(name, ()):
            nb.cells = _without_sections(nb.cells, first, until)
        nbformat.write(nb, work / name)
    for name, values in LAB_SETTINGS.items():
        f = tmp_path / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    port = _free_port()
    log = tmp_path / "jupyterlab.log"
    env = kernel_env({"JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
                      "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
                      "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")})
    cmd = [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           "--IdentityProvider.token=", "--ServerApp.password=",
           "--ServerApp.open_browser=False", "--allow-root", "--ServerApp.terminals_enabled=False",
           f"--ServerApp.root_dir={work}",
           "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"]
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in {SERVER_START_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, work, log
    finally:
        _stop(proc)


@pytest.fixture
def lab(server):
    """The module's JupyterLab server (URL, working folder, log path); the kernels this test
    started are shut down after it, so that none runs on beside the next test."""
    before = set(_kernels(server[0]))
    yield server
    _shut_down_kernels(server[0], keep=before)


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium (Debian's, through Playwright) for the module's tests; each test
    opens its own page. WebGL without a GPU: Chromium's software rasterizer (SwiftShader), asked
    for explicitly (the 2,000-row panel draws its markers with WebGL)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "playwright is not installed (pip install playwright; no 'playwright install')")
    _need(Path(CHROMIUM).exists(), f"{CHROMIUM} not installed (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + ["--enable-unsafe-swiftshader"],
                                     headless=True, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


def _artifacts(tmp_path) -> list[Path]:
    dirs = [Path(os.environ.get("FLYEXPLORE_ARTIFACTS") or tmp_path / "artifacts"),
            ROOT / "test-artifacts"]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def _lab_url(url, name) -> str:
    """The page that opens notebook ``name`` in a JupyterLab workspace of its own: the server is
    shared by the module's tests, and the default workspace would reopen the notebooks of the
    tests before (their cells, not run in this page, in the page that ``ALL_RUN`` reads)."""
    return f"{url}/lab/workspaces/{Path(name).stem}/tree/{name}"


ALL_RUN = """() => {
  const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent);
  return p.length > 0 && p.every(t => /\\[\\d+\\]/.test(t));
}"""


def test_quickstart_runs_in_jupyterlab_with_panel_and_figures(lab, chromium, tmp_path):
    from playwright.sync_api import expect  # the chromium fixture skips without playwright
    url, work, log = lab
    t0 = time.monotonic()
    shots = []
    page = chromium.new_page(viewport={"width": 1400, "height": 1100})
    try:
        page.set_default_timeout(PAGE_LOAD_S * 1000)
        page.goto(_lab_url(url, "quickstart.ipynb"), wait_until="domcontentloaded")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", state="attached")
        # the kernel is up before Run All (queued cells would wait anyway; this bounds it)
        page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"Python 3 .*\| Idle")).wait_for()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        try:
            page.wait_for_function(ALL_RUN, timeout=RUN_ALL_S * 1000, polling=500)
        finally:
            # a screenshot even when the wait fails, to see where it stopped
            panel = page.locator(".widget-vbox", has=page.locator(".widget-button", has_text="Run")).first
            if panel.count():
                panel.scroll_into_view_if_needed()
            for d in _artifacts(tmp_path):
                page.screenshot(path=str(d / "quickstart-lab.png"))
            shots.append("quickstart-lab.png")

        text = page.locator(".jp-Notebook").inner_text()
        assert "Traceback" not in text, text[text.index("Traceback"):][:2000]
        # environment view
        assert "FlyDSL eager overrides" in text and "FlyDSL compile templates" in text
        # the sweep panel rendered and finished from its worker thread
        panel = page.locator(".widget-vbox", has=page.locator(".widget-button", has_text="Run")).first
        panel.wait_for(state="visible")
        page.locator(".widget-html", has_text="done: 12 rows").first.wait_for(timeout=30_000)
        assert panel.locator(".widget-dropdown select").first.input_value() == "gemm"
        assert panel.locator("table.dataTable tbody tr").count() == 12  # the itables grid
        # the panel's FigureWidget drew the inductor points; the static figure is there too
        fw = panel.locator(".js-plotly-plot").first
        fw.wait_for(state="visible", timeout=30_000)
        assert fw.locator(".scatterlayer .trace").count() == 1
        assert fw.locator(".scatterlayer .trace .point").count() == 3
        assert "inductor: geomean" in fw.locator(".legend").text_content()
        assert page.locator(".js-plotly-plot").count() == 2
        static = page.locator(".jp-CodeCell").last.locator(".js-plotly-plot")
        assert static.locator(".barlayer .trace .point").count() == 3
        for d in _artifacts(tmp_path):
            panel.screenshot(path=str(d / "quickstart-panel.png"))
            static.screenshot(path=str(d / "quickstart-figure.png"))
        shots += ["quickstart-panel.png", "quickstart-figure.png"]
        # the user's path: type a shape, click Run in the page; the kernel is idle while
        # the worker thread's updates arrive
        panel.locator("textarea").fill("64x64x64")
        expect(panel.locator(".widget-dropdown select").nth(1)).to_have_value(
            "(custom shapes)", timeout=30_000)  # the kernel saw the edit and answered
        panel.locator(".widget-button", has_text="Run").click()
        page.locator(".widget-html", has_text="done: 4 rows").first.wait_for(timeout=90_000)
        expect(panel.locator("table.dataTable tbody tr")).to_have_count(4, timeout=30_000)
        assert fw.locator(".scatterlayer .trace .point").count() == 1
    finally:
        page.close()
    for d in _artifacts(tmp_path):
        for s in shots:
            assert (d / s).stat().st_size > 10_000, s
    # the notebook wrote the sweep from code into its OUT folder, in the lab's working folder
    assert (work / "quickstart-out" / "gemm.parquet").exists()
    assert time.monotonic() - t0 < RUN_ALL_S + 2 * PAGE_LOAD_S


def _ran(page, url, name) -> str:
    """Open notebook ``name`` in ``page``, run all its cells, and give the notebook's text (no
    traceback in it)."""
    page.set_default_timeout(PAGE_LOAD_S * 1000)
    _run_all(page, url, name)
    text = page.locator(".jp-Notebook").inner_text()
    assert "Traceback" not in text, text[text.index("Traceback"):][:2000]
    return text


def _run_all(page, url, name):
    page.goto(_lab_url(url, name), wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", state="attached")
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"Python 3 .*\| Idle")).wait_for()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(ALL_RUN, timeout=RUN_ALL_S * 1000, polling=500)


def test_switch_panel_and_inspector_render_and_answer_clicks(lab, chromium, tmp_path):
    """dispatch_switches.ipynb in JupyterLab: the switch panel's state table follows a click on a
    checkbox (the kernel changed torch's python_native filter), the inspector shows its verdict
    and the gfx950 X-ray of the RMSNorm kernel."""
    from playwright.sync_api import expect  # the chromium fixture skips without playwright
    url, work, log = lab
    page = chromium.new_page(viewport={"width": 1400, "height": 1100})
    try:
        _ran(page, url, "dispatch_switches.ipynb")
        switches = page.locator(".widget-vbox", has=page.locator(".widget-html", has_text="FlyDSL per operator")).first
        switches.scroll_into_view_if_needed()
        box = switches.get_by_role("checkbox", name="topk", exact=True)
        expect(box).to_be_checked()  # restored at the end of the notebook
        assert "topk enabled" in switches.inner_text()
        box.click()
        expect(switches.locator(".widget-html", has_text="FlyDSL off for topk")).to_be_visible(timeout=30_000)
        expect(switches.locator("table.flyexplore-table", has_text="topk disabled")).to_have_count(1)
        inspector = page.locator(".widget-vbox", has=page.locator(".widget-html", has_text="Kernel X-ray for gfx950")).first
        inspector.scroll_into_view_if_needed()
        assert "rmsnorm_kernel_0" in inspector.inner_text() and "waves_per_simd" in inspector.inner_text()
        for d in _artifacts(tmp_path):
            switches.screenshot(path=str(d / "dispatch-switches.png"))
            inspector.screenshot(path=str(d / "dispatch-inspector.png"))
    finally:
        page.close()
    for d in _artifacts(tmp_path):
        for s in ("dispatch-switches.png", "dispatch-inspector.png"):
            assert (d / s).stat().st_size > 10_000, s


PANEL_2000 = [
    """import importlib.util, threading, time
spec = importlib.util.spec_from_file_location("panel_rows", {bench!r})
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
from flyexplore.ui.panel import SweepPanel
panel = SweepPanel("gemm", backends="aten,triton,flydsl")
panel""",
    """rows = bench.synthetic_rows(2000)  # SYNTHETIC rows, fed as a sweep's thread feeds them
panel.open_feed(len(rows))
def sweep():
    for r in rows:
        panel.add_row(r)
        time.sleep(0.001)
t = threading.Thread(target=sweep, name="flyexplore-sweep")
t.start(); t.join()
panel.close_feed()
print("fed", len(rows), "rows")""",
]


def test_sweep_panel_with_2000_rows_shows_figure_and_grid(lab, chromium, tmp_path):
    """The sweep panel fed 2,000 synthetic rows from a thread (benchmarks/evidence/panel_rows.py) in
    JupyterLab: the WebGL figure with its geometric means and the itables grid of 2,000 rows render;
    the screenshot is kept as panel-2000-rows.png."""
    import nbformat
    from playwright.sync_api import expect  # the chromium fixture skips without playwright
    url, work, log = lab
    nb = nbformat.v4.new_notebook()
    bench = str(ROOT / "benchmarks" / "evidence" / "panel_rows.py")
    nb.cells = [nbformat.v4.new_code_cell(c.format(bench=bench) if "{bench" in c else c) for c in PANEL_2000]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / "panel2000.ipynb")
    page = chromium.new_page(viewport={"width": 1400, "height": 1400})
    try:
        text = _ran(page, url, "panel2000.ipynb")
        assert "fed 2000 rows" in text
        panel = page.locator(".widget-vbox", has=page.locator(".widget-button", has_text="Run")).first
        panel.scroll_into_view_if_needed()
        fw = panel.locator(".js-plotly-plot").first
        fw.wait_for(state="visible", timeout=60_000)
        legend = fw.locator(".legend")
        expect(legend).to_contain_text("triton: geomean", timeout=60_000)
        assert "flydsl: geomean" in legend.text_content() and "FASTER" in legend.text_content()
        assert fw.locator(".gl-container canvas").count() >= 1  # WebGL markers
        assert "WebGL is not supported" not in fw.inner_text()
        expect(panel.locator(".dt-info")).to_contain_text("2,000", timeout=60_000)
        assert panel.locator("table.dataTable tbody tr").count() == 15  # one page of the grid
        # the long unavailable reason once, with its count, not in every row
        assert re.search(r"\[1\] \(\d+ rows\) torch 2\.15\.0\+cu132 is a CUDA build", panel.inner_text())
        page.wait_for_timeout(1500)  # the WebGL canvas paints after the DOM
        for d in _artifacts(tmp_path):
            panel.screenshot(path=str(d / "panel-2000-rows.png"))
    finally:
        page.close()
    for d in _artifacts(tmp_path):
        assert (d / "panel-2000-rows.png").stat().st_size > 30_000
