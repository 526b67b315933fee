#!/usr/bin/env bash
# A study of recipes x seeds (docs/comparing.md, "Studies"; docs/results.md) packed on one
# CUDA GPU, in rounds: a round trains for at most BUDGET seconds of wall time, set-up included
# (default 400: about 7-9 minutes on an H200 with compare and the archive), then archives
# the runs it completed. A study longer than one allocation (a Slurm job, a lease of a node)
# runs as several rounds, on the same node or on others. From the repo root:
#
#     gpu/study.sh ROUND          ROUND: a number naming the round (and its archive), or a
#                                 grid name; numbers 1-9 also pick a grid as below
#
#   ROUND  grid      arms             seeds  per GPU  what it adds
#   1      main      bf16,e2m1,ufp4   1-8    12       the question first: as many seeds as fit
#   2-3    main      all six          1-8    12       the main table; each round continues
#   4-5    ablation  all ten          1-4    12       the paper's ablations (bf16/e2m1/ufp4 reused)
#   6-9    depth     bf16,e2m1,ufp4   1-4    6        the gap against depth: L3, L12, L24 (L6 is
#                                                     main's); AXIS=depth=L3,L12 first, then L24
#   -      small     bf16,e2m1,ufp4   1-3    9        the main question at 125M (GRID=small only)
#   -      prereg    bf16,e2m1,ufp4   grid's 12       the pre-registered study (GRID=prereg only,
#                                                     below)
#
# The pre-registered study (docs/results.md, "Pre-registration"), the same command each time
# until every run of a group is complete (an invocation trains what no archive holds yet):
#
#     GRID=prereg OUT=dir BUDGET=420 bash gpu/study.sh N        N: 1, 2, ... (the archive's name)
#     GRID=prereg OUT=dir BUDGET=500 PER_DEVICE=14 bash gpu/study.sh N   (node already set up)
#     GRID=prereg ARMS=bf16,ufp4_rht_none,ufp4_rht_wgrad,ufp4_rht_dgrad_wgrad,ufp4_rht_fprop_wgrad,ufp4_no_sr,e2m1_rht_all,e2m1_uniform ...
#     GRID=prereg ARMS=bf16,ufp4_int4,nvfp4,mxfp4 ...
#
# The grid fixes the corpus (pysrc), the seeds (E2M1 and UFP4 1-28, the rest 1-12) and the
# arms' order (ARMS: the primary by default, then the two lists above); SEEDS, STEPS, PAUSE
# and PACKAGES are refused. Runs never resume across invocations (--restart-incomplete): a run
# counts only if one process trained all its 1000 steps. On an H200 an invocation takes 9-10
# minutes of wall time and completes about 9 runs where gpu/setup.sh and the corpus start
# from nothing (BUDGET=420: seed 1's mechanism runs after training), 12-14 where an earlier
# invocation left them in place (BUDGET=500, PER_DEVICE=14); measured without MPS:
# BUDGET=470 PER_DEVICE=13 from nothing, 10-12 runs in 455-512 s; BUDGET=480 PER_DEVICE=14
# after it, 12-13 runs in 460-467 s; BUDGET=420 PER_DEVICE=9 for the last 9, 362 s.
# Through MPS (MPS=auto, the default) more fit: BUDGET=470 PER_DEVICE=14 from nothing, 14
# runs in 472 s; BUDGET=530 PER_DEVICE=16 after it, 16 runs in 478 s (NVFP4's runs step
# ~1.4x slower). A prereg round writes no loss_gap.* (no interim look, above). Its archive goes to
# docs/results/prereg/roundN.tar.gz.
#
# GRID=main|ablation|depth|small with any round number trains that grid under that number;
# SEEDS, ARMS, PER_DEVICE then default to the grid's.
# Every round first unpacks the archives of earlier rounds from the study's archive folder in
# the checkout (docs/results/study/round*.tar.gz; CORPUS, STEPS and PACKAGES name others), so runs complete there are skipped and their
# seeds are not trained twice; the runner then starts, seed by seed, only runs it estimates to
# end within the budget, and stops the ones that would not, highest seed first (what completes
# is whole seeds, paired across recipes). A round trains the runs its grid, ARMS and SEEDS
# name; the incomplete runs of other grids wait until a round asks for them. Checkpoints stay
# in the study dir on the node; the archives hold what a later round on another node needs.
#
# OUT (default runs/gpu/study) gets: roundN.tar.gz (study.json, and for each run completed in
# this round runs/<run>/{metrics.jsonl,config.yaml} and its log), loss_gap.md/.json/.png
# (compare over every complete run so far), mechanism.md (bf16, e2m1, ufp4 of seed 1, when
# their models are new; plots in the archive) and roundN.md (what ran, the measured
# throughput; printed last). Copy roundN.tar.gz into the archive folder to carry the round to
# other nodes.
# NODE_DIR (default /tmp): where the node keeps the study dirs (study, study-pysrc, study-prereg,
# with their checkpoints) and the pysrc corpus.
# Env: BUDGET seconds from start to the end of training (default 400), PER_DEVICE, SEEDS, ARMS,
# AXIS (one grid axis's values, e.g. AXIS=depth=L3,L12: the runner's --axis),
# GRID, MPS (off, auto, on: below), PAUSE=1 (runs longer than one round: the budget pauses
# them, the next round on the same node continues them from their checkpoints; STOP_GRACE
# seconds for the checkpoint saves, default 60 with PAUSE=1, else 20).
# After training: the mechanism (a round whose seed-1 models are new) up to ~120 s, compare
# and archives ~25 s. Before training (inside BUDGET): ~115 s on a node that has not run the
# package yet (set-up, preflight, corpus), ~50 s otherwise.
# CORPUS=stdlib (default: the embedded corpus, archives in docs/results/study/) or pysrc (the
# stdlib plus torch's sources, 46.4 MB with torch 2.11, prepared here by gpu/pysrc_corpus.py: no
# byte seen twice in a run; a separate study, archived under docs/results/study-pysrc/).
# STEPS=N: every run trains N steps (cosine to the last), a study of its own ($NODE_DIR/study-pysrc-
# Nsteps, archives under docs/results/study-pysrc-Nsteps/). PACKAGES=torch,numpy,... (pysrc):
# the packages whose sources join the stdlib's, another corpus and so another study (suffix
# -torch+numpy...). A 1000-step run takes 32.8M tokens: pysrc with torch holds 45.4M training
# bytes (1380 steps seen once); torch,megatron.core,wandb,pydantic,numpy add ~20 MB.
# Packing on one H200 (study11m, from the runner's progress lines): 12 runs trained ~36-42
# steps/s in all, 8-9 runs ~39, 4 runs ~27; a UFP4 step took 0.155-0.195 s packed 12 and
# 0.142 s packed 8. 12 runs per GPU complete in one wave of ~430 s. The GPU, not the host, is
# the limit when packed: at the prereg shape 12 UFP4 runs train 36.9 steps/s in all eager and
# 37.8 with train.cuda_graph=local (16 graphed: 37.8), although one run alone takes 0.097 s per
# step eager and 0.047 s graphed (gpu/study_packing.sh); so the study runs eager, as designed.
set -uo pipefail
T0=$(date +%s)
ROUND=${1:?usage: gpu/study.sh ROUND (1-9, see the header) or a grid name}
ARMS_DEFAULT=""
GRID_ASKED=${GRID:-}  # GRID=main|ablation|depth|small: this round trains that grid (any round number)
case $GRID_ASKED in
  ""|main|ablation|depth|small|prereg) ;;
  *) echo "gpu/study.sh: GRID=$GRID_ASKED; give main, ablation, depth, small or prereg" >&2; exit 2 ;;
esac
[[ -n $GRID_ASKED && $ROUND =~ ^[1-9][0-9]*$ ]] && ROUND_ARG=$ROUND && ROUND=${GRID_ASKED}
case $ROUND in
  1) GRID=main; SEEDS_DEFAULT=1-8; PER_DEFAULT=12; ARMS_DEFAULT=bf16,e2m1,ufp4 ;;
  2|3) GRID=main; SEEDS_DEFAULT=1-8; PER_DEFAULT=12 ;;
  4|5) GRID=ablation; SEEDS_DEFAULT=1-4; PER_DEFAULT=12 ;;
  6|7|8|9) GRID=depth; SEEDS_DEFAULT=1-4; PER_DEFAULT=6 ;;
  main|ablation|depth) GRID=$ROUND; SEEDS_DEFAULT=1-8; PER_DEFAULT=12
     [[ $GRID == main ]] || SEEDS_DEFAULT=1-4; [[ $GRID == depth ]] && PER_DEFAULT=6 ;;
  small) GRID=small; SEEDS_DEFAULT=1-3; PER_DEFAULT=9 ;;
  prereg) GRID=prereg; SEEDS_DEFAULT=""; PER_DEFAULT=12; ARMS_DEFAULT=bf16,e2m1,ufp4 ;;
  *) echo "gpu/study.sh: unknown round $ROUND; give 1-9 or main|ablation|depth|small (or GRID=... and any round number)" >&2; exit 2 ;;
esac
ROUND=${ROUND_ARG:-$ROUND}  # the archive's name: roundN.tar.gz
if [[ $GRID == prereg ]]; then  # the design is the grid's: nothing here may change it
  for v in SEEDS STEPS PACKAGES; do
    [[ -n ${!v:-} ]] && { echo "gpu/study.sh: $v is set; the prereg grid fixes it (unset it)" >&2; exit 2; }
  done
  [[ ${PAUSE:-0} == 0 ]] || { echo "gpu/study.sh: PAUSE=1 with GRID=prereg; its runs never resume across calls" >&2; exit 2; }
  [[ ${CORPUS:-pysrc} == pysrc ]] || { echo "gpu/study.sh: CORPUS=$CORPUS with GRID=prereg; it trains on pysrc" >&2; exit 2; }
  CORPUS=pysrc
fi
SEEDS=${SEEDS:-$SEEDS_DEFAULT}
ARMS=${ARMS:-$ARMS_DEFAULT}
PER_DEVICE=${PER_DEVICE:-$PER_DEFAULT}
BUDGET=${BUDGET:-400}
# PAUSE=1: the budget pauses the runs instead of ending them (runs longer than one round, e.g.
# the small grid's 125M models): every run trains until it and saves a checkpoint, nothing is
# shed; the next round on the same node continues them (the checkpoints stay on the node)
PAUSE=${PAUSE:-0}
case $PAUSE in
  0) pause=(); STOP_GRACE_DEFAULT=20 ;;
  1) pause=(--pause-at-limit); STOP_GRACE_DEFAULT=60 ;;  # every run saves at once
  *) echo "gpu/study.sh: PAUSE=$PAUSE; give 1 (the budget pauses the runs) or 0" >&2; exit 2 ;;
esac
STOP_GRACE=${STOP_GRACE:-$STOP_GRACE_DEFAULT}
# MPS=auto (default)|on|off: the runs on the GPU share it through a CUDA MPS server of the
# runner's own (study/mps.py) instead of taking turns: 1.20x the steps on an H100
# (gpu/study_packing.sh), about 1.26x on an H200 (docs/results.md); auto runs without it, after
# one line, where the daemon does not start
MPS=${MPS:-auto}
case $MPS in
  off|auto|on) ;;
  *) echo "gpu/study.sh: MPS=$MPS; give off, auto or on" >&2; exit 2 ;;
esac
OUT=${OUT:-runs/gpu/study}
NODE_DIR=${NODE_DIR:-/tmp}  # the node's study dirs and corpus (checkpoints stay there)
[[ $NODE_DIR =~ ^/[A-Za-z0-9_./-]*$ ]] || {  # it goes into a Hydra list override unquoted
  echo "gpu/study.sh: NODE_DIR=$NODE_DIR; give an absolute path of letters, digits and _ . / -" >&2; exit 2; }
CORPUS=${CORPUS:-stdlib}
PACKAGES=${PACKAGES:-torch}
case $CORPUS in
  stdlib) ARCHIVES=docs/results/study; STUDY=$NODE_DIR/study ;;
  pysrc) ARCHIVES=docs/results/study-pysrc; STUDY=$NODE_DIR/study-pysrc ;;
  *) echo "gpu/study.sh: CORPUS=$CORPUS; give stdlib or pysrc" >&2; exit 2 ;;
esac
prereg=()  # the prereg study: its own dir and archives; a run counts if one process trained it
# and no interim comparison: its stopping rule has no interim look, so a round prints what ran,
# never an estimate (python -m ufp4_megatron.cli.results tests once, when every run counts)
[[ $GRID == prereg ]] && ARCHIVES=docs/results/prereg && STUDY=$NODE_DIR/study-prereg \
  && prereg=(--restart-incomplete --no-compare)
# PACKAGES (pysrc): the installed packages whose sources join the stdlib's (default torch);
# other packages make another corpus, so another study (its own dir and archive folder)
CORPUS_PREFIX=$NODE_DIR/corpus/pysrc
if [[ $PACKAGES != torch ]]; then
  [[ $CORPUS == pysrc ]] || { echo "gpu/study.sh: PACKAGES is for CORPUS=pysrc" >&2; exit 2; }
  [[ $PACKAGES =~ ^[A-Za-z_][A-Za-z0-9_.]*(,[A-Za-z_][A-Za-z0-9_.]*)*$ ]] || {
    echo "gpu/study.sh: PACKAGES=$PACKAGES; give importable names separated by commas, e.g. torch,numpy" >&2; exit 2; }
  tag=${PACKAGES//,/+}
  CORPUS_PREFIX=$NODE_DIR/corpus/pysrc-$tag; ARCHIVES+=-$tag; STUDY+=-$tag
fi
# STEPS: train.steps of every run (default the grid's, 1000; the cosine schedule follows it);
# runs of another length are another study, with their own dir and archive folder
STEPS=${STEPS:-}
steps=()
if [[ -n $STEPS ]]; then
  [[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "gpu/study.sh: STEPS=$STEPS; give a positive step count, e.g. 2000" >&2; exit 2; }
  steps=("train.steps=$STEPS"); ARCHIVES+=-${STEPS}steps; STUDY+=-${STEPS}steps
fi
# STUDY: checkpoints stay on the node; the archive carries the results. SCRATCH: this round's
# own lists, so that two studies side by side on one node cannot empty each other's list of
# archived runs
mkdir -p "$OUT" "$STUDY"
SCRATCH=$(mktemp -d /tmp/study-scratch.XXXXXX)

# shellcheck source=gpu/setup.sh
source gpu/setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

# The pysrc corpus is prepared (CPU, tens of seconds) while the preflight runs; a node that ran
# an earlier round has it already (its manifest is written last, so it is complete).
# Under a lock, so that a second study started beside this one waits for it and then skips.
corpus_pid=
if [[ $CORPUS == pysrc && ! -f $CORPUS_PREFIX.manifest.json ]]; then
  mkdir -p "$(dirname "$CORPUS_PREFIX")"
  ( flock 9; [[ -f $CORPUS_PREFIX.manifest.json ]] && { echo "pysrc corpus: prepared beside this study"; exit 0; }
    python3 gpu/pysrc_corpus.py --out "$CORPUS_PREFIX" --packages "$PACKAGES"
  ) 9>"$CORPUS_PREFIX.lock" > "$STUDY/corpus.log" 2>&1 &
  corpus_pid=$!
fi

# Preflight (~20 s): a 4-step GPU run that saves two checkpoints. Without working GPU
# checkpoints every study run would die at its first save; stop here instead.
# Its own dir, so that two studies started side by side do not share one.
PREFLIGHT=$(mktemp -d /tmp/preflight.XXXXXX)
if ! python3 -m ufp4_megatron.train model=tiny precision=ufp4 train.steps=4 checkpoint.interval=2 \
    train.seq_len=64 train.global_batch=2 hydra.run.dir="$PREFLIGHT" \
    data.cache_dir="$PREFLIGHT/data" logging.wandb.mode=disabled > "$PREFLIGHT.log" 2>&1; then
  tail -5 "$PREFLIGHT.log"
  echo "gpu_study: preflight failed: a 4-step GPU run with checkpoints did not complete; not starting"
  [[ -n $corpus_pid ]] && kill "$corpus_pid" 2>/dev/null
  exit 1
fi
echo "preflight: GPU run with checkpoints ok ($(( $(date +%s) - T0 )) s)"

data=()  # the runs' data overrides (none: the grid's embedded corpus)
if [[ $CORPUS == pysrc ]]; then
  if [[ -n $corpus_pid ]] && ! wait "$corpus_pid"; then
    tail -5 "$STUDY/corpus.log"; echo "gpu_study: the pysrc corpus could not be prepared"; exit 1
  fi
  [[ -n $corpus_pid ]] && tail -1 "$STUDY/corpus.log" || echo "pysrc corpus: prepared by an earlier round on this node"
  echo "corpus ready ($(( $(date +%s) - T0 )) s)"
  cp "$CORPUS_PREFIX.manifest.json" "$STUDY/corpus.manifest.json"
  data=("data.prefixes=[$CORPUS_PREFIX]" data.tokenizer.type=byte-level)
fi
data+=("${steps[@]}")

# A node that ran an earlier round keeps that round's study dir: its study.json is newer than
# any archive's, so the archives do not overwrite it (the runner trusts the files on disk for
# what is complete either way). This round's archive holds every run complete on the node that
# no archive in the archive folder holds, also one an earlier round on this node left stopped and this
# round resumed (such a run had its run dir before this round started).
shopt -s nullglob
keep=(); [[ -f $STUDY/study.json ]] && keep=(--exclude=study.json) \
  && echo "keeping this node's $STUDY/study.json (an earlier round's)"
# runs an earlier round on this node already archived count as archived too, so rounds whose
# archives are not yet in the archive folder archive each run once; delete $STUDY/returned.txt to
# archive them all again
cp "$STUDY/returned.txt" "$SCRATCH/runs-archived.txt" 2>/dev/null || : > "$SCRATCH/runs-archived.txt"
while IFS= read -r a; do
  tar -xzf "$a" -C "$STUDY" "${keep[@]}" && echo "unpacked $a"
  tar -tzf "$a" | sed -n 's#^runs/\([^/]*\)/metrics\.jsonl$#\1#p' >> "$SCRATCH/runs-archived.txt"
done < <(find "$ARCHIVES" -maxdepth 1 -name 'round*.tar.gz' 2>/dev/null | sort -V)

LIMIT=$(( BUDGET - ($(date +%s) - T0) ))
echo "round $ROUND: grid $GRID arms ${ARMS:-all} seeds ${SEEDS:-of the grid}${AXIS:+ axis $AXIS}, $PER_DEVICE per GPU, training stops in $LIMIT s"
T_START=$(date +%s)
extra=(); (( ${#data[@]} )) && extra=(-- "${data[@]}")
python3 -m ufp4_megatron.study --out "$STUDY" --grid "$GRID" ${SEEDS:+--seeds "$SEEDS"} ${ARMS:+--arms "$ARMS"} \
  ${AXIS:+--axis "$AXIS"} --per-device "$PER_DEVICE" --mps "$MPS" --time-limit "$LIMIT" "${pause[@]}" "${prereg[@]}" --stop-grace "$STOP_GRACE" --wandb-mode disabled \
  --progress plain "${extra[@]}" 2>&1 | tee "$STUDY/runner-round$ROUND.log"
T_TRAIN=$(date +%s)
[[ -f $STUDY/study.json ]] || { echo "gpu_study: the runner wrote no study.json (see above)"; exit 1; }

# the runs complete on disk (study.manifest.is_complete), named once for both uses below
python3 - "$STUDY" > "$SCRATCH/runs-complete.txt" <<'EOF'
import sys
from ufp4_megatron.study import manifest as mf
for r in mf.load(sys.argv[1])["runs"]:
    if mf.is_complete(sys.argv[1], r):
        print(r["name"])
EOF

# what no archive holds goes into this round's archive, packed at once so that a round cut
# short during the mechanism still leaves it
new=()
while IFS= read -r name; do
  grep -qx "$name" "$SCRATCH/runs-archived.txt" || [[ ! -f $STUDY/runs/$name/config.yaml ]] || new+=("$name")
done < "$SCRATCH/runs-complete.txt"
files=(study.json "runner-round$ROUND.log")
[[ -f $STUDY/corpus.manifest.json ]] && files+=(corpus.manifest.json)
for n in "${new[@]}"; do
  files+=("runs/$n/metrics.jsonl" "runs/$n/config.yaml" "logs/$n.log")
  [[ -f $STUDY/runs/$n/launch.json ]] && files+=("runs/$n/launch.json")  # how it was trained
done
tar -czf "$OUT/round$ROUND.tar.gz" -C "$STUDY" "${files[@]}" \
  && { (( ${#new[@]} )) && printf '%s\n' "${new[@]}" >> "$STUDY/returned.txt"; :; }

# the mechanism on seed 1's trained bf16, e2m1 and ufp4 models, while their checkpoints exist
# (the small grid's runs are named <arm>-small-s<seed>; its 125M models get 120 s)
tag=""; mech_s=60; [[ $GRID == small ]] && tag="-small" && mech_s=120
mech=()
for arm in bf16 e2m1 ufp4; do
  name="$arm$tag-s1"; run="$STUDY/runs/$name"
  # only a complete run's model says something (a stopped one is barely trained)
  if grep -qx "$name" "$SCRATCH/runs-complete.txt" && [[ -f $run/checkpoints/latest \
      && ! -f $STUDY/mechanism/$name/mechanism.md ]]; then
    timeout "$mech_s" python3 -m ufp4_megatron.report.mechanism "$run" --out "$STUDY/mechanism/$name" \
      > "$STUDY/mechanism-$name.log" 2>&1 &
    mech+=("$name")
  fi
done
wait
for name in "${mech[@]}"; do
  md="$STUDY/mechanism/$name/mechanism.md"
  { echo "## $name"; echo
    if [[ -f $md ]]; then sed '/^## Per layer/,$d' "$md"; else tail -5 "$STUDY/mechanism-$name.log"; fi
  } >> "$OUT/mechanism.md"
done

if (( ${#mech[@]} )); then  # the same archive again, with the mechanism's files
  for name in "${mech[@]}"; do [[ -d $STUDY/mechanism/$name ]] && files+=("mechanism/$name"); done
  tar -czf "$OUT/round$ROUND.tar.gz" -C "$STUDY" "${files[@]}"
fi
for f in loss_gap.md loss_gap.json loss_gap.png; do
  [[ -f $STUDY/compare/$f ]] && cp "$STUDY/compare/$f" "$OUT/"
done

python3 gpu/round_report.py "$STUDY" "$ROUND" "$T_START" "$T_TRAIN" "$PER_DEVICE" "${new[@]}" > "$OUT/round$ROUND.md"
cat "$OUT/round$ROUND.md"
[[ -f $OUT/loss_gap.md ]] && cat "$OUT/loss_gap.md"
echo "gpu_study round $ROUND: $(( $(date +%s) - T0 )) s wall; files in $OUT:" "$OUT"/*
