#!/usr/bin/env bash
# On one CUDA GPU: the kernels' gpu-marked exactness tests, the launch-overhead probe, a tile
# sweep, then the kernel and layer tables of docs/performance.md (about 6 minutes on an H200
# for all four parts; each has its timeout).
# Usage, from the repo root: [BENCH_ARGS=...] bash gpu/kernels.sh [test,overhead,sweep,bench]
# Logs and tables go to OUT (default runs/gpu/kernels); $OUT/performance.md is a copy of
# docs/performance.md with the bench block rewritten.
set -uo pipefail
# the trainer's dependencies (hydra, megatron-core, wandb), from the wheelhouse where the
# node's image lacks them
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
