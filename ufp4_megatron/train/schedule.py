"""One global batch of forward/backward passes through Megatron's own schedule.

`get_forward_backward_func()`: no pipelining, or 1F1B when parallel.pp > 1. The same call on
CPU (its token counters on "cuda" land on CPU inside the CPU runtime's scope, the plugin's
cpu_compat), so the loss contract (sum / tokens / micro-batches), the MoE aux-loss scaling and
the gradient finalization (DP all-reduce, SP norm grads) are Megatron's on both.
"""

from __future__ import annotations

from functools import partial

import torch

from ..data import datasets as data
from ..quant import weight_cache


def _loss_func(loss_mask: torch.Tensor, output: torch.Tensor):
    """Megatron's 3-tuple contract: (summed loss, token count, values to report)."""
    mask = loss_mask.view(-1).float()
    total = torch.sum(output.view(-1).float() * mask)
    return total, mask.sum().to(torch.int), {"lm loss": torch.stack([total.detach(), mask.sum()])}


def forward_step(data_iterator, model):
    b = next(data_iterator)
    out = model(b["tokens"], b["position_ids"], b.get("attention_mask"), labels=b["labels"])
    return out, partial(_loss_func, b["loss_mask"])


def step_function(cuda_graph: str = "none", warmup: int = 3):
    """Megatron's forward-backward function for training steps: with
    train.cuda_graph=full_iteration wrapped in Megatron-Core's FullCudaGraphWrapper (after
    `warmup` eager steps it captures the next step's forward and backward of all
    micro-batches, batches copied into static buffers, and replays it from then on; the
    optimizer step stays eager). local graphs are per layer, inside the model (train/graphs.py)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    fn = get_forward_backward_func()
    if cuda_graph == "full_iteration":
        from megatron.core.full_cuda_graph import FullCudaGraphWrapper

        fn = FullCudaGraphWrapper(fn, cuda_graph_warmup_steps=warmup)
    return fn


def forward_backward(
    model,
    batches,
    *,
    n_micro: int,
    seq_len: int,
    micro_batch: int,
    forward_only: bool,
    step_fn=None,
) -> list[dict]:
    """Runs n_micro micro-batches, accumulating grads unless forward_only; returns reports
    (empty on pipeline stages other than the last). step_fn: step_function()'s (training
    steps; None: Megatron's plain function)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return (step_fn or get_forward_backward_func())(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=[model],
        num_microbatches=n_micro,
        seq_length=seq_len,
        micro_batch_size=micro_batch,
        decoder_seq_length=seq_len,
        forward_only=forward_only,
    )


def micro_batches(dataset, step: int, cfg, env, device):
    """Global batch `step` of `dataset`: this data-parallel rank's micro-batches on `device`."""
    t = cfg.train
    return data.micro_batches(
        dataset,
        step,
        global_batch=t.global_batch,
        micro_batch=t.micro_batch,
        dp=env.dp,
        dp_rank=env.dp_rank,
        device=device,
    )


class TrainingStep:
    """One optimizer step as the trainer runs it (loop.py), and as the step profiler
    profiles it (bench/profile.py): zero the grads, Megatron's forward and backward of every
    micro-batch (`step_function`: full_iteration graphs wrap it, local ones are inside the
    model), the optimizer step, then the kept weight operands re-made from the new weights
    before any graph replays them (train.weight_cache; quant/weight_cache.py). Built before
    a checkpoint loads: it makes the kept operands' storage fixed, and none exist before the
    first forward."""

    def __init__(self, built, cfg, rt):
        self._built, self._cfg, self._device = built, cfg, rt.device
        self._step_fn = step_function(rt.cuda_graph, cfg.train.cuda_graph_warmup)
        self._kept = weight_cache.make_static(built.model)

    def __call__(self, step: int) -> tuple[list[dict], object]:
        """Trains on global batch `step` of the training set: (the micro-batches' reports,
        the optimizer step's grad norm)."""
        built, t = self._built, self._cfg.train
        built.opt.zero_grad()
        reports = forward_backward(
            built.opt.model,  # Megatron's DDP wrapper
            micro_batches(built.train_ds, step, self._cfg, built.env, self._device),
            n_micro=built.n_micro,
            seq_len=t.seq_len,
            micro_batch=t.micro_batch,
            forward_only=False,
            step_fn=self._step_fn,
        )
        grad_norm = built.opt.step()
        if self._kept:
            weight_cache.refresh(built.model)
        return reports, grad_norm
