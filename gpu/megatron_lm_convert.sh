#!/usr/bin/env bash
# Checkpoint conversion (python -m ufp4_megatron.cli.convert_checkpoint) with the real,
# unmodified Megatron-LM pretrain_gpt.py (core_r0.19.0, commit f8837c04ef) on one CUDA GPU:
# a pretrain_gpt.py run saved at iteration 20, converted to the trainer's layout and back,
# resumed by pretrain_gpt.py to 30 and compared with the unbroken run; the trainer continuing
# the converted checkpoint from 20 to 30; its step 30 converted and continued by
# pretrain_gpt.py to 40 (gpu/megatron_lm_convert.py says what is checked). Writes, to OUT
# (default runs/gpu/megatron_lm_convert), megatron_lm_convert.md (checks), results.json and
# runs.log. About 2-3 minutes on an H200 (5 pretrain_gpt.py processes and one trainer run of
# the documented 4-layer model, 10-30 iterations each, three conversions of ~10 s).
# Prepare as the header of gpu/megatron_lm.sh says (wheelhouse/ and the Megatron-LM tarball).
# Run, from the repo root: bash gpu/megatron_lm_convert.sh
set -uo pipefail
OUT=${OUT:-runs/gpu/megatron_lm_convert}; mkdir -p "$OUT"
TARBALL=${MEGATRON_LM_TARBALL:-wheelhouse/megatron-lm-f8837c04ef.tar.gz}
if [ ! -f "$TARBALL" ]; then
  echo "missing $TARBALL: prepare it as the header of gpu/megatron_lm.sh says"; exit 2
fi
source gpu/setup.sh || exit 1
export OMP_NUM_THREADS=8
if ! command -v torchrun >/dev/null; then
  torchrun() { python3 -m torch.distributed.run "$@"; }
  export -f torchrun
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 570 python3 gpu/megatron_lm_convert.py --tarball "$TARBALL" --out "$OUT" "$@"
