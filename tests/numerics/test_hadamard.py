"""The random Hadamard transform.

Contracts: D H / sqrt(n) is orthonormal for every size; the butterfly equals the dense
matrix; inverse undoes rotate; rotating both GEMM operands leaves the product unchanged;
the sign vector is a pure function of (size, seed).
"""

import pytest
import torch

from ufp4_megatron import RHT


@pytest.mark.parametrize("size", [16, 32, 64, 128])
def test_rht_is_orthonormal_and_butterfly_equals_matrix(size):
    r = RHT(size, seed=5)
    m = r.matrix()
    assert torch.allclose(m @ m.T, torch.eye(size, dtype=torch.float64), atol=1e-12)
    x = torch.randn(7, 2 * size, dtype=torch.float64)
    dense = (x.view(7, 2, size) @ m).view(7, 2 * size)
    assert torch.allclose(r.rotate(x.float()).double(), dense, rtol=0, atol=1e-5)
    assert torch.allclose(r.inverse(r.rotate(x)), x, atol=1e-5)


def test_rht_cancels_inside_a_gemm():
    r = RHT(16, seed=1)
    a, b = torch.randn(8, 64, dtype=torch.float64), torch.randn(5, 64, dtype=torch.float64)
    ra, rb = r.rotate(a.float()).double(), r.rotate(b.float()).double()
    assert torch.allclose(ra @ rb.T, a @ b.T, atol=1e-4)


def test_rht_along_any_dim_and_signs_depend_only_on_seed():
    x = torch.randn(32, 3, 16)
    r = RHT(16, seed=9)
    y0 = r.rotate(x, dim=0)
    assert torch.allclose(r.inverse(y0, dim=0), x, atol=1e-5)
    assert torch.equal(RHT(16, 9).signs, r.signs) and not torch.equal(RHT(16, 10).signs, r.signs)
    with pytest.raises(ValueError, match="multiple of 16"):
        r.rotate(torch.randn(4, 20))
    with pytest.raises(ValueError, match="one of"):
        RHT(24)


def _unscaled(r: RHT, x: torch.Tensor) -> torch.Tensor:
    """The rotation as computed before the butterfly ran on x / n: butterfly(x D) * norm."""
    from ufp4_megatron.numerics.hadamard import _butterfly

    y = x.float().unflatten(-1, (-1, r.size)) * r.signs
    return (_butterfly(y) * r.norm).flatten(-2)


@pytest.mark.parametrize("size", [16, 32, 64, 128])
def test_rht_of_values_near_fp32_max_over_sqrt_n_is_finite(size):
    """Finite blocks up to fp32's max / sqrt(n) rotate to finite values (the butterfly used to
    sum them to inf, and inf - inf to NaN: RHT16 of values near 8e37 gave a NaN block)."""
    r = RHT(size, seed=3)
    big = torch.finfo(torch.float32).max / size**0.5 * 0.99
    g = torch.Generator().manual_seed(size)
    x = torch.cat(
        [
            r.signs * big,  # the worst block: every sum adds up to sqrt(n) * big
            (torch.rand(3 * size, generator=g) * 2 - 1) * big,
        ]
    ).reshape(1, -1)
    assert not torch.isfinite(_unscaled(r, x)).all()  # what the old order gave
    y = r.rotate(x)
    assert torch.isfinite(y).all()
    exact = (x.double().view(-1, size) @ r.matrix()).view(1, -1)
    assert torch.allclose(y.double(), exact, rtol=1e-6, atol=big * 1e-6)
    assert y[0, 0] == torch.tensor(big * size**0.5, dtype=torch.float32) or size not in (16, 64)
    assert torch.isfinite(r.inverse(y)).all()
    assert torch.allclose(r.inverse(y).double(), x.double(), rtol=1e-5, atol=big * 1e-6)


def test_rht_scaling_keeps_every_bit_of_normal_range_results():
    """Running the butterfly on x / n changes no bit where the old order neither overflowed nor
    went subnormal: kernels and references of every earlier result still agree."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g) * torch.rand(64, 1, generator=g).mul(60).sub(30).exp2()
    for size in (16, 32, 64, 128):
        r = RHT(size, seed=size)
        assert torch.equal(r.rotate(x), _unscaled(r, x))
