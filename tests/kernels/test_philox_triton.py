"""philox_triton.philox4x32_10 against numerics.philox, word for word.

The kernels' Philox takes each round's 32x32-bit products from one widening multiply
instead of tl.philox's separate high and low halves; the words must be the reference's (and
so tl.philox's) for any counter and key: Random123's known answer, random counters, edge
counters (0, 1, 2^31 - 1, 2^31, all ones: where a carry or a sign would show), the kernels'
counters (zero upper words) and seeds up to the top of the range. That a seed of 1, which
Triton passes as a constexpr, compiles for a GPU is checked in test_compile_sm90.py.
"""

import pytest
import torch
import triton
import triton.language as tl

from ufp4_megatron.kernels.philox_triton import philox4x32_10
from ufp4_megatron.numerics.philox import philox4x32

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MASK32 = 0xFFFFFFFF


@triton.jit
def _philox_kernel(c_ptr, out_ptr, seed, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    c0 = tl.load(c_ptr + i, mask=m, other=0).to(tl.uint32)
    c1 = tl.load(c_ptr + n + i, mask=m, other=0).to(tl.uint32)
    c2 = tl.load(c_ptr + 2 * n + i, mask=m, other=0).to(tl.uint32)
    c3 = tl.load(c_ptr + 3 * n + i, mask=m, other=0).to(tl.uint32)
    w0, w1, w2, w3 = philox4x32_10(seed, c0, c1, c2, c3)
    tl.store(out_ptr + i, w0.to(tl.int64) & 0xFFFFFFFF, mask=m)
    tl.store(out_ptr + n + i, w1.to(tl.int64) & 0xFFFFFFFF, mask=m)
    tl.store(out_ptr + 2 * n + i, w2.to(tl.int64) & 0xFFFFFFFF, mask=m)
    tl.store(out_ptr + 3 * n + i, w3.to(tl.int64) & 0xFFFFFFFF, mask=m)


def _words(counters: torch.Tensor, seed: int) -> torch.Tensor:
    """[4, n] int64 words of the kernel for [4, n] int64 counters (uint32 values)."""
    c = counters.to(DEVICE)
    out = torch.empty_like(c)
    n = c.shape[1]
    _philox_kernel[(triton.cdiv(n, 256),)](c, out, seed, n, BLOCK=256)
    return out.cpu()


def _reference(counters: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.stack(philox4x32(*counters, seed=seed))


def _random_counters(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2**32, (4, n), generator=gen, dtype=torch.int64)


@pytest.mark.parametrize(
    "seed",
    [0, 1, 0x243F6A88, MASK32, 2**32, 0x299F31D0A4093822, 2**63 - 1, 0x7FFFFFFF00000000],
)
def test_words_equal_the_reference(seed):
    gen = torch.Generator().manual_seed(seed & MASK32)
    edges = torch.tensor([[0, 1, MASK32, 2**31, 2**31 - 1]] * 4, dtype=torch.int64)
    zeros_c23 = _random_counters(300, gen)
    zeros_c23[2:] = 0  # the kernels' counters: (column / 4, row, 0, 0)
    counters = torch.cat([edges, _random_counters(700, gen), zeros_c23], dim=1)
    assert torch.equal(_words(counters, seed), _reference(counters, seed))


def test_random123_known_answer():
    # Random123's kat_vectors, philox4x32_10 with ctr (0x243f6a88, ...) and key
    # (0xa4093822, 0x299f31d0): key words low then high, as the seed packs them.
    counters = torch.tensor([[0x243F6A88], [0x85A308D3], [0x13198A2E], [0x03707344]])
    words = _words(counters, 0x299F31D0A4093822)
    assert [int(w) for w in words[:, 0]] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
