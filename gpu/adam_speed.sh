#!/usr/bin/env bash
# Megatron-Core's torch-AdamW fallback (no TE/Apex) as it builds it (foreach) against the fused
# kernel the runtime now selects (optim.adam_kernel=auto; train/runtime.py), side by side in one
# run of the step suite on one CUDA GPU: the same shapes, recipes and checkpoint-at-end as
# docs/performance.md's step table. About 30-60 s per row. From the repo root:
#   bash gpu/adam_speed.sh                     ADAM_MODELS=small,dense_1p5b ADAM_RECIPES=bf16,ufp4
# Writes $OUT/adam_{fused,foreach}.{md,json} (default OUT=runs/gpu/adam_speed), prints both tables.
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
OUT=${OUT:-runs/gpu/adam_speed}; mkdir -p "$OUT"
budget=${ADAM_BUDGET:-300}
t0=$(date +%s)
left=$(( budget / 2 - 10 ))  # half the budget each, so both columns get the same rows
for kernel in fused foreach; do
  timeout $(( left + 30 )) python3 -m ufp4_megatron.bench --suite step \
    --models "${ADAM_MODELS:-small,dense_1p5b}" --recipes "${ADAM_RECIPES:-bf16,ufp4}" \
    --set "optim.adam_kernel=$kernel" --deadline "$left" \
    --json "$OUT/adam_$kernel.json" --out "$OUT/adam_$kernel.md" >> "$OUT/adam_speed.log" 2>&1
  echo "adam_kernel=$kernel: rc=$? ($(( $(date +%s) - t0 )) s elapsed)"
done
for kernel in fused foreach; do echo "## optim.adam_kernel=$kernel"; cat "$OUT/adam_$kernel.md"; done
