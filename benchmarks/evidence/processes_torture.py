"""Torture test of a ``--processes`` sweep's journal (issue 33): one sweep, SIGKILLed ``--kills``
times at random moments and resumed after each kill, until it finishes; then every row is checked.

Before issue 33 a ``--processes N`` sweep journaled nothing until its last pass: ten kills of a
54 s run each found 0 rows, and each resume started from zero. Now each pass row is committed as
it comes (:mod:`flyexplore.run.journal`, table ``passes``) and a resume runs only the passes
still missing. This script checks that on the real command line:

- the sweep is ``flyexplore sweep --op gemm --shapes <S> --dtypes fp32 --backends aten
  --processes 3 --rep 5 --out OUT --quiet`` on the CPU (``--resume`` after the first run);
- each run is killed with SIGKILL (the driver alone, as ``kill -9 PID``; its workers see it gone
  and exit) at a random moment: one run in five at a time drawn from ``[--min-s, --max-s]``
  after its start (mostly while it imports and starts its workers), the others once the
  journal holds a random number of new pass rows (1 to twice the plan's pass rows / (kills +
  2)), plus a random 0-0.3 s (between cases, mid-case, between passes) -- so that the kills
  come at every stage and the sweep is still unfinished at the last one whatever the load;
- after each kill, the journal's pass rows and combined rows are read (read-only) and compared
  with what was there before: a pass row that vanished or changed (another worker, another
  time) is a pass *not kept*;
- after the last kill the sweep is resumed to its end. The file must then hold every plan key
  once (``lost``, ``duplicated``), each row combined from 3 processes whose per-process
  estimates are the pass rows seen in the journal (same worker, same time: ``not kept``
  otherwise), and no journal left.

    python benchmarks/evidence/processes_torture.py --kills 20 --out data/bench/processes_torture.txt

takes about 6 minutes on a 2-core CPU

prints a line per run and a summary; exit 1 when a row was lost or doubled or a pass not kept. The
``--out`` report's second line is its provenance (commit, flyexplore's version, the machine).
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from torture import end, kill_at  # noqa: E402 - benchmarks/evidence/ is sys.path[0] when run as a script

PROCESSES = 3


def shapes(n: int) -> str:
    """``n`` small CPU GEMMs (8x8x8, 16x16x16, ...): enough cases that 20 kills come before the end."""
    return ";".join(f"{k}x{k}x{k}" for k in range(8, 8 * n + 1, 8))


SHAPES = shapes(120)


def _cmd(out: Path, resume: bool) -> list[str]:
    return [sys.executable, "-m", "flyexplore", "sweep", "--op", "gemm", "--shapes", SHAPES, "--dtypes", "fp32",
            "--backends", "aten", "--device", "cpu", "--processes", str(PROCESSES), "--rep", "5", "--out", str(out),
            "--quiet", *(["--resume"] if resume else [])]


def _pass_count(out: Path) -> int:
    from flyexplore.run.journal import committed_rows

    try:
        return len(committed_rows(out, passes=True))
    except Exception:  # noqa: BLE001 - a journal being created this moment
        return 0


def _run(out: Path, resume: bool, kill_after: float | None, rows_after: int | None = None,
         extra_s: float = 0.0) -> tuple[int, float, str]:
    """One run of the sweep: killed ``kill_after`` s after its start, or ``extra_s`` after the
    journal holds ``rows_after`` pass rows, or (both None) left to its end."""
    t0 = time.monotonic()
    p = subprocess.Popen(_cmd(out, resume), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        if kill_after is not None:
            kill_at(p, kill_after)
        elif rows_after is not None:
            while p.poll() is None and _pass_count(out) < rows_after:
                time.sleep(0.1)
            time.sleep(extra_s)
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        err = p.communicate(timeout=1800)[1].decode(errors="replace")
    finally:
        p.kill()
    if p.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"sweep failed ({p.returncode}): {err[-2000:]}")
    return p.returncode, time.monotonic() - t0, err


def _journal(out: Path) -> tuple[dict, dict]:
    """(pass rows: (case, pass) -> (worker, time_ms); combined rows: case -> (run_id, time_ms))."""
    from flyexplore.run.journal import committed_rows

    passes = {(r["case"], int(r["pass"])): (r["worker"], float(r["time_ms"]))
              for _, r in committed_rows(out, passes=True).iterrows()}
    final = {r["case"]: (r["run_id"], float(r["time_ms"])) for _, r in committed_rows(out).iterrows()}
    return passes, final


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs (default 20)")
    ap.add_argument("--min-s", type=float, default=0.5, help="a timed kill's earliest moment, s (default 0.5)")
    ap.add_argument("--max-s", type=float, default=15.0, help="a timed kill's latest moment, s (default 15)")
    ap.add_argument("--cases", type=int, default=120, help="GEMM cases in the plan (default 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the report here (e.g. data/bench/processes_torture.txt)")
    a = ap.parse_args(argv)
    global SHAPES
    SHAPES = shapes(a.cases)
    from flyexplore.results import table as R
    from flyexplore.run.journal import journal_path, leftovers

    rng = random.Random(a.seed)
    folder = Path(tempfile.mkdtemp(prefix="flyexplore-ptorture-"))
    out = folder / "sweep.parquet"
    n_keys = len(SHAPES.split(";"))
    lines = [f"# benchmarks/evidence/processes_torture.py --kills {a.kills} --min-s {a.min_s} --max-s {a.max_s} --cases {a.cases} "
             f"--seed {a.seed}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load "
             f"{os.getloadavg()[0]:.1f}; plan: gemm {a.cases} cases ({SHAPES.split(';')[0]} to {SHAPES.split(';')[-1]}) fp32 aten on cpu, --processes {PROCESSES} = {n_keys} rows "
             f"of {n_keys * PROCESSES} pass rows"]
    print("\n".join(lines), flush=True)
    seen: dict = {}        # (case, pass) -> (worker, time) ever seen in the journal
    not_kept: list = []
    finals: dict = {}
    kills = finished_early = 0
    step = max(1, n_keys * PROCESSES // (a.kills + 2))
    for i in range(a.kills):
        if rng.random() < 0.2:
            delay, target, extra = rng.uniform(a.min_s, a.max_s), None, 0.0
            when = f"{delay:4.1f} s after its start"
        else:
            delay, target, extra = None, len(seen) + rng.randint(1, 2 * step), rng.uniform(0.0, 0.3)
            when = f"{extra:.1f} s after pass row {target}"
        rc, took, _ = _run(out, i > 0, delay, target, extra)
        if rc == 0:
            finished_early += 1
            line = f"run {i + 1:>2}: finished before its kill ({when})"
            lines.append(line)
            print(line, flush=True)
            break
        kills += 1
        passes, final = _journal(out)
        lost_now = [k for k, v in seen.items() if passes.get(k) != v]
        not_kept += lost_now
        seen.update(passes)
        finals.update(final)
        line = (f"run {i + 1:>2}: SIGKILL {when} ({took:.1f} s) -> journal: {len(passes):>2}/{n_keys * PROCESSES} pass rows, "
                f"{len(final)}/{n_keys} combined; pass rows not kept since the last kill: {len(lost_now)}")
        lines.append(line)
        print(line, flush=True)
    rc, took, err = _run(out, True, None) if not out.exists() or journal_path(out).exists() else (0, 0.0, "")
    lines.append(f"last run (--resume, not killed): {took:.1f} s, exit {rc}")
    df = R.load(out)
    keys = {tuple(str(x) for x in r) for r in df[list(R.KEY)].itertuples(index=False)}
    lost = n_keys - len(keys)
    dup = len(df) - len(keys)
    mismatched = 0
    for _, r in df.iterrows():
        per = R.process_estimates(r["process_estimates"])
        if int(r["processes"]) != PROCESSES or len(per) != PROCESSES:
            mismatched += 1
            continue
        for k in range(PROCESSES):
            was = seen.get((r["case"], k))
            if was is not None and (per[k]["worker"] != was[0] or abs(per[k]["time_ms"] - was[1]) > 1e-12 * was[1]):
                mismatched += 1
        if r["case"] in finals and finals[r["case"]][0] != r["run_id"]:
            mismatched += 1
    left = len(leftovers(out)) + int(journal_path(out).exists())
    ok = lost == 0 and dup == 0 and not not_kept and mismatched == 0 and left == 0
    summary = (f"SUMMARY: {kills} SIGKILLs ({finished_early} run finished before its kill), {len(seen)} pass rows "
               f"seen in the journal across kills; final file {len(df)} rows: rows lost {lost}, rows doubled {dup}, "
               f"pass rows not kept across a kill {len(not_kept)}, final rows not made of the journaled passes "
               f"{mismatched}, journals/temp files left {left} -> {'PASS' if ok else 'FAIL'}")
    return end(lines, summary, a.out, ok, "benchmarks/evidence/processes_torture.py")


if __name__ == "__main__":
    sys.exit(main())
