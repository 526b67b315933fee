"""Scenarios run on 2 gloo ranks by mcore_worker.py; each returns rank 0's results."""

from __future__ import annotations

import torch
import torch.distributed as dist
from mcore_tiny import (
    batch,
    build_gpt,
    full_grads,
    full_state,
    load_full_state,
    loss_and_backward,
    setup_parallel,
    tiny_config,
)
from megatron.core import parallel_state as ps

from ufp4_megatron.megatron import UFP4Policy

DENSE_LAYOUTS = {"tp1": {}, "tp2": {"tp": 2}, "tp2sp": {"tp": 2, "sp": True}}
# MoE with TP needs sequence parallelism in Megatron; EP=2 takes its ranks from DP.
MOE_LAYOUTS = {"tp1": {}, "tp2sp": {"tp": 2, "sp": True}, "ep2": {"ep": 2}}


def _run(
    moe: bool,
    recipe: str,
    layout: dict,
    state,
    *,
    sr_seed: int = 7,
    grouped=False,
    glu=False,
    attention="megatron",
):
    setup_parallel(tp=layout.get("tp", 1), ep=layout.get("ep", 1))
    config = tiny_config(moe=moe, grouped=grouped, glu=glu, **layout)
    model = build_gpt(config, UFP4Policy(recipe, sr_seed=sr_seed), attention)
    local_experts = 4 // layout.get("ep", 1) if moe else 0
    load_full_state(model, state, local_experts)
    # the fused attention is causal by construction: no mask tensor, as the trainer runs it
    loss = loss_and_backward(
        model, batch(ps.get_data_parallel_rank()), masked=attention == "megatron"
    )
    out = {"loss": loss}
    if layout.get("ep", 1) == 1:  # rank 0's own gradients (TP layouts share rank 0's data)
        out["grads"] = full_grads(model, local_experts)
    if moe and layout.get("tp", 1) == 1:  # summed over replicas: comparable across EP
        out["grads_dp"] = full_grads(model, local_experts, dp_sum=True)
    out["modules"] = _module_types(model)
    return out


def _module_types(model) -> dict[str, str]:
    return {name: type(m).__name__ for name, m in model.named_modules()}


def bf16_layers_model() -> dict[str, str]:
    """Module classes of a 3-layer UFP4 MoE GPT whose first and last layers stay BF16."""
    setup_parallel()
    config = tiny_config(
        moe=True,
        num_layers=3,
        first_last_layers_bf16=True,
        num_layers_at_start_in_bf16=1,
        num_layers_at_end_in_bf16=1,
    )
    return _module_types(build_gpt(config, UFP4Policy("ufp4")))


def models(recipes=("bf16", "e2m1", "ufp4")) -> dict:
    results = {}
    for moe, layouts in ((False, DENSE_LAYOUTS), (True, MOE_LAYOUTS)):
        setup_parallel()
        state = full_state(build_gpt(tiny_config(moe=moe), UFP4Policy("bf16")))
        for name, layout in layouts.items():  # layout-major: parallel state built once each
            for recipe in recipes:
                results[("moe" if moe else "dense", recipe, name)] = _run(
                    moe, recipe, layout, state
                )
        if not moe:  # the same model with another SR seed: how far apart SR noise alone puts it
            results[("dense", "ufp4", "tp1_seed8")] = _run(False, "ufp4", {}, state, sr_seed=8)
            for name, layout in layouts.items():  # fused attention (SDPA), no mask tensor
                results[("dense", "bf16", f"{name}_sdpa")] = _run(
                    False, "bf16", layout, state, attention="sdpa"
                )
        else:  # grouped experts (TEGroupedMLP + UFP4 grouped linears) on the same weights
            for name, layout in (("tp1", {}), ("tp2sp", MOE_LAYOUTS["tp2sp"]), ("ep2", {"ep": 2})):
                for recipe in ("bf16", "ufp4"):
                    results[("moe", recipe, f"{name}_grouped")] = _run(
                        True, recipe, layout, state, grouped=True
                    )
    # SwiGLU: fc1 is sharded with stride 2, each rank holding [gate_r; up_r]
    setup_parallel()
    state = full_state(build_gpt(tiny_config(glu=True), UFP4Policy("bf16")))
    for name, layout in (("tp1", {}), ("tp2sp", {"tp": 2, "sp": True})):
        for recipe in ("bf16", "ufp4"):
            results[("dense_glu", recipe, name)] = _run(False, recipe, layout, state, glu=True)
    return results


# ----------------------------------------------------------------------------- layers


def _binding(recipe: str, seed: int = 5, **overrides):
    from ufp4_megatron import get_recipe
    from ufp4_megatron.megatron import SRSeeds, UFP4Binding

    return UFP4Binding(
        recipe=get_recipe(recipe, **overrides),
        seeds=SRSeeds(seed),
        layer_number=1,
        path="test.linear",
        role=0,
    )


def _gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    group = ps.get_tensor_model_parallel_group()
    parts = [torch.empty_like(t) for _ in range(group.size())]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _make_linear(kind: str, cls, config, binding=None):
    kw = {} if binding is None else {"ufp4": binding}
    if kind == "column":
        return cls(
            64,
            96,
            config=config,
            init_method=config.init_method,
            bias=True,
            gather_output=False,
            **kw,
        )
    return cls(
        64,
        48,
        config=config,
        init_method=config.init_method,
        bias=True,
        input_is_parallel=True,
        skip_bias_add=False,
        **kw,
    )


def _inputs(kind: str, sp: bool, n_out: int):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 2, 64, generator=g)
    dy = torch.randn(16, 2, n_out, generator=g)
    rank, tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    if kind == "column":
        x_local = x.chunk(tp, 0)[rank] if sp else x
        dy_local = dy.chunk(tp, 2)[rank]
    else:
        x_local = x.chunk(tp, 2)[rank]
        dy_local = dy.chunk(tp, 0)[rank] if sp else dy
    return x, dy, x_local.clone().requires_grad_(), dy_local


def _fwd_bwd(layer, x_local, dy_local):
    y, _ = layer(x_local)
    y.backward(dy_local)
    return y.detach()


def _linear_checks(sp: bool) -> dict:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from ufp4_megatron.megatron import SRSeeds, UFP4ColumnParallelLinear, UFP4RowParallelLinear
    from ufp4_megatron.quant.ops import quantized_linear

    setup_parallel(tp=2)
    config = tiny_config(tp=2, sp=sp)
    out = {}
    for kind, mcls, ucls, n_out in (
        ("column", ColumnParallelLinear, UFP4ColumnParallelLinear, 96),
        ("row", RowParallelLinear, UFP4RowParallelLinear, 48),
    ):
        x, dy, x_local, dy_local = _inputs(kind, sp, n_out)
        # 1. recipe bf16 through the UFP4 path == Megatron's own linear, bit for bit
        ref = _make_linear(kind, mcls, config)
        ours = _make_linear(kind, ucls, config, _binding("bf16"))
        ours.load_state_dict(ref.state_dict())
        x2 = x_local.detach().clone().requires_grad_()
        y_ref, y_ours = _fwd_bwd(ref, x_local, dy_local), _fwd_bwd(ours, x2, dy_local)
        diffs = [
            (y_ref - y_ours).abs().max(),
            (x_local.grad - x2.grad).abs().max(),
            (ref.weight.grad - ours.weight.grad).abs().max(),
            (ref.bias.grad - ours.bias.grad).abs().max(),
        ]
        out[(kind, "bf16_vs_megatron_maxabs")] = _max_over_ranks(max(d.item() for d in diffs))

        # 2. recipe ufp4 on TP=2 == quantized_linear on the full tensors, same seed
        binding = _binding("ufp4")
        layer = _make_linear(kind, ucls, config, binding)
        shadow = SRSeeds()
        shadow.load_state_dict(binding.seeds.state_dict())
        seed = shadow.draw(binding.layer_number, binding.role, 0, ps.get_data_parallel_rank())
        x3 = x_local.detach().clone().requires_grad_()
        y = _fwd_bwd(layer, x3, dy_local)
        pdim = 0 if kind == "column" else 1
        w_full = _gather(layer.weight.detach(), pdim).requires_grad_()
        b_full = (
            _gather(layer.bias.detach(), 0) if kind == "column" else layer.bias.detach().clone()
        ).requires_grad_()
        xf = x.clone().requires_grad_()
        yf = quantized_linear(xf, w_full, b_full, binding.recipe, seed=seed)
        yf.backward(dy)
        if kind == "column":
            y_full = _gather(y, 2)
            dx_full = _gather(x3.grad, 0) if sp else x3.grad
            db_full = _gather(layer.bias.grad, 0)
        else:
            y_full = _gather(y, 0) if sp else y
            dx_full = _gather(x3.grad, 2)
            db_full = layer.bias.grad.clone()
            if sp:  # SP-marked bias: finalize_model_grads sums it over TP
                dist.all_reduce(db_full, group=ps.get_tensor_model_parallel_group())
        dw_full = _gather(layer.weight.grad, pdim)
        out[(kind, "ufp4_rel")] = {
            "y": _rel(y_full, yf),
            "dx": _rel(dx_full, xf.grad),
            "dw": _rel(dw_full, w_full.grad),
            "db": _rel(db_full, b_full.grad),
        }
        # The same reference with another seed: the size of SR noise alone.
        w2 = w_full.detach().clone().requires_grad_()
        quantized_linear(x.clone(), w2, None, binding.recipe, seed=seed + 1).backward(dy)
        out[(kind, "ufp4_other_seed_rel_dw")] = _rel(w2.grad, w_full.grad)
    return out


def _fusion_check() -> dict:
    """gradient_accumulation_fusion: wgrad lands in main_grad (no apex needed)."""
    from ufp4_megatron.megatron import UFP4ColumnParallelLinear

    setup_parallel(tp=2)
    plain = _make_linear(
        "column", UFP4ColumnParallelLinear, tiny_config(tp=2), _binding("ufp4", sr=())
    )
    fused = _make_linear(
        "column",
        UFP4ColumnParallelLinear,
        tiny_config(tp=2, gradient_accumulation_fusion=True),
        _binding("ufp4", sr=()),
    )
    fused.load_state_dict(plain.state_dict())
    fused.weight.main_grad = torch.zeros_like(fused.weight, dtype=torch.float32)
    _, _dy, x_local, dy_local = _inputs("column", False, 96)
    _fwd_bwd(plain, x_local, dy_local)
    for _ in range(2):
        _fwd_bwd(fused, x_local.detach().clone().requires_grad_(), dy_local)
    return {
        "weight_grad_is_none": fused.weight.grad is None,
        "main_grad_rel": _rel(fused.weight.main_grad, 2 * plain.weight.grad),
    }


def _divisibility_error() -> str:
    from ufp4_megatron.megatron import UFP4RowParallelLinear

    setup_parallel(tp=2)
    config = tiny_config(tp=2)
    try:
        UFP4RowParallelLinear(
            48,
            64,
            config=config,
            init_method=config.init_method,
            bias=False,
            input_is_parallel=True,
            skip_bias_add=True,
            ufp4=_binding("ufp4"),
        )
    except ValueError as e:
        return str(e)
    return ""


def _expert_checks() -> dict:
    """SequentialMLP and TEGroupedMLP hosts with UFP4 linears, on uneven and empty experts."""
    from functools import partial

    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import GroupedMLPSubmodules, TEGroupedMLP

    from ufp4_megatron.megatron import UFP4ColumnParallelLinear, UFP4RowParallelLinear
    from ufp4_megatron.megatron.experts import (
        UFP4ColumnParallelGroupedLinear,
        UFP4RowParallelGroupedLinear,
        UFP4SequentialMLP,
    )

    setup_parallel()
    config = tiny_config(moe=True)
    pgc = ProcessGroupCollection.use_mpu_process_groups()
    counts = torch.tensor([0, 5, 17, 10])  # an empty expert, counts not multiples of 16
    g = torch.Generator().manual_seed(4)
    x = torch.randn(int(counts.sum()), 64, generator=g)
    probs = torch.rand(int(counts.sum()), generator=g)
    dy = torch.randn(int(counts.sum()), 64, generator=g)
    out = {}
    for label, overrides in (
        ("rtne", {"sr": ()}),
        ("sr", {}),
        ("sr_all", {"sr": ("dy", "x", "w")}),
    ):
        # one SR stream per host, equal ones: both hosts must draw the same seeds from them
        seqb = _binding("ufp4", **overrides), _binding("ufp4", seed=6, **overrides)
        grpb = _binding("ufp4", **overrides), _binding("ufp4", seed=6, **overrides)
        seq = UFP4SequentialMLP(
            4,
            config,
            MLPSubmodules(
                linear_fc1=partial(UFP4ColumnParallelLinear, ufp4=seqb[0]),
                linear_fc2=partial(UFP4RowParallelLinear, ufp4=seqb[1]),
            ),
            pg_collection=pgc,
        )
        grp = TEGroupedMLP(
            4,
            config,
            GroupedMLPSubmodules(
                linear_fc1=partial(UFP4ColumnParallelGroupedLinear, ufp4=grpb[0]),
                linear_fc2=partial(UFP4RowParallelGroupedLinear, ufp4=grpb[1]),
            ),
            pg_collection=pgc,
        )
        with torch.no_grad():
            for i, e in enumerate(seq.local_experts):
                grp.linear_fc1.weight[i].copy_(e.linear_fc1.weight)
                grp.linear_fc2.weight[i].copy_(e.linear_fc2.weight)
        res = {}
        for name, mod in (("seq", seq), ("grp", grp)):
            xi = x.clone().requires_grad_()
            y, _ = mod(xi, counts, probs)
            y.backward(dy)
            res[name] = (y.detach(), xi.grad)
        wgrads = [
            (e.linear_fc1.weight.grad, grp.linear_fc1.weight.grad[0]) for e in seq.local_experts[:1]
        ]
        dw_seq = [
            torch.stack([getattr(e, f).weight.grad for e in seq.local_experts])
            for f in ("linear_fc1", "linear_fc2")
        ]
        dw_grp = [grp.linear_fc1.weight.grad, grp.linear_fc2.weight.grad]
        out[label] = {
            "grouped_vs_sequential_maxabs": max(
                (res["seq"][0] - res["grp"][0]).abs().max().item(),
                (res["seq"][1] - res["grp"][1]).abs().max().item(),
                *((a - b).abs().max().item() for a, b in zip(dw_seq, dw_grp)),
            ),
            "draws": {"seq": [b.seeds.draws for b in seqb], "grp": [b.seeds.draws for b in grpb]},
            "all_finite": all(bool(t.isfinite().all()) for pair in res.values() for t in pair),
            "empty_expert_wgrad_maxabs": max(w.abs().max().item() for pair in wgrads for w in pair),
            "expert_indices": [e.linear_fc1.expert_index for e in seq.local_experts],
            # how far SR moves dx from RTNE: the SR comparisons above are not trivially equal
            "dx_vs_rtne_maxabs": (res["grp"][1] - out["rtne"]["dx"]).abs().max().item()
            if "rtne" in out
            else 0.0,
            "dx": res["grp"][1],
        }
    return out


def layers() -> dict:
    return {
        "tp2": _linear_checks(sp=False),
        "tp2sp": _linear_checks(sp=True),
        "fusion": _fusion_check(),
        "divisibility": _divisibility_error(),
        "experts": _expert_checks(),
    }


def _boxes(sharded: dict, label_filter=".mlp.experts.") -> list:
    """Per expert weight: (key, global shape, the global box this rank holds), factories
    (SwiGLU halves) built into their tensors."""
    boxes = []
    for name, t in sharded.items():
        if label_filter not in name or "_extra_state" in name:
            continue
        for st in t.build() if hasattr(t, "build") else [t]:
            local = [1] * (len(st.global_shape) - st.data.dim()) + list(st.data.shape)
            box = [(o, o + n) for o, n in zip(st.global_offset, local)]
            e_axis = len(st.global_shape) - 3  # [..., experts, N, K]
            for e in range(*box[e_axis]):  # one box per expert
                boxes.append(
                    (
                        st.key,
                        tuple(st.global_shape),
                        tuple(box[:e_axis] + [(e, e + 1)] + box[e_axis + 1 :]),
                    )
                )
    return sorted(boxes)


def expert_checkpoint_layouts() -> dict:
    """What the routed experts of MoE GPTs write to a sharded checkpoint on this rank,
    SequentialMLP vs grouped (EP=2; EP=2 with SwiGLU; expert-TP=2 with SwiGLU, whose fc1
    halves are saved apart), and whether the tensor a grouped weight saves is the parameter
    itself (the distributed optimizer's model-space formats match them by identity).
    (SequentialMLP also saves `_extra_state` placeholders, which the grouped linears do not.)"""
    out = {}
    for layout, kw in (
        ("ep2", dict(ep=2)),
        ("ep2_glu", dict(ep=2, glu=True)),
        ("tp2sp_glu", dict(tp=2, sp=True, glu=True)),
    ):
        for label, grouped in (("sequential", False), ("grouped", True)):
            setup_parallel(tp=kw.get("tp", 1), ep=kw.get("ep", 1))
            model = build_gpt(tiny_config(moe=True, grouped=grouped, **kw), UFP4Policy("ufp4"))
            sharded = model.sharded_state_dict()
            out[(layout, label)] = _boxes(sharded)
            if grouped:
                params = {id(p) for p in model.parameters()}
                out[(layout, "grouped_data_is_param")] = [
                    id(t.data) in params for name, t in sharded.items() if ".mlp.experts." in name
                ]
    return out


def expert_checkpoint_roundtrip() -> dict:
    """A dist_checkpointing checkpoint of a grouped-expert MoE GPT (EP=2, SwiGLU) loads into
    a SequentialMLP one and back: max |difference| of every parameter after each load."""
    import tempfile

    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    setup_parallel(ep=2)
    holder = [tempfile.mkdtemp(prefix="ufp4-ckpt-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    root = holder[0]
    out = {}
    models = {
        g: build_gpt(tiny_config(moe=True, ep=2, glu=True, grouped=g), UFP4Policy("ufp4"))
        for g in (True, False)
    }
    with torch.no_grad():
        for m in models.values():
            for p in m.parameters():
                p.normal_()
    for src, dst in ((True, False), (False, True)):
        path = f"{root}/{'grouped' if src else 'sequential'}"
        if dist.get_rank() == 0:
            import os

            os.makedirs(path)
        dist.barrier()
        dist_checkpointing.save(models[src].sharded_state_dict(), path)
        template = {
            k: v for k, v in models[dst].sharded_state_dict().items() if "_extra_state" not in k
        }
        loaded = dist_checkpointing.load(template, path, strict=StrictHandling.LOG_ALL)
        models[dst].load_state_dict(loaded, strict=False)
        a = _canonical_params(models[src], 2)
        b = _canonical_params(models[dst], 2)
        out[f"{'grouped' if src else 'sequential'}_to_{'sequential' if src else 'grouped'}"] = max(
            (a[k] - b[k]).abs().max().item() for k in a
        )
        out.setdefault("same_names", []).append(a.keys() == b.keys())
    return out


def _canonical_params(model, num_local_experts: int) -> dict:
    """This rank's parameters under canonical (TP=1, EP=1, SequentialMLP) names."""
    from mcore_tiny import _per_expert

    return {
        k: t.detach().clone()
        for name, p in model.named_parameters()
        for k, t in _per_expert(name, p, num_local_experts)
    }


def seed_stream() -> dict:
    """When a UFP4 linear draws SR seeds, and exact resume from SRSeeds.state_dict()."""
    from ufp4_megatron.megatron import UFP4ColumnParallelLinear

    setup_parallel()
    config = tiny_config()
    out = {}
    for label, overrides in (("sr", {}), ("no_sr", {"sr": ()})):
        binding = _binding("ufp4", **overrides)
        layer = _make_linear("column", UFP4ColumnParallelLinear, config, binding)
        x = torch.randn(16, 2, 64)
        with torch.no_grad():
            layer(x)
        eval_draws = binding.seeds.draws
        layer(x.requires_grad_())
        out[label] = (eval_draws, binding.seeds.draws)

    # Under CUDA-graph capture (simulated: there is no capture on CPU; the GPU test captures
    # for real) a forward that draws an SR seed refuses; one without SR runs
    from unittest import mock

    from ufp4_megatron.megatron import seeds as seeds_module

    out["capture"] = {}
    for label, overrides in (("sr", {}), ("no_sr", {"sr": ()})):
        layer = _make_linear(
            "column", UFP4ColumnParallelLinear, config, _binding("ufp4", **overrides)
        )
        with mock.patch.object(seeds_module, "_capturing", return_value=True):
            try:
                layer(torch.randn(16, 2, 64).requires_grad_())
                out["capture"][label] = None
            except seeds_module.SRCaptureError as e:
                out["capture"][label] = str(e)

    # Resume: step 2 after restoring the stream saved after step 1 == step 2 of the original;
    # dense, and MoE with either expert host (their experts draw once per role and forward)
    for prefix, cfg, experts in (
        ("", config, 0),
        ("moe_", tiny_config(moe=True), 4),
        ("moe_grouped_", tiny_config(moe=True, grouped=True), 4),
    ):
        state = full_state(build_gpt(tiny_config(moe=bool(experts)), UFP4Policy("bf16")))
        policy = UFP4Policy("ufp4", sr_seed=3)
        model = build_gpt(cfg, policy)
        load_full_state(model, state, experts)
        loss_and_backward(model, batch(0))
        saved = policy.state_dict()
        model.zero_grad(set_to_none=True)
        loss_and_backward(model, batch(1))
        step2 = full_grads(model, experts)
        for label, restore in (("resumed", True), ("fresh", False)):
            policy = UFP4Policy("ufp4", sr_seed=3)
            model = build_gpt(cfg, policy)
            load_full_state(model, state, experts)
            if restore:
                policy.load_state_dict(saved)
            loss_and_backward(model, batch(1))
            grads = full_grads(model, experts)
            out[prefix + label] = max((grads[k] - step2[k]).abs().max().item() for k in step2)
    return out


def entry_point() -> dict:
    """ufp4_gpt_spec (Megatron-LM's --spec hook) with UFP4_RECIPE, dense and MoE."""
    import os

    from megatron.core.models.gpt import GPTModel

    from ufp4_megatron.megatron.spec import ufp4_gpt_spec

    setup_parallel()
    os.environ["UFP4_RECIPE"] = "e2m1"
    out, recipes = {}, set()
    for label, config in (("dense", tiny_config()), ("moe", tiny_config(moe=True))):
        model = GPTModel(
            config=config,
            transformer_layer_spec=ufp4_gpt_spec(config),
            vocab_size=128,
            max_sequence_length=32,
        )
        out[label] = {
            n: f"{type(m).__name__} {m.extra_repr()}"
            for n, m in model.named_modules()
            if type(m).__name__.startswith("UFP4")
        }
        recipes |= {m.ufp4.recipe.name for m in model.modules() if hasattr(m, "ufp4")}
    out["policy"] = "/".join(sorted(recipes))  # the recipes the UFP4 linears run
    return out


def attention() -> dict:
    """SDPAttention against Megatron's DotProductAttention on the same q, k, v and output
    gradient: (rel. error of the output, of dq, dk, dv) per dtype, head grouping and mask."""
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from ufp4_megatron.megatron.attention import SDPAttention

    setup_parallel()
    s, b, heads, dim = 48, 2, 4, 16
    causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None].expand(b, 1, s, s)
    padded = causal.clone()
    padded[1, :, :, 40:] = True  # sample 1: the last 8 keys are padding
    padded[1, :, 40:, 40:] = causal[1, :, 40:, 40:]  # (padding rows still see themselves)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for groups in (4, 2, 1):  # MHA, GQA, MQA
            config = TransformerConfig(
                num_layers=1,
                hidden_size=heads * dim,
                num_attention_heads=heads,
                num_query_groups=groups,
                params_dtype=dtype,
                bf16=dtype == torch.bfloat16,
                use_cpu_initialization=True,
                attention_dropout=0.0,
                masked_softmax_fusion=False,
            )  # (needs apex kernels)
            g = torch.Generator().manual_seed(groups)
            q, k, v = (
                torch.randn(s, b, n, dim, generator=g).to(dtype) for n in (heads, groups, groups)
            )
            dy = torch.randn(s, b, heads * dim, generator=g).to(dtype)
            for label, mask_type, ref_mask, our_mask in (
                ("causal", AttnMaskType.causal, causal, None),
                ("causal_mask_given", AttnMaskType.causal, causal, causal),
                ("padding", AttnMaskType.padding, padded, padded),
            ):
                res = []
                for module, mask in (
                    (DotProductAttention(config, 1, mask_type, "self"), ref_mask),
                    (SDPAttention(config, 1, mask_type, "self"), our_mask),
                ):
                    qkv = [t.clone().requires_grad_() for t in (q, k, v)]
                    y = module(*qkv, mask)
                    y.backward(dy)
                    res.append([y.detach()] + [t.grad for t in qkv])
                key = (str(dtype).split(".")[-1], groups, label)
                out[key] = [_rel(ours, ref) for ours, ref in zip(res[1], res[0])]
    return out


def _optional(fn, module: str):
    """fn(), or None when `module` (an optional dependency of what fn exercises) is missing."""
    import importlib.util

    return fn() if importlib.util.find_spec(module) else None


def suite() -> dict:
    """Everything the pytest suite needs, in one launch (Megatron imports once per rank)."""
    return {
        "layers": layers(),
        "models": models(),
        "bf16_layers": bf16_layers_model(),
        "checkpoint": expert_checkpoint_layouts(),
        "seeds": seed_stream(),
        "checkpoint_roundtrip": _optional(expert_checkpoint_roundtrip, "psutil"),
        "entry_point": entry_point(),
        "attention": attention(),
    }
