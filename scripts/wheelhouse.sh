#!/usr/bin/env bash
# Downloads into wheelhouse/ every wheel an air-gapped GPU node needs for ufp4-megatron, for
# Python $PY (default 3.12). Install there with:
#   pip install --no-index --find-links wheelhouse 'ufp4-megatron[slurm]'
# (on Python 3.11 megatron-core, which declares >= 3.12, then goes in by hand:
#   pip install --no-index --find-links wheelhouse --no-deps --ignore-requires-python megatron-core==0.19.2)
set -euo pipefail
PY=${PY:-3.12}
PYTHON=${PYTHON:-python3}
OUT=${OUT_DIR:-wheelhouse}
mkdir -p "$OUT"
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64 any; do
  platforms+=(--platform "$p")
done
dl=("$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all:
    --python-version "$PY" --implementation cp "${platforms[@]}" -d "$OUT" --find-links "$OUT")
"$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps -w "$OUT" .
# antlr4 4.9.3 (pinned by hydra/omegaconf) is an sdist only: build its wheel here; the
# downloads below find it through --find-links.
"$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps -w "$OUT" antlr4-python3-runtime==4.9.3
"${dl[@]}" -r requirements/gpu-node.txt
"${dl[@]}" --no-deps megatron-core==0.19.2
echo "wheelhouse: $(ls "$OUT" | wc -l) wheels in $OUT/ for Python $PY"
