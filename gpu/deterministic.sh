#!/usr/bin/env bash
# train.deterministic on one CUDA GPU at real shapes: model=small (125M, seq 1024, 2
# micro-batches of 4) and dense_1p5b's layers with model.num_layers=2 (seq 4096, 4
# micro-batches of 1), UFP4, checkpoints every 4 of 12 steps. With the mode: a second unbroken
# run, SIGKILL inside a random step, SIGKILL inside a save, SIGTERM and SIGINT, each resumed:
# every loss and grad norm bitwise equal to the unbroken run's. Without it: a pair of unbroken
# runs, what differs and by how much; and the mode's step-time cost (each shape's two timed
# runs alone). Runs tests/gpu/test_deterministic_gpu.py (its header: why dense_1p5b's
# vocabulary is DENSE_VOCAB=32768 rows here). About 8 minutes on an H200 (an estimate from the
# runs' sizes; not yet timed there). Needs ~45 GB of free disk under WORK.
# Usage, from the repo root:  OUT=dir bash gpu/deterministic.sh   (SEED=n repeats the moments)
# Writes OUT (default runs/gpu/deterministic): gpu.txt, deterministic.json (rows, moments, step
# times, the default runs' variation), deterministic.log (every run's output), driver.err.
# Prints a table last. Exit 0 iff every case passes.
set -uo pipefail
OUT=${OUT:-runs/gpu/deterministic}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/gpu_deterministic}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
python3 -c 'import hydra, megatron.core' 2>/dev/null || source gpu/setup.sh > "$OUT/driver.err" 2>&1 \
  || { cat "$OUT/driver.err"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
rm -rf "$WORK"
timeout 570 python3 tests/gpu/test_deterministic_gpu.py --out "$OUT" --work "$WORK" \
  ${SEED:+--seed "$SEED"} 2>> "$OUT/driver.err"
rc=$?
[ $rc -eq 124 ] && echo "FAIL: timed out after 570 s (see $OUT/deterministic.log)"
rm -rf "$WORK"
exit $rc
