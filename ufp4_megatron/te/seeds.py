"""Stochastic-rounding seeds of the TransformerEngine route: the CUDA generator's stream.

A layout quantizer that rounds stochastically draws one seed per quantize call (dY: once for
its dgrad layout, once for its wgrad layout, in backward). TE's quantizer roles carry no layer
or module name when Megatron builds them, so the seed is not keyed like the local route's
(layer, role) stream: it is drawn from the device's current CUDA generator, the one Megatron
seeds with --seed and saves in every checkpoint (Megatron-LM's `rng_state`, the trainer's
checkpoint): seed = mix_seed(generator seed, generator offset, global rank), then the offset
advances by 4 (one Philox draw). So
  - a run resumed from a checkpoint draws the bits of the unbroken run (the generator state
    is restored with it);
  - activation recompute replays a forward's draws from the RNG state Megatron restores, and
    draws in backward continue the stream of the run without recompute;
  - every rank draws its own bits (the global rank is mixed in; tensor parallelism with SR is
    refused by the factory, so no two ranks share a tensor that must round alike);
  - inside a CUDA graph capture a draw refuses (a captured host seed would repeat each step).
Within one call the GEMM and operand are mixed in by the layout (layouts.py), as in quant/ops.py.

`fixed(seed)` makes every draw return one value: the module-parity checks use it to give the TE
route the call seed the local route gets (gpu/te_check.sh).
"""

from __future__ import annotations

import contextlib

import torch

from ..numerics.checks import check_seed
from ..numerics.philox import mix_seed

_FIXED: list[int] = []


@contextlib.contextmanager
def fixed(seed: int):
    """Every draw inside returns `seed` (a 63-bit int): parity checks against the local
    route, whose call seed is an argument there."""
    _FIXED.append(check_seed(seed))
    try:
        yield
    finally:
        _FIXED.pop()


def draw(device: torch.device) -> int:
    """The next SR seed for a quantize call on `device` (module docstring)."""
    if _FIXED:
        return _FIXED[-1]
    if device.type != "cuda":
        raise ValueError(
            f"ufp4_megatron.te: stochastic rounding of a tensor on {device}: the "
            "TransformerEngine route draws its SR seeds from the CUDA generator"
        )
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "ufp4_megatron.te: stochastic rounding inside a CUDA graph: its seed is a host "
            "value the graph would replay every step; run without CUDA graphs or with a recipe "
            "without SR"
        )
    gen = torch.cuda.default_generators[
        device.index if device.index is not None else torch.cuda.current_device()
    ]
    offset = gen.get_offset()
    gen.set_offset(offset + 4)
    return mix_seed(gen.initial_seed(), offset, _rank())


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
