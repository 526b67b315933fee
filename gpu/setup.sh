#!/usr/bin/env bash
# Source on a CUDA machine or cluster node without network, from the repo root: installs the
# wheels of `make wheelhouse PY=3.12` (built where there is network, copied beside the
# checkout) that its CUDA image lacks into /tmp/site, and puts the checkout on PYTHONPATH; the
# image's torch/triton/numpy stay. Every gpu/*.sh that runs the package sources it first.
#   source gpu/setup.sh            WHEELHOUSE=dir (default wheelhouse) to read another folder
# A Triton cache saved on another node ($WHEELHOUSE/triton-cache.tgz) is unpacked into
# TRITON_CACHE_DIR (UFP4_TRITON_CACHE, default /tmp/triton-cache) once per node.
# Sourcing it again on the same node (several scripts in a row) skips the install when
# /tmp/site already holds this wheelhouse (a checksum of the wheels' names and bytes). Seconds.
# A node whose Python imports megatron-core, Hydra and W&B already (a user's cluster image)
# needs no wheelhouse: without one it uses what is installed.
set -u
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
SITE=${UFP4_SITE:-/tmp/site}
keep=(megatron_core hydra_core omegaconf antlr4 wandb pydantic pydantic_core annotated_types
      typing_inspection platformdirs opentelemetry googleapis_common_protos submitit
      hydra_submitit_launcher cwevals distro wandb_workspaces psutil)
wheels=()
for w in "$WHEELHOUSE"/*.whl; do
  for k in "${keep[@]}"; do [[ $(basename "$w") == ${k}* ]] && wheels+=("$w"); done
done
if [[ ${#wheels[@]} -eq 0 ]]; then
  if python3 -c 'import megatron.core, hydra, wandb' 2>/dev/null; then
    echo "gpu/setup.sh: no wheels in $WHEELHOUSE/; using the installed megatron-core, Hydra and W&B"
  else
    echo "gpu/setup.sh: no wheels in $WHEELHOUSE/ and megatron-core, Hydra or W&B do not import; build the wheels with make wheelhouse PY=3.12" >&2
    return 1 2>/dev/null || exit 1
  fi
else
  stamp=$(printf '%s\n' "${wheels[@]##*/}" | cksum)-$(cat "${wheels[@]}" | cksum)  # names, bytes
  if [[ -f $SITE/.ufp4-wheelhouse && $(cat "$SITE/.ufp4-wheelhouse") == "$stamp" ]]; then
    echo "gpu/setup.sh: $SITE holds this wheelhouse already"
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "${wheels[@]}" || return 1 2>/dev/null || exit 1
    echo "$stamp" > "$SITE/.ufp4-wheelhouse"
  fi
fi
TRITON_CACHE=${UFP4_TRITON_CACHE:-/tmp/triton-cache}
# Kernels compiled on another node, brought along as $WHEELHOUSE/triton-cache.tgz (made there
# with `tar -czf wheelhouse/triton-cache.tgz -C /tmp/triton-cache .`): unpacked once per node, before anything compiles, through a temp
# dir so that a damaged archive leaves no half-written entry. Triton checks each entry's key
# (source, options, target) itself: an entry of another build is only unused.
if [[ -f $WHEELHOUSE/triton-cache.tgz && ! -e $TRITON_CACHE ]]; then
  unpack=$(mktemp -d "${TRITON_CACHE%/*}/.triton-cache.XXXXXX")
  if tar -xzf "$WHEELHOUSE/triton-cache.tgz" -C "$unpack" --no-same-owner 2>/dev/null \
      && mv "$unpack" "$TRITON_CACHE"; then
    echo "gpu/setup.sh: Triton cache from $WHEELHOUSE/triton-cache.tgz ($(ls "$TRITON_CACHE" | wc -l) entries)"
  else
    rm -rf "$unpack"
    echo "gpu/setup.sh: $WHEELHOUSE/triton-cache.tgz does not unpack; the kernels compile afresh" >&2
  fi
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$TRITON_CACHE
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import megatron.core, hydra, wandb, torch; print("gpu_setup ok:", megatron.core.__version__, torch.__version__, torch.cuda.device_count(), "GPUs")'
