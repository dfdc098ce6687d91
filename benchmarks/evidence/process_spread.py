"""Where does the spread of GEMM times between fresh processes come from? Issue 24's A-vs-A goal.

``benchmarks/evidence/reproducible.py`` found that fresh processes on the lent H200 read the same cuBLAS
GEMM 0.1-2.8% apart (standard deviation of log time over processes, by shape), more than the
+-1% SAME band can hold. This benchmark asks whether that spread lives *inside* a process -- where
the inputs lie in memory, which interleaving would average out -- or *between* processes
(the device's power and clock state during the process, its context), which only more
processes can average.

``measure OUT [--processes K] [--placements P] [--rounds R]``
    K fresh Python processes, one after another. Each allocates, per shape of :data:`SHAPES`
    (bf16, ``:NT``: B stored N x K), P copies of the same inputs (the same seed), each after a
    pad of a random size so that they lie at different addresses, and times ``torch.mm`` on
    the P copies with :func:`flyexplore.measure.interleaved.measure_interleaved` (interleaved
    rounds, event-gated, the L2 flush before each call) for a fixed R rounds. Each process
    appends one JSON line per shape and placement to ``OUT/spread.jsonl``: its median time
    (ms), rounds, and the device state at the start and end (SM clock, power, temperature).
    ``OUT/provenance.json``: the commit, flyexplore's version, the machine
    (:func:`flyexplore.world.env.write_provenance`).
``analyze OUT``
    Writes ``OUT/summary.md`` (its last line: the analysis's provenance): per shape, the spread between placements within a process
    (standard deviation of log time, pooled over the processes) and between processes (of each
    process's mean over its placements), in percent.

Usage (repository root, on a GPU)::

    python benchmarks/evidence/process_spread.py measure data/h200/process_spread --processes 6
    python benchmarks/evidence/process_spread.py analyze data/h200/process_spread
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCRIPT = "benchmarks/evidence/process_spread.py"

#: GEMM shapes M x N x K of ``benchmarks/evidence/reproducible.py``: from the most to the least stable
#: between processes there.
SHAPES = ((4096, 4096, 4096), (1024, 4096, 4096), (64, 4096, 4096), (2048, 14336, 4096),
          (8192, 4096, 4096), (512, 8192, 28672), (8192, 8192, 8192))


def one(out: Path, process: int, placements: int, rounds: int) -> None:
    """One process: every shape at ``placements`` addresses, interleaved, ``rounds`` rounds."""
    import torch

    from flyexplore.measure.interleaved import measure_interleaved

    rnd = random.Random(1000 + process)
    rows = []
    for m, n, k in SHAPES:
        keep, fns = [], {}
        for p in range(placements):
            keep.append(torch.empty(rnd.randrange(1, 1 << 27), dtype=torch.bfloat16, device="cuda"))
            g = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=g)
            b = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g)
            keep += [a, b]
            fns[f"p{p}"] = (lambda a=a, b=b: torch.mm(a, b.t()))
        for f in fns.values():
            f()
        res = measure_interleaved(fns, "cuda", min_rounds=rounds, max_rounds=rounds)
        for name, meas in res.measurements.items():
            rows.append({"process": process, "shape": f"{m}x{n}x{k}", "placement": name,
                         "time_ms": float(meas.median), "rounds": res.rounds,
                         "clock_mhz_start": res.state_start.get("clock_mhz"),
                         "clock_mhz_end": res.state_end.get("clock_mhz"),
                         "power_w_end": res.state_end.get("power_w"),
                         "temp_c_start": res.state_start.get("temp_c"),
                         "temp_c_end": res.state_end.get("temp_c"),
                         "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                         "timing_mode": meas.mode})
        del keep, fns
        torch.cuda.empty_cache()
    with open(out / "spread.jsonl", "a") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def measure(out: Path, processes: int, placements: int, rounds: int) -> None:
    from flyexplore.world.env import write_provenance

    out.mkdir(parents=True, exist_ok=True)
    (out / "spread.jsonl").unlink(missing_ok=True)
    write_provenance(out, SCRIPT, extra={"step": "measure", "processes": processes, "placements": placements,
                                         "rounds": rounds})
    for i in range(processes):
        t0 = time.time()
        subprocess.run([sys.executable, __file__, "_one", str(out), str(i), str(placements), str(rounds)],
                       check=True)
        print(f"process {i + 1}/{processes}: {time.time() - t0:.0f} s", flush=True)


def analyze(out: Path) -> None:
    import numpy as np
    import pandas as pd

    d = pd.read_json(out / "spread.jsonl", lines=True)
    d["log"] = np.log(d["time_ms"])
    lines = ["# Spread of GEMM times within and between fresh processes (benchmarks/evidence/process_spread.py)", "",
             f"{d['process'].nunique()} fresh processes, one after another; in each, every shape at "
             f"{d['placement'].nunique()} input placements (the same values after pads of random size), "
             f"timed interleaved for {int(d['rounds'].iloc[0])} rounds (flyexplore's interleaved timer, "
             f"{d['timing_mode'].iloc[0]}); {d['device'].iloc[0]}, torch {d['torch'].iloc[0]}.", "",
             "sd: standard deviation of log time, in percent. Within: between the placements of one "
             "process, pooled over the processes. Between: of the processes' means over their "
             "placements. Range: the slowest process mean over the fastest.", "",
             "| shape | median ms | within sd % | between sd % | between range % | SM clock at end, MHz |",
             "|:--|--:|--:|--:|--:|:--|"]
    for shape in dict.fromkeys(d["shape"]):
        s = d[d["shape"] == shape]
        within = float(np.sqrt(s.groupby("process")["log"].var(ddof=1).mean())) * 100
        means = s.groupby("process")["log"].mean()
        between = float(means.std(ddof=1)) * 100
        rng = float(np.expm1(means.max() - means.min())) * 100
        clk = s.groupby("process")["clock_mhz_end"].first().dropna()
        clk_txt = f"{int(clk.min())}-{int(clk.max())}" if len(clk) else "not read"
        lines.append(f"| {shape} | {s['time_ms'].median():.4f} | {within:.2f} | {between:.2f} | {rng:.2f} | "
                     f"{clk_txt} |")
    from flyexplore.world.env import provenance, provenance_line

    lines += ["", f"`{provenance_line(provenance(SCRIPT, extra={'step': 'analyze'}))}`"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_one":
        one(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("out", type=Path)
    m.add_argument("--processes", type=int, default=6)
    m.add_argument("--placements", type=int, default=4)
    m.add_argument("--rounds", type=int, default=60)
    a = sub.add_parser("analyze")
    a.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        measure(args.out, args.processes, args.placements, args.rounds)
    else:
        analyze(args.out)


if __name__ == "__main__":
    main()
