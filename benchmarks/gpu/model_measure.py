"""Issue 35's goals on a GPU (the lent H200): a real model step measured, beside the product's own
estimates. Results go to ``data/h200/model_measure/`` (its README holds the tables).

    python benchmarks/gpu/model_measure.py --what smoke   --out DIR   # 2 layers, every variant: the GPU paths run
    python benchmarks/gpu/model_measure.py --what prefill --out DIR   # Llama-3.1-8B, full depth, bf16, prefill 1x2048
    python benchmarks/gpu/model_measure.py --what decode  --out DIR   # ... decode 32 at 2048 (static KV cache)
    python benchmarks/gpu/model_measure.py --what moe     --out DIR   # Qwen3-30B-A3B dims: the grouped-GEMM share
    python benchmarks/gpu/model_measure.py --what graphs1 --out DIR   # decode 1 at 2048: eager, compile, and each in CUDA graphs
    python benchmarks/gpu/model_measure.py --what graphs32 --out DIR  # ... decode 32 at 2048
    python benchmarks/gpu/model_measure.py --what shares  --out DIR   # prefill 1x2048, eager and compile: modelled vs measured
    python benchmarks/gpu/model_measure.py --what hybrid  --out DIR   # a 2-layer Bamba decode: its states rewound, graphs
    python benchmarks/gpu/model_measure.py --summary DIR... --out F   # issue 44's goals from the run folders (markdown)
    python benchmarks/gpu/model_measure.py --render DIR               # here, no GPU: re-render a run's folder

Each writes into DIR: ``answer.txt`` (what ``flyexplore model --measure`` prints), ``rows.csv`` (the
``model`` sweep's rows: times, intervals, labels, first call, peak memory, breakdown JSON, the
environment columns), ``meta.json`` (the wall time to the answer, compiles included, and the
arguments). ``prefill`` also sweeps the GEMM shapes the capture exports, alone, with ATen
(``gemm_rows.csv``), and writes ``estimate_vs_measured.csv``: the sum of the isolated per-call GEMM
times against the GEMM kernel time measured in the step, and the modelled GEMM share against the
measured one, each with its difference.

Runs as it is on any CUDA or ROCm GPU with torch and transformers; the FlyDSL variants are
``unavailable`` rows off gfx950. ``FLYEXPLORE_COMMIT`` / ``FLYEXPLORE_DIRTY`` label the rows where
the checkout has no git metadata (the lent machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RUNS = {
    "smoke": dict(model="llama-3.1-8b", phase="prefill", batch=1, seq=256, layers=2, variants=None),
    "prefill": dict(model="llama-3.1-8b", phase="prefill", batch=1, seq=2048, layers=None, variants=None),
    "decode": dict(model="llama-3.1-8b", phase="decode", batch=32, seq=2048, layers=None, variants=None),
    "moe": dict(model="qwen3-30b-a3b", phase="prefill", batch=1, seq=2048, layers=None, variants="eager,compile"),
    # issue 44: decode under CUDA/HIP graphs, at batch 1 (launch-bound) and 32, context 2048
    "graphs1": dict(model="llama-3.1-8b", phase="decode", batch=1, seq=2048, layers=None,
                    variants="eager,eager_graph,compile,compile_graph"),
    "graphs32": dict(model="llama-3.1-8b", phase="decode", batch=32, seq=2048, layers=None,
                     variants="eager,eager_graph,compile,compile_graph"),
    # issue 44: the compiled view's modelled shares against the measured ones (prefill 1x2048)
    "shares": dict(model="llama-3.1-8b", phase="prefill", batch=1, seq=2048, layers=None, variants="eager,compile"),
    # issue 44: a hybrid's decode (Mamba-2 conv and SSM states rewound each call), with and without graphs
    "hybrid": dict(model=None, config=dict(
        model_type="bamba", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, attn_layer_indices=[1], mamba_n_heads=4,
        mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=16),
        phase="decode", batch=4, seq=64, layers=None, variants="eager,eager_graph,compile_graph", dtype="bf16"),
}


def gemm_estimate(cov, measured, out: Path, device) -> None:
    """The isolated per-call GEMM times of the exported shapes against the step's measured GEMM
    time (eager: cuBLAS through aten::mm/addmm, the shapes the capture exported), and the modelled
    GEMM share against the measured one."""
    import flyexplore as fx

    shapes = out / "shapes.csv"
    cov.export_shapes(shapes)
    rows = fx.sweep("gemm", shapes_from=str(shapes), backends="aten", device=device, progress=False)
    rows.to_csv(out / "gemm_rows.csv", index=False)
    shapes.unlink()
    estimate_table(rows, measured, out)


def estimate_table(rows, measured, out: Path) -> None:
    """``estimate_vs_measured.csv`` from the GEMM sweep's ``rows`` and the measured step."""
    import pandas as pd

    from flyexplore.results import model_step as MS

    iso = MS.isolated_sum(rows)
    bd = measured.breakdown()
    bm = measured.beside_modelled()
    table = []
    for variant in ("eager", "compile", "max_autotune"):
        g = bd[(bd["variant"] == variant) & (bd["category"] == "gemm")]
        if not len(g):
            continue
        meas_ms = float(g["us"].sum()) / 1e3
        share = bm[(bm["variant"] == variant) & (bm["category"] == "gemm")]
        for r in iso.itertuples():
            table.append({"variant": variant, "isolated_sum_ms": r.isolated_ms, "isolated_cases": r.cases,
                          "isolated_calls": r.calls, "measured_gemm_ms": meas_ms,
                          "sum_vs_measured": r.isolated_ms / meas_ms - 1 if meas_ms else None,
                          "modelled_gemm_share": float(share["modelled_share"].iloc[0]) if len(share) else None,
                          "measured_gemm_share": float(share["measured_share"].iloc[0]) if len(share) else None,
                          "share_difference_points": float(share["difference"].iloc[0]) if len(share) else None})
    pd.DataFrame(table).assign(modelled_on=bm.attrs.get("modelled_on")).to_csv(out / "estimate_vs_measured.csv",
                                                                               index=False)
    print(pd.DataFrame(table).to_string(index=False))


def render(folder: Path) -> None:
    """Re-render a run's answer from its files, here (no GPU): the capture of the same model and
    phase is made again (fake tensors, deterministic) and joined with the measured rows
    (``rows.csv``): ``rendered.txt``, ``beside_modelled.csv`` and, where ``gemm_rows.csv`` is
    there, ``estimate_vs_measured.csv`` -- the modelled shares on the measuring device's datasheet
    peaks (:func:`flyexplore.results.model_step.modelled_on`)."""
    import pandas as pd

    from flyexplore.run import model_step as RS
    from flyexplore.views.model import model_coverage
    from flyexplore.views.model_step import MeasuredStep

    meta = json.loads((folder / "meta.json").read_text())
    rows = pd.read_csv(folder / "rows.csv")
    case = RS.plan_case(meta["model"], phase=meta["phase"], batch=meta["batch"], seq=meta["seq"],
                        layers=meta.get("layers"))
    cov = model_coverage(None, RS.capture_config(case), phases=[(meta["phase"], meta["batch"], meta["seq"])],
                         project="published", say=False)
    m = MeasuredStep(rows, cov.table, cov._proj())
    (folder / "rendered.txt").write_text(m.text() + "\n")
    m.beside_modelled().assign(modelled_on=m.beside_modelled().attrs["modelled_on"]).to_csv(
        folder / "beside_modelled.csv", index=False)
    if (folder / "gemm_rows.csv").exists():
        estimate_table(pd.read_csv(folder / "gemm_rows.csv"), m, folder)
    print(m.text())


def summarize(folders, out: Path) -> str:
    """Issue 44's goals from run folders (``meta.json``, ``rows.csv``, ``beside_modelled.csv``,
    ``profile_check.csv``), as markdown written to ``out``: each decode's variants with intervals
    and the wall time to its answer (goal: under 5 minutes each), the compiled view's modelled
    shares against the measured ones (goal: within 10 points), and each variant's profiled total
    against its measured step (goal: within 5%)."""
    import pandas as pd

    from flyexplore.results import model_step as MS

    lines = []
    for f in map(Path, folders):
        meta = json.loads((f / "meta.json").read_text())
        rows = pd.read_csv(f / "rows.csv")
        st = MS.step_table(rows)
        dev = st["device"].dropna().iloc[0] if st["device"].notna().any() else "?"
        lines += [f"## {meta['what']}: {meta['model']} {meta['phase']} {meta['batch']}x{meta['seq']} on {dev}",
                  f"wall time to the answer, compiles included: {meta['wall_s_to_answer']:.1f} s", "",
                  "| variant | status | ms [95% CI] | vs eager [95% CI] | first call s |", "| --- | --- | --- | --- | --- |"]
        for r in st.itertuples():
            ms = f"{r.step_ms:.3f} [{r.step_lo_ms:.3f}, {r.step_hi_ms:.3f}]" if r.step_ms == r.step_ms else "-"
            sp = (f"{r.speedup:.3f}x [{r.speedup_lo:.3f}, {r.speedup_hi:.3f}] {r.verdict or ''}"
                  if r.speedup == r.speedup else (r.verdict or "-"))
            lines.append(f"| {r.variant} | {r.status} | {ms} | {sp} | {r.first_call_s:.1f} |")
        if (f / "profile_check.csv").exists():
            pc = pd.read_csv(f / "profile_check.csv")
            lines += ["", "| variant | measured ms | profiled ms | difference | kernels alone |", "| --- | --- | --- | --- | --- |"]
            lines += [f"| {r.variant} | {r.measured_ms:.3f} | {r.profiled_ms:.3f} | {r.difference:+.1%} | "
                      f"{r.kernel_difference:+.1%} |" for r in pc.itertuples()]
        if (f / "beside_modelled.csv").exists():
            bm = pd.read_csv(f / "beside_modelled.csv")
            lines += ["", "| variant | category | measured share | modelled share | difference (points) |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| {r.variant} | {r.category} | {r.measured_share:.1%} | {r.modelled_share:.1%} | "
                      f"{100 * r.difference:+.1f} |" for r in bm.itertuples()]
            for v, g in bm.groupby("variant", sort=False):
                lines.append(f"\n{v}: largest share difference {100 * g['difference'].abs().max():.1f} points")
        lines.append("")
    text = "\n".join(lines)
    out.write_text(text + "\n")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", choices=tuple(RUNS))
    ap.add_argument("--out", help="a folder for the files")
    ap.add_argument("--render", metavar="DIR", help="re-render a run's folder here (no GPU): rendered.txt, "
                    "beside_modelled.csv, estimate_vs_measured.csv")
    ap.add_argument("--summary", nargs="+", metavar="DIR", help="issue 44's goals from run folders, as markdown "
                    "into --out FILE")
    ap.add_argument("--device", default=None, help="default: a GPU when one is visible")
    ap.add_argument("--layers", type=int, default=None, help="override the run's depth")
    ap.add_argument("--variants", default=None, help="override the run's variants")
    a = ap.parse_args(argv)
    if a.render:
        render(Path(a.render))
        return 0
    if a.summary:
        print(summarize(a.summary, Path(a.out or "summary.md")))
        return 0
    if not (a.what and a.out):
        ap.error("give --what and --out (or --render DIR)")
    t0 = time.perf_counter()
    import flyexplore as fx

    run = dict(RUNS[a.what])
    if a.layers is not None:
        run["layers"] = a.layers
    if a.variants is not None:
        run["variants"] = a.variants
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cov = fx.model(run["model"], config=run.get("config"), phase=run["phase"], batch=run["batch"], seq=run["seq"],
                   measure=True, layers=run["layers"], variants=run["variants"], dtype=run.get("dtype"),
                   measure_device=a.device, progress=False)
    wall = time.perf_counter() - t0
    text = cov.text()
    (out / "answer.txt").write_text(text + "\n")
    cov.measured.frame.to_csv(out / "rows.csv", index=False)
    print(cov.measured.text())
    print(f"wall time to the answer, compiles included: {wall:.1f} s")
    meta = {"what": a.what, **run, "wall_s_to_answer": wall, "argv": sys.argv,
            "commit": os.environ.get("FLYEXPLORE_COMMIT"), "dirty": os.environ.get("FLYEXPLORE_DIRTY")}
    m = cov.measured
    bm = m.beside_modelled()
    bm.assign(modelled_on=bm.attrs.get("modelled_on")).to_csv(out / "beside_modelled.csv", index=False)
    from flyexplore.results import model_step as MS

    MS.breakdown_check(m.frame).to_csv(out / "profile_check.csv", index=False)
    if a.what == "prefill":
        gemm_estimate(cov, cov.measured, out, a.device)
        meta["wall_s_with_gemm_sweep"] = time.perf_counter() - t0
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
