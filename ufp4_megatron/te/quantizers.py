"""TransformerEngine quantizers holding a recipe's fake-quantized GEMM operands (TE >= 2.19).

For a linear's input, weight and grad_output, the factory returns TE's HybridQuantizer of two
UFP4LayoutQuantizers: the row-wise one holds the operand of the GEMM that reduces along the
tensor's last dim, the column-wise one the operand of the GEMM that reduces along its rows
(layouts.LAYOUTS). Each is TE's IdentityQuantizer (a high-precision passthrough) whose held
tensor is the fake-quantized operand, so TE's GEMM takes its fallback for such storages:
dequantize (here: the held tensor) and run the BF16 cuBLAS GEMM, honouring `out` and
`accumulate` (main_grad under gradient-accumulation fusion). Every other slot (outputs,
grad_input, attention) gets a plain IdentityQuantizer: high precision, as in the local route.

The held values stay in the rotated domain of their GEMM's RHT (layouts.py says why that is
exact for TE's three GEMMs). Anything else that reads them is refused where it can be seen:
sequence parallelism (TE all-gathers a column-parallel input by dequantizing and quantizing
again, which would rotate twice; TE announces it by giving the input quantizer an amax
reduction group), a CustomRecipe backward_override (it feeds dequantized or high-precision
operands to backward GEMMs), FP4 parameters (--fp4-param-gather: the weight would be stored
only as fake-quantized values), TransformerEngine before 2.19, and tensor parallelism with SR
(factories.check_parallel).
"""

from __future__ import annotations

from transformer_engine.pytorch.quantization import FP8GlobalStateManager
from transformer_engine.pytorch.tensor.hybrid_tensor import HybridQuantizer
from transformer_engine.pytorch.tensor.identity_tensor import IdentityQuantizer

from ..quant.recipe import Recipe
from . import seeds
from .checks import check_parallel, check_te_version
from .installed import te_version
from .layouts import COLUMNWISE, LAYOUTS, ROWWISE, LayoutPlan, layout_plan, quantize_layout

LINEAR_MODULES = ("linear", "grouped_linear")


class LayoutStats:
    """Shared by a layout quantizer and its copies: how many tensors it quantized (probes)."""

    def __init__(self):
        self.calls = 0


class UFP4LayoutQuantizer(IdentityQuantizer):
    """One layout of one tensor role: holds `layouts.quantize_layout` of what it is given."""

    def __init__(
        self,
        plan: LayoutPlan,
        stats: LayoutStats | None = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
    ):
        super().__init__(dtype=None, rowwise=rowwise, columnwise=columnwise)
        self.plan = plan
        self.stats = stats if stats is not None else LayoutStats()
        # TE sets these on a column-parallel input quantizer under sequence parallelism
        # (module/_common.py set_quantizer_amax_reduction_group): the refusal's trigger
        self.with_amax_reduction = False
        self.amax_reduction_group = None

    def copy(self) -> UFP4LayoutQuantizer:
        q = type(self)(
            self.plan, self.stats, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage
        )
        q.internal, q.optimize_for_gemm = self.internal, self.optimize_for_gemm
        q.with_amax_reduction, q.amax_reduction_group = (
            self.with_amax_reduction,
            self.amax_reduction_group,
        )
        return q

    def quantize_impl(self, tensor):
        return super().quantize_impl(self._operand(tensor))

    def update_quantized(self, src, dst, *, noop_flag=None):
        return super().update_quantized(self._operand(src), dst, noop_flag=noop_flag)

    def is_requantization_safe(self) -> bool:
        return not self.plan.uses_sr  # RTNE reproduces its values; SR draws new bits

    def _operand(self, tensor):
        if self.with_amax_reduction:
            raise ValueError(
                "ufp4_megatron.te: sequence parallelism: TE all-gathers the dequantized input "
                "and quantizes it again, so the GEMM would not get the recipe's operand; run "
                "without --sequence-parallel (and so without --tp-comm-overlap), or use the "
                "--spec route"
            )
        seed = seeds.draw(tensor.device) if self.plan.uses_sr and tensor.numel() else 0
        self.stats.calls += 1
        return quantize_layout(tensor, self.plan, seed=seed)

    def __repr__(self) -> str:
        p = self.plan
        return (
            f"UFP4LayoutQuantizer({p.recipe.name}: {p.tensor_type} {p.layout} = "
            f"{p.gemm}.{p.operand})"
        )


def quantizer_for(recipe: Recipe, role):
    """The quantizer of one CustomRecipe slot (the factories' body)."""
    _check_environment(recipe)
    tensor_type = getattr(role, "tensor_type", "")
    if getattr(role, "module_type", "") not in LINEAR_MODULES or tensor_type not in LAYOUTS:
        return IdentityQuantizer()
    plans = {lay: layout_plan(recipe, tensor_type, lay) for lay in (ROWWISE, COLUMNWISE)}
    if not any(p.gemm_quantized for p in plans.values()):
        return IdentityQuantizer()
    return HybridQuantizer(
        rowwise_quantizer=UFP4LayoutQuantizer(plans[ROWWISE]),
        columnwise_quantizer=UFP4LayoutQuantizer(plans[COLUMNWISE]),
    )


def _check_environment(recipe: Recipe) -> None:
    check_te_version(te_version() or "0")
    if FP8GlobalStateManager.with_fp8_parameters():
        raise ValueError(
            "ufp4_megatron.te: FP4 parameters (--fp4-param-gather / fp4_param): the weights "
            "would be stored only as fake-quantized values; UFP4 keeps them in high precision, "
            "drop the flag"
        )
    active = (
        FP8GlobalStateManager.get_fp8_recipe() if FP8GlobalStateManager.is_fp8_enabled() else None
    )
    override = getattr(active, "backward_override", None)
    if override is not None:
        raise ValueError(
            f"ufp4_megatron.te: CustomRecipe backward_override={override!r} (NVTE_BACKWARD_"
            "OVERRIDE) replaces the recipe's backward operands; unset it"
        )
    check_parallel(recipe, _tensor_parallel_size())


def _tensor_parallel_size() -> int:
    """Megatron's tensor- (and expert-tensor-) parallel size where Megatron set them up."""
    try:
        from megatron.core import parallel_state as ps
    except ImportError:
        return 1
    if not ps.model_parallel_is_initialized():
        return 1
    return max(
        ps.get_tensor_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size() or 1
    )
