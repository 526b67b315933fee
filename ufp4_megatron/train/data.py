"""Megatron's GPTDataset over indexed data, read in a fixed global order.

Step s uses the global batch of samples [s * G, (s + 1) * G) of the (seeded, shuffled)
GPTDataset; data-parallel rank r takes micro-batch m's slice starting at
s * G + (m * dp + r) * micro_batch. The data position is therefore the step number alone,
the same for every recipe, and restored exactly on resume.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..prepare_data import embedded_corpus
from .schema import Config
from .tokenizer import ByteTokenizer


def build_datasets(cfg: Config, n_train: int, n_valid: int):
    """(train, valid) GPTDatasets through Megatron's BlendedMegatronDatasetBuilder."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    d = cfg.data
    prefixes = list(d.prefixes) or [_embedded(cfg)]
    for p in prefixes[1::2] if len(prefixes) > 1 and _is_number(prefixes[0]) else prefixes:
        if not Path(f"{p}.idx").exists():
            raise FileNotFoundError(f"data.prefixes: {p}.idx not found; write it with "
                                    f"`python -m ufp4_megatron.prepare_data --out {p} <files>`")
    tok = ByteTokenizer()
    if cfg.model.vocab_size < tok.vocab_size:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} is below the tokenizer's "
                         f"{tok.vocab_size}")
    config = GPTDatasetConfig(
        random_seed=cfg.train.seed, sequence_length=cfg.train.seq_len,
        blend=get_blend_from_list(prefixes), split=d.split,
        path_to_cache=str(Path(d.cache_dir) / "index"), tokenizer=tok,
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=True,  # Megatron's mask-free path allocates on "cuda"
        mid_level_dataset_surplus=0.005,
    )
    for p in prefixes[1::2] if len(prefixes) > 1 and _is_number(prefixes[0]) else prefixes:
        _check_split_sizes(p, config.split_matrix, d.split)
    train, valid, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [n_train, n_valid, None], lambda: True, config).build()
    return train, valid


def _check_split_sizes(prefix: str, split_matrix, split: str) -> None:
    """Megatron loops forever on a split with no documents: fail first, saying why."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    n = len(IndexedDataset(prefix))
    for name, bounds in zip(("train", "valid", "test"), split_matrix):
        if bounds is not None and round(bounds[1] * n) - round(bounds[0] * n) == 0:
            raise ValueError(f"data.split={split!r} leaves the {name} split of {prefix} "
                             f"({n} documents) empty; use more data or change data.split")


def _embedded(cfg: Config) -> str:
    import torch.distributed as dist

    # rank 0 writes the corpus once; the others wait and read it
    if not dist.is_initialized() or dist.get_rank() == 0:
        embedded_corpus(cfg.data.cache_dir, cfg.data.corpus_max_bytes)
    if dist.is_initialized():
        dist.barrier()
    return embedded_corpus(cfg.data.cache_dir, cfg.data.corpus_max_bytes)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def micro_batches(dataset, step: int, cfg: Config, dp: int, dp_rank: int, device: torch.device):
    """This rank's micro-batches of global batch `step`, as Megatron's GPT batch dicts."""
    t = cfg.train
    n_micro = num_micro_batches(cfg, dp)
    for m in range(n_micro):
        start = step * t.global_batch + (m * dp + dp_rank) * t.micro_batch
        samples = [dataset[(start + j) % len(dataset)] for j in range(t.micro_batch)]
        yield {k: torch.stack([s[k] for s in samples]).to(device)
               for k in ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")}


def num_micro_batches(cfg: Config, dp: int) -> int:
    t = cfg.train
    if t.global_batch % (t.micro_batch * dp):
        raise ValueError(f"train.global_batch={t.global_batch} must be a multiple of "
                         f"train.micro_batch * data-parallel size = {t.micro_batch} * {dp}")
    return t.global_batch // (t.micro_batch * dp)
