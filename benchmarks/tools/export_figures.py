"""Time static figure export: N figures (default 20) to PNG through flyexplore.views.export's one
persistent kaleido session, each image timed, and print the figures. The first image includes
starting Chromium; the goal for the others is under 1.5 s per image on 2 CPU cores.

    PYTHONPATH=. python benchmarks/tools/export_figures.py [OUT] [--n 20] [--format png]

The figures are the report's own kinds (speedup bars, sweep lines, roofline, error dots) drawn
from the stored H200 demo rows (data/h200/demo/results.parquet), cycled to N. Beside the images:
``provenance.json`` (commit, flyexplore's version, the machine, each image's seconds).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from flyexplore.views import plots as F  # noqa: E402
from flyexplore.results import table as R  # noqa: E402
from flyexplore.views.export import save_figures, static_export_problem  # noqa: E402
from flyexplore.paths import data_dir  # noqa: E402
from flyexplore.world.env import write_provenance  # noqa: E402


def figures(n: int) -> dict:
    df = R.load(data_dir() / "h200" / "demo" / "results.parquet")
    kinds = []
    for op, d in df.groupby("op", sort=False):
        kinds.append((f"{op}_speedup", lambda d=d: F.speedup_figure(d, "aten")))
        kinds.append((f"{op}_sweep", lambda d=d: F.sweep_figure(d, x="m" if "m" in str(d["params"].iloc[0]) else "n",
                                                                y="time_ms", min_points=2)))
        kinds.append((f"{op}_error", lambda d=d: F.error_figure(d)))
    kinds.append(("roofline", lambda: F.roofline_figure(df[df.status == "ok"], kind="measured")))
    out, i = {}, 0
    while len(out) < n:
        name, make = kinds[i % len(kinds)]
        try:
            out[f"{len(out):02d}_{name}"] = make()
        except Exception:  # noqa: BLE001 - a kind that does not apply to these rows
            kinds.pop(i % len(kinds))
            continue
        i += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="folder (default: a temporary one)")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--format", default="png", choices=("png", "svg", "pdf"))
    a = ap.parse_args(argv)
    why = static_export_problem()
    if why:
        print(f"static export unavailable: {why}")
        return 1
    out = a.out or tempfile.mkdtemp(prefix="flyexplore-export-")
    figs = figures(a.n)
    times = []
    for name, fig in figs.items():
        t = time.perf_counter()
        save_figures({name: fig}, out, [a.format])
        times.append(time.perf_counter() - t)
    rest = times[1:]
    write_provenance(out, "benchmarks/tools/export_figures.py",
                     extra={"format": a.format, "seconds": [round(t, 3) for t in times]})
    print(f"{len(times)} figures to {a.format} in {out}; load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs")
    for (name, _), s in zip(figs.items(), times):
        print(f"  {name:28s} {s:6.2f} s")
    print(f"first image (starts Chromium): {times[0]:.2f} s")
    if rest:
        print(f"after the first: mean {sum(rest) / len(rest):.2f} s, max {max(rest):.2f} s per image; "
              f"total {sum(times):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
