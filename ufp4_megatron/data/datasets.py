"""Megatron's GPTDataset over indexed data, read in a fixed global order.

Step s uses the global batch of samples [s * G, (s + 1) * G) of the (seeded, shuffled)
GPTDataset (validation: of the validation split's, shuffled with data.valid_seed when set);
data-parallel rank r takes micro-batch m's slice starting at
s * G + (m * dp + r) * micro_batch. The data position is therefore the step number alone,
the same for every recipe, and restored exactly on resume.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from pathlib import Path

import torch

from . import checks, index_cache
from .corpus import embedded_bpe_path, embedded_corpus, train_embedded_bpe
from .errors import DataError
from .tokenizers import build_tokenizer, describe


def build_datasets(
    data,
    *,
    seed: int,
    seq_len: int,
    vocab_size: int,
    n_train: int,
    n_valid: int,
    create_attention_mask: bool = True,
):
    """(train, valid) GPTDatasets through Megatron's BlendedMegatronDatasetBuilder.

    data: the `data` config group (prefixes, split, cache_dir, tokenizer, corpus_*).
    vocab_size: model.vocab_size, checked against the tokenizer and the data's ids first.
    create_attention_mask: False lets a fused-attention path skip the (seq, seq) mask;
    Megatron's mask-free path allocates on "cuda", so CPU runs keep True.
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    tok_cfg = tokenizer_config(data)
    if data.corpus_bpe_vocab:  # refuse before training a BPE the model cannot hold
        checks.check_tokenizer_fits_model(data.corpus_bpe_vocab, vocab_size, describe(tok_cfg))
    if data.prefixes:
        prefixes = list(data.prefixes)
    else:
        prefixes = [_rank0_first(lambda: _embedded(data, tok_cfg))]
    tok = build_tokenizer(tok_cfg)
    desc = describe(tok_cfg)
    checks.check_tokenizer_fits_model(tok.vocab_size, vocab_size, desc)
    index_dir = Path(data.cache_dir) / "index"
    for p in _paths(prefixes):
        lo, hi = _rank0_first(lambda: checks.token_range(p, index_dir))
        checks.check_data_fits(p, lo, hi, tok.vocab_size, desc)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_len,
        blend=get_blend_from_list(prefixes),
        split=data.split,
        # keyed by the files' size and mtime: data rewritten in place gets a new index
        path_to_cache=str(index_dir / checks.cache_key(_paths(prefixes))),
        tokenizer=tok,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=create_attention_mask,
        mid_level_dataset_surplus=0.005,
    )
    for p in _paths(prefixes):
        _check_split_sizes(p, config.split_matrix, data.split)
    _check_index_memory(prefixes, config.split_matrix, n_train, seq_len)
    with index_cache.guard(config.path_to_cache, build_here=_rank() == 0):
        train, valid, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [n_train, n_valid, None], lambda: True, config
        ).build()
        valid_seed = getattr(data, "valid_seed", None)  # configs saved before it: None
        if valid_seed is not None and valid_seed != seed:
            # the same split's documents, shuffled with valid_seed: every run validates on the
            # same samples whatever its train.seed (the train split of this build is not used)
            _, valid, _ = BlendedMegatronDatasetBuilder(
                GPTDataset,
                [1, n_valid, None],
                lambda: True,
                dataclasses.replace(config, random_seed=valid_seed),
            ).build()
    return train, valid


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def tokenizer_config(data):
    """data.tokenizer, with the embedded corpus's trained BPE filled in (corpus_bpe_vocab)."""
    cfg = data.tokenizer
    if not data.corpus_bpe_vocab:
        return cfg
    if data.prefixes:
        raise DataError(
            f"data.corpus_bpe_vocab={data.corpus_bpe_vocab} trains a BPE on the "
            f"embedded corpus, but data.prefixes is set: set "
            f"data.corpus_bpe_vocab=0 and data.tokenizer to your data's tokenizer"
        )
    if cfg.type != "huggingface" or cfg.path:
        raise DataError(
            f"data.corpus_bpe_vocab={data.corpus_bpe_vocab} brings its own "
            f"tokenizer: leave data.tokenizer.type=huggingface and "
            f"data.tokenizer.path=null (as data=embedded_bpe does)"
        )
    cfg = copy.copy(cfg)
    cfg.path = str(embedded_bpe_path(data.cache_dir, data.corpus_max_bytes, data.corpus_bpe_vocab))
    return cfg


def _paths(prefixes: list[str]) -> list[str]:
    """The file prefixes of a blend: ["a"] or ["0.7", "a", "0.3", "b"]."""
    return prefixes[1::2] if len(prefixes) > 1 and _is_number(prefixes[0]) else prefixes


def _check_split_sizes(prefix: str, split_matrix, split: str) -> None:
    """Megatron loops forever on a split with no documents: fail first, saying why."""
    n = checks.inspect(prefix).sequences
    for name, bounds in zip(("train", "valid", "test"), split_matrix):
        if bounds is not None and round(bounds[1] * n) - round(bounds[0] * n) == 0:
            raise DataError(
                f"data.split={split!r} leaves the {name} split of {prefix} "
                f"({n} documents) empty; use more data or change data.split"
            )


def _check_index_memory(prefixes: list[str], split_matrix, n_train: int, seq_len: int) -> None:
    """Megatron's GPTDataset builds its sample order in memory: per prefix a document index of
    (epochs x documents) entries, made through numpy.mgrid (two int64 grids, then an int32
    copy), and sample and shuffle indices of 24 bytes per sample. A run far longer than its
    data (train.steps=2000000000) asks for terabytes of them and dies in a MemoryError, or in
    the OOM killer; refuse it here, with the numbers."""
    paths = _paths(prefixes)
    weights = (
        [float(w) for w in prefixes[0::2]] if len(paths) != len(prefixes) else [1.0] * len(paths)
    )
    lo, hi = split_matrix[0] or (0.0, 0.0)
    need = 0.0
    for p, w in zip(paths, weights):
        info = checks.inspect(p)
        docs = max(1.0, info.sequences * (hi - lo))
        tokens = max(1.0, info.tokens * (hi - lo))
        samples = n_train * w / sum(weights) * 1.005  # Megatron's mid-level surplus
        epochs = math.ceil((samples * seq_len + 1) / tokens)
        need += 20 * epochs * docs + 24 * samples
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > total:
        raise DataError(
            f"{n_train:,} training samples (train.steps x train.global_batch) of "
            f"{seq_len} tokens from {', '.join(paths)}: Megatron's dataset index "
            f"for them would take about {need / 2**30:,.0f} GiB of memory, more "
            f"than this machine's {total / 2**30:,.0f} GiB; train fewer steps or "
            "on more data"
        )


def _embedded(data, tok_cfg) -> str:
    """The embedded corpus's prefix under cache_dir, tokenized (and its BPE trained) once."""
    if data.corpus_bpe_vocab:
        train_embedded_bpe(data.cache_dir, data.corpus_max_bytes, data.corpus_bpe_vocab)
        name = f"bpe{data.corpus_bpe_vocab}"
    elif tok_cfg.type == "byte-level":
        name = "byte"
    else:
        raise DataError(
            f"data.prefixes is empty (the embedded corpus) with "
            f"data.tokenizer.type={tok_cfg.type}: the corpus is tokenized with "
            f"bytes or its own BPE (data=embedded_bpe); for another tokenizer run "
            f"prepare_data --tokenizer ... and set data.prefixes"
        )
    return embedded_corpus(data.cache_dir, data.corpus_max_bytes, build_tokenizer(tok_cfg), name)


def _rank0_first(fn):
    """fn() on rank 0, then on the other ranks (which then find rank 0's files)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return fn()
    out = error = None
    if dist.get_rank() == 0:
        try:
            out = fn()
        except Exception as e:  # the others must pass the barrier too, then fail the same way
            error = e
    dist.barrier()
    if error is not None:
        raise error
    return out if dist.get_rank() == 0 else fn()


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def micro_batches(
    dataset,
    step: int,
    *,
    global_batch: int,
    micro_batch: int,
    dp: int,
    dp_rank: int,
    device: torch.device,
):
    """This rank's micro-batches of global batch `step`, as Megatron's GPT batch dicts."""
    n_micro = num_micro_batches(global_batch, micro_batch, dp)
    for m in range(n_micro):
        start = step * global_batch + (m * dp + dp_rank) * micro_batch
        samples = [dataset[(start + j) % len(dataset)] for j in range(micro_batch)]
        yield {
            k: torch.stack([s[k] for s in samples]).to(device)
            for k in ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")
            if k in samples[0]
        }  # no attention_mask with create_attention_mask=False


def num_micro_batches(global_batch: int, micro_batch: int, dp: int) -> int:
    if global_batch % (micro_batch * dp):
        raise ValueError(
            f"train.global_batch={global_batch} must be a multiple of "
            f"train.micro_batch * data-parallel size = {micro_batch} * {dp}"
        )
    return global_batch // (micro_batch * dp)
