#!/usr/bin/env bash
# UFP4 inside TransformerEngine models (ufp4_megatron.te) on one CUDA GPU, four parts, each run
# even when an earlier one failed, a status table printed last:
#   parity       gpu/te_parity.py: TE Linear, LayerNormLinear and GroupedLinear with the
#                factories against the local route's autograd function on the same weights
#                and inputs (forward, dX, main_grad over micro-batches; ufp4, e2m1 and the
#                other presets), the CUDA generator as SR stream, the refusals TE can show
#   megatron_lm  gpu/te_megatron_lm.py: stock Megatron-LM pretrain_gpt.py with
#                --fp4-recipe custom --fp4-quantizer-factory ufp4_megatron.te.<recipe>, 30
#                iterations, 16 of 17 linears quantized, losses against the --spec route and
#                BF16, --save/--load resume, dense and MoE (te_experts.te_gpt_spec; needs the
#                Megatron-LM archive of gpu/megatron_lm.sh);
#                the --spec comparison at TE_SEEDS too (default 1235,1236: three seeds in all)
#   steps        gpu/te_steps.py: the trainer's step time, TE+UFP4 vs TE BF16 vs the local
#                route, dense_1p5b and moe_7p9b at 2 layers (TE_STEPS_MODELS=moe_7p9b: one)
#   profile      gpu/te_profile.py: where the step's GPU time goes on each of those routes
#                (torch.profiler, kernel families), dense_1p5b at 2 layers
#                (TE_PROFILE_MODEL=moe_7p9b: that one)
#   moe          tests/gpu/test_checkpoint_gpu.py on moe_small through TE (grouped experts,
#                UFP4, train.deterministic=true): runs killed after a checkpoint, or stopped
#                by SIGTERM, and resumed, each loss curve against the unbroken run's, bitwise
# Needs TransformerEngine from gpu/te_setup.sh (in TE_SITE, default /tmp/te-site), and for
# megatron_lm and steps the wheelhouse of gpu/setup.sh (parity runs without it, so it can follow
# gpu/te_setup.sh in the same run). Writes to OUT (default runs/gpu/te_check): te_check.md (the
# status table), te_check.log, te_parity.json, te_megatron_lm.{md,json,log}, te_steps.json and
# gpu_checkpoint.json and te_profile.md (the runs' own files stay in /tmp).
# PARTS=parity,megatron_lm,steps,moe,profile (default: all but profile) picks parts. Each part
# stops at its limit (parity 110 s, megatron_lm 400 s, steps 560 s, moe 300 s, profile 300 s);
# together they take more than 10 minutes, so PARTS=parity,megatron_lm, PARTS=steps and
# PARTS=moe,profile are three runs.
set -uo pipefail
OUT=${OUT:-runs/gpu/te_check}; mkdir -p "$OUT"
PARTS=${PARTS:-parity,megatron_lm,steps,moe}
for p in ${PARTS//,/ }; do
  case $p in parity|megatron_lm|steps|moe|profile) ;; *)
    echo "te_check: PARTS entry '$p'; give parity, megatron_lm, steps, moe and/or profile" >&2
    exit 2;; esac
done
# the models gpu/te_steps.py and gpu/te_profile.py know, checked before anything is set up
STEPS_MODELS=${TE_STEPS_MODELS:-dense_1p5b,moe_7p9b} PROFILE_MODEL=${TE_PROFILE_MODEL:-dense_1p5b}
set -f  # a '*' in either is a wrong name, not a glob
for m in ${STEPS_MODELS//,/ } "$PROFILE_MODEL"; do
  case $m in dense_1p5b|moe_7p9b) ;; *)
    echo "te_check: model '$m' in TE_STEPS_MODELS or TE_PROFILE_MODEL; give dense_1p5b or moe_7p9b" >&2
    exit 2;; esac
done
set +f
TE_SITE=${TE_SITE:-/tmp/te-site}
exec > >(tee "$OUT/te_check.log") 2>&1
if [[ ,$PARTS, == *,megatron_lm,* || ,$PARTS, == *,steps,* || ,$PARTS, == *,moe,* ||
      ,$PARTS, == *,profile,* ]]; then
  source gpu/setup.sh || { echo "te_check: gpu/setup.sh failed"; exit 1; }
else  # parity needs only torch, Triton, TE and the checkout: no wheelhouse
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
fi
export PYTHONPATH=$TE_SITE:$PYTHONPATH OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
declare -A status took
run_part() {  # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  if [[ ,$PARTS, != *,$name,* ]]; then status[$name]="skipped (PARTS)"; return; fi
  local t=$SECONDS
  echo "===== te_check: $name (limit ${limit}s)"
  timeout "$limit" "$@"
  local rc=$?
  took[$name]=$((SECONDS - t))
  case $rc in 0) status[$name]=PASS ;; 124) status[$name]="TIMEOUT after ${limit}s" ;;
              *) status[$name]="FAIL (rc=$rc)" ;; esac
}
if ! python3 -c 'import ufp4_megatron.te.installed as i; print("te_check: TransformerEngine", i.check_installed())'; then
  echo "te_check: TransformerEngine does not load from $TE_SITE: run gpu/te_setup.sh first"
  for p in parity megatron_lm steps moe profile; do status[$p]="not run (no TransformerEngine)"; done
else
  run_part parity 110 python3 gpu/te_parity.py --out "$OUT"
  TARBALL=${MEGATRON_LM_TARBALL:-wheelhouse/megatron-lm-f8837c04ef.tar.gz}
  if [[ -f $TARBALL ]]; then
    run_part megatron_lm 400 python3 gpu/te_megatron_lm.py --tarball "$TARBALL" --out "$OUT" \
      --jobs 7 --timeout 240 --seeds "${TE_SEEDS:-1235,1236}"
  else
    status[megatron_lm]="not run (no $TARBALL: see gpu/megatron_lm.sh)"
  fi
  # a row takes 70-95 s on an H200 (start-up, 10 steps, the save after the last)
  run_part steps 560 python3 gpu/te_steps.py --out "$OUT" --deadline 550 --timeout 180 \
    --models "$STEPS_MODELS"
  rm -rf /tmp/te_moe_checkpoint
  run_part moe 300 python3 tests/gpu/test_checkpoint_gpu.py --out "$OUT" \
    --work /tmp/te_moe_checkpoint --set model=moe_small \
    --set model.transformer_impl=transformer_engine --set train.deterministic=true
  run_part profile 300 python3 gpu/te_profile.py --out "$OUT" --timeout 95 \
    --model "$PROFILE_MODEL"
fi
{
  echo "| part | result | seconds | details |"
  echo "| --- | --- | --- | --- |"
  for p in parity megatron_lm steps moe profile; do
    case $p in parity) f=te_parity.json ;; megatron_lm) f=te_megatron_lm.md ;;
               steps) f=te_steps.json ;; moe) f=gpu_checkpoint.json ;; profile) f=te_profile.md ;; esac
    echo "| $p | ${status[$p]:-not run} | ${took[$p]:--} | $OUT/$f |"
  done
} > "$OUT/te_check.md"
[[ -f $OUT/te_megatron_lm.md ]] && { echo; grep -E "^\| (check|te-|spec-)" "$OUT/te_megatron_lm.md"; }
echo
cat "$OUT/te_check.md"
