"""NVFP4's weight amaxes made once per optimizer step (megatron/parallel_gemm.weight_amaxes,
megatron/experts._weight_amax, whose kernel path is tested in
tests/kernels/test_grouped_weight_amax.py; the store is quant/weight_cache.WeightOperands).

The tensor amax of a weight only changes where the weight does, so a linear keeps it from
one micro-batch to the next whatever train.weight_cache says: over several optimizer steps
of several micro-batches the outputs and gradients are bit for bit those of a linear that
takes it at every micro-batch, the amax is made once per step, and a kept amax that outlived
its weight would change the bits. Static (per-layer CUDA graphs): the amax stays in its
storage, a "capture" reads it, and refresh() re-makes it from the parameter. On the CPU the
GEMMs take the reference path, so ops.tensor_amaxes is replaced by the reference's amaxes
(test_shared_amax.py's); the kernels' amaxes equal the reference's in tests/kernels.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_shared_amax import _reference_amaxes
from test_weight_cache import _capturing

from ufp4_megatron import get_recipe
from ufp4_megatron.megatron.experts import _weight_amax
from ufp4_megatron.megatron.parallel_gemm import Comm, Shard, UFP4ParallelLinearFn
from ufp4_megatron.quant import grouped_ops, ops, weight_cache
from ufp4_megatron.quant.weight_cache import WeightOperands

COMM = Comm(
    sequence_parallel=False, allreduce_dgrad=False, grad_accumulation_fusion=False, tp_group=None
)
NVFP4 = get_recipe("nvfp4")
STEPS, MICRO = 3, 2


def _counted_weight_amax(calls):
    """grouped_ops.weight_amax, counted: on the CPU it gives None (the reference path takes
    its own per-expert amaxes), which a store keeps as such; the kernel path's store is
    tested in tests/kernels/test_grouped_weight_amax.py."""
    real = grouped_ops.weight_amax

    def weight_amax(w, recipe, *, backend="auto"):
        calls.append("experts")
        return real(w, recipe, backend=backend)

    return weight_amax


class _NeverStale(WeightOperands):
    """A store that keeps the first amax for ever: what a missed invalidation would do."""

    def get(self, key, weight, make):
        if key not in self._entries:
            self._entries[key] = make()
        return self._entries[key]


def _micro_batch(w, store, step: int, micro: int):
    """(y, dx) of the dense linear with weight w [32, 48] on micro-batch `micro` of `step`."""
    g = torch.Generator().manual_seed(100 * step + micro)
    x = torch.randn(2, 8, 48, generator=g).requires_grad_()
    y = UFP4ParallelLinearFn.apply(x, w, None, NVFP4, 11, Shard(), COMM, None, store)
    y.backward(torch.randn(2, 8, 32, generator=g))
    return y.detach(), x.grad


def _train(monkeypatch, store, static=False):
    """(outputs of every micro-batch, grads, amaxes made per micro-batch and, static, by
    each step's refresh after it) of the dense linear over STEPS optimizer steps of MICRO
    micro-batches, each step scaling the weight by 1.37 besides SGD (a factor that is no
    power of two, which e4m3's two-level scales would absorb)."""
    calls = []
    monkeypatch.setattr(ops, "tensor_amaxes", _reference_amaxes(calls))
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(32, 48, generator=g))
    opt = torch.optim.SGD([w], lr=0.1)
    layer = torch.nn.Module()
    layer.weight_amaxes = store
    if static:
        assert weight_cache.make_static(layer) == 1
    outs, grads, made = [], [], []
    for step in range(STEPS):
        for micro in range(MICRO):
            if static:  # after the first, eager use every use is inside a "capture"
                _capturing(monkeypatch, step > 0 or micro > 0)
            calls.clear()
            outs.append(_micro_batch(w, store, step, micro))
            made.append(calls.count("w"))
        grads.append(w.grad.clone())
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            w.mul_(1.37)
        if static:
            calls.clear()
            assert weight_cache.refresh(layer) == 1
            made.append(calls.count("w"))  # the refresh's own amax, for the next step
    monkeypatch.undo()
    return outs, grads, made


def _assert_same(a, b):
    for (y1, dx1), (y2, dx2) in zip(a[0], b[0]):
        assert torch.equal(y1, y2) and torch.equal(dx1, dx2)
    for g1, g2 in zip(a[1], b[1]):
        assert torch.equal(g1, g2)


@pytest.mark.parametrize("static", [False, True])
def test_dense_weight_amax_is_made_once_per_step_with_the_same_bits(monkeypatch, static):
    own = _train(monkeypatch, None)
    kept = _train(monkeypatch, WeightOperands(), static=static)
    _assert_same(kept, own)
    assert own[2] == [1] * (STEPS * MICRO)  # every micro-batch reads the weight for it
    # once per step: at its first micro-batch, or static, by the refresh after each step
    assert kept[2] == ([1, 0] + [1, 0, 0] * (STEPS - 1) + [1] if static else [1, 0] * STEPS)


def test_a_kept_amax_that_outlives_its_weight_would_change_the_bits(monkeypatch):
    own = _train(monkeypatch, None)
    stale = _train(monkeypatch, _NeverStale())
    assert [torch.equal(a[0], b[0]) for a, b in zip(stale[0], own[0])] == [True] * MICRO + [
        False
    ] * (MICRO * (STEPS - 1))


@pytest.mark.parametrize("name", ["ufp4", "mxfp4", "e2m1"])
def test_a_recipe_without_e4m3_weight_scales_keeps_nothing(monkeypatch, name):
    """Only e4m3-scaled weights (NVFP4) take a tensor amax: other recipes neither ask for w's
    amaxes nor leave an entry in the store, which the trainer's refresh then walks past."""
    calls = []
    monkeypatch.setattr(ops, "tensor_amaxes", _reference_amaxes(calls))
    store = WeightOperands()
    w = torch.nn.Parameter(torch.randn(32, 48, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(2, 8, 48).requires_grad_()
    y = UFP4ParallelLinearFn.apply(x, w, None, get_recipe(name), 11, Shard(), COMM, None, store)
    y.backward(torch.ones_like(y))
    assert "w" not in calls and store._entries == {}, (calls, store._entries)
    y = UFP4ParallelLinearFn.apply(x, w, None, NVFP4, 11, Shard(), COMM, None, store)
    assert "w" in calls and len(store._entries) == 1  # the same call with NVFP4 keeps one
    # the stacked experts' [E, N, K] weight: the same (on the CPU NVFP4's entry is a None)
    stacked, kept = torch.randn(4, 32, 48), WeightOperands()
    args = (stacked, 0, stacked, Shard(), stacked.dtype)
    assert _weight_amax(*args, get_recipe(name), None, kept, True) is None and not kept._entries
    _weight_amax(*args, NVFP4, None, kept, True)
    assert list(kept._entries) == [("amax", 0)]


_RUN = textwrap.dedent(
    """
    import sys, torch
    from ufp4_megatron.quant import grouped_ops, ops, weight_cache
    from ufp4_megatron.train import distributed, schedule
    from ufp4_megatron.train.build import build_run
    from ufp4_megatron.train.footprint import load_config
    from ufp4_megatron.train.runtime import decide
    sys.path.insert(0, sys.argv[2])
    from test_kept_weight_amax import _counted_weight_amax
    from test_shared_amax import _reference_amaxes

    calls = []
    ops.tensor_amaxes = _reference_amaxes(calls)
    grouped_ops.weight_amax = _counted_weight_amax(calls)
    cfg = load_config(
        ["model=moe_small", "precision=nvfp4", "train.weight_cache=none",
         "model.num_layers=2", "model.hidden_size=128", "model.num_attention_heads=4",
         "model.ffn_hidden_size=256", "model.moe_ffn_hidden_size=64",
         "model.moe_shared_expert_size=64", "train.seq_len=64", "train.micro_batch=1",
         "train.global_batch=4", f"data.cache_dir={sys.argv[1]}"]
    )
    rt = decide(cfg)
    with rt.scope():
        built = build_run(cfg, rt, n_train=3 * cfg.train.global_batch, n_valid=1)
        step = schedule.TrainingStep(built, cfg, rt)
        for i in range(3):
            calls.clear()
            step(i)
            print("STEP", built.n_micro, calls.count("w") + calls.count("experts"))
        stores = [(type(m).__name__, m.weight_amaxes._entries, m.weight_operands)
                  for m in built.model.modules() if hasattr(m, "weight_amaxes")]
        print("STORES", len(stores), sorted({s[0] for s in stores}),
              all(len(e) > 0 and ops is None for _, e, ops in stores),
              all(v.operand is not None for name, e, _ in stores for v in e.values()
                  if "Grouped" not in name))
        entries = [e for m in built.model.modules() if hasattr(m, "weight_amaxes")
                   for e in m.weight_amaxes._entries.values()]
        print("KEPT", len(entries), sum(e.operand is not None for e in entries))
        distributed.shutdown()
    """
)


def test_a_training_step_makes_each_weights_amaxes_once(tmp_path):
    """The trainer's step (train/schedule.py) with train.weight_cache=none and 4 micro-batches
    per step: every UFP4 linear of an NVFP4 MoE model (attention, shared and routed experts,
    dense MLP) keeps its weight's amaxes, made once per step (by the refresh after the
    optimizer step), not once per micro-batch."""
    r = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path / "data"), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {
        line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line[:1].isupper()
    }
    kept, made = map(int, lines["KEPT"])
    steps = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("STEP ")]
    # each kept amax at its first use, and those that are tensors again by each step's
    # refresh (a None stays None), whatever the number of micro-batches
    assert steps == [["4", str(kept + made)], ["4", str(made)], ["4", str(made)]], (steps, kept)
    # the experts' amaxes are None on the CPU (the reference path takes its own), tensors on
    # the kernel path
    assert made > 0 and (made == kept if torch.cuda.is_available() else made < kept), (made, kept)
    assert lines["STORES"][-2:] == ["True", "True"], lines["STORES"]
    assert "'UFP4RowParallelGroupedLinear'," in lines["STORES"], lines["STORES"]
