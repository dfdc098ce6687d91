"""Measure the published MI355X suites' shapes on this GPU and write the report with the
measured-vs-published comparison. Not a test: run on a GPU and commit the output with its
environment.

    python benchmarks/gpu/gpu_published_report.py OUT_DIR [--budget-s 250] [--no-images]

Sweeps (GPU), in this order: ``gemm`` suite ``published-bf16`` and ``grouped_gemm`` suite
``published`` with aten + triton (the published suites' baselines), ``topk`` suite
``published`` with aten (both determinism settings), ``rmsnorm`` suite ``published`` with
aten + inductor. On a CPU (a smoke run of this script) the operators'
``cpu-small`` suites with aten only. The sweeps stop starting new cases after ``--budget-s``
seconds (finished rows are kept; the stop is printed).

Writes ``OUT_DIR/results.parquet``, ``results.csv``, ``env.json`` (``flyexplore env --json`` with
the run's provenance under ``provenance``: commit, flyexplore's version, the machine),
and ``OUT_DIR/report/`` (``report.html``, ``figures/*.{png,svg,pdf}`` when kaleido finds a
Chromium, ``tables/*.{csv,md,tex}``). On a machine without plotly the report is skipped and
the reason printed; the results are still written.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GPU_PLAN = (("gemm", "published-bf16", "aten,triton"),
            ("grouped_gemm", "published", "aten,triton"),
            ("topk", "published", "aten"),
            ("rmsnorm", "published", "aten,inductor"))
CPU_PLAN = (("gemm", "cpu-small", "aten"), ("rmsnorm", "cpu-small", "aten"), ("topk", "cpu-small", "aten"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=250.0, help="stop starting new cases after this")
    ap.add_argument("--no-images", action="store_true")
    a = ap.parse_args(argv)

    from flyexplore.results import table as R
    from flyexplore.world.env import collect, env_json
    from flyexplore.run.spec import SweepSpec
    from flyexplore.measure.devstate import default_device
    from flyexplore.run.sweep import run_sweep

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = collect()
    (out / "env.json").write_text(env_json("benchmarks/gpu/gpu_published_report.py", env))
    gpu = default_device().type == "cuda"
    deadline = time.monotonic() + a.budget_s
    frames = []
    for op, suite, backends in (GPU_PLAN if gpu else CPU_PLAN):
        if time.monotonic() > deadline:
            print(f"budget of {a.budget_s:.0f} s spent: {op} {suite} not started")
            continue
        t0 = time.monotonic()
        df = run_sweep(SweepSpec(op, suite=suite, backends=backends, out=out / f"{op}.parquet", overwrite=True),
                       progress=False, should_stop=lambda: time.monotonic() > deadline)
        print(f"{op} {suite} [{backends}]: {len(df)} rows in {time.monotonic() - t0:.0f} s")
        frames.append(df)
    df = R.concat(frames)
    R.save(df, out / "results.parquet")
    R.save(df, out / "results.csv")
    print(f"{len(df)} rows written to {out / 'results.parquet'}")
    try:
        import plotly  # noqa: F401
    except ImportError:
        print("plotly is not installed here: report skipped (run `flyexplore report "
              f"{out / 'results.parquet'} --with-published --out REPORT` elsewhere)")
        return 0
    from flyexplore.views.report import write_report

    path = write_report(df, out / "report", env, title=f"Published MI355X suites measured on {env.device.name}",
                        static=not a.no_images, published=True)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
