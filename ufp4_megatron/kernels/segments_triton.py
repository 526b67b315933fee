"""Triton twin of numerics/segments.py: SR keys per row or column segment of a view.

A view's own seed is a host integer, or with SEED_PTR read from device memory (a key table
of kernels/keys_triton.py), so a captured CUDA graph reads each replay's key. Host side
(dispatch.py) passes three small device tables per segmented layout: `sg_idx`, the
segment of every 16 positions along the segmented axis (segments start at multiples of 16,
so a group of 16 never straddles two; positions past the table belong to its last entry),
and per segment its seed (`sg_seed`, int64) and first position (`sg_start`, int32). Under
e4m3 scales the segment also picks its tensor scale (the kernels read `st_ptr + i`).
"""

import triton
import triton.language as tl


@triton.jit
def segment_index(r, c, sg_idx, sg_n16, SEG: tl.constexpr):
    """The segment holding local view row r (SEG == 1) or column c (SEG == 2); 0 when
    SEG == 0 (one segment: the view)."""
    i = 0
    if SEG == 1:
        i = tl.load(sg_idx + tl.minimum(r // 16, sg_n16 - 1))
    elif SEG == 2:
        i = tl.load(sg_idx + tl.minimum(c // 16, sg_n16 - 1))
    return i


@triton.jit
def segment_keys(
    seed, r, c, sg_idx, sg_n16, sg_seed, sg_start, SEG: tl.constexpr, SEED_PTR: tl.constexpr = 0
):
    """(seed, r, c, i) that key the SR bits of local view positions (r, c) (broadcastable
    int tensors), and their segment i: unchanged (i = 0) when SEG == 0 (the view's seed: the
    int64 at address `seed` when SEED_PTR, a key table's entry); else the seed of
    the segment holding r (SEG == 1, row segments) or c (SEG == 2, column segments), and
    that position counted from the segment's start. Origins are added by the caller, after
    this. i also picks a segment's e4m3 tensor scale (dispatch.py)."""
    i = segment_index(r, c, sg_idx, sg_n16, SEG)
    if SEG == 0 and SEED_PTR:
        seed = tl.load(seed)
    if SEG == 1:
        seed = tl.load(sg_seed + i)
        r = r - tl.load(sg_start + i)
    elif SEG == 2:
        seed = tl.load(sg_seed + i)
        c = c - tl.load(sg_start + i)
    return seed, r, c, i
