#!/usr/bin/env bash
# Source on a CUDA machine or cluster node without network, from the repo root: installs the
# wheels of `make wheelhouse PY=3.12` (built where there is network, copied beside the
# checkout) that its CUDA image lacks into /tmp/site, and puts the checkout on PYTHONPATH; the
# image's torch/triton/numpy stay. The gpu/*.sh scripts that need it source it themselves.
#   source gpu/setup.sh            WHEELHOUSE=dir (default wheelhouse) to read another folder
set -u
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
keep=(megatron_core hydra_core omegaconf antlr4 wandb pydantic pydantic_core annotated_types
      typing_inspection platformdirs opentelemetry googleapis_common_protos submitit
      hydra_submitit_launcher cwevals distro wandb_workspaces psutil)
wheels=()
for w in "$WHEELHOUSE"/*.whl; do
  for k in "${keep[@]}"; do [[ $(basename "$w") == ${k}* ]] && wheels+=("$w"); done
done
if [[ ${#wheels[@]} -eq 0 ]]; then
  echo "gpu/setup.sh: no wheels in $WHEELHOUSE/; build them with make wheelhouse PY=3.12" >&2
  return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "${wheels[@]}" || return 1 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import megatron.core, hydra, wandb, torch; print("gpu_setup ok:", megatron.core.__version__, torch.__version__, torch.cuda.device_count(), "GPUs")'
