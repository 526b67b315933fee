"""Tiny Megatron GPTs on CPU and the bookkeeping to compare them across parallel layouts:
full (unsharded) parameters in, full gradients out, under layout-independent names."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

from ufp4_megatron.megatron import UFP4Policy, seed_model_parallel
from ufp4_megatron.megatron.attention import core_attention_spec, with_core_attention
from ufp4_megatron.megatron.spec import ufp4_block_spec

SEQ, BATCH, VOCAB = 32, 2, 128
_LOCAL = re.compile(r"\.experts\.local_experts\.(\d+)\.")
_GROUPED = re.compile(r"\.experts\.(linear_fc[12])\.(weight|bias)$")  # stacked [E, ...]


_LAYOUT: list = []


def setup_parallel(tp: int = 1, ep: int = 1, seed: int = 1234) -> None:
    """Megatron's parallel state for (tp, ep), rebuilt only when the layout changes (group
    creation dominates a gloo run's set-up), and the RNGs reseeded."""
    if [tp, ep] != _LAYOUT:
        ps.destroy_model_parallel()
        # gloo is already the default backend: no second set of gloo groups
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            expert_model_parallel_size=ep,
            create_gloo_process_groups=False,
        )
        _LAYOUT[:] = [tp, ep]
    seed_model_parallel(seed)


def tiny_config(
    *,
    moe: bool = False,
    tp: int = 1,
    ep: int = 1,
    sp: bool = False,
    grouped: bool = False,
    glu: bool = False,
    **overrides,
) -> TransformerConfig:
    kw = dict(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
        expert_model_parallel_size=ep,
        add_bias_linear=not moe,
    )
    if glu:  # SwiGLU: fc1 weights are partitioned with stride 2
        kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if moe:
        kw.update(
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=64,
            moe_token_dispatcher_type="allgather",
            moe_grouped_gemm=grouped,
            moe_shared_expert_intermediate_size=64,
        )
    kw.update(overrides)
    return TransformerConfig(**kw)


def build_gpt(
    config: TransformerConfig, policy: UFP4Policy, attention: str = "megatron"
) -> GPTModel:
    base = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm
    )
    if attention != "megatron":
        base = with_core_attention(base, core_attention_spec(attention))
    return GPTModel(
        config=config,
        transformer_layer_spec=ufp4_block_spec(base, config, policy),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        position_embedding_type="rope",
    )


def batch(dp_rank: int) -> torch.Tensor:
    """Tokens of a data-parallel rank (TP ranks of one replica share them)."""
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(dp_rank))


def loss_and_backward(model: GPTModel, tokens: torch.Tensor, masked: bool = True) -> float:
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1)[None, None] if masked else None
    pos = torch.arange(SEQ).expand(BATCH, SEQ)
    loss = model(tokens, pos, mask, labels=tokens).float().mean()
    loss.backward()
    return loss.item()


# ----------------------------------------------------------------------------- layouts


def _per_expert(name: str, t, num_local_experts: int):
    """[(canonical name, tensor)]: one entry, or one per local expert of a stacked grouped
    tensor (t[e], whose partition dim is one less)."""
    first = ps.get_expert_model_parallel_rank() * num_local_experts
    m = _GROUPED.search(name)
    if m:
        fc, kind = m.groups()
        return [
            (
                name[: m.start()] + f".experts.local_experts.{first + e}.{fc}.{kind}",
                None if t is None else t[e],
            )
            for e in range(num_local_experts)
        ]
    return [(_LOCAL.sub(lambda m: f".experts.local_experts.{first + int(m.group(1))}.", name), t)]


def _is_expert(name: str) -> bool:
    return ".experts." in name


def _tp_group(name: str):
    return (
        ps.get_expert_tensor_parallel_group()
        if _is_expert(name)
        else ps.get_tensor_model_parallel_group()
    )


def _partition(p, name: str) -> tuple[int, int] | None:
    """(dim, stride) of a TP-sharded parameter, per expert for stacked ones; None otherwise."""
    if not getattr(p, "tensor_model_parallel", False) or _tp_group(name).size() == 1:
        return None
    return p.partition_dim - (1 if _GROUPED.search(name) else 0), p.partition_stride


def full_state(model) -> dict[str, torch.Tensor]:
    """Parameters of a TP=1, EP=1 model under canonical names."""
    assert ps.get_tensor_model_parallel_world_size() == 1
    assert ps.get_expert_model_parallel_world_size() == 1
    n = model.config.num_moe_experts or 0
    return {
        k: t.detach().clone()
        for name, p in model.named_parameters()
        for k, t in _per_expert(name, p, n)
    }


def load_full_state(model, state: dict[str, torch.Tensor], num_local_experts: int = 0) -> None:
    """Give a model in any TP/EP layout the parameters of a TP=1, EP=1 model."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            part = _partition(p, name)
            group = _tp_group(name)
            for key, local in _per_expert(name, p, num_local_experts):
                full = state[key]
                if part is not None:
                    # Megatron's strided partition: world*stride chunks, rank r takes r::world
                    dim, stride = part
                    chunks = full.chunk(group.size() * stride, dim=dim)
                    full = torch.cat(chunks[group.rank() :: group.size()], dim=dim)
                local.copy_(full)


def full_grads(model, num_local_experts: int = 0, dp_sum: bool = False) -> dict:
    """Gradients as a TP=1 model would hold them: TP shards gathered, sequence-parallel
    partial grads summed over TP (Megatron's finalize_model_grads does this), experts from
    all EP ranks; with dp_sum, summed over data-parallel replicas as DDP would."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        group = _tp_group(name)
        part = _partition(p, name)
        if part is None and getattr(p, "sequence_parallel", False) and group.size() > 1:
            dist.all_reduce(g, group=group)
        if dp_sum:
            dp = (
                ps.get_expert_data_parallel_group()
                if _is_expert(name)
                else ps.get_data_parallel_group()
            )
            dist.all_reduce(g, group=dp)
        for key, local in _per_expert(name, g, num_local_experts):
            if part is not None:
                dim, stride = part
                parts = [torch.empty_like(local) for _ in range(group.size())]
                dist.all_gather(parts, local.contiguous(), group=group)
                local = torch.cat(
                    [q.chunk(stride, dim)[c] for c in range(stride) for q in parts], dim=dim
                )
            out[key] = local
    if ps.get_expert_model_parallel_world_size() > 1:
        parts = [None] * ps.get_expert_model_parallel_world_size()
        dist.all_gather_object(
            parts,
            {k: v for k, v in out.items() if _is_expert(k)},
            group=ps.get_expert_model_parallel_group(),
        )
        for part in parts:
            out.update(part)
    return out
