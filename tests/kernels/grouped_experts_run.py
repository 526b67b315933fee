"""The grouped GEMMs' autograd functions on the kernel path with their amax passes counted,
and a sharing turned off: the harness of the tests of the amaxes they share between GEMMs
(test_grouped_*_amax.py)."""

import functools

import torch

from ufp4_megatron.kernels import dispatch
from ufp4_megatron.quant import grouped_ops as G


def turn_off(monkeypatch, off: dict | None) -> None:
    """Replaces the grouped_ops functions named in `off` by their values (a sharing turned
    off: what the function returns where it does not apply)."""
    for name, value in (off or {}).items():
        monkeypatch.setattr(G, name, lambda *a, _value=value, **k: _value)


def count_amax_passes(monkeypatch) -> list:
    """A list that collects the view shape of every single-layout amax pass from now on
    (dispatch._tensor_amax)."""
    passes, real_amax = [], dispatch._tensor_amax

    def counted(view, *args, **kwargs):
        passes.append(tuple(view.shape))
        return real_amax(view, *args, **kwargs)

    monkeypatch.setattr(dispatch, "_tensor_amax", counted)
    return passes


def run_experts(monkeypatch, shard, recipe, groups, x, w, dy, *, kernel_calls, off=None):
    """(y, dx, dw) of megatron.experts._GroupedExpertsFn for x [tokens, K], the stacked
    weight w [E, N, K] and dy [tokens, N], and the view shape of every single-layout amax
    pass (dispatch._tensor_amax). The grouped_ops functions named in `kernel_calls` run with
    backend "triton" (on the CPU "auto" would take the reference); those in `off` are turned
    off (`turn_off`)."""
    from ufp4_megatron.megatron import experts

    for name in kernel_calls:
        monkeypatch.setattr(G, name, functools.partial(getattr(G, name), backend="triton"))
    turn_off(monkeypatch, off)
    passes = count_amax_passes(monkeypatch)
    x = x.detach().clone().requires_grad_()
    weight = torch.nn.Parameter(w.detach().clone())
    y = experts._GroupedExpertsFn.apply(x, weight, None, recipe, 11, 2, groups, shard, False, None)
    y.backward(dy)
    monkeypatch.undo()
    return (y.detach(), x.grad, weight.grad), passes


def passes_with_and_without(monkeypatch, run, n_local: int, stride: int):
    """The amax passes of `run(shard, monkeypatch, share)` (-> (y, dx, dw), passes) without and
    with the sharing, on rank 1 of a 2-way column-parallel shard of `n_local` rows with
    `stride` chunks, after checking that the sharing changes no bit of y, dx and dw; and the
    shard's number of chunks."""
    from ufp4_megatron.megatron.parallel_gemm import Shard

    shard = Shard.column(rank=1, world=2, n_local=n_local, stride=stride)
    own, own_passes = run(shard, monkeypatch, False)
    got, got_passes = run(shard, monkeypatch, True)
    for what, a, b in zip(("y", "dx", "dw"), got, own):
        assert torch.equal(a, b), what
    return own_passes, got_passes, len(shard.n)
