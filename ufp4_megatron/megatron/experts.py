"""MoE experts with UFP4 GEMMs, in Megatron's two expert containers.

- `UFP4SequentialMLP`: Megatron's SequentialMLP (one MLP per local expert) whose MLPs are
  built from UFP4 linears; it only keys each linear's SR seed per expert (below). Used with
  moe_grouped_gemm=False.
- `UFP4ColumnParallelGroupedLinear` / `UFP4RowParallelGroupedLinear`: the fc1/fc2 builders
  of the grouped-linear protocol that Megatron's `TEGroupedMLP` calls
  (`linear(x, tokens_per_expert) -> (y, bias)`), so `TEGroupedMLP` hosts them unchanged.
  All local experts' weights are one parameter `weight` [E, N, K] (and `bias` [E, N]), and
  every GEMM runs for all experts at once through `ufp4_megatron.quant.grouped_ops`, on the token
  matrix padded per expert to a multiple of 16 (or the recipe's block): one quantization
  launch per operand, one `torch._grouped_mm` per GEMM, for every recipe (BF16 experts
  included), with no host sync per expert.

SR seeds, the same in both hosts: per forward each role (fc1, fc2) draws ONE seed from the
policy's stream (`_call_seed`: salted like a non-expert linear, expert 0), and global expert
g uses `grouped_ops.expert_seed(seed, g)`, positions counted from its own first token. The
grouped linears do this in one launch per operand; UFP4SequentialMLP draws the two seeds
before Megatron's loop over experts and hands each expert linear its keyed seed
(`_ExpertSeeds`). So the two hosts draw the same bits, an expert's keys depend neither on the
other experts' token counts nor on which EP rank holds it (the stream advances by 2 per MoE
layer and forward whatever the number of local experts), and the stream stays one
checkpointed `SRSeeds`: resume is exact in both hosts.

Experts need no TP communication here (Megatron's token dispatcher does it: explicit expert
comm); shard origins still follow the expert-TP rank. Checkpoints: the stacked weight is saved
as the same global tensor SequentialMLP saves (key `...experts.linear_fc1.weight`, shape
[experts, N, K], SwiGLU halves placed as MLP places them), so the two hosts' checkpoints are
interchangeable, and its ShardedTensor's data is the parameter itself, which the distributed
optimizer's model-space formats need.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from megatron.core.tensor_parallel.layers import (
    _initialize_affine_weight_cpu,
    _initialize_affine_weight_gpu,
    set_tensor_model_parallel_attributes,
)
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.utils import divide, get_pg_rank, get_pg_size

from ..quant import grouped_ops, ops
from ..quant.recipe import Recipe
from ..quant.weight_cache import WeightOperands
from .linear import _UFP4Mixin
from .parallel_gemm import (
    Shard,
    _accumulate,
    _chunks,
    chunk_of,
    kept_key,
    quantizes_dy_twice,
    quantizes_input_twice,
    save_seed,
    shares_input,
    shares_weight_amax,
)
from .policy import UFP4Binding
from .seeds import SRSeeds


def _will_backward(input_requires_grad: bool, *params) -> bool:
    """Whether a forward will run backward (the linears' rule for drawing a seed: eval and
    frozen forwards leave the stream alone)."""
    return torch.is_grad_enabled() and (input_requires_grad or any(p.requires_grad for p in params))


def _call_seed(binding: UFP4Binding, dp_rank: int, first_expert: int, experts: int, device):
    """The one SR seed of a role's call over all local experts (module docstring): on the GPU
    the key table [6, experts] of global experts first_expert.. (seeds.py), else an int."""
    return binding.seeds.draw(
        binding.layer_number,
        binding.role,
        0,
        dp_rank,
        experts=(first_expert, experts),
        device=device,
    )


class _RoleSeed:
    """The seed one role (fc1 or fc2) of UFP4SequentialMLP drew for the current forward: an
    int, or the key table of its local experts."""

    seed = 0
    first = 0  # global index of local expert 0


@dataclasses.dataclass(frozen=True)
class _ExpertSeeds:
    """Stands in for SRSeeds in one expert linear's binding: its draw is the host's draw of
    this forward keyed by the expert's global index, the grouped host's key. The stream
    (and its checkpoint state) stays the policy's SRSeeds, which only the host draws from."""

    role: _RoleSeed
    expert: int
    stream: SRSeeds  # the policy's stream, which the host draws from and checkpoints save

    def draw(self, *salt: int, device=None):
        seed = self.role.seed
        if isinstance(seed, torch.Tensor):  # the expert's column of the role's key table
            local = self.expert - self.role.first
            return seed[:, local : local + 1]
        return grouped_ops.expert_seed(seed, self.expert)

    # The linear's `_extra_state` (linear.py) carries the stream's state, as every UFP4 linear's
    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)


class UFP4SequentialMLP(SequentialMLP):
    """SequentialMLP whose UFP4 linears take the grouped host's per-expert SR seeds."""

    def __init__(self, num_local_experts, config, submodules, pg_collection=None, name=None):
        super().__init__(
            num_local_experts, config, submodules, pg_collection=pg_collection, name=name
        )
        first = get_pg_rank(self.ep_group) * num_local_experts
        self._dp_rank = parallel_state.get_expert_data_parallel_rank()
        self._roles = {}  # role name -> (its binding, its _RoleSeed, its linears)
        for name in ("linear_fc1", "linear_fc2"):
            linears = [getattr(expert, name) for expert in self.local_experts]
            if not all(isinstance(linear, _UFP4Mixin) for linear in linears):
                continue  # Megatron's own linears (the policy keeps this role in BF16)
            role = _RoleSeed()
            role.first = first
            self._roles[name] = (linears[0].ufp4, role, linears)
            for i, linear in enumerate(linears):
                linear.expert_index = first + i
                linear.ufp4 = dataclasses.replace(
                    linear.ufp4, seeds=_ExpertSeeds(role, first + i, linear.ufp4.seeds)
                )

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs, **kw):
        # Both roles draw here, fc1 then fc2, in the order and under the conditions the
        # grouped host's fc1 and fc2 draw theirs (fc2's input needs grad if fc1's input, its
        # parameters or the routing probs do).
        x = permuted_local_hidden_states
        fc1_params = [p for e in self.local_experts for p in e.linear_fc1.parameters()]
        inputs_grad = {
            "linear_fc1": x.requires_grad,
            "linear_fc2": x.requires_grad
            or permuted_probs.requires_grad
            or any(p.requires_grad for p in fc1_params),
        }
        for name, (binding, role, linears) in self._roles.items():
            backward = _will_backward(inputs_grad[name], *(linear.weight for linear in linears))
            role.seed = (
                _call_seed(binding, self._dp_rank, role.first, len(linears), x.device)
                if backward and binding.recipe.uses_sr
                else 0
            )
        return super().forward(
            permuted_local_hidden_states, tokens_per_expert, permuted_probs, **kw
        )


class _UFP4GroupedLinear(MegatronModule):
    """num_local_experts [N_local, K_local] weights stacked in one parameter, all GEMMs grouped."""

    partition_dim: int  # 0: column-parallel (N split), 1: row-parallel (K split), per expert

    def __init__(
        self,
        num_local_experts,
        input_size,
        output_size,
        *,
        config,
        init_method,
        bias,
        skip_bias_add,
        is_expert,
        tp_comm_buffer_name=None,
        pg_collection=None,
        name=None,
        ufp4: UFP4Binding,
    ):
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
        # A gated fc1 is sharded like MLP's (stride 2: [gate_r; up_r]) and saved as MLP saves it.
        self._stride = 2 if self.partition_dim == 0 and config.gated_linear_unit else 1
        _check_grouped(ufp4, dims, self.partition_dim, self._stride, tp, full)
        self._shard = (
            Shard.column(rank, tp, local, self._stride)
            if self.partition_dim == 0
            else Shard.row(rank, local)
        )
        self._dp_rank = parallel_state.get_expert_data_parallel_rank()
        self._first_expert = get_pg_rank(self.ep_group) * num_local_experts
        self._sr = ufp4.recipe.uses_sr
        self._align = grouped_ops.token_alignment(ufp4.recipe)
        # the experts' RTNE weight operands, kept until the weights change (quant/weight_cache.py)
        self.weight_operands = WeightOperands() if ufp4.cache_weights else None
        # NVFP4's per-expert tensor amaxes of the weights, once per optimizer step whatever the
        # cache: 4 bytes per expert (_weight_amax)
        self.weight_amaxes = WeightOperands()

        # As Megatron's linears: expert weights reduce over the expert-DP group, not DP.
        use_expert_pgs = (
            config.expert_model_parallel_size > 1
            or config.expert_tensor_parallel_size != config.tensor_model_parallel_size
        )
        device = _device(config)
        self.weight = torch.nn.Parameter(
            torch.empty(num_local_experts, *dims, dtype=config.params_dtype, device=device)
        )
        if config.perform_initialization:
            for e in range(num_local_experts):  # one expert at a time: the RNG order of
                w = self.weight.data[e]  # separate per-expert weights
                if config.use_cpu_initialization:
                    _initialize_affine_weight_cpu(
                        w,
                        output_size,
                        input_size,
                        local,
                        self.partition_dim,
                        init_method,
                        stride=self._stride,
                        rank=rank,
                        world_size=tp,
                        skip_set_tensor_parallel_attributes=True,
                    )
                else:
                    _initialize_affine_weight_gpu(
                        w, init_method, self.partition_dim, stride=self._stride, is_expert=True
                    )
        set_tensor_model_parallel_attributes(
            self.weight, True, self.partition_dim + 1, self._stride
        )
        self.weight.allreduce = not use_expert_pgs
        if bias:
            n = output_size if self.partition_dim else local
            self.bias = torch.nn.Parameter(
                torch.zeros(num_local_experts, n, dtype=config.params_dtype, device=device)
            )
            if self.partition_dim == 0:
                set_tensor_model_parallel_attributes(self.bias, True, 1, self._stride)
            self.bias.allreduce = not use_expert_pgs
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, tokens_per_expert):
        counts = tuple(
            tokens_per_expert.tolist() if torch.is_tensor(tokens_per_expert) else tokens_per_expert
        )
        groups = grouped_ops.expert_groups(counts, self._align)
        seed = (
            _call_seed(self.ufp4, self._dp_rank, self._first_expert, self.num_gemms, x.device)
            if self._sr and _will_backward(x.requires_grad, self.weight)
            else 0
        )
        bias = None if self.skip_bias_add else self.bias
        fuse = self.config.gradient_accumulation_fusion
        y = _GroupedExpertsFn.apply(
            x.reshape(-1, x.shape[-1]),
            self.weight,
            bias,
            self.ufp4.recipe,
            seed,
            self._first_expert,
            groups,
            self._shard,
            fuse,
            self.weight_operands,
            self.weight_amaxes,
        )
        y = y.view(*x.shape[:-1], y.shape[-1])
        return y, (self.bias if self.skip_bias_add else None)

    def backward_dw(self) -> None:
        """Deferred wgrad is not supported: wgrad runs inside backward."""

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """The stacked tensors as slices [E_local, ...] of the global [experts, N, K] tensor
        SequentialMLP saves under the same key (TEGroupedMLP maps the prefix)."""
        replica = (0, 0, self._dp_rank)  # replicated over expert-DP only
        ep = (get_pg_rank(self.ep_group), get_pg_size(self.ep_group))
        out = {}
        for name, tp_axis in (("weight", self.partition_dim), ("bias", 0)):
            t = getattr(self, name)
            if t is None:
                continue
            tp_sharded = name == "weight" or self.partition_dim == 0
            out[f"{prefix}{name}"] = _stacked_sharded_tensor(
                f"{prefix}{name}",
                t,
                sharded_offsets,
                ep,
                tp_axis if tp_sharded else None,
                self.tp_group,
                self._stride if tp_sharded else 1,
                replica if tp_sharded else (0, get_pg_rank(self.tp_group), self._dp_rank),
            )
        return out

    def extra_repr(self) -> str:
        return f"experts={self.num_gemms}, recipe={self.ufp4.recipe.name}"


class UFP4ColumnParallelGroupedLinear(_UFP4GroupedLinear):
    """Grouped fc1 (weights split along N over expert-TP)."""

    partition_dim = 0


class UFP4RowParallelGroupedLinear(_UFP4GroupedLinear):
    """Grouped fc2 (weights split along K over expert-TP)."""

    partition_dim = 1


class _GroupedExpertsFn(torch.autograd.Function):
    """All local experts' fc1 or fc2: grouped GEMMs on the padded token layout, per N chunk of
    this rank's shard (as UFP4ParallelLinearFn, without communication), wgrad into
    main_grad when fused."""

    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        recipe: Recipe,
        seed,
        first_expert: int,
        groups,
        shard: Shard,
        fuse_wgrad: bool,
        cache=None,
        amaxes=None,
    ):
        xp = groups.pad(x)
        keys = dict(seed=seed, first_expert=first_expert)
        qx = _shared_input("fprop", xp, groups, recipe, shard, keys)
        # NVFP4: x's per-expert amaxes for fprop and wgrad from one read
        x_amax = (
            grouped_ops.input_amaxes("x", xp, groups, recipe)
            if quantizes_input_twice(recipe, shard, ctx.needs_input_grad[1])
            else (None, None)
        )
        # backward always runs dgrad: each chunk's w amax, where taken, serves both GEMMs
        dgrad_runs = any(ctx.needs_input_grad)
        ys, w_amaxes = [], []
        for c, (w, n0) in enumerate(_chunks(shard, weight, 1)):
            w_amax = _weight_amax(w, c, weight, shard, xp.dtype, recipe, cache, amaxes, dgrad_runs)
            w_amaxes.append(w_amax)
            ys.append(
                grouped_ops.fprop(
                    xp,
                    w,
                    groups,
                    recipe,
                    **keys,
                    x_origin=(0, shard.k),
                    w_origin=(n0, shard.k),
                    qw=_kept(cache, "fprop", c, weight, shard, recipe, (n0, shard.k), xp.dtype),
                    qx=qx,
                    w_amax=w_amaxes[-1],
                    x_amax=x_amax[0],
                )
            )
        y = groups.unpad(ys[0] if len(ys) == 1 else torch.cat(ys, dim=1))
        if bias is not None:
            y = y + bias.index_select(0, groups.token_experts(y.device)).to(y.dtype)
        # the key table and the amaxes saved, not kept on ctx, so that a CUDA graph runner
        # (Megatron's) keeps their memory to the backward graph
        keys_saved = save_seed(seed)
        ctx.n_keys = len(keys_saved)
        amaxes = (x_amax[1], *w_amaxes)  # wgrad's of x, dgrad's of each chunk of w
        ctx.amax_given = tuple(a is not None for a in amaxes)
        ctx.save_for_backward(xp, weight, *keys_saved, *(a for a in amaxes if a is not None))
        ctx.main_grad = getattr(weight, "main_grad", None) if fuse_wgrad else None
        ctx.recipe, ctx.groups, ctx.shard, ctx.cache = recipe, groups, shard, cache
        ctx.first_expert, ctx.seed = first_expert, seed if isinstance(seed, int) else 0
        ctx.use_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        xp, weight, *rest = ctx.saved_tensors
        table, given = rest[: ctx.n_keys], iter(rest[ctx.n_keys :])
        x_amax, *w_amaxes = [next(given) if saved else None for saved in ctx.amax_given]
        recipe, groups, shard = ctx.recipe, ctx.groups, ctx.shard
        keys = dict(seed=table[0] if table else ctx.seed, first_expert=ctx.first_expert)
        dy = dy.contiguous().to(xp.dtype)
        dyp = groups.pad(dy)
        # NVFP4: dY's per-expert amaxes for dgrad and wgrad from one read
        dy_amax = (
            grouped_ops.input_amaxes("dy", dyp, groups, recipe)
            if quantizes_dy_twice(shard, ctx.needs_input_grad[1])
            else (None, None)
        )
        dxs = [
            grouped_ops.dgrad(
                d,
                w,
                groups,
                recipe,
                **keys,
                dy_origin=(0, n0),
                w_origin=(n0, shard.k),
                qw=_kept(ctx.cache, "dgrad", c, weight, shard, recipe, (n0, shard.k), xp.dtype),
                w_amax=w_amaxes[c],
                dy_amax=dy_amax[0],
            )
            for c, ((d, n0), (w, _)) in enumerate(
                zip(_chunks(shard, dyp, 1), _chunks(shard, weight, 1))
            )
        ]
        dx = groups.unpad(dxs[0] if len(dxs) == 1 else torch.stack(dxs).sum(0))
        grad_weight = None
        if ctx.needs_input_grad[1]:
            qx = _shared_input("wgrad", xp, groups, recipe, shard, keys)
            dws = [
                grouped_ops.wgrad(
                    d,
                    xp,
                    groups,
                    recipe,
                    **keys,
                    dy_origin=(0, n0),
                    x_origin=(0, shard.k),
                    qx=qx,
                    dy_amax=dy_amax[1],
                    x_amax=x_amax,
                )
                for d, n0 in _chunks(shard, dyp, 1)
            ]
            dw = dws[0] if len(dws) == 1 else torch.cat(dws, dim=1)
            grad_weight = _accumulate(weight, dw, ctx.main_grad)
        grad_bias = grouped_ops.per_expert_sum(dy, groups) if ctx.use_bias else None
        return dx, grad_weight, grad_bias, None, None, None, None, None, None, None, None


def _shared_input(gemm: str, xp, groups, recipe, shard: Shard, keys: dict):
    """x's operand of `gemm` made once for all chunks of a strided (gated fc1) shard where
    `shares_input`, else None: parallel_gemm.shared_input for grouped experts."""
    if not shares_input(gemm, recipe, shard):
        return None
    return grouped_ops.input_operand(gemm, xp, groups, recipe, **keys, x_origin=(0, shard.k))


def _weight_amax(w, chunk: int, weight, shard: Shard, dtype, recipe, cache, kept, dgrad_runs):
    """NVFP4's per-expert tensor amax of w, chunk `chunk` [E, N, K] of the stacked `weight`,
    for fprop and dgrad from one read (grouped_ops.weight_amax), where both GEMMs quantize
    this chunk themselves (parallel_gemm.shares_weight_amax, with the activations'
    `dtype`); else None: each takes its own. `kept`: the module's store of its weight's
    amaxes, which makes them once per optimizer step (parallel_gemm.weight_amaxes says why),
    from the parameter's chunk at that time (a strided chunk is a copy)."""
    if not shares_weight_amax(w.dtype, dtype, recipe, cache, dgrad_runs):
        return None
    if kept is None:
        return grouped_ops.weight_amax(w, recipe)
    return kept.get(
        ("amax", chunk),
        weight,
        lambda: grouped_ops.weight_amax(chunk_of(shard, weight, 1, chunk), recipe),
    )


def _kept(cache, gemm: str, chunk: int, weight, shard: Shard, recipe, origin, dtype):
    """The stacked weight's operand of `gemm` for one chunk from the module's WeightOperands
    (keyed by the parameter `weight`), or None: no cache, or not RTNE (quantized per call).
    Made from the parameter's chunk when made (parallel_gemm.kept_weight says why); one
    operand for both GEMMs where they are one tensor (parallel_gemm.kept_key)."""
    if cache is None or not ops.cacheable(recipe, gemm):
        return None
    _, n, k = weight.shape
    key = kept_key(gemm, chunk, shard, n, k, recipe, dtype or weight.dtype)
    return cache.get(
        key,
        weight,
        lambda: grouped_ops.weight_operand(
            key[0], chunk_of(shard, weight, 1, chunk), recipe, origin=origin, dtype=dtype
        ),
    )


def _check_grouped(
    binding: UFP4Binding, dims, partition_dim: int, stride: int, tp: int, full: int
) -> None:
    """One launch quantizes all experts' weights: blocks must not straddle experts or
    shards."""
    recipe = binding.recipe
    unit = recipe.shard_unit
    for axis, size in enumerate(dims):
        per_chunk = size // stride if axis == partition_dim else size
        if per_chunk % unit:
            what = f"{full}/TP/stride = {per_chunk}" if axis == partition_dim else str(size)
            raise ValueError(
                f"grouped experts {binding.path}: {what} is not a multiple of {unit} (block and "
                f"RHT sizes of recipe {recipe.name!r}); choose expert sizes divisible by "
                f"expert-TP*{stride * unit}, or moe_grouped_gemm=false."
            )


def _stacked_sharded_tensor(key, t, outer, ep, tp_axis, tp_group, stride, replica):
    """ShardedTensor of a stacked [E_local, ...] tensor: axis 0 is this EP rank's slice of the
    experts axis (ep = (rank, size)), tp_axis (per expert) is split over expert-TP; a stride-2
    (SwiGLU) shard holds two chunks of the full axis, saved as a factory of two tensors."""
    prepend = len(outer)
    offsets = [*outer, (prepend, *ep)]
    tp, rank = get_pg_size(tp_group), get_pg_rank(tp_group)
    if tp_axis is None:
        return ShardedTensor.from_rank_offsets(
            key, t, *offsets, replica_id=replica, prepend_axis_num=prepend
        )
    axis = prepend + 1 + tp_axis
    if stride == 1:
        return ShardedTensor.from_rank_offsets(
            key, t, *offsets, (axis, rank, tp), replica_id=replica, prepend_axis_num=prepend
        )

    @torch.no_grad()
    def build(key, data, replica_id, flattened_range):
        chunks = torch.chunk(data, stride, dim=1 + tp_axis)
        return [
            ShardedTensor.from_rank_offsets(
                key,
                c,
                *offsets,
                (axis, rank + i * tp, stride * tp),
                replica_id=replica_id,
                prepend_axis_num=prepend,
            )
            for i, c in enumerate(chunks)
        ]

    @torch.no_grad()
    def merge(parts):
        return torch.cat(parts, dim=1 + tp_axis)

    return ShardedTensorFactory(key, t, build, merge, replica)


def _device(config):
    return "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
