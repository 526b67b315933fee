#!/usr/bin/env bash
# On one CUDA GPU, at most about 8 minutes (every part has its timeout; the parts run side by
# side on an H200): every GPU correctness check (the timings are gpu/speed.sh's).
#   1. gpu/kernels_exact.sh: all of tests/kernels on CUDA, compiled Triton kernels vs the
#      PyTorch references, bitwise (RTNE) or in distribution (SR);
#   2. the `gpu`-marked attention test outside tests/kernels (SDPA vs Megatron's attention; the
#      grouped-expert GPU tests are in tests/kernels, part 1);
#   3. gpu/checkpoint.sh: SIGKILL / SIGTERM resume bitwise, three optimizer forms;
#   4. gpu/megatron_lm.sh: the real pretrain_gpt.py, every route, --save/--load;
#   5. gpu/runtime.sh's decision checks (decide() here, train.device=cpu refused).
# Each part writes to its own folder under OUT (default runs/gpu/validate), and the table of
# all parts to $OUT/summary.md (printed last). Run from the repo root, with wheelhouse/ beside
# it (it holds the Megatron-LM archive, see gpu/megatron_lm.sh):
#   bash gpu/validate.sh
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-runs/gpu/validate}; mkdir -p "$OUT"
W=$OUT; mkdir -p "$W"/{kernels_exact,tests,checkpoint,megatron_lm,runtime}
# shellcheck source=gpu/setup.sh
source gpu/setup.sh > "$W/setup.txt" 2>&1 || { cat "$W/setup.txt"; exit 1; }
elapsed() { echo $(( $(date +%s) - T0 )); }

KERNELS_TIMEOUT=${KERNELS_TIMEOUT:-420} OUT=$W/kernels_exact bash gpu/kernels_exact.sh > "$W/kernels_exact/stdout.txt" 2>&1 &
kx=$!
OUT=$W/checkpoint bash gpu/checkpoint.sh > "$W/checkpoint/stdout.txt" 2>&1 &
ckpt=$!
OUT=$W/megatron_lm timeout 480 bash gpu/megatron_lm.sh > "$W/megatron_lm/stdout.txt" 2>&1 &
mlm=$!
TRITON_CACHE_DIR=/tmp/triton-cache-tests timeout 300 python3 -m pytest -q -m gpu \
  -p no:cacheprovider tests/megatron/test_attention_gpu.py > "$W/tests/tests.log" 2>&1
tests_rc=$?
RUNTIME_PARTS=decide,device OUT=$W/runtime bash gpu/runtime.sh > "$W/runtime/stdout.txt" 2>&1
rt_rc=$?
wait $kx; kx_rc=$?
wait $ckpt; ckpt_rc=$?
wait $mlm; mlm_rc=$?

{
  echo "# GPU validation ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo; echo "| part | rc |"; echo "| --- | --- |"
  echo "| kernels_exact.sh (tests/kernels on CUDA) | $kx_rc |"
  echo "| gpu-marked attention test | $tests_rc |"
  echo "| checkpoint.sh | $ckpt_rc |"
  echo "| megatron_lm.sh | $mlm_rc |"
  echo "| runtime.sh decide,device | $rt_rc |"
  echo; echo "## tests/kernels on CUDA"; tail -12 "$W/kernels_exact/stdout.txt"
  echo; echo "## gpu-marked attention test"; tail -3 "$W/tests/tests.log"
  echo; echo "## checkpoints"; tail -12 "$W/checkpoint/stdout.txt"
  echo; echo "## runtime"; tail -8 "$W/runtime/stdout.txt"
  echo; echo "## Megatron-LM"; tail -25 "$W/megatron_lm/stdout.txt"
  echo; echo "total $(elapsed) s"
} > "$OUT/summary.md"
cat "$OUT/summary.md"
(( kx_rc == 0 && tests_rc == 0 && ckpt_rc == 0 && mlm_rc == 0 && rt_rc == 0 ))
