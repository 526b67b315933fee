#!/usr/bin/env bash
# CUDA graphs on one CUDA GPU: are graphed runs the eager runs' bits, and what do they cost
# against BF16 at the paper's shapes. From the repo root (after `source gpu/setup.sh` on a node
# without network), writing under OUT (default runs/gpu/perf-graphs):
#   PARTS=checks bash gpu/perf_graphs.sh   the GPU tests of graph-safe stochastic rounding, then
#       tests/gpu/test_cuda_graph_gpu.py: small (dense) and moe_small UFP4 runs with
#       train.deterministic=true, checkpointing on, local and full_iteration graphs and a
#       graphed run killed and resumed, each loss curve against its eager run's, bit for bit;
#       all runs at once on the one GPU. About 4 minutes on an H200.
#   bash gpu/perf_graphs.sh                (PARTS=step) the step table: dense_1p5b (seq 4096,
#       8 micro-batches per step), bf16 and ufp4, with local CUDA graphs and eager, every 4-bit
#       row against the BF16 row of its variant, with the memory floor (QDQ bytes / copy
#       bandwidth) beside it. About 7 minutes on an H200 (a row: ~90 s, its 19-GiB
#       checkpoint included; 110-130 s where the Triton cache is cold).
#       GRAPH_VARIANTS="local full_iteration" adds full-iteration graphs where the PyTorch
#       has what they need (docs/training.md). local is as a run gets it
#       (train.weight_cache=auto: the weights' operands kept where they fit);
#       GRAPH_VARIANTS="local_nocache local_kept" sets that apart: local graphs with
#       train.weight_cache=none against =all (operands kept in fixed storage).
#   PARTS=moe bash gpu/perf_graphs.sh      the same for moe_7p9b (4 of 20 layers) with
#       drop-and-pad experts (capacity factor 1, as graphs need). About 8 minutes.
#   PARTS=profile bash gpu/perf_graphs.sh  where a graphed step's GPU time goes: one step of
#       each recipe of GRAPH_RECIPES (default bf16,ufp4) for each model of GRAPH_MODELS
#       (default moe_7p9b) and each variant of GRAPH_VARIANTS (default local_nocache) under
#       torch.profiler (python -m ufp4_megatron.bench --suite profile, 8 micro-batches), in
#       $OUT/profile-MODEL-VARIANT-RECIPE.txt. About 2 minutes a profile on an H100.
# Knobs: GRAPH_MODELS, GRAPH_RECIPES (comma lists), GRAPH_VARIANTS (space-separated among
# eager, local, local_kept, local_nocache, full_iteration), GRAPH_BUDGET (seconds for the
# step table, default 540; rows past it are marked "not run (time budget)": give about
# 130 s a row, e.g. 660 for four recipes),
# PROFILE_TIMEOUT (seconds a profile may take, default 300),
# RUNS_DIR (run dirs; default /dev/shm/ufp4-graph-runs where /dev/shm has 64 GiB free, else
# $OUT/runs: the checkpoints are 19-26 GiB).
# Exit status: the checks' (0 iff every case passes); the step parts': the step suite's;
# the profiles': the last failed profile's.
set -uo pipefail
PARTS=${PARTS:-step}
for part in ${PARTS//,/ }; do
  case $part in checks|step|moe|profile) ;; *)
    echo "gpu/perf_graphs.sh: PARTS=$PARTS; give checks, step, moe or profile (comma-separated)" >&2; exit 2 ;;
  esac
done
variant() {  # the step suite's --variant of a GRAPH_VARIANTS entry
  case $1 in
    eager) echo eager ;;
    local|full_iteration) echo "$1:train.cuda_graph=$1" ;;
    local_kept) echo "local_kept:train.cuda_graph=local train.weight_cache=all" ;;
    local_nocache) echo "local_nocache:train.cuda_graph=local train.weight_cache=none" ;;
    *) return 1 ;;
  esac
}
variants=()
for v in ${GRAPH_VARIANTS:-}; do
  a=$(variant "$v") || {
    echo "gpu/perf_graphs.sh: GRAPH_VARIANTS entry '$v'; give eager, local, local_kept, local_nocache or full_iteration" >&2; exit 2; }
  variants+=(--variant "$a")
done
source gpu/setup.sh || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
OUT=${OUT:-runs/gpu/perf-graphs}; mkdir -p "$OUT"
if [[ -z ${RUNS_DIR:-} ]]; then
  free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  if (( ${free_kb:-0} >= 64 * 1024 * 1024 )); then RUNS_DIR=/dev/shm/ufp4-graph-runs
  else RUNS_DIR=$OUT/runs; fi
fi
export RUNS_DIR
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,memory.total --format=csv \
  > "$OUT/gpu.txt" 2>&1
rc=0
t0=$(date +%s)

step_table() {  # $1: name of the part, then the default models and variants
  local part=$1 models=$2 defaults=$3 v
  local vs=("${variants[@]}")
  if (( ${#vs[@]} == 0 )); then
    for v in $defaults; do vs+=(--variant "$(variant "$v")"); done
  fi
  local extra=()
  [[ $part == moe ]] && extra=(--set model.moe_capacity_factor=1.0 --set model.moe_pad_to_capacity=true)
  timeout $(( ${GRAPH_BUDGET:-540} + 40 )) python3 -m ufp4_megatron.bench --suite step \
    --models "${GRAPH_MODELS:-$models}" --recipes "${GRAPH_RECIPES:-bf16,ufp4}" \
    --micro-batches 8 "${vs[@]}" "${extra[@]}" --deadline "${GRAPH_BUDGET:-540}" \
    --json "$OUT/$part.json" --out "$OUT/$part.md" >> "$OUT/$part.log" 2>&1
  local r=$?
  echo "$part: step suite rc=$r ($(( $(date +%s) - t0 )) s elapsed)"
  cat "$OUT/$part.md" 2>/dev/null || tail -30 "$OUT/$part.log"
  (( r != 0 )) && rc=$r
}

profiles() {  # one profiled step per model, variant and recipe
  local m v kv recipe file r sets models recipes
  models=${GRAPH_MODELS:-moe_7p9b} recipes=${GRAPH_RECIPES:-bf16,ufp4}
  for m in ${models//,/ }; do
    for v in ${GRAPH_VARIANTS:-local_nocache}; do
      sets=()
      for kv in $(variant "$v" | cut -s -d: -f2); do sets+=(--set "$kv"); done
      [[ $m == moe_* ]] && sets+=(--set model.moe_capacity_factor=1.0 --set model.moe_pad_to_capacity=true)
      for recipe in ${recipes//,/ }; do
        file="$OUT/profile-$m-$v-$recipe.txt"
        timeout "${PROFILE_TIMEOUT:-300}" python3 -m ufp4_megatron.bench --suite profile \
          --model "$m" --recipe "$recipe" --micro-batches 8 "${sets[@]}" > "$file" 2>&1
        r=$?
        echo "profile $m $v $recipe: rc=$r ($(( $(date +%s) - t0 )) s elapsed)"
        grep -m1 "^profile " "$file"
        (( r != 0 )) && rc=$r
      done
    done
  done
}

for part in ${PARTS//,/ }; do
  case $part in
    checks)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/megatron/test_sr_capture_gpu.py \
        tests/kernels/test_device_keys_and_prepared.py > "$OUT/tests.log" 2>&1 || rc=1
      tail -3 "$OUT/tests.log"
      rm -rf /tmp/gpu_graphs
      timeout 420 python3 tests/gpu/test_cuda_graph_gpu.py --out "$OUT" --work /tmp/gpu_graphs \
        2> "$OUT/graphs.err" || rc=1
      ;;
    step) step_table step dense_1p5b "local eager" ;;
    moe) step_table moe moe_7p9b "local eager" ;;
    profile) profiles ;;
  esac
done
echo "total $(( $(date +%s) - t0 )) s"
exit $rc
