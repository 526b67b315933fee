"""Counter-based random bits.

Contracts: Philox4x32-10 matches Random123's known-answer vectors; the bits of an element
depend only on (seed, global position) so a shard at its origin reproduces the full
tensor's bits; different seeds give different bits.
"""

import pytest
import torch

from ufp4_megatron.numerics.philox import (
    mix_seed,
    mix_seeds,
    philox_rounds,
    position_bits,
    uniform24,
)


@pytest.mark.parametrize(
    "ctr,key,expected",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_matches_random123_known_answers(ctr, key, expected):
    out = philox_rounds(*ctr, *key)
    assert tuple(int(w) for w in out) == expected


def test_bits_of_a_shard_equal_the_full_tensor_bits():
    full = position_bits(37, 64, seed=11)
    top = position_bits(20, 64, seed=11, origin=(0, 0))
    bottom = position_bits(17, 64, seed=11, origin=(20, 0))
    left = position_bits(37, 32, seed=11, origin=(0, 0))
    right = position_bits(37, 32, seed=11, origin=(0, 32))
    assert torch.equal(torch.cat([top, bottom]), full)
    assert torch.equal(torch.cat([left, right], 1), full)


def test_column_origin_must_be_a_multiple_of_four():
    with pytest.raises(ValueError, match="multiple of 4"):
        position_bits(2, 8, seed=0, origin=(0, 6))


def test_seeds_give_independent_uniforms():
    a = uniform24(position_bits(256, 256, seed=1))
    b = uniform24(position_bits(256, 256, seed=2))
    assert not torch.equal(a, b)
    assert float(a.min()) >= 0 and float(a.max()) < 1
    # mean of 65536 U(0,1): sd = 1/sqrt(12 * 65536) ~ 0.00113; 5 sd
    assert abs(float(a.mean()) - 0.5) < 0.0057
    assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 0.02
    assert mix_seed(1, 0, 1) != mix_seed(1, 1, 0) and 0 <= mix_seed(2**62, 5) < 2**63


@pytest.mark.filterwarnings("error")  # no numpy overflow warning: uint64 wraps by design
def test_mix_seeds_equals_mix_seed_elementwise():
    g = torch.Generator().manual_seed(0)
    seeds = [int(v) for v in torch.randint(0, 2**62, (50,), generator=g)] + [0, 2**63 - 1]
    per = list(range(len(seeds)))
    assert mix_seeds(seeds, 7, 2**64 - 1) == [mix_seed(s, 7, 2**64 - 1) for s in seeds]
    assert mix_seeds(seeds, per, 3) == [mix_seed(s, e, 3) for s, e in zip(seeds, per)]
    assert mix_seeds([], 1) == []
