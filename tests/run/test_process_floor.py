"""The per-process floor (issue 45): a label of an environment A/B or of ``--processes`` needs
evidence between processes -- three or more pairs, whose spread the interval reads, or a difference
that the device's stated floor (:data:`flyexplore.results.speedups.PROCESS_FLOOR`) cannot explain.
Two identical CPU workers once read 18.3 ms and 3.8 ms for a whole pass, each with an interval of
+-1%, and one pair read 4.87x FASTER; now one or two pairs' interval is widened by the floor, and
many simulated A/As -- per-process offsets heavy-tailed at the floor's spread, each pair's own
interval tight -- read FASTER/SLOWER at 1, 3 and auto pairs no more often than the labels' 5% allows
(the 99th percentile of the binomial count). The cause that could be fixed -- glibc's heap -- is
tested at the end."""
import math

import numpy as np
import pytest
from scipy import stats as st

from flyexplore.measure import stats as S
from flyexplore.results import table as R
from flyexplore.results.speedups import PROCESS_FLOOR, process_floor
from flyexplore.run.processes import SPREAD_PAIRS, PassRule, combine, floor_for

ARMS = ("w@A", "w@B")


def _pass_rows(speedups, t_ms=1.0, se=0.002):
    """``{pass: {arm: row}}`` of an A/B whose B arm read ``speedups`` in its pairs, each with a
    tight own interval (``se``, log space) and calls of ``t_ms``."""
    out = {}
    half = math.exp(1.96 * se)
    for k, sp in enumerate(speedups):
        out[k] = {ARMS[0]: {"status": "ok", "time_ms": t_ms, "time_ci_lo_ms": t_ms * 0.99,
                            "time_ci_hi_ms": t_ms * 1.01, "backend": ARMS[0], "message": None},
                  ARMS[1]: {"status": "ok", "time_ms": t_ms / sp, "time_ci_lo_ms": 0.99 * t_ms / sp,
                            "time_ci_hi_ms": 1.01 * t_ms / sp, "speedup": sp, "speedup_lo": sp / half,
                            "speedup_hi": sp * half, "backend": ARMS[1], "message": None}}
    return out


def test_the_floor_is_the_devices_and_only_rows_of_fewer_than_three_pairs_get_it():
    assert process_floor("cpu") == process_floor(None) == process_floor("mps") == PROCESS_FLOOR["cpu"] == 0.25
    assert process_floor("cuda") == process_floor("rocm") == 0.15
    assert R.process_floor is process_floor
    assert floor_for(1, "cpu") == floor_for(2, "cpu") == 0.25 and floor_for(SPREAD_PAIRS, "cpu") == 0.0


def test_one_process_gets_the_floors_interval():
    e, lo, hi = S.between_process([1.30], [0.005], prediction=False)
    assert math.isnan(lo)                                   # without a floor: no interval from one
    e, lo, hi = S.between_process([1.30], [0.005], prediction=False, floor=0.12)
    half = S.Z95 * math.sqrt(0.12 ** 2 + 0.005 ** 2)
    assert e == pytest.approx(1.30) and math.log(hi / e) == pytest.approx(half)
    # two that happen to agree: never narrower than the floor's z * floor / sqrt(2)
    _, lo2, hi2 = S.between_process([1.001, 0.999], [0.002] * 2, prediction=False, floor=0.12)
    assert math.log(hi2) >= S.Z95 * 0.12 / math.sqrt(2)
    # pairs that spread more than the floor: their own t-interval
    x = [0.7, 1.3, 1.0]
    assert S.between_process(x, None, prediction=False, floor=0.12) == S.between_process(x, None, prediction=False)


def test_one_pair_never_labels_what_the_floor_explains():
    """The issue's pair: 1.218x with its own +-1% interval on the CPU read FASTER; with the CPU's
    floor it is AMBIGUOUS and the row says why. A 2x slowdown still reads SLOWER with one pair;
    three pairs read their own spread."""
    rule = PassRule(1, 1, 0.01, "cpu", auto=False)
    row = rule.final_rows(_pass_rows([1.218], se=0.005), ARMS)["w@B"]
    assert row["verdict"] == "AMBIGUOUS" and row["speedup_lo"] < 1 < row["speedup_hi"], row
    assert "per-process floor of 25%" in row["ci_method"] and row["processes"] == 1
    assert row["pairs_stop"] == "fixed"
    big = rule.final_rows(_pass_rows([0.5], se=0.005), ARMS)["w@B"]
    assert big["verdict"] == "SLOWER" and big["speedup_hi"] < 0.99
    # the H100's one-pair A/A of TopK 1024x4096x8 read 1.029x [1.017, 1.041] FASTER: AMBIGUOUS now
    gpu = PassRule(1, 1, 0.01, "cuda", auto=False).final_rows(_pass_rows([1.029], se=0.006), ARMS)["w@B"]
    assert gpu["verdict"] == "AMBIGUOUS"
    three = PassRule(3, 3, 0.01, "cpu", auto=False).final_rows(_pass_rows([0.97, 0.968, 0.972]), ARMS)["w@B"]
    assert three["verdict"] == "SLOWER" and three["ci_method"].startswith("between-pair (3 pairs")
    # --processes: one process of the N wanted gets the floor too
    one = combine([dict(_pass_rows([1.218], se=0.005)[0]["w@B"])], 3, platform="cpu")
    assert one["verdict"] == "AMBIGUOUS" and "widened by the per-process floor" in one["message"]


def _simulate(rule: PassRule, n: int, rng, floor: float, most: int) -> tuple[int, int]:
    """``n`` A/As run through ``rule``: each pair's log ratio drawn from a Student t with 3 degrees of
    freedom scaled to a standard deviation of ``floor`` (heavy tails, as the CPU's offsets are), each
    pair's own interval +-1%. Returns (false labels, comparisons)."""
    false = 0
    scale = floor / math.sqrt(3.0)      # the sd of t(3) is sqrt(3)
    for _ in range(n):
        sp = list(np.exp(scale * rng.standard_t(3, size=most)))
        k = rule.first
        while k < most and rule.wants(_pass_rows(sp[:k], se=0.005), ARMS):
            k += 1
        false += rule.final_rows(_pass_rows(sp[:k], se=0.005), ARMS)["w@B"]["verdict"] in ("FASTER", "SLOWER")
    return false, n


@pytest.mark.parametrize("first,most,auto", [(1, 1, False), (3, 3, False), (3, 10, True)])
def test_many_simulated_aas_hold_the_labels_error_rate(first, most, auto):
    """At one pair the offsets are drawn at exactly the floor's spread, so this holds by the
    floor's construction (what it shows is that the old rule labels most of them); at 3 and auto
    pairs the intervals read the pairs' own spread, and the heavy tails test that. The real count is
    ``benchmarks/evidence/aa_pairs.py``'s (``data/cpu/aa/``, ``data/h100/aa_pairs/``)."""
    rng = np.random.default_rng(45 + first + most)
    rule = PassRule(first, most, 0.01, "cpu", auto=auto)
    false, n = _simulate(rule, 300, rng, R.process_floor("cpu"), most)
    allowed = int(st.binom.ppf(0.99, n, 1 - S.CONFIDENCE))
    assert false <= allowed, (false, allowed)
    # the rule before the floor: one pair's own interval labels most of them
    if first == 1:
        e = np.exp(R.process_floor("cpu") / math.sqrt(3.0) * np.random.default_rng(1).standard_t(3, size=300))
        before = sum(S.verdict(x * math.exp(-1.96 * 0.005), x * math.exp(1.96 * 0.005)) in ("FASTER", "SLOWER")
                     for x in e)
        assert before > n // 2, before


# -- the cause that could be fixed: a CPU worker's heap ---------------------------------------------------

_FAULTS = r"""
import resource, sys, torch
torch.set_num_threads(1)
x, w = torch.randn(4096, 4096), torch.randn(4096)
f = lambda: torch.nn.functional.rms_norm(x, (4096,), w)
for _ in range(5):
    f()
windows = []
for _ in range(6):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        f()
    windows.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 5)
print(min(windows))
"""


def _faults_per_call(env: dict) -> float:
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", _FAULTS], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    return float(r.stdout.strip().splitlines()[-1])


def _thp_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's heap")
@pytest.mark.skipif(_thp_always(), reason="transparent huge pages 'always': a 64 MiB block faults per 2 MiB")
def test_a_cpu_worker_heap_serves_a_call_without_page_faults():
    """The 5x between two identical CPU workers: glibc's default heap serves a block from fresh
    pages (a page fault each 4 KiB, counted in the call's time) always at 32 MiB and more, and below
    that depending on what the process freed before (one program read 0.4, 406 and 8,160 faults a
    call of rmsnorm 2048x2048 in three runs). rmsnorm 4096x4096 fp32 (64 MiB blocks): about 49,000
    faults a call by default, none with the workers' settings (``CPU_MALLOC``). Each figure is the
    fewest faults a call over six windows of five calls: on a loaded machine the kernel may take back
    a page of the heap between calls (one CI run read 3,277 a call in one window, one 64 MiB block
    faulted in once over five calls), while the default heap faults in every call of every window."""
    from flyexplore.run.engine import CPU_MALLOC, cpu_malloc

    assert _faults_per_call({}) > 10000
    assert _faults_per_call(dict(CPU_MALLOC)) < 100
    assert cpu_malloc({}) == CPU_MALLOC and cpu_malloc({"MALLOC_MMAP_MAX_": "9"}) == {
        k: v for k, v in CPU_MALLOC.items() if k != "MALLOC_MMAP_MAX_"}   # what the environment sets stays


def test_every_cpu_worker_starts_with_that_heap_unless_its_environment_sets_it(tmp_path):
    import torch

    from flyexplore.run import engine as E
    from flyexplore.run.envab import EnvWorker
    from flyexplore.run.envs import parse_env

    w = EnvWorker(parse_env("A"), "cpu", {}, "driver", (), str(tmp_path), "t")
    assert {k: w.environ()[k] for k in E.CPU_MALLOC} == E.CPU_MALLOC
    # and the profiler's quiet log level, as the command line's (its USDT lines stay out of the log a
    # crashed row quotes), unless the driver's environment sets one
    from flyexplore.measure.timing import KINETO_QUIET_LEVEL

    level = __import__("os").environ.get("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
    assert w.environ()["KINETO_LOG_LEVEL"] == level
    own = EnvWorker(parse_env("B:MALLOC_MMAP_MAX_=65536"), "cpu", {}, "driver", (), str(tmp_path), "t")
    assert own.environ()["MALLOC_MMAP_MAX_"] == "65536"
    gpu = EnvWorker(parse_env("A"), "cuda:0", {}, "driver", (), str(tmp_path), "t")
    assert "MALLOC_MMAP_MAX_" not in gpu.environ() or "MALLOC_MMAP_MAX_" in __import__("os").environ
    # a sweep's (and --processes') CPU worker places
    slots = E._slots(torch.device("cpu"), None, 2, None)
    assert all(s.env_changes == E.cpu_malloc() for s in slots)
