"""Issue 43: one case driver for every place a case runs (in-process, a sweep worker, ``--processes``,
an environment A/B's workers), ``--pairs auto`` (pairs until decided, with the correction for
looking again), a decode model step under ``--aa``, and the real cause of differing input digests."""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest
import torch

import flyexplore as fx
from flyexplore.measure import stats as S
from flyexplore.run import driver as D
from flyexplore.run import envab
from flyexplore.run.processes import PassRule
from flyexplore.run.spec import SweepSpec
from tests.run.test_model_step import FAST_TIMER, _cfg

#: Columns only an environment A/B's rows have (its environments, its pairs, the check across them).
AB_ONLY = {"env", "env_python", "env_changes", "inputs_digest", "cross_env_err_rel", "cross_env_ok",
           "cross_env_note", "turn_overhead_ms", "pairs_stop", "pairs_needed", "processes", "process_estimates"}
#: Columns only rows combined over fresh processes or pairs have.
PASS_ONLY = {"processes", "process_estimates"}
#: Filled only where a row is compared with its baseline in the same rounds and the label was decided
#: within them (the wall time to that decision): the A/A's copy, when its interval settled in time.
DECIDED_ONLY = {"verdict_s"}


def _filled(row) -> set:
    return {k for k, v in row.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}


#: What every model-step sweep here shares (its cases: :func:`model_aa`).
MODEL_KW = dict(dtypes="fp32", backends="eager", timer=FAST_TIMER, progress=False, device="cpu")


@pytest.fixture(scope="module")
def model_aa(tmp_path_factory):
    """One A/A (one pair of workers) of a model step's prefill and decode cases, shared by the tests
    that read it: ``(prefill label, decode label, rows)``; the other places run the same prefill."""
    cfg = _cfg(tmp_path_factory.mktemp("model"))
    prefill, decode = f"2x16:model={cfg},layers=1", f"2x16:model={cfg},decode,layers=1"
    df = fx.sweep("model", shapes=f"{prefill};{decode}", aa=True, pairs=1, **MODEL_KW)
    return prefill, decode, df


@pytest.mark.slow
def test_the_same_case_gives_the_same_columns_and_timing_mode_wherever_it_runs(model_aa):
    """A model step (the family with a breakdown, a timing mode and no fresh recheck) run in this
    process, in a sweep worker, in two fresh processes and under an A/A: one driver, so the same
    columns are filled and the same timing mode is used everywhere."""
    prefill, _, aa = model_aa
    kw = dict(shapes=prefill, **MODEL_KW)
    got = {"in-process": fx.sweep("model", engine="in-process", **kw).iloc[0].to_dict(),
           "worker": fx.sweep("model", workers=1, **kw).iloc[0].to_dict(),
           "processes": fx.sweep("model", processes=2, **kw).iloc[0].to_dict()}
    aa = aa[aa["case"] == prefill]
    got["aa"] = aa[aa["backend"] == aa["baseline"].iloc[0]].iloc[0].to_dict()
    ref = _filled(got["in-process"]) - {"worker"}
    assert {"breakdown", "timing_mode", "samples_ms", "stop_reason", "first_call_ms"} <= ref
    for where, row in got.items():
        assert row["status"] == "ok", (where, row.get("message"))
        assert row["timing_mode"] == "cpu-thread", where
        assert json.loads(row["breakdown"])["rows"], where           # the family's breakdown, everywhere
        assert "recheck_ok" not in _filled(row), where               # fresh_recheck=False, everywhere
        missing = ref - _filled(row)
        assert not missing, (where, missing)
        extra = _filled(row) - ref - AB_ONLY - PASS_ONLY - DECIDED_ONLY - {"worker", "peak_mem_bytes"}
        assert not extra, (where, extra)


@pytest.mark.slow
def test_a_vs_a_of_one_model_step_never_reads_faster_or_slower(model_aa):
    """The same variant in two worker processes taking turns (the environment A/B's A/A): SAME or
    AMBIGUOUS, never FASTER/SLOWER -- and a whole step, prefill or decode, takes the A/B as any case
    does (moved here from ``test_model_step.py``: the A/A the tests here run anyway)."""
    prefill, decode, df = model_aa
    for case in (prefill, decode):
        ok = df[(df["case"] == case) & (df["status"] == "ok")]
        assert len(ok) == 2, df[["case", "backend", "status", "message"]]
        assert set(ok["verdict"].dropna()) <= {"SAME", "AMBIGUOUS"}, ok[["backend", "verdict", "speedup_lo",
                                                                         "speedup_hi"]]


def test_a_gpu_case_takes_the_familys_timing_mode_in_process_and_under_an_ab(tmp_path):
    """The family's ``timing_mode`` (the model step: ``event``, its launch gaps counted) is chosen
    by one rule for the in-process driver and the A/B's Setup; an asked-for mode wins."""
    from flyexplore.ops import get_op

    model, gemm = get_op("model"), get_op("gemm")
    assert D.how_for(model, {}, gpu=True) == ("event", {})
    assert D.how_for(gemm, {}, gpu=True)[0] == "event-gated"
    assert D.how_for(model, {"mode": "event-gated", "min_rounds": 3}, gpu=True) == ("event-gated", {"min_rounds": 3})
    assert D.how_for(model, {}, gpu=False)[0] == "cpu-thread"
    spec = SweepSpec("model", shapes=f"1x8:model={_cfg(tmp_path)}", dtypes="fp32", backends="eager", aa=True,
                     device="cpu")
    st = envab.setup_of(spec, torch.device("cuda", 0), str(tmp_path))
    assert st.how == "event" and not st.mode_fixed


@pytest.mark.slow
def test_a_decode_step_runs_under_aa_with_its_breakdown_and_its_logits_compared(model_aa):
    """A decode step's output holds its KV cache: what crosses to the other environment is the
    logits (the family's ``check_output``), so the A/A runs, checks its logits across environments,
    and keeps the family's breakdown (before: ``UnpicklingError: Weights only load failed``)."""
    _, decode, df = model_aa
    df = df[df["case"] == decode]
    assert len(df) == 2
    assert (df["status"] == "ok").all(), df[["backend", "status", "message"]]
    other = df[df["env"].str.endswith("-aa")].iloc[0]
    assert other["cross_env_ok"] and other["cross_env_err_rel"] == 0.0
    assert other["inputs_digest"] == df[~df["env"].str.endswith("-aa")].iloc[0]["inputs_digest"]
    assert df["breakdown"].map(lambda b: bool(json.loads(b)["rows"])).all()
    # (its label is not checked: one pair of CPU workers can carry a per-process offset, issue 45)


def test_the_checked_output_of_a_step_is_its_logits_as_cpu_tensors():
    from flyexplore.ops import get_op
    from flyexplore.run.place import checked_tensors

    out = types.SimpleNamespace(logits=torch.ones(2, 1, 8), past_key_values=object())
    got = checked_tensors(get_op("model"), out)
    assert len(got) == 1 and got[0].shape == (2, 1, 8) and got[0].device.type == "cpu"
    assert [t.shape for t in checked_tensors(get_op("gemm"), (torch.ones(2), {"b": torch.zeros(3)}))] == [(2,), (3,)]


# -- --pairs auto ---------------------------------------------------------------------------------------

def _pass_rows(speedups, arms=("w@A", "w@B"), se=0.002):
    """``{pass: {arm: row}}`` of an A/B whose B arm read ``speedups`` in its pairs (A: the base)."""
    out = {}
    for k, sp in enumerate(speedups):
        half = math.exp(1.96 * se)
        out[k] = {arms[0]: {"status": "ok", "time_ms": 1.0, "time_ci_lo_ms": 0.99, "time_ci_hi_ms": 1.01,
                            "backend": arms[0], "message": None},
                  arms[1]: {"status": "ok", "time_ms": 1.0 / sp, "time_ci_lo_ms": 0.99 / sp,
                            "time_ci_hi_ms": 1.01 / sp, "speedup": sp, "speedup_lo": sp / half,
                            "speedup_hi": sp * half, "backend": arms[1], "message": None}}
    return out


def test_auto_pairs_split_the_error_rate_over_their_looks():
    rule = PassRule(3, 10, 0.01, "cuda")                             # 8 looks: after pairs 3, 4, ..., 10
    per = [1 - rule.confidence_at(n) for n in range(3, 11)]
    assert per[0] == pytest.approx(0.025) and sum(per) == pytest.approx(0.05)   # the union bound: 5% in all
    assert rule.confidence == pytest.approx(1 - 0.025 / 7)
    assert PassRule(3, 3, 0.01, "cuda", auto=False).confidence_at(3) == 0.95
    assert rule.text() == "3-10 auto"


def test_auto_pairs_add_a_pair_while_a_real_effect_is_ambiguous_and_stop_once_decided():
    """The issue's numbers: a 3% effect whose three pairs scatter is AMBIGUOUS at three pairs; more
    pairs on the same side decide it SLOWER; an A/A that agrees stops at three, SAME."""
    arms = ("w@A", "w@B")
    rule = PassRule(3, 10, 0.01, "cuda")
    three = _pass_rows([0.96, 0.985, 0.972])
    assert rule.wants(three, arms)                                   # undecided at the corrected confidence
    eight = _pass_rows([0.96, 0.985, 0.972, 0.968, 0.975, 0.97, 0.966, 0.98])
    got = rule.final_rows(eight, arms)["w@B"]
    assert not rule.wants(eight, arms) and got["verdict"] == "SLOWER" and got["pairs_stop"] == "decided"
    assert got["processes"] == 8 and "99.643% interval" in got["ci_method"]
    same = _pass_rows([1.0005, 0.9995, 1.0002])
    assert not rule.wants(same, arms) and rule.final_rows(same, arms)["w@B"]["verdict"] == "SAME"
    assert rule.done(_pass_rows([1.0, 1.0]), arms) == 2 and rule.wants(_pass_rows([1.0, 1.0]), arms)


def test_a_case_left_ambiguous_says_how_many_pairs_would_decide_it():
    arms = ("w@A", "w@B")
    rule = PassRule(3, 4, 0.01, "cpu")
    wide = _pass_rows([0.36, 0.56, 0.64, 0.9])    # the loaded-CPU 2x slowdown and one more pair
    row = rule.final_rows(wide, arms)["w@B"]
    assert row["pairs_stop"] in ("max_pairs", "unreachable") and row["verdict"] == "AMBIGUOUS"
    sd = S.pair_spread([0.36, 0.56, 0.64, 0.9])
    assert row["pairs_needed"] == S.pairs_to_decide(sd, 0.01, confidence=rule.confidence) > 4
    assert f"would need about {int(row['pairs_needed'])} pairs to decide a change of 1%" in row["message"]
    # a spread no cap reaches: stopped before the cap, said so
    far = PassRule(3, 10, 0.01, "cpu")
    assert far.stop(_pass_rows([0.8, 1.2, 1.0]), arms) == "unreachable"


def test_the_fixed_count_is_one_look_at_95_percent():
    arms = ("w@A", "w@B")
    rule = PassRule(3, 3, 0.01, "cuda", auto=False)
    rows = _pass_rows([0.96, 0.985, 0.972])
    assert not rule.wants(rows, arms) and rule.final_rows(rows, arms)["w@B"]["pairs_stop"] == "fixed"
    assert "95% interval" in rule.final_rows(rows, arms)["w@B"]["ci_method"]


def test_a_simulated_aa_never_reads_faster_or_slower_over_many_sequential_runs():
    """The correction holds its promise: 400 simulated A/As, each pair's log ratio drawn with a
    spread of 1% (a per-pair offset as the CPU shows, well past the 1% band's half), run through
    the auto rule up to 10 pairs: no FASTER or SLOWER beyond what 5% allows (binomial: < 30)."""
    rng = np.random.default_rng(7)
    arms = ("w@A", "w@B")
    rule = PassRule(3, 10, 0.01, "cpu")
    false = 0
    for _ in range(400):
        sp = list(np.exp(rng.normal(0.0, 0.01, size=10)))
        n = 3
        while rule.wants(_pass_rows(sp[:n]), arms):
            n += 1
        false += rule.final_rows(_pass_rows(sp[:n]), arms)["w@B"]["verdict"] in ("FASTER", "SLOWER")
    assert false < 30, false


@pytest.mark.slow
def test_on_the_cpu_a_2x_slowdown_under_auto_pairs_fails_the_gate(tmp_path):
    """``--pairs auto`` on real workers, capped (``--max-pairs``: on a loaded machine it would
    otherwise start up to 10 pairs): the 2x slowdown with its one look at 3 pairs (the gate fails
    on SLOWER or on AMBIGUOUS). The A/A under ``--pairs auto``, with a second look at 4 pairs (each
    look at the confidence corrected for looking again), is the second-venv A/A of
    tests/run/test_envab.py: one A/A run for both."""
    ab = tmp_path / "ab.parquet"
    r = fx.sweep("ab_ops:SLOW", shapes="4096", dtypes="fp32", backends="work", envs=["A", "B:AB_SLOWDOWN=1.0"],
                 max_pairs=3, out=ab, progress=False)
    b = r[r["backend"] == "work@B"].iloc[0]
    assert b["processes"] >= 3 and b["pairs_stop"] in ("decided", "max_pairs", "unreachable")
    from flyexplore.cli import main

    rc = main(["compare", str(ab), "--fail-on", "SLOWER:5%,AMBIGUOUS:5%"])
    assert rc == 1, b[["speedup", "speedup_lo", "speedup_hi", "verdict", "processes"]].to_dict()


# -- input digests that differ: the real cause named ------------------------------------------------------

def test_differing_input_digests_name_the_real_cause():
    def place(name, torch_v="2.15.0", git="abc", env=None):
        return types.SimpleNamespace(name=name, info={"versions": {"torch": torch_v, "torch_git": git},
                                                      "env_vars": env or {}})

    assert "different torch builds (torch 2.15.0 vs 2.16.0" in D.digest_cause(
        [place("A"), place("B", "2.16.0", "def")], "B", "A")
    assert "set CUBLAS_WORKSPACE_CONFIG differently" in D.digest_cause(
        [place("A"), place("B", env={"CUBLAS_WORKSPACE_CONFIG": ":0:0"})], "B", "A")
    assert "not fully seeded" in D.digest_cause([place("A"), place("A-aa")], "A-aa", "A")


def test_an_input_digest_does_not_read_object_addresses():
    """A decode step's inputs hold its KV cache object and a rewind callable, whose default repr
    carries an address that differs between processes: the digest leaves addresses out."""
    from flyexplore.run import build as B

    class Cache:
        pass

    x = torch.arange(4.0)
    a = B.inputs_digest({"x": x, "kwargs": {"cache": Cache(), "rewind": lambda: None}})
    b = B.inputs_digest({"x": x.clone(), "kwargs": {"cache": Cache(), "rewind": lambda: None}})
    assert a == b
    assert a != B.inputs_digest({"x": x + 1, "kwargs": {"cache": Cache(), "rewind": lambda: None}})


def test_the_next_pass_s_pair_is_launched_while_a_pass_measures_and_an_unused_spare_is_stopped(monkeypatch):
    """Fast pair starts: pass k+1's workers are launched before pass k runs its first case, and
    pass k+1 only waits for what is left of their start; a spare that no pass needs is stopped."""
    events = []

    class FakePair:
        def __init__(self, st, label):
            self.label, self.workers, self.start_s, self.failed_starts = label, [], 0.0, []

        def launch(self):
            events.append(("launch", self.label))

        def ready(self):
            events.append(("ready", self.label))

        def start(self):
            self.launch()
            self.ready()

        def stop(self):
            events.append(("stop", self.label))

    def fake_run_case(pair, case, dtype, st, sampler, clock):
        events.append(("case", pair.label, case.label))
        sp = 0.98 if case.label == "slow" else 1.0
        return {"w@A": {"status": "ok", "time_ms": 1.0, "time_ci_lo_ms": 0.999, "time_ci_hi_ms": 1.001},
                "w@B": {"status": "ok", "time_ms": 1.0 / sp, "time_ci_lo_ms": 0.999 / sp, "time_ci_hi_ms": 1.001 / sp,
                        "speedup": sp, "speedup_lo": sp * 0.999, "speedup_hi": sp * 1.001}}, False

    monkeypatch.setattr(envab, "Pair", FakePair)
    monkeypatch.setattr(envab, "run_case", fake_run_case)
    monkeypatch.setattr(envab, "env_columns", lambda st, a: {})
    st = types.SimpleNamespace(pairs=2, max_pairs=2, band=0.01, auto=False, arm_names=lambda: ["w@A", "w@B"],
                               start_s=[], failed_starts=[])
    work = [(types.SimpleNamespace(label=lab), "fp32") for lab in ("slow", "same")]
    finals = []
    make_row = lambda case, dtype, a, cols, info: {**cols, "backend": a, "case": case.label}  # noqa: E731
    problems = envab.run_passes(st, work, {}, first_pair=None, make_row=make_row, add_passes=lambda rows: None,
                                add_final=lambda c, d, a, row: finals.append((c.label, a)), sampler=None, bar=None)
    assert problems == []
    first_case = events.index(("case", "pair1", "slow"))
    assert events.index(("launch", "pair2")) < first_case            # the spare launched before pass 1 measured
    assert events.index(("ready", "pair2")) > events.index(("case", "pair1", "same"))   # waited for in pass 2 only
    assert [e for e in events if e[0] == "case"] == [("case", "pair1", "slow"), ("case", "pair1", "same"),
                                                     ("case", "pair2", "same"), ("case", "pair2", "slow")]
    assert sorted(finals) == [("same", "w@A"), ("same", "w@B"), ("slow", "w@A"), ("slow", "w@B")]
    assert events.count(("launch", "pair3")) == 0                    # no pass 3: no spare for it
    # --pairs auto where the first look (3 pairs) decides every label: the spare launched for pass 4 is
    # stopped, unused (one pair never decides: its interval carries the per-process floor, issue 45)
    events.clear()
    st.auto, st.pairs, st.max_pairs = True, 3, 5
    envab.run_passes(st, work, {}, first_pair=None, make_row=make_row, add_passes=lambda rows: None,
                     add_final=lambda c, d, a, row: None, sampler=None, bar=None)
    assert ("launch", "pair4") in events and ("ready", "pair4") not in events and ("stop", "pair4") in events
    assert {e[1] for e in events if e[0] == "case"} == {"pair1", "pair2", "pair3"}
