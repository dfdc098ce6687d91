"""Issue 20: the timing modes as one table (flyexplore.measure.modes) that Timer, measure_interleaved,
the spec and `flyexplore sweep --help` all read; the SAME band and its default in one place."""
import contextlib
import inspect
import io

import pytest

from flyexplore.errors import UsageError
from flyexplore.measure import modes as M
from flyexplore.measure import stats as S
from flyexplore.measure.interleaved import _measure_interleaved, measure_interleaved
from flyexplore.measure.timing import Timer
from flyexplore.run.spec import TIMER_OPTIONS, SweepSpec, timer_keys


def _refused(call) -> str | None:
    try:
        call()
    except UsageError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("mode", [m.name for m in M.TABLE] + ["fast"])
def test_both_timers_take_exactly_the_modes_the_table_gives_them(mode):
    row = {m.name: m for m in M.TABLE}.get(mode)
    on_cpu = row is not None and row.device != "gpu"
    # block order: Timer; construction alone checks the mode
    err = _refused(lambda: Timer(lambda: None, "cpu", mode=mode))
    assert (err is None) == (on_cpu and "block" in row.orders), err
    # interleaved order: a two-round measurement when the mode is valid on the CPU
    err = _refused(lambda: measure_interleaved({"a": lambda: None}, "cpu", mode=mode, min_rounds=2,
                                               max_rounds=2, warmup_rounds=1, calls_per_round=1))
    assert (err is None) == (on_cpu and "interleaved" in row.orders), err
    # the spec says the same for a CPU sweep
    for order in M.ORDERS:
        err = _refused(lambda: SweepSpec("gemm", shapes="8x8x8", order=order, timer={"mode": mode}, device="cpu"))
        assert (err is None) == (on_cpu and order in row.orders), (order, err)


def test_check_names_the_mode_and_what_to_use_instead():
    assert M.check("kernel", "block", gpu=True) == "kernel"
    with pytest.raises(UsageError, match=r"^unknown timing mode 'fast' \(valid: auto, cpu-thread, cpu-wall, "
                                         r"event-gated, event, kernel\)$"):
        M.check("fast", "interleaved")
    with pytest.raises(UsageError, match=r"^timing mode 'event-gated' works in interleaved order only "
                                         r"\(valid in block order: auto, cpu-thread, cpu-wall, event, graph, kernel\)$"):
        M.check("event-gated", "block")
    with pytest.raises(UsageError, match=r"^timing mode 'cpu-wall' is for the CPU; on a GPU use auto, "
                                         r"event-gated, event or kernel$"):
        M.check("cpu-wall", "interleaved", gpu=True)
    with pytest.raises(UsageError, match=r"^unknown order 'zigzag'"):
        M.names("zigzag")


def test_auto_is_one_entry_per_order_and_device():
    assert M.effective("auto", "interleaved", gpu=True) == "event-gated"
    assert M.effective("auto", "block", gpu=True) == "kernel"
    assert M.effective("auto", "block", gpu=False) == M.effective("auto", "interleaved", gpu=False) == "cpu-thread"
    assert M.effective("cpu-thread", "block", gpu=False, custom_clock=True) == "cpu-wall"
    assert Timer(lambda: None, "cpu", rep=3, warmup=1).measure().mode == M.AUTO["block"]["cpu"]
    ticks = iter(range(10 ** 6))
    m = _measure_interleaved({"a": lambda: None}, "cpu", min_rounds=2, max_rounds=2, warmup_rounds=1,
                             calls_per_round=1, clock=lambda: next(ticks) * 1e-6)
    assert m.measurements["a"].mode == "cpu-wall"  # a custom clock stands for wall time


def test_the_timer_options_match_the_timers_keywords():
    timer_kw = [p for p in inspect.signature(Timer.__init__).parameters if p not in ("self", "fn", "device")]
    assert sorted(timer_keys("block")) == sorted(timer_kw)
    inter_kw = set(inspect.signature(_measure_interleaved).parameters)
    # rep, warmup and rep_ms are translated (flyexplore.run.spec.interleaved_kwargs); the rest pass on
    assert set(timer_keys("interleaved")) - {"rep", "warmup", "rep_ms"} <= inter_kw
    assert set(TIMER_OPTIONS) == set(timer_keys("block")) | set(timer_keys("interleaved"))


def test_sweep_help_lists_the_table_and_the_band_default(monkeypatch):
    from flyexplore.cli import main

    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps the options' help to the terminal

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main(["sweep", "--help"])
    h = buf.getvalue()
    assert M.listing() in h
    for m in M.TABLE:
        assert m.meaning in h, m.name
    assert " | ".join(M.names("interleaved")) in h and M.auto_text() in h
    assert f"(default {S.BAND:g} = ±{S.BAND:.0%})" in h


def test_the_band_has_one_default():
    from flyexplore.run.cases import measure_case, run_case

    for f in (S.verdict, measure_case, run_case):
        assert inspect.signature(f).parameters["band"].default is S.BAND, f
    assert SweepSpec("gemm", shapes="8x8x8").band is S.BAND
