"""Do verdicts reproduce across processes and runs? Issue 24's goals, measured.

Three steps, each a separate command so that each fits one call of the lent GPU:

``sweep OUT --run R``
    One independent sweep: ``flyexplore sweep`` (a fresh driver process, whose workers are fresh
    processes too) of :data:`GEMM` shapes, bf16, backends aten, triton (torch.compile
    max-autotune, Triton templates) and inductor (torch.compile default: the same cuBLAS kernel as
    aten), ``--processes P`` (default 3), written to ``OUT/run{R}.parquet`` (each row carries the
    commit, ``flyexplore_commit``) with ``OUT/provenance_run{R}.json`` (commit, flyexplore's
    version, the machine, the command: :func:`flyexplore.world.env.provenance`); then, in another
    fresh process, ``triton.testing.do_bench`` (its defaults: 25 ms warm-up, 100 ms of
    repetitions) on the same three callables of every case, its wall time per case written to
    ``OUT/dobench{R}.csv``. On the CPU (``--device cpu``) the shapes are :data:`CPU_GEMM` and
    the backends aten and inductor; do_bench is skipped.
``analyze OUT``
    Reads every ``run*.parquet`` (and ``dobench*.csv``) and writes ``OUT/summary.md`` and
    ``OUT/coverage.csv``, ``OUT/cross_run.csv``, ``OUT/time.csv``, ``OUT/calibration.json``:

    * coverage: for every ordered pair of runs (i, j) and every row -- each backend's time and
      each speedup against aten -- whether run j's estimate lies in run i's interval;
    * cross-run A vs A: each backend of run i against the same backend of run j, by
      :func:`flyexplore.results.compare.pair` (the files' own between-process variation): the
      labels' counts; and the same pairs read as single-process files (the first process of
      each, with the default allowance) for reference;
    * time to a verdict: each process's wall time per case (warm-up and rounds, all backends)
      and its time until the labels were decided, beside do_bench's wall time for the same
      callables in the same run (calls of 5 µs and longer);
    * calibration: the spread of single-process estimates between runs (for each row, every
      pair of processes from different runs: |log t_p - log t_q|), its 95th percentile is the
      default cross-run allowance for files measured without ``--processes``.

Usage (repository root)::

    python benchmarks/evidence/reproducible.py sweep data/h200/reproducible --run 1
    python benchmarks/evidence/reproducible.py sweep data/h200/reproducible --run 2
    python benchmarks/evidence/reproducible.py sweep data/h200/reproducible --run 3
    python benchmarks/evidence/reproducible.py analyze data/h200/reproducible
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCRIPT = "benchmarks/evidence/reproducible.py"

#: GEMM shapes M x N x K (``:NT``: B stored N x K, the nn.Linear layout), from a 9 µs call to a
#: 1.5 ms one, the issue's two (512x8192x28672, 8192x8192x8192) among them.
GEMM = ("64x4096x4096:NT", "1024x4096x4096:NT", "4096x4096x4096:NT", "8192x4096x4096:NT",
        "2048x14336x4096:NT", "16x28672x4096:NT", "512x8192x28672:NT", "8192x8192x8192:NT")
CPU_GEMM = ("128x128x128", "256x256x256", "384x384x384", "512x512x512", "256x1024x256", "64x2048x512")
GPU_BACKENDS = ("aten", "triton", "inductor")
CPU_BACKENDS = ("aten", "inductor")


def sweep(out: Path, run: int, processes: int, device: str, quick: bool) -> None:
    from flyexplore.world.env import write_provenance

    out.mkdir(parents=True, exist_ok=True)
    gpu = device != "cpu"
    shapes = (GEMM if gpu else CPU_GEMM)[: 2 if quick else None]
    backends = GPU_BACKENDS if gpu else CPU_BACKENDS
    dest = out / f"run{run}.parquet"
    cmd = [sys.executable, "-m", "flyexplore", "sweep", "--op", "gemm", "--shapes", ";".join(shapes),
           "--dtypes", "bf16" if gpu else "fp32", "--backends", ",".join(backends), "--device", device,
           "--processes", str(processes), "--out", str(dest), "--overwrite"]
    write_provenance(out, SCRIPT, name=f"provenance_run{run}.json",
                     extra={"step": "sweep", "run": run, "command": " ".join(cmd[1:])})
    t0 = time.time()
    subprocess.run(cmd, check=True)
    print(f"[run {run}] sweep {time.time() - t0:.0f} s", flush=True)
    if gpu:
        t0 = time.time()
        subprocess.run([sys.executable, __file__, "dobench", str(out / f"dobench{run}.csv"),
                        "--shapes", ";".join(shapes)], check=True)
        print(f"[run {run}] do_bench {time.time() - t0:.0f} s", flush=True)


def dobench(dest: Path, shapes: str) -> None:
    """do_bench on the sweep's own callables (built by the same backends), one case at a time:
    the wall time of do_bench on all three, and its medians."""
    import pandas as pd
    import torch
    from triton.testing import do_bench

    from flyexplore.ops import get_op
    from flyexplore.ops.base import RunContext, reset_dynamo
    from flyexplore.world.env import collect

    dev = torch.device("cuda:0")
    gemm = get_op("gemm")
    ctx = RunContext(dev, collect())
    rows = []
    for shape in shapes.split(";"):
        c = gemm.case(shape)
        inputs = gemm.make_inputs(c, "bf16", dev, 0)
        reset_dynamo()   # as the sweep does per case: no recompile limit reached across cases
        fns = {}
        for b in GPU_BACKENDS:
            bk = gemm.get_backend(b)
            with bk.context(ctx, c):
                fns[b] = bk.build(c, "bf16", inputs, ctx)
                fns[b]()   # compile and autotune here, outside the timed part (as the sweep does)
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        med = {}
        for b, f in fns.items():
            with gemm.get_backend(b).context(ctx, c):
                med[b] = do_bench(f, return_mode="median")
        wall = time.perf_counter() - w0
        rows.append({"case": c.label, "do_bench_wall_s": wall, **{f"do_bench_ms_{b}": v for b, v in med.items()}})
        del fns, inputs
        torch.cuda.empty_cache()
    pd.DataFrame(rows).to_csv(dest, index=False)


def _est(r) -> list[dict]:
    from flyexplore.results.table import process_estimates

    return process_estimates(r.get("process_estimates"))


def _current_rule(d):
    """The rows with their time and speedup intervals and labels recomputed from their
    ``process_estimates`` by the current rule (:func:`flyexplore.run.processes.intervals`, as a
    sweep combines them), so that files measured before a change of the rule are read as a sweep
    would write them now."""
    import pandas as pd

    from flyexplore.measure import stats as S
    from flyexplore.results import table as R
    from flyexplore.run.processes import intervals

    d = d.copy()
    for i, r in d.iterrows():
        pe = R.process_estimates(r["process_estimates"])
        if len(pe) < 2:
            continue
        new = intervals(pe, r["platform"], float(r["band"]) if pd.notna(r.get("band")) else S.BAND)
        d.loc[i, list(new)] = list(new.values())
    return d


def analyze(out: Path) -> None:
    import numpy as np
    import pandas as pd

    from flyexplore.measure import stats as S
    from flyexplore.results import compare as C
    from flyexplore.results import table as R
    from flyexplore.world.env import provenance, provenance_line

    runs = sorted(out.glob("run*.parquet"))
    if len(runs) < 2:
        raise SystemExit(f"analyze needs at least two run*.parquet files in {out}")
    dfs = {p.stem: R.load(p) for p in runs}
    dfs = {n: _current_rule(d[d["status"] == "ok"].reset_index(drop=True)) for n, d in dfs.items()}
    platform = str(next(iter(dfs.values()))["platform"].iloc[0])
    lines = [f"# Reproducible verdicts ({platform}; benchmarks/evidence/reproducible.py)", "",
             f"Runs: {', '.join(dfs)}; each `flyexplore sweep --processes "
             f"{int(next(iter(dfs.values()))['processes'].max())}`, a fresh driver per run. Row intervals "
             f"and labels recomputed from each row's `process_estimates` by the current rule (run shift "
             f"{R.run_shift(platform):.3g}, or {R.run_shift_per_sd(platform):.3g} x the row's between-process "
             f"sd where more).", ""]

    # coverage: run j's estimate inside run i's interval
    cov = []
    for (ni, di), (nj, dj) in itertools.permutations(dfs.items(), 2):
        m = di.merge(dj, on=["case", "dtype", "backend"], suffixes=("_i", "_j"))
        for _, r in m.iterrows():
            cov.append({"run_i": ni, "run_j": nj, "case": r["case"], "backend": r["backend"], "what": "time_ms",
                        "est_i": r["time_ms_i"], "lo_i": r["time_ci_lo_ms_i"], "hi_i": r["time_ci_hi_ms_i"],
                        "est_j": r["time_ms_j"]})
            if pd.notna(r.get("speedup_i")) and pd.notna(r.get("speedup_j")):
                cov.append({"run_i": ni, "run_j": nj, "case": r["case"], "backend": r["backend"],
                            "what": f"speedup vs {r['baseline_i']}", "est_i": r["speedup_i"], "lo_i": r["speedup_lo_i"],
                            "hi_i": r["speedup_hi_i"], "est_j": r["speedup_j"], "verdict_i": r["verdict_i"],
                            "verdict_j": r["verdict_j"]})
    cov = pd.DataFrame(cov)
    cov["covered"] = (cov["lo_i"] <= cov["est_j"]) & (cov["est_j"] <= cov["hi_i"])
    cov["half_width"] = (cov["hi_i"] - cov["lo_i"]) / (2 * cov["est_i"])
    cov.to_csv(out / "coverage.csv", index=False)
    sp = cov[cov["what"].str.startswith("speedup")]
    tm = cov[cov["what"] == "time_ms"]
    lines += ["## Each run's interval against the other runs' estimates", "",
              f"- speedups (triton, inductor vs aten): {int(sp['covered'].sum())}/{len(sp)} "
              f"({sp['covered'].mean():.0%}) covered; median half-width {sp['half_width'].median():.2%}",
              f"- times (every backend): {int(tm['covered'].sum())}/{len(tm)} ({tm['covered'].mean():.0%}) covered; "
              f"median half-width {tm['half_width'].median():.2%}", ""]
    labels = sp.groupby(["case", "backend"])["verdict_i"].agg(lambda v: ",".join(sorted(set(v))))
    lines += [f"- labels of the speedups over the runs: {int((~labels.str.contains(',')).sum())}/{len(labels)} "
              "(case, backend) pairs kept one label", ""]

    # cross-run A vs A
    xr = []
    for (ni, di), (nj, dj) in itertools.combinations(dfs.items(), 2):
        for be in sorted(set(di["backend"]) & set(dj["backend"])):
            ab = C.pair(di, dj, (ni, nj), a_backend=be)
            single = C.pair(_first_process(di), _first_process(dj), (ni, nj), a_backend=be)
            for (_, r), (_, s) in zip(ab.pairs.iterrows(), single.pairs.iterrows()):
                xr.append({"run_a": ni, "run_b": nj, "backend": be, "case": r["case"], "ratio": r["ratio"],
                           "lo": r["ratio_lo"], "hi": r["ratio_hi"], "verdict": r["verdict"], "interval": r["interval"],
                           "allowance": r["allowance"], "single_ratio": s["ratio"], "single_lo": s["ratio_lo"],
                           "single_hi": s["ratio_hi"], "single_verdict": s["verdict"]})
    xr = pd.DataFrame(xr)
    xr.to_csv(out / "cross_run.csv", index=False)
    cnt = xr["verdict"].value_counts().to_dict()
    cnt1 = xr["single_verdict"].value_counts().to_dict()
    lines += ["## Cross-run A vs A (one backend of run i against the same backend of run j)", "",
              f"- with the runs' own between-process variation: {len(xr)} pairs: "
              + ", ".join(f"{k} {cnt.get(k, 0)}" for k in S.LABELS)
              + f" (SAME {cnt.get('SAME', 0) / len(xr):.0%}); ratios {xr['ratio'].min():.4f}..{xr['ratio'].max():.4f}; "
              f"median allowance ±{np.expm1(xr['allowance'].median()):.2%}",
              "- the same pairs from one process a run (the default allowance, "
              f"{R.RUN_TO_RUN.get(platform, R.RUN_TO_RUN['cpu']):.1%} a side): "
              + ", ".join(f"{k} {cnt1.get(k, 0)}" for k in S.LABELS), ""]
    lines += [xr.groupby(["backend"]).agg(pairs=("verdict", "size"), same=("verdict", lambda v: int((v == "SAME").sum())),
                                          worst=("ratio", lambda v: float(np.max(np.abs(np.log(v))))))
              .reset_index().to_markdown(index=False, floatfmt=".4f"), ""]

    # calibration of the single-process default
    gaps = []
    for key in set().union(*[set(zip(d["case"], d["backend"])) for d in dfs.values()]):
        per = {n: [p["time_ms"] for p in _est(d[(d["case"] == key[0]) & (d["backend"] == key[1])].iloc[0])]
               for n, d in dfs.items() if ((d["case"] == key[0]) & (d["backend"] == key[1])).any()}
        for (na, ta), (nb, tb) in itertools.combinations(per.items(), 2):
            gaps += [abs(math.log(x / y)) for x in ta for y in tb if x and y]
    gaps = np.asarray(gaps)
    cal = {"platform": platform, "pairs": int(gaps.size), "p50": float(np.expm1(np.percentile(gaps, 50))),
           "p95": float(np.expm1(np.percentile(gaps, 95))), "max": float(np.expm1(gaps.max())),
           "what": "|t_p / t_q - 1| for every row and every two processes p, q of different runs"}
    (out / "calibration.json").write_text(json.dumps(cal, indent=1) + "\n")
    lines += ["## Calibration of the default cross-run allowance (files without --processes)", "",
              f"Between single processes of different runs ({cal['pairs']} pairs of processes): median "
              f"{cal['p50']:.2%}, 95th percentile {cal['p95']:.2%}, largest {cal['max']:.2%}.", ""]

    # time to a verdict
    tt = []
    dob = {p.stem.replace("dobench", "run"): pd.read_csv(p) for p in sorted(out.glob("dobench*.csv"))}
    for n, d in dfs.items():
        for case, g in d.groupby("case"):
            ests = _est(g.iloc[0])
            db = dob.get(n)
            dbw = float(db.loc[db["case"] == case, "do_bench_wall_s"].iloc[0]) if db is not None and (db["case"] == case).any() else math.nan
            shortest = float(g["time_ms"].min())
            for k, p in enumerate(ests):
                tt.append({"run": n, "case": case, "process": k, "wall_s": p.get("wall_s"), "verdict_s": p.get("verdict_s"),
                           "rounds": p.get("rounds"), "do_bench_wall_s": dbw, "shortest_call_ms": shortest})
    tt = pd.DataFrame(tt)
    if not tt.empty:
        tt["ratio_wall"] = tt["wall_s"] / tt["do_bench_wall_s"]
        tt.to_csv(out / "time.csv", index=False)
        t5 = tt[tt["shortest_call_ms"] >= 0.005]
        lines += ["## Time to a verdict, per case and process (all backends, warm-up and rounds; compile excluded)", "",
                  f"- {len(t5)} case-processes, calls >= 5 µs: wall median {t5['wall_s'].median():.3f} s, "
                  f"largest {t5['wall_s'].max():.3f} s; labels decided after median {t5['verdict_s'].median():.3f} s"]
        if t5["do_bench_wall_s"].notna().any():
            lines += [f"- do_bench on the same three callables in the same run: median {t5['do_bench_wall_s'].median():.3f} s; "
                      f"ours / do_bench's: median {t5['ratio_wall'].median():.2f}x, largest {t5['ratio_wall'].max():.2f}x "
                      f"(largest wall over the median do_bench wall: {t5['wall_s'].max() / t5['do_bench_wall_s'].median():.2f}x)"]
        lines.append("")
    env = next(iter(dfs.values())).iloc[0]
    lines += ["## Where", "", f"{env.get('device')} ({env.get('arch')}), torch {env.get('torch')}, triton {env.get('triton')}, "
              f"timing mode {env.get('timing_mode')}, flyexplore {env.get('flyexplore')}; every row is `measured`.", ""]
    commits = sorted({str(c) for d in dfs.values() if "flyexplore_commit" in d for c in d["flyexplore_commit"].dropna()})
    lines += [f"Measured by flyexplore commit {', '.join(commits) if commits else 'unknown (runs made before rows carried it)'}; "
              f"this summary: `{provenance_line(provenance(SCRIPT, extra={'step': 'analyze'}))}`", ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _first_process(df):
    """The rows as if the sweep had run one process: each row's first process's time and
    interval, its between-process columns dropped (so the default allowance applies)."""
    import pandas as pd

    d = df.copy()
    t = [(_est(r) or [{}])[0] for _, r in d.iterrows()]
    d["time_ms"] = [p.get("time_ms") for p in t]
    d["samples_ms"] = [json.dumps(json.loads(s)[: int(p.get("rounds") or 0)]) for s, p in zip(d["samples_ms"], t)]
    for c in ("processes", "process_estimates"):
        d[c] = pd.NA
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("out", type=Path)
    s.add_argument("--run", type=int, required=True)
    s.add_argument("--processes", type=int, default=3)
    s.add_argument("--device", default="cuda")
    s.add_argument("--quick", action="store_true")
    d = sub.add_parser("dobench")
    d.add_argument("dest", type=Path)
    d.add_argument("--shapes", required=True)
    a = sub.add_parser("analyze")
    a.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "sweep":
        sweep(args.out, args.run, args.processes, args.device, args.quick)
    elif args.cmd == "dobench":
        dobench(args.dest, args.shapes)
    else:
        analyze(args.out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
