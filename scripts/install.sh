#!/usr/bin/env bash
# Creates .venv and installs the pinned stack; called by `make install` (idempotent: the
# Makefile skips it when Makefile, pyproject.toml and requirements/ are unchanged).
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=2.13.0
TRITON_VERSION=3.6.0
MEGATRON_VERSION=0.19.2

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    # A GPU node: keep the torch (and triton) built for its CUDA; never replace it.
    echo "[install] GPU node: venv reuses the system torch"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

if ! "$PY" -c 'import torch' 2>/dev/null; then
  # Pinned: an unpinned torch would pull a multi-GB CUDA build on a CPU machine.
  echo "[install] torch==$TORCH_VERSION"
  "${PIP[@]}" install "torch==$TORCH_VERSION"
fi
"$PY" -c 'import triton' 2>/dev/null || "${PIP[@]}" install "triton==$TRITON_VERSION"

# megatron-core 0.19.2 declares Requires-Python >= 3.12, yet megatron.core imports and runs
# on 3.11 (only parts of megatron/training use 3.12-only typing). --ignore-requires-python on
# a whole install line makes pip pick sdists that need 3.12, so megatron-core goes alone,
# without dependencies, after its real runtime dependencies (requirements/megatron.txt).
"${PIP[@]}" install -r requirements/megatron.txt
if "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'; then
  "${PIP[@]}" install --no-deps "megatron-core==$MEGATRON_VERSION"
else
  "${PIP[@]}" install --no-deps --ignore-requires-python "megatron-core==$MEGATRON_VERSION"
fi
# The package declares torch and triton (and megatron-core on 3.12+): pin them to what is
# installed now, so that pip never swaps the node's CUDA torch (or the CPU one) for another
# build; a torch older than the package needs stops here with pip's conflict message.
KEEP="$VENV/.keep-torch.txt"
"$PY" - > "$KEEP" <<'PYEOF'
import importlib.metadata as m
for name in ("torch", "triton"):
    print(f"{name}=={m.version(name)}")
PYEOF
"${PIP[@]}" install -c "$KEEP" -e '.[test,slurm]'
"$PY" - <<'PYEOF'
import torch, triton, megatron.core as m
print(f"[install] torch {torch.__version__}, triton {triton.__version__}, megatron-core {m.__version__}")
PYEOF
