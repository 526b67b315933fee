#!/usr/bin/env bash
# On one CUDA GPU (about 9 minutes on an H200): the GPU checks of record that are not timings.
#   1. gpu/checkpoint.sh (SIGKILL / SIGTERM resume, bitwise) alongside the `gpu`-marked
#      kernel and grouped-expert tests (real Triton kernels vs the references, bitwise);
#   2. gpu/megatron_lm.sh (the real pretrain_gpt.py, every route, --save/--load).
# Each part writes under its own folder; everything ends in OUT (default runs/gpu/validate) as
# $OUT/validate.tar.gz plus $OUT/summary.md (printed last). Run from the repo root, with
# wheelhouse/ beside it (it holds the Megatron-LM archive, see gpu/megatron_lm.sh):
#   bash gpu/validate.sh
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-runs/gpu/validate}; mkdir -p "$OUT"
W=/tmp/validate; rm -rf "$W"; mkdir -p "$W"/{checkpoint,kernels,megatron_lm}
# shellcheck source=gpu/setup.sh
source gpu/setup.sh || exit 1
elapsed() { echo $(( $(date +%s) - T0 )); }

OUT=$W/checkpoint bash gpu/checkpoint.sh > "$W/checkpoint/stdout.txt" 2>&1 &
ckpt=$!
TRITON_CACHE_DIR=/tmp/triton-cache-tests timeout 300 python3 -m pytest -q -m gpu \
  -p no:cacheprovider -n 4 tests/kernels tests/numerics tests/test_grouped_ops.py \
  tests/megatron/test_attention_gpu.py > "$W/kernels/tests.log" 2>&1
echo "kernel/grouped GPU tests rc=$? ($(elapsed) s)"
wait $ckpt; echo "checkpoint rc=$? ($(elapsed) s)"

left=$(( 560 - $(elapsed) ))
OUT=$W/megatron_lm timeout "$left" bash gpu/megatron_lm.sh > "$W/megatron_lm/stdout.txt" 2>&1
echo "megatron-lm rc=$? ($(elapsed) s)"

{
  echo "# GPU validation ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader))"
  echo; echo "## kernel and grouped-expert GPU tests"; tail -3 "$W/kernels/tests.log"
  echo; echo "## checkpoints"; tail -12 "$W/checkpoint/stdout.txt"
  echo; echo "## Megatron-LM"; tail -25 "$W/megatron_lm/stdout.txt"
  echo; echo "total $(elapsed) s"
} > "$OUT/summary.md"
tar czf "$OUT/validate.tar.gz" -C "$W" .
cat "$OUT/summary.md"
