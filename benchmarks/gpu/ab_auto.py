"""Issue 43's goals for the environment A/B, measured on the lent GPU: ``--pairs auto`` (pairs until
every label is decided), the A/A floor under it, real effects of 2-6%, pairs that start fast, and
a model step (prefill and decode) across two environments.

``run OUT [--part aa|effects|model|all] [--quick]``
    On the GPU. Writes into ``OUT`` (at most 8 files, what the device hands back):

    * ``aa.parquet`` -- the A/A floor under ``--pairs auto``: this interpreter against a copy of
      itself (``--aa``) on :data:`AA`, 12 cases of 40 µs or more, bf16 (GEMMs through cuBLAS, SDPA
      forward through flash attention, causal and GQA among them);
    * ``effects.parquet`` -- effects of 2-6% read with ``--pairs auto`` and with ``--pairs 3`` on the
      same plan (each sweep's wall time in ``run.log`` and ``timing.json``):
      - ``work5`` and ``work2.5``: a controlled effect whose size is known in advance: the toy
        operator ``ab_ops:SLOW`` (``tests/ab_ops.py``: ``sin`` of a vector repeated 40 times a call)
        with ``AB_SLOWDOWN=0.05`` / ``0.025`` in environment B, i.e. 42 / 41 launches instead of 40:
        B does 5% / 2.5% more of the same work, so every case is truly SLOWER by about that much;
      - ``cublas_ws``: ``CUBLAS_WORKSPACE_CONFIG=:0:0`` in B (cuBLAS gets no workspace, so it
        cannot pick the split-K kernels that need one: the issue measured -2.9% and +6.1% on two
        bf16 GEMMs with 8 pairs), on small-M, large-K GEMMs where split-K kernels are the ones
        cuBLAS picks; the size and sign of each case's effect are what the run finds;
    * ``model.parquet`` -- a model step across two environments (``--aa``): a 2-layer Llama-like
      config, prefill 1x512 and decode 8x512, the family's timing mode (``event``) and breakdown;
    * ``timing.json`` -- each sweep's wall time, pair counts, and how long each pass waited for its
      pair of workers (``start_s``: a spare pair is launched while a pass measures) beside how long
      a pair takes from launch to ready;
    * ``env.json`` (``flyexplore env --json``), ``provenance_<part>.json`` and ``run.log``.

``analyze OUT``
    Here. Reads the files and writes ``OUT/summary.md`` against the goals: A/A none FASTER/SLOWER
    and SAME >= 90%; the effects FASTER/SLOWER in >= 90% of their cases with ``--pairs auto`` at
    <= 2x the wall time of ``--pairs 3``; a pair started in <= 3 s.

Usage (repository root)::

    python benchmarks/gpu/ab_auto.py run $OUT --part aa        # on the GPU
    python benchmarks/gpu/ab_auto.py analyze data/h100/ab_auto
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))   # ab_ops, the toy operator with a known effect

SCRIPT = "benchmarks/gpu/ab_auto.py"

#: The A/A cases: (op, backend, dtype, shapes), every call 40 µs or more on an H100 / H200.
AA = (
    ("gemm", "aten", "bf16", ("8192x8192x8192", "4096x4096x4096", "3072x3072x12288", "512x8192x28672",
                              "2048x14336x4096", "2048x4096x14336", "1024x8192x8192", "4096x2048x8192")),
    ("attention", "flash", "bf16", ("4x32x2048x2048x128:causal=1", "1x32x2048x2048x128", "2x32x1024x1024x128",
                                    "2x32x4096x4096x128:causal=1,hkv=8")),
)
#: The effects: (name, environment B, op, backend, dtype, shapes).
EFFECTS = (
    ("work5", "work5:AB_SLOWDOWN=0.05", "ab_ops:SLOW", "work", "fp32",
     ("1048576", "2097152", "4194304", "524288", "3145728", "1572864")),
    ("work2.5", "work2.5:AB_SLOWDOWN=0.025", "ab_ops:SLOW", "work", "fp32",
     ("1048576", "2097152", "4194304", "524288", "3145728", "1572864")),
    ("cublas_ws", "ws0:CUBLAS_WORKSPACE_CONFIG=:0:0", "gemm", "aten", "bf16",
     ("128x2048x16384", "64x4096x28672", "32x4096x14336", "64x8192x8192", "128x4096x28672", "16x8192x28672",
      "256x2048x16384", "64x2048x16384")),
)
MODEL_CFG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 2,
             "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
             "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
_TMP = tempfile.TemporaryDirectory(prefix="ab-auto-")


def _log(out: Path, text: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {text}"
    print(line, flush=True)
    with open(out / "run.log", "a") as f:
        f.write(line + "\n")


def _timing(out: Path, rec: dict) -> None:
    p = out / "timing.json"
    got = json.loads(p.read_text()) if p.exists() else []
    got.append(rec)
    p.write_text(json.dumps(got, indent=1))


def _sweep(out: Path, name: str, op, backend, dtype, shapes, *, envs=None, aa=False, pairs=None):
    from flyexplore.run import envab
    from flyexplore.run.spec import SweepSpec
    from flyexplore.run.sweep import run_sweep

    spec = SweepSpec(op, shapes=";".join(shapes), dtypes=dtype, backends=backend, device="cuda", envs=envs, aa=aa,
                     pairs=pairs, out=Path(_TMP.name) / f"{name}.parquet", overwrite=True)
    starts: list = []
    real = envab.Pair.ready

    def ready(self):   # how long each pass waited for its pair (a spare: what was left of its start)
        real(self)
        starts.append({"label": self.label, "wait_s": round(self.start_s, 3),
                       "launch_to_ready_s": round(time.monotonic() - self.launched, 3)})

    envab.Pair.ready = ready
    t0 = time.time()
    try:
        df = run_sweep(spec, progress=False)
    finally:
        envab.Pair.ready = real
    wall = time.time() - t0
    _log(out, f"{name}: {len(df)} rows in {wall:.1f} s; pairs {sorted(set(df['processes'].dropna().astype(int)))}; "
              f"problems: {df.attrs.get('problems')}; notes: {df.attrs.get('notes')}")
    _timing(out, {"name": name, "wall_s": wall, "rows": len(df), "pairs": spec.pairs or "auto", "starts": starts})
    return df


def _save(frames, out: Path, name: str) -> None:
    from flyexplore.results import table as R

    df = R.concat(frames)
    df.attrs["sweeps"] = [rec for f in frames for rec in f.attrs.get("sweeps", [])]
    R.save(df, out / f"{name}.parquet")


def run(out: Path, part: str, quick: bool) -> None:
    from flyexplore.world.env import write_provenance

    out.mkdir(parents=True, exist_ok=True)
    write_provenance(out, SCRIPT, name=f"provenance_{part}.json", extra={"part": part})
    if not (out / "env.json").exists():
        subprocess.run([sys.executable, "-m", "flyexplore", "env", "--json"], stdout=open(out / "env.json", "w"))
    if part in ("aa", "all"):
        frames = []
        for op, be, dt, shapes in AA:
            frames.append(_sweep(out, f"aa_{op}", op, be, dt, shapes[:2] if quick else shapes, aa=True))
            _save(frames, out, "aa")
    if part in ("effects", "all"):
        frames = []
        for name, env_b, op, be, dt, shapes in EFFECTS:
            shapes = shapes[:2] if quick else shapes
            for pairs in ("auto", 3):
                df = _sweep(out, f"{name}_{pairs}", op, be, dt, shapes, envs=["base", env_b], pairs=pairs)
                frames.append(df.assign(effect=name, pairs_mode=str(pairs)))
                _save(frames, out, "effects")
    if part in ("model", "all"):
        cfg = Path(_TMP.name) / "llama2l.json"
        cfg.write_text(json.dumps(MODEL_CFG))
        frames = [_sweep(out, "model", "model", "eager,compile", "bf16",
                         (f"1x512:model={cfg}", f"8x512:model={cfg},decode"), aa=True, pairs="auto")]
        _save(frames, out, "model")


# -- analysis -------------------------------------------------------------------------------------

def analyze(out: Path) -> None:
    import pandas as pd

    from flyexplore.results import table as R
    from flyexplore.world.env import provenance, provenance_line

    lines = ["# `--pairs auto` on the lent GPU: summary (`benchmarks/gpu/ab_auto.py analyze`)", ""]
    prov = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("provenance_*.json"))}
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    dev = (env.get("devices") or [{}])[0] if isinstance(env.get("devices"), list) else {}
    lines += [f"Device: {dev.get('name', '?')}; torch {env.get('versions', {}).get('torch', '?')}; runs: "
              + ", ".join(f"{k} at {v.get('flyexplore_commit') or v.get('commit')}"
                          f"{' (dirty)' if v.get('dirty') else ''}" for k, v in prov.items()), ""]
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else []
    wall = {t["name"]: t for t in timing}
    if (out / "aa.parquet").exists():
        aa = R.load(out / "aa.parquet")
        base = aa[aa["speedup"].isna() & aa["status"].eq("ok")].set_index(["op", "case"])["time_ms"]
        o = aa[aa["speedup"].notna()]
        n_fs = int(o["verdict"].isin(["FASTER", "SLOWER"]).sum())
        n_same = int((o["verdict"] == "SAME").sum())
        lines += [f"## A/A floor, `--aa --pairs auto` ({len(o)} cases, bf16)", "",
                  f"FASTER/SLOWER: {n_fs} (goal 0); SAME: {n_same} of {len(o)} ({n_same / max(len(o), 1):.0%}; goal "
                  f">= 90%).", "", "| op | case | time µs | A-aa / A | interval | label | pairs | stopped |",
                  "| --- | --- | ---: | ---: | --- | --- | ---: | --- |"]
        for r in o.itertuples():
            us = base.get((r.op, r.case), math.nan) * 1e3
            lines.append(f"| {r.op} | {r.case} | {us:.1f} | {r.speedup:.4f} | [{r.speedup_lo:.4f}, {r.speedup_hi:.4f}] "
                         f"| {r.verdict} | {int(r.processes)} | {r.pairs_stop} |")
        lines.append("")
    if (out / "effects.parquet").exists():
        ef = R.load(out / "effects.parquet")
        lines += ["## Effects: `--pairs auto` against `--pairs 3` on the same plan", "",
                  "| effect | case | pairs | B / base | interval | label | pairs run | stopped |",
                  "| --- | --- | --- | ---: | --- | --- | ---: | --- |"]
        goal = []
        for (name, mode), d in ef[ef["speedup"].notna()].groupby(["effect", "pairs_mode"], sort=False):
            for r in d.itertuples():
                lines.append(f"| {name} | {r.case} | {mode} | {r.speedup:.4f} | [{r.speedup_lo:.4f}, {r.speedup_hi:.4f}] "
                             f"| {r.verdict} | {int(r.processes)} | {r.pairs_stop} |")
            decided = int(d["verdict"].isin(["FASTER", "SLOWER"]).sum())
            goal.append((name, mode, decided, len(d), wall.get(f"{name}_{mode}", {}).get("wall_s")))
        lines += ["", "| effect | pairs | FASTER/SLOWER | of cases | wall s |", "| --- | --- | ---: | ---: | ---: |"]
        for name, mode, dec, n, w in goal:
            lines.append(f"| {name} | {mode} | {dec} | {n} | {w:.1f} |" if w else f"| {name} | {mode} | {dec} | {n} | ? |")
        lines += ["", "Wall time of `--pairs auto` over `--pairs 3` (goal <= 2x): " + ", ".join(
            f"{name} {wall[f'{name}_auto']['wall_s'] / wall[f'{name}_3']['wall_s']:.2f}x"
            for name, *_ in EFFECTS if f"{name}_auto" in wall and f"{name}_3" in wall), ""]
    waits = [{**s, "sweep": t["name"], "first": i == 0} for t in timing for i, s in enumerate(t.get("starts", []))]
    if waits:
        w = pd.DataFrame(waits)
        later, first = w[~w["first"]], w[w["first"]]
        lines += ["## Pair starts", "",
                  f"{len(w)} pairs in {len(first)} sweeps. A pass after the first waits for its pair (a spare, launched "
                  f"while the previous pass measured): {len(later)} pairs, median {later['wait_s'].median():.2f} s, "
                  f"largest {later['wait_s'].max():.2f} s, {int((later['wait_s'] <= 3).sum())} of {len(later)} within "
                  f"3 s. The first pair of each sweep starts cold, before the output is opened (a bad environment is "
                  f"refused with nothing written): median {first['wait_s'].median():.2f} s, largest "
                  f"{first['wait_s'].max():.2f} s. A pair's own start, launch to ready: median "
                  f"{w['launch_to_ready_s'].median():.2f} s. Goal: a pair starts in <= 3 s.", ""]
    if (out / "model.parquet").exists():
        m = R.load(out / "model.parquet")
        lines += ["## A model step across two environments (`--aa`)", "",
                  "| case | arm | status | time ms | timing mode | B / A | label | breakdown | pairs |",
                  "| --- | --- | --- | ---: | --- | ---: | --- | --- | ---: |"]
        for r in m.itertuples():
            bd = "yes" if isinstance(r.breakdown, str) and r.breakdown else "no"
            sp = f"{r.speedup:.4f}" if pd.notna(r.speedup) else ""
            lines.append(f"| {r.case} | {r.backend} | {r.status} | {r.time_ms:.3f} | {r.timing_mode} | {sp} | "
                         f"{r.verdict if pd.notna(r.verdict) else ''} | {bd} | {int(r.processes or 0)} |")
        lines.append("")
    lines += [f"`{provenance_line(provenance(SCRIPT, extra={'step': 'analyze'}))}`"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--part", default="all", choices=("aa", "effects", "model", "all"))
    r.add_argument("--quick", action="store_true")
    a = sub.add_parser("analyze")
    a.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "run":
        run(args.out, args.part, args.quick)
    else:
        analyze(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
