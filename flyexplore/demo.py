"""The main job: ``flyexplore demo`` -- detect the machine, sweep GEMM, RMSNorm and TopK with
every backend (unavailable ones recorded with their reason), and write results, the
environment report and an HTML report.

Suites by machine: CPU -> each operator's ``cpu-small`` suite (about a minute on 2 cores);
GPU -> the LLM suites (Llama-3.1-8B GEMMs, Llama hidden-size RMSNorm, sampling/MoE TopK).
"""
from __future__ import annotations

import json
from pathlib import Path

from . import results as R
from .env import collect
from .report import check_report_dir, write_report
from .sweep import default_device, run_sweep

#: (operator, suite on CPU, suite on GPU)
DEMO_SUITES = (("gemm", "cpu-small", "llama3.1-8b"),
               ("rmsnorm", "cpu-small", "llm"),
               ("topk", "cpu-small", "llm"))


def demo_files() -> tuple[str, ...]:
    """Names of the files the demo writes into its folder besides the report: one result file
    per operator (and its journal while it runs), results.parquet, results.csv and env.json."""
    per_op = [f"{op}.parquet{sfx}" for op, _, _ in DEMO_SUITES for sfx in ("", ".partial.jsonl")]
    return (*per_op, "results.parquet", "results.csv", "env.json")


def run_demo(out_dir: str | Path = "flyexplore-demo", progress: bool = True, timer: dict | None = None,
             static: bool = True) -> Path:
    """Run the demo sweep into ``out_dir`` (results.parquet, results.csv, env.json,
    report.html, and with ``static`` the figures as PNG/SVG/PDF under ``figures/``); returns
    the report's path. Earlier demo files in ``out_dir`` are replaced; a folder holding anything
    else is refused before anything runs.
    Raises :class:`~flyexplore.errors.UsageError` if ``out_dir`` cannot be written or holds
    other files (:func:`flyexplore.report.check_report_dir`)."""
    out = Path(out_dir)
    check_report_dir(out, keep=demo_files())
    R.check_path(out / "results.parquet")
    env = collect()
    gpu = default_device().type == "cuda"
    frames = []
    for op, cpu_suite, gpu_suite in DEMO_SUITES:
        frames.append(run_sweep(op, suite=gpu_suite if gpu else cpu_suite,
                                out=out / f"{op}.parquet", overwrite=True, progress=progress,
                                timer=timer))
    df = R.concat(frames)
    R.save(df, out / "results.parquet")
    R.save(df, out / "results.csv")
    (out / "env.json").write_text(json.dumps(env.to_dict(), indent=2, default=str))
    return write_report(df, out, env, title=f"flyexplore demo on {env.device.name} ({env.platform})",
                        static=static, keep=demo_files())
