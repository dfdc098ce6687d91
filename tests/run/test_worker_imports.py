"""What a worker imports before it measures: reading the environment and running an eager case
import neither Dynamo nor Inductor (1.8 and 1.6 CPU-s a process, half of an A/B worker's start on
the 2-core machine), while the answers stay torch's own: ``has_module`` agrees with
``importlib.util.find_spec``, and a process that compiled still has Dynamo reset between cases."""
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from flyexplore.world import readiness as R

NAMES = ["torch._inductor.codegen.flydsl", "torch._inductor.codegen.flydsl.flydsl_utils",
         "torch._inductor.codegen.no_such", "torch.nn.functional", "torch._native", "torch",
         "flydsl", "no_such_top.sub", "json.decoder", "torch.nn.functional.not_a_package"]


def _find_spec(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter (this checkout and tests/ on its path); its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


@pytest.mark.slow
def test_has_module_agrees_with_find_spec_and_imports_no_parent():
    """In a fresh process (nothing of Inductor imported): the same answers as ``find_spec``,
    asked afterwards in this process, where ``find_spec`` imports the parents."""
    got = _fresh("import sys, json; import torch; from flyexplore.world import readiness as R; "
                 f"print(json.dumps([[R.has_module(n) for n in {NAMES!r}], "
                 "sorted(m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules)]))")
    import json

    answers, imported = json.loads(got)
    assert imported == []
    assert answers == [_find_spec(n) for n in NAMES]
    assert answers[0] is True and answers[2] is False    # torch 2.15 has the FlyDSL templates
    # a parent imported already is asked as find_spec asks it
    assert [R.has_module(n) for n in NAMES] == answers


@pytest.mark.slow
def test_an_eager_case_in_a_worker_imports_neither_dynamo_nor_inductor():
    """An A/B worker's start (its environment read) and an eager case (built, called, timed): no
    Dynamo, no Inductor in the process."""
    got = _fresh("import sys; from flyexplore.run import envworker as EW; w = EW.Worker('A', 'cpu'); "
                 "w.case({'cmd': 'case', 'op': 'ab_ops:SLOW', 'case': '4096', 'dtype': 'fp32', "
                 "'backends': ['work'], 'seed': 0, 'trace': False, 'how': 'cpu-thread'}); "
                 "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    assert got == "[]"


@pytest.mark.slow
def test_an_eager_rmsnorm_case_and_its_switches_leave_inductor_unimported():
    """An RMSNorm case runs in its FlyDSL switch block (``switches.flydsl("rmsnorm")``), whose
    snapshot read Inductor's settings and so imported Inductor and Dynamo (1.7 CPU-s in every
    fresh worker): now the block of an eager operator leaves them unimported, its snapshot holds
    no Inductor settings and restoring it imports nothing. Nor does a sweep worker (its module and
    the case it runs) import pandas or pyarrow: its rows carry the schema version and its arms'
    names without them (0.35-0.45 CPU-s a worker)."""
    got = _fresh("import sys, torch; from flyexplore.ops import get_op; from flyexplore.ops.base import RunContext; "
                 "import flyexplore.run.engine; from flyexplore.run.cases import run_case; from flyexplore.world import env as ENV; "
                 "from flyexplore.world import switches as S; "
                 "op = get_op('rmsnorm'); ctx = RunContext(torch.device('cpu'), ENV.collect()); "
                 "rows = list(run_case(op, op.case('64x256'), 'fp32', ('aten',), ctx, timer_opts={'rep': 2, 'warmup': 1})); "
                 "snap = S.snapshot(inductor=False); S.restore(snap); "
                 "print(rows[0][1]['status'], snap.inductor, "
                 "sorted(m for m in ('torch._dynamo', 'torch._inductor', 'pandas', 'pyarrow') if m in sys.modules))")
    assert got == "ok None []"


def test_a_switch_block_of_a_compiled_operator_restores_inductors_settings():
    """``flydsl("gemm")`` changes Inductor's settings (FLYDSL in max_autotune_gemm_backends): its
    snapshot holds them and they are back after the block; where Inductor is imported (here), a
    snapshot that need not import it holds them too."""
    from torch._inductor import config as ic

    from flyexplore.world import switches as S

    before = S.snapshot()
    assert before.inductor and S.snapshot(inductor=False).inductor == before.inductor
    with S.flydsl("gemm", warn=False):
        inside = ic.max_autotune_gemm_backends
    assert "FLYDSL" in inside.upper() and S.snapshot() == before


def test_reset_dynamo_resets_once_dynamo_has_compiled(monkeypatch):
    import torch

    from flyexplore.ops.base import reset_dynamo

    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))   # Dynamo imported and used
    calls = []
    monkeypatch.setattr(sys.modules["torch._dynamo"], "reset", lambda: calls.append(1))
    reset_dynamo()
    assert calls == [1]
