#!/usr/bin/env bash
# On one CUDA GPU: the kernels' exactness tests, a tile sweep, then the benchmark tables.
# Usage, from the repo root: [BENCH_ARGS=...] bash gpu/kernels.sh [test,overhead,sweep,bench]
# Logs go to OUT (default runs/gpu/kernels).
set -uo pipefail
# the trainer's dependencies (hydra, megatron-core, wandb), from the wheelhouse where the
# image lacks them (2026-12-02: perf.sh alone on a fresh node died on `import hydra`)
source gpu/setup.sh || exit 1
export PYTHONPATH=. PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
OUT=${OUT:-runs/gpu/kernels}; mkdir -p "$OUT"
steps=${1:-test,sweep,bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if [[ $steps == *test* ]]; then
  timeout 150 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider -n 8 2>&1 | tail -40 | tee "$OUT/test_gpu.log"
fi
if [[ $steps == *sweep* ]]; then
  timeout 90 python3 gpu/tile_sweep.py 2>&1 | tee "$OUT/sweep.log"
fi
if [[ $steps == *overhead* ]]; then
  timeout 60 python3 gpu/launch_overhead.py 2>&1 | tee "$OUT/overhead.log"
fi
if [[ $steps == *bench* ]]; then
  cp docs/performance.md "$OUT/performance.md" 2>/dev/null
  timeout 330 python3 -m ufp4_megatron.bench --out "$OUT/performance.md" --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
