#!/usr/bin/env bash
# Megatron-Core's torch-AdamW fallback (no TE/Apex) as it builds it (foreach) against the fused
# kernel the runtime now selects (optim.adam_kernel=auto; train/runtime.py), in one run of the
# step suite on one CUDA GPU: the same shapes, recipes and checkpoint-at-end as
# docs/performance.md's step table. A warm-up pass fills the Triton cache first (a cold UFP4
# row spends its first ~40 s compiling, which would land in whichever column ran first); then
# ADAM_ROUNDS rounds in ABBA order (foreach, fused, fused, foreach, ...), so drift over the
# run falls on both kernels alike.
#   bash gpu/adam_speed.sh     ADAM_MODELS=small ADAM_RECIPES=bf16,ufp4 ADAM_ROUNDS=2
#                              ADAM_COLUMN_S=150 (deadline of one column) ADAM_WARMUP_S=90
# A column of small bf16+ufp4 needs ~100-150 s on an H200 (trainer start, 12 steps, the
# checkpoint at the end): two rounds take ~11 minutes, ADAM_ROUNDS=1 about 6.
# Writes $OUT/adam_<kernel>_r<round>.{md,json} (default OUT=runs/gpu/adam_speed) and prints
# each kernel's step times per row over the rounds.
set -uo pipefail
# the trainer's dependencies (hydra, megatron-core, wandb), from the wheelhouse where the
# node's image lacks them
source gpu/setup.sh || exit 1
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
OUT=${OUT:-runs/gpu/adam_speed}; mkdir -p "$OUT"
models=${ADAM_MODELS:-small} recipes=${ADAM_RECIPES:-bf16,ufp4}
column=${ADAM_COLUMN_S:-150}
t0=$(date +%s)
suite() {  # suite NAME RECIPES DEADLINE [--set ...]: one step-suite run, tables in $OUT/NAME.*
  local name=$1 rows=$2 deadline=$3; shift 3
  timeout $(( deadline + 30 )) python3 -m ufp4_megatron.bench --suite step --models "$models" \
    --recipes "$rows" --deadline "$deadline" "$@" \
    --json "$OUT/$name.json" --out "$OUT/$name.md" >> "$OUT/adam_speed.log" 2>&1
  echo "$name: rc=$? ($(( $(date +%s) - t0 )) s elapsed)"
}
# the warm-up runs the quantized recipes only: BF16 compiles nothing, and with it first a
# warm-up deadline could leave UFP4 too little time to reach its first step
quantized=$(tr ',' '\n' <<< "$recipes" | grep -vx bf16 | paste -sd, -)
[[ -n $quantized ]] && suite warmup "$quantized" "${ADAM_WARMUP_S:-90}" --set optim.adam_kernel=foreach
for (( r = 1; r <= ${ADAM_ROUNDS:-2}; r++ )); do
  if (( r % 2 )); then order="foreach fused"; else order="fused foreach"; fi
  for kernel in $order; do suite "adam_${kernel}_r$r" "$recipes" "$column" --set "optim.adam_kernel=$kernel"; done
done
python3 - "$OUT" <<'PY'
import json, pathlib, statistics, sys
rows = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("adam_*_r*.json")):
    kernel = f.stem.split("_")[1]
    for row in json.loads(f.read_text())["step"]:
        ms = row.get("step_ms") if row.get("status") == "ok" else None
        rows.setdefault((row["model"], row["recipe"], kernel), []).append((ms, row.get("tflops_peak")))
print("| shape | recipe | adam | step ms per round | mean | BF16 GEMM TFLOP/s per round |")
print("| --- | --- | --- | --- | ---: | --- |")
for (model, recipe, kernel), got in sorted(rows.items()):
    ok = [ms for ms, _ in got if ms is not None]
    each = ", ".join(f"{ms:.1f}" if ms is not None else "cut" for ms, _ in got)
    mean = f"{statistics.mean(ok):.1f}" if ok else "-"
    peaks = ", ".join(f"{p:.0f}" for _, p in got if p)
    print(f"| {model} | {recipe} | {kernel} | {each} | {mean} | {peaks} |")
PY
