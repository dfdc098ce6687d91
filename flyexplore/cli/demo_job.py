"""The main job, what ``flyexplore demo`` (:mod:`flyexplore.cli.demo`) runs: detect the machine,
sweep GEMM, RMSNorm and TopK with every backend (unavailable ones recorded with their reason),
and write results, the environment report and an HTML report.

Suites by machine: CPU -> each operator's ``cpu-small`` suite (about a minute on 2 cores);
GPU -> the LLM suites (Llama-3.1-8B GEMMs, Llama hidden-size RMSNorm, sampling/MoE TopK).

The report also has a FlyDSL section (:func:`flydsl_cases`, :func:`flydsl_section`), on any
machine: for a few published MI355X cases (data/published/), the explainer's verdict on an
MI355X (gfx950, ROCm torch 2.15 assumed) with its conditions, the compiled gfx950 kernel's
registers, LDS and occupancy from the compile-only X-ray (needs an AMDGPU-capable ld.lld,
e.g. Debian's lld-22; without it the section says how to get it), the published figures,
and what this machine measured for the operator.
"""
from __future__ import annotations

import json
from pathlib import Path

from flyexplore.atomic import write_text
from flyexplore.insight import explain as X
from flyexplore.insight import xray as XR
from flyexplore.insight.xray import GFX950, XRayUnavailable, xray_batch
from flyexplore.measure.devstate import default_device
from flyexplore.ops import get_op
from flyexplore.paths import published_dir
from flyexplore.results import table as R
from flyexplore.run.journal import sidecar_files
from flyexplore.run.spec import SweepSpec
from flyexplore.run.sweep import run_sweep
from flyexplore.views.report import check_report_dir, write_report
from flyexplore.world import env as ENV
from flyexplore.world.switches import compile_options

#: (operator, suite on CPU, suite on GPU)
DEMO_SUITES = (("gemm", "cpu-small", "llama3.1-8b"),
               ("rmsnorm", "cpu-small", "llm"),
               ("topk", "cpu-small", "llm"))


#: Published MI355X cases the FlyDSL section explains and X-rays: (op, shape, dtype,
#: published csv, the columns of that csv holding the published ATen and FlyDSL figures, unit).
FLYDSL_CASES = (
    ("gemm", "16x4096x4096:NT", "bf16", "dense_gemm_bf16.csv", {"m": 16, "n": 4096, "k": 4096},
     ("aten_tflops", "flydsl_tflops"), "TFLOP/s"),
    ("rmsnorm", "8192x4096", "bf16", "rmsnorm.csv", {"dtype": "bf16", "m": 8192, "n": 4096},
     ("aten_us", "flydsl_us"), "µs"),
    ("topk", "256x1024x8", "fp32", "topk.csv", {"m": 256, "n": 1024, "k": 8},
     ("aten_nondeterministic_us", "flydsl_nondeterministic_us"), "µs"),
)
#: How to make the X-ray possible on a Debian/Ubuntu machine (what .ci/run does).
XRAY_HOWTO = ("install an AMDGPU-capable linker: apt-get install lld-22 (Debian 12 / Ubuntu: from "
              "apt.llvm.org; Debian's default lld 14 cannot link gfx950 code), or use a ROCm install's "
              "/opt/rocm/llvm/bin/ld.lld; then re-run (flyexplore env shows the X-ray's readiness)")


def _published_row(csv: str, match: dict) -> dict | None:
    import pandas as pd


    d = pd.read_csv(published_dir() / csv)
    for k, v in match.items():
        d = d[d[k] == v]
    return d.iloc[0].to_dict() if len(d) else None


def flydsl_cases(xray=True) -> list[dict]:
    """For each of :data:`FLYDSL_CASES`: the explainer's answer on an MI355X (``explanation``,
    a :class:`flyexplore.insight.explain.Explanation` with ``assume_rocm`` and arch gfx950), the
    published figures (``published``: the csv row), and with ``xray`` the X-ray of the kernel
    torch would compile (``xray``: a :class:`flyexplore.insight.xray.XRay`, ``None`` when the X-ray
    cannot run here; ``xray_note`` says why and how to get it). ``xray`` may also be what
    :func:`run_xrays` returned earlier. Runs on a CPU; the X-ray
    compiles for gfx950 in one subprocess (about 10 s on 2 cores), nothing is run on a GPU."""

    out = []
    for op, shape, dtype, csv, match, cols, unit in FLYDSL_CASES:
        route = get_op(op).flydsl.route
        comp = compile_options(True, backends="ATEN,TRITON,FLYDSL") if route == "compile" else None
        ex = X.explain_shape(op, shape, dtype, None, arch="gfx950", assume_rocm=True, compile_options=comp)
        out.append({"op": op, "shape": shape, "dtype": dtype, "explanation": ex,
                    "published": _published_row(csv, match), "published_cols": cols, "unit": unit,
                    "xray": None, "xray_note": ""})
    if not xray:
        for c in out:
            c["xray_note"] = "X-ray not asked for"
        return out
    res = xray if isinstance(xray, (list, str)) else run_xrays()
    if isinstance(res, str):
        for c in out:
            c["xray_note"] = res
        return out
    for c, x in zip(out, res):
        c["xray"] = x
        if x.error:
            c["xray_note"] = f"build failed: {x.error}"
    return out


def run_xrays():
    """X-ray the kernels of :data:`FLYDSL_CASES` for gfx950 in one subprocess (compile-only).
    Returns the list of :class:`flyexplore.insight.xray.XRay`, or a sentence saying why the X-ray
    cannot run here and how to get it (:data:`XRAY_HOWTO`). Mostly waits on the subprocess, so
    the demo runs it in a thread beside its sweeps (which time with one thread on the CPU)."""

    why = XR.unavailable_reason()
    if why:
        return f"the kernel X-ray cannot run here ({why}). To get it: {XRAY_HOWTO}"
    try:
        return xray_batch([(op, shape, dtype) for op, shape, dtype, *_ in FLYDSL_CASES], arch="gfx950",
                          timeout_s=300)
    except (XRayUnavailable, RuntimeError) as exc:
        return f"the kernel X-ray failed here: {exc}. {XRAY_HOWTO}"


def flydsl_section(page, cases: list[dict], measured) -> None:
    """Add the FlyDSL section to a report page (``flyexplore.views.report._Page``): a table with one
    row per case (verdict on MI355X, kernel, VGPRs, SGPRs, LDS bytes, waves per SIMD and what
    limits them, the published ATen and FlyDSL figures), then per case its conditions; and what
    this machine measured for FlyDSL (``measured``: the demo's result rows)."""
    import html

    import pandas as pd


    page.h2("FlyDSL on MI355X (gfx950): explainer and kernel X-ray")
    page.p("FlyDSL runs only on a ROCm torch 2.15 with an MI350-series GPU; this section needs neither. For "
           "a few published MI355X cases (data/published/SOURCES.md) it shows what flyexplore.insight.explain says "
           "torch 2.15 would do there (assumed: ROCm torch 2.15, flydsl 0.3.x, gfx950 with 256 CUs), and the "
           "kernel torch would compile, built here for gfx950 (compile-only: registers, LDS and occupancy "
           "are the compiler's; nothing ran).")
    rows = []
    for c in cases:
        ex, pub, x = c["explanation"], c["published"], c["xray"]
        k = x.kernels[0] if x is not None and x.kernels else None
        a_col, f_col = c["published_cols"]
        r = {"op": c["op"], "case": c["shape"], "dtype": c["dtype"],
             "FlyDSL on MI355X": "YES" if ex.taken else "NO", "kernel": ex.kernel or "",
             "VGPRs": k.resources.vgprs_total if k else None, "SGPRs": k.resources.sgprs if k else None,
             "LDS bytes": k.resources.lds_bytes if k else None,
             "waves/SIMD": (f"{k.occupancy.waves_per_simd:g} of {GFX950.max_waves_per_simd} ({k.occupancy.fraction:.0%})"
                            if k else ""),
             "occupancy limited by": ",".join(k.occupancy.limited_by) if k else "",
             "published ATen": f"{pub[a_col]} {c['unit']}" if pub else "",
             "published FlyDSL": f"{pub[f_col]} {c['unit']}" if pub else ""}
        rows.append(r)
    t = pd.DataFrame(rows)
    for col in ("VGPRs", "SGPRs", "LDS bytes"):
        t[col] = t[col].astype("Int64")
    page.table("flydsl_mi355x", t)
    notes = sorted({c["xray_note"] for c in cases if c["xray_note"]})
    for n in notes:
        page.p(n, cls="note")
    for c in cases:
        page.parts.append(f"<details><summary>{html.escape(c['op'])} {html.escape(c['shape'])} "
                          f"{html.escape(c['dtype'])}: {html.escape(c['explanation'].reason)}</summary><pre>"
                          + html.escape(c["explanation"].to_text())
                          + ("\n\n" + html.escape(c["xray"].to_text()) if c["xray"] is not None else "")
                          + "</pre></details>")
    fl = measured[measured["backend"] == "flydsl"] if "backend" in measured else measured.iloc[0:0]
    if len(fl):
        st = ", ".join(f"{n} {s}" for s, n in fl["status"].value_counts().items())
        msgs = "; ".join(sorted(set(fl["message"].dropna().astype(str))))
        page.p(f"Measured here for FlyDSL: {len(fl)} rows ({st})" + (f": {msgs}" if msgs else "") + ".")


def demo_files() -> tuple[str, ...]:
    """Names of the files the demo writes into its folder besides the report: one result file
    per operator (and its journal while it runs), results.parquet, results.csv and env.json."""
    per_op = [name for op, _, _ in DEMO_SUITES for name in (f"{op}.parquet", *sidecar_files(f"{op}.parquet"))]
    return (*per_op, "results.parquet", "results.csv", "env.json")


def run_demo(out_dir: str | Path = "flyexplore-demo", progress: bool = True, timer: dict | None = None,
             static: bool = True, xray: bool = True) -> Path:
    """Run the demo sweep into ``out_dir`` (results.parquet, results.csv, env.json,
    report.html, and with ``static`` the figures as PNG/SVG/PDF under ``figures/``); returns
    the report's path. The report has the FlyDSL section (:func:`flydsl_section`; ``xray``:
    compile the gfx950 kernels for it where this machine can). Earlier demo files in ``out_dir`` are replaced; a folder holding anything
    else is refused before anything runs.
    Raises :class:`~flyexplore.errors.UsageError` if ``out_dir`` cannot be written or holds
    other files (:func:`flyexplore.views.report.check_report_dir`)."""
    out = Path(out_dir)
    check_report_dir(out, keep=demo_files())
    R.check_path(out / "results.parquet")
    env = ENV.collect()
    gpu = default_device().type == "cuda"
    pool = xr = None
    if xray:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(1)
        xr = pool.submit(run_xrays)
    frames = []
    try:
        for op, cpu_suite, gpu_suite in DEMO_SUITES:
            spec = SweepSpec(op, suite=gpu_suite if gpu else cpu_suite, out=out / f"{op}.parquet",
                             overwrite=True, timer=timer)
            frames.append(run_sweep(spec, progress=progress))
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    df = R.concat(frames)
    R.save(df, out / "results.parquet")
    R.save(df, out / "results.csv")
    write_text(out / "env.json", json.dumps(env.to_dict(), indent=2, default=str))
    cases = flydsl_cases(xray=xr.result() if xr is not None else False)
    if pool is not None:
        pool.shutdown()
    return write_report(df, out, env, title=f"flyexplore demo on {env.device.name} ({env.platform})",
                        static=static, keep=demo_files(),
                        sections=[lambda page: flydsl_section(page, cases, df)])
