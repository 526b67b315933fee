"""Bitwise assertion helpers: kernel output vs the reference, NaN positions included."""

import torch


def assert_bitwise(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    g, w = got.cpu(), want.cpu()
    nan_g, nan_w = torch.isnan(g), torch.isnan(w)
    assert torch.equal(nan_g, nan_w), f"{what}: NaN positions differ"
    if torch.equal(g[~nan_g], w[~nan_w]):
        return
    diff = (g != w) & ~nan_g
    idx = diff.nonzero()[:5].tolist()
    pairs = [(i, g[tuple(i)].item(), w[tuple(i)].item()) for i in idx]
    raise AssertionError(
        f"{what}: {int(diff.sum())} of {g.numel()} elements differ, first "
        f"(index, kernel, reference): {pairs}"
    )
