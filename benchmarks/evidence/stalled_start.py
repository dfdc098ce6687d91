"""Issue 45's goal "bounded starts": a worker stopped while its pair starts costs an environment A/B
at most the pair-start limit (:func:`flyexplore.run.envab.pair_start_limit`), and is said -- in the
summary's notes and in the rows of the pass that lost the start.

``run OUT [--device cpu|cuda]``
    Two A/Bs of the same plan (GEMM, two shapes, ATen, ``--pairs 3``), environment A this
    interpreter and environment B a fake interpreter that runs this one (``OUT/stopper``): in the
    *control* it never stops; in the *stalled* run B's second worker start (the spare pair of pass
    2) stops itself with SIGSTOP before Python starts, the issue's fault. Writes ``OUT/stalled.json``
    (each run's wall time, its notes and problems, the message of a B row of pass 2, each pair's
    launch-to-ready time and the limit later pairs got), ``OUT/summary.md``, ``env.json`` and
    ``provenance.json``.

Before issue 45 the stalled run waited ``--worker-start-timeout`` (300 s) and said only "3 pair(s)
started". Usage (repository root)::

    python benchmarks/evidence/stalled_start.py run data/cpu/stalled_start
    python benchmarks/evidence/stalled_start.py run $OUT --device cuda          # on the lent GPU
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SCRIPT = "benchmarks/evidence/stalled_start.py"
SHAPES = {"cpu": ("256x256x256", "512x512x512"), "cuda": ("1024x4096x4096", "4096x4096x4096")}
DTYPE = {"cpu": "fp32", "cuda": "bf16"}
#: A fake interpreter: this Python, except that worker start number STOP_AT stops itself.
STOPPER = """#!/bin/bash
if [ "$1" = "-m" ] && [ -n "$STOP_AT" ]; then
  k=$(( $(cat "$STOP_COUNT" 2>/dev/null || echo 0) + 1 ))
  echo $k > "$STOP_COUNT"
  if [ $k -eq $STOP_AT ]; then echo $$ > "$STOP_PID"; kill -STOP $$; fi
fi
exec {py} "$@"
"""


def _one(out: Path, name: str, device: str, stop_at: int | None) -> dict:
    from flyexplore.run import envab
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep

    count, pidf = out / f"{name}.count", out / f"{name}.pid"
    for p in (count, pidf):
        p.unlink(missing_ok=True)
    os.environ.update(STOP_COUNT=str(count), STOP_PID=str(pidf), STOP_AT=str(stop_at or ""))
    spec = SweepSpec("gemm", shapes=";".join(SHAPES[device]), dtypes=DTYPE[device], backends="aten", device=device,
                     envs=["A", f"B={out / 'stopper'}"], pairs=3)
    starts, limits = [], []
    real = envab.Pair.ready

    def ready(self):
        limits.append(round(self.limit(), 1))
        real(self)
        starts.append(round(self.launch_s, 2))

    envab.Pair.ready = ready
    t0 = time.monotonic()
    try:
        df = run_sweep(spec, progress=False)
    finally:
        envab.Pair.ready = real
        if pidf.exists():
            try:
                os.kill(int(pidf.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    wall = time.monotonic() - t0
    b = df[df["backend"] == "aten@B"]
    return {"name": name, "wall_s": round(wall, 1), "stopped": pidf.exists(), "rows": len(df),
            "pairs": sorted(set(int(x) for x in df["processes"].dropna())), "statuses": sorted(set(df["status"])),
            "notes": list(df.attrs.get("notes") or []), "problems": list(df.attrs.get("problems") or []),
            "b_message": str(b.iloc[0]["message"]) if len(b) else "", "launch_to_ready_s": starts,
            "limits_s": limits}


def run(out: Path, device: str) -> None:
    from flyexplore.world.env import write_provenance

    out.mkdir(parents=True, exist_ok=True)
    write_provenance(out, SCRIPT, name="provenance.json", extra={"stall_device": device})
    with open(out / "env.json", "w") as f:
        subprocess.run([sys.executable, "-m", "flyexplore", "env", "--json"], stdout=f, check=False)
    p = out / "stopper"
    p.write_text(STOPPER.format(py=sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    got = [_one(out, "control", device, None), _one(out, "stalled", device, 2)]
    (out / "stalled.json").write_text(json.dumps(got, indent=1))
    c, s = got
    lines = [f"# A worker stopped at its start ({device}, issue 45)", "",
             f"GEMM {', '.join(SHAPES[device])} {DTYPE[device]}, ATen, `--pairs 3`, env B a fake interpreter whose "
             "second worker start stops itself (SIGSTOP).", "",
             "| run | wall | pairs | launch to ready, each pair | start limit, each pair | B's worker stopped |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in got:
        lines.append(f"| {r['name']} | {r['wall_s']:.0f} s | {r['pairs']} | {r['launch_to_ready_s']} s | "
                     f"{r['limits_s']} s | {r['stopped']} |")
    lines += ["", f"The stall cost {s['wall_s'] - c['wall_s']:.0f} s (the stalled run's later pairs' limit: "
                  f"{max(s['limits_s'][1:] or [0]):.0f} s, then a fresh pair's start; before issue 45: "
                  "--worker-start-timeout, 300 s).", "",
              "Notes of the stalled run:", ""] + [f"- {n}" for n in s["notes"]] + [
              "", f"A B row of the stalled run: `{s['b_message'][:600]}`"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    for f in out.glob("*.count"):
        f.unlink()
    for f in out.glob("*.pid"):
        f.unlink()
    (out / "stopper").unlink()
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--device", default="cpu", choices=sorted(SHAPES))
    args = ap.parse_args()
    run(args.out, args.device)


if __name__ == "__main__":
    main()
