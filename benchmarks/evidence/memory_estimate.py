"""How close the memory estimate is to what cases really take, on this machine's device.

For every (family, backend, dtype) that runs on the device here (CPU, or the first CUDA/ROCm GPU
when one is visible), at a few sizes: the sweep's estimate (:func:`flyexplore.run.memory.estimate_cases`:
probes measured and fitted first, into an empty cache, so the fits are made here and their time
is counted) beside the peak the case really reaches, run as a sweep runs it
(:func:`flyexplore.run.memory.measure_cases`, with the allocator and compile caches as a sweep has
them: on the CPU the peak resident-set growth, each case alone in a fresh child process; on a GPU
``torch.cuda.max_memory_reserved``, exact per case, so one child per family, with
``max_memory_allocated`` and what the driver (NVML) says the process holds beside it). The sizes
are the family's structure (:data:`STRUCTURES`) grown or shrunk to each target of declared bytes
(:data:`TARGETS`), none of them a probe's. One row per (family, backend, dtype, size), and per
family one row with every backend of a case at once (interleaved, as a sweep runs them).

Writes into OUT (no subfolders, 5 files), again after each family (a run cut short keeps what it
measured): ``memory_estimate.parquet`` and ``memory_estimate.csv`` (the table),
``summary.md`` (the command, the provenance line, the ratio range, how measured, the table as
Markdown), ``fits.json`` (each fit: fixed bytes, factors, probe points) and ``env.json``
(``flyexplore env --json`` with the run's provenance under ``provenance``: commit, flyexplore's
version, the machine, the command; :func:`flyexplore.world.env.provenance`). Ratio =
measured / estimate (1.5x either side is the goal).

CPU (this project's 2-core machine, 27 minutes with other jobs beside; data/cpu/README.md):
    nice -n 19 python benchmarks/evidence/memory_estimate.py --out data/cpu/memory_estimate \
        --dtypes fp32,mxfp8,mxfp4,fp8_e4m3 --targets 12,48
On the lent GPU (the device found by itself; in parts under a time limit, each adding its rows;
the Triton and Inductor probes autotune and compile every shape, a few minutes per dtype):
    python benchmarks/evidence/memory_estimate.py --out data/h200/memory_estimate --families rmsnorm,topk --dtypes bf16
    python benchmarks/evidence/memory_estimate.py --out data/h200/memory_estimate --families gemm --dtypes bf16 --append
    python benchmarks/evidence/memory_estimate.py --out data/h200/memory_estimate --families attention,grouped_gemm,scaled_gemm --append
Options: ``--families``, ``--dtypes`` (comma lists; default every one that runs here),
``--targets`` (MiB of declared tensors, comma list; default 16,64 on a CPU, 256,2048 on a
GPU), ``--append`` (keep OUT's rows of what this run does not measure).
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SCRIPT = "benchmarks/evidence/memory_estimate.py"

#: Each family's case structures (options and the proportions of the scaled dims), per dtype
#: where one needs its own (FP8 with per-row scales).
STRUCTURES = {
    "gemm": ["4096x1024x2048:NT"],
    "grouped_gemm": ["4x2048x1024x1024"],
    "rmsnorm": ["4096x1024"],
    "topk": ["1024x4096x64"],
    "scaled_gemm": ["1024x1024x2048", "1024x1024x2048:scaling=row"],
    "attention": ["1x8x1024x2048x64", "1x8x1024x1024x64:causal=1,bwd"],
}
#: Declared bytes (inputs, outputs, intermediates) of the measured cases, MiB, by device type.
TARGETS = {"cpu": (16, 64), "cuda": (256, 2048)}


def _runnable(op, ctx, dtypes):
    """(structure case, dtype, [backends that run here]) of ``op``."""
    out = []
    for text in STRUCTURES.get(op.name, [f"{'x'.join(['256'] * len(op.dims))}"]):
        case = op.case(text)
        for dt in op.dtypes:
            if dtypes and dt not in dtypes:
                continue
            bks = [b for b, bk in op.backends.items() if bk.available(ctx, case, dt) is None]
            if bks:
                out.append((case, dt, bks))
    return out


def _write(out: Path, rows: list, fits: dict, head: list[str], guard_ms: list, dev_name: str, append: bool) -> str:
    """Write the table, fits and summary so far (after each family: a run cut short keeps what
    it measured); with ``append``, the rows already in OUT that this run did not measure stay."""
    import pandas as pd

    df = pd.DataFrame(rows)
    old = out / "memory_estimate.parquet"
    if append and old.exists():
        prev = pd.read_parquet(old)
        keys = {tuple(r) for r in df[["family", "backend", "dtype", "case"]].itertuples(index=False)} if len(df) else set()
        prev = prev[[tuple(r) not in keys for r in prev[["family", "backend", "dtype", "case"]].itertuples(index=False)]]
        df = pd.concat([prev, df], ignore_index=True)
        fpath = out / "fits.json"
        if fpath.exists():
            fits = {**json.loads(fpath.read_text()), **fits}
    if not len(df):
        return ""
    df.to_parquet(out / "memory_estimate.parquet", index=False)
    df.to_csv(out / "memory_estimate.csv", index=False)
    (out / "fits.json").write_text(json.dumps(fits, indent=1, sort_keys=True))
    ok = df[df["ratio"].notna()]
    lo, hi = (ok["ratio"].min(), ok["ratio"].max()) if len(ok) else (float("nan"), float("nan"))
    within = int(((ok["ratio"] >= 1 / 1.5) & (ok["ratio"] <= 1.5)).sum())
    show = df[["family", "backend", "dtype", "case", "estimate_bytes", "measured_bytes", "ratio", "status"]].copy()
    for col in ("estimate_bytes", "measured_bytes"):
        show[col] = show[col].map(lambda v: f"{v / 1e6:.1f}" if v == v and v is not None else "")
    show = show.rename(columns={"estimate_bytes": "estimate MB", "measured_bytes": "measured MB",
                                "ratio": "measured / estimate"})
    how = sorted({h for h in df["how_measured"] if h})
    fresh = "alone in a fresh child process (as a case near the limit runs)" if dev_name == "cpu" else \
        "in one child process per family (device peaks are exact per case)"
    md = [f"# Memory estimate against measured peaks ({dev_name})", "", *head, "",
          f"- Ratio measured / estimate: {lo:.2f} to {hi:.2f}; {within} of {len(ok)} rows within 1.5x either side.",
          f"- Measured: {', '.join(how)}; each case run as a sweep runs it (inputs, reference, build, check, "
          f"timing rounds, recheck), {fresh}, the allocator and compile caches as a sweep has them.",
          "- Estimate: fixed + factor x declared bytes per role, fitted to small probe cases measured in a child "
          "process (flyexplore.run.memory); each fit's factors and points are in fits.json; `fit_s` is the time "
          "the fits of a row's family, backends and dtype took (probes included), `allocated_bytes` and "
          "`held_bytes` (GPU) the allocator's allocated peak and what the driver says the process held after it.",
          f"- The guard where nothing needs measuring (each family's `cpu-small` suite against this device's "
          f"free memory): {', '.join(f'{f} {ms:.1f} ms' for f, ms, _ in guard_ms)}; "
          f"{sum(n for _, _, n in guard_ms)} case(s) needed an estimate.",
          "", show.to_markdown(index=False), ""]
    (out / "summary.md").write_text("\n".join(md))
    return "\n".join(md[:len(head) + 5])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the table, summary and fits")
    ap.add_argument("--families", help="comma list (default: every family)")
    ap.add_argument("--dtypes", help="comma list (default: every dtype a family takes here)")
    ap.add_argument("--targets", help="MiB of declared tensors per measured case, comma list")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in OUT that this run does not measure (a run in parts)")
    a = ap.parse_args(argv)

    import torch

    from flyexplore.ops import builtin_ops, get_op
    from flyexplore.ops.base import RunContext
    from flyexplore.run.plan import make_plan
    from flyexplore.world import env as ENV

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["FLYEXPLORE_CACHE"] = tempfile.mkdtemp(prefix="memest-cache-")   # fits made here, now
    from flyexplore.run import memory as M

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    kind = "cpu" if device.type == "cpu" else "cuda"
    targets = [int(float(x) * 2**20) for x in a.targets.split(",")] if a.targets else [t * 2**20 for t in TARGETS[kind]]
    families = a.families.split(",") if a.families else list(builtin_ops())
    dtypes = set(a.dtypes.split(",")) if a.dtypes else None
    env = ENV.collect()
    ctx = RunContext(device, env)
    dev_name = M.device_kind(device)
    p = subprocess.run([sys.executable, "-m", "flyexplore", "env", "--json"], capture_output=True, text=True,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    prov = ENV.provenance(SCRIPT, env, extra={"command": " ".join(argv if argv is not None else sys.argv[1:])})
    (out / "env.json").write_text(json.dumps({**json.loads(p.stdout), "provenance": prov}, indent=2)
                                  if p.returncode == 0 else json.dumps({"error": p.stderr[-2000:], "provenance": prov}))
    # the guard's cost where nothing needs measuring: each family's small suite on this device
    guard_ms = []
    for fam in families:
        if "cpu-small" in get_op(fam).suites:
            plan = make_plan(fam, suite="cpu-small")
            t0 = time.perf_counter()
            chk = M.memory_check(plan, device, measure=False)
            guard_ms.append((fam, (time.perf_counter() - t0) * 1e3, len(chk.estimates)))
    t_all = time.perf_counter()
    head = [f"`python benchmarks/evidence/memory_estimate.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
            f"torch {torch.__version__}, flyexplore {M.__version__}, {time.strftime('%Y-%m-%d')}, "
            f"{os.cpu_count()} CPU cores.", "", f"`{ENV.provenance_line(prov)}`", ""]
    rows, fits, text = [], {}, ""
    for fam in families:
        op = get_op(fam)
        for case0, dt, bks in _runnable(op, ctx, dtypes):
            sizes = []
            for t in targets:
                c = M.resize(op, case0, dt, t)
                if c not in sizes:
                    sizes.append(c)
            combos = [(b,) for b in bks] + ([tuple(bks)] if len(bks) > 1 else [])
            t0 = time.perf_counter()
            est, notes = M.estimate_cases(op, [(c, dt) for c in sizes], bks, device)
            fit_s = time.perf_counter() - t0
            per_backend = {b: M.estimate_cases(op, [(c, dt) for c in sizes], [b], device, measure=False)[0]
                           for b in bks}
            fits.update({key: fit.to_json() for key, fit in M._FITS.items()})
            jobs = [(c, dt, combo) for combo in combos for c in sizes]
            got = M.measure_cases(op, jobs, device, tidy_malloc=False, fresh=device.type == "cpu")
            for (c, _, combo), g in zip(jobs, got):
                e = est.get((c.label, dt)) if len(combo) > 1 else per_backend[combo[0]].get((c.label, dt))
                peak = g.get("peak")
                rows.append({
                    "family": fam, "backend": "+".join(combo), "dtype": dt, "case": c.label, "device": dev_name,
                    "declared_bytes": sum(M.features(op, c, dt).values()),
                    "estimate_bytes": e.total if e else None, "measured_bytes": peak,
                    "ratio": round(peak / e.total, 3) if e and peak else None,
                    "allocated_bytes": g.get("allocated"), "held_bytes": g.get("held"),
                    "context_bytes": g.get("context"),
                    "status": ",".join(g.get("status") or []) or "not run", "case_s": g.get("seconds"),
                    "fit_s": round(fit_s, 1), "estimate_terms": e.terms if e else "; ".join(notes),
                    "how_measured": g.get("how") or "", "torch": torch.__version__,
                    "message": (g.get("message") or "")[:200]})
                print(f"{fam:12s} {'+'.join(combo):16s} {dt:8s} {c.label:28s} est "
                      f"{(e.total / 1e6 if e else float('nan')):9.1f} MB  measured "
                      f"{(peak / 1e6 if peak else float('nan')):9.1f} MB  ratio {rows[-1]['ratio']}", flush=True)
            head[-1] = f"{time.perf_counter() - t_all:.0f} s for the rows measured by this run."
            text = _write(out, rows, fits, head, guard_ms, dev_name, a.append)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
