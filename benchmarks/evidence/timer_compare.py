"""Compare flyexplore's timer with triton.testing.do_bench and torch.utils.benchmark on the same
calls: the 15 published dense BF16 shapes (NT layout), ATen eager and torch.compile Triton.

Not a test: run on a GPU and commit the output with its environment.

    python benchmarks/evidence/timer_compare.py OUT_DIR [--backends aten,triton] [--limit N]

Writes ``OUT_DIR/timer_compare.csv`` (one row per shape and backend; times in µs, harness wall
time in s) and ``OUT_DIR/env.json`` (``flyexplore env --json`` with the run's provenance under
``provenance``: commit, flyexplore's version, the machine), and prints a table. Columns:

- ``do_bench_us``: ``triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")``
  (256 MB flush, events per call).
- ``fx_event_us``, ``fx_kernel_us``, ``fx_graph_us``, ``fx_auto_us``: flyexplore's Timer in
  each mode (median); ``fx_auto_mode``: the mode ``auto`` chose.
- ``utils_bench_us``: ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time=0.2)``
  median (host clock, synchronizes per block).
- ``*_wall_s``: wall-clock seconds each harness took to produce its number (harness overhead).
- ``event_vs_do_bench``: fx_event_us / do_bench_us (target: within 3% for calls >= 50 µs).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--backends", default="aten,triton")
    ap.add_argument("--limit", type=int, default=0, help="only the first N shapes")
    a = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        sys.exit("timer_compare needs a CUDA or ROCm GPU")
    import triton.testing
    import torch.utils.benchmark as tb

    from flyexplore.world.env import collect, env_json
    from flyexplore.ops import get_op
    from flyexplore.ops.base import RunContext
    from flyexplore.ops.base import reset_dynamo
    from flyexplore.measure.timing import Timer

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = collect()
    (out / "env.json").write_text(env_json("benchmarks/evidence/timer_compare.py", env))
    op = get_op("gemm")
    dev = torch.device("cuda:0")
    ctx = RunContext(dev, env)
    cases = op.get_suite("published-bf16").cases
    if a.limit:
        cases = cases[: a.limit]
    rows = []
    fields = None
    for case in cases:
        inputs = op.make_inputs(case, "bf16", dev, 0)
        for b in a.backends.split(","):
            bk = op.get_backend(b)
            reset_dynamo()
            with bk.context(ctx, case):
                fn = bk.build(case, "bf16", inputs, ctx)
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                row = {"m": case["m"], "n": case["n"], "k": case["k"], "layout": case["layout"],
                       "backend": b, "first_call_s": time.perf_counter() - t0}

                def timed(label, f):
                    t = time.perf_counter()
                    v = f()
                    row[f"{label}_wall_s"] = round(time.perf_counter() - t, 3)
                    return v

                row["do_bench_us"] = 1e3 * timed("do_bench", lambda: triton.testing.do_bench(
                    fn, warmup=25, rep=100, return_mode="median"))
                for mode in ("event", "kernel", "graph", "auto"):
                    try:
                        m = timed(f"fx_{mode}", lambda: Timer(fn, dev, mode=mode).measure())
                        row[f"fx_{mode}_us"] = m.median * 1e3
                        row[f"fx_{mode}_iqr_us"] = m.iqr * 1e3
                        row[f"fx_{mode}_n"] = m.n
                        if mode == "auto":
                            row["fx_auto_mode"] = m.mode
                            row["fx_auto_per_call_us"] = (m.per_call_ms or float("nan")) * 1e3
                            row["fx_auto_host_bound"] = m.host_bound
                            row["fx_auto_kernels"] = ";".join(k.name[:60] for k in m.kernels)
                            row["fx_auto_notes"] = "; ".join(m.notes)
                    except Exception as exc:
                        row[f"fx_{mode}_us"] = float("nan")
                        row[f"fx_{mode}_error"] = f"{type(exc).__name__}: {exc}"[:200]
                ub = timed("utils_bench", lambda: tb.Timer(stmt="fn()", globals={"fn": fn})
                           .blocked_autorange(min_run_time=0.2))
                row["utils_bench_us"] = ub.median * 1e6
                row["event_vs_do_bench"] = row["fx_event_us"] / row["do_bench_us"]
                row["kernel_vs_do_bench"] = row["fx_kernel_us"] / row["do_bench_us"]
                row["tflops_auto"] = 2 * case["m"] * case["n"] * case["k"] / (row["fx_auto_us"] * 1e-6) / 1e12
            rows.append(row)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                              if not k.endswith("kernels")}), flush=True)
            fields = list(dict.fromkeys([*(fields or []), *row]))
            with open(out / "timer_compare.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows(rows)
        del inputs
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
