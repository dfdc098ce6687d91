#!/usr/bin/env bash
# Issue 21 on the lent GPU: the capture against a real run on cuda:0, full-depth captures with the
# real device present, and the exported shapes of Llama-3.1-8B and Qwen3-30B-A3B swept with
# --shapes-from, then a report with the model-weighted (measured) section.
# Usage (device tool, repo root, .whl carried with transformers 5.23 and plotly):
#   FLYEXPLORE_COMMIT=<hash> FLYEXPLORE_DIRTY=<0|1> bash benchmarks/gpu/gpu_model_capture.sh "$OUT"
# The provenance (commit, flyexplore's version, the machine) is in OUT/env.json (gpu_model_capture.py)
# and every swept row carries the commit (flyexplore_commit).
set -uo pipefail
OUT=${1:-out/gpu_model_capture}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 benchmarks/gpu/gpu_model_capture.py "$OUT" 2>&1 | grep -v "is an Enum subclass" | tee "$OUT/capture.log"
FX="python3 -m flyexplore"
for m in llama-3.1-8b qwen3-30b-a3b; do
  $FX sweep --op gemm --shapes-from "$OUT/${m}_shapes.csv" --backends aten,inductor --budget-s 2 \
      --out "$OUT/${m}_gemm.parquet" --quiet 2>&1 | tail -25 | tee "$OUT/${m}_gemm.log"
  $FX sweep --op rmsnorm --shapes-from "$OUT/${m}_shapes.csv" --backends aten,inductor --budget-s 2 \
      --out "$OUT/${m}_rmsnorm.parquet" --quiet 2>&1 | tail -12 | tee "$OUT/${m}_rmsnorm.log"
done
$FX sweep --op grouped_gemm --shapes-from "$OUT/qwen3-30b-a3b_shapes.csv" --backends aten,triton --budget-s 2 \
    --out "$OUT/qwen3-30b-a3b_grouped.parquet" --quiet 2>&1 | tail -12 | tee "$OUT/qwen3-30b-a3b_grouped.log"
for m in llama-3.1-8b qwen3-30b-a3b; do
  $FX report "$OUT/${m}"_*.parquet --out "$OUT/${m}_report" --no-images 2>&1 | tail -2
done
