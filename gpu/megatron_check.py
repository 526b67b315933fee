"""GPU check of the Megatron-Core glue: tiny dense and MoE GPTs, forward + backward on CUDA
with each recipe, one table, printed (about a minute on H200s). Run on a GPU node with
megatron-core 0.19.2 installed:

    python gpu/megatron_check.py                       # 1 GPU
    torchrun --nproc-per-node 2 gpu/megatron_check.py --tp 2 --sp
    torchrun --nproc-per-node 2 gpu/megatron_check.py --ep 2

Columns: loss of step 0, relative distance of its gradients to the bf16 run on the same
weights and data (quantization error, expected ~1e-2..1e-1; 0 for bf16), whether everything
is finite, median fwd+bwd time of the timed steps, peak memory. Exit status 1 if any run is
non-finite or any quantized run leaves the gradients bitwise unchanged (not quantized).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", default="bf16,e2m1,ufp4,ufp4_int4,nvfp4,mxfp4")
    p.add_argument("--models", default="dense,moe,moe_grouped")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--sp", action="store_true")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="dry-run the script itself on CPU (gloo, CPU compat layer)",
    )
    return p.parse_args()


DEVICE = "cuda"


def init_distributed(cpu: bool) -> None:
    global DEVICE
    for key, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29512"),
    ):
        os.environ.setdefault(key, value)
    if cpu:
        from ufp4_megatron.megatron import enable_cpu_compat

        enable_cpu_compat()
        DEVICE = "cpu"
        dist.init_process_group("gloo")
        return
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")


def build(kind: str, recipe: str, a, seed: int = 1234):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from ufp4_megatron.megatron import UFP4Policy, seed_model_parallel
    from ufp4_megatron.megatron.spec import ufp4_block_spec

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=a.tp, expert_model_parallel_size=a.ep)
    seed_model_parallel(seed)
    moe = kind.startswith("moe")
    kw = dict(
        num_layers=2,
        hidden_size=a.hidden,
        ffn_hidden_size=4 * a.hidden,
        num_attention_heads=8,
        params_dtype=torch.bfloat16,
        bf16=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=a.tp,
        sequence_parallel=a.sp,
        expert_model_parallel_size=a.ep,
        add_bias_linear=not moe,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        normalization="RMSNorm",
        use_cpu_initialization=DEVICE == "cpu",
    )
    if moe:
        kw.update(
            num_moe_experts=8,
            moe_router_topk=2,
            moe_ffn_hidden_size=a.hidden,
            moe_grouped_gemm=kind == "moe_grouped",
            moe_shared_expert_intermediate_size=a.hidden,
            moe_token_dispatcher_type="alltoall" if DEVICE == "cuda" else "allgather",
        )
    config = TransformerConfig(**kw)
    base = get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=config.moe_grouped_gemm,
        normalization="RMSNorm",
    )
    spec = ufp4_block_spec(base, config, UFP4Policy(recipe))
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=1024,
        max_sequence_length=a.seq,
        position_embedding_type="rope",
    ).to(DEVICE)


def step(model, tokens, a) -> float:
    mask = torch.triu(torch.ones(a.seq, a.seq, dtype=torch.bool, device=DEVICE), 1)[None, None]
    pos = torch.arange(a.seq, device=DEVICE).expand(a.batch, a.seq)
    loss = model(tokens, pos, mask, labels=tokens).float().mean()
    loss.backward()
    return loss.item()


def grads(model) -> torch.Tensor:
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
            for p in model.parameters()
        ]
    )


def main() -> int:
    a = parse()
    init_distributed(a.cpu)
    from megatron.core import parallel_state as ps

    rank0 = dist.get_rank() == 0
    rows, ok = [], True
    for kind in a.models.split(","):
        reference_state, reference_grads = None, None
        for recipe in a.recipes.split(","):
            model = build(kind, recipe, a)
            if reference_state is None:
                reference_state = {
                    k: v.clone()
                    for k, v in model.state_dict().items()
                    if isinstance(v, torch.Tensor)
                }
            else:
                model.load_state_dict(reference_state, strict=False)
            g = torch.Generator(device=DEVICE).manual_seed(ps.get_data_parallel_rank())
            tokens = torch.randint(0, 1024, (a.batch, a.seq), device=DEVICE, generator=g)
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            loss = step(model, tokens, a)
            gr = grads(model)
            finite = bool(torch.isfinite(gr).all()) and loss == loss
            if reference_grads is None:
                reference_grads, rel = gr, 0.0
            else:
                rel = ((gr - reference_grads).norm() / reference_grads.norm()).item()
            if not finite or (recipe != "bf16" and rel == 0.0):
                ok = False
            times = []
            for _ in range(a.steps):
                model.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(model, tokens, a)
                torch.cuda.synchronize()
                times.append(1e3 * (time.perf_counter() - t0))
            peak = torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else 0.0
            rows.append((kind, recipe, loss, rel, finite, statistics.median(times), peak))
            del model
    if rank0:
        print(
            f"tp={a.tp} ep={a.ep} sp={a.sp} hidden={a.hidden} seq={a.seq} batch={a.batch} "
            f"device={torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'} "
            f"torch={torch.__version__}"
        )
        print("| model | recipe | loss | grad rel. to bf16 | finite | fwd+bwd ms | peak MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for kind, recipe, loss, rel, finite, ms, mib in rows:
            print(
                f"| {kind} | {recipe} | {loss:.5f} | {rel:.3e} | {finite} | {ms:.1f} | {mib:.0f} |"
            )
        print("OK" if ok else "FAILED: a run is non-finite or a quantized run is unquantized")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
