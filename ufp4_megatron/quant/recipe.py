"""Recipes: which operand of which GEMM is quantized, how, and where the RHT applies.

A linear layer Y = X W^T (X: tokens x K, W: N x K) runs three GEMMs:

    fprop  Y  = X  W^T   operands x, w   reduction dim K  (x row-wise,  w row-wise)
    dgrad  dX = dY W     operands dy, w  reduction dim N  (dy row-wise, w column-wise)
    wgrad  dW = dY^T X   operands dy, x  reduction dim M  (dy and x column-wise)

Each operand is quantized along its GEMM's reduction dim, from the high-precision tensor
(never from another quantized copy). A Recipe is a frozen value that states these facts
once (reduction_dim, Recipe.operands / uses_sr / shard_unit); the presets below are written
out in full (PRESETS), `get_recipe(name, **overrides)` edits one, and the paper's ablations
are named overrides beside them (ABLATIONS). Nothing here reads the environment or holds
mutable state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..numerics.checks import check_bool, check_seed
from ..numerics.grids import Grid, codebook_levels, get_grid
from ..numerics.hadamard import RHT
from ..numerics.hadamard import SIZES as RHT_SIZES
from ..numerics.quantize import OperandFormat
from ..numerics.scaling import SCALE_MODES

GEMMS = ("fprop", "dgrad", "wgrad")
OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}
OPERAND_NAMES = ("x", "w", "dy")
# (GEMM, operand) -> the dim of the operand's natural layout (x: tokens x K, w: N x K,
# dy: tokens x N) along which that GEMM reduces: the one statement of it that ops, the
# experts' GEMMs, the training probes and the mechanism report read (reduction_dim).
REDUCTION_DIM = {
    ("fprop", "x"): 1,
    ("fprop", "w"): 1,
    ("dgrad", "dy"): 1,
    ("dgrad", "w"): 0,
    ("wgrad", "dy"): 0,
    ("wgrad", "x"): 0,
}
ROUNDINGS = ("rtne", "sr")


@dataclass(frozen=True, kw_only=True)
class OperandSpec:
    """How one GEMM operand is quantized.

    grid:     element grid name ("e2m1", "e1m2", "int4", "int4_asym") or a custom codebook
              given as a tuple of non-negative sorted levels (sign-symmetric).
    block:    block length along the GEMM's reduction dim (1 x block blocks).
    block_2d: square block x block tiles (weights only, NVFP4 style): one scale serves both
              fprop and dgrad layouts.
    scale:    "fp32" (s = amax / g_max, the paper), "e4m3" (NVFP4: E4M3 block scale times an
              FP32 per-tensor scale) or "e8m0" (MX: power-of-two scale).
    rounding: "rtne" (nearest level, ties to the even code) or "sr" (stochastic, unbiased).
    """

    grid: str | tuple[float, ...] = "e1m2"
    block: int = 16
    block_2d: bool = False
    scale: str = "fp32"
    rounding: str = "rtne"

    def __post_init__(self) -> None:
        check_operand_fields(self.grid, self.block, self.scale, self.rounding)
        check_bool(self.block_2d, "block_2d")
        if not isinstance(self.grid, (str, Grid)):  # a list (e.g. from YAML) -> hashable tuple
            object.__setattr__(self, "grid", codebook_levels(self.grid))

    def format(self, rht: RHT | None = None) -> OperandFormat:
        """The operand's format as a QDQ call takes it (numerics.quantize.OperandFormat): this
        spec, the GEMM's RHT (shared by both operands, so the GemmSpec's, not the operand's)
        and the padding kept (zeros add nothing to the product). The one place an
        OperandSpec becomes the reference's and the kernels' arguments."""
        return OperandFormat(
            self.grid,
            block=self.block,
            block_2d=self.block_2d,
            scale=self.scale,
            rounding=self.rounding,
            rht=rht,
            keep_padding=True,
        )


def check_operand_fields(grid, block, scale: str, rounding: str) -> None:
    """Clear errors, listing the valid choices, for an operand's quantization settings."""
    get_grid(grid)  # validates names and codebooks
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if scale not in SCALE_MODES:
        raise ValueError(f"unknown scale mode {scale!r}; valid: {', '.join(SCALE_MODES)}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")


@dataclass(frozen=True, kw_only=True)
class GemmSpec:
    """One GEMM: its operands by name (None: left in high precision) and its RHT.

    fprop takes x and w, dgrad dy and w, wgrad dy and x (OPERANDS); an operand the GEMM does
    not have stays None (Recipe checks it).
    rht: size of the random Hadamard transform applied blockwise along the reduction dim to
         both operands (they cancel inside the product), or None for no rotation.
    """

    x: OperandSpec | None = None
    w: OperandSpec | None = None
    dy: OperandSpec | None = None
    rht: int | None = None

    def __post_init__(self) -> None:
        for name in OPERAND_NAMES:
            op = getattr(self, name)
            if op is not None and not isinstance(op, OperandSpec):
                raise ValueError(
                    f"GemmSpec.{name} must be an OperandSpec or None (high precision), got {op!r}"
                )
        if self.rht is not None and (
            isinstance(self.rht, bool) or not isinstance(self.rht, int) or self.rht not in RHT_SIZES
        ):
            raise ValueError(f"rht size must be one of 16, 32, 64, 128 or None, got {self.rht!r}")

    @property
    def quantized_operands(self) -> tuple[OperandSpec, ...]:
        return tuple(op for name in OPERAND_NAMES if (op := getattr(self, name)) is not None)

    @property
    def uses_sr(self) -> bool:
        return any(op.rounding == "sr" for op in self.quantized_operands)

    @property
    def unit(self) -> int:
        """The length along the reduction dim that keeps both operands' blocks, the RHT groups
        and, under SR, the Philox words (4 values) whole."""
        unit = self.rht or 1
        for op in self.quantized_operands:
            unit = math.lcm(unit, op.block, 4 if op.rounding == "sr" else 1)
        return unit


def reduction_dim(gemm: str, operand: str) -> int:
    """The dim of `operand`'s natural 2D layout (x: tokens x K, w: N x K, dy: tokens x N)
    along which `gemm` reduces, so along which it is quantized: 1 for its columns, 0 for its
    rows (the operand is then quantized as its transpose)."""
    try:
        return REDUCTION_DIM[gemm, operand]
    except KeyError:
        raise ValueError(
            f"{gemm} has no operand {operand!r}; operands: "
            f"{', '.join(f'{g}: {OPERANDS[g]}' for g in GEMMS)}"
        ) from None


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A full precision recipe for the three GEMMs of every quantized linear layer.

    rht_seed: seed of the RHT sign vector (one fixed vector per run, equal on all ranks).
    """

    name: str
    fprop: GemmSpec | None = None
    dgrad: GemmSpec | None = None
    wgrad: GemmSpec | None = None
    rht_seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"recipe name must be a string, got {self.name!r}")
        for g in GEMMS:
            spec = getattr(self, g)
            if spec is None:
                continue
            if not isinstance(spec, GemmSpec):
                raise ValueError(
                    f"Recipe.{g} must be a GemmSpec or None (high precision), got {spec!r}"
                )
            for name in OPERAND_NAMES:
                if name not in OPERANDS[g] and getattr(spec, name) is not None:
                    raise ValueError(
                        f"Recipe.{g} has no operand {name!r} (its operands are "
                        f"{', '.join(OPERANDS[g])}); leave GemmSpec.{name} None"
                    )
        check_seed(self.rht_seed, "rht_seed")

    @property
    def quantized(self) -> bool:
        return any(getattr(self, g) is not None for g in GEMMS)

    @property
    def uses_sr(self) -> bool:
        """Whether any operand rounds stochastically (only then does a call need a seed)."""
        return any(spec.uses_sr for g in GEMMS if (spec := getattr(self, g)) is not None)

    @property
    def shard_unit(self) -> int:
        """Smallest tensor-parallel shard width that keeps every GEMM's blocks, RHT groups and
        Philox words whole (GemmSpec.unit of every quantized GEMM)."""
        return math.lcm(*(spec.unit for g in GEMMS if (spec := getattr(self, g)) is not None))

    def operand(self, gemm: str, name: str) -> OperandSpec | None:
        """How operand `name` of `gemm` is quantized; None when it stays in high precision."""
        reduction_dim(gemm, name)  # a clear error for a name the GEMM does not have
        spec: GemmSpec | None = getattr(self, gemm)
        return None if spec is None else getattr(spec, name)

    def operands(self, gemm: str) -> tuple[tuple[str, OperandSpec | None], ...]:
        """(name, spec) of `gemm`'s two operands, in OPERANDS order (the SR key's operand
        index); spec None where it stays in high precision."""
        return tuple((name, self.operand(gemm, name)) for name in OPERANDS[gemm])

    def describe(self) -> str:
        """One line per GEMM, for logs and reports."""
        lines = [f"recipe {self.name}:"]
        for g in GEMMS:
            spec = getattr(self, g)
            if spec is None:
                lines.append(f"  {g}: high precision")
                continue
            parts = []
            for op_name, op in self.operands(g):
                if op is None:
                    parts.append(f"{op_name}=bf16")
                else:
                    shape = f"{op.block}x{op.block}" if op.block_2d else f"1x{op.block}"
                    grid = op.grid if isinstance(op.grid, str) else "custom"
                    parts.append(f"{op_name}={grid}/{shape}/{op.scale}/{op.rounding}")
            lines.append(f"  {g}: {' '.join(parts)} rht={spec.rht or 'off'}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- presets
# Each preset written out in full: every GEMM's operands (grid, block, scale, rounding) and
# RHT. The precision YAMLs (configs/precision/) name one of these and state only what they
# change (tests/train/test_precision_configs.py pins them).

# High-precision reference: no GEMM quantized (BF16 on GPU, FP32 on CPU).
BF16 = Recipe(name="bf16", fprop=None, dgrad=None, wgrad=None, rht_seed=0)

# The paper's E2M1 baseline (Table 1): E2M1, 1x16 blocks, FP32 scales, RHT16 on wgrad only,
# SR on dY.
_E2M1 = OperandSpec(grid="e2m1", block=16, scale="fp32", rounding="rtne")
_E2M1_SR = OperandSpec(grid="e2m1", block=16, scale="fp32", rounding="sr")
E2M1 = Recipe(
    name="e2m1",
    rht_seed=0,
    fprop=GemmSpec(x=_E2M1, w=_E2M1, rht=None),
    dgrad=GemmSpec(dy=_E2M1_SR, w=_E2M1, rht=None),
    wgrad=GemmSpec(dy=_E2M1_SR, x=_E2M1, rht=16),
)

# UFP4 (Table 1): uniform E1M2 grid, 1x16 blocks, FP32 scales, RHT16 on all three GEMMs, SR
# on dY only.
_E1M2 = OperandSpec(grid="e1m2", block=16, scale="fp32", rounding="rtne")
_E1M2_SR = OperandSpec(grid="e1m2", block=16, scale="fp32", rounding="sr")
UFP4 = Recipe(
    name="ufp4",
    rht_seed=0,
    fprop=GemmSpec(x=_E1M2, w=_E1M2, rht=16),
    dgrad=GemmSpec(dy=_E1M2_SR, w=_E1M2, rht=16),
    wgrad=GemmSpec(dy=_E1M2_SR, x=_E1M2, rht=16),
)

# UFP4 on the symmetric INT4 grid {0..7}: the same grid as E1M2 up to scale (paper).
_INT4 = OperandSpec(grid="int4", block=16, scale="fp32", rounding="rtne")
_INT4_SR = OperandSpec(grid="int4", block=16, scale="fp32", rounding="sr")
UFP4_INT4 = Recipe(
    name="ufp4_int4",
    rht_seed=0,
    fprop=GemmSpec(x=_INT4, w=_INT4, rht=16),
    dgrad=GemmSpec(dy=_INT4_SR, w=_INT4, rht=16),
    wgrad=GemmSpec(dy=_INT4_SR, x=_INT4, rht=16),
)

# NVIDIA NVFP4 (arXiv 2509.25149): E2M1 with an E4M3 block scale x FP32 tensor scale, 16x16
# weight tiles (one scale serves fprop and dgrad), RHT16 on wgrad only, SR on gradients.
_NV = OperandSpec(grid="e2m1", block=16, scale="e4m3", rounding="rtne")
_NV_SR = OperandSpec(grid="e2m1", block=16, scale="e4m3", rounding="sr")
_NV_W = OperandSpec(grid="e2m1", block=16, block_2d=True, scale="e4m3", rounding="rtne")
NVFP4 = Recipe(
    name="nvfp4",
    rht_seed=0,
    fprop=GemmSpec(x=_NV, w=_NV_W, rht=None),
    dgrad=GemmSpec(dy=_NV_SR, w=_NV_W, rht=None),
    wgrad=GemmSpec(dy=_NV_SR, x=_NV, rht=16),
)

# OCP MXFP4 (decision): E2M1 with 1x32 power-of-two (E8M0) scales, in the E2M1 baseline's
# structure (RHT16 on wgrad, SR on dY), so only the format differs from `e2m1`.
_MX = OperandSpec(grid="e2m1", block=32, scale="e8m0", rounding="rtne")
_MX_SR = OperandSpec(grid="e2m1", block=32, scale="e8m0", rounding="sr")
MXFP4 = Recipe(
    name="mxfp4",
    rht_seed=0,
    fprop=GemmSpec(x=_MX, w=_MX, rht=None),
    dgrad=GemmSpec(dy=_MX_SR, w=_MX, rht=None),
    wgrad=GemmSpec(dy=_MX_SR, x=_MX, rht=16),
)

PRESETS: Mapping[str, Recipe] = MappingProxyType(
    {r.name: r for r in (BF16, E2M1, UFP4, UFP4_INT4, NVFP4, MXFP4)}
)

# The paper's ablations (Dense 1.5B, Section "Ablation"): UFP4 with the RHT on fewer GEMMs, or
# without SR on dY. Each is a named set of get_recipe overrides of ABLATION_PRESET; a run of
# one is named after it (`precision.name`, train/precision.py gives its command line).
ABLATION_PRESET = "ufp4"
ABLATIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "ufp4_rht_none": {"rht": ()},
        "ufp4_rht_wgrad": {"rht": ("wgrad",)},
        "ufp4_rht_dgrad_wgrad": {"rht": ("dgrad", "wgrad")},
        "ufp4_rht_fprop_wgrad": {"rht": ("fprop", "wgrad")},
        "ufp4_no_sr": {"sr": ()},
    }
)


def ablation(name: str) -> Recipe:
    """The recipe of a named ablation: ABLATION_PRESET with its overrides."""
    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}; valid: {', '.join(ABLATIONS)}")
    return get_recipe(ABLATION_PRESET, **ABLATIONS[name])


def list_recipes() -> list[str]:
    return list(PRESETS)


def get_recipe(name: str | Recipe, **overrides: Any) -> Recipe:
    """A preset by name, with overrides for ablations.

    Shorthand keys apply to every quantized operand:
        grid, block, scale, block_2d   e.g. grid="int4", block=32
        rht: bool | size | iterable of GEMM names   e.g. rht=("fprop", "wgrad")
        rht_size: int                  size of every enabled RHT
        sr: iterable of operand names  e.g. sr=("dy", "x"); sr=() for RTNE everywhere
        rht_seed: int
    Dotted keys reach one field, e.g. **{"fprop.x.grid": "e2m1", "dgrad.rht": None,
    "wgrad": None} (None for a GEMM leaves it in high precision).
    """
    if isinstance(name, Recipe):
        recipe = name
    else:
        if name not in PRESETS:
            raise ValueError(f"unknown recipe {name!r}; valid: {', '.join(PRESETS)}")
        recipe = PRESETS[name]
    return apply_overrides(recipe, overrides)


def apply_overrides(recipe: Recipe, overrides: Mapping[str, Any]) -> Recipe:
    if not overrides:
        return recipe
    known = {"grid", "block", "scale", "block_2d", "rht", "rht_size", "sr", "rht_seed", "name"}
    shorthand = {k: v for k, v in overrides.items() if "." not in k and k in known}
    dotted = {k: v for k, v in overrides.items() if k not in shorthand}
    for key in dotted:
        head = key.split(".")[0]
        if head not in GEMMS:
            raise ValueError(
                f"unknown recipe override {key!r}; valid: {', '.join(sorted(known))}, or a "
                f"dotted path such as 'fprop.x.grid', 'wgrad.rht', 'dgrad' (GEMMs: {GEMMS})"
            )

    gemms = {g: getattr(recipe, g) for g in GEMMS}
    top = {k: shorthand[k] for k in ("rht_seed", "name") if k in shorthand}
    op_fields = {k: shorthand[k] for k in ("grid", "block", "scale", "block_2d") if k in shorthand}

    for g, spec in gemms.items():
        if spec is None:
            continue
        ops = {}
        for op_name, op in recipe.operands(g):
            if op is not None:
                changes = dict(op_fields)
                if "sr" in shorthand:
                    changes["rounding"] = "sr" if op_name in _names(shorthand["sr"]) else "rtne"
                op = dataclasses.replace(op, **changes)
            ops[op_name] = op
        rht = spec.rht
        if "rht" in shorthand:
            rht = _rht_for(g, shorthand["rht"], shorthand.get("rht_size", spec.rht or 16))
        elif "rht_size" in shorthand and rht is not None:
            rht = shorthand["rht_size"]
        gemms[g] = GemmSpec(**ops, rht=rht)

    for key, value in dotted.items():
        parts = key.split(".")
        g = parts[0]
        if len(parts) == 1:
            gemms[g] = value if value is None or isinstance(value, GemmSpec) else _bad(key, value)
            continue
        spec = gemms[g]
        if spec is None:
            raise ValueError(f"override {key!r}: GEMM {g!r} is not quantized in this recipe")
        if len(parts) == 2 and parts[1] == "rht":
            gemms[g] = _replaced(key, value, spec, rht=_rht_for(g, value, spec.rht or 16))
            continue
        if len(parts) != 3 or parts[1] not in OPERANDS[g]:
            raise ValueError(
                f"override {key!r}: expected '{g}.<operand>.<field>' with operand "
                f"in {OPERANDS[g]} or '{g}.rht'"
            )
        slot = parts[1]
        op = getattr(spec, slot)
        if op is None:
            raise ValueError(f"override {key!r}: operand {parts[1]!r} of {g} is not quantized")
        fields = {f.name for f in dataclasses.fields(OperandSpec)}
        if parts[2] not in fields:
            raise ValueError(
                f"override {key!r}: unknown field {parts[2]!r}; valid: {sorted(fields)}"
            )
        gemms[g] = dataclasses.replace(
            spec, **{slot: _replaced(key, value, op, **{parts[2]: value})}
        )
    return dataclasses.replace(recipe, **gemms, **top)


def _replaced(key: str, value, obj, **changes):
    """dataclasses.replace, its ValueError naming the override that caused it."""
    try:
        return dataclasses.replace(obj, **changes)
    except ValueError as e:
        raise ValueError(f"override {key}={value!r}: {e}") from None


def _names(value: Iterable[str] | str | bool) -> set[str]:
    if value is True:
        return {"x", "w", "dy"}
    if value is False or value is None:
        return set()
    names = (
        {value}
        if isinstance(value, str)
        else _as_set(value, "sr", "True, False or a tuple of operand names (x, w, dy)")
    )
    bad = names - {"x", "w", "dy"}
    if bad:
        raise ValueError(f"unknown operand(s) {sorted(bad)}; valid: x, w, dy")
    return names


def _rht_for(gemm: str, value, size: int) -> int | None:
    if value is None or value is False:
        return None
    if value is True:
        return size
    if isinstance(value, int):
        return value
    names = (
        {value}
        if isinstance(value, str)
        else _as_set(value, "rht", "True, False, a size (16, 32, 64, 128) or a tuple of GEMM names")
    )
    bad = names - set(GEMMS)
    if bad:
        raise ValueError(f"unknown GEMM(s) {sorted(bad)} in rht; valid: {', '.join(GEMMS)}")
    return size if gemm in names else None


def _as_set(value, key: str, what: str) -> set:
    try:
        names = set(value)
    except TypeError:
        raise ValueError(f"override {key}={value!r}: expected {what}") from None
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"override {key}={value!r}: expected {what}")
    return names


def _bad(key, value):
    raise ValueError(f"override {key!r} takes None or a GemmSpec, got {value!r}")
