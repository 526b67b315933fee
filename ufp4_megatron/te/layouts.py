"""What each quantized layout of a TransformerEngine linear holds: the GEMM operand it feeds.

TransformerEngine asks a quantizer for a tensor's row-wise and/or column-wise layout and its
GEMMs read one layout of each operand (transformer_engine/pytorch/module/linear.py and
cpp_extensions/gemm.py `general_gemm(A, B, layout)`: A is read row-wise when transposed ("T"),
B column-wise when transposed):

    fprop  TN  general_gemm(weight, input)        weight row-wise,  input row-wise
    dgrad  NN  general_gemm(weight, grad_output)  weight column-wise, grad_output row-wise
    wgrad  NT  general_gemm(input, grad_output)   input column-wise, grad_output column-wise

so each (tensor role, layout) is exactly one operand of one of the local route's GEMMs
(LAYOUTS), and a row-wise layout is the one quantized along the tensor's last dim
(recipe.reduction_dim == 1), a column-wise layout the one quantized along its rows.

`quantize_layout` fake-quantizes a tensor for one layout as ops._gemm_operands quantizes that
operand for its GEMM: the same OperandSpec, view (transposed for a column-wise layout), RHT
(the GEMM's size, recipe.rht_seed: identical signs on every rank), SR key (mix_seed(seed,
GEMM index, operand index), the element's position from origin (0, 0)) and output dtype, through
fake_quant.quantize_view (its OperandSpec.format), the kernels or the reference. What it returns stays in the
rotated domain of its GEMM's RHT (docs/megatron-lm.md, TransformerEngine route): TE multiplies
only the pairs above, both rotated along the same reduction dim with the same signs, so the
rotation cancels inside the product as it does in quant/ops.py.

Unlike quant/ops.py, a layout has no room for padding: TE allocates and multiplies tensors of their
own shape. A length along the reduction dim that is not a multiple of the GEMM's RHT size is refused
(rotated padding is not zero and would be dropped); other padding (to whole blocks, or whole
rotation groups of zeros, which rotate to zeros) contributes nothing to the product and is cut.

Plain PyTorch and the package's numerics: no TransformerEngine here (tests/te run it on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch

from ..numerics.hadamard import as_rht, rotated_dtype
from ..numerics.philox import mix_seed
from ..quant.fake_quant import quantize_view
from ..quant.recipe import GEMMS, OPERANDS, OperandSpec, Recipe, reduction_dim

ROWWISE, COLUMNWISE = "rowwise", "columnwise"
# TE tensor role (QuantizerRole.tensor_type of a linear) -> layout -> (GEMM, operand)
LAYOUTS = MappingProxyType(
    {
        "input": MappingProxyType({ROWWISE: ("fprop", "x"), COLUMNWISE: ("wgrad", "x")}),
        "weight": MappingProxyType({ROWWISE: ("fprop", "w"), COLUMNWISE: ("dgrad", "w")}),
        "grad_output": MappingProxyType({ROWWISE: ("dgrad", "dy"), COLUMNWISE: ("wgrad", "dy")}),
    }
)


@dataclass(frozen=True)
class LayoutPlan:
    """One layout of one tensor role under a recipe: the operand it is, how it is quantized.

    op is None where the recipe leaves this operand of a quantized GEMM in high precision
    (it is still rotated when its GEMM has an RHT, so the product stays exact); gemm_quantized
    is False where the whole GEMM stays in high precision (the tensor passes through)."""

    recipe: Recipe
    tensor_type: str
    layout: str
    gemm: str
    operand: str

    @property
    def spec(self):
        return getattr(self.recipe, self.gemm)

    @property
    def gemm_quantized(self) -> bool:
        return self.spec is not None

    @property
    def op(self) -> OperandSpec | None:
        return None if self.spec is None else getattr(self.spec, self.operand)

    @property
    def uses_sr(self) -> bool:
        return self.op is not None and self.op.rounding == "sr"

    @property
    def along_rows(self) -> bool:
        return reduction_dim(self.gemm, self.operand) == 0

    @property
    def salt(self) -> tuple[int, int]:
        """(GEMM index, operand index): what ops mixes into a call's seed for this operand."""
        return GEMMS.index(self.gemm), OPERANDS[self.gemm].index(self.operand)


def layout_plan(recipe: Recipe, tensor_type: str, layout: str) -> LayoutPlan:
    try:
        gemm, operand = LAYOUTS[tensor_type][layout]
    except KeyError:
        raise ValueError(
            f"no GEMM operand for tensor {tensor_type!r} in layout {layout!r}; "
            f"tensors: {', '.join(LAYOUTS)}; layouts: {ROWWISE}, "
            f"{COLUMNWISE}"
        ) from None
    return LayoutPlan(recipe, tensor_type, layout, gemm, operand)


def quantize_layout(
    t: torch.Tensor, plan: LayoutPlan, *, seed: int = 0, backend: str = "auto"
) -> torch.Tensor:
    """`t` ([..., C], TE's layout of the tensor) as `plan`'s GEMM multiplies it: the same shape,
    fake-quantized (and rotated) along the GEMM's reduction dim, contiguous. seed: this call's
    SR seed (ops' per-call seed; the GEMM and operand are mixed in here as ops does)."""
    if not plan.gemm_quantized:
        return t
    if t.dim() < 1:
        raise ValueError(f"{plan.tensor_type}: cannot quantize a 0-d tensor")
    if t.numel() == 0:  # an expert that got no tokens: nothing to multiply
        return t.contiguous()
    t2 = t.reshape(-1, t.shape[-1])
    view = t2.t() if plan.along_rows else t2
    spec, op = plan.spec, plan.op
    rht = as_rht(spec.rht, plan.recipe.rht_seed)
    dtype = rotated_dtype(t.dtype) if rht is not None else t.dtype
    length = view.shape[1]
    if rht is not None and length % rht.size:
        dim = "tokens (rows)" if plan.along_rows else "features (last dim)"
        raise ValueError(
            f"{plan.tensor_type} {tuple(t.shape)}: its {plan.gemm} GEMM rotates its {dim} in "
            f"groups of {rht.size}, but {length} is not a multiple of {rht.size} (recipe "
            f"{plan.recipe.name!r}); TransformerEngine multiplies tensors of their own shape, "
            f"so the rotated padding would be lost. Use sizes that are multiples of "
            f"{rht.size} (tokens: micro-batch x sequence length), or the --spec route, which "
            "pads"
        )
    if op is None:  # a high-precision operand of a quantized GEMM: rotated all the same
        q = view.to(torch.float32)
        q = (rht.rotate_fp32_lastdim(q) if rht is not None else q).to(dtype)
    else:
        key_seed = mix_seed(seed, *plan.salt) if op.rounding == "sr" else 0
        q = quantize_view(
            view, fmt=op.format(rht), seed=key_seed, origin=(0, 0), out_dtype=dtype, backend=backend
        )
        if q.shape[1] != length:  # padding in whole rotation groups stays 0: contributes 0
            q = q[:, :length]
    q = q.t() if plan.along_rows else q
    return q.contiguous().reshape(t.shape)
