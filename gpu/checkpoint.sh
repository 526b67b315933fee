#!/usr/bin/env bash
# GPU checkpoints on one CUDA GPU: tiny-model UFP4 runs killed with SIGKILL right
# after a checkpoint and stopped with SIGTERM, resumed, each loss curve bitwise equal to an
# unbroken run's; with the distributed optimizer (dp_reshardable, fully_reshardable) and without it.
# Runs tests/gpu/test_checkpoint_gpu.py (the same cases as `make test-gpu`), all runs in
# parallel on the one GPU. About 2.5 minutes on an H200; a table of 4 PASS rows, printed last.
# Usage, from the repo root:  bash gpu/checkpoint.sh   (after `source gpu/setup.sh` on a node
# without network: gpu/README.md)
# Writes to OUT (default runs/gpu/checkpoint): $OUT/gpu.txt, $OUT/gpu_checkpoint.json (one row
# per case), $OUT/gpu_checkpoint.log (stdout/stderr of every run). Exit 0 iff every case passes.
set -uo pipefail
OUT=${OUT:-runs/gpu/checkpoint}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
if ! python3 -c 'import psutil' 2>/dev/null; then
  echo "FAIL: psutil is missing (Megatron's dist_checkpointing writer needs it): rebuild the" \
       "wheelhouse (make wheelhouse PY=3.12) so that gpu/setup.sh installs it"
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
rm -rf /tmp/gpu_checkpoint
timeout 230 python3 tests/gpu/test_checkpoint_gpu.py --out "$OUT" --work /tmp/gpu_checkpoint \
  2> "$OUT/driver.err"
rc=$?
[ $rc -eq 124 ] && echo "FAIL: timed out after 230 s (see $OUT/gpu_checkpoint.log)"
exit $rc
