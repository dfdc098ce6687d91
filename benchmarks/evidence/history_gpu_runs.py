"""Issue 46's step goals on runs from the lent GPU: 30 real sweeps of 6 bf16 GEMMs (ATen) made
one after the other on one H100 (``data/h100/history_runs/runs.parquet``, made by the command in
that folder's README), so the noise between the points is what that GPU really showed between
runs: clock changes, power, the fresh process of each sweep.

- **Step found:** the 30 runs in an order (seed 0: the order they were measured in; seeds 1-19:
  a random order), the runs at positions 20..29 made 3% slower -- every time column, every
  sample in ``samples_ms`` scaled, the rates divided -- added to a fresh history store and read by
  :func:`flyexplore.results.history.analyse`. Found: a geometric-mean step at position 20 +- 1.
- **No step:** 20 series of 10 runs drawn from the 30 (a random draw and order each), nothing
  injected: the steps found (goal: none).

Usage::

    python benchmarks/evidence/history_gpu_runs.py run data/h100/history_runs
    python benchmarks/evidence/history_gpu_runs.py summary data/h100/history_runs

Writes ``results.json`` and ``summary.md`` into the folder (beside ``runs.parquet``). Runs on
the CPU (it reads the committed runs).
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from flyexplore.results import history as H  # noqa: E402
from flyexplore.results import table as R  # noqa: E402
from flyexplore.results.history_store import Store  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from history_steps import scale_rows  # noqa: E402  (one way to make a run slower, samples and all)

SCRIPT = "benchmarks/evidence/history_gpu_runs.py"
STEP = 0.03
AT = 20
#: The ``--recent`` values whose gate the detection-lag part reads.
RECENT = (1, 3, 5)


def series(runs: list[pd.DataFrame], order: np.ndarray, step_at: int | None, tag: str) -> list[pd.DataFrame]:
    """The runs in ``order`` as a new series: run ids and timestamps in that order (one hour
    apart), 3% slower from position ``step_at`` on (None: no step)."""
    out = []
    for pos, j in enumerate(order.tolist()):
        d = scale_rows(runs[j], 1 + STEP) if step_at is not None and pos >= step_at else runs[j].copy()
        d["run_id"] = f"{tag}-{pos:02d}"
        d["timestamp"] = pd.Timestamp("2026-11-01T00:00:00+00:00") + pd.Timedelta(hours=pos)
        d["timestamp"] = d["timestamp"].dt.strftime("%Y-%m-%dT%H:%M:%S+00:00")
        out.append(d)
    return out


def analyse(frames: list[pd.DataFrame], lag: bool = False):
    """The analysis of the runs ``frames`` in a fresh store; with ``lag``, also the detection lag:
    for each count of runs from ``AT + 1`` to all, whether the geometric mean's step at ``AT`` +- 1
    is found by then and whether ``history show --fail-on SLOWER:1% --recent R`` fails
    (:data:`RECENT`), as a CI adding one run a day would see it."""
    with tempfile.TemporaryDirectory() as tmp:
        st = Store(Path(tmp) / "store")
        st.add(frames)
        pts = st.points()
        an = H.analyse(pts)
        if not lag:
            return an
        order = list(dict.fromkeys(pts.sort_values("timestamp", kind="stable")["run_id"]))
        seen = []
        for k in range(AT + 1, len(order) + 1):
            ak = H.analyse(pts[pts["run_id"].isin(set(order[:k]))])
            g = ak.steps[ak.steps["series"] == H.GEOMEAN]
            seen.append({"runs": k, "found": bool(((g["position"] - AT).abs() <= 1).any()),
                         **{f"gate_recent_{r}": H.gate_steps(ak, "SLOWER:1%", recent=r)[0] for r in RECENT}})
        return an, seen


def run(out: Path, seeds: int) -> dict:
    df = R.load(out / "runs.parquet")
    ids = list(dict.fromkeys(df.sort_values("timestamp")["run_id"]))
    runs = [df[df["run_id"] == r].reset_index(drop=True) for r in ids]
    n_series = df.groupby(list(H.SERIES_KEY)).ngroups
    step_rows, quiet_rows = [], []
    t0 = time.time()
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        order = np.arange(len(runs)) if seed == 0 else rng.permutation(len(runs))
        an, seen = analyse(series(runs, order, AT, f"s{seed}"), lag=True)
        st = an.steps
        g = st[st["series"] == H.GEOMEAN]
        cases = st[st["series"] != H.GEOMEAN]
        near = cases[(cases["position"] - AT).abs() <= 1]
        step_rows.append({
            "seed": seed, "order": "measured" if seed == 0 else "random",
            "geomean_positions": g["position"].astype(int).tolist(),
            "geomean_change": g["change"].round(4).tolist(), "geomean_lo": g["lo"].round(4).tolist(),
            "geomean_hi": g["hi"].round(4).tolist(),
            "geomean_found": bool(((g["position"] - AT).abs() <= 1).any()),
            "cases_found": int(near["series"].nunique()), "cases": n_series,
            "case_steps_elsewhere": int(len(cases) - len(near)),
            "first_found_at_runs": next((x["runs"] for x in seen if x["found"]), None),
            **{f"gate_recent_{r}_failed_at_runs": next((x["runs"] for x in seen if x[f"gate_recent_{r}"]), None)
               for r in RECENT}})
        draw = np.random.default_rng(1000 + seed).choice(len(runs), 10, replace=False)
        aq = analyse(series(runs, draw, None, f"q{seed}"))
        quiet_rows.append({"seed": seed, "runs": draw.tolist(),
                           "geomean_steps": int((aq.steps["series"] == H.GEOMEAN).sum()),
                           "case_steps": int((aq.steps["series"] != H.GEOMEAN).sum()),
                           "steps": [H.step_text(s) for _, s in aq.steps.iterrows()]})
    sd = np.std(np.log(np.array([r.sort_values("case")["time_ms"].to_numpy(dtype=float) for r in runs])), axis=0)
    res = {"provenance": provenance(), "runs": len(runs), "series": n_series, "step": STEP, "at": AT,
           "run_to_run_sd": {c: round(float(v), 5) for c, v in zip(sorted(runs[0]["case"]), sd)},
           "wall_s": round(time.time() - t0, 1), "steps": step_rows, "no_step": quiet_rows}
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


def provenance() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        commit, dirty = "", None
    return {"script": SCRIPT, "flyexplore_commit": commit, "dirty": dirty, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": platform.node(), "python": platform.python_version()}


def summary(out: Path) -> None:
    res = json.loads((out / "results.json").read_text())
    st, q = res["steps"], res["no_step"]
    found = sum(r["geomean_found"] for r in st)
    exact = sum(r["geomean_positions"] == [AT] for r in st)
    elsewhere = sum(len([p for p in r["geomean_positions"] if abs(p - AT) > 1]) for r in st)
    cover = sum(any(lo <= STEP <= hi for lo, hi in zip(r["geomean_lo"], r["geomean_hi"])) for r in st)
    frac = [r["cases_found"] / r["cases"] for r in st]
    lines = [
        "# History on runs from the lent H100 (issue 46)", "",
        f"provenance: {json.dumps(res['provenance'])}", "",
        f"The {res['runs']} runs of `runs.parquet`: {res['series']} bf16 GEMMs (ATen), one sweep after the other "
        "on one NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130), each sweep a fresh Python process (`--in-process`: its cases in that process), event-gated "
        "timing. Their run-to-run standard deviation per case (log space): "
        + ", ".join(f"{c} {v:.2%}" for c, v in res["run_to_run_sd"].items()) + ".", "",
        f"## A {STEP:.0%} step at run {AT} of {res['runs']} ({len(st)} orders of the runs; seed 0 the measured order)", "",
        f"- geometric mean: a step at run {AT} +- 1 in **{found} of {len(st)}** orders ({exact} exactly at {AT}); "
        f"its 95% interval holds the {STEP:.0%} in {cover} of {len(st)}; steps elsewhere: {elsewhere}",
        f"- cases finding it themselves at {AT} +- 1: median {np.median(frac):.0%}, fewest {min(frac):.0%} "
        f"(of {res['series']}); case steps elsewhere: {sum(r['case_steps_elsewhere'] for r in st)} in "
        f"{len(st) * res['series']} series", "",
        "", f"## When a CI adding one run at a time sees it (the runs up to {AT + 1}, {AT + 2}, ...)", "",
        "| | found at 20 +- 1 (geomean) | gate SLOWER:1% --recent 1 | --recent 3 | --recent 5 |",
        "| --- | --- | --- | --- | --- |",
        "| orders where it happens by run 30 | " + " | ".join(
            f"{sum(r[k] is not None for r in st)} of {len(st)}"
            for k in ("first_found_at_runs", *(f"gate_recent_{x}_failed_at_runs" for x in RECENT))) + " |",
        "| the run it first happens at (median, latest; run 21 brought the step) | " + " | ".join(
            _when([r[k] for r in st]) for k in ("first_found_at_runs",
                                                *(f"gate_recent_{x}_failed_at_runs" for x in RECENT))) + " |",
        "",
        f"## No step: {len(q)} series of 10 runs drawn from the {res['runs']}", "",
        f"- geometric mean: **{sum(r['geomean_steps'] for r in q)} steps** in {len(q)} series",
        f"- cases: {sum(r['case_steps'] for r in q)} steps in {len(q) * res['series']} series",
    ]
    for r in q:
        for s in r["steps"]:
            lines.append(f"  - seed {r['seed']}: {s}")
    lines += ["", f"Made by `python {SCRIPT} run {out.relative_to(ROOT) if out.is_absolute() else out}` "
              f"in {res['wall_s']} s."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _when(ks: list) -> str:
    got = [k for k in ks if k is not None]
    return f"{int(np.median(got))}, {max(got)}" if got else "never"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--seeds", type=int, default=20)
    s = sub.add_parser("summary")
    s.add_argument("out", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.out, a.seeds)
    summary(a.out)


if __name__ == "__main__":
    main()
