"""The switch panel and the dispatch inspector driven from Python, on the installed torch 2.15
(CUDA wheel, CPU machine): switches change torch's real settings and are restored, a sweep runs
under the chosen switches, the inspector's verdicts, traces and kernel X-ray (one real compile
for gfx950)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.backends.python_native as pn  # noqa: E402
from torch._inductor import config as ic  # noqa: E402

from flyexplore.world import switches as S  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402
from flyexplore.ui.inspector import DispatchInspector  # noqa: E402
from flyexplore.ui.panel import SweepPanel  # noqa: E402
from flyexplore.ui.widgets import SwitchPanel  # noqa: E402

FAST = {"rep": 3, "warmup": 1}
WAIT = 240  # seconds; a bound, never reached on a healthy machine


@pytest.fixture(autouse=True)
def restored():
    """Every test leaves torch's switches as it found them."""
    before = S.snapshot()
    yield before
    S.restore(before)
    assert S.snapshot() == before


# -- switch panel ------------------------------------------------------------------------------

def test_switch_panel_changes_torch_settings_shows_them_and_restores(restored):
    p = SwitchPanel()
    assert list(p.toggles) == list(S.OPS)
    # torch 2.15 CUDA build: every FlyDSL switch exists but has no effect; attention cannot be on
    assert p.toggles["attention"].disabled and "not a ROCm build" in p.notes["attention"].value
    assert not p.toggles["rmsnorm"].disabled and "no effect here" in p.notes["rmsnorm"].value
    assert p.rocm_fa.disabled and not p.autotuning.disabled
    assert p.toggles["rmsnorm"].value and p.toggles["topk"].value and not p.toggles["gemm"].value
    assert "topk enabled" in p.table.value and "FLYDSL" not in p.table.value

    p.toggles["topk"].value = False
    assert pn.is_operation_disabled("topk") and pn.is_operation_disabled("topk.values")
    assert S.eager_on("rmsnorm") and not S.eager_on("topk")
    assert "topk disabled, topk.values disabled" in p.table.value
    assert "FlyDSL off for topk" in p.message.value

    p.toggles["gemm"].value = True  # one torch setting: the other compiled GEMMs follow
    assert "FLYDSL" in ic.max_autotune_gemm_backends.split(",") and ic.max_autotune_gemm
    assert p.toggles["grouped_gemm"].value and p.toggles["scaled_gemm"].value
    assert "FLYDSL" in p.gemm_backends.value and "FLYDSL" in p.table.value
    p.autotuning.value = True
    p.search_space.value = "EXHAUSTIVE"
    assert ic.flydsl_enable_autotuning is True and ic.max_autotune_gemm_search_space == "EXHAUSTIVE"
    p.sdpa["math"].value = False
    assert not torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert "SDPA enabled: flash,mem_efficient,cudnn;" in p.table.value
    assert p.settings == S.settings()
    assert p.settings.flydsl["topk"] is False and p.settings.sdpa_backends == ("flash", "mem_efficient", "cudnn")

    p.restore_button.click()
    assert S.snapshot() == restored
    assert p.toggles["topk"].value and not p.toggles["gemm"].value and p.sdpa["math"].value
    assert not p.autotuning.value and p.search_space.value == "DEFAULT"
    assert "restored" in p.message.value and "topk enabled" in p.table.value


def test_switch_panel_disables_what_this_torch_cannot_turn_on(monkeypatch):
    """torch 2.11 (the H200 machine): no python_native, no FlyDSL templates."""
    from flyexplore.world import readiness as R
    real = R.has_module
    monkeypatch.setattr(S, "python_native", lambda: None)  # where torch is asked
    monkeypatch.setattr(R, "has_module", lambda name: False if "codegen.flydsl" in name else real(name))
    p = SwitchPanel()
    for op in ("rmsnorm", "topk"):
        assert p.toggles[op].disabled and "python_native" in p.notes[op].value
    for op in ("gemm", "grouped_gemm", "scaled_gemm"):
        assert p.toggles[op].disabled and "no FlyDSL Inductor templates" in p.notes[op].value
    assert p.autotuning.disabled and p.search_space.disabled and "unavailable" in p.compile_note.value
    assert not any(cb.disabled for cb in p.sdpa.values())  # SDPA flags exist everywhere
    assert set(p.settings.flydsl) == set() and p.settings.autotuning is None
    before = ic.max_autotune_gemm_backends
    p.toggles["gemm"].value = True  # what a script could still do: nothing changes, it says why
    assert ic.max_autotune_gemm_backends == before and not p.toggles["gemm"].value
    assert "nothing changed: cannot turn FlyDSL on for gemm" in p.message.value


def test_a_sweep_runs_under_the_panels_switches_and_rows_go_to_the_inspector():
    sp = SwitchPanel()
    sp.toggles["topk"].value = False
    S.enable("topk")  # changed behind the panel's back: the sweep must still run with TopK off
    sweep = SweepPanel("gemm", shapes="32x32x32\n48x32x64", dtypes="fp32", backends="aten", timer=FAST)
    insp = DispatchInspector()
    sp.attach(sweep)
    insp.attach(sweep)
    seen = []
    sweep.on_row(lambda row: seen.append((S.eager_on("topk"), sp.toggles["rmsnorm"].disabled)))
    sweep.run_button.click()
    assert sweep.wait(WAIT)
    assert seen == [(False, True), (False, True)]  # the panel's choice, controls locked meanwhile
    assert S.eager_on("topk") and not sp.toggles["rmsnorm"].disabled  # as before the sweep
    assert sp.toggles["topk"].value  # the panel shows the live state again
    sections = sweep.widget.children[-1].children
    assert sections[1] is sp.widget and sections[3] is insp.widget
    sweep.row_select.value = 1
    assert (insp.op.value, insp.shape.value, insp.dtype.value, insp.backend.value) == ("gemm", "48x32x64", "fp32", "aten")
    assert not insp.explanation.taken and "FlyDSL GEMM takes fp16/bf16" in insp.verdict.value


# -- dispatch inspector ------------------------------------------------------------------------

def test_inspector_verdict_reasons_and_arch():
    i = DispatchInspector("rmsnorm", "8192x4096", "bf16")
    ex = i.explanation
    assert ex.taken and ex.kernel.startswith("rmsnorm_kernel")
    assert "FlyDSL YES" in i.verdict.value and "device gfx950 with 256 CUs" in i.verdict.value
    assert "_fused_rms_norm_fwd_perf_wins" in i.conditions.value and "forward only" in i.conditions.value
    assert not i.xray_button.disabled and i.message.value == ""
    i.shape.value = "2048x4096"
    assert not i.explanation.taken and i.explanation.call_ok is False
    assert "FlyDSL NO" in i.verdict.value and "needs M &gt;= 8192: M=2048" in i.verdict.value
    assert i.xray_button.disabled and "not eligible on gfx950" in i.xray_status.value
    i.shape.value = "8192x4096"
    i.arch.value = "gfx942"
    assert not i.explanation.taken and "arch gfx942" in i.verdict.value and "need gfx950" in i.verdict.value
    assert not i.xray_button.disabled  # the X-ray is for gfx950, where the call qualifies
    i.arch.value = "this machine"
    assert "not a ROCm build" in i.verdict.value and "this machine, as it is" in i.verdict.value
    ex = i.set_case("gemm", "16x28672x4096:NT", "bf16", "a_offset=3; b_stride=1,4096")
    assert ex is not None and not ex.call_ok
    assert "A storage offset 3 x 2 B is not 16-byte aligned" in i.verdict.value
    i.set_case("topk", "4096x2048x8")
    assert i.dtype.value == "fp32" and i.backend.value == "aten"  # flydsl cannot run here
    assert ("flydsl (unavailable here)", "flydsl") in i.backend.options
    assert "register" in i.verdict.value and i.explanation.arguments["k"] == 8


@pytest.mark.parametrize("edit, expected", [
    (dict(shape="12x"), "malformed rmsnorm shape '12x'"),
    (dict(shape="  "), "type a rmsnorm shape"),
    (dict(options="eps"), "malformed option 'eps'"),
    (dict(options="bogus=1"), "unknown explain option for rmsnorm 'bogus'"),
    (dict(options="x_stride=a,b"), "malformed x_stride 'a,b'"),
])
def test_inspector_invalid_input_is_a_message(edit, expected):
    i = DispatchInspector("rmsnorm")
    for k, v in edit.items():
        getattr(i, k).value = v
    assert expected in i.message.value
    assert i.explanation is None and i.verdict.value == "" and i.xray_button.disabled
    assert not i.run_trace() and expected.split("'")[0] in i.message.value
    assert not i.run_xray() and not i.busy


def test_inspector_bad_cases_from_code_and_rows():
    i = DispatchInspector("gemm")
    assert i.set_case("rmsnorm", "64x64", "int8") is None and "unknown dtype for rmsnorm 'int8'" in i.message.value
    assert i.set_case("conv", "1x1") is None and "unknown operator for the dispatch inspector 'conv'" in i.message.value
    assert i.show_row({"op": "attention", "case": "b1xh8xs128xd64", "dtype": "bf16"}) is None
    assert "attention is not one of them" in i.message.value
    with pytest.raises(UsageError, match="unknown operator for the dispatch inspector 'conv'"):
        DispatchInspector("conv")


def test_inspector_runs_traced_on_the_cpu_and_says_so():
    i = DispatchInspector("topk", "256x1024x8", "fp32")
    assert i.run_trace() and i.wait(WAIT)
    r = i.trace_result
    assert r["status"] == "ok" and r["backend"] == "aten"
    tr = r["trace"]
    assert tr.device == "cpu" and tr.kernels == () and list(tr.family_frame()["family"]) == ["ATen native"]
    v = i.trace_view.value
    assert "no device kernels" in v and "aten::topk" in v and "ATen native" in v and "by family" in v
    assert "trace done" in i.message.value and not i.trace_button.disabled
    i.backend.value = "flydsl"
    assert i.run_trace() and i.wait(WAIT)
    assert i.trace_result["status"] == "unavailable"
    assert "unavailable: torch" in i.trace_view.value and "not ROCm" in i.trace_view.value


@pytest.mark.slow
def test_xray_button_fills_the_resource_view():
    """One real compile-only build of the FlyDSL RMSNorm kernel for gfx950 (a few seconds)."""
    i = DispatchInspector("rmsnorm", "8192x4096", "bf16")
    assert not i.xray_button.disabled, i.xray_status.value
    i.xray_button.click()
    assert i.busy and i.xray_button.disabled and "compiling rmsnorm 8192x4096 bf16 for gfx950" in i.xray_status.value
    assert not i.run_trace() and "running" in i.message.value  # one job at a time
    assert i.wait(WAIT)
    x = i.xray_result
    assert x is not None and x.eligible and x.error is None and len(x.kernels) == 1
    k = x.kernels[0]
    assert k.name.startswith("rmsnorm_kernel") and k.resources.vgprs_total > 0
    v = i.xray_view.value
    assert k.name in v and "vgprs_total" in v and "waves_per_simd" in v
    assert f"<td>{k.resources.vgprs_total}</td>" in v and f"<td>{k.resources.lds_bytes}</td>" in v
    assert "ELIGIBLE" in i.xray_status.value and "nothing was run" in i.xray_status.value
    assert "X-ray done" in i.message.value and not i.xray_button.disabled


def test_inspector_says_why_there_is_no_xray(monkeypatch):
    """Where the X-ray cannot run (the H200 machine: torch 2.11, no flydsl, no lld-22)."""
    from flyexplore.insight import xray as XR

    monkeypatch.setattr(XR, "unavailable_reason", lambda: "AMDGPU-capable ld.lld: no ld.lld found")
    i = DispatchInspector("rmsnorm", "8192x4096", "bf16")
    assert i.explanation.taken and i.xray_button.disabled and "no ld.lld found" in i.xray_status.value
    assert not i.run_xray() and not i.busy
    assert "no X-ray for this case: the kernel X-ray cannot run here: AMDGPU-capable ld.lld" in i.message.value
