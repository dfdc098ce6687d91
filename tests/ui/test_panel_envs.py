"""The sweep panel runs an environment A/B (issue 43, item 6): ``SweepPanel(..., envs=[...])`` puts
an environment picker (``fx.EnvPicker``) in the panel, Run runs the SweepSpec ``fx.sweep(envs=...)``
builds, the A/B's rows come through the panel's live row path, bad environment text is one line
in the panel and runs nothing, and the figure area shows the A/B figure (and, with three or more
environments, the build-series figure where the views layer has one)."""
import json
import threading

import ipywidgets as W
import pytest

import flyexplore as fx
import flyexplore._api as api
from flyexplore.errors import UsageError
from flyexplore.measure import stats as S
from flyexplore.results import compare as C
from flyexplore.results import table as R
from flyexplore.ui.envs import EnvPicker
from flyexplore.ui.panel import SweepPanel

WAIT = 240  # seconds; a bound, never reached on a healthy machine


def _walk(w):
    """Every widget under ``w`` (itself included)."""
    yield w
    for c in getattr(w, "children", ()):
        yield from _walk(c)


def _spec_of_fx_sweep(monkeypatch, *args, **kw):
    """The SweepSpec ``fx.sweep(*args, **kw)`` builds (its run replaced by catching the spec)."""
    got = []
    monkeypatch.setattr(api, "run_sweep", lambda spec, **_: got.append(spec))
    fx.sweep(*args, **kw)
    (spec,) = got
    return spec


@pytest.mark.parametrize("envs, opts", [
    (["base", "ck:TORCH_ROCM_FA_PREFER_CK=1"], {}),
    (["base", "lt:TORCH_BLAS_PREFER_HIPBLASLT=0", "v:X=1"], {"pairs": 2}),
    (None, {"aa": True}),
])
def test_the_panel_with_envs_builds_the_spec_fx_sweep_builds(monkeypatch, envs, opts):
    timer = {"rep": 5, "warmup": 1}
    p = SweepPanel("rmsnorm", shapes="256x256", dtypes="fp32", backends="aten", timer=timer, envs=envs, **opts)
    assert isinstance(p.env_picker, EnvPicker) and p.env_picker.widget in list(_walk(p.widget))
    assert p.env_picker.text in p._inputs   # disabled while a sweep runs
    spec = p.spec()
    ref = _spec_of_fx_sweep(monkeypatch, "rmsnorm", shapes="256x256", dtypes="fp32", backends="aten", timer=timer,
                            **p.env_picker.options)
    assert spec == ref and spec.fingerprint() == ref.fingerprint()
    assert spec.plan_fingerprint() == ref.plan_fingerprint() and spec.engine_kind == "envab"
    names = [e.name for e in spec.environments]
    assert names == ([e.split(":")[0] for e in envs] if envs else ["base", "base-aa"])
    assert spec.pairs_or_default == opts.get("pairs", 3)
    assert p.env_picker.options["pairs"] == opts.get("pairs", "auto") and spec.pairs_auto == ("pairs" not in opts)
    # the baseline is an arm: the operator's baseline in the first environment; the A/B figure
    # sets the last environment against it
    assert p.baseline.options == tuple(f"aten@{n}" for n in names) and p.baseline.value == f"aten@{names[0]}"
    assert p.ab_with.options == tuple(names[1:]) and p.ab_with.value == names[-1]


def test_without_envs_the_panel_has_no_picker_and_its_spec_is_an_ordinary_sweep(monkeypatch):
    p = SweepPanel("rmsnorm", shapes="256x256", dtypes="fp32", backends="aten,inductor")
    assert p.env_picker is None and not p._ab_box.children
    assert p.spec() == _spec_of_fx_sweep(monkeypatch, "rmsnorm", shapes="256x256", dtypes="fp32",
                                         backends="aten,inductor")
    assert p.baseline.options == ("aten", "inductor", "flydsl") and p.baseline.value == "aten"


def test_bad_environment_text_is_one_line_in_the_panel_and_runs_nothing(tmp_path):
    p = SweepPanel("rmsnorm", shapes="256x256", dtypes="fp32", backends="aten", envs=["base", "b:X=1"])
    for text, expected in (("base\nbad name", "bad --env 'bad name': the name 'bad name' must be 1 to 40 letters"),
                           ("base", "an environment A/B needs two or more --env"),
                           ("base\nb:CUDA_VISIBLE_DEVICES=1", "CUDA_VISIBLE_DEVICES is set by the A/B itself"),
                           ("base\nbase", "--env name 'base' is given twice"),
                           (f"base\nv={tmp_path / 'nope' / 'python'}", "the interpreter does not exist")):
        p.env_picker.text.value = text
        p.run_button.click()
        assert not p.running and p._thread is None, text
        assert expected in p.message.value, (text, p.message.value)
        assert "<br>" not in p.message.value   # one line
        assert p.results.empty and p.progress.value == 0 and not p.run_button.disabled
    assert "bad --env" not in p.env_picker.status.value   # the picker's own status follows the text
    p.env_picker.text.value = "base\nbad name"
    assert "bad --env 'bad name'" in p.env_picker.status.value


def test_bad_initial_environments_raise_usage_error():
    with pytest.raises(UsageError, match="bad --env 'a b'"):
        SweepPanel("rmsnorm", envs=["base", "a b"])
    with pytest.raises(UsageError, match="needs two or more --env"):
        SweepPanel("rmsnorm", envs=["base"])
    with pytest.raises(UsageError, match="pairs is for an environment A/B"):
        SweepPanel("rmsnorm", pairs=2)
    with pytest.raises(UsageError, match=r"baseline 'inductor@c' is not an arm of the A/B \(aten@base, aten@b\)"):
        SweepPanel("rmsnorm", backends="aten", envs=["base", "b:X=1"], baseline="inductor@c")
    p = SweepPanel("rmsnorm", backends="aten,inductor", envs="base", aa=True, baseline="inductor")
    assert p.baseline.value == "inductor@base"   # a backend is taken in the first environment
    assert p.baseline.options == ("aten@base", "inductor@base", "aten@base-aa", "inductor@base-aa")


def _ab_rows(envs, cases, speedups, op="gemm", backend="aten", dtype="fp32", run_id="r1", k=3):
    """An environment A/B's rows as run_sweep hands them to on_row: per case, ``backend`` in each
    environment (the first the base), each other arm's speedup over ``k`` pairs of workers
    (``speedups[env][i]`` for case ``i``, the pairs spread +-0.5%)."""
    rows = []
    base = f"{backend}@{envs[0]}"
    for i, case in enumerate(cases):
        common = {"op": op, "case": case, "dtype": dtype, "status": "ok", "source": "measured", "run_id": run_id,
                  "order": "interleaved", "platform": "cpu", "processes": k, "baseline": base}
        rows.append({**common, "backend": base, "env": envs[0], "time_ms": 1.0,
                     "process_estimates": json.dumps([{"time_ms": 1.0, "time_se": 0.001}] * k)})
        for e in envs[1:]:
            per = [speedups[e][i] * f for f in (0.995, 1.0, 1.005)[:k]]
            est, lo, hi = S.between_process(per, [0.001] * k, prediction=False)
            rows.append({**common, "backend": f"{backend}@{e}", "env": e, "time_ms": 1.0 / est, "speedup": est,
                         "speedup_lo": lo, "speedup_hi": hi, "verdict": S.verdict(lo, hi),
                         "process_estimates": json.dumps([{"time_ms": 1.0 / s, "time_se": 0.001, "speedup": s,
                                                           "speedup_se": 0.001} for s in per])})
    return rows


def _plotly_outputs(p):
    return [o["data"]["application/vnd.plotly.v1+json"] for o in p.ab_view.outputs]


def test_ab_rows_arrive_live_and_the_figure_area_shows_the_ab_figure():
    cases = ["64x64x64", "128x128x128", "256x256x256"]
    rows = _ab_rows(["base", "ck"], cases, {"ck": [0.80, 1.0, 1.25]})
    p = SweepPanel("gemm", shapes="\n".join(cases), dtypes="fp32", backends="aten", envs=["base", "ck:X=1"])
    seen = []
    p.on_row(lambda r: seen.append(r["backend"]))
    p.open_feed(len(rows))
    for r in rows[:2]:   # the first case: both arms
        p.add_row(r)
    p.redraw(table=True)
    # live: the speedup figure of the arm against the baseline arm, the A/B figure of the first case
    (t,) = p.figure.data
    assert t.name.startswith("aten@ck: geomean") and list(t.x) == ["64x64x64"]
    assert list(t.y) == pytest.approx([rows[1]["speedup"]])
    assert set(p.ab_figures) == {"ab"} and len(_plotly_outputs(p)) == 1
    (bar,) = [b for b in p.ab_figures["ab"].data if b.type == "bar"]
    assert list(bar.x) == ["64x64x64"]
    for r in rows[2:]:
        p.add_row(r)
    p.close_feed()
    assert seen == [r["backend"] for r in rows]
    assert p.progress.value == 6 and len(p.table_frame) == 6
    # the A/B figure: time base / time ck per case, the A/B's own intervals (between pairs, no
    # cross-run allowance): what fx.compare of the same rows gives
    df = R.frame(rows)
    ref = C.sides(df).ab
    fig = p.ab_figures["ab"]
    (bar,) = [b for b in fig.data if b.type == "bar"]
    assert list(bar.x) == cases and list(bar.y) == pytest.approx(list(ref.pairs["ratio"]))
    assert list(bar.y) == pytest.approx([r["speedup"] for r in rows if r["env"] == "ck"])
    assert set(ref.pairs["interval"]) == {"between-pair"}
    assert fig.layout.title.text.startswith("A/B: ck vs base")
    assert [o["layout"]["title"]["text"] for o in _plotly_outputs(p)] == [fig.layout.title.text]
    assert "time base / time ck per case and backend" in p.ab_message.value and "3 pairs" in p.ab_message.value
    assert [t.name.split(":")[0] for t in p.figure.data] == ["aten@ck"]
    assert list(p.figure.data[0].marker.symbol)[0] == "triangle-down"   # 0.8x: SLOWER
    # the other way round: the baseline arm's environment is side A
    p.baseline.value = "aten@ck"
    assert p.ab_with.options == ("base",) and p.ab_figures["ab"].layout.title.text.startswith("A/B: base vs ck")
    assert [t.name.split(":")[0] for t in p.figure.data] == ["aten@base"]
    # a new feed clears the A/B figures
    p.open_feed(2)
    assert p.ab_figures == {} and p.ab_view.outputs == () and p.ab_message.value == ""
    p.close_feed()


def test_three_environments_draw_the_build_series_figure():
    cases = ["64x64x64", "128x128x128"]
    envs = ["old", "mid", "new"]
    rows = _ab_rows(envs, cases, {"mid": [0.9, 1.1], "new": [1.2, 1.3]})
    p = SweepPanel("gemm", shapes="\n".join(cases), dtypes="fp32", backends="aten",
                   envs=["old", "mid:X=1", "new:X=2"])
    assert p.ab_with.options == ("mid", "new") and p.ab_with.value == "new"
    p.open_feed(len(rows))
    for r in rows:
        p.add_row(r)
    p.close_feed()
    (bar,) = [b for b in p.ab_figures["ab"].data if b.type == "bar"]
    assert list(bar.y) == pytest.approx([1.2, 1.3], rel=1e-3)   # old against new
    p.ab_with.value = "mid"
    (bar,) = [b for b in p.ab_figures["ab"].data if b.type == "bar"]
    assert list(bar.y) == pytest.approx([0.9, 1.1], rel=1e-3)
    assert p.ab_figures["ab"].layout.title.text.startswith("A/B: mid vs old")
    # the live figure: every arm against the baseline arm
    assert [t.name.split(":")[0] for t in p.figure.data] == ["aten@mid", "aten@new"]
    # the build series: each case in every environment against the first, in the run's order
    # (fx.figure("series", rows)), whichever environment the A/B figure compares
    assert set(p.ab_figures) == {"ab", "series"} and len(_plotly_outputs(p)) == 2
    assert "against old, the environments in the run's order" in p.ab_message.value
    ref = fx.figure("series", R.frame(rows))
    got = {t.meta["case"]: (list(t.x), list(t.y)) for t in p.ab_figures["series"].data if t.meta}
    want = {t.meta["case"]: (list(t.x), list(t.y)) for t in ref.data if t.meta}
    assert got == want and got["64x64x64"][0] == envs
    assert got["64x64x64"][1] == pytest.approx([1.0, 0.9, 1.2], rel=1e-3)


def test_an_attention_ab_also_shows_which_aotriton_backend_ran():
    cases = ["1x4x256x256x64", "1x4x256x256x64:causal=1"]
    rows = _ab_rows(["0.13b", "0.14.2b"], cases, {"0.14.2b": [1.5, 1.1]}, op="attention", backend="flash")
    p = SweepPanel("attention", shapes="\n".join(cases), dtypes="fp32", backends="flash",
                   envs=["0.13b", "0.14.2b:X=1"])
    p.open_feed(len(rows))
    for r in rows:
        p.add_row(r)
    p.close_feed()
    assert set(p.ab_figures) == {"ab", "aotriton"}
    aot = p.ab_figures["aotriton"]
    assert aot.layout.title.text.startswith("AOTriton A/B: 0.14.2b vs 0.13b")
    assert sorted(v for t in aot.data if t.type == "bar" for v in t.y) == pytest.approx([1.1, 1.5], rel=1e-3)
    assert len(_plotly_outputs(p)) == 2


def test_without_pairs_the_ab_area_says_why_and_draws_nothing():
    rows = _ab_rows(["base", "ck"], ["64x64x64"], {"ck": [1.0]})
    p = SweepPanel("gemm", shapes="64x64x64", dtypes="fp32", backends="aten", envs=["base", "ck:X=1"])
    p.open_feed(2)
    p.add_row(rows[0])
    p.close_feed()
    assert p.ab_figures == {} and "waiting for rows of base and ck" in p.ab_message.value
    # both environments' rows, none timed in ck: the pairing's one line, no figure, no error
    p.open_feed(2)
    p.add_row(rows[0])
    p.add_row({**rows[1], "status": "unavailable", "time_ms": None, "message": "no such kernel here"})
    p.close_feed()
    assert p.ab_figures == {} and p.ab_view.outputs == ()
    assert "A/B figure: no case is in both base and ck" in p.ab_message.value and "failed" not in p.ab_message.value


@pytest.mark.slow   # a real A/B: a pair of worker processes on this CPU (about 12 s on 2 cores)
def test_a_real_cpu_ab_from_the_panel(tmp_path):
    p = SweepPanel("rmsnorm", shapes="256x256", dtypes="fp32", backends="aten", timer={"rep": 5, "warmup": 1},
                   aa=True, pairs=1)
    threads = []
    p.on_row(lambda r: threads.append(threading.current_thread().name))
    p.run_button.click()
    assert p.running and p.env_picker.text.disabled and p.env_picker.aa.disabled
    assert "running an environment A/B of rmsnorm" in p.message.value
    assert p.wait(WAIT)
    df = p.results
    R.validate(df)
    assert list(df["backend"]) == ["aten@base", "aten@base-aa"] and set(df["status"]) == {"ok"}
    assert threads == ["flyexplore-sweep", "flyexplore-sweep"]   # the A/B's rows on the panel's row path
    assert "done: 2 rows" in p.message.value and p.progress.value == p.progress.max == 2
    assert not p.env_picker.text.disabled
    # the live figure: the copy against the baseline arm; the A/B figure: the same ratio
    (t,) = p.figure.data
    assert t.name.startswith("aten@base-aa") and list(t.y) == pytest.approx([df["speedup"].iloc[1]])
    (bar,) = [b for b in p.ab_figures["ab"].data if b.type == "bar"]
    assert list(bar.y) == pytest.approx([df["speedup"].iloc[1]], rel=1e-6)
    assert p.ab_figures["ab"].layout.title.text.startswith("A/B: base-aa vs base")
    # saved, it is an A/B file fx.compare reads by itself
    path = p.save(str(tmp_path / "aa.parquet"))
    assert fx.compare(path).names == ("base", "base-aa")
    assert any(isinstance(w, W.Output) and w.outputs for w in _walk(p.widget))


def test_an_ab_row_picked_in_the_panel_reaches_the_inspector_as_its_backend():
    rows = _ab_rows(["base", "ck"], ["2048x4096"], {"ck": [1.0]}, op="rmsnorm", dtype="bf16")
    p = SweepPanel("rmsnorm", shapes="2048x4096", dtypes="bf16", backends="aten", envs=["base", "ck:X=1"])
    insp = fx.DispatchInspector("rmsnorm", "8192x4096", "bf16").attach(p)
    p.open_feed(2)
    for r in rows:
        p.add_row(r)
    p.close_feed()
    p.row_select.value = 1   # aten@ck
    assert insp.explanation is not None and insp.backend.value == "aten"
    assert "2048x4096" in insp.shape.value and "unknown backend" not in insp.message.value


def test_the_picker_s_pairs_are_auto_by_default_a_number_or_a_one_line_error():
    ep = EnvPicker(["base", "b:X=1"])
    assert ep.options["pairs"] == "auto"
    ep.pairs.value = "8"
    assert ep.options["pairs"] == 8
    ep.pairs.value = "many"
    with pytest.raises(UsageError, match="pairs must be 'auto' or an integer >= 1, got 'many'"):
        ep.options
    assert "pairs must be" in ep.status.value
