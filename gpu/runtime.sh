#!/usr/bin/env bash
# The runtime decision (train/runtime.py) on any CUDA machine: about 6 minutes on an H200, at
# most 10 (every part has its timeout):
#   1. decide() of the default config here: cuda, bfloat16, nccl, dp_reshardable, a fused
#      Adam; a GPU runtime's scope() leaves torch.cuda untouched (cpu_compat: no-op with CUDA);
#   2. the trainer refuses train.device=cpu beside a visible GPU: exit 2, one line;
#   3. gpu/checkpoint.sh: SIGKILL/SIGTERM resume bitwise with the three optimizer forms
#      (the CUDA RNG in the checkpoint, the stop flag reduced on the GPU over nccl);
#   4. the GPU branch of seed_model_parallel (tests/megatron/test_attention_gpu.py);
#   5. bench --suite profile of one small ufp4 step (profile.py takes its device from decide).
# Usage, from the repo root (wheelhouse/ beside it on a node without network):
#   bash gpu/runtime.sh
#   RUNTIME_PARTS=decide,device bash gpu/runtime.sh   runs only those parts (of decide, device,
#   checkpoint, attention, profile; gpu/validate.sh runs the others itself)
# Writes $OUT/runtime.md (the table, printed last) and $OUT/logs/ (one log per part).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-runs/gpu/runtime}; mkdir -p "$OUT/logs"
# shellcheck source=gpu/setup.sh
source gpu/setup.sh || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
rows=()
row() { rows+=("| $1 | $2 | $3 |"); }
PARTS=",${RUNTIME_PARTS:-decide,device,checkpoint,attention,profile},"
part() { [[ $PARTS == *",$1,"* ]]; }

if part decide; then
timeout 60 python3 - > "$OUT/logs/decide.log" 2>&1 <<'EOF'
import torch
from ufp4_megatron.train.footprint import load_config
from ufp4_megatron.train.runtime import decide
names = ("current_device", "Stream", "Event", "current_stream", "stream", "synchronize")
before = {n: getattr(torch.cuda, n) for n in names}
rt = decide(load_config(["model=tiny"]))
print(rt)
with rt.scope():
    same = all(getattr(torch.cuda, n) is before[n] for n in names)
ok = (rt.device.type, rt.dtype, rt.backend, rt.optim_sharding) == (
    "cuda", torch.bfloat16, "nccl", "dp_reshardable") and same and rt.saves_cuda_rng and (
    rt.adam.endswith("_fused"))
print("DECIDE", "PASS" if ok else "FAIL")
EOF
row "decide() here" "$(grep -o 'DECIDE .*' "$OUT/logs/decide.log" || echo 'FAIL (no result)')" \
    "$(grep -o 'Runtime(.*' "$OUT/logs/decide.log" | head -c 160)"
fi

if part device; then
timeout 60 python3 -m ufp4_megatron.train model=tiny train.device=cpu train.steps=1 \
  logging.wandb.mode=disabled hydra.run.dir=/tmp/rt-cpu > "$OUT/logs/device_cpu.log" 2>&1
rc=$?
line=$(grep '^error: train.device=cpu but a CUDA device is visible' "$OUT/logs/device_cpu.log")
if [ $rc -eq 2 ] && [ -n "$line" ] && ! grep -q Traceback "$OUT/logs/device_cpu.log"; then
  r=PASS; else r="FAIL (rc=$rc)"; fi
row "train.device=cpu refused" "$r" "${line:0:120}"
fi

if part checkpoint; then
OUT=/tmp/rt-checkpoint timeout 260 bash gpu/checkpoint.sh > "$OUT/logs/checkpoint.log" 2>&1
rc=$?; n=$(grep -c 'PASS' "$OUT/logs/checkpoint.log")
row "checkpoint resume (gpu_checkpoint.sh)" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc)")" \
    "$n PASS lines (expect 4 rows)"
fi

if part attention; then
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/megatron/test_attention_gpu.py \
  > "$OUT/logs/attention_gpu.log" 2>&1
rc=$?
row "seed_model_parallel on GPU" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc)")" \
    "$(tail -1 "$OUT/logs/attention_gpu.log")"
fi

if part profile; then
timeout 120 python3 -m ufp4_megatron.bench --suite profile --model small --recipe ufp4 \
  > "$OUT/logs/profile.log" 2>&1
rc=$?
row "bench --suite profile small ufp4" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc)")" \
    "$(grep -m1 -o 'step wall [0-9.]* ms' "$OUT/logs/profile.log")"
fi

{
  echo "# Runtime checks ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  echo; echo "| check | result | detail |"; echo "| --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
  echo; echo "total $(( $(date +%s) - T0 )) s"
} > "$OUT/runtime.md"
cat "$OUT/runtime.md"
! grep -q FAIL "$OUT/runtime.md"
