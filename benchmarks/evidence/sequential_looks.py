"""How often repeated looks at a median's order-statistic interval miss the true median: the
figures behind :data:`flyexplore.measure.interleaved.LOOK_CONFIDENCE`.

A case of :func:`flyexplore.measure.interleaved.measure_interleaved` checks its speedups at
looks at least ``LOOK_GROWTH`` times as many rounds apart, from ``MIN_ROUNDS`` on, and stops at
the first look whose interval decides the label. The chance of a wrong label is at most the
chance that *some* look's interval misses the true median ratio. The order-statistic interval
of the median depends only on how many values lie below the true median (a Binomial(n, 1/2)
count for any continuous distribution), so a simulation of that count is exact for every
distribution of the per-round ratios. Seeded; CPU; seconds.

    python benchmarks/evidence/sequential_looks.py [--trials 40000] [--seed 1]

Prints, for each confidence and number of rounds, the looks and the chance that any look's
interval misses the median (both sides, and above it only: a wrong label needs a miss on the
side beyond a band edge).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def looks(first: int, growth: float, last: int) -> list[int]:
    """Round counts of the looks: ``first``, then each at least ``growth`` times the one
    before (and at least one more), up to ``last``."""
    out = [first]
    while True:
        n = max(out[-1] + 1, math.ceil(out[-1] * growth))
        if n > last:
            return out
        out.append(n)


def miss_rates(first: int, growth: float, last: int, confidences, trials: int = 40000,
               seed: int = 1) -> dict:
    """``{confidence: (any miss, miss above, number of looks)}`` over ``trials`` simulated
    cases with looks from ``first`` to ``last`` rounds."""
    from flyexplore.measure.stats import median_ci_ranks

    ns = looks(first, growth, last)
    out = {}
    for conf in confidences:
        rng = np.random.default_rng(seed)
        below = np.zeros(trials, dtype=np.int64)  # values below the true median so far
        any_miss = np.zeros(trials, dtype=bool)
        above = np.zeros(trials, dtype=bool)
        prev = 0
        for n in ns:
            below += rng.binomial(n - prev, 0.5, size=trials)
            prev = n
            i, j = median_ci_ranks(n, conf)
            if i < 0 or j >= n:
                continue
            # the interval [x_(i), x_(j)] lies above the median when at most i values are
            # below it, below the median when more than j are
            hi_side = below <= i
            above |= hi_side
            any_miss |= hi_side | (below >= j + 1)
        out[conf] = (float(any_miss.mean()), float(above.mean()), len(ns))
    return out


def main(argv=None) -> None:
    from flyexplore.measure.interleaved import LOOK_CONFIDENCE, LOOK_GROWTH, MIN_ROUNDS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=40000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    print(f"looks from {MIN_ROUNDS} rounds, each >= {LOOK_GROWTH}x the last; {a.trials} trials, seed {a.seed}")
    print("confidence  rounds<=  looks  any look misses  misses above")
    for conf in (0.95, LOOK_CONFIDENCE, 0.995):
        for last in (300, 1000, 3000, 10000):
            got = miss_rates(MIN_ROUNDS, LOOK_GROWTH, last, (conf,), a.trials, a.seed)[conf]
            print(f"{conf:10.3f}  {last:8d}  {got[2]:5d}  {got[0]:15.4f}  {got[1]:13.4f}")


if __name__ == "__main__":
    main()
