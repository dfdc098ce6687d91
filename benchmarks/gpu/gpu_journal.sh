#!/usr/bin/env bash
# Issue 22 on the lent GPU: the journal, the writer lock, the memory refusal and the worker start
# limit with real CUDA workers, and benchmarks/evidence/torture.py on cuda:0.
# Usage (device tool, repo root, .whl carried with plotly):
#   FLYEXPLORE_COMMIT=<hash> FLYEXPLORE_DIRTY=<0|1> bash benchmarks/gpu/gpu_journal.sh "$OUT"
# Writes OUT/provenance.json, nvidia-smi.csv, steps.log, *_rows.csv and torture_cuda.txt.
set -uo pipefail
OUT=${1:-out/gpu_journal}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv > "$OUT/nvidia-smi.csv" 2>&1
# where the numbers come from: commit (FLYEXPLORE_COMMIT / FLYEXPLORE_DIRTY on a copy without .git),
# flyexplore's version, the machine (flyexplore.world.env.write_provenance)
python3 -c 'import sys; from flyexplore.world.env import write_provenance; write_provenance(sys.argv[1], sys.argv[2])' \
    "$OUT" benchmarks/gpu/gpu_journal.sh >> "$OUT/steps.log" 2>&1
FX="python3 -m flyexplore"
W="$OUT/work"; mkdir -p "$W"
step() { echo "== $*" | tee -a "$OUT/steps.log"; }

step "1. memory: a 2e5-cubed bf16 GEMM (240 GB estimated) beside two small ones, on cuda:0 (NVML free memory)"
$FX sweep --op gemm --shapes "512x512x512;200000x200000x200000;1024x1024x1024" --dtypes bf16 --backends aten \
    --out "$W/mem.parquet" --quiet --budget-s 1 >> "$OUT/steps.log" 2>&1; echo "rc=$?" >> "$OUT/steps.log"
step "1b. memory: every case over --max-memory 1MB is exit 2"
$FX sweep --op gemm --shapes "512x512x512" --dtypes bf16 --backends aten --max-memory 1MB \
    --out "$W/mem2.parquet" --quiet >> "$OUT/steps.log" 2>&1; echo "rc=$? file: $(ls $W/mem2.parquet 2>&1)" >> "$OUT/steps.log"

step "2. two sweeps on one --out: the second is refused naming the first"
$FX sweep --op gemm --suite llama3.1-8b --dtypes bf16 --backends aten,triton --budget-s 1 \
    --out "$W/two.parquet" --quiet > "$W/first.log" 2>&1 &
FIRST=$!
for i in $(seq 1 600); do [ -e "$W/two.parquet.journal.sqlite" ] && break; sleep 0.1; done
sleep 2
$FX sweep --op gemm --suite llama3.1-8b --dtypes bf16 --backends aten,triton --budget-s 1 \
    --out "$W/two.parquet" --quiet --resume >> "$OUT/steps.log" 2>&1; echo "second rc=$? (first pid $FIRST)" >> "$OUT/steps.log"
wait $FIRST; echo "first rc=$?" >> "$OUT/steps.log"; tail -3 "$W/first.log" >> "$OUT/steps.log"

step "3. worker start limit 0.5 s: CUDA workers never get ready in time -> 3 attempts, crashed rows, exit 4"
$FX sweep --op gemm --shapes "512x512x512;1024x1024x1024" --dtypes bf16 --backends aten --worker-start-timeout 0.5 \
    --out "$W/start.parquet" --quiet >> "$OUT/steps.log" 2>&1; echo "rc=$?" >> "$OUT/steps.log"
step "3b. the same with the default limit: ready, ok rows"
$FX sweep --op gemm --shapes "512x512x512;1024x1024x1024" --dtypes bf16 --backends aten \
    --out "$W/start.parquet" --quiet --resume --retry-failed >> "$OUT/steps.log" 2>&1; echo "rc=$?" >> "$OUT/steps.log"

python3 - "$W" "$OUT" <<'PY' >> "$OUT/steps.log" 2>&1
import sys, json
from flyexplore.results import table as R
w, out = sys.argv[1], sys.argv[2]
for f in ("mem", "two", "start"):
    df = R.load(f"{w}/{f}.parquet")
    print(f, len(df), "rows;", df.groupby("status").size().to_dict(), "; duplicates:", int(df.duplicated(list(R.KEY)).sum()))
    cols = [c for c in ("op", "case", "dtype", "backend", "status", "message", "time_ms", "device", "device_id",
                        "worker", "run_id") if c in df]
    df[cols].to_csv(f"{out}/{f}_rows.csv", index=False)
PY

if [ "${TORTURE_N:-10}" != 0 ]; then step "4. torture on cuda:0"
python3 benchmarks/evidence/torture.py --device cuda:0 --n ${TORTURE_N:-10} --jobs 2 --out "$OUT/torture_cuda.txt" 2>&1 | tail -3 >> "$OUT/steps.log"; fi
cat "$OUT/steps.log"
