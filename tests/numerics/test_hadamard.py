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
