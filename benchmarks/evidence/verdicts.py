"""Do flyexplore's verdicts hold? Four checks on one GPU, each case in 3 fresh processes.

(a) A vs A: the same kernel reached two ways must read SAME with |ratio - 1| <= 1%:
    GEMM ``aten`` vs ``inductor`` through the sweep (Inductor's default mm calls the same
    extern cuBLAS/hipBLASLt kernel; the kernel names are recorded to show it), RMSNorm
    ``F.rms_norm`` vs ``torch.rms_norm``, SDPA ``F.scaled_dot_product_attention`` (flash only)
    vs ``aten._scaled_dot_product_flash_attention``.
(b) A known ratio: a callable that runs the GEMM twice against one that runs it once must
    read 2.00x +- 1%.
(c) ``aten`` vs ``triton`` (torch.compile max-autotune, Triton templates) through the sweep:
    the ratio from 3 fresh processes must spread by at most 2%, and the labels must agree.
(d) Wall time to decided labels and of the whole case (warm-up and all rounds, both backends;
    compile excluded; why each case stopped: ``stop_reason``)
    beside ``triton.testing.do_bench`` (its defaults: 25 ms warm-up, 100 ms of repetitions,
    median) run on the same two callables, for the (c) cases.

Usage, from the repository root::

    python benchmarks/evidence/verdicts.py OUT_DIR [--procs 3] [--quick]

Runs ``--procs`` fresh Python processes one after another (``--worker`` mode, results in a
temporary folder), then writes to OUT_DIR: ``rows.parquet`` (every sweep row of every process,
with ``proc``), ``a_same.csv``, ``b_known.csv``, ``c_aten_triton.csv``, ``d_walltime.csv``,
``env.json`` (``flyexplore env --json`` with the run's provenance under ``provenance``: commit,
flyexplore's version, the machine) and ``summary.md`` (each check's pass/fail in words; its last
line the provenance). Needs a CUDA or ROCm GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCRIPT = "benchmarks/evidence/verdicts.py"

A_GEMM = ("1024x4096x4096:NT", "2048x6144x4096:NT", "4096x4096x4096:NT", "16x28672x4096:NT",
          "8192x8192x1024:NT", "3000x5000x2000:NT")
A_RMS = ((8192, 4096), (4096, 8192), (16384, 7168), (2048, 16384))
A_SDPA = ((4, 32, 2048, 128), (1, 16, 8192, 128), (8, 32, 1024, 64))
#: Large, compute-bound GEMMs: the second call of "twice" finds little of its operands in the
#: L2 (50 MB on an H200), so the true ratio is 2 (at 4096^3 it read 1.973: cache reuse).
B_GEMM = ("8192x8192x4096", "8192x8192x8192", "16384x4096x8192", "4096x16384x8192",
          "8192x4096x16384")
C_GEMM = ("1024x4096x4096:NT", "2048x4096x4096:NT", "4096x4096x4096:NT", "8192x4096x4096:NT",
          "2048x14336x4096:NT", "2048x4096x14336:NT", "4096x6144x4096:NT", "16x28672x4096:NT")


def _interleaved(fns: dict, dev, baseline: str):
    from flyexplore.measure import stats as S
    from flyexplore.measure.interleaved import measure_interleaved

    r = measure_interleaved(fns, dev, baseline=baseline, band=S.BAND)
    other = [n for n in fns if n != baseline][0]
    est, lo, hi = r.speedup(other)
    return {"speedup": est, "speedup_lo": lo, "speedup_hi": hi, "verdict": S.verdict(lo, hi),
            "rounds": r.rounds, "converged": r.converged, "wall_s": r.wall_s,
            "verdict_s": r.verdict_s, "stop_reason": r.stop_reason,
            "kernels_a": json.dumps([k.name[:80] for k in r.measurements[baseline].kernels]),
            "kernels_b": json.dumps([k.name[:80] for k in r.measurements[other].kernels]),
            "clock_mhz_min": min((c for c in r.round_clocks if c), default=None)}


def worker(out: Path, proc: int, quick: bool) -> None:
    import pandas as pd
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flyexplore.results import table as R
    from flyexplore.ops import get_op
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep

    dev = torch.device("cuda:0")
    n = 2 if quick else None
    rows = []
    # (a) GEMM through the sweep, aten vs inductor
    t0 = time.time()
    ga = run_sweep(SweepSpec("gemm", shapes=";".join(A_GEMM[:n]), dtypes="bf16", backends="aten,inductor",
                             device=dev), progress=False)
    for _, r in ga[ga["backend"] == "inductor"].iterrows():
        k = ga[(ga["case"] == r["case"]) & (ga["backend"] == "aten")].iloc[0]
        rows.append({"check": "a", "op": "gemm", "case": r["case"], "a": "aten", "b": "inductor",
                     "speedup": r["speedup"], "speedup_lo": r["speedup_lo"], "speedup_hi": r["speedup_hi"],
                     "verdict": r["verdict"], "rounds": r["rounds"], "converged": r["converged"],
                     "wall_s": r["wall_s"], "kernels_a": k["kernels"], "kernels_b": r["kernels"],
                     "clock_mhz_min": r["clock_mhz_min"]})
    print(f"[proc {proc}] (a) gemm {time.time() - t0:.1f}s", flush=True)
    for m, nn in A_RMS[:n]:
        x = torch.randn(m, nn, device=dev, dtype=torch.bfloat16)
        w = torch.randn(nn, device=dev, dtype=torch.bfloat16)
        fns = {"F.rms_norm": lambda: F.rms_norm(x, (nn,), w, 1e-6),
               "torch.rms_norm": lambda: torch.rms_norm(x, [nn], w, 1e-6)}
        for f in fns.values():
            f()
        rows.append({"check": "a", "op": "rmsnorm", "case": f"{m}x{nn}", "a": "F.rms_norm",
                     "b": "torch.rms_norm", **_interleaved(fns, dev, "F.rms_norm")})
    for b, h, s, d in A_SDPA[:n]:
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(3))

        def sdpa():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        fns = {"F.sdpa[flash]": sdpa,
               "aten.flash": lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]}
        for f in fns.values():
            f()
        rows.append({"check": "a", "op": "attention", "case": f"{b}x{h}x{s}x{s}x{d}:causal=1",
                     "a": "F.sdpa[flash]", "b": "aten.flash", **_interleaved(fns, dev, "F.sdpa[flash]")})
    print(f"[proc {proc}] (a) done {time.time() - t0:.1f}s", flush=True)
    # (b) twice vs once
    gemm = get_op("gemm")
    for shape in B_GEMM[: n]:
        c = gemm.case(shape)
        a_, b_ = (torch.randn(c["m"], c["k"], device=dev, dtype=torch.bfloat16),
                  torch.randn(c["n"], c["k"], device=dev, dtype=torch.bfloat16))
        fns = {"twice": lambda: (a_ @ b_.t(), a_ @ b_.t()), "once": lambda: a_ @ b_.t()}
        for f in fns.values():
            f()
        rows.append({"check": "b", "op": "gemm", "case": shape, "a": "twice", "b": "once",
                     **_interleaved(fns, dev, "twice")})
    print(f"[proc {proc}] (b) done {time.time() - t0:.1f}s", flush=True)
    # (c) aten vs triton through the sweep, and (d) do_bench on the same callables
    gc = run_sweep(SweepSpec("gemm", shapes=";".join(C_GEMM[: n]), dtypes="bf16", backends="aten,triton",
                             device=dev), progress=False)
    print(f"[proc {proc}] (c) done {time.time() - t0:.1f}s", flush=True)
    from triton.testing import do_bench

    from flyexplore.world.env import collect
    from flyexplore.ops.base import RunContext
    ctx = RunContext(dev, collect())
    for shape in C_GEMM[: n]:
        c = gemm.case(shape)
        inputs = gemm.make_inputs(c, "bf16", dev, 0)
        fa = gemm.get_backend("aten").build(c, "bf16", inputs, ctx)
        ft = gemm.get_backend("triton").build(c, "bf16", inputs, ctx)
        fa(), ft()  # compiled already in this process (Dynamo/Inductor caches): no autotune here
        torch.cuda.synchronize()
        w0 = time.perf_counter()
        ta = do_bench(fa, return_mode="median")
        tt = do_bench(ft, return_mode="median")
        wall = time.perf_counter() - w0
        r = gc[(gc["case"] == c.label) & (gc["backend"] == "triton")].iloc[0]
        rows.append({"check": "c", "op": "gemm", "case": c.label, "a": "aten", "b": "triton",
                     "speedup": r["speedup"], "speedup_lo": r["speedup_lo"], "speedup_hi": r["speedup_hi"],
                     "verdict": r["verdict"], "rounds": r["rounds"], "converged": r["converged"],
                     "wall_s": r["wall_s"], "verdict_s": r["verdict_s"], "stop_reason": r["stop_reason"],
                     "kernel_ms_a": float(gc[(gc["case"] == c.label) & (gc["backend"] == "aten")]["time_ms"].iloc[0]),
                     "kernel_ms_b": r["time_ms"], "do_bench_ms_a": ta, "do_bench_ms_b": tt,
                     "do_bench_ratio": ta / tt, "do_bench_wall_s": wall,
                     "clock_mhz_min": r["clock_mhz_min"]})
    print(f"[proc {proc}] (d) done {time.time() - t0:.1f}s", flush=True)
    df = pd.DataFrame(rows)
    df["proc"] = proc
    df.to_parquet(out / f"checks_{proc}.parquet", index=False)
    sw = R.concat([ga, gc])
    sw["proc"] = proc
    R.save(sw, out / f"rows_{proc}.parquet")


def summarize(tmp: Path, out: Path, procs: int) -> None:
    import pandas as pd

    from flyexplore.results import table as R

    chk = pd.concat([pd.read_parquet(tmp / f"checks_{p}.parquet") for p in range(procs)], ignore_index=True)
    rows = R.concat([R.load(tmp / f"rows_{p}.parquet").assign(proc=p) for p in range(procs)])
    R.save(rows, out / "rows.parquet")
    lines = ["# Verdict checks (benchmarks/evidence/verdicts.py)", ""]
    a = chk[chk["check"] == "a"].copy()
    a["ok"] = (a["verdict"] == "SAME") & ((a["speedup"] - 1).abs() <= 0.01)
    a.to_csv(out / "a_same.csv", index=False)
    lines.append(f"(a) A vs A: {int(a['ok'].sum())}/{len(a)} case-process pairs read SAME with "
                 f"|ratio-1| <= 1% ({a['case'].nunique()} cases x {procs} processes); "
                 f"ratios {a['speedup'].min():.4f}..{a['speedup'].max():.4f}")
    b = chk[chk["check"] == "b"].copy()
    b["ok"] = ((b["speedup"] - 2).abs() <= 0.02) & (b["speedup_lo"] >= 1.98) & (b["speedup_hi"] <= 2.02)
    b.to_csv(out / "b_known.csv", index=False)
    lines.append(f"(b) known 2x: {int(b['ok'].sum())}/{len(b)} read 2.00x +-1% (estimate and interval); "
                 f"ratios {b['speedup'].min():.4f}..{b['speedup'].max():.4f}")
    c = chk[chk["check"] == "c"].copy()
    g = c.groupby("case").agg(lo=("speedup", "min"), hi=("speedup", "max"),
                              labels=("verdict", lambda v: ",".join(sorted(set(v)))),
                              do_bench_lo=("do_bench_ratio", "min"), do_bench_hi=("do_bench_ratio", "max"))
    g["spread"] = g["hi"] / g["lo"] - 1
    g["do_bench_spread"] = g["do_bench_hi"] / g["do_bench_lo"] - 1
    g["ok"] = (g["spread"] <= 0.02) & ~g["labels"].str.contains(",")
    c.to_csv(out / "c_aten_triton.csv", index=False)
    lines.append(f"(c) aten vs triton: {int(g['ok'].sum())}/{len(g)} cases spread <= 2% with one label "
                 f"across {procs} processes; largest spread {g['spread'].max():.2%} "
                 f"(do_bench's ratio, same callables: largest spread {g['do_bench_spread'].max():.2%})")
    lines += ["", g.reset_index().to_markdown(index=False, floatfmt=".4f"), ""]
    d = c[["proc", "case", "wall_s", "verdict_s", "do_bench_wall_s", "kernel_ms_a", "kernel_ms_b", "converged",
           "stop_reason", "rounds"]].copy()
    d["ratio_wall"] = d["wall_s"] / d["do_bench_wall_s"]
    d["ratio_verdict"] = d["verdict_s"] / d["do_bench_wall_s"]
    d["long_call"] = d[["kernel_ms_a", "kernel_ms_b"]].min(axis=1) >= 0.005  # the goals: calls >= 5 us
    d.to_csv(out / "d_walltime.csv", index=False)
    dl = d[d["long_call"]]
    lines.append(f"(d) wall time / do_bench's for the same two callables, calls >= 5 us "
                 f"({len(dl)} case-process pairs): to decided labels (verdict_s: every label's 99% "
                 f"interval inside the band or beyond an edge): median {dl['ratio_verdict'].median():.2f}x, max "
                 f"{dl['ratio_verdict'].max():.2f}x ({int((dl['ratio_verdict'] <= 1).sum())}/{len(dl)} "
                 f"within do_bench's time); whole case (goals: median <= 1x, max <= 3x): median "
                 f"{dl['ratio_wall'].median():.2f}x, max {dl['ratio_wall'].max():.2f}x; "
                 f"{int(d['converged'].sum())}/{len(d)} cases converged; stopped by: "
                 + ", ".join(f"{k} {v}" for k, v in d["stop_reason"].value_counts().items()))
    from flyexplore.world.env import provenance, provenance_line

    lines += ["", f"`{provenance_line(provenance(SCRIPT, extra={'procs': procs}))}`"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two cases per check (a smoke test)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker is not None:
        worker(Path(a.tmp), a.worker, a.quick)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from flyexplore.world.env import env_json
    (out / "env.json").write_text(env_json(SCRIPT))
    tmp = Path(tempfile.mkdtemp(prefix="verdicts-"))
    for p in range(a.procs):
        cmd = [sys.executable, __file__, a.out, "--worker", str(p), "--tmp", str(tmp)] + (["--quick"] if a.quick else [])
        t0 = time.time()
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        print(f"process {p}: {time.time() - t0:.1f} s", flush=True)
    summarize(tmp, out, a.procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
