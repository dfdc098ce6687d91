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


def test_reset_dynamo_resets_once_dynamo_has_compiled(monkeypatch):
    import torch

    from flyexplore.ops.base import reset_dynamo

    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))   # Dynamo imported and used
    calls = []
    monkeypatch.setattr(sys.modules["torch._dynamo"], "reset", lambda: calls.append(1))
    reset_dynamo()
    assert calls == [1]
