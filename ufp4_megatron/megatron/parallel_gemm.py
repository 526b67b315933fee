"""The autograd function of a UFP4 tensor-parallel linear: Megatron's communication, UFP4 GEMMs.

It mirrors `LinearWithGradAccumulationAndAsyncCommunication` (megatron-core 0.19.2) step for
step, and swaps each of its three matmuls for `ufp4_megatron.quant.ops`:

    forward   [SP: all-gather x over TP]       y  = fprop(x, w)
    backward  [SP: all-gather x again, async]  dx = dgrad(dy, w)
              [all-reduce dx, or SP: reduce-scatter dx, async]
              dw = wgrad(dy, x)  -> weight.grad, or added into weight.main_grad
              (gradient_accumulation_fusion, done with torch instead of apex's fused kernel)

`Shard` tells ops where this rank's operands sit in the unsharded GEMM, so stochastic-rounding
bits equal those of TP=1. Rows always start at 0 (every rank holds all tokens of the GEMM: SP
gathers them first). A column-parallel weight with partition stride s > 1 (the gated fc1 of
SwiGLU: local rows are [gate_r; up_r]) is s separate chunks of the full N axis; each chunk is
its own call into ops at its own offset: fprop and wgrad outputs are concatenated, dgrad's
partial products summed (like a TP reduction); x, which every chunk shares, is quantized once
for all of them where it rounds to nearest. With stride 1 there is one chunk, one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core.parallel_state import get_global_memory_buffer

from ..quant import ops
from ..quant.recipe import Recipe


@dataclass(frozen=True)
class Shard:
    """This rank's place in the full GEMM: K offset, and N chunks (local, full, width)."""

    k: int = 0  # row-parallel: K offset of x and w columns
    n: tuple[tuple[int, int, int], ...] = ((0, 0, -1),)  # width -1: the whole local N

    @staticmethod
    def column(rank: int, world: int, n_local: int, stride: int = 1) -> Shard:
        # Megatron's partition with stride s: the full N axis is cut into world*s chunks,
        # rank r holds chunks r, r+world, ... (megatron.core.tensor_parallel.layers).
        if stride == 1 or world == 1:  # one contiguous block of the full N axis: one call
            return Shard(n=((0, rank * n_local, -1),))
        width = n_local // stride
        return Shard(n=tuple((c * width, (rank + c * world) * width, width) for c in range(stride)))

    @staticmethod
    def row(rank: int, k_local: int) -> Shard:
        return Shard(k=rank * k_local)


@dataclass(frozen=True)
class Comm:
    """Megatron's communication flags for one call (see LinearWithGradAccumulation...)."""

    sequence_parallel: bool
    allreduce_dgrad: bool
    grad_accumulation_fusion: bool
    tp_group: dist.ProcessGroup | None


def _gather_tokens(x: torch.Tensor, group, async_op: bool = False):
    size = list(x.shape)
    size[0] *= group.size()
    buf = get_global_memory_buffer().get_tensor(size, x.dtype, "mpu")
    handle = dist.all_gather_into_tensor(buf, x.contiguous(), group=group, async_op=async_op)
    return buf, handle


def chunk_of(shard: Shard, t: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """Chunk `index` of t along the local N dim (a contiguous copy where it is a slice)."""
    local, _, width = shard.n[index]
    return t if width < 0 else t.narrow(dim, local, width).contiguous()


def _chunks(shard: Shard, t: torch.Tensor, dim: int):
    """(chunk of t along the local N dim, full N offset) for each chunk."""
    for i, (_, full, _) in enumerate(shard.n):
        yield chunk_of(shard, t, dim, i), full


def kept_key(gemm: str, chunk: int, shard: Shard, n: int, k: int, recipe, dtype) -> tuple:
    """The weight cache's key of `gemm`'s operand of chunk `chunk` of a weight [n, k] (n: all
    of the local N axis): (gemm, chunk), and fprop's for dgrad where the two operands are one
    tensor (ops.shares_weight_operand: NVFP4's 16x16 tiles), so one is kept for both."""
    width = shard.n[chunk][2]
    if gemm == "dgrad" and ops.shares_weight_operand(recipe, n if width < 0 else width, k, dtype):
        return "fprop", chunk
    return gemm, chunk


def kept_weight(cache, gemm: str, chunk: int, weight, shard: Shard, recipe, origin):
    """The weight operand of `gemm` for chunk `chunk` (at `origin` in the full weight) from the
    module's WeightOperands (quant/weight_cache.py; keyed by the parameter `weight`), or None:
    no cache, or an operand that is not RTNE (then ops quantizes it every call). The operand
    is made from the parameter's chunk at the time it is made, never from a copy taken
    earlier: a static operand is re-made from the same closure after each optimizer step.
    Where fprop's and dgrad's operands are one tensor, dgrad takes fprop's entry (`kept_key`)."""
    if cache is None or not ops.cacheable(recipe, gemm):
        return None
    key = kept_key(gemm, chunk, shard, *weight.shape, recipe, weight.dtype)
    return cache.get(
        key,
        weight,
        lambda: ops.operand(key[0], "w", chunk_of(shard, weight, 0, chunk), recipe, origin=origin),
    )


def shares_input(gemm: str, recipe, shard: Shard) -> bool:
    """Whether `gemm`'s chunk calls take one x operand made for all of them: a strided weight
    (more than one chunk) and an x that rounds to nearest. Every chunk's call quantizes the
    same x at the same origin with the same format, so each would make those bits again."""
    return len(shard.n) > 1 and ops.cacheable(recipe, gemm, "x")


def shared_input(gemm: str, x2d, recipe, shard: Shard):
    """x's operand of `gemm`, quantized once for all chunks where `shares_input`, else None."""
    if not shares_input(gemm, recipe, shard):
        return None
    return ops.operand(gemm, "x", x2d, recipe, origin=(0, shard.k))


def quantizes_input_twice(recipe, shard: Shard, wgrad_runs: bool) -> bool:
    """Whether fprop and wgrad both quantize x themselves, so that one read can give both
    their tensor amax: wgrad runs, and neither takes x's operand made once for a strided
    weight's chunks (`shares_input`)."""
    return wgrad_runs and not any(shares_input(g, recipe, shard) for g in ("fprop", "wgrad"))


def quantizes_dy_twice(shard: Shard, wgrad_runs: bool) -> bool:
    """Whether dgrad and wgrad both quantize the one dY tensor, so that one read can give
    both their tensor amax: wgrad runs, and the weight is one chunk (a strided weight's dY
    chunks are copies made per GEMM)."""
    return wgrad_runs and len(shard.n) == 1


def input_amaxes(x2d, recipe, shard: Shard, wgrad_runs: bool):
    """NVFP4's tensor amax of x for fprop and for wgrad from one read (ops.tensor_amaxes),
    where both GEMMs quantize this x themselves (`quantizes_input_twice`); else
    (None, None): each takes its own."""
    if not quantizes_input_twice(recipe, shard, wgrad_runs):
        return None, None
    return ops.tensor_amaxes("x", x2d, recipe)


def shares_weight_amax(w_dtype, x_dtype, recipe, cache, dgrad_runs: bool) -> bool:
    """Whether fprop and dgrad both take a tensor amax of the weight (e4m3 scales,
    ops.takes_tensor_amaxes) and quantize it themselves, so that one read can give both:
    dgrad runs, neither keeps its operand, and w is in x's dtype (the GEMMs' cast would
    change its amax). A recipe without e4m3 weight scales (UFP4, MXFP4) shares, and keeps,
    nothing."""
    if not (dgrad_runs and w_dtype == x_dtype and ops.takes_tensor_amaxes("w", recipe)):
        return False
    return cache is None or not (ops.cacheable(recipe, "fprop") or ops.cacheable(recipe, "dgrad"))


def weight_amaxes(weight, x2d, recipe, shard: Shard, cache, dgrad_runs: bool, kept=None):
    """NVFP4's tensor amax of w for fprop and for dgrad from one read (ops.tensor_amaxes),
    where both GEMMs take it and quantize this weight themselves (`shares_weight_amax`) in one
    chunk; else (None, None): each takes its own. `kept`: the module's store of its weight's
    amaxes (quant/weight_cache.py), which makes them once per optimizer step, not per
    micro-batch: the weight only changes there, and a max is exact, so the same bits."""
    if len(shard.n) > 1 or not shares_weight_amax(
        weight.dtype, x2d.dtype, recipe, cache, dgrad_runs
    ):
        return None, None
    if kept is None:
        return ops.tensor_amaxes("w", weight, recipe)
    both = kept.get("amax", weight, lambda: _stacked(ops.tensor_amaxes("w", weight, recipe)))
    return (None, None) if both is None else (both[0], both[1])


def _stacked(pair):
    """One tensor of a pair of amaxes (what a store keeps in fixed storage), or None."""
    return None if pair[0] is None else torch.stack(pair)


def _fprop(x2d, weight, recipe, seed, shard: Shard, cache=None, x_amax=None, w_amax=None):
    qx = shared_input("fprop", x2d, recipe, shard)
    ys = [
        ops.fprop(
            x2d,
            w,
            recipe,
            seed=seed,
            x_origin=(0, shard.k),
            w_origin=(n0, shard.k),
            qw=kept_weight(cache, "fprop", c, weight, shard, recipe, (n0, shard.k)),
            qx=qx,
            x_amax=x_amax,
            w_amax=w_amax,
        )
        for c, (w, n0) in enumerate(_chunks(shard, weight, 0))
    ]
    return ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)


def _dgrad(dy2d, weight, recipe, seed, shard: Shard, cache=None, dy_amax=None, w_amax=None):
    dxs = [
        ops.dgrad(
            dy,
            w,
            recipe,
            seed=seed,
            dy_origin=(0, n0),
            w_origin=(n0, shard.k),
            qw=kept_weight(cache, "dgrad", c, weight, shard, recipe, (n0, shard.k)),
            dy_amax=dy_amax,
            w_amax=w_amax,
        )
        for c, ((dy, n0), (w, _)) in enumerate(
            zip(_chunks(shard, dy2d, 1), _chunks(shard, weight, 0))
        )
    ]
    return dxs[0] if len(dxs) == 1 else torch.stack(dxs).sum(0)


def _wgrad(dy2d, x2d, recipe, seed, shard: Shard, dy_amax=None, x_amax=None):
    qx = shared_input("wgrad", x2d, recipe, shard)
    dws = [
        ops.wgrad(
            dy,
            x2d,
            recipe,
            seed=seed,
            dy_origin=(0, n0),
            x_origin=(0, shard.k),
            qx=qx,
            dy_amax=dy_amax,
            x_amax=x_amax,
        )
        for dy, n0 in _chunks(shard, dy2d, 1)
    ]
    return dws[0] if len(dws) == 1 else torch.cat(dws, dim=0)


class UFP4ParallelLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x,
        weight,
        bias,
        recipe: Recipe,
        seed,
        shard: Shard,
        comm: Comm,
        cache=None,
        amaxes=None,
    ):
        if comm.sequence_parallel:
            total_x, _ = _gather_tokens(x, comm.tp_group)
        else:
            total_x = x
        x2d = total_x.reshape(-1, total_x.shape[-1])
        amax = input_amaxes(x2d, recipe, shard, ctx.needs_input_grad[1])
        # backward always runs dgrad (as Megatron's function does)
        w_amax = weight_amaxes(
            weight, x2d, recipe, shard, cache, any(ctx.needs_input_grad), kept=amaxes
        )
        y = _fprop(x2d, weight, recipe, seed, shard, cache, x_amax=amax[0], w_amax=w_amax[0])
        y = y.view(*total_x.shape[:-1], weight.shape[0])
        if bias is not None:
            y = y + bias
        # the shard, as Megatron: SP re-gathers in backward; a device key table and the
        # backward GEMMs' amaxes (wgrad's of x, dgrad's of w) too, so that a CUDA graph
        # runner (Megatron's) keeps their memory to the backward graph
        keys = save_seed(seed)
        ctx.n_keys = len(keys)
        ctx.amax_given = (amax[1] is not None, w_amax[1] is not None)
        given = tuple(a for a in (amax[1], w_amax[1]) if a is not None)
        ctx.save_for_backward(x, weight, *keys, *given)
        # main_grad is kept off save_for_backward as Megatron does (modules reused across
        # layers, e.g. MTP, would trip the in-place version check).
        ctx.main_grad = (
            getattr(weight, "main_grad", None) if comm.grad_accumulation_fusion else None
        )
        ctx.recipe, ctx.shard, ctx.comm, ctx.cache = recipe, shard, comm, cache
        ctx.seed = seed if isinstance(seed, int) else 0
        ctx.use_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, *rest = ctx.saved_tensors
        keys, given = rest[: ctx.n_keys], iter(rest[ctx.n_keys :])
        x_amax, w_amax = (next(given) if saved else None for saved in ctx.amax_given)
        recipe, shard, comm = ctx.recipe, ctx.shard, ctx.comm
        seed = keys[0] if keys else ctx.seed
        wgrad_needed = ctx.needs_input_grad[1]
        handle = None
        if wgrad_needed and comm.sequence_parallel:
            total_x, handle = _gather_tokens(x, comm.tp_group, async_op=True)
        else:
            total_x = x
        dy2d = dy.reshape(-1, dy.shape[-1]).contiguous()
        # NVFP4: dY's tensor amax for dgrad and wgrad from one read
        dy_amax = (
            ops.tensor_amaxes("dy", dy2d, recipe)
            if quantizes_dy_twice(shard, wgrad_needed)
            else (None, None)
        )
        dx = _dgrad(dy2d, weight, recipe, seed, shard, ctx.cache, dy_amax[0], w_amax)
        dx = dx.view(*dy.shape[:-1], weight.shape[1])
        if handle is not None:
            handle.wait()

        if comm.allreduce_dgrad:
            handle = dist.all_reduce(dx, group=comm.tp_group, async_op=True)
        if comm.sequence_parallel:
            assert not comm.allreduce_dgrad
            sub_dx = torch.empty(x.shape, dtype=dx.dtype, device=dx.device)
            handle = dist.reduce_scatter_tensor(
                sub_dx, dx.contiguous(), group=comm.tp_group, async_op=True
            )

        grad_weight = None
        if wgrad_needed:
            x2d = total_x.reshape(-1, total_x.shape[-1])
            dw = _wgrad(dy2d, x2d, recipe, seed, shard, dy_amax[1], x_amax)
            grad_weight = _accumulate(weight, dw, ctx.main_grad)
        grad_bias = dy2d.sum(dim=0) if ctx.use_bias else None

        if comm.sequence_parallel:
            handle.wait()
            dx = sub_dx
        elif comm.allreduce_dgrad:
            handle.wait()
        return dx, grad_weight, grad_bias, None, None, None, None, None, None


def save_seed(seed) -> tuple:
    """What of an SR seed goes to save_for_backward: a device key table (seeds.py), not an
    int (kept on ctx)."""
    return (seed,) if isinstance(seed, torch.Tensor) else ()


def _accumulate(weight, dw, main_grad):
    """dW for autograd, or None/dummy after adding it into main_grad (grad accumulation fusion).

    Same contract as Megatron: with `grad_added_to_main_grad` present (Megatron DDP), return a
    dummy gradient so DDP's hooks run on the main thread, and mark the weight.
    """
    if main_grad is None:
        return dw.to(weight.dtype)
    main_grad.add_(dw.to(main_grad.dtype))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    return make(main_grad.shape, dtype=dw.dtype, device=dw.device)
