"""One global batch of forward/backward passes: Megatron's schedule on GPU, its twin on CPU.

GPU: `get_forward_backward_func()` (no pipelining, or 1F1B when parallel.pp > 1).
CPU: Megatron's schedules allocate a token counter on device "cuda", so the same
no-pipelining schedule is spelled out here: the same forward step, the same loss contract
(sum / tokens / micro-batches), the same MoE aux-loss scaling.
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


def forward_backward(model, batches, *, n_micro: int, seq_len: int, micro_batch: int,
                     forward_only: bool) -> list[dict]:
    """Runs n_micro micro-batches, accumulating grads unless forward_only; returns reports."""
    if next(model.parameters()).is_cuda:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
            num_microbatches=n_micro, seq_length=seq_len, micro_batch_size=micro_batch,
            decoder_seq_length=seq_len, forward_only=forward_only)
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1) / n_micro)
    reports, it = [], iter(batches)
    for _ in range(n_micro):
        output, loss_func = forward_step(it, model)
        total, n_tokens, report = loss_func(output)
        if not forward_only:
            (total / n_tokens.clamp(min=1) / n_micro).backward()
        reports.append(report)
    return reports
