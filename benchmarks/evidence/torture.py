"""Torture test of the sweep's journal (issue 22): N sweeps, each killed with SIGKILL at random
moments -- the final write included -- and resumed until it finishes; then every row is checked.

Each sweep is a fresh process running ``run_sweep`` on a small CPU GEMM plan (``--backends
aten,triton,flydsl``: ATen measured, the other two ``unavailable`` rows on a CPU) into a fresh
``.parquet``, ``.csv`` or ``.jsonl`` file. A run is killed in one of three ways (chosen at random,
up to ``--kills`` times per sweep, then a last run goes to the end):

- ``timer``: SIGKILL from outside at a random moment between 0.2 s and a little past the time a
  whole unkilled run takes (imports, cases, final write);
- ``mid-write``: the process kills itself half-way through writing the result file's temporary
  copy (the atomic write's ``.OUT.*.tmp``);
- ``after-replace``: the process kills itself right after the result file was replaced, before
  the journal is deleted (the moment that used to double every row on resume).

After every kill, the rows then committed (journal and result file) are recorded; at the end
the finished file must hold every plan key exactly once (``lost`` = keys missing, ``duplicated``
= rows past one per key) and every recorded row unchanged (same ``run_id`` and time: a committed
row that disappeared also counts as lost), with no journal and no temporary file left.

    python benchmarks/evidence/torture.py --n 50 --jobs 2 --out data/bench/torture.txt

prints one line per sweep and a summary; exit 1 when anything was lost or duplicated. The ``--out``
report's second line is its provenance (commit, flyexplore's version, the machine).
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SCRIPT = "benchmarks/evidence/torture.py"

SHAPES = ";".join(f"{n}x{n}x{n}" for n in (8, 16, 24, 32, 40, 48, 56, 64))
BACKENDS = "aten,triton,flydsl"
N_KEYS = 8 * 3

# the sweep process; MODE chooses a self-inflicted kill inside the final write
DRIVER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    mode = {mode!r}
    import pandas as pd
    import flyexplore.results.table as T
    if mode == "mid-write":
        real_parquet, real_csv, real_jsonl = pd.DataFrame.to_parquet, pd.DataFrame.to_csv, T.write_jsonl
        def half(write):
            def w(df, path, *a, **k):
                write(df.iloc[: max(1, len(df) // 2)], path, *a, **k)  # half the file on disk, then death
                os.kill(os.getpid(), signal.SIGKILL)
            return w
        pd.DataFrame.to_parquet, pd.DataFrame.to_csv, T.write_jsonl = (half(real_parquet), half(real_csv),
                                                                        half(real_jsonl))
    elif mode == "after-replace":
        real_save = T.save
        def save(df, path):
            real_save(df, path)
            os.kill(os.getpid(), signal.SIGKILL)
        T.save = save
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep
    run_sweep(SweepSpec("gemm", shapes={shapes!r}, dtypes={dtype!r}, backends={backends!r}, device={device!r},
                        timer={{"rep": 3, "warmup": 1}}, out={out!r}, resume={resume}), progress=False)
""")


DEVICE = "cpu"


def _run(out: Path, mode: str, resume: bool, kill_after: float | None) -> tuple[int, float]:
    code = DRIVER.format(root=str(ROOT), mode=mode, shapes=SHAPES, backends=BACKENDS, out=str(out), resume=resume,
                         device=DEVICE, dtype="fp32" if DEVICE == "cpu" else "bf16")
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if kill_after is not None:
            kill_at(p, kill_after)
        err = p.communicate(timeout=600)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    if p.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"sweep of {out} failed ({p.returncode}): {err.decode(errors='replace')[-2000:]}")
    return p.returncode, time.monotonic() - t0


def _time(v) -> float | None:
    import pandas as pd

    return None if pd.isna(v) else float(v)


def _committed(out: Path) -> dict:
    """(op, case, dtype, backend, run_id) -> time_ms of every row committed now."""
    from flyexplore.results import table as R
    from flyexplore.run.journal import committed_rows

    frames = [committed_rows(out)]
    if out.exists():
        frames.append(R.load(out))
    got = {}
    for df in frames:
        for r in df[["op", "case", "dtype", "backend", "run_id", "time_ms"]].itertuples(index=False):
            got[tuple(str(x) for x in r[:5])] = _time(r[5])
    return got


def torture(i: int, folder: Path, full_s: float, kills: int, rng: random.Random) -> dict:
    from flyexplore.results import table as R
    from flyexplore.run.journal import journal_path, leftovers

    out = folder / f"s{i:03d}{rng.choice(['.parquet', '.csv', '.jsonl'])}"
    seen, log, resume = {}, [], False
    for _ in range(rng.randint(1, kills)):
        mode = rng.choices(["timer", "mid-write", "after-replace"], weights=[6, 2, 2])[0]
        delay = rng.uniform(0.2, 1.15 * full_s) if mode == "timer" else None
        rc, _ = _run(out, mode if mode != "timer" else "none", resume, delay)
        log.append(f"{mode}{'' if delay is None else f'@{delay:.1f}s'}{'' if rc else ' (finished first)'}")
        seen.update(_committed(out))
        resume = True
        if rc == 0:
            break
    if not out.exists() or journal_path(out).exists():
        _run(out, "none", True, None)
        log.append("resume")
    df = R.load(out)
    keys = {tuple(str(x) for x in r) for r in df[list(R.KEY)].itertuples(index=False)}
    final = {tuple(str(x) for x in r[:5]): _time(r[5]) for r in
             df[["op", "case", "dtype", "backend", "run_id", "time_ms"]].itertuples(index=False)}
    changed = [k for k, t in seen.items() if k not in final or final[k] != t]
    return {"sweep": out.name, "kills": log, "rows": len(df), "lost": (N_KEYS - len(keys)) + len(changed),
            "duplicated": len(df) - len(keys), "leftovers": len(leftovers(out)) + int(journal_path(out).exists())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50, help="sweeps (default 50)")
    ap.add_argument("--kills", type=int, default=3, help="kills per sweep at most (default 3)")
    ap.add_argument("--jobs", type=int, default=2, help="sweeps at once (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu (default: in-process) or cuda:0 (bf16, worker "
                    "processes: a kill then also takes the driver's worker down with it)")
    ap.add_argument("--out", help="also write the report here (e.g. data/bench/torture.txt)")
    a = ap.parse_args(argv)
    global DEVICE
    DEVICE = a.device
    rng = random.Random(a.seed)
    folder = Path(tempfile.mkdtemp(prefix="flyexplore-torture-"))
    _, full_s = _run(folder / "reference.parquet", "none", False, None)
    lines = [f"# benchmarks/evidence/torture.py --n {a.n} --kills {a.kills} --jobs {a.jobs} --seed {a.seed} --device {a.device}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
             f"load {os.getloadavg()[0]:.1f}; plan: gemm {SHAPES} {'fp32' if DEVICE == 'cpu' else 'bf16'} on {DEVICE} "
             f"x {BACKENDS} = {N_KEYS} rows; "
             f"an unkilled run takes {full_s:.1f} s"]
    print("\n".join(lines), flush=True)
    seeds = [rng.randrange(2**32) for _ in range(a.n)]
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda i: torture(i, folder, full_s, a.kills, random.Random(seeds[i])), range(a.n)))
    for r in results:
        line = (f"{r['sweep']:>14}  rows {r['rows']:>3}  lost {r['lost']}  duplicated {r['duplicated']}  "
                f"leftovers {r['leftovers']}  runs: {', '.join(r['kills'])}")
        lines.append(line)
        print(line)
    kills = sum(sum(1 for k in r["kills"] if "finished first" not in k and k != "resume") for r in results)
    by = {m: sum(1 for r in results for k in r["kills"] if k.startswith(m) and "finished first" not in k)
          for m in ("timer", "mid-write", "after-replace")}
    lost = sum(r["lost"] for r in results)
    dup = sum(r["duplicated"] for r in results)
    left = sum(r["leftovers"] for r in results)
    ok = lost == 0 and dup == 0 and left == 0
    summary = (f"SUMMARY: {a.n} sweeps, {kills} SIGKILLs ({', '.join(f'{m} {n}' for m, n in by.items())}), "
               f"{sum(r['rows'] for r in results)} rows: rows lost {lost}, rows duplicated {dup}, "
               f"journals/temp files left {left} -> {'PASS' if ok else 'FAIL'}")
    return end(lines, summary, a.out, ok)


def kill_at(p: subprocess.Popen, seconds: float) -> None:
    """SIGKILL ``p`` ``seconds`` after now unless it has ended by then. Shared by the torture scripts."""
    try:
        p.wait(seconds)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)


def end(lines: list[str], summary: str, out: str | None, ok: bool, script: str = SCRIPT) -> int:
    """Print the SUMMARY line, write the report (``lines`` and it, the provenance of ``script``'s
    run as its second line: :func:`flyexplore.world.env.provenance`) to ``out`` when given; the
    exit status: 0 when ``ok``, else 1. Shared by the torture scripts."""
    lines.append(summary)
    print(summary)
    if out:
        from flyexplore.world.env import provenance, provenance_line

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        head = "# " + provenance_line(provenance(script))
        Path(out).write_text("\n".join([*lines[:1], head, *lines[1:]]) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
