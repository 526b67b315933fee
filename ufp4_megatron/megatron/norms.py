"""Megatron's torch-only norm under sequence parallelism (no apex, no TransformerEngine).

`WrappedTorchNorm` asserts `not config.sequence_parallel`, so Megatron's local spec cannot run
TP with SP without apex. The norm itself is sequence-local; what SP needs is that its
parameters be marked `sequence_parallel`, so `finalize_model_grads` all-reduces their
gradients over TP (each rank saw only its slice of the sequence) - exactly what apex's
FusedLayerNorm and TE's norms do. `SequenceParallelTorchNorm` builds the torch norm from a
config copy with SP off and marks the parameters; the spec rewrite uses it only when SP is on.
"""

from __future__ import annotations

import copy

from megatron.core.transformer.torch_norm import WrappedTorchNorm


def sequence_parallel_torch_norm(*, config, hidden_size: int, eps: float = 1e-5, **kwargs):
    """A LayerNormBuilder: WrappedTorchNorm with SP-marked parameters."""
    local = copy.copy(config)
    local.sequence_parallel = False
    norm = WrappedTorchNorm(config=local, hidden_size=hidden_size, eps=eps, **kwargs)
    for p in norm.parameters():
        p.sequence_parallel = config.sequence_parallel
    return norm
