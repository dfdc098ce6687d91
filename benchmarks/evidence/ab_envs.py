"""Issue 32's goals for the environment A/B, measured: ``flyexplore sweep --env`` timing the arms
of each case round by round in one worker per environment, the workers taking turns on one GPU.

Two steps:

``run OUT [--part aa|effects|all] [--pairs K] [--quick] [--device cuda|cpu]``
    On the lent GPU. Writes into ``OUT`` (at most 8 files, what the device hands back):

    * ``aa.parquet`` -- **A/A**: the one interpreter against a copy of itself (``--aa``) on
      :data:`AA` (GEMMs through cuBLAS, SDPA forward through flash attention, RMSNorm; bf16), long
      calls (40 µs and more) and short ones (under 20 µs), ``--pairs K`` (default 5, so that the
      analysis can read what 2 to 5 pairs give);
    * ``effects.parquet`` -- environment changes whose effect is known in advance (:data:`EFFECTS`):
      ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` on fp32 GEMMs (cuBLAS may use TF32 tensor cores:
      FASTER, and the output moves by TF32's rounding), ``CUDA_LAUNCH_BLOCKING=1`` on short GEMMs
      (every launch waits for the GPU, so each timed call also holds the host's launch latency:
      SLOWER), and ``TORCH_BLAS_PREFER_HIPBLASLT=0``, which only ROCm builds read (the same cuBLAS
      kernel on an NVIDIA GPU: SAME); plus a second interpreter (a venv made here, seeing this
      interpreter's packages through a ``.pth`` file) against this one (SAME);
    * ``inproc.json`` -- the same A/A cases timed in one process, interleaved, the backend twice
      (:func:`flyexplore.measure.interleaved.measure_interleaved`): the time an in-process case of
      the same backends costs, against the A/B case's (its ``wall_s``: warm-up, rounds and the
      profiled round, worker starts and builds not counted);
    * ``env.json`` (``flyexplore env --json``), ``provenance_<part>.json`` (commit and tree state,
      flyexplore's version, the machine, the time: :func:`provenance`) and ``run.log``.

``analyze OUT``
    Here. Reads the files and writes ``OUT/summary.md`` (its last line: the provenance of the
    analysis) and ``OUT/aa_pairs.csv``: A/A labels at
    the +-1% band for the calls of 40 µs and more (goal: SAME in 90% or more, FASTER/SLOWER in
    none), what the short calls read with 2..K pairs (each row's first k pairs combined as the
    A/B combines them), the effects' labels and directions, and the A/B case's time against the
    in-process case's (goal: at most 2x).

Usage (repository root)::

    python benchmarks/evidence/ab_envs.py run data/h200/ab --part aa      # on the GPU
    python benchmarks/evidence/ab_envs.py run data/h200/ab --part effects # on the GPU
    python benchmarks/evidence/ab_envs.py analyze data/h200/ab
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SCRIPT = "benchmarks/evidence/ab_envs.py"

#: The A/A cases: (op, backend, dtype, shapes). Long calls first (40 µs and more on an H200),
#: then short ones (under 20 µs): the issue's 8192x8192x8192, 3072x3072x12288, 512x8192x28672,
#: 384x11008x4096, 4096x4096x4096 and its SDPA and RMSNorm shapes among them.
AA = (
    ("gemm", "aten", "bf16", ("8192x8192x8192", "4096x4096x4096", "3072x3072x12288", "512x8192x28672",
                              "2048x14336x4096", "2048x4096x14336", "1024x4096x4096", "384x11008x4096",
                              "64x4096x4096", "16x4096x4096")),
    ("attention", "flash", "bf16", ("4x32x2048x2048x128:causal=1", "1x32x2048x2048x128", "2x32x1024x1024x128",
                                    "1x8x512x512x64")),
    ("rmsnorm", "aten", "bf16", ("8192x4096", "16384x8192", "32768x4096", "1024x4096", "2048x2048")),
)
#: Known effects: (name, environment B's text, op, backend, dtype, shapes, expected label).
EFFECTS = (
    ("tf32", "tf32:TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1", "gemm", "aten", "fp32",
     ("4096x4096x4096", "2048x8192x4096"), "FASTER"),
    ("blocking", "blocking:CUDA_LAUNCH_BLOCKING=1", "gemm", "aten", "bf16",
     ("64x4096x4096", "1024x4096x4096"), "SLOWER"),
    ("hipblaslt", "hipblaslt:TORCH_BLAS_PREFER_HIPBLASLT=0", "gemm", "aten", "bf16",
     ("4096x4096x4096", "1024x4096x4096", "512x8192x28672"), "SAME"),
)
CPU_AA = (("gemm", "aten", "fp32", ("256x256x256", "384x256x512")),)
#: Where the sweeps write before their rows are joined into one file of ``OUT`` (their journals
#: and locks stay out of the folder the device hands back).
_TMP = tempfile.TemporaryDirectory(prefix="ab-envs-")
#: Long calls: the A/A goal's threshold (µs).
LONG_US = 40.0
SHORT_US = 20.0


def _log(out: Path, text: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {text}"
    print(line, flush=True)
    with open(out / "run.log", "a") as f:
        f.write(line + "\n")


def _sweep(op, backend, dtype, shapes, envs, aa, pairs, device, out: Path, name: str):
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep

    spec = SweepSpec(op, shapes=";".join(shapes), dtypes=dtype, backends=backend, device=device,
                     envs=envs, aa=aa, pairs=pairs, out=Path(_TMP.name) / f"{name}.parquet", overwrite=True)
    t0 = time.time()
    df = run_sweep(spec, progress=False)
    _log(out, f"{name}: {op} {len(df)} rows in {time.time() - t0:.0f} s; problems: {df.attrs.get('problems')}; "
              f"notes: {df.attrs.get('notes')}")
    return df


def _save(frames, out: Path, name: str) -> None:
    from flyexplore.results import table as R

    df = R.concat(frames)
    df.attrs["sweeps"] = [rec for f in frames for rec in f.attrs.get("sweeps", [])]
    R.save(df, out / f"{name}.parquet")


def make_venv(where: Path) -> str:
    """A venv at ``where`` that sees this interpreter's packages (a ``.pth`` file calling
    ``site.addsitedir`` on this interpreter's site-packages: a venv made from inside a venv does
    not see them otherwise). Returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = where / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    mine = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    Path(site, "parent_site.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in dict.fromkeys(mine)) + "\n")
    return str(py)


def provenance(out: Path, part: str) -> None:
    """Where the numbers come from, as ``provenance_<part>.json``
    (:func:`flyexplore.world.env.write_provenance`: the commit -- ``git rev-parse`` of the checkout,
    or ``FLYEXPLORE_COMMIT`` / ``FLYEXPLORE_DIRTY`` set by whoever started the run where the code is
    a copy without ``.git`` --, whether the tree was dirty, flyexplore's version, the machine
    without its host name and the time), with the part and what ``nvidia-smi`` says of the GPU
    (name, driver, power limit; ``none`` without it)."""
    import shutil

    from flyexplore.world.env import write_provenance

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "none"
    write_provenance(out, SCRIPT, name=f"provenance_{part}.json", extra={"part": part, "nvidia_smi": gpu})


def run(out: Path, part: str, pairs: int, quick: bool, device: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gpu = device != "cpu"
    provenance(out, part)
    if part in ("aa", "all"):
        subprocess.run([sys.executable, "-m", "flyexplore", "env", "--json"], stdout=open(out / "env.json", "w"))
        frames = []
        for op, be, dt, shapes in (AA if gpu else CPU_AA):
            shapes = shapes[:2] if quick else shapes
            frames.append(_sweep(op, be, dt, shapes, None, True, pairs, device, out, f"aa_{op}"))
            _save(frames, out, "aa")   # after each operator: a run cut short keeps what it measured
    if part == "aa-rmsnorm":   # the A/A of the RMSNorm cases alone (a follow-up run)
        op, be, dt, shapes = next(x for x in AA if x[0] == "rmsnorm")
        _save([_sweep(op, be, dt, shapes, None, True, pairs, device, out, "aa_rmsnorm")], out, "aa_rmsnorm")
    if part in ("effects", "all"):
        frames = []
        for name, env_b, op, be, dt, shapes, _ in EFFECTS if gpu else ():
            shapes = shapes[:1] if quick else shapes
            frames.append(_sweep(op, be, dt, shapes, ["base", env_b], False, 3, device, out, f"effects_{name}"))
            _save(frames, out, "effects")
        with tempfile.TemporaryDirectory() as tmp:
            py = make_venv(Path(tmp) / "venv2")
            _log(out, f"second interpreter: {py}")
            op, be, dt, shapes = (AA if gpu else CPU_AA)[0][:4]
            frames.append(_sweep(op, be, dt, shapes[:1] if quick else shapes[:3], ["base", f"venv={py}"], False,
                                 2 if quick else 3, device, out, "effects_venv"))
        _save(frames, out, "effects")
        inproc(out, device, quick)


def inproc(out: Path, device: str, quick: bool) -> None:
    """The A/A cases timed in this process, interleaved, the backend's callable twice: each case's
    wall time (warm-up, rounds, profiled round) and its rounds, written to ``inproc.json``."""
    import torch

    from flyexplore.measure.interleaved import measure_interleaved
    from flyexplore.ops import get_op
    from flyexplore.ops.base import RunContext, reset_dynamo
    from flyexplore.world import env as ENV

    dev = torch.device(device)
    ctx = RunContext(dev, ENV.collect())
    rows = []
    for op_name, be, dt, shapes in (AA if dev.type == "cuda" else CPU_AA):
        op = get_op(op_name)
        for s in shapes[:2] if quick else shapes:
            case = op.case(s)
            reset_dynamo()
            inputs = op.make_inputs(case, dt, dev, 0)
            bk = op.get_backend(be)
            with bk.context(ctx, case):
                fn = bk.build(case, dt, inputs, ctx)
                fn()
            t0 = time.perf_counter()
            res = measure_interleaved({"x": fn, "y": fn}, dev, baseline="x",
                                      enter=lambda nm: bk.context(ctx, case))
            rows.append({"op": op_name, "case": case.label, "dtype": dt, "backend": be, "wall_s": res.wall_s,
                         "call_s": time.perf_counter() - t0, "rounds": res.rounds, "stop_reason": res.stop_reason,
                         "time_us": res.measurements["x"].median * 1e3, "speedup": res.speedup("y")[0]})
            del inputs, fn
    (out / "inproc.json").write_text(json.dumps(rows, indent=1))
    _log(out, f"in-process: {len(rows)} cases")


# -- analysis ---------------------------------------------------------------------------------------

def _pairs_label(per: list[dict], k: int, band: float = 0.01):
    """The speedup's estimate, interval and label from the first ``k`` pairs, as the A/B combines
    them (:func:`flyexplore.run.processes.intervals`, ``kind="pairs"``)."""
    from flyexplore.measure import stats as S
    from flyexplore.run.processes import intervals

    got = intervals(per[:k], "cuda", band, kind="pairs")   # one pair: its own interval widened by the floor
    if got is None or "speedup" not in got:
        p = per[0]
        se = p.get("speedup_se") or math.nan
        lo, hi = p["speedup"] * math.exp(-1.96 * se), p["speedup"] * math.exp(1.96 * se)
        return p["speedup"], lo, hi, S.verdict(lo, hi, band)
    return got["speedup"], got["speedup_lo"], got["speedup_hi"], got["verdict"]


def analyze(out: Path) -> None:
    import pandas as pd

    from flyexplore.results import compare as C
    from flyexplore.results import table as R

    lines = ["# Environment A/B on the H200: summary (`benchmarks/evidence/ab_envs.py analyze`)", ""]
    aa = R.load(out / "aa.parquet")
    base = aa[aa["speedup"].isna() & aa["status"].eq("ok")]
    other = aa[aa["speedup"].notna()]
    t_us = {(r.op, r.case): r.time_ms * 1e3 for r in base.itertuples()}
    recs = []
    for r in other.itertuples():
        per = R.process_estimates(r.process_estimates)
        us = t_us.get((r.op, r.case), math.nan)
        rec = {"op": r.op, "case": r.case, "time_us": round(us, 1), "pairs": len(per),
               "speedup": r.speedup, "lo": r.speedup_lo, "hi": r.speedup_hi, "label": r.verdict,
               "same_within": max(1 - r.speedup_lo, r.speedup_hi - 1),
               "per_pair": ";".join(f"{p['speedup']:.4f}" for p in per)}
        for k in range(1, len(per) + 1):
            rec[f"label_{k}"] = _pairs_label(per, k)[3]
        recs.append(rec)
    t = pd.DataFrame(recs)
    t.to_csv(out / "aa_pairs.csv", index=False)
    long = t[t["time_us"] >= LONG_US]
    short = t[t["time_us"] < SHORT_US]
    n_same = int((long["label"] == "SAME").sum())
    n_fs = int(long["label"].isin(["FASTER", "SLOWER"]).sum())
    lines += [f"## A/A across two processes ({len(t)} cases, {t['pairs'].max()} pairs)", "",
              f"- Calls of {LONG_US:g} µs or more: {len(long)} cases; SAME at ±1%: {n_same} "
              f"({n_same / max(len(long), 1):.0%}); FASTER/SLOWER: {n_fs}. Goal: SAME >= 90%, none FASTER/SLOWER.",
              "", "| op | case | time µs | A-aa / A | 95% interval | label | labels with 1..K pairs | per-pair |",
              "| --- | --- | ---: | ---: | --- | --- | --- | --- |"]
    for r in t.sort_values("time_us", ascending=False).itertuples():
        labs = " ".join(getattr(r, f"label_{k}")[0] for k in range(1, r.pairs + 1))
        lines.append(f"| {r.op} | {r.case} | {r.time_us:g} | {r.speedup:.4f} | [{r.lo:.4f}, {r.hi:.4f}] | "
                     f"{r.label} | {labs} | {r.per_pair} |")
    lines += ["", "(labels with k pairs: the first k pairs combined as the A/B combines them; S SAME, A AMBIGUOUS, "
              "F FASTER, S... by first letter; 1 and 2 pairs: widened by the GPU's per-process floor since issue 45)", ""]
    if len(short):
        lines += [f"### Calls under {SHORT_US:g} µs", "",
                  "sd: the standard deviation of one pair's log speedup (between pairs, each pair's own noise "
                  "in it); pairs for ±1%: the fewest pairs K whose interval of the mean, t(K-1) sd / sqrt(K), "
                  "is within ±1% at this sd (where the effect is 0).", "",
                  "| op | case | time µs | per-pair | sd | SAME within (5 pairs) | pairs for ±1% |",
                  "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
        for r in short.itertuples():
            sd = _sd_log(r.per_pair)
            lines.append(f"| {r.op} | {r.case} | {r.time_us:g} | {r.per_pair} | {sd:.2%} | ±{r.same_within:.2%} | "
                         f"{_pairs_needed(sd)} |")
        longer = t[t["time_us"] >= LONG_US]
        sds = [_sd_log(p) for p in longer["per_pair"]]
        lines += ["", f"For comparison, the calls of {LONG_US:g} µs or more: sd median {sorted(sds)[len(sds) // 2]:.2%}, "
                      f"largest {max(sds):.2%}.", ""]
    ef = R.load(out / "effects.parquet")
    lines += ["## Known effects", "", "| change | case | time A µs | time B µs | ratio A/B | 95% interval | label | "
              "expected | kernels A | kernels B | outputs |", "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- |"]
    expected = {e.split(":")[0]: lab for _, e, *_rest, lab in EFFECTS}
    expected["venv"] = "SAME"
    for env_b in ef["env"].dropna().unique():
        if env_b == "base":
            continue
        d = ef[ef["env"].isin(["base", env_b])]
        run_ids = d.loc[d["env"] == env_b, "run_id"].unique()
        d = d[d["run_id"].isin(run_ids)]
        sd = C.sides(d, None, a_env="base", b_env=env_b)
        pa = sd.ab.pairs
        for r in pa.itertuples():
            ka = _kernels(sd.a, r.case)
            kb = _kernels(sd.b, r.case)
            ok = sd.b.loc[sd.b["case"] == r.case, "cross_env_ok"]
            err = sd.b.loc[sd.b["case"] == r.case, "cross_env_err_rel"]
            lines.append(f"| {env_b} | {r.case} | {r.time_a_ms * 1e3:.1f} | {r.time_b_ms * 1e3:.1f} | {r.ratio:.4f} | "
                         f"[{r.ratio_lo:.4f}, {r.ratio_hi:.4f}] | {r.verdict} | {expected.get(env_b, '?')} | {ka} | "
                         f"{'same' if kb == ka else kb} | {'equal' if ok.eq(True).all() else f'differ ({float(err.max()):.2e})'} |")
    inp = json.loads((out / "inproc.json").read_text())
    ip = pd.DataFrame(inp)
    ab_wall = other.assign(ab_wall=[_median_wall(r.process_estimates) for r in other.itertuples()])
    m = ab_wall.merge(ip, on=["op", "case"], suffixes=("", "_in"))
    m["ratio"] = m["ab_wall"] / m["wall_s_in"]
    lines += ["", "## Time: an A/B case against an in-process interleaved case of the same backends", "",
              f"- Median A/B case (warm-up, rounds and profiled round of one pair; starts and builds not counted): "
              f"{m['ab_wall'].median():.3f} s; in-process (the backend twice, one process): {m['wall_s_in'].median():.3f} s;"
              f" ratio median {m['ratio'].median():.2f}x, worst {m['ratio'].max():.2f}x ({m.loc[m['ratio'].idxmax(), 'case']}). "
              "Goal: at most 2x.", "",
              "| op | case | A/B s (median of pairs) | in-process s | ratio |", "| --- | --- | ---: | ---: | ---: |"]
    for r in m.itertuples():
        lines.append(f"| {r.op} | {r.case} | {r.ab_wall:.3f} | {r.wall_s_in:.3f} | {r.ratio:.2f} |")
    fu = out / "followup" / "aa_rmsnorm.parquet"
    if fu.exists():   # the RMSNorm A/A again, after a change (run with --part aa-rmsnorm)
        d = R.load(fu)
        b = d[d["speedup"].isna() & d["status"].eq("ok")].set_index("case")["time_ms"]
        prov = json.loads((fu.parent / "provenance_aa-rmsnorm.json").read_text())
        lines += ["", f"## Follow-up: the RMSNorm A/A again ({fu.parent.name}/, "
                      f"{prov.get('flyexplore_commit') or prov.get('commit')})", "",
                  "| case | time µs | A-aa / A | 95% interval | label | per-pair |", "| --- | ---: | ---: | --- | --- | --- |"]
        for r in d[d["speedup"].notna()].itertuples():
            per = ";".join(f"{p['speedup']:.4f}" for p in R.process_estimates(r.process_estimates))
            lines.append(f"| {r.case} | {b[r.case] * 1e3:.1f} | {r.speedup:.4f} | [{r.speedup_lo:.4f}, {r.speedup_hi:.4f}] | "
                         f"{r.verdict} | {per} |")
    lines += ["", f"`{_made_by(out, 'analyze')}`"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _made_by(out: Path, step: str) -> str:
    """One line naming the code and machine that wrote ``out``'s summary (its measurements name
    theirs in ``provenance_<part>.json``)."""
    from flyexplore.world.env import provenance, provenance_line

    return provenance_line(provenance(SCRIPT, extra={"step": step}))


def _sd_log(per_pair: str) -> float:
    """Standard deviation of the log of the per-pair speedups (``;``-joined text)."""
    import numpy as np

    x = np.log([float(v) for v in per_pair.split(";")])
    return float(np.std(x, ddof=1)) if x.size > 1 else math.nan


def _pairs_needed(sd: float, band: float = 0.01, most: int = 200) -> str:
    """The fewest pairs K >= 2 with ``t(K-1) * sd / sqrt(K) <= band`` (the interval of the mean
    within the band when the effect is 0); ``> most`` past it."""
    from flyexplore.measure.stats import t_quantile

    for k in range(2, most + 1):
        if t_quantile(k - 1) * sd / math.sqrt(k) <= band:
            return str(k)
    return f"> {most}"


def _median_wall(text) -> float:
    from flyexplore.results import table as R

    w = sorted(p["wall_s"] for p in R.process_estimates(text) if p.get("wall_s") is not None)
    return w[len(w) // 2] if w else math.nan


def _kernels(d, case) -> str:
    ks = d.loc[d["case"] == case, "kernels"].dropna()
    if not len(ks):
        return "?"
    return ", ".join(sorted({k[0][:40] for k in json.loads(ks.iloc[0])}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--part", choices=("aa", "effects", "all", "aa-rmsnorm"), default="all")
    r.add_argument("--pairs", type=int, default=5)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--device", default="cuda")
    a = sub.add_parser("analyze")
    a.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "run":
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        run(args.out, args.part, args.pairs, args.quick, args.device)
    else:
        analyze(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
