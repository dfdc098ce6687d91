"""What worker processes cost: one suite swept with workers and in-process, compared.

Runs ``flyexplore sweep --op gemm --suite published-bf16 --backends aten,triton`` twice, each
as its own ``python -m flyexplore`` process with fresh, empty Inductor and Triton cache folders
(so neither run reuses the other's compiled kernels): once with worker processes
(``--executor local``: one spawned worker on the GPU) and once ``--in-process``. Then it checks
that the statuses are the same row by row, that each row's median lies within the other run's
95% interval (and the intervals overlap), and reports the wall time of each run and the cost of
workers in percent (goal: under 5%; the worker's start-up -- importing torch, creating a CUDA
context -- is part of the cost).

Writes into OUT (at most 8 files): ``workers.parquet``, ``inprocess.parquet``, ``env.json``
(``flyexplore env --json`` with the run's provenance under ``provenance``: commit, flyexplore's
version, the machine; :func:`flyexplore.world.env.env_json`), ``summary.json`` (the provenance
again, of the step that wrote it), ``summary.md``, ``workers.log``, ``inprocess.log``,
``wall_s.json``; prints the summary.
Imports no plotly (the GPU machine has none).

On the lent GPU:   python benchmarks/evidence/engine_overhead.py data/h200/engine_overhead
  (or in two calls, each under a 10-minute limit: ``--part workers``, then ``--part inprocess``;
  each run's wall time is kept in OUT/wall_s.json (the 8th file) and the summary is written once
  both result files are there)
On a CPU (check):  python benchmarks/evidence/engine_overhead.py /tmp/eo --cpu-small
(``--cpu-small``: gemm ``cpu-small``, backend aten, workers forced with ``--executor local``.)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SCRIPT = "benchmarks/evidence/engine_overhead.py"


def _run(out: Path, name: str, args: list[str], extra: list[str]) -> float:
    """Run one sweep in its own process with empty compile caches; returns its wall time, s."""
    with tempfile.TemporaryDirectory(prefix=f"eo-{name}-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "flyexplore", "sweep", *args, "--out", str(out / f"{name}.parquet"),
               "--overwrite", "--quiet", *extra]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(" ".join(cmd) + "\n\n" + p.stdout + "\n" + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"{name} sweep failed (exit {p.returncode}); see {out / (name + '.log')}")
    return wall


def _within(v, lo, hi) -> bool:
    return all(x is not None and not (isinstance(x, float) and math.isnan(x)) for x in (v, lo, hi)) and lo <= v <= hi


def compare(w, i) -> dict:
    """Row-by-row comparison of the workers (``w``) and in-process (``i``) result frames."""
    key = ["case", "dtype", "backend"]
    m = w.merge(i, on=key, suffixes=("_w", "_i"))
    same_status = bool((m.status_w == m.status_i).all()) and len(m) == len(w) == len(i)
    ok = m[(m.status_w == "ok") & (m.status_i == "ok")]
    rows = []
    for _, r in ok.iterrows():
        f = lambda c: None if r[c] is None or (isinstance(r[c], float) and math.isnan(r[c])) else float(r[c])  # noqa: E731
        tw, ti = f("time_ms_w"), f("time_ms_i")
        lw, hw, li, hi = f("time_ci_lo_ms_w"), f("time_ci_hi_ms_w"), f("time_ci_lo_ms_i"), f("time_ci_hi_ms_i")
        rows.append({"case": r.case, "backend": r.backend, "workers_ms": tw, "inprocess_ms": ti,
                     "ratio": tw / ti if tw and ti else None,
                     "w_in_i_interval": _within(tw, li, hi), "i_in_w_interval": _within(ti, lw, hw),
                     "overlap": None not in (lw, hw, li, hi) and lw <= hi and li <= hw})
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    return {"rows": len(m), "statuses_equal": same_status,
            "status_counts_workers": w.status.value_counts().to_dict(),
            "status_counts_inprocess": i.status.value_counts().to_dict(),
            "ok_pairs": len(rows),
            "medians_in_other_interval": sum(r["w_in_i_interval"] and r["i_in_w_interval"] for r in rows),
            "intervals_overlap": sum(bool(r["overlap"]) for r in rows),
            "geomean_time_ratio_workers_over_inprocess": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
            "per_row": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output folder (created; at most 8 files written)")
    ap.add_argument("--cpu-small", action="store_true", help="CPU check: gemm cpu-small, backend aten")
    ap.add_argument("--part", choices=("both", "workers", "inprocess"), default="both",
                    help="run both sweeps (default) or one; the summary needs both result files")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.cpu_small:
        args = ["--op", "gemm", "--suite", "cpu-small", "--backends", "aten"]
    else:
        args = ["--op", "gemm", "--suite", "published-bf16", "--backends", "aten,triton"]
    import pandas as pd

    from flyexplore.results import table as R
    from flyexplore.world.env import collect, env_json, provenance

    env = collect()
    (out / "env.json").write_text(env_json(SCRIPT, env))
    walls_p = out / "wall_s.json"
    walls = json.loads(walls_p.read_text()) if walls_p.exists() and a.part != "both" else {}
    if a.part in ("both", "workers"):
        walls["workers"] = _run(out, "workers", args, ["--executor", "local"])
    if a.part in ("both", "inprocess"):
        walls["inprocess"] = _run(out, "inprocess", args, ["--in-process"])
    walls_p.write_text(json.dumps(walls, indent=2))
    if not {"workers", "inprocess"} <= set(walls):
        print(f"{a.part} done ({walls}); run the other --part for the summary")
        return 0
    t_w, t_i = walls["workers"], walls["inprocess"]
    w, i = R.load(out / "workers.parquet"), R.load(out / "inprocess.parquet")
    s = compare(w, i)
    s.update(command="flyexplore sweep " + " ".join(args), device=env.device.name, platform=env.platform,
             wall_s_workers=round(t_w, 2), wall_s_inprocess=round(t_i, 2),
             worker_cost_pct=round(100 * (t_w - t_i) / t_i, 2),
             workers_device_ids=sorted(set(w.device_id.dropna())), workers=sorted(set(w.worker.dropna())),
             note="each run is its own process with empty Inductor/Triton caches; wall times include "
                  "starting the process (and, for workers, the worker), in this order: workers, then in-process",
             provenance=provenance(SCRIPT, env))
    (out / "summary.json").write_text(json.dumps(s, indent=2, default=str))
    lines = [f"# Worker processes vs in-process: {s['command']}", "",
             f"- device: {s['device']} ({s['platform']}); worker rows on {', '.join(s['workers_device_ids']) or 'cpu'}",
             f"- rows: {s['rows']}; statuses equal: {s['statuses_equal']} (workers {s['status_counts_workers']}, "
             f"in-process {s['status_counts_inprocess']})",
             f"- ok pairs: {s['ok_pairs']}; each median within the other's 95% interval: "
             f"{s['medians_in_other_interval']}/{s['ok_pairs']}; intervals overlap: {s['intervals_overlap']}/{s['ok_pairs']}",
             f"- geomean time ratio workers/in-process: {s['geomean_time_ratio_workers_over_inprocess']}",
             f"- wall time: workers {s['wall_s_workers']} s, in-process {s['wall_s_inprocess']} s, "
             f"cost of workers {s['worker_cost_pct']}% (goal < 5%)", "",
             pd.DataFrame(s["per_row"]).to_string(index=False) if s["per_row"] else "(no ok pairs)"]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
