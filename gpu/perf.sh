#!/usr/bin/env bash
# On one CUDA GPU, about 8 minutes on an H200: GPU tests of the grouped experts and the fused
# attention, the step table (bf16 / ufp4 / e2m1 / ufp4_int4 / nvfp4 at small, dense_1p5b,
# moe_7p9b x4 layers, moe_124b x1 layer), and profiles of one ufp4 moe_7p9b and one ufp4
# dense_1p5b step, within PERF_BUDGET seconds (default 470). Writes under OUT (default
# runs/gpu/perf) and prints the step table last. From the repo root:
#   bash gpu/perf.sh
#   PERF_BUDGET=480 PERF_MODELS=small,moe_7p9b PERF_RECIPES=bf16,ufp4 bash gpu/perf.sh
#   PERF_PROFILES=none (or model:recipe,...) chooses the profiles, PERF_MODELS=none skips the
#   step table (profiles only); PERF_REPEATS=2 runs every
#   row twice, one pass after the other (the table then shows each run: the spread)
#   PERF_MICRO_BATCHES=8: 8 micro-batches per optimizer step (gradient accumulation, as a
#   user's global batch of many sequences has; default 1: the optimizer after every one)
#   PERF_SET="model.cross_entropy_fusion=true ...": trainer overrides for every run (step rows
#   and profiles alike), space-separated
# A failing or out-of-memory run costs its own row only; rows the budget leaves out are listed
# as "not run (time budget)"; rerun with PERF_MODELS / PERF_RECIPES for them.
set -uo pipefail
sets=()  # PERF_SET, checked before anything is installed
read -ra kvs <<< "${PERF_SET:-}"
for kv in "${kvs[@]}"; do
  [[ $kv == *=* ]] || { echo "gpu/perf.sh: PERF_SET entry '$kv'; give KEY=VALUE overrides separated by spaces" >&2; exit 2; }
  sets+=(--set "$kv")
done
# the trainer's dependencies (hydra, megatron-core, wandb), from the wheelhouse where the
# node's image lacks them
source gpu/setup.sh || exit 1
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
OUT=${OUT:-runs/gpu/perf}; mkdir -p "$OUT"
budget=${PERF_BUDGET:-470}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,memory.total --format=csv \
  > "$OUT/gpu.txt" 2>&1
df -h /tmp >> "$OUT/gpu.txt" 2>&1

# 1. exactness on the GPU (~1-2 min with kernel compiles): grouped QDQ launches vs the
#    per-expert twin bitwise, torch._grouped_mm vs cuBLAS, SDPA kernels vs Megatron attention
#    (PERF_TESTS=0 skips them, e.g. after gpu/validate.sh ran them)
if [[ ${PERF_TESTS:-1} != 0 ]]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -s \
    tests/kernels/test_grouped_ops_triton.py tests/megatron/test_attention_gpu.py \
    > "$OUT/tests.log" 2>&1
  grep -A8 "attention fwd+bwd" "$OUT/tests.log"; tail -3 "$OUT/tests.log"
fi

# 2. the step table (leaves ~80 s for the profiles); PERF_MODELS=none skips it (profiles only)
reserve=80; [[ ${PERF_PROFILES:-} == none ]] && reserve=0
if [[ ${PERF_MODELS:-} != none ]]; then
  step_budget=$(( $(left) - reserve ))
  timeout $(( step_budget + 30 )) python3 -m ufp4_megatron.bench --suite step \
    --models "${PERF_MODELS:-small,dense_1p5b,moe_7p9b,moe_124b}" \
    --recipes "${PERF_RECIPES:-bf16,ufp4,e2m1,ufp4_int4,nvfp4}" \
    --repeats "${PERF_REPEATS:-1}" --micro-batches "${PERF_MICRO_BATCHES:-1}" "${sets[@]}" \
    --deadline "$step_budget" --json "$OUT/step.json" --out "$OUT/step.md" \
    >> "$OUT/step.log" 2>&1
  echo "step suite rc=$? ($(( $(date +%s) - t0 )) s elapsed)"
fi

# 3. where a step's time goes (one process per profile; each ~30-40 s); PERF_PROFILES=none
#    skips them (the step budget then takes their 80 s)
profiles=${PERF_PROFILES:-moe_7p9b:ufp4,dense_1p5b:ufp4}
for mr in ${profiles//,/ }; do
  [[ $mr == none ]] && continue
  rem=$(left)
  if (( rem < 25 )); then echo "profile $mr: skipped (time budget)" >> "$OUT/profile.md"; continue; fi
  out=$(timeout "$rem" python3 -m ufp4_megatron.bench --suite profile --model "${mr%%:*}" \
    --micro-batches "${PERF_MICRO_BATCHES:-1}" "${sets[@]}" \
    --recipe "${mr##*:}" 2>&1); rc=$?
  fence='```'
  if (( rc == 0 )); then sed -n '/^### Profile/,$p' <<< "$out" >> "$OUT/profile.md"
  else printf '### Profile %s: failed (rc=%s)\n%s\n%s\n%s\n' "$mr" "$rc" "$fence" \
         "$(tail -20 <<< "$out")" "$fence" >> "$OUT/profile.md"; fi
done
[[ -f $OUT/profile.md ]] && head -c 20000 "$OUT/profile.md"

echo "total $(( $(date +%s) - t0 )) s"
if [[ ${PERF_MODELS:-} != none ]]; then cat "$OUT/step.md" 2>/dev/null || tail -30 "$OUT/step.log"; fi
