"""FlyDSL switches on the installed torch 2.15 (CUDA wheel, CPU machine): the python_native
filter sets, the Inductor settings and the SDPA flags really change, and every context
restores exactly what it found."""
from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.backends.python_native as pn  # noqa: E402
from torch._inductor import config as ic  # noqa: E402

from flyexplore.world import switches as S  # noqa: E402
from flyexplore.errors import UsageError  # noqa: E402


def test_table_lists_every_switch_with_its_mechanism():
    df = S.table()
    assert list(df["op"]) == list(S.OPS)
    assert set(df.columns) == {"op", "mechanism", "setting", "flydsl", "exists", "effective", "note"}
    row = df.set_index("op")
    # torch 2.15 has both mechanisms; this CUDA build cannot use them.
    assert row.loc["rmsnorm", "exists"] and not row.loc["rmsnorm", "effective"]
    assert "python_native" in row.loc["rmsnorm", "mechanism"]
    assert row.loc["gemm", "exists"] and "max_autotune_gemm_backends" in row.loc["gemm", "setting"]
    assert "grouped_gemm" in row.loc["gemm", "note"]          # the shared setting is said
    assert row.loc["attention", "flydsl"] == "n/a"              # not a ROCm build
    text = S.text()
    for op in S.OPS:
        assert op in text


def test_eager_switch_per_operator_and_exact_restore():
    before = S.snapshot()
    with S.flydsl("rmsnorm", enabled=False):
        assert pn.is_operation_disabled("_fused_rms_norm")
        assert not pn.is_operation_disabled("topk")
        assert not S.eager_on("rmsnorm") and S.eager_on("topk")
        assert S.table().set_index("op").loc["rmsnorm", "flydsl"] == "off"
    assert S.snapshot() == before
    assert not pn.is_operation_disabled("_fused_rms_norm")


def test_enabling_one_op_under_a_disabled_dsl_keeps_the_other_off():
    with pn.flydsl.disabled():
        inside = S.snapshot()
        assert not S.eager_on("rmsnorm") and not S.eager_on("topk")
        with S.flydsl("rmsnorm"):
            assert pn.flydsl.enabled
            assert S.eager_on("rmsnorm") and not S.eager_on("topk")
            assert pn.is_operation_disabled("topk") and pn.is_operation_disabled("topk.values")
        assert S.snapshot() == inside
        assert not pn.flydsl.enabled


def test_nested_contexts_and_exceptions_restore_exactly():
    before = S.snapshot()
    with pytest.raises(RuntimeError):
        with S.flydsl(enabled=False):
            mid = S.snapshot()
            with S.flydsl("gemm", "topk", enabled=True, autotuning=True, search_space="EXHAUSTIVE"):
                assert S.compile_on() and S.eager_on("topk") and not S.eager_on("rmsnorm")
                with S.sdpa(["math"], rocm_fa_library="ck"):
                    assert not torch.backends.cuda.flash_sdp_enabled()
                    assert torch.backends.cuda.math_sdp_enabled()
                    raise RuntimeError("boom")
            assert S.snapshot() == mid
    assert S.snapshot() == before


def test_compile_switch_sets_the_inductor_settings():
    before = S.snapshot()
    with S.flydsl("grouped_gemm", autotuning=True, search_space="exhaustive"):
        assert "FLYDSL" in ic.max_autotune_gemm_backends.upper().split(",")
        assert ic.max_autotune or ic.max_autotune_gemm
        assert ic.flydsl_enable_autotuning is True
        assert ic.max_autotune_gemm_search_space == "EXHAUSTIVE"
        states = S.table().set_index("op")["flydsl"]
        assert states["gemm"] == states["grouped_gemm"] == states["scaled_gemm"] == "on"
        with S.flydsl("gemm", enabled=False):
            assert "FLYDSL" not in ic.max_autotune_gemm_backends.upper()
            assert S.table().set_index("op").loc["scaled_gemm", "flydsl"] == "off"
    assert S.snapshot() == before


def test_disable_leaves_aten_when_flydsl_was_the_only_backend():
    with ic.patch(max_autotune_gemm_backends="FLYDSL"):
        with S.flydsl("gemm", enabled=False):
            assert ic.max_autotune_gemm_backends == "ATEN"
        assert ic.max_autotune_gemm_backends == "FLYDSL"


def test_plain_calls_change_state(monkeypatch):
    before = S.snapshot()
    try:
        S.disable("topk")
        assert pn.is_operation_disabled("topk")
        S.enable("topk")
        assert not pn.is_operation_disabled("topk")
    finally:
        S.restore(before)
    assert S.snapshot() == before


def test_attention_on_a_cuda_build_says_it_cannot():
    with pytest.warns(S.SwitchUnavailableWarning, match="not a ROCm build"):
        with S.flydsl("attention"):
            pass
    with pytest.raises(S.SwitchUnavailable):
        S.enable("attention", strict=True)


def test_sdpa_context_and_bad_names():
    before = S.snapshot()
    with S.sdpa(["flash", "efficient"]):
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert not torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.cudnn_sdp_enabled()
    assert S.snapshot() == before
    with pytest.raises(UsageError, match="unknown SDPA backend 'fast'"):
        with S.sdpa(["fast"]):
            pass
    with pytest.raises(UsageError, match="unknown FlyDSL switch 'conv'"):
        S.enable("conv")
    with pytest.raises(UsageError, match="search space"):
        S.enable("gemm", search_space="HUGE")
    assert S.snapshot() == before


def test_missing_python_native_is_reported_not_faked(monkeypatch):
    """torch 2.11 has no torch.backends.python_native: the switch says so; 'on' warns or
    raises, 'off' is silently true."""
    monkeypatch.setattr(S, "python_native", lambda: None)  # where torch is asked
    row = S.table().set_index("op").loc["rmsnorm"]
    assert not row["exists"] and row["flydsl"] == "n/a" and "python_native" in row["note"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S.disable("rmsnorm")
    with pytest.warns(S.SwitchUnavailableWarning, match="python_native"):
        S.enable("rmsnorm")
    with pytest.raises(S.SwitchUnavailable):
        S.enable("topk", strict=True)


def test_missing_inductor_templates_are_reported(monkeypatch):
    from flyexplore.world import readiness as R
    real = R.has_module
    monkeypatch.setattr(R, "has_module", lambda name: False if "codegen.flydsl" in name else real(name))
    before = ic.max_autotune_gemm_backends
    with pytest.warns(S.SwitchUnavailableWarning, match="no FlyDSL Inductor templates"):
        S.enable("gemm")
    assert ic.max_autotune_gemm_backends == before
    assert S.table().set_index("op").loc["gemm", "flydsl"] == "n/a"


def test_op_backends_use_the_switches():
    """The catalogue's aten/flydsl backends of RMSNorm and TopK switch their own op."""
    from flyexplore.world.env import collect
    from flyexplore.ops import get_op
    from flyexplore.ops.base import RunContext

    ctx = RunContext(torch.device("cpu"), collect())
    before = S.snapshot()
    rms, topk = get_op("rmsnorm"), get_op("topk")
    with rms.get_backend("aten").context(ctx, rms.case("64x64")):
        assert not S.eager_on("rmsnorm") and S.eager_on("topk")
        assert not torch._native.aot_enabled()          # stock ATen, as flydsl.disabled() does
    with topk.get_backend("aten").context(ctx, topk.case("64x64x4:deterministic=1")):
        assert not S.eager_on("topk") and S.eager_on("rmsnorm")
        assert torch.are_deterministic_algorithms_enabled()
    assert S.snapshot() == before


def test_compile_options():
    o = S.compile_options(True, autotuning=True, backends="ATEN,TRITON")
    assert o["max_autotune_gemm_backends"] == "ATEN,TRITON,FLYDSL" and o["max_autotune"]
    assert o["flydsl_enable_autotuning"] is True
    assert S.compile_options(False, backends="FLYDSL")["max_autotune_gemm_backends"] == "ATEN"


# -- whole settings (what the switch panel holds) -----------------------------------------------

def test_settings_round_trip_apply_and_using_restore():
    before = S.snapshot()
    now = S.settings()
    assert set(now.flydsl) == {"gemm", "grouped_gemm", "scaled_gemm", "rmsnorm", "topk"}  # no attention here
    assert now.rocm_fa_library is None and now.search_space in ("DEFAULT", "EXHAUSTIVE")
    assert S.unavailable().keys() == {"attention", "rocm_fa_library"}
    want = S.SwitchSettings({"gemm": True, "grouped_gemm": True, "scaled_gemm": True, "rmsnorm": False, "topk": True},
                      autotuning=True, search_space="exhaustive", sdpa_backends=("flash", "math"))
    with S.using(want) as snap:
        assert snap == before
        assert S.compile_on() and not S.eager_on("rmsnorm") and S.eager_on("topk")
        assert ic.flydsl_enable_autotuning is True and ic.max_autotune_gemm_search_space == "EXHAUSTIVE"
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.mem_efficient_sdp_enabled()
        got = S.settings()
        assert got.flydsl == want.flydsl and got.sdpa_backends == ("flash", "math")
    assert S.snapshot() == before
    try:
        S.apply_settings(want)
        assert S.settings().flydsl["rmsnorm"] is False
        S.apply_settings(now)
        assert S.settings() == now
    finally:
        S.restore(before)


def test_settings_are_checked_before_anything_changes():
    before = S.snapshot()
    with pytest.raises(UsageError, match="share one torch setting"):
        S.apply_settings(S.SwitchSettings({"gemm": True, "scaled_gemm": False, "topk": False}))
    with pytest.raises(UsageError, match="unknown SDPA backend 'fast'"):
        S.apply_settings(S.SwitchSettings({"topk": False}, sdpa_backends=("fast",)))
    with pytest.raises(UsageError, match="unknown FlyDSL switch 'conv'"):
        with S.using(S.SwitchSettings({"conv": True})):
            pass
    assert S.snapshot() == before


def test_plain_sdpa_and_compile_settings():
    before = S.snapshot()
    try:
        S.set_sdpa(["efficient"])
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
        S.set_compile_settings(autotuning=True)
        assert ic.flydsl_enable_autotuning is True and "FLYDSL" not in ic.max_autotune_gemm_backends  # on/off untouched
        with pytest.raises(UsageError, match="ROCm flash-attention library"):
            S.set_sdpa(rocm_fa_library="triton")
        with pytest.raises(UsageError, match="search space"):
            S.set_compile_settings(search_space="HUGE")
    finally:
        S.restore(before)
    assert S.snapshot() == before


def test_a_registered_operator_gets_a_switch():
    """The switch tables come from the registry: an operator registered with an eager
    FlyDSLPath is in OPS / EAGER_OPS / EAGER_MODULES and the table, and its override's absence
    from this torch is said, not faked."""
    from flyexplore.ops import FlyDSLPath, Operator, register_op, unregister_op

    toy = Operator("toy_norm", "a toy eager operator", ("n",), {}, ("fp32",),
                   flydsl=FlyDSLPath(route="eager", path="eager override of aten::my_op", aten_ops=("my_op",),
                                     module="torch._native.ops.no_such_flydsl_impl"))
    assert "toy_norm" not in S.OPS
    register_op(toy)
    try:
        assert S.OPS[-1] == "toy_norm" and S.EAGER_OPS["toy_norm"] == ("my_op",)
        assert S.EAGER_MODULES["toy_norm"] == "torch._native.ops.no_such_flydsl_impl"
        assert "toy_norm" not in S.COMPILE_OPS
        row = S.table().set_index("op").loc["toy_norm"]
        assert row["flydsl"] == "n/a" and "no_such_flydsl_impl" in row["note"]
        assert "toy_norm" in S.unavailable()
        with pytest.warns(S.SwitchUnavailableWarning, match="toy_norm"):
            S.enable("toy_norm")
    finally:
        unregister_op("toy_norm")
    assert "toy_norm" not in S.OPS and "toy_norm" not in S.EAGER_OPS
