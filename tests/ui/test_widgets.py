"""The sweep panel driven from Python: set values, click Run and Stop, check rows, figure
traces and messages. Sweeps are real (GEMM on the CPU, small shapes, few repetitions)."""
import threading

import pandas as pd
import pytest

from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.errors import UsageError
from flyexplore.ops import list_ops
from flyexplore.views.plots import speedup_figure
from flyexplore.ui.panel import CUSTOM, SweepPanel
from flyexplore.ui.panel import SYMBOLS
from flyexplore.ui.widgets import environment_view
from flyexplore.world.env import collect

FAST = {"rep": 3, "warmup": 1}
WAIT = 240  # seconds; a bound, never reached on a healthy machine


def run(panel):
    panel.run_button.click()
    assert panel.wait(WAIT), "sweep did not finish"
    return panel.results


def test_controls_follow_the_operator_registry():
    p = SweepPanel("gemm", timer=FAST)
    assert p.op.options == list_ops() and p.op.options[:3] == ("gemm", "rmsnorm", "topk")
    assert p.backends.options == ("aten", "triton", "inductor", "flydsl")
    assert p.backends.value == p.backends.options and p.baseline.value == "aten"
    assert p.suite.options[-1] == CUSTOM and "cpu-small" in p.suite.options
    p.suite.value = "cpu-small"
    assert p.shapes.value.splitlines() == ["128x128x128", "256x256x256", "384x256x512"]
    assert p.dtypes.value == ("fp32",)
    p.op.value = "rmsnorm"
    assert p.backends.options == ("aten", "inductor", "flydsl")
    assert set(p.dtypes.options) == {"bf16", "fp16", "fp32"}
    # a published suite keeps its own dtype per case (22 cases, not 22 x 3)
    p.suite.value = "published"
    assert set(p.dtypes.value) == {"fp16", "bf16", "fp32"}
    assert len(p.plan()) == 22 * 3  # 22 cases x 3 backends
    # typing into the shapes box switches to custom shapes
    p.shapes.value = "64x256\n32x128"
    assert p.suite.value == CUSTOM
    p.dtypes.value = ("bf16", "fp32")
    plan = p.plan()
    assert [c.label for c, _ in plan.pairs] == ["64x256", "64x256", "32x128", "32x128"]
    assert environment_view().value.count("FlyDSL") >= 2
    env = collect(refresh=True, environ={"FLYEXPLORE_COMMIT": "c0ffee", "FLYEXPLORE_DIRTY": "0"})
    assert "<b>flyexplore commit</b>: c0ffee (no changes to tracked files)" in environment_view(env).value


@pytest.mark.parametrize("edit, expected", [
    (dict(shapes="12x"), "malformed gemm shape '12x'"),
    (dict(shapes="8x8x0"), "non-positive gemm k=0"),
    (dict(shapes="8x8x8:XX"), "unknown gemm option 'XX'"),
    (dict(shapes="  "), "no gemm shapes given"),
    (dict(backends=()), "select at least one backend (valid: aten, triton, inductor, flydsl)"),
    (dict(dtypes=()), "select at least one dtype"),
])
def test_invalid_input_shows_a_message_not_a_traceback(edit, expected):
    p = SweepPanel("gemm", suite="cpu-small", timer=FAST)
    for name, value in edit.items():
        getattr(p, name).value = value
    p.run_button.click()
    assert not p.running and p._thread is None
    assert expected in p.message.value
    assert p.results.empty and p.progress.value == 0
    assert not p.run_button.disabled


def test_bad_initial_values_raise_usage_error():
    with pytest.raises(UsageError, match="unknown operator 'gemmm'"):
        SweepPanel("gemmm")
    with pytest.raises(UsageError, match="unknown suite for gemm 'nope'"):
        SweepPanel("gemm", suite="nope")
    with pytest.raises(UsageError, match="unknown backend for topk 'triton'"):
        SweepPanel("topk", backends="aten,triton")


def test_run_fills_rows_progress_table_and_figure(tmp_path):
    # 8 rounds: enough for a 95% interval of every speedup (6 or more)
    p = SweepPanel("gemm", suite="cpu-small", backends=["aten", "inductor", "triton"], timer={"rep": 8, "warmup": 1})
    seen, done = [], []
    p.on_row(lambda row: seen.append((row["case"], row["backend"], threading.current_thread().name)))
    p.on_done(done.append)
    df = run(p)
    R.validate(df)
    assert len(df) == 9 and len(seen) == 9
    assert {t for *_, t in seen} == {"flyexplore-sweep"}  # rows arrive on the worker thread
    st = df.set_index(["case", "backend"])["status"]
    assert (st.xs("aten", level="backend") == "ok").all()
    assert (st.xs("inductor", level="backend") == "ok").all()
    assert (st.xs("triton", level="backend") == "unavailable").all()  # no GPU: a row, not a swap
    assert p.progress.value == p.progress.max == 9 and p.progress.bar_style == "success"
    assert "done: 9 rows" in p.message.value and "3 unavailable" in p.message.value
    assert not p.running and not p.run_button.disabled and p.stop_button.disabled
    assert len(done) == 1 and len(done[0]) == 9
    # figure: one marker series (inductor vs aten), one point per case with its interval and
    # label, the 1.0x line; the same numbers and legend as plots.speedup_figure
    pts = [t for t in p.figure.data if t.type == "scatter"]
    assert len(pts) == 1 and pts[0].name.startswith("inductor: geomean ")
    assert list(pts[0].x) == ["128x128x128", "256x256x256", "384x256x512"]
    sp = R.speedup(df, "aten")
    assert list(pts[0].y) == pytest.approx(list(sp["speedup"]))
    assert [y + e for y, e in zip(pts[0].y, pts[0].error_y.array)] == pytest.approx(list(sp["speedup_hi"]))
    assert [y - e for y, e in zip(pts[0].y, pts[0].error_y.arrayminus)] == pytest.approx(list(sp["speedup_lo"]))
    assert list(pts[0].marker.symbol) == [SYMBOLS[v] for v in sp["verdict"]]
    # a small plan writes a mark after each value (never a first letter: SAME and SLOWER alike)
    assert [t.split()[-1] for t in pts[0].text] == [S.MARKS[v].strip() for v in sp["verdict"]]
    assert pts[0].name == speedup_figure(df, "aten").data[0].name  # geomean, interval, label counts
    assert any(s.y0 == 1.0 and s.line.dash == "dash" for s in p.figure.layout.shapes)
    # a lone backend's geometric mean is shown: legend on, and in the subtitle
    gm = R.geomean(sp["speedup"])
    assert p.figure.layout.showlegend is True and f"inductor geomean {gm:.3f}x" in p.figure.layout.title.text
    assert {round(sh.y0, 6): sh.line.dash for sh in p.figure.layout.shapes}[round(gm, 6)] == "dot"
    # another baseline redraws the figure from the same rows
    p.baseline.value = "inductor"
    assert [t.name.split(":")[0] for t in p.figure.data if t.type == "scatter"] == ["aten"]
    # table: every row; the long unavailable reason once in the notes, numbered in the rows
    t = p.table_frame
    assert len(t) == 9 and list(t.backend) == list(df.backend)
    assert set(t.message[t.status == "unavailable"]) == {"[1] Triton GEMM templates need a CUDA or ROC…"}
    assert p.notes.value.count("Triton GEMM templates need a CUDA or ROCm GPU") == 1 and "(3 rows)" in p.notes.value
    # row details and on_select
    chosen = []
    p.on_select(chosen.append)
    p.row_select.value = 1
    assert chosen[0]["case"] == df.case[1] and chosen[0]["backend"] == df.backend[1]
    assert "run_id" in p.details.value and df.run_id[1] in p.details.value
    # save: the file holds the same rows; a bad path is a message
    p.save_path.value = str(tmp_path / "panel.parquet")
    p.save_button.click()
    assert "saved 9 rows" in p.message.value
    back = R.load(tmp_path / "panel.parquet")
    pd.testing.assert_series_equal(back["time_ms"], df["time_ms"])
    p.save_path.value = str(tmp_path / "panel.xlsx")
    p.save_button.click()
    assert "unknown result file extension '.xlsx'" in p.message.value


def test_stop_ends_after_the_current_case_and_keeps_rows():
    shapes = "\n".join(f"{64 + 8 * i}x64x64" for i in range(12))
    p = SweepPanel("gemm", shapes=shapes, dtypes="fp32", backends="aten", timer=FAST)
    gate = threading.Event()
    seen = []

    def hold_then_stop(row):
        seen.append(row)
        if len(seen) == 2:
            gate.wait(WAIT)  # the worker waits here while the test looks at the panel
        if len(seen) == 3:
            p.stop_button.click()

    p.on_row(hold_then_stop)
    assert p.start()
    for _ in range(WAIT * 10):
        if p.status.value.startswith("2/12"):
            break
        threading.Event().wait(0.1)
    # the notebook is free while the sweep runs; a second Run is refused with a message
    assert p.running and p.run_button.disabled and not p.stop_button.disabled
    p.start()
    assert "already running" in p.message.value
    assert p.status.value.startswith("2/12 - now 80x64x64 fp32 aten - about ")
    gate.set()
    assert p.wait(WAIT)
    df = p.results
    assert len(df) == 3 and (df.status == "ok").all()
    assert list(df.case) == ["64x64x64", "72x64x64", "80x64x64"]
    assert "stopped after 3 of 12 runs" in p.message.value
    assert p.progress.bar_style == "warning" and not p.run_button.disabled
    # Run again replaces the rows
    p.shapes.value = "32x32x32"
    assert len(run(p)) == 1


def test_contexts_sections_and_failing_callbacks():
    p = SweepPanel("gemm", shapes="32x32x32", dtypes="fp32", backends="aten", timer=FAST)
    log = []

    class Ctx:
        def __enter__(self):
            log.append(("enter", threading.current_thread().name))

        def __exit__(self, *exc):
            log.append(("exit", threading.current_thread().name))

    p.add_context(Ctx)

    def broken(row):
        raise RuntimeError("listener bug")

    p.on_row(broken)
    df = run(p)
    assert len(df) == 1 and df.status[0] == "ok"  # the sweep went on
    assert log == [("enter", "flyexplore-sweep"), ("exit", "flyexplore-sweep")]
    assert "done: 1 rows" in p.message.value

    def refuse():
        raise RuntimeError("switch cannot be set here")

    p.add_context(lambda: _Raising(refuse))
    run(p)
    assert "sweep failed: RuntimeError: switch cannot be set here" in p.message.value
    assert p.progress.bar_style == "danger" and not p.run_button.disabled

    import ipywidgets as W
    extra = p.add_section("More", W.Label("extra"))
    assert p.widget.children[-1].children[-1] is extra


class _Raising:
    def __init__(self, fn):
        self.fn = fn

    def __enter__(self):
        self.fn()

    def __exit__(self, *exc):
        return False


def test_figure_waits_for_the_baseline_and_save_needs_rows(tmp_path):
    p = SweepPanel("gemm", shapes="32x32x32", dtypes="fp32", backends="inductor", timer=FAST)
    p.save(str(tmp_path / "x.csv"))
    assert "nothing to save yet" in p.message.value
    run(p)
    assert len(p.figure.data) == 0 and "waiting for a aten row" in p.figure.layout.title.text


def test_default_suite_depends_on_the_device():
    assert SweepPanel("topk").suite.value == "cpu-small"  # this machine has no GPU
    p = SweepPanel("gemm", device="cuda:0")  # only resolved, nothing runs
    assert p.suite.value == "published-bf16" and p.dtypes.value == ("bf16",)


def test_the_measuring_core_never_imports_ui_code():
    import subprocess
    import sys

    from conftest import ROOT
    code = ("import sys, flyexplore.cli, flyexplore.run.sweep, flyexplore.results.table, flyexplore.views.plots, "
            "flyexplore.views.report, flyexplore.cli.demo, flyexplore.ui.notebooks, flyexplore.ops.gemm.operator; "
            "bad = [m for m in ('ipywidgets', 'flyexplore.ui.widgets', 'flyexplore.ui.panel', 'flyexplore.ui.tables', "
            "'flyexplore.ui.inspector', 'flyexplore.ui.widget_base', 'anywidget', 'nbclient') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_measuring_modules_import_no_figures_and_no_widgets():
    import subprocess
    import sys

    from conftest import ROOT
    code = ("import sys, flyexplore.measure.timing, flyexplore.measure.interleaved, flyexplore.measure.stats, flyexplore.measure.devstate, "
            "flyexplore.run.sweep, flyexplore.results.table; "
            "bad = [m for m in sys.modules if m.split('.')[-1] in ('plots', 'plots_compare', 'plot_style', 'widgets', "
            "'panel', 'tables', 'inspector', 'widget_base') or m in ('ipywidgets', 'plotly')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
