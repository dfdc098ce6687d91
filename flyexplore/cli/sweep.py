"""``flyexplore sweep``: the flags become one :class:`flyexplore.run.spec.SweepSpec` (which checks
every value, names first, before anything imports torch or opens a file), run by
:func:`flyexplore.run.sweep.run_sweep`; then a table a reader can scan.

What is the command line's own, not the spec's: ``--in-process``/``--executor`` become the spec's
``engine``; ``--timing``, ``--rep``, ``--warmup``, ``--rep-ms``, ``--ci-target``, ``--budget-s``
become its ``timer`` (``--warmup`` defaults to a quarter of ``--rep``); ``--shapes`` without
``--dtypes`` runs fp32 on the CPU when the operator has it (:func:`dtypes_for`).
"""
from __future__ import annotations

import argparse
import signal
import sys

from flyexplore.cli._shared import (
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    catalogue,
    gpu_visible,
    stopped_line,
    values_text,
)
from flyexplore.errors import UsageError
from flyexplore.measure import modes
from flyexplore.measure.stats import BAND
from flyexplore.parsing import parse_bytes  # noqa: F401 - named here too (flyexplore model --max-memory)

HELP = "run a sweep; rows are kept as they finish"


def _pct(x: float) -> str:
    return f"{x:.0%}".replace("%", "%%")  # argparse %-formats help text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = (values_text() + "\n\n" + modes.listing()
                + "\n\nexamples:\n  flyexplore sweep --op gemm --suite cpu-small --out r.parquet\n"
                "  flyexplore sweep --op rmsnorm --shapes '2048x4096;8192x4096' --backends aten,inductor "
                "--out r.csv\n"
                "  flyexplore sweep --op attention --shapes 4x32x2048x2048x128:causal=1 --dtypes bf16 --backends "
                "flash \\\n      --env 0.13b=/opt/envs/aot013/bin/python --env 0.14.2b=/opt/envs/aot0142/bin/python "
                "--out ab.parquet\n"
                "  flyexplore sweep --op gemm --suite published-bf16 --backends aten --env base "
                "--env lt:TORCH_BLAS_PREFER_HIPBLASLT=0 --out lt.parquet")
    p.add_argument("--op", required=True, help="operator: " + ", ".join(catalogue()))
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--suite", help="a named shape set of the operator (below; flyexplore suites)")
    g.add_argument("--shapes", help="inline shapes, e.g. '4096x4096x4096;8x4096x4096:NN'")
    g.add_argument("--shapes-from", metavar="FILE", help="the shapes of --op in a file written by flyexplore "
                   "model --export-shapes (each with its dtype; rows keep the model's module and call count)")
    p.add_argument("--dtypes", help="comma-separated, e.g. bf16,fp16 (default: the suite's; with --shapes "
                   "the operator's first dtype on a GPU, fp32 on the CPU)")
    p.add_argument("--backends", help="comma-separated (default: all of the operator's; below)")
    p.add_argument("--out", required=True, help="result file: .parquet, .csv or .jsonl")
    p.add_argument("--resume", action="store_true", help="skip cases already in --out")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--device", help="torch device (default: cuda:0 if present, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", default=modes.ORDERS[0], choices=modes.ORDERS,
                   help="interleaved (default): every backend of a case built and warmed, then timed in "
                   "shared rounds until the labels are decided and the 95%% intervals tight; block: one backend after the other "
                   "(the old order; wider, unpaired intervals)")
    p.add_argument("--timing", default=modes.DEFAULT,
                   help="; ".join(f"{o}: {' | '.join(modes.names(o))}" for o in modes.ORDERS)
                   + f" (default {modes.DEFAULT}: {modes.auto_text()}; the table below)")
    p.add_argument("--ci-target", type=float, help="stop a case when every speedup label is decided "
                   "and every median's 95%% interval is within ±this fraction (default 0.01)")
    p.add_argument("--band", type=float, help=f"equivalence band of the SAME label (default {BAND:g} = "
                   f"±{_pct(BAND)})")
    p.add_argument("--budget-s", type=float, help="hard time limit of one case after warm-up, s "
                   "(default 10 on GPU, 2 on CPU; most cases stop earlier, at the time caps: 0.1 s per "
                   "backend once the labels are decided, 0.18 s while one is not; on CPU 0.2 s and 0.6 s: "
                   "flyexplore.measure.interleaved's PRECISION_CAP_S, LABEL_CAP_S); "
                   "past it the row is flagged unconverged")
    p.add_argument("--baseline", help="backend speedups are taken against (default: the operator's, "
                   "e.g. aten)")
    p.add_argument("--rep", type=int, help="interleaved: a fixed number of rounds; block: timed calls "
                   "(default: adaptive / by time budget)")
    p.add_argument("--warmup", type=int, help="warm-up rounds (interleaved) or calls (block), with --rep")
    p.add_argument("--rep-ms", type=float, help="interleaved: the case budget, ms; block: time budget "
                   "for timed calls, ms")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--trace", action="store_true",
                   help="record what really ran for every row (observed, autotune; flydsl rows always)")
    p.add_argument("--in-process", action="store_true",
                   help="run every case in this process (for debugging; the default on the CPU). On a GPU "
                   "the default is worker processes: a crash or hang becomes a crashed/timeout row")
    p.add_argument("--executor", choices=("local", "ray"),
                   help="local (default): worker processes on this machine; ray: Ray actors, num_gpus=1 "
                   "each (pip install 'flyexplore[ray]')")
    p.add_argument("--devices", help="all, or GPU indices such as 0,1: one worker per GPU, pinned with "
                   "CUDA_VISIBLE_DEVICES (NVIDIA) or HIP_VISIBLE_DEVICES (ROCm); cases handed out most "
                   "expensive first")
    p.add_argument("--workers", type=int, help="CPU: this many worker processes (sharding on the CPU); "
                   "ray: at most this many actors")
    p.add_argument("--processes", type=int, metavar="N",
                   help="measure every case in N fresh worker processes (one pass of the plan each, the "
                   "case order rotated between passes) and combine them: each row's interval then covers "
                   "what another run reads (default 1: one process, its own interval)")
    p.add_argument("--case-timeout", type=float, metavar="SECONDS",
                   help="a case (compile included) running longer gets timeout rows and its worker is "
                   "killed and replaced (default 900; 0 = none)")
    p.add_argument("--max-cases-per-worker", type=int, metavar="N",
                   help="replace a worker after N cases, against leaks (default 50)")
    p.add_argument("--retry-failed", action="store_true",
                   help="with --resume: run crashed and timeout rows again (default: keep them)")
    p.add_argument("--worker-start-timeout", type=float, metavar="SECONDS",
                   help="a worker not ready this long after its start (CUDA/HIP initialisation included) is "
                   "killed and started again, a few times; then the remaining cases get crashed rows "
                   "(default 300)")
    p.add_argument("--max-memory", metavar="BYTES",
                   help="refuse a case whose estimated memory (its peak, measured on small cases of the same "
                   "operator and backend) is over this, e.g. 40GB or 32GiB (always: over the device's free "
                   "memory); refused cases become refused rows; on the CPU a case over half of it runs in a "
                   "watched worker process (past the limit: an oom row)")
    p.add_argument("--extend", action="store_true",
                   help="with --resume: add this plan's cases to a file made by another plan (a resume "
                   "with another plan is otherwise refused, naming what differs)")
    p.add_argument("--force", action="store_true",
                   help="run past the stated limits: --processes or --pairs over 20, or a time bound over 24 h "
                   "(a note gives the bound before any sweep over 5 minutes)")
    p.add_argument("--ray-address", help="Ray cluster to join, e.g. ray://head:10001 (default: "
                   "$RAY_ADDRESS, else a local Ray instance for this sweep)")
    g = p.add_argument_group(
        "environment A/B (two torch builds, flydsl versions or library settings, timed round by round on one GPU)")
    g.add_argument("--env", action="append", metavar="NAME[=PYTHON][:VAR=VALUE,...]",
                   help="an environment: NAME alone is this interpreter; NAME=/path/to/python another one (a conda "
                   "env, a venv); :VAR=VALUE,... variables set at its start (VAR= empty, -VAR removed). Give two or "
                   "more; each case's arms (backend@NAME) are timed in one worker per environment, the workers "
                   "taking turns round by round")
    g.add_argument("--pairs", metavar="auto|K", help="fresh pairs of workers, one pass of the plan each, the case "
                   "order rotated; each row's interval includes the spread between pairs. auto (default): 3 pairs, "
                   "then one more at a time for each case whose label is still AMBIGUOUS, up to --max-pairs "
                   "(labels read at a confidence corrected for the repeated looks); K: exactly K")
    g.add_argument("--max-pairs", type=int, metavar="K", help="the most pairs --pairs auto gives a case (default 10)")
    g.add_argument("--aa", action="store_true", help="A/A: the one --env (default: this interpreter) against a "
                   "copy of itself, the floor of an A/B")
    g.add_argument("--worker-code", choices=("driver", "env"), default="driver",
                   help="driver (default): every environment runs this flyexplore's source; env: each "
                   "environment's own installed flyexplore (the same version)")


def dtypes_for(a: argparse.Namespace) -> str | None:
    """The sweep's ``--dtypes``: as given, or for ``--shapes`` on the CPU (``--device cpu``, or
    no ``--device`` and no GPU device node) ``fp32`` when the operator has it (bf16 is emulated
    slowly on most CPUs and rarely what a CPU user means); else ``None`` (the spec's default)."""
    on_cpu = (a.device or "").startswith("cpu") or (a.device is None and not gpu_visible())
    if a.shapes and not a.dtypes and on_cpu and "fp32" in catalogue().get(a.op, ((), ()))[1]:
        return "fp32"
    return a.dtypes


def timer_of(a: argparse.Namespace) -> dict:
    """The spec's ``timer`` from the flags: ``mode`` (``--timing``), ``rep``, ``warmup`` (with
    ``--rep`` alone: a quarter of it, at least 1), ``rep_ms``, ``target`` (``--ci-target``),
    ``budget_s``. Checked by the spec."""
    t = {"mode": a.timing}
    if a.rep is not None:
        t["rep"] = a.rep
    if a.warmup is not None:
        t["warmup"] = a.warmup
    elif isinstance(a.rep, int) and a.rep >= 1:
        t["warmup"] = max(1, a.rep // 4)
    if a.rep_ms is not None:
        t["rep_ms"] = a.rep_ms
    if a.ci_target is not None:
        t["target"] = a.ci_target
    if a.budget_s is not None:
        t["budget_s"] = a.budget_s
    return t


def engine_of(a: argparse.Namespace) -> str:
    """The spec's ``engine`` from ``--in-process`` and ``--executor``."""
    if a.in_process and a.executor == "ray":
        raise UsageError("--in-process and --executor ray exclude each other")
    return "in-process" if a.in_process else (a.executor or "auto")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.run.spec import TIME_NOTE_S, SweepSpec

    kw = {"band": a.band} if a.band is not None else {}
    spec = SweepSpec(a.op, suite=a.suite, shapes=a.shapes, dtypes=dtypes_for(a), backends=a.backends,
                     device=a.device, seed=a.seed, order=a.order, timer=timer_of(a), baseline=a.baseline,
                     trace=a.trace, engine=engine_of(a), devices=a.devices, workers=a.workers, processes=a.processes,
                     case_timeout=a.case_timeout, max_cases_per_worker=a.max_cases_per_worker,
                     ray_address=a.ray_address, worker_start_timeout=a.worker_start_timeout,
                     max_memory=parse_bytes(a.max_memory, "--max-memory") if a.max_memory is not None else None,
                     out=a.out, shapes_from=a.shapes_from, resume=a.resume, overwrite=a.overwrite,
                     retry_failed=a.retry_failed, extend=a.extend, force=a.force, flags=True,
                     envs=a.env, pairs=a.pairs, max_pairs=a.max_pairs, aa=a.aa, worker_code=a.worker_code, **kw)
    from flyexplore.run.sweep import NOTES_ATTR, PROBLEMS_ATTR, run_sweep
    from flyexplore.views.report import summary_table
    from flyexplore.views.tables import scan_table

    for n in getattr(spec.plan, "notes", ()):
        print(f"flyexplore: note: {n}", file=sys.stderr)
    if a.quiet and spec.time_bound_s() > TIME_NOTE_S:   # with a progress bar run_sweep says it
        print(f"flyexplore: note: {spec.time_note()}", file=sys.stderr)
    got: list[int] = []

    def terminated(signum, frame):  # SIGTERM (timeout, docker stop, Slurm): as Ctrl-C, rows kept
        got.append(signum)
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: leave SIGTERM as it is
        old = None
    try:
        df = run_sweep(spec, progress=not a.quiet)
    except KeyboardInterrupt:
        print(stopped_line(a.out, 'terminated' if got else 'interrupted'), file=sys.stderr)
        return EXIT_TERMINATED if got else EXIT_INTERRUPTED
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    table, caption, notes = scan_table(summary_table(df))
    print(table.to_string(index=False))
    if caption:
        print("all rows: " + "; ".join(caption) + "; times in µs")
    for n in notes:
        print(n)
    for n in df.attrs.get(NOTES_ATTR, [])[len(getattr(spec.plan, "notes", ())):]:
        print(f"flyexplore: note: {n}", file=sys.stderr)
    print(f"{len(df)} rows written to {a.out}")
    problems = df.attrs.get(PROBLEMS_ATTR, [])
    for p in problems:
        print(f"flyexplore: sweep incomplete: {p}", file=sys.stderr)
    return EXIT_INCOMPLETE if problems else 0
