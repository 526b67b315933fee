"""UFP4ColumnParallelLinear / UFP4RowParallelLinear: Megatron's parallel linears with UFP4 GEMMs.

Subclasses that only override `_forward_impl` (the seam Megatron itself uses for frozen vs
trainable weights): construction, parameters, initialization, checkpoint layout, the
surrounding TP communication of `forward` and every config flag stay Megatron's. What they
need beyond Megatron's arguments arrives as one `ufp4=UFP4Binding` (see policy.py), so they
drop into a ModuleSpec unchanged.

Tensor-parallel invariance: this rank's shard offsets are passed to ops as origins, and the
SR seed is identical on all TP ranks (seeds.py), so TP=2 draws the SR bits of TP=1. That needs
shards made of whole blocks: the sharded dim per rank and chunk (N/TP/stride for
column-parallel, K/TP for row-parallel) must be a multiple of `recipe.shard_unit`;
construction fails otherwise.
"""

from __future__ import annotations

import copy

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.utils import get_pg_rank, get_pg_size

from ..quant.weight_cache import WeightOperands
from .parallel_gemm import Comm, Shard, UFP4ParallelLinearFn
from .policy import UFP4Binding


def draw_seed(
    binding: UFP4Binding,
    sr: bool,
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_index: int,
    dp_rank: int,
):
    """This call's SR seed (seeds.py): on the GPU its key table in device memory, else an
    int. Only forwards that will run backward draw, so eval leaves the stream alone; recipes
    without SR draw nothing (0)."""
    if not (sr and torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return 0
    return binding.seeds.draw(
        binding.layer_number, binding.role, expert_index + 1, dp_rank, device=x.device
    )


class _UFP4Mixin:
    """Shared by both linears: binding, origins, seed draw, the call into the autograd fn."""

    ufp4: UFP4Binding
    expert_index: int = -1  # global expert index, set by the expert containers (experts.py)

    def _setup_ufp4(self, ufp4: UFP4Binding, *, sharded: int, kind: str, dim_name: str):
        if not isinstance(ufp4, UFP4Binding):
            raise TypeError(
                f"{type(self).__name__} needs ufp4=UFP4Binding (build it through "
                "UFP4Policy.bind or the spec functions in ufp4_megatron.megatron.spec)"
            )
        self.ufp4 = ufp4
        tp = get_pg_size(self.tp_group)
        unit = ufp4.recipe.shard_unit
        if tp > 1 and sharded % unit:
            raise ValueError(
                f"{kind} {ufp4.path}: {dim_name}/TP = {sharded} is not a multiple of {unit} "
                f"(block and RHT sizes of recipe {ufp4.recipe.name!r}), so quantization blocks "
                f"would straddle tensor-parallel shards. Choose sizes with {dim_name} divisible "
                f"by TP*{unit}, a smaller TP, or a recipe with smaller blocks for this layer."
            )
        self._dp_rank = (
            parallel_state.get_expert_data_parallel_rank()
            if self.is_expert
            else parallel_state.get_data_parallel_rank(with_context_parallel=True)
        )
        self._sr = ufp4.recipe.uses_sr
        # the weight's RTNE operands, kept until it changes (quant/weight_cache.py)
        self.weight_operands = WeightOperands() if ufp4.cache_weights else None
        # NVFP4's tensor amaxes of the weight, made once per optimizer step whatever the
        # cache: a few bytes (parallel_gemm.weight_amaxes)
        self.weight_amaxes = WeightOperands()

    def _forward_impl(
        self,
        input,
        weight,
        bias,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        *args,
        **kwargs,
    ):
        # The seam Megatron's own forward calls, for both linears; self._shard (set by the
        # subclass) says where this rank's slice sits in the full weight.
        return self._ufp4_forward(
            input,
            weight,
            bias,
            shard=self._shard,
            gradient_accumulation_fusion=gradient_accumulation_fusion,
            allreduce_dgrad=allreduce_dgrad,
            sequence_parallel=sequence_parallel,
            **_named(args, kwargs),
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.ufp4.recipe.name}"

    # Megatron's linears keep an `_extra_state` slot for TE's FP8 metadata (None for the local
    # ones), which every Megatron checkpoint stores as a ShardedObject. The SR stream rides in
    # it, so Megatron-LM's own --save/--load resumes the SR bits exactly. All UFP4 linears of
    # a model chunk share one stream, so each carries the same state; the value is plain
    # (ints + a uint8 tensor) for torch.load(weights_only=True). States that are not ours
    # (None from a BF16 checkpoint, TE's FP8 metadata) leave the stream as it is.
    def get_extra_state(self) -> dict:
        return {"ufp4_sr_seeds": self.ufp4.seeds.state_dict()}

    def set_extra_state(self, state) -> None:
        if isinstance(state, dict) and "ufp4_sr_seeds" in state:
            self.ufp4.seeds.load_state_dict(state["ufp4_sr_seeds"])

    def _ufp4_forward(
        self,
        input,
        weight,
        bias,
        *,
        shard: Shard,
        gradient_accumulation_fusion,
        allreduce_dgrad,
        sequence_parallel,
        tp_group,
        grad_output_buffer=None,
        wgrad_deferral_limit=None,
        gtp_remat_size=1,
    ):
        if gtp_remat_size > 1:
            raise NotImplementedError(
                f"{self.ufp4.path}: GTP weight rematerialization is not "
                "supported by UFP4 linears; set gtp_weight_remat_size=1"
            )
        if grad_output_buffer is not None:
            raise NotImplementedError(
                f"{self.ufp4.path}: deferred wgrad (grad_output_buffer) "
                "is an LM-head feature; the LM head stays BF16"
            )
        comm = Comm(
            sequence_parallel=sequence_parallel,
            allreduce_dgrad=allreduce_dgrad,
            grad_accumulation_fusion=gradient_accumulation_fusion,
            tp_group=tp_group if tp_group is not None else self.tp_group,
        )
        seed = draw_seed(self.ufp4, self._sr, input, weight, self.expert_index, self._dp_rank)
        # the stores only where `weight` is this module's own (the parameter their stamps read)
        own = weight is self.weight
        return UFP4ParallelLinearFn.apply(
            input,
            weight,
            bias,
            self.ufp4.recipe,
            seed,
            shard,
            comm,
            self.weight_operands if own else None,
            self.weight_amaxes if own else None,
        )


def _config_without_apex_check(config):
    # ColumnParallelLinear refuses gradient_accumulation_fusion unless apex's fused kernel is
    # importable; the UFP4 backward accumulates into main_grad with torch, so build the
    # parent with the flag off and restore it afterwards.
    if not config.gradient_accumulation_fusion:
        return config
    quiet = copy.copy(config)
    quiet.gradient_accumulation_fusion = False
    return quiet


class UFP4ColumnParallelLinear(_UFP4Mixin, ColumnParallelLinear):
    """ColumnParallelLinear (Y = X W^T, W split along N) whose GEMMs follow a UFP4 recipe."""

    def __init__(self, input_size, output_size, *, config, ufp4: UFP4Binding, **kwargs):
        super().__init__(
            input_size, output_size, config=_config_without_apex_check(config), **kwargs
        )
        self.config = config
        self.gradient_accumulation_fusion = config.gradient_accumulation_fusion
        stride = kwargs.get("stride", 1)
        self._setup_ufp4(
            ufp4,
            sharded=self.output_size_per_partition // stride,
            kind="UFP4ColumnParallelLinear",
            dim_name=f"output_size {output_size}" + (f"/stride {stride}" if stride > 1 else ""),
        )
        self._shard = Shard.column(
            get_pg_rank(self.tp_group),
            get_pg_size(self.tp_group),
            self.output_size_per_partition,
            stride,
        )


class UFP4RowParallelLinear(_UFP4Mixin, RowParallelLinear):
    """RowParallelLinear (Y = X W^T, W split along K) whose GEMMs follow a UFP4 recipe."""

    def __init__(self, input_size, output_size, *, config, ufp4: UFP4Binding, **kwargs):
        super().__init__(input_size, output_size, config=config, **kwargs)
        self._setup_ufp4(
            ufp4,
            sharded=self.input_size_per_partition,
            kind="UFP4RowParallelLinear",
            dim_name=f"input_size {input_size}",
        )
        self._shard = Shard.row(get_pg_rank(self.tp_group), self.input_size_per_partition)


_TAIL = ("grad_output_buffer", "wgrad_deferral_limit", "tp_group", "gtp_remat_size")


def _named(args, kwargs) -> dict:
    # Megatron calls _forward_impl with keywords; accept its positional order too.
    out = dict(zip(_TAIL, args))
    out.update(kwargs)
    return out
