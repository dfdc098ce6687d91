"""Every walkthrough notebook runs top to bottom on the CPU at small sizes (nbclient, a real
kernel), and the quickstart shows what it promises."""
import ast
import json
import subprocess
import sys

import nbformat
import pytest

from flyexplore import notebooks as N
from flyexplore import results as R
from flyexplore.errors import UsageError
from flyexplore.sweep import make_plan

from conftest import ROOT

NOTEBOOKS = N.list_notebooks()


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """All notebooks executed once, with SIZE="cpu", by ``benchmarks/run_notebooks.py`` (the
    script used for the GPU copies): returns its output folder."""
    out = tmp_path_factory.mktemp("executed")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_notebooks.py"), str(out),
                        "--size", "cpu", "--timeout", "300"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


def _read(out, path):
    return nbformat.read(out / path.name, as_version=4)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _widget_states(nb):
    st = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return [m for m in st.values()]


def test_there_are_notebooks_and_each_has_a_parameters_cell():
    assert "quickstart.ipynb" in [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        params = [c for c in nb.cells if N.PARAMETERS_TAG in c.metadata.get("tags", [])]
        assert len(params) == 1, path.name
        names = {t.id for n in ast.parse(params[0].source).body for t in n.targets}
        assert {"SIZE", "OUT"} <= names, path.name
        assert not any(c.get("outputs") for c in _code_cells(nb)), f"{path.name} is committed with outputs"


# Statements a walkthrough cell may hold: imports, assignments and expressions (calls).
_ALLOWED = (ast.Import, ast.ImportFrom, ast.Assign, ast.Expr)
# Expressions that would be logic of the notebook's own.
_FORBIDDEN = (ast.Lambda, ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.IfExp)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_cells_only_call_the_library(path):
    nb = nbformat.read(path, as_version=4)
    for cell in _code_cells(nb):
        tree = ast.parse(cell.source)
        for stmt in tree.body:
            assert isinstance(stmt, _ALLOWED), f"{path.name}: {ast.dump(stmt)[:80]}"
        for node in ast.walk(tree):
            assert not isinstance(node, _FORBIDDEN), f"{path.name}: logic in a cell: {cell.source[:80]}"
            if isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] == "flyexplore", node.module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom_on_cpu(path, executed):
    nb = _read(executed, path)
    injected = [c for c in nb.cells if N.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "SIZE = 'cpu'" in injected[0].source
    errors = [o for c in _code_cells(nb) for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert all(c.execution_count for c in _code_cells(nb))


def test_quickstart_shows_environment_panel_rows_and_figure(executed):
    nb = _read(executed, ROOT / "notebooks" / "quickstart.ipynb")
    out = executed / "quickstart-out"
    states = _widget_states(nb)
    html = " ".join(str(m["state"].get("value", "")) for m in states if m["model_name"] == "HTMLModel")
    assert "FlyDSL eager overrides" in html and "FlyDSL compile templates" in html
    # The panel's progress bar was updated from the sweep's worker thread: its final state
    # reached the kernel's frontend (nbclient records comm messages like a browser does).
    bars = [m["state"] for m in states if m["model_name"] == "IntProgressModel"
            and m["state"].get("description") == "progress"]
    assert len(bars) == 1 and bars[0]["value"] == bars[0]["max"] == 12
    assert bars[0]["bar_style"] == "success" and "done: 12 rows" in html
    assert "Triton GEMM templates need a CUDA or ROCm GPU" in html  # the results table
    # the sweep from code wrote its file; the figure is a plotly figure with the inductor bars
    df = R.load(out / "gemm.parquet")
    R.validate(df)
    assert len(df) == 12 and set(df.backend) == {"aten", "triton", "inductor", "flydsl"}
    figs = [o["data"]["application/vnd.plotly.v1+json"] for c in _code_cells(nb) for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figs) == 1
    traces = [t for t in figs[0]["data"] if t["type"] == "bar"]
    assert [t["name"].split(":")[0] for t in traces] == ["inductor"]
    assert len(traces[0]["x"]) == 3


def test_parameters_are_injected_papermill_style():
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    n = len(nb.cells)
    N.inject_parameters(nb, {"SIZE": "gpu", "OUT": "/tmp/x"})
    N.inject_parameters(nb, {"SIZE": "gpu"})  # replaces the earlier injected cell
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    i = tags.index([N.PARAMETERS_TAG])
    assert tags[i + 1] == [N.INJECTED_TAG] and len(nb.cells) == n + 1
    assert nb.cells[i + 1].source.endswith("SIZE = 'gpu'\n")
    with pytest.raises(UsageError, match="not a Python identifier"):
        N.inject_parameters(nb, {"1x": 1})
    bare = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    with pytest.raises(UsageError, match="no cell tagged 'parameters'"):
        N.inject_parameters(bare, {"SIZE": "cpu"})


def test_walkthrough_sizes_resolve_to_valid_plans():
    for (op, size) in N.WALKTHROUGH_SWEEPS:
        a = N.sweep_args(size, op)
        plan = make_plan(a["op"], a.get("suite"), a.get("shapes"), a.get("dtypes"))
        assert len(plan) > 0
    gpu = make_plan(**{k: v for k, v in N.sweep_args("gpu").items()})
    assert all(c["m"] in (16, 2048) for c, _ in gpu.pairs)
    with pytest.raises(UsageError, match=r"unknown walkthrough size 'tpu' \(valid: cpu, gpu\)"):
        N.sweep_args("tpu")
    with pytest.raises(UsageError, match="unknown walkthrough operator 'sdpa'"):
        N.sweep_args("cpu", "sdpa")


def test_slim_widget_state_replaces_only_large_bundles():
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "a": {"model_name": "AnyModel", "state": {"_esm": "x" * 200_000, "_widget_data": []}},
        "b": {"model_name": "AnyModel", "state": {"_esm": "export default {}"}}}}}
    N.slim_widget_state(nb)
    st = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert st["a"]["state"]["_esm"] == N.SLIM_ESM and st["a"]["state"]["_widget_data"] == []
    assert st["b"]["state"]["_esm"] == "export default {}"


def test_run_notebooks_script_writes_env_and_run_log(executed):
    env = json.loads((executed / "env.json").read_text())
    assert env["platform"] == "cpu" and env["fingerprint"]["torch"]
    runs = json.loads((executed / "run.json").read_text())
    assert [r["notebook"] for r in runs] == [p.name for p in NOTEBOOKS]
    assert all(r["status"] == "ok" and r["size"] == "cpu" and r["seconds"] > 0 for r in runs)
    # the 5 MB plotly.js bundle of the FigureWidget is not stored in the copies
    assert (executed / "quickstart.ipynb").stat().st_size < 1_000_000
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_notebooks.py"),
                        str(executed / "again"), "--only", "nope"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no notebook named 'nope'" in p.stderr


def _texts(nb) -> str:
    """Every stream and text/plain output of a notebook, joined."""
    out = []
    for c in _code_cells(nb):
        for o in c.outputs:
            if o.output_type == "stream":
                out.append(o.text)
            elif "text/plain" in o.get("data", {}):
                out.append(o["data"]["text/plain"])
    return "\n".join(out)


def _figures(nb) -> list[dict]:
    return [o["data"]["application/vnd.plotly.v1+json"] for c in _code_cells(nb) for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]


def _title(fig) -> str:
    t = fig["layout"].get("title", {})
    return t.get("text", "") if isinstance(t, dict) else str(t)


def test_dispatch_switches_shows_switches_verdicts_traces_and_autotune(executed):
    nb = _read(executed, ROOT / "notebooks" / "dispatch_switches.ipynb")
    text = _texts(nb)
    # the explainer: one eligible call in full, then a reason per ineligible call
    assert "rmsnorm: FlyDSL YES -- eager override of aten::_fused_rms_norm" in text
    for reason in ("needs M >= 8192: M=2048", "fewer rows than CUs", "the FlyDSL TopK kernels take fp32 only",
                   "A storage offset 3 x 2 B is not 16-byte aligned", "device arch gfx942",
                   "is not a ROCm build: FlyDSL overrides never register"):
        assert reason in text, reason
    # what ran: CPU operators said as such; a backend that cannot run says why
    assert "rmsnorm 2048x4096 bf16 backend aten on cpu: ok" in text and "aten::rms_norm" in text
    assert "backend flydsl on cpu: unavailable" in text and "CUDA build, not ROCm" in text
    assert "autotune bmm: 2 candidates, winner" in text
    # the switch table before, after TopK off / GEMM on, after Restore; switches restored at the end
    tables = [o["data"]["text/html"] for c in _code_cells(nb) for o in c.outputs
              if "text/html" in o.get("data", {}) and "mechanism" in o["data"]["text/html"]]
    assert len(tables) == 3
    counts = [(t.count("<td>on</td>"), t.count("<td>off</td>")) for t in tables]
    assert counts == [(2, 3), (4, 1), (2, 3)]  # rmsnorm, topk on / TopK off, the 3 GEMMs on / restored
    assert tables[2] == tables[0]
    assert "gemm          FlyDSL OFF" in text and "topk          FlyDSL ON" in text  # restored at the end
    # the widgets' final state reached the frontend: inspector trace and X-ray, the sweep panel
    html = " ".join(str(m["state"].get("value", "")) for m in _widget_states(nb) if m["model_name"] == "HTMLModel")
    assert "aten::rms_norm" in html and "no device kernels" in html  # the inspector's trace
    assert "<b>rmsnorm 8192x4096 bf16</b>, backend <b>aten</b> on cpu" in html
    assert "<b>rmsnorm 8192x4096 bf16</b> for gfx950" in html  # the X-ray view (lld-22 is here)
    assert "rmsnorm_kernel_0" in html and "waves_per_simd" in html
    assert "saved 6 rows" in html and "FlyDSL GEMM takes fp16/bf16" in html  # row 1 went to the inspector
    df = R.load(executed / "dispatch_switches-out" / "gemm.parquet")
    assert len(df) == 6 and set(df.backend) == {"aten", "inductor"} and (df.status == "ok").all()


def test_rmsnorm_topk_shows_sweeps_published_eligibility_and_xray(executed):
    nb = _read(executed, ROOT / "notebooks" / "rmsnorm_topk.ipynb")
    out = executed / "rmsnorm_topk-out"
    for op in ("rmsnorm", "topk"):
        df = R.load(out / f"{op}.parquet")
        R.validate(df)
        assert set(df.op) == {op} and len(df) == 9
        assert set(df[df.backend == "flydsl"].status) == {"unavailable"}  # a row with the reason, not a swap
    figs = {_title(f).split("<br>")[0]: f for f in _figures(nb)}
    assert "RMSNorm on MI355X, FlyDSL over ATen (published)" in figs
    assert "TopK on MI355X, FlyDSL over ATen (published)" in figs
    rms = figs["RMSNorm bf16 on gfx950: FlyDSL taken over M and N"]["data"][0]
    taken = sum(v == 1 for row in rms["z"] for v in row)
    from flyexplore import explain, notebooks
    grid = explain.eligibility_grid("rmsnorm", dtype="bf16", **notebooks.ELIGIBILITY_GRIDS["rmsnorm"])
    assert taken == int(grid["value"].sum()) > 0
    topk = figs["TopK fp32, M=2048, on gfx950: FlyDSL taken over N and K"]["data"][0]
    assert any("register" in str(v) for row in topk["customdata"] for v in row)  # kernel family on hover
    xr = figs["FlyDSL kernel resources for gfx950 (rmsnorm; compiled, not run)"]
    assert "not eligible / no kernel: 1024x4096 bf16" in _title(xr)
    import pandas as pd
    x = pd.read_csv(out / "xray" / "xray.csv")
    assert x["kernel"].dropna().str.startswith("rmsnorm_kernel").all() and x["eligible"].sum() == 6
    assert "radix K 832-1024, N 32768-262144" in _texts(nb)  # the family per (N, K) table
