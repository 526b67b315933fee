#!/usr/bin/env bash
# The real, unmodified Megatron-LM pretrain_gpt.py (core_r0.19.0, commit f8837c04ef) on one
# CUDA GPU, for every route of docs/megatron-lm.md (stock BF16; --spec with
# UFP4_RECIPE=ufp4 and e2m1 on stock Megatron-LM; the flags with patches/ applied, e1m2 and
# e2m1; a --save at 20 then --load resume to 30), each command exactly as documented. Writes,
# to OUT (default runs/gpu/megatron_lm), $OUT/megatron_lm.md (table + checks),
# $OUT/results.json, $OUT/runs.log; prints the table last.
# About 3-5 minutes (7 pretrain_gpt.py processes, 30 iterations each, run one after another).
#
# Prepare, in the repository root (wheelhouse/ is ignored by git; copy it with the checkout to
# a node without network):
#   make wheelhouse PY=3.12
#   git -C /path/to/Megatron-LM archive --format=tar.gz \
#     -o "$PWD/wheelhouse/megatron-lm-f8837c04ef.tar.gz" f8837c04ef \
#     pretrain_gpt.py gpt_builders.py model_provider.py megatron          # about 2 MB
# Run, from the repo root: bash gpu/megatron_lm.sh   (MEGATRON_LM_TARBALL=... for another archive)
#   (extra arguments go to gpu/megatron_lm.py, e.g. --only bf16,spec-ufp4)
set -uo pipefail
OUT=${OUT:-runs/gpu/megatron_lm}; mkdir -p "$OUT"
TARBALL=${MEGATRON_LM_TARBALL:-wheelhouse/megatron-lm-f8837c04ef.tar.gz}
if [ ! -f "$TARBALL" ]; then
  echo "missing $TARBALL: prepare it as the header of gpu/megatron_lm.sh says"; exit 2
fi
source gpu/setup.sh || exit 1
export OMP_NUM_THREADS=8
if ! command -v torchrun >/dev/null; then  # the documented commands call torchrun
  torchrun() { python3 -m torch.distributed.run "$@"; }
  export -f torchrun
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 570 python3 gpu/megatron_lm.py --tarball "$TARBALL" --out "$OUT" "$@"
