"""Core attention for the layer spec: PyTorch's fused scaled_dot_product_attention.

`SDPAttention` takes DotProductAttention's place (`core_attention` of SelfAttention) with the
same constructor and forward contract (query [sq, b, np, hn], key/value [sk, b, ng, hn] ->
context [sq, b, np * hn]), and runs one fused kernel: FlashAttention, cuDNN or the
memory-efficient kernel on GPUs (PyTorch picks, or `kernels` fixes the order), the math
kernel on CPU. Causal attention needs no mask tensor (is_causal); GQA runs without
repeating key/value heads (enable_gqa). A given mask (Megatron's convention, True = masked
out) is honoured as it is; then PyTorch picks a kernel that takes masks.
Attention is never quantized: it runs the same for every recipe.

`core_attention_spec(backend)` is what the trainer puts into the layer spec:
"sdpa" (this module), "te" (TransformerEngine's TEDotProductAttention, when installed) or
"megatron" (Megatron's unfused DotProductAttention, which needs a materialised mask on CPU).
"""

from __future__ import annotations

import contextlib
import math

import torch.nn.functional as F
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide

BACKENDS = ("sdpa", "te", "megatron")
KERNELS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


class SDPAttention(MegatronModule):
    """DotProductAttention's contract on torch.nn.functional.scaled_dot_product_attention.

    kernels: SDPA kernel names in priority order ("cudnn", "flash", "efficient", "math"),
    or None for PyTorch's own choice.
    """

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
        kernels: tuple[str, ...] | None = None,
    ):
        super().__init__(config=config)
        unsupported = {
            "context_parallel_size > 1": config.context_parallel_size > 1,
            f"softmax_type={config.softmax_type!r}": config.softmax_type != "vanilla",
            "window_size": config.window_size is not None,
        }
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise ValueError(
                f"SDPAttention does not support {', '.join(bad)}; use "
                "model.attention_backend=te (TransformerEngine) or megatron"
            )
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp = pg_collection.tp.size()
        self.attn_mask_type = attn_mask_type
        self.heads = divide(config.num_attention_heads, tp)
        self.groups = divide(config.num_query_groups, tp)
        head_dim = config.kv_channels
        # Megatron's query-key layer scaling divides the scores by layer_number and multiplies
        # them back inside its fp32 softmax: the same scores, so only the plain scale remains.
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.sequence_parallel = config.sequence_parallel
        self._kernels = _sdpa_kernels(kernels)

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError(
                "SDPAttention takes neither packed sequences nor an "
                "attention bias; use model.attention_backend=te"
            )
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        # [s, b, h, d] -> [b, h, s, d] views; the kernels take these strides as they are
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask, causal = None, False
        if attention_mask is not None:
            mask = ~attention_mask  # Megatron: True = masked out; SDPA: True = attend
        elif mask_type == AttnMaskType.causal:
            causal = q.shape[2] > 1  # one query (a KV-cache step) attends to every key
        elif mask_type != AttnMaskType.no_mask:
            raise ValueError(f"attention mask type {mask_type} needs an attention_mask")
        p = self.dropout if self.training else 0.0
        rng = (
            get_cuda_rng_tracker().fork()
            if p > 0 and not self.sequence_parallel
            else contextlib.nullcontext()
        )
        with rng, self._kernels():
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=p,
                is_causal=causal,
                scale=self.softmax_scale,
                enable_gqa=self.groups != self.heads,
            )
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * query.shape[3])


def _sdpa_kernels(kernels: tuple[str, ...] | None):
    if kernels is None:
        return contextlib.nullcontext
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown or not kernels:
        raise ValueError(
            f"unknown SDPA kernel(s) {unknown or kernels}; valid: {', '.join(KERNELS)}"
        )
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [getattr(SDPBackend, KERNELS[k]) for k in kernels]
    if len(order) == 1:
        return lambda: sdpa_kernel(order)
    return lambda: sdpa_kernel(order, set_priority=True)  # the listed order, not PyTorch's


def core_attention_spec(backend: str, kernels: tuple[str, ...] | None = None):
    """The core_attention module (or partial) for `backend` (see module docstring)."""
    if backend == "sdpa":
        if kernels is None:
            return SDPAttention
        import functools

        _sdpa_kernels(tuple(kernels))  # validate now, not at the first forward
        return functools.partial(SDPAttention, kernels=tuple(kernels))
    if backend == "te":
        from megatron.core.extensions.transformer_engine import HAVE_TE

        if not HAVE_TE:
            raise ValueError(
                "model.attention_backend=te needs TransformerEngine, which is not "
                "installed; use sdpa (PyTorch's fused attention)"
            )
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        return TEDotProductAttention
    if backend == "megatron":
        from megatron.core.transformer.dot_product_attention import DotProductAttention

        return DotProductAttention
    raise ValueError(f"unknown attention backend {backend!r}; valid: {', '.join(BACKENDS)}")


def with_core_attention(spec, core_attention):
    """A copy of a Megatron layer or block spec whose self-attention core is `core_attention`
    (the other submodules untouched; for the UFP4 rewrite that follows)."""
    import dataclasses

    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    if isinstance(spec, TransformerBlockSubmodules):
        return dataclasses.replace(
            spec, layer_specs=[with_core_attention(s, core_attention) for s in spec.layer_specs]
        )
    layer = spec.submodules
    attn = layer.self_attention
    if not (isinstance(attn, ModuleSpec) and hasattr(attn.submodules, "core_attention")):
        raise TypeError(
            f"expected a layer spec with self_attention.submodules.core_attention, "
            f"got {type(attn).__name__}"
        )
    attn = dataclasses.replace(
        attn, submodules=dataclasses.replace(attn.submodules, core_attention=core_attention)
    )
    return dataclasses.replace(spec, submodules=dataclasses.replace(layer, self_attention=attn))
