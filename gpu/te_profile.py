"""Where a training step's GPU time goes through TransformerEngine, beside TE BF16 and the local route.

Driver of gpu/te_check.sh (part "profile"); needs TransformerEngine >= 2.19 on PYTHONPATH
(gpu/te_setup.sh). One `python -m ufp4_megatron.bench --suite profile` per route (torch.profiler
over one steady step after 3, GPU time per kernel family and the top kernels), 2-layer
dense_1p5b at sequence 4096, micro-batch 1, vocabulary 4096, as gpu/te_steps.py times it:
    te    ufp4   model.transformer_impl=transformer_engine precision=ufp4
    te    bf16   model.transformer_impl=transformer_engine precision=bf16
    local ufp4   precision=ufp4 (the plugin's linears in Megatron's local spec)
Writes DIR/te_profile.md (each route's profile under its heading, or why it failed).

    python3 gpu/te_profile.py --out DIR [--model dense_1p5b] [--timeout 150]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from te_steps import COMMON, ROUTES, TE_IMPL
from te_steps import MODELS as STEP_MODELS

# te_steps.py's models and vocabulary; the bench's --model gives the rest of the shape
MODELS = {
    name.split()[0]: [o for o in overrides if not o.startswith("model=")]
    for name, overrides in STEP_MODELS.items()
}
VOCAB = [o for o in COMMON if o.startswith("model.vocab_size=")]


def command(model: str, route: str, recipe: str) -> list[str]:
    """The bench command of one route's profile."""
    sets = [*MODELS[model], *VOCAB, *([TE_IMPL] if route == "te" else [])]
    return [
        sys.executable,
        *("-m", "ufp4_megatron.bench", "--suite", "profile"),
        *("--model", model, "--recipe", recipe),
        *(arg for o in sets for arg in ("--set", o)),
    ]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", choices=list(MODELS), default="dense_1p5b")
    p.add_argument("--timeout", type=int, default=150, help="seconds for one route")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    parts, failed = [], 0
    for route, recipe in ROUTES:
        cmd = command(a.model, route, recipe)
        parts.append(f"## {a.model} x2, {route} route, {recipe}\n\n`{' '.join(cmd[1:])}`\n")
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            ok, text = r.returncode == 0, r.stdout if r.returncode == 0 else r.stderr[-2000:]
        except subprocess.TimeoutExpired:
            ok, text = False, f"timed out after {a.timeout} s"
        failed += not ok
        parts.append(text if ok else f"FAILED:\n\n```\n{text}\n```\n")
        print(parts[-2] + parts[-1], flush=True)
    (a.out / "te_profile.md").write_text("\n".join(parts))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
