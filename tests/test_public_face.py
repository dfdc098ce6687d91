"""The public face (issue 20, "one way in"): ``import flyexplore as fx`` and every name of
``fx.__all__`` doing real work on the CPU -- sweeps, result files, A/B pairs, the published
figures, figures, export, reports, the explainer, traces, the notebooks' walkthrough steps --
with one-line ``UsageError``s for bad values."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pandas as pd
import pytest

import flyexplore as fx
from flyexplore.errors import UsageError
from flyexplore.ui import notebooks as N

from conftest import ROOT

H200 = fx.data_dir() / "h200"
DEMO = H200 / "demo" / "results.parquet"
CATALOGUE = H200 / "catalogue"
VLLM = fx.data_dir() / "examples" / "vllm"
AOT = fx.data_dir() / "examples" / "aotriton"


@pytest.fixture(scope="module")
def demo():
    return fx.load(DEMO)


@pytest.mark.slow
def test_every_public_name_resolves_lazily_and_has_a_docstring():
    code = ("import sys, flyexplore as fx\n"
            "assert not [m for m in ('torch', 'pandas', 'plotly', 'ipywidgets') if m in sys.modules]\n"
            "from flyexplore.ui import inspector as I, panel as P, widgets as W\n"
            "assert fx.SweepPanel is P.SweepPanel and fx.SwitchPanel is W.SwitchPanel\n"
            "assert fx.DispatchInspector is I.DispatchInspector and fx.environment_view is W.environment_view\n"
            "print(sorted(fx.__all__))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    # the world layer's doors work first thing in a fresh process (their readiness model needs
    # the catalogue's FlyDSL routes, handed down when the catalogue is imported)
    code = ("import flyexplore as fx\n"
            "print('platform', fx.collect().platform)\n"
            "with fx.flydsl('topk', enabled=False):\n"
            "    pass\n"
            "fx.set_flydsl('rmsnorm', False)\n"
            "with fx.sdpa(['math']):\n"
            "    pass\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "platform cpu" in p.stdout, p.stderr[-2000:]
    assert fx.__all__ == sorted(fx.__all__) and "pair" not in fx.__all__  # fx.compare replaces it
    for name in fx.__all__:
        doc = inspect.getdoc(getattr(fx, name)) or ""
        assert len(doc) > 40, name
    assert {"compare", "published", "export", "files", "walkthrough", "kernels", "switches", "mx_blocks",
            "mx_errors", "peaks", "summary", "autotune", "xray_figure", "aotriton_ab", "data_dir", "sdpa",
            "SweepPanel", "SwitchPanel", "DispatchInspector", "environment_view"} <= set(fx.__all__)


def test_sweep_of_cpu_small_gemm_returns_rows_and_writes_them(tmp_path):
    args = fx.walkthrough("gemm", "cpu")
    df = fx.sweep(**args, backends="aten", timer=N.CPU_TIMER, out=tmp_path / "r.parquet")
    assert set(df.op) == {"gemm"} and set(df.backend) == {"aten"} and len(df) == 3
    assert (df.status == "ok").all() and (df.time_ms > 0).all() and df.tflops.notna().all()
    back = fx.load(tmp_path / "r.parquet")
    assert list(back.case) == list(df.case)
    with pytest.raises(UsageError, match="cublas"):
        fx.sweep("gemm", shapes="8x8x8", backends="cublas", out=tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_load_reads_one_or_several_files(demo):
    grouped = [CATALOGUE / "grouped_published.parquet", CATALOGUE / "grouped_moe.parquet"]
    one, two = fx.load(grouped[0]), fx.load(grouped[1])
    both = fx.load(*grouped)
    assert len(both) == len(one) + len(two) and set(both.case) == set(one.case) | set(two.case)
    assert len(fx.load(grouped)) == len(both)  # a list reads the same
    assert len(demo) > 0 and {"op", "case", "dtype", "backend", "time_ms"} <= set(demo.columns)
    with pytest.raises(UsageError, match="at least one"):
        fx.load()
    with pytest.raises(UsageError, match="result file not found: 'nope.parquet'"):
        fx.load("nope.parquet")


def test_speedup_and_geomean_take_rows_or_paths(demo):
    gemm = demo[demo.op == "gemm"]
    sp = fx.speedup(gemm, "aten")
    assert {"speedup", "speedup_lo", "speedup_hi", "verdict"} <= set(sp.columns)
    assert "triton" in set(sp.backend) and "aten" not in set(sp.backend) and (sp.speedup > 0).all()
    assert "flydsl" not in set(sp.backend)  # unavailable on the H200: never a FlyDSL time
    g = fx.geomean(demo, baseline="aten")
    assert g.equals(fx.geomean(DEMO, baseline="aten"))
    assert {"op", "dtype", "backend"} <= set(g.columns)
    with pytest.raises(UsageError, match="takes result rows"):
        fx.geomean(42)


def test_figure_takes_a_kind_and_plotly_express_like_arguments(demo):
    import plotly.graph_objects as go

    gemm = demo[demo.op == "gemm"]
    f = fx.figure("speedup", gemm, baseline="aten", title="GEMM speedup")
    assert isinstance(f, go.Figure) and f.layout.title.text.startswith("GEMM speedup")
    assert {t.name.split(":")[0] for t in f.data if t.type == "bar"} >= {"triton"}
    s = fx.figure("sweep", demo[demo.op == "rmsnorm"], x="m", y="gbps")
    assert "GB/s" in s.layout.yaxis.title.text and s.layout.xaxis.title.text.lower().startswith("m")
    assert isinstance(fx.figure("speedup", DEMO, baseline="aten"), go.Figure)  # a path is read
    grid = fx.eligibility_grid(**fx.walkthrough("rmsnorm:grid"), dtype="bf16")
    h = fx.figure("heatmap", grid, x="n", y="m")
    assert sum(v == 1 for row in h.data[0].z for v in row) == int(grid["value"].sum()) > 0
    r = fx.figure("range", title="ranges")  # default: the published ranges
    assert r.layout.title.text.startswith("ranges")
    with pytest.raises(UsageError, match=r"unknown figure kind 'pie' \(valid: speedup, sweep"):
        fx.figure("pie", gemm)
    with pytest.raises(UsageError, match="figure 'speedup' takes no x="):
        fx.figure("speedup", gemm, x="m")
    with pytest.raises(UsageError, match="unknown option 'colour' for figure 'sweep'"):
        fx.figure("sweep", gemm, colour="red")
    with pytest.raises(UsageError, match="z= and value= name the same thing"):
        fx.figure("heatmap", grid, z="value", value="value")
    with pytest.raises(UsageError, match="figure 'ab' needs data"):
        fx.figure("ab")


def test_compare_pairs_frames_paths_and_vllm_runs(tmp_path, demo):
    gemm = demo[demo.op == "gemm"]
    ab = fx.compare(gemm, gemm, names="ATen,Triton", a_backend="aten", b_backend="triton")
    assert ab.names == ("ATen", "Triton") and len(ab.pairs) == gemm[gemm.backend == "aten"].case.nunique()
    assert (ab.pairs["ratio"] > 0).all() and set(ab.summary.backend) == {"aten -> triton"}
    att = CATALOGUE / "attention_llm.parquet"
    ab2 = fx.compare(att, att, names=("flash", "cuDNN"), a_backend="flash", b_backend="cudnn",
                     out=tmp_path / "ab", static=False)
    assert len(ab2.pairs) > 0 and "flash -> cudnn" in set(ab2.summary.backend)
    assert "cuDNN vs flash" in (tmp_path / "ab" / "report.html").read_text()
    v = fx.compare(VLLM / "flydsl_off", VLLM / "flydsl_on", names=("FlyDSL off", "FlyDSL on"))
    assert isinstance(v, pd.DataFrame) and {"model", "concurrency", "metric", "speedup"} <= set(v.columns)
    assert set(v.source) == {"synthetic example"}
    with pytest.raises(UsageError, match="cannot compare a vllm bench result with a flyexplore result"):
        fx.compare(VLLM / "flydsl_off", att)
    with pytest.raises(UsageError, match="not vllm bench results"):
        fx.compare(VLLM / "flydsl_off", VLLM / "flydsl_on", a_backend="aten")
    with pytest.raises(UsageError, match="names needs two names"):
        fx.compare(gemm, gemm, names=("one",))


def test_published_tables_and_rows():
    rows = fx.published()
    assert len(rows) > 0 and set(rows.source) == {"published"}
    mx = fx.published("mxfp")
    assert set(mx.op) == {"scaled_gemm"} and len(fx.published("mxfp,topk")) == len(mx) + len(fx.published("topk"))
    assert "1.1027 (1.10x)" in fx.published("headlines").to_string()
    assert set(fx.published("summary").suite) >= {"dense", "mxfp"}
    assert {"what", "subject", "low", "high"} <= set(fx.published("ranges").columns)
    assert (fx.published("vllm").source == "published").all()
    with pytest.raises(UsageError, match=r"unknown published table 'nope' \(valid: dense,"):
        fx.published("nope")


def test_peaks_table_and_percent_of_peak(demo):
    t = fx.peaks()
    assert {"device", "class", "tflops"} <= set(t.columns) and t.device.str.contains("H200").any()
    gemm = demo[demo.op == "gemm"]
    pk = fx.peaks(gemm, kind="measured")
    assert len(pk) == len(gemm) and (pk.pct_peak_tflops.dropna() > 0).all() and pk.pct_peak_tflops.notna().any()
    with pytest.raises(UsageError, match="apply to result rows"):
        fx.peaks(kind="measured")


def test_walkthrough_gives_the_notebooks_arguments():
    for name, size in N.WALKTHROUGH_SWEEPS:
        assert fx.walkthrough(name, size) == N.sweep_args(size, name)
    a = fx.walkthrough("topk:grid")
    assert a == {"op": "topk", **N.ELIGIBILITY_GRIDS["topk"]}
    a["dims"]["k"].append(7)  # a copy
    assert 7 not in N.ELIGIBILITY_GRIDS["topk"]["dims"]["k"]
    assert fx.walkthrough("rmsnorm:xray") == {"op": "rmsnorm", "shapes": list(N.XRAY_RMSNORM), "dtype": "bf16"}
    with pytest.raises(UsageError, match=r"unknown walkthrough step 'sdpa' \(valid: attention,"):
        fx.walkthrough("sdpa")
    with pytest.raises(UsageError, match="unknown walkthrough size 'tpu'"):
        fx.walkthrough("gemm", "tpu")


def test_explain_with_shape_text_or_tensors():
    yes = fx.explain("rmsnorm", "8192x4096", "bf16")
    assert isinstance(yes, fx.Explanation) and yes.taken is True and "FlyDSL" in yes.reason
    no = fx.explain("rmsnorm", "2048x4096", "bf16")
    assert no.taken is False and "needs M >= 8192: M=2048" in no.reason
    assert "a_offset" not in fx.explain("gemm", "16x28672x4096:NT", "bf16").reason
    assert "16-byte aligned" in fx.explain("gemm", "16x28672x4096:NT", "bf16", "a_offset=3").reason
    t = fx.explain("topk", x=fx.TensorDesc((4096, 2048), "fp32"), k=8)  # judged for gfx950
    assert t.taken is True and t.kernel == "register"
    assert "fp32 only" in fx.explain("topk", x=fx.TensorDesc((4096, 2048), "bf16"), k=8).reason
    assert fx.explain("topk", x=fx.TensorDesc((4096, 2048), "fp32"), k=8, arch=None).taken is False  # this CPU
    with pytest.raises(UsageError, match="unknown operator for explain 'conv'"):
        fx.explain("conv", "1x1")
    with pytest.raises(UsageError, match="without a shape"):
        fx.explain("topk", dtype="bf16")


def test_trace_of_a_case_and_of_a_callable():
    r = fx.trace("rmsnorm", "2048x4096", "aten", "bf16")
    assert r["status"] == "ok" and r["trace"] is not None
    assert "rmsnorm 2048x4096 bf16 backend aten on cpu: ok" in str(r) and "aten::rms_norm" in str(r)
    u = fx.trace("rmsnorm", "8192x4096", "flydsl", "bf16")
    assert u["status"] == "unavailable" and "backend flydsl on cpu: unavailable" in str(u)
    import torch

    a = torch.ones(64, 64)
    tr = fx.trace(lambda: a @ a, reps=1)
    assert tr.device == "cpu" and "aten::matmul" in tr.to_text()
    with pytest.raises(UsageError, match="needs a shape and a backend"):
        fx.trace("rmsnorm", "2048x4096")
    with pytest.raises(UsageError, match="malformed gemm shape"):
        fx.autotune("64x64")


def test_xray_figure_says_why_when_the_xray_cannot_run(monkeypatch):
    from flyexplore.insight import xray as XR

    monkeypatch.setattr(XR, "unavailable_reason", lambda: "no AMDGPU-capable ld.lld")
    note = fx.xray_figure(**fx.walkthrough("rmsnorm:xray"))
    assert isinstance(note, N.Note) and "no AMDGPU-capable ld.lld" in note.text and "lld-22" in note.text
    with pytest.raises(UsageError, match="dtype for the rmsnorm X-ray 'int8'"):
        fx.xray_figure("rmsnorm", "8192x4096", "int8")
    with pytest.raises(UsageError):
        fx.xray_figure("rmsnorm", "8192")


def test_kernels_switches_and_mx():
    bands = fx.kernels("topk")
    assert bands.kernel.iloc[0] == "register" and "radix K 832-1024, N 32768-262144" in set(bands.kernel)
    heads = fx.kernels("attention", arch="gfx950", dtype="bf16", head_dims=[64, 80])
    flyc = heads.set_index(["head_dim", "pass"])["flyc"]
    assert not flyc[(80, "fwd")] and flyc[(64, "fwd")] and flyc[(80, "bwd")]
    with pytest.raises(UsageError, match=r"unknown operator with a FlyDSL kernel table 'gemm' \(valid: "):
        fx.kernels("gemm")
    sw = fx.switches()
    assert {"op", "mechanism", "setting", "effective"} <= set(sw.columns) and "topk" in set(sw.op)
    assert "topk" in fx.switches(text=True) and "FlyDSL" in fx.switches(text=True)
    import torch

    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    blocks = fx.mx_blocks(x, "mxfp8")
    assert len(blocks) == 4 * 64 // 32 and "scale_exp" in blocks.columns
    errs = fx.mx_errors(x)
    assert {"mxfp8", "mxfp4"} <= set(errs["format"]) and "err_rel_worst_row" in errs.columns
    with pytest.raises(UsageError):
        fx.mx_blocks(torch.ones(2, 48), "mxfp8")


def test_aotriton_ab_view_and_its_figure():
    ab, view = fx.aotriton_ab(AOT / "aotriton_0.13b_synthetic.jsonl", AOT / "aotriton_0.14.2b_synthetic.jsonl")
    assert len(view) == len(ab.pairs) > 0 and set(view.source) == {"synthetic example"}
    assert {"ran_a", "ran_b", "speedup", "published_range"} <= set(view.columns)
    fig = fx.figure("aotriton", view, title="AOTriton A/B")
    assert fig.layout.title.text.startswith("SYNTHETIC EXAMPLE (made-up numbers): AOTriton A/B")
    with pytest.raises(UsageError, match="result file not found"):
        fx.aotriton_ab(AOT / "nope.jsonl", AOT / "aotriton_0.14.2b_synthetic.jsonl")


def test_export_files_summary_and_report(tmp_path, demo):
    gemm = demo[demo.op == "gemm"]
    fig = fx.figure("speedup", gemm, baseline="aten")
    table = fx.geomean(demo, baseline="aten")
    w = fx.export({"speedup": fig, "geomean": table}, tmp_path / "out", ["html", "csv", "md"])
    assert list(w.columns) == ["name", "format", "path", "status", "note"]
    assert set(zip(w.name, w.format)) == {("speedup", "html"), ("geomean", "html"), ("geomean", "csv"),
                                          ("geomean", "md")}
    assert (w.status == "written").all()
    assert pd.read_csv(tmp_path / "out" / "geomean.csv").shape[0] == len(table)
    one = fx.export(fig, tmp_path / "single" / "speedup.html")
    assert one.status.tolist() == ["written"] and (tmp_path / "single" / "speedup.html").stat().st_size > 0
    fx.export(table, tmp_path / "g.tex")
    assert "\\begin{tabular}" in (tmp_path / "g.tex").read_text()
    listed = fx.files(tmp_path)
    assert {"out/speedup.html", "out/geomean.md", "single/speedup.html", "g.tex"} <= set(listed.path)
    assert (listed.bytes > 0).all() and fx.files(tmp_path / "none").empty
    with pytest.raises(UsageError, match="formats go with a dict"):
        fx.export(fig, tmp_path / "x.html", ["html"])
    with pytest.raises(UsageError, match="no table format in"):
        fx.export({"t": table}, tmp_path / "t", ["png"])
    with pytest.raises(UsageError, match="'n' is neither a plotly figure nor a DataFrame"):
        fx.export({"n": 3}, tmp_path / "n")
    with pytest.raises(UsageError, match="unknown table file extension '.xls'"):
        fx.export(table, tmp_path / "t.xls")
    s = fx.summary(demo)
    assert len(s) == len(demo) and {"time_us", "speedup", "verdict"} <= set(s.columns)
    path = fx.report(demo, tmp_path / "rep", static=False, title="public face report")
    assert path.name == "report.html" and "public face report" in path.read_text()
    path2 = fx.report([DEMO], tmp_path / "rep2", static=False)
    assert "rmsnorm" in path2.read_text()
    with pytest.raises(UsageError, match="takes result rows"):
        fx.report({"a": 1}, tmp_path / "rep3")


def test_readme_and_docs_python_examples_use_only_the_public_face():
    import ast
    import re

    pages = [ROOT / "README.md", ROOT / "notebooks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [(p.name, b) for p in pages for b in re.findall(r"```python\n(.*?)```", p.read_text(), re.DOTALL)]
    assert len(blocks) >= 5
    for name, block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("flyexplore"), (name, ast.unparse(node))
            if isinstance(node, ast.Import):
                assert all(a.name != "flyexplore" or a.asname == "fx" for a in node.names), (name, ast.unparse(node))
                assert not any(a.name.startswith("flyexplore.") for a in node.names), (name, ast.unparse(node))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fx":
                assert node.attr in fx.__all__, (name, node.attr)
