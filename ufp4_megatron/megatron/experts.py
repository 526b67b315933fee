"""MoE experts with UFP4 GEMMs, in Megatron's two expert containers.

- `UFP4SequentialMLP`: Megatron's SequentialMLP (one MLP per local expert, works without
  TransformerEngine) whose MLPs are built from UFP4 linears; it only tells each linear its
  global expert index, so experts draw distinct SR seeds.
- `UFP4ColumnParallelGroupedLinear` / `UFP4RowParallelGroupedLinear`: the fc1/fc2 builders
  of the grouped-linear protocol that Megatron's `TEGroupedMLP` calls
  (`linear(x, tokens_per_expert) -> (y, bias)`), so `TEGroupedMLP` hosts them unchanged.
  Weights are `weight0..weight{E-1}` as in TE's GroupedLinear. Each expert is its own GEMM
  (own blocks along tokens, own scales): the call loops over experts on CPU and GPU alike,
  because ops has no grouped entry point yet (a grouped fake-quant GEMM belongs in ops).

Experts need no TP communication here (Megatron's token dispatcher does it: explicit expert
comm); shard origins still follow the expert-TP rank. Experts with zero tokens, and token
counts that are not a multiple of the block, go through ops like any other GEMM (ops pads).
"""
from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
from megatron.core.tensor_parallel.layers import (
    _initialize_affine_weight_cpu,
    _initialize_affine_weight_gpu,
    set_tensor_model_parallel_attributes,
)
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
from megatron.core.utils import divide, get_pg_rank, get_pg_size

from ..ops import uses_sr
from .linear import _UFP4Mixin, draw_seed, shard_unit
from .parallel_gemm import Comm, Shard, UFP4ParallelLinearFn
from .policy import UFP4Binding


class UFP4SequentialMLP(SequentialMLP):
    """SequentialMLP whose UFP4 linears know their global expert index (for SR seeds)."""

    def __init__(self, num_local_experts, config, submodules, pg_collection=None, name=None):
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection,
                         name=name)
        first = get_pg_rank(self.ep_group) * num_local_experts
        for i, expert in enumerate(self.local_experts):
            for linear in (expert.linear_fc1, expert.linear_fc2):
                if isinstance(linear, _UFP4Mixin):
                    linear.expert_index = first + i


class _UFP4GroupedLinear(MegatronModule):
    """num_local_experts independent [N_local, K_local] weights, one UFP4 GEMM per expert."""

    partition_dim: int  # 0: column-parallel (N split), 1: row-parallel (K split)

    def __init__(self, num_local_experts, input_size, output_size, *, config, init_method, bias,
                 skip_bias_add, is_expert, tp_comm_buffer_name=None, pg_collection=None,
                 name=None, ufp4: UFP4Binding):
        super().__init__(config=config)
        if not is_expert:
            raise ValueError("UFP4 grouped linears are expert layers (is_expert=True)")
        if not isinstance(ufp4, UFP4Binding):
            raise TypeError(f"{type(self).__name__} needs ufp4=UFP4Binding")
        self.num_gemms = num_local_experts
        self.skip_bias_add = skip_bias_add
        self.ufp4 = ufp4
        self.tp_group = pg_collection.expt_tp
        self.ep_group = pg_collection.ep
        tp, rank = get_pg_size(self.tp_group), get_pg_rank(self.tp_group)
        dims = [output_size, input_size]
        full = dims[self.partition_dim]
        dims[self.partition_dim] = local = divide(full, tp)
        # A gated fc1 is sharded like MLP's (stride 2: [gate_r; up_r]), as TEGroupedMLP's
        # checkpoint mapping (apply_swiglu_sharded_factory) expects.
        stride = 2 if self.partition_dim == 0 and config.gated_linear_unit else 1
        unit = shard_unit(ufp4.recipe)
        if tp > 1 and (local // stride) % unit:
            raise ValueError(
                f"{type(self).__name__} {ufp4.path}: {full}/TP/stride = {local // stride} is "
                f"not a multiple of {unit} (block and RHT sizes of recipe {ufp4.recipe.name!r});"
                f" choose expert sizes divisible by expert-TP*{stride * unit}.")
        self._shard = (Shard.column(rank, tp, local, stride) if self.partition_dim == 0 else
                       Shard.row(rank, local))
        self._dp_rank = parallel_state.get_expert_data_parallel_rank()
        self._first_expert = get_pg_rank(self.ep_group) * num_local_experts
        self._sr = uses_sr(ufp4.recipe)

        # As Megatron's linears: expert weights reduce over the expert-DP group, not DP.
        use_expert_pgs = (config.expert_model_parallel_size > 1 or
                          config.expert_tensor_parallel_size != config.tensor_model_parallel_size)
        for i in range(num_local_experts):
            w = torch.nn.Parameter(torch.empty(dims, dtype=config.params_dtype,
                                               device=_device(config)))
            if config.perform_initialization:
                if config.use_cpu_initialization:
                    _initialize_affine_weight_cpu(w, output_size, input_size, local,
                                                  self.partition_dim, init_method, stride=stride,
                                                  rank=rank, world_size=tp)
                else:
                    _initialize_affine_weight_gpu(w, init_method, self.partition_dim,
                                                  stride=stride, is_expert=True)
            else:
                set_tensor_model_parallel_attributes(w, True, self.partition_dim, stride)
            w.allreduce = not use_expert_pgs
            self.register_parameter(f"weight{i}", w)
            if bias:
                b = torch.nn.Parameter(torch.zeros(output_size if self.partition_dim else local,
                                                   dtype=config.params_dtype,
                                                   device=_device(config)))
                b.allreduce = not use_expert_pgs
                self.register_parameter(f"bias{i}", b)
            else:
                self.register_parameter(f"bias{i}", None)

    def forward(self, x: torch.Tensor, tokens_per_expert):
        counts = [int(c) for c in tokens_per_expert]
        comm = Comm(sequence_parallel=False, allreduce_dgrad=False,
                    grad_accumulation_fusion=self.config.gradient_accumulation_fusion,
                    tp_group=self.tp_group)
        outs, biases = [], []
        for i, xe in enumerate(torch.split(x, counts)):
            w, b = getattr(self, f"weight{i}"), getattr(self, f"bias{i}")
            seed = draw_seed(self.ufp4, self._sr, xe, w, self._first_expert + i, self._dp_rank)
            outs.append(UFP4ParallelLinearFn.apply(xe, w, None if self.skip_bias_add else b,
                                                   self.ufp4.recipe, seed, self._shard, comm))
            biases.append(b)
        has_bias = biases[0] is not None
        return torch.cat(outs), (biases if self.skip_bias_add and has_bias else None)

    def backward_dw(self) -> None:
        """Deferred wgrad is not supported: wgrad runs inside backward."""

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """Per-expert tensors with a global expert axis, keyed like TE's GroupedLinear so
        TEGroupedMLP maps them onto SequentialMLP's checkpoint keys."""
        num_global = get_pg_size(self.ep_group) * self.num_gemms
        ep_axis = len(sharded_offsets)
        out = {}
        for i in range(self.num_gemms):
            sd = {f"{i}.weight": getattr(self, f"weight{i}")}
            if getattr(self, f"bias{i}") is not None:
                sd[f"{i}.bias"] = getattr(self, f"bias{i}")
            tp_axis = {f"{i}.weight": self.partition_dim}
            if self.partition_dim == 0:
                tp_axis[f"{i}.bias"] = 0
            sub = make_sharded_tensors_for_checkpoint(
                sd, "", tp_axis, (*sharded_offsets, (ep_axis, self._first_expert + i, num_global)),
                tp_group=self.tp_group, dp_cp_group=metadata["dp_cp_group"])
            replace_prefix_for_sharding(sub, f"{i}.", prefix)
            out[f"{prefix}weight{i}"] = sub[f"{i}.weight"]
            if f"{i}.bias" in sub:
                out[f"{prefix}bias{i}"] = sub[f"{i}.bias"]
        return out

    def extra_repr(self) -> str:
        return f"experts={self.num_gemms}, recipe={self.ufp4.recipe.name}"


class UFP4ColumnParallelGroupedLinear(_UFP4GroupedLinear):
    """Grouped fc1 (weights split along N over expert-TP)."""

    partition_dim = 0


class UFP4RowParallelGroupedLinear(_UFP4GroupedLinear):
    """Grouped fc2 (weights split along K over expert-TP)."""

    partition_dim = 1


def _device(config):
    return "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
