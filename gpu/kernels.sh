#!/usr/bin/env bash
# One device call: GPU exactness tests, a tile sweep, then the benchmark tables.
# Usage (device tool): [BENCH_ARGS=...] bash tools/gpu_kernels.sh [test,sweep,bench]; logs in $OUT
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
steps=${1:-test,sweep,bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [[ $steps == *test* ]]; then
  timeout 150 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider -n 8 2>&1 | tail -40 | tee "$OUT/test_gpu.log"
fi
if [[ $steps == *sweep* ]]; then
  timeout 90 python3 tools/gpu_tile_sweep.py 2>&1 | tee "$OUT/sweep.log"
fi
if [[ $steps == *overhead* ]]; then
  timeout 60 python3 tools/gpu_launch_overhead.py 2>&1 | tee "$OUT/overhead.log"
fi
if [[ $steps == *bench* ]]; then
  cp docs/performance.md "$OUT/performance.md" 2>/dev/null
  timeout 330 python3 -m ufp4_megatron.bench --out "$OUT/performance.md" --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
