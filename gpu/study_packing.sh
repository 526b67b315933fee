#!/usr/bin/env bash
# How many small study runs one CUDA GPU trains at once: taking turns on it (a CUDA context per
# process, which the GPU time-slices), sharing it through CUDA MPS (one server runs every
# process's kernels side by side), or with CUDA graphs (docs/comparing.md, "Packing"). UFP4 at
# the pre-registered study's shape (study11m, two micro-batches of 64 x 256 tokens,
# configs/study/prereg.yaml) on the embedded corpus (the throughput does not depend on the
# text). From the repo root, writing under OUT (default runs/gpu/study-packing); about 8
# minutes on an H200 with the default PACKS:
#   1. the study runner's own MPS daemon (ufp4_megatron/study/mps.py) started, probed and
#      stopped on this node: what `--mps on` would do;
#   2. an eager and a graphed run (train.cuda_graph=local) of 120 steps side by side, then an
#      eager run under MPS: whether the graphed and the MPS run's losses equal the eager run's
#      step by step (without train.deterministic), and each run's median step time;
#   3. PACKS, each MODE:N:SECONDS: N runs at once for SECONDS (each stopped by SIGTERM, which
#      saves a checkpoint), MODE none (eager, taking turns), local (local graphs, taking turns)
#      or mps (eager, through one MPS server): steps/s in all (the sum over the runs of 1 / their
#      median step time after step 15) and each run's median. Default "none:12:90 mps:12:90
#      mps:16:90"; the graphed packings of docs/comparing.md: "local:12:110 none:12:90
#      local:16:100".
# Where nvidia-cuda-mps-control is missing or its daemon does not start, the MPS parts say so
# and are skipped.
set -u
PACKS=${PACKS:-none:12:90 mps:12:90 mps:16:90}
for p in $PACKS; do
  [[ $p =~ ^(none|local|mps):[1-9][0-9]*:[1-9][0-9]*$ ]] || {
    echo "gpu/study_packing.sh: PACKS entry '$p'; give MODE:RUNS:SECONDS, MODE none, local or mps" >&2
    exit 2; }
done
source gpu/setup.sh > /dev/null || exit 1
export OMP_NUM_THREADS=1
P=${OUT:-runs/gpu/study-packing}; mkdir -p "$P"
common=(model=study11m train=study optim=study train.seq_len=256 train.micro_batch=64
        train.global_batch=128 train.eval_interval=50 train.eval_iters=4 data.valid_seed=99
        "data.split='98,2,0'" checkpoint.interval=1000 logging.print_interval=50
        logging.wandb.mode=disabled)
t0=$(date +%s)

python3 - "$P" <<'PY'
import sys
from pathlib import Path
from ufp4_megatron.study import mps
from ufp4_megatron.study.packing import Slot, visible_gpus
gpus = visible_gpus("auto")
try:
    d = mps.start("on", gpus, Path(sys.argv[1]) / "runner-mps-logs")
except SystemExit as e:
    print(f"the runner's MPS daemon: {e}")
else:
    print(f"the runner's MPS daemon: runs of GPU {gpus[0]} get {d.client_env(Slot(0, gpus[0], (0,)))}")
    d.stop()
PY

# A daemon for the MPS runs below: a private pipe dir, the logs in OUT
MPS_PIPE=$(mktemp -d /tmp/ufp4-mps.XXXXXX)
mkdir -p "$P/mps-logs"
mps_ok=0
if command -v nvidia-cuda-mps-control > /dev/null && CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE \
    CUDA_MPS_LOG_DIRECTORY=$P/mps-logs nvidia-cuda-mps-control -d; then
  mps_ok=1
  trap 'echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control; rm -rf "$MPS_PIPE"' EXIT
else
  echo "no MPS daemon on this node (nvidia-cuda-mps-control missing or not started): MPS parts skipped"
fi
servers() {  # the MPS servers running: proof that the runs went through it
  echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control | tr '\n' ' '
}

train() {  # $1 mode (none, local, mps), $2 seconds (0: no limit), $3 run dir, then
  # overrides; in the background, stopped by SIGTERM at the limit
  local mode=$1 limit=$2 dir=$3 graph=none via=(); shift 3
  [[ $mode == local ]] && graph=local
  [[ $mode == mps ]] && via=(env "CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE")
  rm -rf "$dir"  # a dir left by an earlier invocation would resume, its old steps read as new
  "${via[@]}" timeout "$limit" python3 -m ufp4_megatron.train "${common[@]}" precision=ufp4 \
    train.cuda_graph=$graph hydra.run.dir="$dir" "$@" > "$dir.log" 2>&1 &
}

train none 0 "$P/bit-none" train.seed=3 train.steps=120 data.cache_dir="$P/data-none"
train local 0 "$P/bit-local" train.seed=3 train.steps=120 data.cache_dir="$P/data-local"
wait
if (( mps_ok )); then
  train mps 0 "$P/bit-mps" train.seed=3 train.steps=120 data.cache_dir="$P/data-mps"
  wait
fi
echo "eager/graphed pair and MPS run done $(( $(date +%s) - t0 )) s"
python3 - "$P" <<'PY'
import os, statistics, sys
from ufp4_megatron.train.logs.metrics import read_metrics
out = sys.argv[1]
a = read_metrics(f"{out}/bit-none/metrics.jsonl")
key = lambda r: (r["step"], r.get("loss"), r.get("val_loss"), r.get("grad_norm"))
for name in ("bit-local", "bit-mps"):
    if not os.path.exists(f"{out}/{name}/metrics.jsonl"):
        continue
    b = read_metrics(f"{out}/{name}/metrics.jsonl")
    diff = [(x, y) for x, y in zip(map(key, a), map(key, b)) if x != y]
    print(f"eager vs {name[4:]}: {len(a)} and {len(b)} steps, equal: {not diff and len(a) == len(b)}")
    if diff:
        (s, la, *_), (_, lb, *_) = diff[0]
        print(f"first difference at step {s}: loss {la} vs {lb} ({abs(la - lb):.2g})")
for name in ("bit-none", "bit-local", "bit-mps"):
    if os.path.exists(f"{out}/{name}/metrics.jsonl"):
        r = read_metrics(f"{out}/{name}/metrics.jsonl")
        t = statistics.median(x["step_time"] for x in r if x["step"] > 20)
        print(f"{name[4:]}: median step time {t:.3f} s")
PY

pack() {  # $1 mode (none, local, mps), $2 runs at once, $3 seconds
  local mode=$1 n=$2 T=$3 i
  if [[ $mode == mps ]] && (( ! mps_ok )); then echo "$n MPS runs: skipped (no MPS daemon)"; return; fi
  for i in $(seq 1 "$n"); do
    train "$mode" "$T" "$P/pack-$mode-$n-$i" train.seed="$i" train.steps=1000 \
      data.cache_dir="$P/data-$mode"
  done
  if [[ $mode == mps ]]; then
    sleep $(( T / 3 < 30 ? T / 3 : 30 )); echo "MPS servers while $n runs train: $(servers)"
  fi
  wait
  python3 - "$P" "$mode" "$n" <<'PY'
import statistics, sys
from ufp4_megatron.train.logs.metrics import read_metrics
out, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
medians = []
for i in range(1, n + 1):
    try:
        r = read_metrics(f"{out}/pack-{mode}-{n}-{i}/metrics.jsonl")
    except OSError as e:
        print(f"{mode} run {i}: no metrics ({e})")
        continue
    t = [x["step_time"] for x in r if x["step"] > 15]
    if t:
        medians.append(statistics.median(t))
what = {"local": "graphed", "none": "eager", "mps": "eager MPS"}[mode]
if medians:
    print(f"{n} {what} runs at once: {sum(1 / m for m in medians):.1f} steps/s in all; "
          f"median step time per run {min(medians):.3f}-{max(medians):.3f} s "
          f"({len(medians)} of {n} runs measured)")
PY
}
for p in $PACKS; do
  IFS=: read -r mode n secs <<< "$p"
  pack "$mode" "$n" "$secs"
done
echo "study_packing: $(( $(date +%s) - t0 )) s; run dirs under $P"
