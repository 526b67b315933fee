#!/usr/bin/env bash
# On one CUDA GPU (about 9 minutes on an H200): the timings of docs/performance.md.
#   1. gpu/host_overhead.py: bare QDQ kernel vs kernels.quantize_view vs quantize() at
#      8192x8192, the ops GEMMs' host and GPU time at dense_1p5b shapes (about 1 minute);
#   2. gpu/perf.sh without its tests (gpu/validate.sh runs them): the step table
#      (bf16 / ufp4 / e2m1 / ufp4_int4 / nvfp4 at small, dense_1p5b, moe_7p9b x4, moe_124b x1)
#      and two step profiles, within PERF_BUDGET seconds (default 440).
# Writes $OUT/host/ and $OUT/perf/ (OUT default runs/gpu/speed) and prints the step table
# last. From the repo root:   bash gpu/speed.sh
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-runs/gpu/speed}; mkdir -p "$OUT"
W=$OUT; mkdir -p "$W"/{host,perf}
# shellcheck source=gpu/setup.sh
source gpu/setup.sh || exit 1
OUT=$W/host timeout 120 python3 gpu/host_overhead.py > "$W/host/stdout.txt" 2>&1
echo "host overhead rc=$? ($(( $(date +%s) - T0 )) s)"; tail -25 "$W/host/stdout.txt"
OUT=$W/perf PERF_TESTS=0 PERF_BUDGET=${PERF_BUDGET:-440} bash gpu/perf.sh \
  > "$W/perf/stdout.txt" 2>&1
echo "perf rc=$? ($(( $(date +%s) - T0 )) s)"
tail -60 "$W/perf/stdout.txt"
