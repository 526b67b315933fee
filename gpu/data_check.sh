#!/usr/bin/env bash
# The data path on a CUDA machine's own stack (e.g. an NGC image: Python 3.12, its tokenizers,
# tiktoken, sentencepiece). From the repo root:
#   bash gpu/data_check.sh
#   MEGATRON_LM=/path/to/Megatron-LM bash gpu/data_check.sh   # also check 2 below
# 1. data=embedded_bpe: trains the 8k BPE with the image's `tokenizers`, then 20 UFP4 steps
#    of the tiny model on CUDA with model.vocab_size=8192 (first loss near ln 8192 = 9.01).
# 2. With MEGATRON_LM (a checkout, e.g. core_r0.19.0 = f8837c04ef): Megatron-LM's own
#    tools/preprocess_data.py (megatron.training imports on 3.12) and our prepare_data on the
#    same JSONL, with TikTokenizer and NullTokenizer: .bin and .idx must be byte-identical.
# Writes to OUT (default runs/gpu/data_check): $OUT/data_check.md and one log per step; about
# 2 minutes on an H200. Exit 1 if a check fails.
set -uo pipefail
# the trainer's dependencies (hydra, megatron-core, wandb), from the wheelhouse where the
# node's image lacks them
source gpu/setup.sh || exit 1
OUT=${OUT:-runs/gpu/data_check}
mkdir -p "$OUT"
W=$(mktemp -d)
PY=${PYTHON:-python3}
status=0
table="| check | result | detail |
| --- | --- | --- |"
row() { table+=$'\n'"| $1 | $2 | $3 |"; [[ $2 == ok* || $2 == skipped ]] || status=1; }
STEPS=${STEPS:-20}

# 1. the embedded corpus with its trained BPE, on CUDA
t0=$SECONDS
if $PY -m ufp4_megatron.train model=tiny data=embedded_bpe model.vocab_size=8192 precision=ufp4 \
    train.steps=$STEPS train.seq_len=256 train.global_batch=8 logging.wandb.mode=disabled \
    logging.progress=plain "data.cache_dir=$W/cache" \
    "hydra.run.dir=$W/run" >"$OUT/embedded_bpe.log" 2>&1; then
  detail=$($PY - "$W" <<'EOF'
import json, math, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/run/metrics.jsonl")]
print(f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} (ln 8192 = {math.log(8192):.3f})")
EOF
)
  row "data=embedded_bpe, $STEPS steps" "ok ($((SECONDS - t0)) s)" "$detail"
else
  row "data=embedded_bpe, $STEPS steps" "FAILED" "$(tail -1 "$OUT/embedded_bpe.log")"
fi

# 2. byte-identical to Megatron-LM's preprocess_data.py
if [[ -n ${MEGATRON_LM:-} && -f ${MEGATRON_LM}/tools/preprocess_data.py ]]; then
  $PY - "$W" <<'EOF'
import base64, json, sys
from ufp4_megatron.data.corpus import stdlib_documents
w = sys.argv[1]
with open(f"{w}/in.jsonl", "w") as f:
    for d in list(stdlib_documents(300_000)) + ["", "naïve ∑ end"]:
        f.write(json.dumps({"text": d}) + "\n")
with open(f"{w}/null.jsonl", "w") as f:
    for d in ("5 7 9", "60000 1", "3 4 4"):
        f.write(json.dumps({"text": d}) + "\n")
toks = [bytes([i]) for i in range(256)] + [b"th", b"he", b"the", b" t", b" the", b"in"]
json.dump([{"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("latin-1")}
           for i, t in enumerate(toks)], open(f"{w}/ranks.json", "w"))
EOF
  for case in tiktoken null; do
    if [[ $case == tiktoken ]]; then
      src=$W/in.jsonl
      theirs=(--tokenizer-type TikTokenizer --tokenizer-model "$W/ranks.json" --vocab-size 1262)
      ours=(--tokenizer tiktoken --tokenizer-path "$W/ranks.json")
    else
      src=$W/null.jsonl
      theirs=(--tokenizer-type NullTokenizer --vocab-size 70000)
      ours=(--tokenizer null-text --vocab-size 70000)
    fi
    $PY "$MEGATRON_LM/tools/preprocess_data.py" --input "$src" --output-prefix "$W/mlm_$case" \
      --append-eod --workers 1 "${theirs[@]}" >"$OUT/preprocess_$case.log" 2>&1
    $PY -m ufp4_megatron.cli.prepare_data "$src" --out "$W/ours_$case" "${ours[@]}" \
      >>"$OUT/preprocess_$case.log" 2>&1
    if cmp -s "$W/mlm_${case}_text_document.bin" "$W/ours_$case.bin" &&
       cmp -s "$W/mlm_${case}_text_document.idx" "$W/ours_$case.idx"; then
      row "preprocess_data.py vs prepare_data ($case)" "ok" \
        "$(stat -c %s "$W/ours_$case.bin") + $(stat -c %s "$W/ours_$case.idx") bytes identical"
    else
      why=$(grep -m1 -E "Error|error:" "$OUT/preprocess_$case.log" || echo "files differ")
      row "preprocess_data.py vs prepare_data ($case)" "FAILED" "${why//|/ }"
    fi
  done
else
  row "preprocess_data.py vs prepare_data" "skipped" "set MEGATRON_LM to a Megatron-LM checkout"
fi

echo "$table" | tee "$OUT/data_check.md"
rm -rf "$W"
exit $status
