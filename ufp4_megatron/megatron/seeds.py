"""Per-call stochastic-rounding seeds: one small, checkpointable stream per model.

Every UFP4 linear that needs SR draws once per forward pass with grad enabled. Draw number k
of a run seeded s, salted with the global layer number, the linear's role, the global expert
index and the data-parallel rank, has the call seed

    numerics.philox.stream_seed(s, k, layer, role, expert, dp_rank)   (splitmix64)

and each GEMM operand (and expert) of the call its key from that seed (operand_keys). The
stream is counter-based: a draw depends on (s, k) alone. On the GPU the counter k lives in
device memory and a draw is one kernel (kernels/keys_triton.py) that writes the call's key
table [6, E] and advances the counter: no host value changes per call, so a CUDA graph that
captured draws replays fresh ones each time, the same keys the eager run draws in the same
order (graph-safe SR: losses with and without graphs are the same). On the CPU the counter is
a host integer and a draw returns the call seed itself (ops derives the keys).

Invariants:
  - identical on all tensor-parallel ranks: TP ranks run the same layers in the same order,
    so they draw the same values, and the TP rank is never mixed in (shards then key their
    bits by global element position, see ops);
  - different across data-parallel replicas (their data differ) and across layers/experts;
  - no draws in eval / no-grad forwards, so evaluation does not shift the training stream;
  - the throw-away forwards Megatron runs before capturing a layer's CUDA graph draw from a
    copy of the counter, so a run with `cuda_graph_impl="local"` draws the same keys in the
    same order as the eager run;
  - `state_dict()` / `load_state_dict()` restore the stream exactly (the seed and the number
    of draws), for bit-exact resume. Activation recompute re-runs forwards and so draws
    again: still deterministic, but a run with recompute does not reproduce the SR bits of
    one without.

Streams saved before the counter-based stream (format 1: a CPU torch.Generator whose values
were the base of each call seed) resume in that format, so such a run continues exactly; its
seeds are host integers, which a CUDA graph would freeze, so a draw under capture refuses
(SRCaptureError), as any host-integer draw does (the CPU path).
"""

from __future__ import annotations

import torch

from ..numerics.philox import KEY_ROWS, mix_seed, stream_seed

FORMAT = 2  # state_dict's format: 2 counter-based; 1 (no "format" key) a CPU generator's
# devices whose draws run the draw kernel (the CPU tests add "cpu" under Triton's interpreter)
DEVICE_DRAWS = {"cuda"}


class SRCaptureError(RuntimeError):
    """A host-integer SR seed drawn while a CUDA graph is being captured (module docstring)."""


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _graph_warmup() -> bool:
    """Inside Megatron's warm-up runs before a per-layer capture (CudaGraphManager runs each
    layer's forward and backward a few extra times on cloned inputs): their results are
    thrown away, so their draws must not advance the stream the eager run follows."""
    try:
        from megatron.core.transformer.cuda_graphs import is_graph_warmup
    except ImportError:  # Megatron-Core without per-layer graphs: no such warm-up
        return False
    return is_graph_warmup()


class SRSeeds:
    """The per-call SR seed stream shared by a model's UFP4 linears (one per pipeline chunk)."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)
        self._draws = 0  # host count: CPU draws, and the device counter's start
        self._counter: torch.Tensor | None = None  # int64 [1] on the GPU after a GPU draw
        self._legacy: torch.Generator | None = None  # a format-1 stream's generator
        self._launches: dict = {}  # prepared draw launches per call site

    def draw(
        self, *salt: int, experts: tuple[int, int] | None = None, device: torch.device | None = None
    ):
        """The next draw, salted with `salt` (layer, role, expert, data-parallel rank).

        On a CUDA `device`: the call's key table, an int64 tensor [6, E] on the device
        (numerics.philox.operand_keys; experts=(first global expert, E) for a grouped call,
        else E = 1). Elsewhere, or for a format-1 stream: the call seed, an int."""
        if self._legacy is not None or device is None or device.type not in DEVICE_DRAWS:
            return self._host_draw(salt)
        return self._device_draw(salt, experts, device)

    def _host_draw(self, salt) -> int:
        if _capturing():
            raise SRCaptureError(
                "stochastic rounding inside a CUDA graph: its seed is a host value the graph "
                "would replay every step (the same rounding noise each step); this happens "
                "for a stream resumed from a checkpoint of an older ufp4-megatron (its SR "
                "format cannot be drawn on the device) or tensors off the GPU: run without "
                "CUDA graphs (train.cuda_graph=none; Megatron: drop --cuda-graph-impl) or "
                "with a recipe without SR"
            )
        if self._counter is not None:  # back from the GPU (rare): continue its count
            self._draws, self._counter = int(self._counter.item()), None
        if self._legacy is not None:
            base = int(torch.randint(0, 2**62, (1,), generator=self._legacy).item())
            self._draws += 1
            return mix_seed(base, *salt)
        seed = stream_seed(self.seed, self._draws, *salt)
        self._draws += 1
        return seed

    def _device_draw(self, salt, experts, device) -> torch.Tensor:
        from ..kernels.keys_triton import _draw_keys_kernel
        from ..kernels.launch import Prepared

        if len(salt) > 4:
            raise ValueError(f"at most 4 salts per SR draw on the GPU, got {salt}")
        if device.type == "cuda" and device.index is None:  # "cuda" is the current device
            device = torch.device("cuda", torch.cuda.current_device())
        counter = self._counter
        if counter is None or counter.device != device:
            if _capturing():
                raise SRCaptureError(
                    "the SR stream's draw counter is not on the GPU yet: run one step "
                    "eagerly before capturing a CUDA graph (Megatron's warm-up steps do)"
                )
            counter = self._counter = torch.tensor([self.draws], dtype=torch.int64, device=device)
        if _graph_warmup():  # a throw-away run: draw from a copy, leave the stream where it is
            counter = counter.clone()
        first, n = experts if experts is not None else (0, 1)
        keys = torch.empty(KEY_ROWS, n, dtype=torch.int64, device=device)
        site = (salt, experts is not None, first, n)
        run = self._launches.get(site)
        if run is None:
            if len(self._launches) > 4096:  # call sites are few; never grow without bound
                self._launches.clear()
            run = self._launches[site] = Prepared(
                _draw_keys_kernel,
                (1,),
                dict(
                    E=n,
                    NSALT=len(salt),
                    EXPERTS=experts is not None,
                    BLOCK=min(128, 1 << max(0, (n - 1).bit_length())),
                    num_warps=1,
                ),
            )
        run(counter, keys, self.seed, *salt, *(0,) * (4 - len(salt)), first)
        return keys

    @property
    def draws(self) -> int:
        """Draws so far (on the GPU read from the device counter: a synchronisation)."""
        return int(self._counter.item()) if self._counter is not None else self._draws

    def state_dict(self) -> dict:
        if self._legacy is not None:
            return {"seed": self.seed, "draws": self.draws, "generator": self._legacy.get_state()}
        return {"format": FORMAT, "seed": self.seed, "draws": self.draws}

    def load_state_dict(self, state: dict) -> None:
        self.seed, draws = int(state["seed"]), int(state["draws"])
        if state.get("format", 1) == 1:  # an older checkpoint: continue its own stream
            self._legacy = torch.Generator(device="cpu")
            self._legacy.set_state(state["generator"])
            self._counter = None
        elif state["format"] == FORMAT:
            self._legacy = None
        else:
            raise ValueError(
                f"SR seed stream of format {state['format']!r}: this ufp4-megatron "
                f"reads formats 1 and {FORMAT}; resume with the version that "
                "wrote the checkpoint"
            )
        self._draws = draws
        if self._counter is not None:
            self._counter.fill_(draws)

    def __deepcopy__(self, memo):
        # Megatron deep-copies configs and sometimes specs (shared experts, MTP); the stream
        # is a shared service, and a copy would silently fork it away from the checkpoint.
        return self

    def __repr__(self) -> str:
        kind = (
            "format 1"
            if self._legacy is not None
            else "on the GPU"
            if self._counter is not None
            else "on the host"
        )
        return f"SRSeeds(seed={self.seed}, {kind})"
