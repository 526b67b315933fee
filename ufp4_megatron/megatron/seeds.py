"""Per-call stochastic-rounding seeds: one small, checkpointable stream per model.

Every UFP4 linear that needs SR draws one 63-bit value from a CPU `torch.Generator` per
forward pass with grad enabled, and mixes it with the global layer number, the linear's role,
the global expert index and the data-parallel rank (`mix_seed`, splitmix64). Invariants:
  - identical on all tensor-parallel ranks: TP ranks run the same layers in the same order,
    so they draw the same values, and the TP rank is never mixed in (shards then key their
    bits by global element position, see ops);
  - different across data-parallel replicas (their data differ) and across layers/experts;
  - no draws in eval / no-grad forwards, so evaluation does not shift the training stream;
  - `state_dict()` / `load_state_dict()` restore the stream exactly, for bit-exact resume.
Activation recompute re-runs forwards and so draws again: still deterministic, but a run
with recompute does not reproduce the SR bits of one without.

CUDA graphs: a seed is a host integer handed to the kernel, so a captured graph would replay
the seed it captured on every step (the same rounding noise each step: correlated, no longer
the unbiased noise SR is for), and the stream would stop advancing. A draw during capture
therefore refuses (SRCaptureError) instead of training on frozen noise; recipes without SR
draw nothing and are not affected.
"""

from __future__ import annotations

import torch

from ..numerics.philox import mix_seed


class SRCaptureError(RuntimeError):
    """An SR seed drawn while a CUDA graph is being captured (module docstring)."""


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class SRSeeds:
    """The per-call SR seed stream shared by a model's UFP4 linears (one per pipeline chunk)."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self._gen = torch.Generator(device="cpu")
        self._gen.manual_seed(self.seed)
        self.draws = 0

    def draw(self, *salt: int) -> int:
        """The next seed, mixed with `salt` (layer, role, expert, data-parallel rank)."""
        if _capturing():
            raise SRCaptureError(
                "stochastic rounding inside a CUDA graph: its seed is a host value the graph "
                "would replay every step (the same rounding noise each step); run without CUDA "
                "graphs (Megatron: drop --enable-cuda-graph / --cuda-graph-impl, "
                "cuda_graph_impl='none') or with a recipe without SR"
            )
        base = int(torch.randint(0, 2**62, (1,), generator=self._gen).item())
        self.draws += 1
        return mix_seed(base, *salt)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "draws": self.draws, "generator": self._gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.draws = int(state["seed"]), int(state["draws"])
        self._gen.set_state(state["generator"])

    def __deepcopy__(self, memo):
        # Megatron deep-copies configs and sometimes specs (shared experts, MTP); the stream
        # is a shared service, and a copy would silently fork it away from the checkpoint.
        return self

    def __repr__(self) -> str:
        return f"SRSeeds(seed={self.seed}, draws={self.draws})"
