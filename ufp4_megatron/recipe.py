"""Recipes: which operand of which GEMM is quantized, how, and where the RHT applies.

A linear layer Y = X W^T (X: tokens x K, W: N x K) runs three GEMMs:

    fprop  Y  = X  W^T   operands x, w   reduction dim K  (x row-wise,  w row-wise)
    dgrad  dX = dY W     operands dy, w  reduction dim N  (dy row-wise, w column-wise)
    wgrad  dW = dY^T X   operands dy, x  reduction dim M  (dy and x column-wise)

Each operand is quantized along its GEMM's reduction dim, from the high-precision tensor
(never from another quantized copy). A Recipe is a frozen value; presets are built by
`get_recipe(name, **overrides)`. Nothing here reads the environment or holds global state.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .numerics.checks import check_bool, check_seed
from .numerics.grids import GRIDS, Grid, codebook_levels, get_grid
from .numerics.hadamard import SIZES as RHT_SIZES
from .numerics.scaling import SCALE_MODES

GEMMS = ("fprop", "dgrad", "wgrad")
OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}
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
    """One GEMM: its two operands (None: left in high precision) and its RHT.

    rht: size of the random Hadamard transform applied blockwise along the reduction dim to
         both operands (they cancel inside the product), or None for no rotation.
    """

    a: OperandSpec | None  # first operand: x (fprop) or dy (dgrad, wgrad)
    b: OperandSpec | None  # second operand: w (fprop, dgrad) or x (wgrad)
    rht: int | None = None

    def __post_init__(self) -> None:
        for slot in ("a", "b"):
            op = getattr(self, slot)
            if op is not None and not isinstance(op, OperandSpec):
                raise ValueError(f"GemmSpec.{slot} must be an OperandSpec or None (high "
                                 f"precision), got {op!r}")
        if self.rht is not None and (isinstance(self.rht, bool) or not isinstance(self.rht, int)
                                     or self.rht not in RHT_SIZES):
            raise ValueError(f"rht size must be one of 16, 32, 64, 128 or None, got {self.rht!r}")


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
            if spec is not None and not isinstance(spec, GemmSpec):
                raise ValueError(f"Recipe.{g} must be a GemmSpec or None (high precision), "
                                 f"got {spec!r}")
        check_seed(self.rht_seed, "rht_seed")

    @property
    def quantized(self) -> bool:
        return any(getattr(self, g) is not None for g in GEMMS)

    def operand(self, gemm: str, name: str) -> OperandSpec | None:
        spec: GemmSpec | None = getattr(self, gemm)
        if spec is None:
            return None
        return spec.a if OPERANDS[gemm][0] == name else spec.b

    def describe(self) -> str:
        """One line per GEMM, for logs and reports."""
        lines = [f"recipe {self.name}:"]
        for g in GEMMS:
            spec = getattr(self, g)
            if spec is None:
                lines.append(f"  {g}: high precision")
                continue
            parts = []
            for op_name, op in zip(OPERANDS[g], (spec.a, spec.b)):
                if op is None:
                    parts.append(f"{op_name}=bf16")
                else:
                    shape = f"{op.block}x{op.block}" if op.block_2d else f"1x{op.block}"
                    grid = op.grid if isinstance(op.grid, str) else "custom"
                    parts.append(f"{op_name}={grid}/{shape}/{op.scale}/{op.rounding}")
            lines.append(f"  {g}: {' '.join(parts)} rht={spec.rht or 'off'}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- presets


def _uniform(grid, *, block=16, scale="fp32", rht_gemms=(), sr=("dy",), weight_2d=False,
             name: str) -> Recipe:
    """Same grid/block/scale on every operand; RHT on `rht_gemms`; SR on operands `sr`."""
    gemms = {}
    for g in GEMMS:
        ops = []
        for op_name in OPERANDS[g]:
            ops.append(OperandSpec(grid=grid, block=block, scale=scale,
                                   rounding="sr" if op_name in sr else "rtne",
                                   block_2d=weight_2d and op_name == "w"))
        gemms[g] = GemmSpec(a=ops[0], b=ops[1], rht=16 if g in rht_gemms else None)
    return Recipe(name=name, **gemms)


def _presets() -> dict[str, Recipe]:
    return {
        "bf16": Recipe(name="bf16"),
        # The paper's E2M1 baseline (Table 1): 1x16 FP32 scales, RHT16 on wgrad, SR on dY.
        "e2m1": _uniform("e2m1", rht_gemms=("wgrad",), name="e2m1"),
        # UFP4 (Table 1): uniform E1M2 grid, RHT16 on all three GEMMs, SR on dY only.
        "ufp4": _uniform("e1m2", rht_gemms=GEMMS, name="ufp4"),
        "ufp4_int4": _uniform("int4", rht_gemms=GEMMS, name="ufp4_int4"),
        # NVIDIA NVFP4 (arXiv 2509.25149): E4M3 block scale x FP32 tensor scale, 16x16 weight
        # tiles, RHT16 on wgrad only, SR on gradients.
        "nvfp4": _uniform("e2m1", scale="e4m3", rht_gemms=("wgrad",), weight_2d=True,
                          name="nvfp4"),
        # OCP MXFP4 (decision): E2M1 with 1x32 power-of-two scales, in the E2M1 baseline's
        # structure (RHT16 on wgrad, SR on dY), so only the format differs from `e2m1`.
        "mxfp4": _uniform("e2m1", block=32, scale="e8m0", rht_gemms=("wgrad",), name="mxfp4"),
    }


def list_recipes() -> list[str]:
    return list(_presets())


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
        presets = _presets()
        if name not in presets:
            raise ValueError(f"unknown recipe {name!r}; valid: {', '.join(presets)}")
        recipe = presets[name]
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
                f"dotted path such as 'fprop.x.grid', 'wgrad.rht', 'dgrad' (GEMMs: {GEMMS})")

    gemms = {g: getattr(recipe, g) for g in GEMMS}
    top = {k: shorthand[k] for k in ("rht_seed", "name") if k in shorthand}
    op_fields = {k: shorthand[k] for k in ("grid", "block", "scale", "block_2d") if k in shorthand}

    for g, spec in gemms.items():
        if spec is None:
            continue
        ops = {}
        for slot, op_name in zip(("a", "b"), OPERANDS[g]):
            op = getattr(spec, slot)
            if op is not None:
                changes = dict(op_fields)
                if "sr" in shorthand:
                    changes["rounding"] = "sr" if op_name in _names(shorthand["sr"]) else "rtne"
                op = dataclasses.replace(op, **changes)
            ops[slot] = op
        rht = spec.rht
        if "rht" in shorthand:
            rht = _rht_for(g, shorthand["rht"], shorthand.get("rht_size", spec.rht or 16))
        elif "rht_size" in shorthand and rht is not None:
            rht = shorthand["rht_size"]
        gemms[g] = GemmSpec(a=ops["a"], b=ops["b"], rht=rht)

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
            gemms[g] = dataclasses.replace(spec, rht=_rht_for(g, value, spec.rht or 16))
            continue
        if len(parts) != 3 or parts[1] not in OPERANDS[g]:
            raise ValueError(f"override {key!r}: expected '{g}.<operand>.<field>' with operand "
                             f"in {OPERANDS[g]} or '{g}.rht'")
        slot = "a" if OPERANDS[g][0] == parts[1] else "b"
        op = getattr(spec, slot)
        if op is None:
            raise ValueError(f"override {key!r}: operand {parts[1]!r} of {g} is not quantized")
        fields = {f.name for f in dataclasses.fields(OperandSpec)}
        if parts[2] not in fields:
            raise ValueError(f"override {key!r}: unknown field {parts[2]!r}; valid: {sorted(fields)}")
        gemms[g] = dataclasses.replace(spec, **{slot: dataclasses.replace(op, **{parts[2]: value})})
    return dataclasses.replace(recipe, **gemms, **top)


def _names(value: Iterable[str] | str | bool) -> set[str]:
    if value is True:
        return {"x", "w", "dy"}
    if value is False or value is None:
        return set()
    names = {value} if isinstance(value, str) else _as_set(
        value, "sr", "True, False or a tuple of operand names (x, w, dy)")
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
    names = {value} if isinstance(value, str) else _as_set(
        value, "rht", "True, False, a size (16, 32, 64, 128) or a tuple of GEMM names")
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
