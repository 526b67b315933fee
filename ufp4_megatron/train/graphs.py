"""train.cuda_graph and train.weight_cache: what they mean for Megatron-Core, and what is refused.

    train.cuda_graph   Megatron-Core                      captured
    none               cuda_graph_impl="none"             nothing
    local              cuda_graph_impl="local",           each transformer layer's forward and
                       cuda_graph_modules=[]              backward (CudaGraphManager), reused
                                                          across micro-batches
    full_iteration     cuda_graph_impl="full_iteration"   the forward and backward of all the
                       (FullCudaGraphWrapper around the   step's micro-batches in one graph;
                       schedule, train/loop.py)           the optimizer step stays eager

Both capture after `train.cuda_graph_warmup` eager steps (Megatron's cuda_graph_warmup_steps):
the kernels compile and the SR stream's draw counter reaches the GPU eagerly first. Both
need Megatron's cudagraphable RNG tracker (train/distributed.py), and stochastic rounding
that draws its keys on the device (megatron/seeds.py), so a replay rounds with fresh noise,
the same as the eager run's: losses with and without graphs are equal. Refused, one line
each: graphs on CPU; an MoE model without static expert shapes (Megatron's drop-and-pad:
model.moe_capacity_factor and model.moe_pad_to_capacity, which Megatron itself requires for
captured MoE layers); pipeline parallelism (not tried); no warm-up step; full_iteration on a
PyTorch without `torch.autograd.graph.set_override_stale_capture_stream` (pytorch#180090):
Megatron-Core captures the backward on its own stream, and the autograd nodes the eager
warm-up steps made still point at the default stream, so the capture fails
(cudaErrorStreamCaptureImplicit; seen with torch 2.11 for BF16 and UFP4 alike).

train.weight_cache=auto keeps all quantized weights' operands where the memory estimate
(train/footprint.py) plus the cache fits 80% of the device, else the routed experts' alone
where that fits, else none; all / experts / none as given (weight_cache.py: the same bits
either way, only memory and time differ). The trainer keeps them in fixed storage and
re-makes them right after each optimizer step (weight_cache.make_static/refresh), so a
graph reads them instead of quantizing the weights at every replay: with local graphs at
dense_1p5b that is UFP4 1.141x BF16 instead of 1.173x, for +12.5% of peak memory
(docs/performance.md).
"""

from __future__ import annotations

from .schema import Config

CUDA_GRAPHS = ("none", "local", "full_iteration")
WEIGHT_CACHE = ("auto", "all", "experts", "none")
FIT_FRACTION = 0.8  # of the device's memory, for the estimate plus the weight cache


def check_cuda_graph(cfg: Config, on_gpu: bool) -> None:
    """Raises ValueError (one line naming the key) for a train.cuda_graph that cannot run."""
    t, m = cfg.train, cfg.model
    if t.cuda_graph not in CUDA_GRAPHS:
        raise ValueError(f"train.cuda_graph={t.cuda_graph!r}; valid: {', '.join(CUDA_GRAPHS)}")
    if m.moe_pad_to_capacity and m.moe_capacity_factor is None:
        raise ValueError(
            "model.moe_pad_to_capacity=true pads to a capacity: set "
            "model.moe_capacity_factor (e.g. 1.0) too"
        )
    if m.moe_capacity_factor is not None and m.moe_capacity_factor <= 0:
        raise ValueError(
            f"model.moe_capacity_factor={m.moe_capacity_factor} must be > 0 (or null: dropless)"
        )
    if t.cuda_graph == "none":
        return
    if not on_gpu:
        raise ValueError(
            f"train.cuda_graph={t.cuda_graph} captures CUDA graphs, which need a "
            "GPU run; use train.cuda_graph=none on CPU"
        )
    if m.num_experts is not None and not (m.moe_capacity_factor and m.moe_pad_to_capacity):
        raise ValueError(
            f"train.cuda_graph={t.cuda_graph} with MoE needs static expert "
            "shapes: set model.moe_capacity_factor (e.g. 1.0) and "
            "model.moe_pad_to_capacity=true (drop-and-pad), or "
            "train.cuda_graph=none"
        )
    if cfg.parallel.pp > 1:
        raise ValueError(
            f"train.cuda_graph={t.cuda_graph} with parallel.pp > 1 is not "
            "supported here (not tried); use train.cuda_graph=none"
        )
    if t.cuda_graph == "full_iteration" and not _captures_backward_on_its_stream():
        import torch

        raise ValueError(
            "train.cuda_graph=full_iteration needs a PyTorch with torch.autograd.graph."
            f"set_override_stale_capture_stream (torch {torch.__version__} has none, and "
            "Megatron-Core's capture of the backward fails without it); use "
            "train.cuda_graph=local"
        )
    if t.cuda_graph_warmup < 1:
        raise ValueError(
            f"train.cuda_graph_warmup={t.cuda_graph_warmup} must be >= 1: the "
            "kernels compile and the SR draw counter reaches the GPU in an "
            "eager step before capture"
        )


def _captures_backward_on_its_stream() -> bool:
    import torch

    return hasattr(torch.autograd.graph, "set_override_stale_capture_stream")


def megatron_config(cfg: Config) -> dict:
    """TransformerConfig fields of train.cuda_graph and the MoE capacity settings."""
    t, m = cfg.train, cfg.model
    out = {}
    if m.num_experts is not None and m.moe_capacity_factor is not None:
        out.update(
            moe_expert_capacity_factor=m.moe_capacity_factor,
            moe_pad_expert_input_to_capacity=m.moe_pad_to_capacity,
        )
    if t.cuda_graph != "none":
        # the whole layer (local) or nothing per layer (full_iteration: one graph outside)
        out.update(
            cuda_graph_impl=t.cuda_graph,
            cuda_graph_modules=[],
            cuda_graph_warmup_steps=t.cuda_graph_warmup,
        )
    return out


def resolve_weight_cache(cfg: Config, device_bytes: int | None) -> str:
    """train.weight_cache with auto decided: device_bytes is the GPU's memory (None on CPU,
    where auto is "all": host memory is not what a CPU run runs short of)."""
    from .footprint import memory_estimate, weight_cache_gib, with_smallest_dp

    asked = cfg.train.weight_cache
    if asked not in WEIGHT_CACHE:
        raise ValueError(f"train.weight_cache={asked!r}; valid: {', '.join(WEIGHT_CACHE)}")
    if asked != "auto":
        return asked
    if device_bytes is None:
        return "all"
    described = with_smallest_dp(cfg)
    base = memory_estimate(described)["total_gib"]
    budget = FIT_FRACTION * device_bytes / 2**30
    for which in ("all", "experts"):
        if (
            weight_cache_gib(described, which) > 0
            and base + weight_cache_gib(described, which) <= budget
        ):
            return which
    return "none"
