"""Weights quantized once per optimizer step: a weight's RTNE GEMM operands kept until it changes.

A linear quantizes its weight for fprop (row-wise, along K) and again for dgrad (column-wise,
along N), every micro-batch, though the weight changes only at an optimizer step, a
checkpoint load or a parameter gather. `WeightOperands` keeps both quantized operands of one
weight (one entry per GEMM and shard chunk; one for both GEMMs where they are the same bits,
ops.shares_weight_operand) and returns them while the weight is unchanged.
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
capture each layer's forward and backward once, each with its own GEMM's operand).

Static operands (`make_static`; the trainer makes its model's static): a per-layer graph
replays at every micro-batch, so an operand made inside it is made again at every
micro-batch. Made static, a module's operands live in fixed storage: a stale one is re-made
into the same storage (`Tensor.copy_`), a capture records reads of that storage instead of
the quantization, and `refresh(module)` re-makes every stale operand eagerly. The owner of
the training loop must call `refresh` after every optimizer step and checkpoint load, before
the next forward: a replay reads whatever the storage holds. The trainer does (train/loop.py;
its load comes before the first forward, when no operand exists yet); a loop that gathers
parameters during the forward (Megatron's overlap_param_gather) cannot, so nothing
else makes operands static. An operand found stale inside a capture is made inside the graph
(correct at every replay, only not kept). Each entry re-derives its operand from the
parameter itself (its `make` takes no copy of the weight), so a refresh reads the new values.

The cost is memory: the kept operands (`nbytes`), two of each cached weight's size in the
operand dtype (bf16: 4 bytes per weight element); `ufp4-describe` prints the estimate for a
config (train/footprint.py).

The same store keeps what a weight's quantization needs beyond its operands, at a few bytes:
NVFP4's e4m3 tensor amaxes of a weight (per expert for stacked experts), which every linear
keeps whatever train.weight_cache says (megatron/parallel_gemm.weight_amaxes), so that a step
of 8 micro-batches reads each weight once for them instead of 8 times. A `make` may return
None (nothing to keep, e.g. off the kernel path), for a key whose make always does.
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


class _Entry:
    __slots__ = ("make", "operand", "stamp", "weight")

    def __init__(self, stamp, operand, make, weight):
        self.stamp, self.operand, self.make, self.weight = stamp, operand, make, weight


def _stamp(weight: torch.Tensor) -> tuple:
    return (_generation, weight._version, weight.data_ptr())


class WeightOperands:
    """One weight's kept GEMM operands, by key (e.g. ("fprop", chunk))."""

    __slots__ = ("_entries", "static")

    def __init__(self):
        _ensure_hook()
        self._entries: dict = {}
        self.static = False  # fixed storage, re-made in place (module docstring)

    def get(self, key, weight: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The operand kept under `key` for `weight` (the parameter, whose stamp decides), or
        make() kept from now on. make() must derive the operand from `weight` itself."""
        tag = _capture_tag()
        hit = self._entries.get(key)
        if self.static:
            return self._get_static(key, weight, make, hit, capturing=tag >= 0)
        stamp = (*_stamp(weight), tag)
        if hit is not None and hit.stamp == stamp:
            return hit.operand
        self._entries.pop(key, None)  # free the stale operand before making the new one
        q = make()
        self._entries[key] = _Entry(stamp, q, make, weight)
        return q

    def _get_static(self, key, weight, make, hit, capturing: bool) -> torch.Tensor:
        stamp = _stamp(weight)
        if hit is not None and hit.stamp == stamp:
            return hit.operand  # inside a capture: the graph reads this storage
        if capturing:  # nothing fresh to read: quantize inside the graph, keep nothing
            return make()
        if hit is None:
            self._entries[key] = _Entry(stamp, make(), make, weight)
            return self._entries[key].operand
        if hit.operand is not None:
            with torch.no_grad():
                hit.operand.copy_(make())
        hit.stamp = stamp
        return hit.operand

    @torch.no_grad()
    def refresh(self) -> int:
        """Re-makes every stale static operand in its storage; returns how many."""
        if not self.static:
            return 0
        n = 0
        for e in self._entries.values():
            if e.operand is not None and e.stamp != (stamp := _stamp(e.weight)):
                e.operand.copy_(e.make())
                e.stamp = stamp
                n += 1
        return n

    def clear(self) -> None:
        self._entries.clear()

    @property
    def nbytes(self) -> int:
        return sum(
            e.operand.numel() * e.operand.element_size()
            for e in self._entries.values()
            if e.operand is not None
        )


# the stores a UFP4 linear may hold: its weight's operands, and its weight's tensor amaxes
STORES = ("weight_operands", "weight_amaxes")


def _kept_in(module: torch.nn.Module):
    return [
        store
        for m in module.modules()
        for name in STORES
        if (store := getattr(m, name, None)) is not None
    ]


def make_static(module: torch.nn.Module) -> int:
    """Makes the kept operands (and amaxes) of `module`'s linears static (module docstring);
    the caller then owes a `refresh(module)` after every weight change. Returns how many
    stores (`STORES`) it made static."""
    kept = _kept_in(module)
    for k in kept:
        k.clear()
        k.static = True
    return len(kept)


def refresh(module: torch.nn.Module) -> int:
    """Re-makes the stale static operands of `module`'s linears in place; returns how many."""
    return sum(k.refresh() for k in _kept_in(module))


def kept_bytes(module: torch.nn.Module) -> int:
    """Bytes of all that `module`'s UFP4 linears keep (their `STORES`)."""
    return sum(k.nbytes for k in _kept_in(module))
