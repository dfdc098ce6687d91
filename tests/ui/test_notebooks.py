"""Every walkthrough notebook runs top to bottom on the CPU at the test size (nbclient, a real
kernel; ``SIZE="test"``: the rows, figures and texts of ``SIZE="cpu"`` at the least work) and
shows what it promises -- one slow test per notebook runs it once and checks it -- and every
notebook cell is a call of the public face (``import flyexplore as fx``), checked statically
without running anything."""
import ast
import importlib.util
import json
import subprocess
import sys

import pytest

# nbformat is imported in the functions that read or make notebooks, not here: its import (jsonschema
# compiling its format grammars) costs every pytest worker 1.2 CPU-s at collection, the fast lane's too,
# which deselects this whole module

import flyexplore as fx
from flyexplore.ui import notebooks as N
from flyexplore.results import table as R
from flyexplore.errors import UsageError
from flyexplore.run.plan import make_plan

from conftest import ROOT

pytestmark = pytest.mark.slow  # real notebook kernels, every walkthrough run

NOTEBOOKS = N.list_notebooks()
#: The size the notebooks run at here (:data:`flyexplore.ui.notebooks.SIZES`).
TEST_SIZE = "test"


def _read(out, path):
    import nbformat
    return nbformat.read(out / path.name, as_version=4)


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _figures(nb):
    """The plotly figures a notebook displayed (JSON), in order."""
    return [o["data"]["application/vnd.plotly.v1+json"] for c in _code_cells(nb) for o in c.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]


def _titles(nb):
    return [f["layout"].get("title", {}).get("text", "") for f in _figures(nb)]


def _text(nb):
    """Every text output of a notebook (plain-text reprs and streams), joined."""
    parts = []
    for c in _code_cells(nb):
        for o in c.outputs:
            parts.append(o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _widget_states(nb):
    st = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return [m for m in st.values()]


def test_there_are_notebooks_and_each_has_a_parameters_cell():
    import nbformat
    assert {"quickstart.ipynb", "gemm_sweeps.ipynb", "mxfp_fp8.ipynb", "attention_aotriton.ipynb",
            "published_mi355x.ipynb", "export_report.ipynb"} <= {p.name for p in NOTEBOOKS}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        params = [c for c in nb.cells if N.PARAMETERS_TAG in c.metadata.get("tags", [])]
        assert len(params) == 1, path.name
        names = {t.id for n in ast.parse(params[0].source).body for t in n.targets}
        assert {"SIZE", "OUT"} <= names, path.name
        assert not any(c.get("outputs") for c in _code_cells(nb)), f"{path.name} is committed with outputs"


# Statements a walkthrough cell may hold: imports, assignments and expressions (calls).
_ALLOWED = (ast.Import, ast.ImportFrom, ast.Assign, ast.Expr)
# Nodes that would be logic of the notebook's own: control flow, definitions, and expressions
# that hide a loop or a branch.
_LOGIC = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
          ast.Try, ast.With, ast.AsyncWith, ast.Lambda, ast.ListComp, ast.DictComp, ast.SetComp,
          ast.GeneratorExp, ast.IfExp)
# The one flyexplore submodule a notebook may import from directly.
_WIDGETS = "flyexplore.ui.widgets"


def cell_problems(source: str) -> list[str]:
    """Why a notebook code cell is more than calls of the public face (empty: it is fine): a
    statement other than an import, assignment or expression; control flow, a definition,
    a lambda or comprehension anywhere; an import of flyexplore other than ``import flyexplore
    as fx`` (or from the widgets); ``fx`` rebound; an ``fx.NAME`` outside ``fx.__all__``;
    ``flyexplore.x`` reached other than through ``fx``."""
    out = []
    tree = ast.parse(source)
    for stmt in tree.body:
        if not isinstance(stmt, _ALLOWED):
            out.append(f"statement {type(stmt).__name__}: {ast.unparse(stmt)[:60]}")
    for node in ast.walk(tree):
        if isinstance(node, _LOGIC):
            out.append(f"logic ({type(node).__name__}): {ast.unparse(node)[:60]}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "flyexplore" and (a.name, a.asname) != ("flyexplore", "fx"):
                    out.append(f"import {a.name}{' as ' + a.asname if a.asname else ''}: use import flyexplore as fx")
                elif a.asname == "fx" and a.name != "flyexplore":
                    out.append(f"fx is bound to {a.name}")
        elif isinstance(node, ast.ImportFrom):
            if node.module != _WIDGETS:
                out.append(f"from {node.module} import ...: only import flyexplore as fx (or {_WIDGETS})")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "fx" and node.attr not in fx.__all__:
                out.append(f"fx.{node.attr} is not a public name (flyexplore.__all__)")
            if node.value.id == "flyexplore":
                out.append(f"flyexplore.{node.attr}: use fx.")
        elif isinstance(node, ast.Name) and node.id == "fx" and isinstance(node.ctx, ast.Store):
            out.append("fx is assigned")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_cells_only_call_the_public_face(path):
    import nbformat
    nb = nbformat.read(path, as_version=4)
    problems = [f"cell {i}: {p}" for i, c in enumerate(nb.cells) if c.cell_type == "code"
                for p in cell_problems(c.source)]
    assert problems == [], f"{path.name}: " + "; ".join(problems)
    assert any("import flyexplore as fx" in c.source for c in _code_cells(nb)), path.name


def test_the_cell_check_catches_submodules_and_logic():
    assert cell_problems('import flyexplore as fx\ndf = fx.load("r.parquet")\nfx.figure("speedup", df)') == []
    assert cell_problems("import torch\nx = torch.ones(2)") == []
    assert cell_problems("from flyexplore.ui.widgets import SwitchPanel\nSwitchPanel()") == []
    bad = {
        "from flyexplore.views import plots": "from flyexplore.views import ...",
        "import flyexplore.results.table as R": "import flyexplore.results.table as R",
        "import flyexplore": "import flyexplore: use",
        "import flyexplore as fx\nfx.plots": "fx.plots is not a public name",
        "import flyexplore as fx\nflyexplore.cli.main([])": "flyexplore.cli: use fx.",
        "if x:\n    y = 1": "statement If",
        "z = [v for v in range(3)]": "logic (ListComp)",
        "z = f(lambda: 1)": "logic (Lambda)",
        "z = 1 if a else 2": "logic (IfExp)",
        "for i in x:\n    pass": "statement For",
        "def f():\n    pass": "statement FunctionDef",
        "class C:\n    pass": "statement ClassDef",
        "try:\n    f()\nexcept Exception:\n    pass": "statement Try",
        "while x:\n    pass": "statement While",
        "import flyexplore as fx\nfx = 3": "fx is assigned",
        "import numpy as fx": "fx is bound to numpy",
    }
    for src, why in bad.items():
        got = cell_problems(src)
        assert any(why in p for p in got), (src, got)


def _check_runs_top_to_bottom(executed, path):
    nb, name = _read(executed, path), path.name
    injected = [c for c in nb.cells if N.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and f"SIZE = {TEST_SIZE!r}" in injected[0].source, name
    errors = [o for c in _code_cells(nb) for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{name}: {errors[:1]}"
    assert all(c.execution_count for c in _code_cells(nb)), name


def _check_quickstart(executed):
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
    figs = _figures(nb)
    assert len(figs) == 1
    traces = [t for t in figs[0]["data"] if t["type"] == "bar"]
    assert [t["name"].split(":")[0] for t in traces] == ["inductor"]
    assert len(traces[0]["x"]) == 3
    # one backend: its geometric mean is still shown (legend forced on, and in the subtitle)
    assert figs[0]["layout"]["showlegend"] is True and "inductor geomean" in figs[0]["layout"]["title"]["text"]


def test_parameters_are_injected_papermill_style():
    import nbformat
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
    for (name, size) in N.WALKTHROUGH_SWEEPS:
        a = N.sweep_args(size, name)
        assert a["op"] == name.split(":")[0]
        plan = make_plan(a["op"], a.get("suite"), a.get("shapes"), a.get("dtypes"), a.get("backends"))
        assert len(plan) > 0
        if size == "cpu" and name in ("gemm:m-sweep", "gemm:published", "grouped_gemm", "scaled_gemm", "attention"):
            assert len(plan) <= 30 and a.get("timer") == N.CPU_TIMER  # seconds on 2 cores
        if size == "gpu" and name != "gemm":
            # the GPU walkthroughs stay within minutes on one H200: no Triton max-autotune
            # (5-10 s per GEMM shape there) beyond the quickstart's three shapes
            assert "triton" not in plan.backends, name
            assert "flydsl" in plan.backends or a["op"] not in ("gemm", "grouped_gemm", "scaled_gemm"), name
    a = N.sweep_args("cpu", "gemm:m-sweep")
    a["timer"]["rep"] = 1000  # a copy: the table is not changed
    assert N.WALKTHROUGH_SWEEPS[("gemm:m-sweep", "cpu")]["timer"]["rep"] == N.CPU_TIMER["rep"]
    # the test size: every CPU step, its backends, at most its rows (the same rows but for SDPA's
    # two small cases and the A/B's one smaller case), the fewest timer calls, the A/B at 2 pairs
    assert {n for n, s in N.WALKTHROUGH_SWEEPS if s == "test"} == {n for n, s in N.WALKTHROUGH_SWEEPS if s == "cpu"}
    for name in {n for n, s in N.WALKTHROUGH_SWEEPS if s == "cpu"}:
        c, t = N.sweep_args("cpu", name), N.sweep_args(TEST_SIZE, name)
        pc, pt = (make_plan(a["op"], a.get("suite"), a.get("shapes"), a.get("dtypes"), a.get("backends"))
                  for a in (c, t))
        assert pt.backends == pc.backends and 0 < len(pt) <= len(pc) and t["timer"] == N.TEST_TIMER, name
        if name not in ("attention", "attention:env-ab"):
            assert [(x.label, d) for x, d in pt.pairs] == [(x.label, d) for x, d in pc.pairs], name
    assert N.sweep_args(TEST_SIZE, "attention:env-ab")["pairs"] == 2 and "pairs" not in N.sweep_args("cpu", "attention:env-ab")
    gpu = make_plan(**{k: v for k, v in N.sweep_args("gpu").items()})
    assert all(c["m"] in (16, 2048) for c, _ in gpu.pairs)
    with pytest.raises(UsageError, match=r"unknown walkthrough size 'tpu' \(valid: cpu, gpu, test\)"):
        N.sweep_args("tpu")
    with pytest.raises(UsageError, match="unknown walkthrough operator 'sdpa'"):
        N.sweep_args("cpu", "sdpa")


def test_slim_widget_state_replaces_only_large_bundles():
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "a": {"model_name": "AnyModel", "state": {"_esm": "x" * 200_000, "_widget_data": []}},
        "b": {"model_name": "AnyModel", "state": {"_esm": "export default {}"}}}}}
    N.slim_widget_state(nb)
    st = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert st["a"]["state"]["_esm"] == N.SLIM_ESM and st["a"]["state"]["_widget_data"] == []
    assert st["b"]["state"]["_esm"] == "export default {}"


def _check_run_notebooks_script(executed, name):
    env = json.loads((executed / "env.json").read_text())
    assert env["platform"] == "cpu" and env["fingerprint"]["torch"]
    runs = json.loads((executed / "run.json").read_text())
    assert [r["notebook"] for r in runs] == [f"{name}.ipynb"]
    assert all(r["status"] == "ok" and r["size"] == TEST_SIZE and r["seconds"] > 0 for r in runs)
    # the 5 MB plotly.js bundle of the FigureWidget is not stored in the copies
    assert (executed / f"{name}.ipynb").stat().st_size < 1_000_000


@pytest.mark.slow   # a subprocess
def test_run_notebooks_refuses_a_name_it_does_not_have(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tools" / "run_notebooks.py"),
                        str(tmp_path / "again"), "--only", "nope"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no notebook named 'nope'" in p.stderr


def _nb(executed, name):
    import nbformat
    return nbformat.read(executed / f"{name}.ipynb", as_version=4), executed / f"{name}-out"


def test_every_notebook_says_what_it_needs():
    import nbformat
    for path in NOTEBOOKS:
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.cell_type == "markdown", path.name
        if path.stem != "quickstart":
            assert "| you have |" in first.source and "CPU only" in first.source, path.name


def _check_gemm_sweeps(executed):
    nb, out = _nb(executed, "gemm_sweeps")
    dense, grouped = R.load(out / "dense.parquet"), R.load(out / "grouped.parquet")
    R.validate(dense)
    R.validate(grouped)
    assert set(dense.backend) == {"aten", "inductor", "flydsl"} and dense["m"].nunique() == 4
    assert (dense[dense.backend == "flydsl"].status == "unavailable").all()
    assert set(grouped.backend) == {"aten", "triton", "flydsl", "reference"}
    titles = _titles(nb)
    assert any(t.startswith("Dense GEMM on ") and "TFLOP/s across M" in t for t in titles)
    # the committed H200 rows are plotted and labelled as measured on the H200
    h200 = [t for t in titles if t.startswith("Measured on NVIDIA H200")]
    assert len(h200) == 4 and any("grouped GEMM" in t for t in h200)
    roof = [f for f in _figures(nb) if "roofline" in f["layout"]["title"]["text"]]
    assert any("989 TFLOP/s" in (t.get("name") or "") for t in roof[0]["data"])  # H200 bf16 roof
    assert "pct_peak_tflops" in _text(nb)


def _check_mxfp_fp8(executed):
    nb, out = _nb(executed, "mxfp_fp8")
    sg = R.load(out / "scaled_gemm.parquet")
    R.validate(sg)
    emu = sg[sg.backend == "emulated"]
    assert (emu.status == "ok").all() and set(emu.source) == {"emulated"}
    assert set(sg[sg.backend != "emulated"].source) == {"measured"}
    text = _text(nb)
    assert "err_rel_worst_row" in text and "E8M0 per 32 values along K" in text
    assert "refuses MXFP8" in text  # the H200's reason for no native MX
    titles = _titles(nb)
    assert sum(t.startswith("Published (AMD Instinct MI355X, not measured here)") for t in titles) == 2
    assert sum(t.startswith("Measured on NVIDIA H200") for t in titles) == 2
    errs = [f for f in _figures(nb) if "GEMM error" in f["layout"]["title"]["text"]]
    assert len(errs) == 3 and any("(emulated)" in t["name"] for t in errs[0]["data"])


def _check_attention_aotriton(executed):
    nb, out = _nb(executed, "attention_aotriton")
    att = R.load(out / "attention.parquet")
    R.validate(att)
    assert set(att.backend) == {"flash", "efficient", "cudnn", "ck", "math", "default"}
    eff = att[att.backend == "efficient"]
    assert (eff.status == "unavailable").all() and eff.message.str.contains("torch").all()
    assert (out / "compare_flash_cudnn" / "report.html").exists()
    text = _text(nb)
    assert "flash -> cudnn" in text and "aotriton" in text
    rng = [f for f in _figures(nb) if "AOTriton 0.14.2b vs 0.13b" in f["layout"]["title"]["text"]]
    (bar,) = [t for t in rng[0]["data"] if t["type"] == "bar"]
    assert bar["text"] == ["0.92x – 2.34x", "0.93x – 2.47x"]
    titles = _titles(nb)
    assert any("SDPA forward" in t for t in titles) and any("SDPA backward" in t for t in titles)
    # AOTriton: the explainer before running (this CPU machine, and a gfx950 what-if inside and
    # outside the FlyDSL head dims), then which backend ran on each side of the synthetic A/B
    assert "attention: AOTriton FlyDSL NOT ELIGIBLE" in text and "is not a ROCm build" in text
    assert "attention: AOTriton FlyDSL UNVERIFIED" in text and "FlyDSL kernels for this call: flyc_attn_fwd" in text
    assert "not eligible: head dim 80 -> rung 80: no FlyDSL forward kernel on gfx950" in text
    assert "AOTriton 0.13b has no FlyDSL backend" in text and "FlyDSL + Triton bwd_preprocess" in text
    (ab,) = [f for f in _figures(nb) if f["layout"]["title"]["text"].startswith("SYNTHETIC EXAMPLE")]
    bars = [t for t in ab["data"] if t["type"] == "bar"]
    assert {t["name"] for t in bars} >= {"AOTriton 0.14.2b ran FlyDSL", "AOTriton 0.14.2b ran Triton"}
    assert sorted((s["y0"], s["y1"]) for s in ab["layout"]["shapes"] if s["type"] == "rect") == \
        [(0.92, 2.34), (0.93, 2.47)]
    # the environment A/B: two environments (one a variable only ROCm reads) timed round by round,
    # picked and run in the sweep panel, saved, read back as one A/B file by compare and by the
    # AOTriton view
    env_ab = R.load(out / "attention_env_ab.parquet")
    R.validate(env_ab)
    assert set(env_ab["backend"]) == {"flash@base", "flash@ck"} and set(env_ab["env"]) == {"base", "ck"}
    ck = env_ab[env_ab["env"] == "ck"].iloc[0]
    pairs = N.sweep_args(TEST_SIZE, "attention:env-ab")["pairs"]   # fresh pairs of workers, one process each
    assert ck["status"] == "ok" and ck["processes"] == pairs and ck["verdict"] in ("SAME", "AMBIGUOUS")
    assert '"TORCH_ROCM_FA_PREFER_CK": "1"' in ck["env_changes"] and bool(ck["cross_env_ok"])
    assert "flyexplore compare: ck vs base, 1 pairs" in text
    states = _widget_states(nb)
    assert any(m["state"].get("value", "").startswith("base\nck:TORCH_ROCM_FA_PREFER_CK=1") for m in states
               if m["model_name"] == "TextareaModel")
    # the panel's final state reached the frontend: progress done, and its A/B figure (time base /
    # time ck per case) in the panel's A/B area
    bars = [m["state"] for m in states if m["model_name"] == "IntProgressModel"
            and m["state"].get("description") == "progress"]
    assert len(bars) == 1 and bars[0]["value"] == bars[0]["max"] == 2 and bars[0]["bar_style"] == "success"
    html = " ".join(str(m["state"].get("value", "")) for m in states if m["model_name"] == "HTMLModel")
    assert "saved 2 rows to" in html and "time base / time ck per case and backend" in html   # Save after Run
    outs = [o["data"]["application/vnd.plotly.v1+json"] for m in states if m["model_name"] == "OutputModel"
            for o in m["state"].get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert [f["layout"]["title"]["text"].split("<br>")[0] for f in outs] == \
        ["A/B: ck vs base", "AOTriton A/B: ck vs base, per case"]


def _check_published_mi355x(executed):
    nb, out = _nb(executed, "published_mi355x")
    text = _text(nb)
    assert "1.1027 (1.10x)" in text and "1.102712" in text  # printed and recomputed
    titles = _titles(nb)
    assert sum(t.startswith("Published (MI355X)") for t in titles) == 7
    assert sum(t.startswith("Different devices:") for t in titles) == 2
    synth = [f for f in _figures(nb) if f["layout"]["title"]["text"].startswith("SYNTHETIC EXAMPLE")]
    panels = [a["text"] for a in synth[0]["layout"]["annotations"]]
    assert panels and all(p.endswith("[synthetic example]") for p in panels)
    assert "synthetic example" in text
    live = R.load(out / "dense_published_shapes.parquet")
    assert set(live.case) == {"8x4096x4096", "16x4096x4096"}


def _check_export_report(executed):
    from flyexplore.views.export import static_export_problem

    nb, out = _nb(executed, "export_report")
    for f in ("report/report.html", "compare/report.html", "single/gemm_roofline.html",
              "tables/geomean_speedup.md", "tables/geomean_speedup.tex", "tables/results.csv",
              "figures/gemm_speedup.html"):
        assert (out / f).stat().st_size > 0, f
    static = static_export_problem() is None
    for f in ("figures/gemm_speedup.png", "figures/gemm_roofline.svg", "figures/rmsnorm_gbps.pdf",
              "report/figures"):
        assert (out / f).exists() == static, f
    text = _text(nb)
    assert ("skipped" in text) != static
    assert "| op " in text and "\\begin{tabular}" in text  # the Markdown and LaTeX tables printed
    assert "report/report.html" in text  # the list of files written
    # the history of the 30 committed H100 runs: no step, the allowance learned from them,
    # its figures, report and Bencher export
    assert "history " in text and "30 runs, 1 device model" in text and "no step in any case" in text
    assert "pairs of one-process rows of identical runs" in text and "source='learned'" in text
    assert (out / "history_report" / "report.html").stat().st_size > 0
    assert (out / "history_report" / "figures").exists() == static
    bmf = json.loads((out / "bmf.json").read_text())
    assert len(bmf) == 6 and all(set(m) == {"latency"} for m in bmf.values())
    hist = [t for t in _titles(nb) if t.startswith("History of ")]
    assert len(hist) == 2 and "geometric mean" in hist[0] and "the cases named" in hist[1]


def _title(fig) -> str:
    t = fig["layout"].get("title", {})
    return t.get("text", "") if isinstance(t, dict) else str(t)


def _check_dispatch_switches(executed):
    nb = _read(executed, ROOT / "notebooks" / "dispatch_switches.ipynb")
    text = _text(nb)
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


def _check_rmsnorm_topk(executed):
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
    from flyexplore.insight import explain
    from flyexplore.ui import notebooks
    grid = explain.eligibility_grid("rmsnorm", dtype="bf16", **notebooks.ELIGIBILITY_GRIDS["rmsnorm"])
    assert taken == int(grid["value"].sum()) > 0
    topk = figs["TopK fp32, M=2048, on gfx950: FlyDSL taken over N and K"]["data"][0]
    assert any("register" in str(v) for row in topk["customdata"] for v in row)  # kernel family on hover
    xr = figs["FlyDSL kernel resources for gfx950 (rmsnorm; compiled, not run)"]
    assert "not eligible / no kernel: 1024x4096 bf16" in _title(xr)
    import pandas as pd
    x = pd.read_csv(out / "xray" / "xray.csv")
    assert x["kernel"].dropna().str.startswith("rmsnorm_kernel").all() and x["eligible"].sum() == 6
    assert "radix K 832-1024, N 32768-262144" in _text(nb)  # the family per (N, K) table


def _check_model_coverage(executed):
    import pandas as pd

    nb, out = _nb(executed, "model_coverage")
    text = _text(nb)
    # every call judged per view, FLOPs captured and time modelled, said as such
    assert "== llama-3.1-8b prefill" in text and "(eager view)" in text and "(compiled view)" in text
    assert "of FLOPs (captured)" in text and "of modelled time" in text
    # the Qwen3 MoE finding: the experts' B is NT, the template needs [G, K, N]; the what-if re-judges it
    assert "== qwen3-30b-a3b prefill" in text and "row-major [G, K, N]" in text
    assert "what-if (re-judged): store the expert weights as [G, K, N]" in text
    assert "65 of 65 RMSNorm calls eligible" in text  # prefill at M = 8192 reaches the tuned region
    assert "projection: a projection, not a measurement" in text
    (fig,) = _figures(nb)  # the panel's figure is in its Output widget, not a cell output
    assert "modelled, not measured" in _title(fig)
    assert {"eligible", "grouped_gemm: B contiguous"} <= {t["name"] for t in fig["data"]}
    shapes = pd.read_csv(out / "qwen3_shapes.csv")
    grouped = shapes[(shapes.op == "grouped_gemm") & shapes["variant"].isna()]
    assert len(grouped) == 2 and grouped["shape"].str.contains("layout=NT").all() and (grouped["count"] == 48).all()
    what_if = shapes[shapes["variant"] == "expert_weights_gkn"]   # the [G, K, N] shapes, to measure the advice
    assert set(what_if["replaces"]) == set(grouped["shape"]) and not what_if["shape"].str.contains("NT").any()
    # the panel: a bad sequence was one line of error text, then gpt-oss-20b ran and filled it
    assert "seq must be a positive integer, got 0" in text
    states = _widget_states(nb)
    html = " ".join(str(m["state"].get("value", "")) for m in states if m["model_name"] == "HTMLModel")
    assert "gpt-oss-20b prefill, batch 1, seq 256, compiled view: captured and judged" in html
    assert "judged for gfx950" in html and "grouped_gemm_flydsl" in html and "eligible time (modelled)" in html
    outs = [o for m in states if m["model_name"] == "OutputModel" for o in m["state"].get("outputs", [])]
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outs)
    # section 8: the step measured for real on this machine, each variant a row, beside the model
    assert "Measured step (measured on " in text and "first 2 layers only (--layers)" in text
    assert "none: eager launches each kernel" in text and "modelled %" in text
    assert "not a measurement) beside measured" in text


#: What each notebook must show once it ran (the checks above), by notebook name.
CHECKS = {"quickstart": _check_quickstart, "gemm_sweeps": _check_gemm_sweeps, "mxfp_fp8": _check_mxfp_fp8,
          "attention_aotriton": _check_attention_aotriton, "published_mi355x": _check_published_mi355x,
          "export_report": _check_export_report, "dispatch_switches": _check_dispatch_switches,
          "rmsnorm_topk": _check_rmsnorm_topk, "model_coverage": _check_model_coverage}


def test_every_notebook_has_its_check():
    assert set(CHECKS) == {path.stem for path in NOTEBOOKS}  # a new notebook gets its check


def _run_notebooks_script():
    """``benchmarks/tools/run_notebooks.py`` loaded as a module: its ``main(argv)`` is the command."""
    spec = importlib.util.spec_from_file_location("run_notebooks_script",
                                                  ROOT / "benchmarks" / "tools" / "run_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_notebook_runs_on_the_cpu_and_shows_what_it_promises(tmp_path, name, capsys):
    """Each notebook executed with SIZE="test" by ``benchmarks/tools/run_notebooks.py --only NAME``
    (the script used for the GPU copies; :func:`flyexplore.ui.notebooks.execute`, nbclient and a
    fresh kernel), then its checks: it ran top to bottom, the script wrote its logs, and it shows
    what it promises. The script's ``main`` runs in this process (its command line, a process of
    its own: :func:`test_run_notebooks_refuses_a_name_it_does_not_have`), so that a notebook costs
    one interpreter start, its kernel's. One test per notebook, so that the suite's workers share
    them."""
    executed = tmp_path / "executed"
    rc = _run_notebooks_script().main([str(executed), "--size", TEST_SIZE, "--timeout", "300", "--only", name])
    said = capsys.readouterr()
    assert rc == 0, said.out + said.err
    path = ROOT / "notebooks" / f"{name}.ipynb"
    _check_runs_top_to_bottom(executed, path)
    CHECKS[name](executed)
    _check_run_notebooks_script(executed, name)
