"""Triton twin of numerics/philox.py's SR key tables: one call's keys drawn on the device.

`_draw_keys_kernel` reads a run's draw counter from device memory, writes the call's key
table (numerics.philox.operand_keys of stream_seed(run_seed, draw, *salt): [6, E] int64, row
2 gemm + operand, one column per expert) and advances the counter by one, in a launch of one
program. Nothing of it is a host value that changes per call: captured in a CUDA graph, each
replay draws the next call seed, as the same calls do eagerly. The QDQ kernels then read
their operand's key from that table (SEED_PTR, segments_triton.py). uint64 arithmetic wraps
modulo 2^64 on the GPU and in the interpreter alike, as numerics.philox.mix_seed's masks do.
"""

import triton
import triton.language as tl


@triton.jit
def _mix(z, s):
    """One splitmix64 step of numerics.philox.mix_seed on uint64 z and salt s."""
    z = z + 0x9E3779B97F4A7C15 + s
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _key(z, g: tl.constexpr, o: tl.constexpr):
    """mix_seed(z, g, o) for a seed z (uint64, < 2^63): an operand's key."""
    zero = z - z
    return _mix(_mix(z, zero + g), zero + o) >> 1


# the seed and salts are values, never constexprs: Triton would specialise a 1 (and 0) into
# the kernel, where `.to` does not exist
@triton.jit(do_not_specialize=["run_seed", "s0", "s1", "s2", "s3", "first_expert"])
def _draw_keys_kernel(
    counter_ptr,
    out_ptr,
    run_seed,
    s0,
    s1,
    s2,
    s3,
    first_expert,
    E: tl.constexpr,
    NSALT: tl.constexpr,
    EXPERTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out [6, E] <- the key table of draw *counter_ptr; *counter_ptr += 1. Salts s0..s3, the
    first NSALT of them used; EXPERTS: column e is global expert first_expert + e (else
    E == 1 and no expert mixing). E is a constexpr: a call site's expert count never
    changes, and the loop over BLOCK columns unrolls."""
    draw = tl.load(counter_ptr)
    z = _mix(run_seed.to(tl.int64).to(tl.uint64), draw.to(tl.uint64))
    if NSALT > 0:
        z = _mix(z, s0.to(tl.int64).to(tl.uint64))
    if NSALT > 1:
        z = _mix(z, s1.to(tl.int64).to(tl.uint64))
    if NSALT > 2:
        z = _mix(z, s2.to(tl.int64).to(tl.uint64))
    if NSALT > 3:
        z = _mix(z, s3.to(tl.int64).to(tl.uint64))
    call = z >> 1
    for start in tl.static_range(0, E, BLOCK):
        e = start + tl.arange(0, BLOCK)
        c = tl.zeros((BLOCK,), tl.uint64) + call
        if EXPERTS:
            c = _mix(c, (first_expert + e).to(tl.int64).to(tl.uint64)) >> 1
        for g in tl.static_range(3):
            for o in tl.static_range(2):
                key = _key(c, g, o)
                tl.store(out_ptr + (2 * g + o) * E + e, key.to(tl.int64), mask=e < E)
    tl.store(counter_ptr, draw + 1)
