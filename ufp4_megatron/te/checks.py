"""What the TransformerEngine route refuses, as plain functions of values (tested on CPU).

The factories check the recipe when they are resolved (check_recipe); the quantizers check the
TE version and the parallel layout when TE first asks for one (quantizers._check_environment).
"""

from __future__ import annotations

from ..quant.recipe import OPERANDS, Recipe

TE_MIN_VERSION = (2, 19)  # IdentityQuantizer/HybridQuantizer and the dequantize GEMM fallback


def check_recipe(recipe: Recipe) -> None:
    """Refuse what the TransformerEngine route cannot run as the local route does."""
    for gemm in ("fprop", "dgrad"):
        spec = getattr(recipe, gemm)
        if spec is not None and spec.w is not None and spec.w.rounding == "sr":
            raise ValueError(
                f"recipe {recipe.name!r} rounds the weight stochastically ({gemm}.w): TE "
                "quantizes a weight once per step and reuses it for every micro-batch, where "
                "the local route draws per micro-batch; use the --spec route for it"
            )


def check_te_version(version: str) -> None:
    """Refuse TransformerEngine before 2.19: its custom-recipe GEMM (qgemm) ignores `out` and
    `accumulate`, so with Megatron's gradient-accumulation fusion the weight gradient written
    into main_grad would be silently lost; 2.19 added the dequantize fallback used here."""
    parts = []
    for p in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) < TE_MIN_VERSION:
        raise ValueError(
            f"ufp4_megatron.te needs TransformerEngine >= {'.'.join(map(str, TE_MIN_VERSION))} "
            f"(found {version}): earlier custom recipes drop the weight gradient under "
            "gradient-accumulation fusion; upgrade TE (gpu/te_setup.sh installs 2.20.2) or "
            "use the --spec route"
        )


def check_parallel(recipe: Recipe, tp: int) -> None:
    """Refuse tensor parallelism with stochastic rounding: a TE quantizer is not told where its
    shard sits in the full tensor, so SR bits could not be keyed by global position (the local
    route's TP invariance) and shards of one tensor would share bits."""
    if tp > 1 and recipe.uses_sr:
        sr = sorted(
            {
                f"{g}.{o}"
                for g in OPERANDS
                if getattr(recipe, g) is not None
                for o in OPERANDS[g]
                if (op := recipe.operand(g, o)) is not None and op.rounding == "sr"
            }
        )
        raise ValueError(
            f"ufp4_megatron.te: tensor parallelism (TP={tp}) with recipe {recipe.name!r}, which "
            f"rounds {', '.join(sr)} stochastically: TE's quantizers do not know a shard's "
            "offset, so SR would not match TP=1; use TP=1 (data, pipeline and expert "
            "parallelism are fine) or the --spec route for TP > 1"
        )
