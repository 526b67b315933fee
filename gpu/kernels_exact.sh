#!/usr/bin/env bash
# Every kernel exactness test of tests/kernels on one CUDA GPU: the compiled Triton kernels
# against the PyTorch references, bitwise (RTNE) or in distribution (SR). About 3-5 minutes
# on an H200 with KERNELS_WORKERS=16 (longer with a cold Triton cache).
# tests/kernels holds `gpu`-marked tests (large shapes) and tests that run in Triton's CPU
# interpreter where there is no GPU; on CUDA the latter run the compiled kernels, including
# the fast division that the interpreter never takes (it always divides with div_rn), at the
# special values (subnormal and huge scales, NaN/Inf blocks) that exercise its guard.
# gpu/kernels.sh runs only the `gpu`-marked ones; gpu/validate.sh runs this script.
#   bash gpu/kernels_exact.sh        (repo root; needs torch + triton + pytest-xdist)
# A few tests drive the kernels through ufp4_megatron.megatron (the SR key draws, the sm_90
# compile cases with device keys), so gpu/setup.sh installs the wheelhouse's megatron-core
# first, as for every other GPU script.
# Writes to OUT (default runs/gpu/kernels_exact): kernels_exact.log, collected.txt and
# finished.txt (the tests collected and those that finished) and unfinished.txt; prints
# pytest's summary, the tests that did not finish (if cut short) and the exit status last.
#   KERNELS_WORKERS (default 8) xdist workers, KERNELS_TIMEOUT (default 560) seconds,
#   KERNELS_TESTS (default tests/kernels) the test files.
set -uo pipefail
source gpu/setup.sh > /dev/null || exit 1
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
OUT=${OUT:-runs/gpu/kernels_exact}
mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# pytest_finished.py: names the finished tests, so a cut-short run lists the rest;
# faulthandler_timeout: a test running past 150 s dumps its threads' stacks (where it hangs);
# SIGINT at the time limit: pytest then prints its summary of what ran; --dist loadgroup:
# tests sharing a costly fixture (the sm_90 compile of every case) run on one worker, which
# makes it once (tests/conftest.py).
python3 -m pytest -q -p no:cacheprovider --collect-only ${KERNELS_TESTS:-tests/kernels} 2>/dev/null \
  | grep '::' | LC_ALL=C sort -u > "$OUT/collected.txt"
rm -f "$OUT/finished.raw"
FINISHED_TESTS=$OUT/finished.raw PYTHONPATH=$PWD/gpu:$PYTHONPATH \
  timeout -s INT -k 30 "${KERNELS_TIMEOUT:-560}" python3 -m pytest -v -p no:cacheprovider \
  -n "${KERNELS_WORKERS:-8}" --dist loadgroup -p pytest_finished -o faulthandler_timeout=150 \
  --durations=12 -rf ${KERNELS_TESTS:-tests/kernels} \
  > "$OUT/kernels_exact.log" 2>&1
rc=$?
LC_ALL=C sort -u "$OUT/finished.raw" > "$OUT/finished.txt" 2>/dev/null || : > "$OUT/finished.txt"
rm -f "$OUT/finished.raw"
LC_ALL=C comm -23 "$OUT/collected.txt" "$OUT/finished.txt" > "$OUT/unfinished.txt"
grep -v -e '^\[gw' -e PytestBenchmarkWarning -e 'warner(' "$OUT/kernels_exact.log" | tail -25
echo "finished $(wc -l < "$OUT/finished.txt") of $(wc -l < "$OUT/collected.txt") tests;" \
  "not finished: $(wc -l < "$OUT/unfinished.txt") (listed in $OUT/unfinished.txt)"
head -20 "$OUT/unfinished.txt"
echo "tests/kernels on CUDA (gpu-marked and interpreter tests): rc=$rc, $(( $(date +%s) - t0 )) s"
exit $rc
