#!/usr/bin/env bash
# A smoke run of the layered package on a GPU machine (issue 20): the public face and the CLI end
# to end, worker processes, event-gated interleaved timing, traces, a report, and every notebook
# at --size gpu. Not a benchmark: it shows that what worked before the layout change still works
# on a real GPU. Writes two archives under OUT (the lent machine returns at most 8 files):
#   OUT/layers_smoke.tar.gz   env.json, provenance.json, the sweeps' result files and logs, fx.json, report/
#   OUT/notebooks.tar.gz      the executed notebooks, env.json, run.json (benchmarks/tools/run_notebooks.py)
# Usage (repo root): FLYEXPLORE_COMMIT=<hash> FLYEXPLORE_DIRTY=<0|1> bash benchmarks/gpu/gpu_layers_smoke.sh OUT
set -uo pipefail
OUT=${1:?usage: gpu_layers_smoke.sh OUT}
S="$OUT/layers_smoke"
mkdir -p "$S"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

$py -m flyexplore env --json > "$S/env.json"   # with the commit (FLYEXPLORE_COMMIT / FLYEXPLORE_DIRTY on a copy)
$py -c 'import sys; from flyexplore.world.env import write_provenance; write_provenance(sys.argv[1], sys.argv[2])' \
    "$S" benchmarks/gpu/gpu_layers_smoke.sh
# CLI: worker process per GPU, event-gated rounds, every row traced
$py -m flyexplore sweep --op gemm --shapes "4096x4096x4096;16x28672x4096;2048x6144x4096" --dtypes bf16 \
    --backends aten,triton,inductor --trace --out "$S/gemm.parquet" > "$S/gemm.log" 2>&1
$py -m flyexplore sweep --op rmsnorm --shapes "8192x4096;4096x8192" --dtypes bf16 \
    --backends aten,inductor,flydsl --trace --out "$S/rmsnorm.parquet" > "$S/rmsnorm.log" 2>&1
# attention rows on a GPU record which kernel ran (Operator.trace_on_gpu) without --trace
$py -m flyexplore sweep --op attention --shapes "1x32x4096x4096x128:causal=1;4x16x1024x1024x64" \
    --dtypes bf16 --backends flash,efficient,cudnn,math --out "$S/attention.parquet" > "$S/attention.log" 2>&1
$py -m flyexplore trace --op gemm --shape 4096x4096x4096 --backend aten > "$S/trace.log" 2>&1
$py -m flyexplore report "$S/gemm.parquet" "$S/rmsnorm.parquet" "$S/attention.parquet" --out "$S/report" \
    --no-images > "$S/report.log" 2>&1
# the public face: a sweep from Python, the spec that travels with its rows, speedups, explain.
# From a file with a main guard: worker processes re-import the main module ('<stdin>' cannot be)
cat > "$OUT/fx_smoke.py" <<'EOF'
import json
import sys

import flyexplore as fx


def main(out):
    df = fx.sweep("topk", shapes="4096x32768x8;256x1024x8", dtypes="fp32", backends="aten,inductor",
                  progress=False, out=f"{out}/topk.parquet")
    sp = fx.speedup(df, "aten")
    ex = fx.explain("gemm", "8192x8192x8192", "bf16")
    rec = {"rows": len(df), "statuses": sorted(set(df.status)), "devices": sorted(set(df.device)),
           "timing_modes": sorted(set(df.timing_mode.dropna())), "sweeps": df.attrs.get("sweeps"),
           "speedups": sp[["case", "backend", "speedup", "speedup_lo", "speedup_hi", "verdict"]].to_dict("records"),
           "explain_gfx950": {"taken": ex.taken, "reason": ex.reason}}
    json.dump(rec, open(f"{out}/fx.json", "w"), indent=1, default=str)
    print(json.dumps({k: rec[k] for k in ("rows", "statuses", "devices", "timing_modes")}))


if __name__ == "__main__":
    main(sys.argv[1])
EOF
$py "$OUT/fx_smoke.py" "$S" > "$S/fx.log" 2>&1; rm -f "$OUT/fx_smoke.py"
$py benchmarks/tools/run_notebooks.py "$OUT/notebooks" --size gpu > "$S/notebooks.log" 2>&1
tar -C "$OUT" -czf "$OUT/layers_smoke.tar.gz" layers_smoke && rm -rf "$S"
tar -C "$OUT" -czf "$OUT/notebooks.tar.gz" notebooks && rm -rf "$OUT/notebooks"
ls -la "$OUT"
