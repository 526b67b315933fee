#!/usr/bin/env bash
# Installs TransformerEngine 2.20.2 for PyTorch on a CUDA 13 node without network (torch
# 2.11+cu130, Python 3.12, nvcc 13, g++, the image's nvidia-cudnn/nccl wheels) into
# /tmp/te-site, from the files `python3 scripts/te_wheels.py` prepares and that travel beside
# the checkout in a folder (default te-wheels/): the TE wheels, the transformer-engine-torch
# source, cudnn_frontend's headers and pydantic. It builds the extension (g++ only,
# NVTE_PYTORCH_FORCE_BUILD=TRUE, --no-build-isolation, cuDNN/NCCL headers from the nvidia wheels
# on CPATH, MAX_JOBS=16) once per node, then runs a TE linear layer (BF16 and FP8) as a check
# that the library loads and its kernels run on this GPU.
#   bash gpu/te_setup.sh [DIR]          (or TE_DIR=DIR; TE_SITE=/tmp/te-site, TE_STAGE=/tmp/te-stage)
# A wheel split into parts may arrive over several runs: every run copies what DIR holds into
# the node's stage and installs once PARTS lists nothing missing (exit 3 until then: "staged").
# Running it again on an installed node only checks (exit 0). Use TE afterwards with
#   export PYTHONPATH=/tmp/te-site:$PYTHONPATH      (gpu/te_check.sh does it)
# On an H200 node (16 cores): 66-142 s in all over four nodes, most of it the extension build
# (82-94 s where timed; the script prints its times), the check 5-11 s.
set -uo pipefail
TE_DIR=${1:-${TE_DIR:-te-wheels}}
STAGE=${TE_STAGE:-/tmp/te-stage}
SITE=${TE_SITE:-/tmp/te-site}
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp}/te_setup.log
mkdir -p "$STAGE" "$(dirname "$LOG")"
t0=$SECONDS
say() { echo "te_setup: $*"; }

# 1. stage what this run carried (a part carried earlier stays in the stage)
if [[ -d $TE_DIR ]]; then
  for f in "$TE_DIR"/*; do
    [[ -f $f ]] || continue
    b=$(basename "$f")
    if [[ ! -f $STAGE/$b || $(stat -c %s "$f") != $(stat -c %s "$STAGE/$b") ]]; then
      cp "$f" "$STAGE/$b.tmp" && mv "$STAGE/$b.tmp" "$STAGE/$b"
    fi
  done
else
  say "no folder $TE_DIR here; using what $STAGE holds"
fi
if [[ ! -f $STAGE/PARTS || ! -f $STAGE/SHA256SUMS ]]; then
  say "error: no PARTS/SHA256SUMS in $TE_DIR or $STAGE: prepare the folder with python3 scripts/te_wheels.py"
  exit 1
fi

# 2. join parts; report what is still missing
missing=()
while read -r name nparts size; do
  [[ -z $name ]] && continue
  if [[ -f $STAGE/$name && $(stat -c %s "$STAGE/$name") == "$size" ]]; then continue; fi
  have=()
  for ((i = 0; i < nparts; i++)); do
    p=$(printf '%s/%s.part%02d' "$STAGE" "$name" "$i")
    [[ -f $p ]] && have+=("$p") || missing+=("$(basename "$p")")
  done
  if ((${#have[@]} == nparts)); then
    cat "${have[@]}" > "$STAGE/$name.tmp" && mv "$STAGE/$name.tmp" "$STAGE/$name"
    say "joined $name from $nparts parts"
  fi
done < "$STAGE/PARTS"
if ((${#missing[@]})); then
  say "staged in $STAGE; still missing ${#missing[@]}: ${missing[*]} (carry them in another run)"
  exit 3
fi
if ! (cd "$STAGE" && sha256sum --quiet -c SHA256SUMS); then
  say "error: a file in $STAGE does not match SHA256SUMS (damaged in transit?); carry it again"
  exit 1
fi
stamp=$(sha256sum "$STAGE/SHA256SUMS" | cut -c1-16)
say "staged and verified in $((SECONDS - t0)) s"

check() {  # TE imports and a Linear/LayerNormLinear runs, BF16 and FP8 (TE's own kernels)
  PYTHONPATH=$SITE:${PYTHONPATH:-} "$PY" - <<'EOF'
import time, torch
t = time.time()
import transformer_engine as te_pkg
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import Float8CurrentScaling
torch.manual_seed(0)
x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for layer in (te.Linear(512, 256), te.LayerNormLinear(512, 256, normalization="RMSNorm")):
    layer = layer.cuda().to(torch.bfloat16)
    y = layer(x)
    y.float().square().sum().backward()
    with te.fp8_autocast(enabled=True, fp8_recipe=Float8CurrentScaling()):
        y8 = layer(x)
    y8.float().sum().backward()
    err = ((y8.float() - y.float()).norm() / y.float().norm()).item()
    assert torch.isfinite(y).all() and 0 < err < 0.1, (type(layer).__name__, err)
torch.cuda.synchronize()
print(f"te_setup: TransformerEngine {te_pkg.__version__} runs on {torch.cuda.get_device_name()}"
      f" (Linear, LayerNormLinear; BF16 and FP8, rel. diff {err:.4f}) in {time.time() - t:.1f} s")
EOF
}

# 3. installed already on this node?
if [[ -f $SITE/.ufp4-te && $(cat "$SITE/.ufp4-te") == "$stamp" ]]; then
  say "$SITE holds this TransformerEngine already"
  check || { say "error: the installed TransformerEngine does not run; rm -rf $SITE and run again"; exit 1; }
  exit 0
fi

# 4. the wheels (TE, its core library, pydantic) and the build's headers
rm -rf "$SITE"
t1=$SECONDS
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STAGE"/*.whl \
  || { say "error: pip could not install the wheels of $STAGE"; exit 1; }
mkdir -p "$SITE/.build/include"
for h in "$STAGE"/nvidia_cudnn_frontend-*-include.tar.gz; do
  tar -xzf "$h" -C "$SITE/.build" || { say "error: cannot unpack $h"; exit 1; }
done
say "wheels installed in $((SECONDS - t1)) s"

# 5. build transformer-engine-torch against this torch (once per node)
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
[[ -n $nvcc ]] || { say "error: nvcc not found (needed for the CUDA headers)"; exit 1; }
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}
roots=$("$PY" -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null)
incs=$(find $roots -maxdepth 5 \( -name cudnn.h -o -name nccl.h \) -printf '%h\n' 2>/dev/null | sort -u)
for h in cudnn.h nccl.h; do
  grep -q . <<<"$(for d in $incs; do [[ -f $d/$h ]] && echo "$d"; done)" \
    || { say "error: $h not found in the nvidia wheels ($roots)"; exit 1; }
done
cpath="$SITE/.build/include"
for d in $incs; do cpath+=":$d"; done
ep="$SITE/transformer_engine/wheel_lib/nccl_ep/include"
if [[ -d $ep ]]; then cpath+=":$ep"; else export NVTE_WITH_NCCL_EP=0; fi
export CPATH=$cpath${CPATH:+:$CPATH}
export NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-16} NVTE_CUDA_ARCHS=${NVTE_CUDA_ARCHS:-90}
t2=$SECONDS
say "building transformer-engine-torch (MAX_JOBS=$MAX_JOBS, log $LOG) ..."
# into its own folder, then merged: pip --target --upgrade replaces a top-level folder it
# installs whole, which would drop the transformer_engine/ of the wheels above
built=$SITE.torch
rm -rf "$built"
if ! "$PY" -m pip install -v --no-index --no-deps --no-build-isolation --no-compile \
    --target "$built" "$STAGE"/transformer_engine_torch-*.tar.gz > "$LOG" 2>&1; then
  tail -40 "$LOG"
  say "error: the extension build failed after $((SECONDS - t2)) s (log: $LOG)"
  exit 1
fi
say "the build added: $(cd "$built" && echo *)"
cp -a "$built"/. "$SITE"/ && rm -rf "$built"
say "extension built in $((SECONDS - t2)) s"

# 6. check, then mark the node
if ! check; then
  say "error: TransformerEngine does not run on this node. If it was the sm_90-only core wheel"
  say "       (scripts/te_wheels.py without --full), carry the published one: te_wheels.py --full"
  exit 1
fi
echo "$stamp" > "$SITE/.ufp4-te"
say "done in $((SECONDS - t0)) s: export PYTHONPATH=$SITE:\$PYTHONPATH"
