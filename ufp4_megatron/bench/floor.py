"""The memory floor of a 4-bit step: what its QDQ passes must move, at the copy bandwidth.

On Hopper each quantized GEMM operand is fake-quantized by a kernel that reads the bf16
operand and writes its bf16 QDQ copy, once per layout it is used in, so a training step
costs at least a BF16 step plus

    floor = QDQ bytes per step / copy bandwidth (read + write, measured in the same run)

Per quantized linear (K inputs, N outputs) and micro-batch of T tokens the operands are:
fprop x [T, K] and w [N, K] row-wise; dgrad dy [T, N] row-wise and w column-wise; wgrad dy and
x column-wise: 2 T (K + N) activation elements and 2 N K weight elements, 4 bytes each (2
read, 2 written). Kept weight operands (train.weight_cache) are quantized once per step, not
per micro-batch. A routed expert sees its tokens (T x top-k over all experts); padding to
capacity (factor c) makes that c x T x top-k. Only the decoder's linears are quantized (not
the router, embeddings or head), outside the layers kept in BF16: train/footprint.py's
quantized_linears, which the weight cache's memory estimate counts too.

A recipe with e4m3 tensor scales (NVFP4) needs each operand's tensor amax before its QDQ
pass: one more read of it, 2 bytes per element, once whatever the layouts it is quantized in
(one read gives both of x's or dY's amaxes, kernels.tensor_amax_pair; w's as well).
"""

from __future__ import annotations

BYTES_PER_ELEMENT = 4  # a bf16 read and a bf16 write
AMAX_BYTES_PER_ELEMENT = 2  # a bf16 read: an e4m3-scaled operand's tensor amax, taken first


def amax_bytes(recipe) -> dict[str, int]:
    """Per operand (x, w, dy): bytes per element of its tensor amax pass, 0 where no GEMM
    of `recipe` quantizes it with e4m3 scales."""
    from ..quant.recipe import GEMMS, OPERAND_NAMES, OPERANDS

    def e4m3(name):
        ops = (recipe.operand(g, name) for g in GEMMS if name in OPERANDS[g])
        return any(op is not None and op.scale == "e4m3" for op in ops)

    return {name: AMAX_BYTES_PER_ELEMENT * e4m3(name) for name in OPERAND_NAMES}


def qdq_bytes_per_step(cfg, micro_batches: int, weight_cache: str) -> float:
    """Bytes the QDQ passes of one optimizer step move at least (module docstring);
    weight_cache: the resolved train.weight_cache (all, experts or none)."""
    from ..train.footprint import quantized_linears
    from ..train.precision import recipe_from_config

    linears = quantized_linears(cfg)
    amax = amax_bytes(recipe_from_config(cfg.precision)) if linears else {}
    tokens = cfg.train.seq_len * cfg.train.micro_batch
    total = 0.0
    for k, n, share, expert in linears:
        kept = weight_cache == "all" or (weight_cache == "experts" and expert)
        t = tokens * share
        total += micro_batches * (
            BYTES_PER_ELEMENT * 2 * t * (k + n) + amax["x"] * t * k + amax["dy"] * t * n
        )
        total += (1 if kept else micro_batches) * (BYTES_PER_ELEMENT * 2 + amax["w"]) * n * k
    return total


def copy_bandwidth(n: int = 8192) -> float:
    """Bytes per second (read + write) of a device copy of an n x n bf16 tensor now: median
    of 20 timed copies."""
    import statistics

    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for _ in range(20):
        ev[0].record()
        b.copy_(a)
        ev[1].record()
        torch.cuda.synchronize()
        times.append(ev[0].elapsed_time(ev[1]) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2 * n * n / statistics.median(times)
