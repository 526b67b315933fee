"""Megatron-LM's UFP4 flags (patches/0001): `--fp4-recipe ufp4 --fp4-format e1m2` and knobs.

The patch declares the flags in megatron/training/arguments.py and calls this module twice:
    validate_args(args)        -> validate_ufp4_args(args): every check, naming the flag to
                                  change; the patch then moves the format to args.ufp4_format
                                  and clears args.fp4, so Megatron's Transformer Engine FP4 code
                                  paths (autocast, FP4 recompute, padding) stay off
    gpt_config_from_args(args) -> layer_spec_from_args(args): the spec builder that Megatron-LM's
                                  GPTModelBuilder calls, as for --spec (spec.ufp4_gpt_spec)
Each --fp4-format starts from the preset of the --spec route, so both routes build the same
model for the same recipe:
    e1m2 -> ufp4       int4 -> ufp4_int4       e2m1 -> e2m1 (the paper's baseline: RHT on wgrad)
and --fp4-block / --fp4-rht / --no-fp4-sr-dy override it (the paper's ablations).
Only plain values are stored in args: Megatron-LM saves args in its checkpoints and loads them
with torch.load(weights_only=True).
"""

from __future__ import annotations

import functools
import os

from ..quant.recipe import GEMMS, Recipe, apply_overrides, get_recipe

FORMAT_PRESET = {"e1m2": "ufp4", "int4": "ufp4_int4", "e2m1": "e2m1"}


def recipe_from_flags(
    fp4_format: str,
    *,
    block: int | None = None,
    rht: list[str] | None = None,
    sr_dy: bool | None = None,
) -> Recipe:
    """The recipe of `--fp4-format F [--fp4-block N] [--fp4-rht G ...] [--no-fp4-sr-dy]`."""
    if fp4_format not in FORMAT_PRESET:
        raise ValueError(
            f"--fp4-format {fp4_format}: --fp4-recipe ufp4 takes {', '.join(FORMAT_PRESET)}"
        )
    overrides, tags = {}, []
    if block is not None:
        if not isinstance(block, int) or block < 1:
            raise ValueError(
                f"--fp4-block {block}: a block length is a positive integer (the paper's is 16)"
            )
        overrides["block"] = block
        tags.append(f"block={block}")
    if rht is not None:
        rht = list(rht)
        if (
            len(set(rht)) != len(rht)
            or ("none" in rht and len(rht) > 1)
            or (set(rht) - {"none", *GEMMS})
        ):
            raise ValueError(
                f"--fp4-rht {' '.join(rht)}: give distinct GEMMs from "
                f"{', '.join(GEMMS)}, or 'none' alone"
            )
        overrides["rht"] = () if rht == ["none"] else tuple(rht)
        tags.append("rht=" + "+".join(rht))
    if sr_dy is False:
        overrides["sr"] = ()
        tags.append("sr=off")
    preset = FORMAT_PRESET[fp4_format]
    if not overrides:
        return get_recipe(preset)
    return apply_overrides(get_recipe(preset), {"name": f"{preset}[{','.join(tags)}]", **overrides})


def recipe_from_args(args) -> Recipe:
    """After validation (patches/0001 moved --fp4-format to args.ufp4_format)."""
    fp4_format = getattr(args, "ufp4_format", None) or args.fp4
    return recipe_from_flags(
        fp4_format, block=args.fp4_block, rht=args.fp4_rht, sr_dy=args.fp4_sr_dy
    )


def validate_ufp4_args(args) -> str:
    """Checks a parsed `--fp4-recipe ufp4` command line; returns its --fp4-format."""
    fp4_format = args.fp4
    if not fp4_format:
        raise ValueError(
            "--fp4-recipe ufp4 needs --fp4-format: e1m2 (UFP4), int4 (the same "
            "grid as integers) or e2m1 (the paper's E2M1 baseline)"
        )
    if args.fp8:
        raise ValueError("--fp4-recipe ufp4 and --fp8-format cannot be combined; choose one")
    if args.fp4_param_gather:
        raise ValueError(
            "--fp4-param-gather is not supported with --fp4-recipe ufp4: UFP4 "
            "keeps its weights in high precision; drop the flag"
        )
    if args.spec is not None:
        raise ValueError(
            f"--fp4-recipe ufp4 builds its own layer spec (Megatron-LM's default "
            f"spec with UFP4 linears), so --spec {' '.join(args.spec)} would be "
            "ignored: drop --spec, or drop the --fp4-* flags and use --spec "
            "ufp4_megatron.megatron.spec ufp4_gpt_spec with UFP4_RECIPE"
        )
    if os.environ.get("UFP4_RECIPE"):
        raise ValueError(
            f"UFP4_RECIPE={os.environ['UFP4_RECIPE']} is set, but --fp4-recipe ufp4 "
            "takes its recipe from the --fp4-* flags: unset UFP4_RECIPE (it is "
            "for the --spec route)"
        )
    if args.transformer_impl not in ("local", "transformer_engine"):
        raise ValueError(
            f"--fp4-recipe ufp4 with --transformer-impl {args.transformer_impl}: "
            "UFP4 rewrites the local or transformer_engine spec; pass "
            "--transformer-impl local"
        )
    if args.transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import HAVE_TE

        if not HAVE_TE:
            raise ValueError(
                "--fp4-recipe ufp4 with --transformer-impl transformer_engine "
                "needs TransformerEngine, which is not installed: pass "
                "--transformer-impl local (UFP4 runs without TE)"
            )
    recipe_from_flags(fp4_format, block=args.fp4_block, rht=args.fp4_rht, sr_dy=args.fp4_sr_dy)
    return fp4_format


def layer_spec_from_args(args):
    """What gpt_config_from_args puts in GPTModelConfig.transformer_layer_spec."""
    from .spec import ufp4_gpt_spec

    return functools.partial(ufp4_gpt_spec, recipe=recipe_from_args(args))
