"""The step finder's penalty by simulation (issue 46; :mod:`flyexplore.results.steps`): how often
series with no step read one (10, 30 and 100 runs; Gaussian and heavy-tailed run noise), and how
often a 3% step at run 20 of 30 is found at run 20 +- 1, for run-to-run noise of 0.5%, 1% and
1.3% (the last: one process's spread between runs on the H200, ``calibration.json``'s p95 of
3.3% for ``|t_p / t_q - 1|`` over 1.96 x sqrt(2)) and 0.5% within a run. Each series is one case
fitted alone by :func:`flyexplore.results.steps.fit` (the geometric mean of many cases is
quieter).

Usage::

    python benchmarks/evidence/history_penalty.py run data/cpu/history_penalty

Writes ``results.json`` and ``summary.md``. CPU only; about a minute.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from flyexplore.results import steps as ST  # noqa: E402

SCRIPT = "benchmarks/evidence/history_penalty.py"
WITHIN = 0.005


def series(rng, count: int, n: int, sd: float, tails: str) -> np.ndarray:
    if tails == "gaussian":
        noise = rng.normal(0, sd, (count, n))
    else:   # Student t with 4 degrees of freedom, scaled to the same standard deviation
        noise = rng.standard_t(4, (count, n)) * sd / np.sqrt(2)
    return noise + rng.normal(0, WITHIN, (count, n))


def run(out: Path) -> dict:
    rng = np.random.default_rng(46)
    t0 = time.time()
    false = []
    for tails in ("gaussian", "t4"):
        for n, count in ((10, 4000), (30, 2000), (100, 400)):
            fits = ST.fit(series(rng, count, n, 0.013, tails), np.full((count, n), WITHIN))
            false.append({"tails": tails, "runs": n, "series": count, "sd": 0.013,
                          "with_a_step": float(np.mean([len(f.starts) > 1 for f in fits]))})
    found = []
    for sd in (0.005, 0.01, 0.013):
        for tails in ("gaussian", "t4"):
            y = series(rng, 2000, 30, sd, tails)
            y[:, 20:] += np.log(1.03)
            fits = ST.fit(y, np.full(y.shape, WITHIN))
            at = [[s.at for s in ST.steps_of(f)] for f in fits]
            found.append({"sd": sd, "tails": tails, "series": 2000,
                          "found_at_20_pm_1": float(np.mean([any(abs(a - 20) <= 1 for a in x) for x in at])),
                          "only_that_step": float(np.mean([len(x) == 1 and abs(x[0] - 20) <= 1 for x in at]))})
    res = {"script": SCRIPT, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ"), "within_sd": WITHIN,
           "penalty": {"log": ST.PENALTY_LOG, "base": ST.PENALTY_BASE, "alpha": ST.ALPHA, "min_level": ST.MIN_LEVEL},
           "no_step": false, "step_3pct_at_20_of_30": found, "wall_s": round(time.time() - t0, 1)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = ["# The step finder's penalty, by simulation (issue 46)", "",
             f"`{SCRIPT}` at {res['utc']}; penalty (2 ln n + 3) x kappa, alpha {ST.ALPHA}, levels before the newest "
             f"of {ST.MIN_LEVEL} runs or more; within-run noise {WITHIN:.1%}; one case a series.", "",
             "| no step: tails | runs | series | read a step |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['tails']} | {r['runs']} | {r['series']} | {r['with_a_step']:.2%} |" for r in false]
    lines += ["", "| 3% step at run 20 of 30: run-to-run sd | tails | found at 20 +- 1 | and no other step |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {r['sd']:.1%} | {r['tails']} | {r['found_at_20_pm_1']:.1%} | {r['only_that_step']:.1%} |" for r in found]
    lines += ["", f"Made by `python {SCRIPT} run {out}` in {res['wall_s']} s."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    a = ap.parse_args()
    run(a.out)


if __name__ == "__main__":
    main()
