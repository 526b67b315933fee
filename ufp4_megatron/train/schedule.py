"""One global batch of forward/backward passes through Megatron's own schedule.

`get_forward_backward_func()`: no pipelining, or 1F1B when parallel.pp > 1. The same call on
CPU (its token counters on "cuda" land on CPU inside the CPU runtime's scope, the plugin's
cpu_compat), so the loss contract (sum / tokens / micro-batches), the MoE aux-loss scaling and
the gradient finalization (DP all-reduce, SP norm grads) are Megatron's on both.
"""

from __future__ import annotations

from functools import partial

import torch


def _loss_func(loss_mask: torch.Tensor, output: torch.Tensor):
    """Megatron's 3-tuple contract: (summed loss, token count, values to report)."""
    mask = loss_mask.view(-1).float()
    total = torch.sum(output.view(-1).float() * mask)
    return total, mask.sum().to(torch.int), {"lm loss": torch.stack([total.detach(), mask.sum()])}


def forward_step(data_iterator, model):
    b = next(data_iterator)
    out = model(b["tokens"], b["position_ids"], b.get("attention_mask"), labels=b["labels"])
    return out, partial(_loss_func, b["loss_mask"])


def forward_backward(
    model, batches, *, n_micro: int, seq_len: int, micro_batch: int, forward_only: bool
) -> list[dict]:
    """Runs n_micro micro-batches, accumulating grads unless forward_only; returns reports
    (empty on pipeline stages other than the last)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=[model],
        num_microbatches=n_micro,
        seq_length=seq_len,
        micro_batch_size=micro_batch,
        decoder_seq_length=seq_len,
        forward_only=forward_only,
    )
