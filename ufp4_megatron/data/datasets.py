"""Megatron's GPTDataset over indexed data, read in a fixed global order.

Step s uses the global batch of samples [s * G, (s + 1) * G) of the (seeded, shuffled)
GPTDataset; data-parallel rank r takes micro-batch m's slice starting at
s * G + (m * dp + r) * micro_batch. The data position is therefore the step number alone,
the same for every recipe, and restored exactly on resume.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .indexed import embedded_corpus
from .tokenizers import ByteTokenizer


def build_datasets(data, *, seed: int, seq_len: int, vocab_size: int, n_train: int,
                   n_valid: int, create_attention_mask: bool = True):
    """(train, valid) GPTDatasets through Megatron's BlendedMegatronDatasetBuilder.

    data: the `data` config group (prefixes, split, cache_dir, corpus_max_bytes).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    prefixes = list(data.prefixes) or [_embedded(data)]
    for p in _paths(prefixes):
        if not Path(f"{p}.idx").exists():
            raise FileNotFoundError(f"data.prefixes: {p}.idx not found; write it with "
                                    f"`python -m ufp4_megatron.prepare_data --out {p} <files>`")
    tok = ByteTokenizer()
    if vocab_size < tok.vocab_size:
        raise ValueError(f"model.vocab_size={vocab_size} is below the tokenizer's "
                         f"{tok.vocab_size}")
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_len,
        blend=get_blend_from_list(prefixes), split=data.split,
        path_to_cache=str(Path(data.cache_dir) / "index"), tokenizer=tok,
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=create_attention_mask,
        mid_level_dataset_surplus=0.005,
    )
    for p in _paths(prefixes):
        _check_split_sizes(p, config.split_matrix, data.split)
    train, valid, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [n_train, n_valid, None], lambda: True, config).build()
    return train, valid


def _paths(prefixes: list[str]) -> list[str]:
    """The file prefixes of a blend: ["a"] or ["0.7", "a", "0.3", "b"]."""
    return prefixes[1::2] if len(prefixes) > 1 and _is_number(prefixes[0]) else prefixes


def _check_split_sizes(prefix: str, split_matrix, split: str) -> None:
    """Megatron loops forever on a split with no documents: fail first, saying why."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    n = len(IndexedDataset(prefix))
    for name, bounds in zip(("train", "valid", "test"), split_matrix):
        if bounds is not None and round(bounds[1] * n) - round(bounds[0] * n) == 0:
            raise ValueError(f"data.split={split!r} leaves the {name} split of {prefix} "
                             f"({n} documents) empty; use more data or change data.split")


def _embedded(data) -> str:
    import torch.distributed as dist

    # rank 0 writes the corpus once; the others wait and read it
    if not dist.is_initialized() or dist.get_rank() == 0:
        embedded_corpus(data.cache_dir, data.corpus_max_bytes)
    if dist.is_initialized():
        dist.barrier()
    return embedded_corpus(data.cache_dir, data.corpus_max_bytes)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def micro_batches(dataset, step: int, *, global_batch: int, micro_batch: int, dp: int,
                  dp_rank: int, device: torch.device):
    """This rank's micro-batches of global batch `step`, as Megatron's GPT batch dicts."""
    n_micro = num_micro_batches(global_batch, micro_batch, dp)
    for m in range(n_micro):
        start = step * global_batch + (m * dp + dp_rank) * micro_batch
        samples = [dataset[(start + j) % len(dataset)] for j in range(micro_batch)]
        yield {k: torch.stack([s[k] for s in samples]).to(device)
               for k in ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
               if k in samples[0]}  # no attention_mask with create_attention_mask=False


def num_micro_batches(global_batch: int, micro_batch: int, dp: int) -> int:
    if global_batch % (micro_batch * dp):
        raise ValueError(f"train.global_batch={global_batch} must be a multiple of "
                         f"train.micro_batch * data-parallel size = {micro_batch} * {dp}")
    return global_batch // (micro_batch * dp)
