#!/usr/bin/env bash
# How many small study runs one CUDA GPU trains at once, and whether CUDA graphs change that
# (docs/comparing.md, "Packing"). UFP4 at the pre-registered study's shape (study11m, two
# micro-batches of 64 x 256 tokens, configs/study/prereg.yaml) on the embedded corpus (the
# throughput does not depend on the text). From the repo root, writing under OUT (default
# runs/gpu/study-packing); about 7 minutes on an H200:
#   1. an eager and a graphed run (train.cuda_graph=local) of 120 steps side by side: whether
#      their losses are equal step by step (without train.deterministic), and each run's
#      median step time alone;
#   2. 12 runs at once with local graphs for 110 s, 12 eager for 90 s, 16 with local graphs
#      for 100 s (each stopped by SIGTERM, which saves a checkpoint): steps/s in all (the sum over
#      the runs of 1 / their median step time after step 15) and each run's median.
set -u
source gpu/setup.sh > /dev/null || exit 1
export OMP_NUM_THREADS=1
P=${OUT:-runs/gpu/study-packing}; mkdir -p "$P"
common=(model=study11m train=study optim=study train.seq_len=256 train.micro_batch=64
        train.global_batch=128 train.eval_interval=50 train.eval_iters=4 data.valid_seed=99
        "data.split='98,2,0'" checkpoint.interval=1000 logging.print_interval=50
        logging.wandb.mode=disabled)
t0=$(date +%s)
# every run starts in a fresh dir: one left by an earlier invocation with this OUT would
# resume at its last step and its old metrics would be read as this run's
for g in none local; do
  rm -rf "$P/bit-$g"
  python3 -m ufp4_megatron.train "${common[@]}" precision=ufp4 train.seed=3 train.steps=120 \
    train.cuda_graph=$g hydra.run.dir="$P/bit-$g" data.cache_dir="$P/data-$g" > "$P/bit-$g.log" 2>&1 &
done
wait
echo "eager/graphed pair done $(( $(date +%s) - t0 )) s"
python3 - "$P" <<'PY'
import statistics, sys
from ufp4_megatron.train.logs.metrics import read_metrics
a, b = (read_metrics(f"{sys.argv[1]}/{name}/metrics.jsonl") for name in ("bit-none", "bit-local"))
key = lambda r: (r["step"], r.get("loss"), r.get("val_loss"), r.get("grad_norm"))
diff = [(x, y) for x, y in zip(map(key, a), map(key, b)) if x != y]
print(f"eager vs graphed: {len(a)} and {len(b)} steps, equal: {not diff and len(a) == len(b)}")
if diff:
    (s, la, *_), (_, lb, *_) = diff[0]
    print(f"first difference at step {s}: loss {la} vs {lb} ({abs(la - lb):.2g})")
for name, r in (("eager", a), ("graphed", b)):
    t = statistics.median(x["step_time"] for x in r if x["step"] > 20)
    print(f"{name} alone: median step time {t:.3f} s")
PY
pack() {  # $1 graph mode, $2 runs at once, $3 seconds
  local g=$1 n=$2 T=$3 i
  for i in $(seq 1 "$n"); do
    rm -rf "$P/pack-$g-$n-$i"
    timeout "$T" python3 -m ufp4_megatron.train "${common[@]}" precision=ufp4 train.seed="$i" \
      train.steps=1000 train.cuda_graph="$g" hydra.run.dir="$P/pack-$g-$n-$i" \
      data.cache_dir="$P/data-$g" > "$P/pack-$g-$n-$i.log" 2>&1 &
  done
  wait
  python3 - "$P" "$g" "$n" <<'PY'
import statistics, sys
from ufp4_megatron.train.logs.metrics import read_metrics
out, g, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
medians = []
for i in range(1, n + 1):
    try:
        r = read_metrics(f"{out}/pack-{g}-{n}-{i}/metrics.jsonl")
    except OSError as e:
        print(f"{g} run {i}: no metrics ({e})")
        continue
    t = [x["step_time"] for x in r if x["step"] > 15]
    if t:
        medians.append(statistics.median(t))
mode = "graphed" if g == "local" else "eager"
if medians:
    print(f"{n} {mode} runs at once: {sum(1 / m for m in medians):.1f} steps/s in all; "
          f"median step time per run {min(medians):.3f}-{max(medians):.3f} s "
          f"({len(medians)} of {n} runs measured)")
PY
}
pack local 12 110
pack none 12 90
pack local 16 100
echo "study_packing: $(( $(date +%s) - t0 )) s; run dirs under $P"
