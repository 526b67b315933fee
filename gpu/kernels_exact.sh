#!/usr/bin/env bash
# On one CUDA GPU (H200: about 3-5 minutes, mostly kernel compiles): every kernel
# exactness test of tests/kernels on CUDA, real Triton kernels vs the references, bitwise.
# tests/kernels holds `gpu`-marked tests (large shapes) and tests that run in Triton's CPU
# interpreter where there is no GPU; on CUDA the latter run the compiled kernels, including
# the fast division that the interpreter never takes (it always divides with div_rn), at the
# special values (subnormal and huge scales, NaN/Inf blocks) that exercise its guard.
# gpu/kernels.sh and gpu/validate.sh run only the `gpu`-marked ones.
#   bash gpu/kernels_exact.sh        (repo root; needs torch + triton + pytest-xdist)
# Writes $OUT/kernels_exact.log; prints pytest's summary and the exit status last.
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
OUT=${OUT:-runs/gpu/kernels_exact}; mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 560 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels \
  > "$OUT/kernels_exact.log" 2>&1
rc=$?
tail -15 "$OUT/kernels_exact.log"
echo "tests/kernels on CUDA (gpu-marked and interpreter tests): rc=$rc, $(( $(date +%s) - t0 )) s"
exit $rc
