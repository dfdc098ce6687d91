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
