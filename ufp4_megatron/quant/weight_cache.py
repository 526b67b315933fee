"""Weights quantized once per optimizer step: a weight's RTNE GEMM operands kept until it changes.

A linear quantizes its weight for fprop (row-wise, along K) and again for dgrad (column-wise,
along N), every micro-batch, though the weight changes only at an optimizer step, a
checkpoint load or a parameter gather. `WeightOperands` keeps both quantized operands of one
weight (one entry per GEMM and shard chunk) and returns them while the weight is unchanged.
RTNE is deterministic, so a kept operand is bit for bit what quantizing again gives; operands
that round stochastically are never kept (their noise must be fresh every call).

An entry is valid while its weight's stamp is unchanged:
  - the generation: bumped after every torch optimizer step (a global post-step hook,
    registered on first use, so any optimizer built on torch.optim.Optimizer counts:
    Megatron's wrap one and then copy the new values into the model's weights through
    `.data`, which no version counter sees) and by `invalidate()` (the trainer calls it after
    loading a checkpoint);
  - the weight's `_version`: any in-place write through the parameter itself
    (load_state_dict's copy_, `w.mul_(...)` under no_grad);
  - its `data_ptr()`: a parameter whose storage was replaced (`param.data = ...`).
A write through `param.data` outside an optimizer step is invisible to all three: call
`invalidate()` after one.

CUDA graphs: a graph replays the kernels it captured, none of this module's checks. So
while a graph is being captured an operand kept from before it is never used: the first use
in a capture quantizes inside the graph (every replay then quantizes the new weight), and
later uses in the same capture reuse that graph-made operand (a full-iteration graph of
several micro-batches quantizes each weight once per replay, i.e. once per step). A capture
is told from the previous one by the eager use between them (`_capture_epoch`): two graphs
captured back to back must not share a module's operands (Megatron's per-layer graphs
capture each layer's forward and backward once, each with its own GEMM's operand). The cost is memory: the kept operands (`nbytes`), two of each
cached weight's size in the operand dtype (bf16: 4 bytes per weight element); `ufp4-describe`
prints the estimate for a config (train/footprint.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_generation = 0
_hook = None
_capture_epoch = 0  # +1 at each first use in a new capture (module docstring)
_capturing = False  # whether the last use was inside a capture


def invalidate() -> None:
    """Every kept operand is stale from now on (a weight changed where no stamp sees it)."""
    global _generation
    _generation += 1


def _after_step(optimizer, args, kwargs) -> None:
    invalidate()


def _capture_tag() -> int:
    """-1 outside a CUDA-graph capture; inside one, the epoch of the current capture."""
    global _capture_epoch, _capturing
    inside = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if inside and not _capturing:
        _capture_epoch += 1
    _capturing = inside
    return _capture_epoch if inside else -1


def _ensure_hook() -> None:
    global _hook
    if _hook is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _hook = register_optimizer_step_post_hook(_after_step)


class WeightOperands:
    """One weight's kept GEMM operands, by key (e.g. ("fprop", chunk))."""

    __slots__ = ("_entries",)

    def __init__(self):
        _ensure_hook()
        self._entries: dict = {}

    def get(self, key, weight: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The operand kept under `key` for `weight` (the parameter, whose stamp decides), or
        make() kept from now on."""
        stamp = (_generation, weight._version, weight.data_ptr(), _capture_tag())
        hit = self._entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        self._entries.pop(key, None)  # free the stale operand before making the new one
        q = make()
        self._entries[key] = (stamp, q)
        return q

    def clear(self) -> None:
        self._entries.clear()

    @property
    def nbytes(self) -> int:
        return sum(q.numel() * q.element_size() for _, q in self._entries.values())


def kept_bytes(module: torch.nn.Module) -> int:
    """Bytes of all operands kept by `module`'s UFP4 linears (their `weight_operands`)."""
    return sum(
        m.weight_operands.nbytes
        for m in module.modules()
        if getattr(m, "weight_operands", None) is not None
    )
