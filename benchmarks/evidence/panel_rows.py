"""How much a live sweep panel costs the sweep: feeds N rows through
:meth:`flyexplore.ui.panel.SweepPanel.add_row` -- the call the sweep's thread makes for every
finished row (``run_sweep(on_row=panel.add_row)``) -- while the panel's UI thread redraws, and
prints the cost per row on the feeding (sweep) thread (median, 95th percentile), the redraws the
UI thread made, the last redraw with every row (``close_feed``: figure, table, notes) and one
full redraw at N rows (``redraw(full=True)``, what changing the baseline does).

The rows are SYNTHETIC (no operator runs): GEMM cases ``MxNxK`` with three backends (aten, the
baseline; triton; flydsl), laid out like a real interleaved sweep's rows (every column a CPU
sweep writes, raw samples as JSON, the speedup with its 95% interval and label against aten);
1 case in 10 has flydsl ``unavailable`` with the same long reason. Between rows the feeding
thread sleeps ``--gap-ms`` (default 1 ms: a sweep far faster than any real one, whose cases take
tens of ms or more), so the UI thread competes with it as it would with a sweep.

Public API only; runs on the CPU; no kernel (widget state is serialized but not sent).
Usage: ``python benchmarks/evidence/panel_rows.py --rows 2000``.
Goals (issue 13, on a 2-core CPU): under 2 ms per row on the sweep's thread; a redraw under 200 ms.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from flyexplore.measure import stats as S  # noqa: E402
from flyexplore.ui.panel import REDRAW_FACTOR, SweepPanel  # noqa: E402

#: Redraws timed at the end, one new case each.
REPS = 5
REASON = ("torch 2.15.0+cu132 is a CUDA build, not ROCm; no ROCm device (Inductor reads the device's "
          "gcnArchName only)")


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` synthetic result rows (see the module text), in sweep order: case by case."""
    rng = random.Random(seed)
    common = {"op": "gemm", "dtype": "bf16", "run_id": "20261201T000000-synthetic", "source": "measured",
              "schema_version": 2, "platform": "cpu", "device": "synthetic", "host": "synthetic",
              "torch": "2.15.0", "triton": "3.9.0", "flydsl": "0.3.4", "python": "3.11", "arch": "x86_64",
              "env_id": "synthetic", "aotriton": "not present", "gpu_runtime": "13.2", "flyexplore": "0.1.0"}
    rows, i = [], 0
    while len(rows) < n:
        m, nn, k = 64 * (1 + i % 64), 256 * (1 + (i // 64) % 16), 4096
        case = f"{m}x{nn}x{k}"
        base_ms = 2 * m * nn * k / 400e9 * 1e3 * rng.uniform(0.9, 1.1)
        for b in ("aten", "triton", "flydsl"):
            r = {**common, "case": case, "backend": b, "m": m, "n": nn, "k": k, "layout": "NT",
                 "params": json.dumps({"k": k, "layout": "NT", "m": m, "n": nn}),
                 "timestamp": "2026-12-01T00:00:00+00:00"}
            if b == "flydsl" and i % 10 == 3:
                r.update(status="unavailable", message=REASON)
            else:
                sp = 1.0 if b == "aten" else rng.lognormvariate(0, 0.08)
                t = base_ms / sp
                rounds = [[round(t * rng.uniform(0.97, 1.05), 6) for _ in range(5)] for _ in range(12)]
                lo, hi = S.median_ci([min(r_) for r_ in rounds])
                r.update(status="ok", time_ms=t, time_ci_lo_ms=lo, time_ci_hi_ms=hi, rounds=12,
                         calls_per_round=5, n_samples=60, samples_ms=json.dumps(rounds), order="interleaved",
                         timing_mode="cpu-thread", converged=True, noisy=False, band=0.01, baseline="aten",
                         tflops=2 * m * nn * k / t / 1e9, gbps=2 * (m * k + k * nn + m * nn) / t / 1e6,
                         err_rel=1e-3 * rng.random(), accuracy_ok=True, recheck_ok=True)
                if b != "aten":
                    w = rng.uniform(0.003, 0.03)
                    r.update(speedup=sp, speedup_lo=sp * (1 - w), speedup_hi=sp * (1 + w),
                             verdict=S.verdict(sp * (1 - w), sp * (1 + w)))
            rows.append(r)
            if len(rows) == n:
                break
        i += 1
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2000, help="rows to feed (default 2000)")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="sleep between rows on the feeding thread (ms)")
    a = ap.parse_args(argv)
    if a.rows < 1 or a.gap_ms < 0:
        print(f"flyexplore: error: --rows must be >= 1 and --gap-ms >= 0, got {a.rows}, {a.gap_ms}", file=sys.stderr)
        return 2
    rows = synthetic_rows(a.rows)
    panel = SweepPanel("gemm", backends="aten,triton,flydsl", baseline="aten")
    cost = []
    t_start = time.perf_counter()
    panel.open_feed(len(rows))
    for r in rows[:-REPS * 3]:
        t0 = time.perf_counter()
        panel.add_row(r)
        cost.append(time.perf_counter() - t0)
        if a.gap_ms:
            time.sleep(a.gap_ms / 1e3)
    t_fed = time.perf_counter() - t_start
    last = panel.close_feed()  # the UI thread ends; what follows is timed on this thread
    fig_t, tab_t = [], []
    for i in range(REPS, 0, -1):  # the last cases arrive one by one: redraws at ~N rows
        for r in rows[len(rows) - 3 * i:len(rows) - 3 * (i - 1)]:
            panel.add_row(r)
        fig_t.append(panel.redraw(table=False))
        tab_t.append(panel.redraw(table=True))
    fig_only, table_only = statistics.median(fig_t), statistics.median(tab_t)
    full = statistics.median(panel.redraw(full=True) for _ in range(3))
    ms = sorted(c * 1e3 for c in cost)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    log = panel.redraw_log
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
          f"Python {platform.python_version()}, {platform.platform()}")
    print(f"rows: {len(rows)} SYNTHETIC GEMM rows (3 backends, 1 flydsl row in 30 unavailable), "
          f"gap {a.gap_ms:g} ms between rows; fed in {t_fed:.2f} s")
    print(f"figure: {'WebGL' if panel.figure.data and panel.figure.data[0].type == 'scattergl' else 'SVG'} "
          f"markers, {sum(len(t.x) for t in panel.figure.data)} points in {len(panel.figure.data)} series; "
          f"table: {type(panel.table).__name__}, {len(panel.table_frame)} rows")
    print(f"per row on the sweep's thread (add_row): median {statistics.median(ms):.3f} ms, "
          f"p95 {p95:.3f} ms, max {ms[-1]:.3f} ms   (goal < 2 ms)")
    for what, part in (("figure only", [c for _, c, tb in log if not tb]),
                       ("figure + table refresh", [c for _, c, tb in log if tb])):
        if part:
            print(f"UI-thread redraws while feeding, {what}: {len(part)}, median "
                  f"{statistics.median(part) * 1e3:.1f} ms, max {max(part) * 1e3:.1f} ms")
    late = [c for n, c, _ in log if n >= 0.9 * len(rows)]
    if late:
        print(f"UI-thread redraws at >= 90% of the rows: {len(late)}, max {max(late) * 1e3:.1f} ms   (goal < 200 ms)")
    print(f"end of the feed: last redraw with every row (catch-up, figure, table, notes): {last * 1e3:.1f} ms")
    print(f"one redraw at ~{len(rows)} rows (median of {REPS}), one new case (3 rows) into the figure: "
          f"{fig_only * 1e3:.1f} ms; the table refresh with {len(rows)} rows: {table_only * 1e3:.1f} ms; together "
          f"{(fig_only + table_only) * 1e3:.1f} ms   (goal: a redraw < 200 ms; the table refresh is\n"
          f"  separate and rarer: at most every {REDRAW_FACTOR}x its own cost)")
    print(f"full redraw at {len(rows)} rows (median of 3; every speedup recomputed, figure rebuilt, table): {full * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
