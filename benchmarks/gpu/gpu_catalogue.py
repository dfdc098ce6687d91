"""Catalogue run on one GPU: grouped GEMM (ATen vs Triton, plus the per-group loop), FP8 scaled
GEMM (per-tensor and per-row scales), MXFP8/MXFP4 emulation accuracy (and the native MX row,
unavailable with torch's reason where the GPU lacks MX block scaling), and every SDPA backend,
forward and backward -- all through :func:`flyexplore.run.sweep.run_sweep`.

Usage, from the repository root::

    python benchmarks/gpu/gpu_catalogue.py OUT_DIR [--budget-s 240] [--parts a,b,...]

Writes to OUT_DIR: one result file per part (``<part>.parquet``; ``.jsonl`` where pyarrow is
missing), everything together in ``results.parquet`` and ``results.csv``, the environment (``env.json``, as ``flyexplore env
--json`` prints it with the run's provenance under ``provenance``: commit, flyexplore's version, the
machine; and ``env.txt``, with the commit) and ``summary.json`` (rows per status, seconds per part,
parts cut short by the time budget). Sized for an H200 with torch 2.11 (no FlyDSL there:
those rows are unavailable with the reason) to finish in under 5 minutes: no new row starts
after ``--budget-s`` seconds, and the parts run most important first.

Without a GPU it runs each operator's ``cpu-small`` suite instead (the CPU-testable part;
about half a minute on 2 cores).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: Grouped GEMM cases given to the Triton backend: each compiles and autotunes Inductor's
#: grouped-GEMM template (up to 144 configs before pruning, ~30 s), so only two published
#: cases: a uniform one and the ragged one with empty groups.
TRITON_GROUPED = ("8x512x4096x4096", "8x2048x4096x4096:ms=0/1024/0/512/2048/128/0/896")


@dataclass(frozen=True)
class Part:
    """One sweep of the run: an operator, a suite or shapes, backends, timer options."""

    name: str
    op: str
    suite: str | None = None
    shapes: tuple[str, ...] | None = None
    dtypes: str | None = None
    backends: str | None = None
    timer: dict = field(default_factory=dict)


GPU_TIMER = {"rep": 20, "warmup": 5}

GPU_PARTS = (
    Part("grouped_published", "grouped_gemm", suite="published", backends="aten,reference",
         timer=GPU_TIMER),
    Part("grouped_triton", "grouped_gemm", shapes=TRITON_GROUPED, dtypes="bf16",
         backends="aten,triton,flydsl", timer=GPU_TIMER),
    Part("attention_llm", "attention", suite="llm", timer={"rep": 10, "warmup": 3}),
    Part("scaled_fp8", "scaled_gemm", suite="published-shapes-fp8", backends="aten",
         timer=GPU_TIMER),
    Part("scaled_mx", "scaled_gemm", suite="published", backends="aten,flydsl,emulated",
         timer={"rep": 5, "warmup": 2}),
    Part("grouped_moe", "grouped_gemm", suite="mixtral-8x7b", backends="aten,reference",
         timer=GPU_TIMER),
    Part("grouped_moe_qwen", "grouped_gemm", suite="qwen3-30b-a3b", backends="aten,reference",
         timer=GPU_TIMER),
)

CPU_TIMER = {"rep": 3, "warmup": 1}
CPU_PARTS = (
    Part("grouped_cpu", "grouped_gemm", suite="cpu-small", timer=CPU_TIMER),
    Part("scaled_cpu", "scaled_gemm", suite="cpu-small", timer=CPU_TIMER),
    Part("attention_cpu", "attention", suite="cpu-small", timer=CPU_TIMER),
)


def run(out_dir: str | Path, budget_s: float = 240.0, parts: list[str] | None = None,
        device: str | None = None, progress: bool = True) -> dict:
    """Run the parts for this machine (GPU or CPU) into ``out_dir``; returns the summary dict
    (also written to ``summary.json``). Raises ``UsageError`` for an unknown part name."""
    from flyexplore.results import table as R
    from flyexplore.world.env import collect, env_json
    from flyexplore.errors import bad_choice
    from flyexplore.run.spec import SweepSpec
    from flyexplore.measure.devstate import default_device
    from flyexplore.run.sweep import run_sweep

    import torch

    t0 = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device) if device else default_device()
    plan = GPU_PARTS if dev.type == "cuda" else CPU_PARTS
    if parts:
        names = {p.name for p in plan}
        for p in parts:
            if p not in names:
                raise bad_choice("part", p, names)
        plan = tuple(p for p in plan if p.name in parts)
    env = collect()
    (out / "env.json").write_text(env_json("benchmarks/gpu/gpu_catalogue.py", env))
    (out / "env.txt").write_text(env.to_text() + "\n")
    deadline = t0 + budget_s
    # Parquet needs pyarrow; without it (a bare GPU image) the per-part files are JSON Lines.
    ext = ".parquet" if importlib.util.find_spec("pyarrow") else ".jsonl"
    summary = {"device": str(dev), "budget_s": budget_s, "parts": []}
    frames = []
    for p in plan:
        entry = {"part": p.name, "op": p.op, "suite": p.suite, "shapes": p.shapes,
                 "backends": p.backends, "file": f"{p.name}{ext}"}
        summary["parts"].append(entry)
        if time.monotonic() > deadline:
            entry["skipped"] = "time budget spent before this part started"
            continue
        ts = time.monotonic()
        try:
            spec = SweepSpec(p.op, suite=p.suite, shapes=list(p.shapes) if p.shapes else None,
                             dtypes=p.dtypes, backends=p.backends, out=out / entry["file"],
                             overwrite=True, device=dev, timer=p.timer)
            df = run_sweep(spec, progress=progress, should_stop=lambda: time.monotonic() > deadline)
        except Exception as exc:  # keep the other parts: one broken part must not end the run
            entry["failed"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"[{time.monotonic() - t0:6.1f} s] {p.name}: FAILED {entry['failed']}", flush=True)
            continue
        finally:
            entry["seconds"] = round(time.monotonic() - ts, 1)
            (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        entry["rows"] = len(df)
        entry["status"] = df["status"].value_counts().to_dict()
        entry["cut_by_budget"] = time.monotonic() > deadline
        frames.append(df)
        print(f"[{time.monotonic() - t0:6.1f} s] {p.name}: {len(df)} rows {entry['status']}",
              flush=True)
    df = R.concat(frames)
    R.save(df, out / f"results{ext}")
    R.save(df, out / "results.csv")
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["rows"] = len(df)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main(argv: list[str] | None = None) -> int:
    from flyexplore.errors import UsageError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="no new row starts after this many seconds (default 240)")
    ap.add_argument("--parts", help="comma-separated subset of the parts to run")
    ap.add_argument("--device", help="torch device (default: cuda:0 if present, else cpu)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    try:
        s = run(a.out_dir, a.budget_s, a.parts.split(",") if a.parts else None, a.device,
                progress=not a.quiet)
    except UsageError as exc:
        print(f"gpu_catalogue: error: {exc}", file=sys.stderr)
        return 2
    print(f"{s['rows']} rows in {s['seconds']} s -> {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
