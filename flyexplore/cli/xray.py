"""``flyexplore xray``: compile the FlyDSL kernel torch would run on gfx950 (no GPU needed) and
show its registers, LDS, occupancy and ISA (:mod:`flyexplore.insight.xray`)."""
from __future__ import annotations

import argparse
import json
import sys

from flyexplore.cli._shared import EXIT_NO
from flyexplore.errors import UsageError, bad_choice

HELP = ("compile the FlyDSL kernel torch would run on gfx950 (no GPU needed) "
        "and show its registers, LDS, occupancy and ISA")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", help="rmsnorm, topk, gemm or grouped_gemm")
    p.add_argument("--shape", help="e.g. 8192x4096 (rmsnorm), 4096x4096x8 (topk), 4096x4096x4096:NT "
                   "(gemm), 8x512x4096x4096 (grouped_gemm G x M x N x K); several with ';'")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16, fp32 (gemm also mxfp8, mxfp4); "
                   "comma-separated for several")
    p.add_argument("--arch", default="gfx950", help="target arch (torch 2.15 runs FlyDSL on gfx950 only)")
    p.add_argument("--out", default="flyexplore-xray", help="folder for the ISA and xray.json "
                   "(default: flyexplore-xray)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--autotune", action="store_true", help="GEMMs: every FlyDSL autotuning candidate, "
                   "not just the baseline config")
    p.add_argument("--keep-ir", action="store_true", help="also keep every IR stage flydsl dumped")
    p.add_argument("--figure", help="write the resources figure (.html, or .png/.svg/.pdf via kaleido)")
    p.add_argument("--coverage", action="store_true", help="list what the X-ray covers and what not")


def run(a: argparse.Namespace) -> int:
    # imported here, as in every command module: `flyexplore --help` imports neither torch nor pandas
    from flyexplore.insight.xray import (
        XRAY_DTYPES,
        XRayUnavailable,
        coverage_text,
        xray_batch,
        xray_frame,
        xray_shapes,
    )
    from flyexplore.views.export import save_figure
    from flyexplore.views.xray import resources_figure

    if a.coverage:
        print(coverage_text())
        return 0
    if not a.op or not a.shape:
        raise UsageError("xray needs --op and --shape (or --coverage)")
    if a.op not in XRAY_DTYPES:
        raise bad_choice("operator for xray", a.op, XRAY_DTYPES)
    if a.figure and a.figure.rsplit(".", 1)[-1].lower() not in ("html", "png", "svg", "pdf"):
        raise UsageError(f"--figure {a.figure!r} must end in .html, .png, .svg or .pdf")
    shapes = xray_shapes(a.op, a.shape)
    dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
    try:
        res = xray_batch([(a.op, s, d) for s in shapes for d in dtypes], arch=a.arch, out=a.out,
                         autotune=a.autotune, keep_ir=a.keep_ir)
    except XRayUnavailable as exc:
        print(f"flyexplore: {exc}", file=sys.stderr)
        return EXIT_NO
    if a.json:
        print(json.dumps([x.to_dict() for x in res], indent=2, default=str))
    else:
        print("\n\n".join(x.to_text() for x in res))
    if a.figure:
        save_figure(resources_figure(xray_frame(res)), a.figure)   # whole or not at all
        if not a.json:
            print(f"figure: {a.figure}")
    return 0
