"""How :func:`flyexplore.results.table.speedup` and :func:`~flyexplore.results.table.geomean_speedup` scale
with the number of rows: a committed result file's rows replicated over distinct cases (copy
``i`` of case ``C`` becomes case ``C#i``) to 10,000 and 100,000 rows, each size timed, and
beside each a plain-pandas reference doing the same median/merge arithmetic (medians per case
and backend, the faster baseline per case, a merge and a division; geometric means by groupby)
without intervals or labels: the floor a vectorized implementation can get near.

Two layouts of the same file: ``one run`` (the rows of the run with the most carried speedups:
what a sweep writes, nearly every pair takes the carried-speedup path) and ``all runs`` (every
run of the file together: a case's backends have rows from several runs, so every pair's
interval comes from the stored samples, unpaired across runs: the slow path).

The default file is ``data/h200/verdicts/rows.parquet`` (H200 rows: interleaved samples, carried
speedups, six runs); the repository keeps no CPU result file. Times are wall seconds, best of
``--repeat``; on a loaded machine they wander, so read them as orders of magnitude.
Usage: ``python benchmarks/speedup_scale.py [--file PATH] [--sizes 10000,100000] [--repeat 1]``.
"""
import argparse
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from flyexplore.results import table as R  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BY = ["op", "case", "dtype"]


def replicate(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """``df``'s rows copied over distinct cases until there are ``n`` rows (the last copy cut)."""
    k = math.ceil(n / len(df))
    out = pd.concat([df.assign(case=df["case"] + f"#{i}") for i in range(k)], ignore_index=True)
    return out.iloc[:n].reset_index(drop=True)


def reference(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Plain pandas: the speedup of medians, baseline median / backend median per case."""
    d = df[df["status"].isin(["ok", "published"]) & df["time_ms"].notna()]
    d = d[~(d["flydsl_taken"].astype("boolean") == False).fillna(False)]  # noqa: E712
    med = d.groupby([*BY, "backend"], sort=False, dropna=False)["time_ms"].median().reset_index()
    base = med[med["backend"] == baseline].drop(columns="backend")
    x = med[med["backend"] != baseline].merge(base, on=BY, suffixes=("", "_base"))
    x["speedup"] = x["time_ms_base"] / x["time_ms"]
    return x


def reference_geomean(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    x = reference(df, baseline)
    x["log"] = np.log(x["speedup"].astype(float))
    g = x.groupby(["op", "dtype", "backend"], sort=False)["log"].agg(["mean", "size"])
    return g.assign(geomean=np.exp(g["mean"]))


def best(fn, repeat: int) -> tuple[float, object]:
    t, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - t0)
    return t, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default=os.path.join(ROOT, "data", "h200", "verdicts", "rows.parquet"))
    ap.add_argument("--sizes", default="10000,100000", help="row counts, comma-separated")
    ap.add_argument("--baseline", default="aten")
    ap.add_argument("--repeat", type=int, default=1, help="runs per timing; the best is printed")
    a = ap.parse_args(argv)
    src = R.load(a.file)
    carried = src[src["speedup"].notna()].groupby("run_id")["speedup"].size()
    one = src[src["run_id"] == carried.idxmax()] if len(carried) else src
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
          f"Python {platform.python_version()}, pandas {pd.__version__}, numpy {np.__version__}")
    print(f"file: {os.path.relpath(a.file, ROOT)} ({len(src)} rows, {src['run_id'].nunique()} runs); "
          f"baseline {a.baseline}; wall seconds, best of {a.repeat}")
    R.geomean_speedup(src, a.baseline)  # warm: the first call imports scipy's parts
    for name, base in (("one run", one), ("all runs", src)):
        for n in (int(s) for s in a.sizes.split(",")):
            df = replicate(base, n)
            t_sp, s = best(lambda: R.speedup(df, a.baseline), a.repeat)
            t_ref, _ = best(lambda: reference(df, a.baseline), a.repeat)
            t_gm, _ = best(lambda: R.geomean_speedup(df, a.baseline), a.repeat)
            t_gref, _ = best(lambda: reference_geomean(df, a.baseline), a.repeat)
            kinds = ", ".join(f"{k} {v}" for k, v in s["interval"].value_counts().items())
            print(f"{name:>8} {n:>7} rows, {len(s):>6} pairs ({kinds}):\n"
                  f"           speedup {t_sp:7.3f} s  (plain-pandas reference {t_ref:6.3f} s, "
                  f"x{t_sp / t_ref:5.1f}; {t_sp / n * 1e6:6.1f} us/row)\n"
                  f"   geomean_speedup {t_gm:7.3f} s  (plain-pandas reference {t_gref:6.3f} s, "
                  f"x{t_gm / t_gref:5.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
