"""train.cuda_graph, train.cuda_graph_warmup and train.weight_cache: what each value means for
the run, and what is refused before it starts (train/graphs.py).

    test_bad_values_are_one_line           typos, absurd values and impossible layouts: one line
                                           naming the key, before anything is written
    test_cuda_graph_needs_a_gpu            on CPU every graph mode is refused; none is accepted
    test_graph_modes_on_a_gpu              what each mode asks of Megatron-Core's config, and
                                           what a GPU run refuses (MoE without static shapes,
                                           pp > 1)
    test_weight_cache_auto                 auto: all where the estimate plus the cache fits the
                                           GPU, else the experts', else none; all on CPU
"""

from __future__ import annotations

import dataclasses

import pytest
from _config import refusal, typed_default

from ufp4_megatron.train import graphs
from ufp4_megatron.train.footprint import memory_estimate, weight_cache_gib, with_smallest_dp

TINY = [
    "model=tiny",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "logging.wandb.mode=disabled",
]

BAD = [  # (overrides, a fragment of the one-line message)
    (["train.cuda_graph=locl"], "train.cuda_graph='locl'; valid: none, local, full_iteration"),
    (["train.weight_cache=everything"], "train.weight_cache='everything'; valid: auto"),
    (["train.cuda_graph_warmup=0"], "train.cuda_graph_warmup"),
    (["train.cuda_graph_warmup=-3"], "train.cuda_graph_warmup"),
    (["train.cuda_graph_warmup=99999999999"], "train.cuda_graph_warmup"),
    (["model.moe_capacity_factor=0"], "model.moe_capacity_factor"),
    (["model.moe_capacity_factor=nan"], "model.moe_capacity_factor"),
    (["model.moe_pad_to_capacity=true"], "set model.moe_capacity_factor"),
]


@pytest.mark.usefixtures("hydra_configs")
@pytest.mark.parametrize("overrides,fragment", BAD, ids=["+".join(o) for o, _ in BAD])
def test_bad_values_are_one_line(overrides, fragment):
    line = refusal([*TINY, *overrides])
    assert line is not None and "\n" not in line, line
    assert fragment in line, line


@pytest.mark.usefixtures("hydra_configs")
@pytest.mark.parametrize("mode", ["local", "full_iteration"])
def test_cuda_graph_needs_a_gpu(mode):
    line = refusal([*TINY, f"train.cuda_graph={mode}"])
    assert line is not None and "use train.cuda_graph=none on CPU" in line, line
    assert refusal([*TINY, "train.cuda_graph=none"]) is None


@pytest.mark.usefixtures("hydra_configs")
def test_graph_modes_on_a_gpu(monkeypatch):
    # a PyTorch that captures the backward on its stream, as 2.13 does (the refusal on one
    # that does not, 2.11: test_full_iteration_needs_a_torch_that_captures_the_backward)
    monkeypatch.setattr(graphs, "_captures_backward_on_its_stream", lambda: True)
    cfg = typed_default(*TINY, "train.cuda_graph=local", "train.cuda_graph_warmup=2")
    graphs.check_cuda_graph(cfg, on_gpu=True)
    assert graphs.megatron_config(cfg) == dict(
        cuda_graph_impl="local", cuda_graph_modules=[], cuda_graph_warmup_steps=2
    )
    assert graphs.megatron_config(typed_default(*TINY)) == {}

    moe = typed_default("model=moe_small", "train.cuda_graph=full_iteration")
    with pytest.raises(ValueError, match="needs static expert shapes"):
        graphs.check_cuda_graph(moe, on_gpu=True)
    padded = typed_default(
        "model=moe_small",
        "train.cuda_graph=full_iteration",
        "model.moe_capacity_factor=1.0",
        "model.moe_pad_to_capacity=true",
    )
    graphs.check_cuda_graph(padded, on_gpu=True)
    assert graphs.megatron_config(padded)["moe_pad_expert_input_to_capacity"] is True

    pp2 = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, pp=2))
    with pytest.raises(ValueError, match="parallel.pp > 1"):
        graphs.check_cuda_graph(pp2, on_gpu=True)


@pytest.mark.usefixtures("hydra_configs")
def test_weight_cache_size_counts_one_operand_where_fprop_and_dgrad_share_it():
    """NVFP4's 16x16 weight tiles: one kept operand serves fprop and dgrad (whole tiles at
    every linear of these models), so its cache is half of UFP4's two layouts."""
    for model in ("moe_small", "dense_1p5b"):
        ufp4 = typed_default(f"model={model}", "precision=ufp4")
        nvfp4 = typed_default(f"model={model}", "precision=nvfp4")
        for which in ("all", "experts"):
            assert weight_cache_gib(nvfp4, which) == weight_cache_gib(ufp4, which) / 2
        assert weight_cache_gib(nvfp4, "all") > 0
    with pytest.raises(ValueError, match="valid: all, experts, none"):
        weight_cache_gib(ufp4, "auto")


@pytest.mark.usefixtures("hydra_configs")
def test_weight_cache_auto():
    cfg = typed_default("model=moe_small")
    assert graphs.resolve_weight_cache(cfg, None) == "all"  # CPU
    base = memory_estimate(with_smallest_dp(cfg))["total_gib"]
    every, experts = weight_cache_gib(cfg, "all"), weight_cache_gib(cfg, "experts")
    assert 0 < experts < every

    def device(gib):  # a GPU of this many GiB, of which FIT_FRACTION may be used
        return int(gib / graphs.FIT_FRACTION * 2**30)

    assert graphs.resolve_weight_cache(cfg, device(base + every + 0.01)) == "all"
    assert graphs.resolve_weight_cache(cfg, device(base + experts + 0.01)) == "experts"
    assert graphs.resolve_weight_cache(cfg, device(base)) == "none"
    for asked in ("all", "experts", "none"):
        fixed = typed_default("model=moe_small", f"train.weight_cache={asked}")
        assert graphs.resolve_weight_cache(fixed, device(base)) == asked


@pytest.mark.usefixtures("hydra_configs")
def test_full_iteration_needs_a_torch_that_captures_the_backward(monkeypatch):
    """Megatron-Core's full-iteration capture of the backward fails on a PyTorch without
    set_override_stale_capture_stream (seen on an H200 with torch 2.11): refused in one line."""
    cfg = typed_default(*TINY, "train.cuda_graph=full_iteration")
    import torch

    if hasattr(torch.autograd.graph, "set_override_stale_capture_stream"):
        graphs.check_cuda_graph(cfg, on_gpu=True)
        monkeypatch.delattr(torch.autograd.graph, "set_override_stale_capture_stream")
    with pytest.raises(ValueError, match="use train.cuda_graph=local") as e:
        graphs.check_cuda_graph(cfg, on_gpu=True)
    assert "set_override_stale_capture_stream" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.usefixtures("hydra_configs")
def test_graphs_keep_weight_operands_where_they_fit():
    """Under graphs auto decides by fit as in eager (the trainer keeps the operands static,
    quant/weight_cache.py, so a replay reads them); all and experts are taken as given."""
    local = typed_default("model=moe_small", "train.cuda_graph=local")
    assert graphs.resolve_weight_cache(local, 10**12) == "all"
    assert graphs.resolve_weight_cache(local, 1) == "none"  # nothing fits one byte
    full = typed_default("model=moe_small", "train.cuda_graph=full_iteration")
    assert graphs.resolve_weight_cache(full, 10**12) == "all"  # once per replay = per step
    for asked in ("all", "experts", "none"):
        cfg = typed_default(*TINY, "train.cuda_graph=local", f"train.weight_cache={asked}")
        graphs.check_cuda_graph(cfg, on_gpu=True)
        assert graphs.resolve_weight_cache(cfg, 10**12) == asked
