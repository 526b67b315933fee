#!/usr/bin/env bash
# Starts the ufp4 trainer under torchrun on this node. Single node by default; multi-node with
# c10d rendezvous when an endpoint is given. Every flag has an environment twin; flags win.
#
#   launch/torchrun.sh [--nnodes N|MIN:MAX] [--nproc-per-node G] [--rdzv-endpoint HOST:PORT]
#                      [--rdzv-id ID] [--max-restarts R] [--module M] [--] [overrides...]
#   launch/torchrun.sh --help
#
# (The file lives in the package, ufp4_megatron/scripts/torchrun.sh, so that installed wheels
# have it too; launch/torchrun.sh in a checkout is a link to it.)
#
#   NNODES (1)            NPROC_PER_NODE (all GPUs: torchrun's "gpu"; CPU runs pass a number)
#   RDZV_ENDPOINT (MASTER_ADDR:MASTER_PORT, else --standalone on one node)
#   RDZV_ID (SLURM_JOB_ID, else "ufp4")   MAX_RESTARTS (0)   UFP4_MODULE (ufp4_megatron.train)
#   PYTHON (python)
#
# Everything after the launcher flags reaches the module's argv byte for byte (Hydra overrides:
# model=tiny precision=ufp4 'train.steps=20' ...): it is passed as "$@", never re-parsed by a
# shell, so override values cannot inject commands. With --max-restarts R torchrun restarts
# all workers up to R times after a failure; the trainer resumes from the newest checkpoint in
# checkpoint.dir, so pass checkpoint.dir=... for restarts to lose at most one interval.
set -euo pipefail

NNODES=${NNODES:-1}
NPROC_PER_NODE=${NPROC_PER_NODE:-gpu}
RDZV_ENDPOINT=${RDZV_ENDPOINT:-${MASTER_ADDR:+$MASTER_ADDR:${MASTER_PORT:-29500}}}
RDZV_ID=${RDZV_ID:-${SLURM_JOB_ID:-ufp4}}
MAX_RESTARTS=${MAX_RESTARTS:-0}
UFP4_MODULE=${UFP4_MODULE:-ufp4_megatron.train}
PYTHON=${PYTHON:-python}

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
need() { [ "$#" -ge 2 ] || { echo "torchrun.sh: $1 needs a value" >&2; exit 2; }; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --nnodes) need "$@"; NNODES=$2; shift 2 ;;
    --nproc-per-node) need "$@"; NPROC_PER_NODE=$2; shift 2 ;;
    --rdzv-endpoint) need "$@"; RDZV_ENDPOINT=$2; shift 2 ;;
    --rdzv-id) need "$@"; RDZV_ID=$2; shift 2 ;;
    --max-restarts) need "$@"; MAX_RESTARTS=$2; shift 2 ;;
    --module) need "$@"; UFP4_MODULE=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done

# NVLink multicast (NVLS / SHARP) off unless the caller sets these: creating multicast objects
# fails on hosts without fabric-manager multicast support (VMs, shared or partitioned GPUs) and
# on some shared hosts it can leave the GPUs unusable for everyone. Set them to 1/0 to opt in.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
# Megatron overlaps TP communication with compute only with one CUDA connection.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Workers get their own TCPStore instead of sharing the rendezvous store: with the shared one,
# workers restarted by --max-restarts read keys of the failed attempt and connect to dead peers
# (pytorch/pytorch#135712; seen with gloo and torch 2.13).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}

if [ "$NPROC_PER_NODE" = gpu ] &&
   ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "torchrun.sh: no GPU visible to $PYTHON; give the number of processes," \
       "e.g. --nproc-per-node 2 (or NPROC_PER_NODE=2)" >&2
  exit 2
fi

if [ -n "$RDZV_ENDPOINT" ]; then
  rdzv=(--rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RDZV_ID")
elif [ "$NNODES" = 1 ]; then
  rdzv=(--standalone)
else
  echo "torchrun.sh: --nnodes $NNODES needs --rdzv-endpoint (or RDZV_ENDPOINT, MASTER_ADDR)" >&2
  exit 2
fi

exec "$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
  "${rdzv[@]}" --max-restarts "$MAX_RESTARTS" -m "$UFP4_MODULE" "$@"
