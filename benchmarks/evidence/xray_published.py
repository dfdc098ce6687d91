"""X-ray the FlyDSL kernels behind the published MI355X cases (data/published/*.csv), on any
machine: compile-only for gfx950, no GPU. Writes OUT/xray_published.csv (one row per kernel,
``source = "compiled"``), OUT/env.json (``flyexplore env --json`` with the run's provenance under
``provenance``: commit, flyexplore's version, the machine) and OUT/resources_<op>.html.

    PYTHONPATH=. python benchmarks/evidence/xray_published.py OUT [--radix] [--grouped]

RMSNorm (22 cases), dense BF16 GEMM (15, NT), MXFP8/MXFP4 GEMM (17 + 17) and the TopK register
cases (10) take a few minutes on 2 CPU cores. ``--radix`` adds the 23 TopK radix cases (20-60 s
each); ``--grouped`` the 14 uniform grouped-GEMM cases (needs ROCm device libraries, e.g.
Debian's rocm-device-libs). Needs torch 2.15, flydsl 0.3 and an AMDGPU-capable ld.lld
(``flyexplore env`` says what is missing); on anything else it writes env.json and says why.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from flyexplore.world.env import collect, env_json  # noqa: E402
from flyexplore.paths import published_dir  # noqa: E402


def _rows(name):
    with open(published_dir() / name) as f:
        return list(csv.DictReader(f))


def requests(radix: bool, grouped: bool) -> list[tuple[str, str, str]]:
    req = [("rmsnorm", f"{r['m']}x{r['n']}", r["dtype"]) for r in _rows("rmsnorm.csv")]
    req += [("gemm", f"{r['m']}x{r['n']}x{r['k']}:NT", "bf16") for r in _rows("dense_gemm_bf16.csv")]
    req += [("gemm", f"{r['m']}x{r['n']}x{r['k']}:NT", r["format"]) for r in _rows("mxfp_gemm.csv")]
    for r in _rows("topk.csv"):
        if r["family"] == "register" or radix:
            req.append(("topk", f"{r['m']}x{r['n']}x{r['k']}", "fp32"))
    if grouped:
        for r in _rows("grouped_gemm_bf16.csv"):
            m = re.fullmatch(r"g(\d+)x(\d+)x(\d+)x(\d+)", r["case"])
            if r["suite"] == "standard" and m:
                req.append(("grouped_gemm", "x".join(m.groups()), "bf16"))
    return list(dict.fromkeys(req))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--radix", action="store_true", help="also the TopK radix cases (slow)")
    ap.add_argument("--grouped", action="store_true", help="also the uniform grouped GEMM cases")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    env = collect()
    with open(os.path.join(a.out, "env.json"), "w") as f:
        f.write(env_json("benchmarks/evidence/xray_published.py", env))
    if env.flydsl_xray is None or not env.flydsl_xray.ready:
        why = "; ".join(c.detail for c in env.flydsl_xray.failed) if env.flydsl_xray else "torch too old"
        print(f"X-ray cannot run here: {why}")
        return 0
    from flyexplore.insight.xray import xray_batch, xray_frame
    from flyexplore.views.xray import resources_figure

    reqs = requests(a.radix, a.grouped)
    t0 = time.perf_counter()
    res = xray_batch(reqs, out=os.path.join(a.out, "isa"), use_explainer=False, timeout_s=3600)
    df = xray_frame(res)
    df["isa_file"] = [os.path.relpath(p, a.out) if isinstance(p, str) else p for p in df["isa_file"]]
    df.to_csv(os.path.join(a.out, "xray_published.csv"), index=False)
    for op, g in df.groupby("op"):
        if g["kernel"].notna().any():
            x = "n" if op == "rmsnorm" else "case"
            color = "dtype" if op in ("rmsnorm", "gemm") else "family"
            resources_figure(g, x=x, color=color).write_html(os.path.join(a.out, f"resources_{op}.html"))
    n_k = int(df["kernel"].notna().sum())
    print(f"{len(reqs)} cases, {n_k} kernel rows, {int((~df['eligible']).sum())} not eligible, "
          f"{int(df['error'].notna().sum())} errors, {time.perf_counter() - t0:.0f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
