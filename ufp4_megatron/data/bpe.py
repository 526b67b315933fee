"""An offline byte-level BPE trained with HuggingFace `tokenizers`, saved as a tokenizer.json.

GPT-2's scheme: the ByteLevel pre-tokenizer (its regex split, bytes mapped to 256 printable
symbols, so any text encodes and nothing is unknown), BPE merges learned on the given
documents, `<|endoftext|>` as id 0 (the EOD; no pad token, so nothing is masked as pad).
Training is deterministic for the same documents (same file bytes, any thread count), and
the file is written under a temporary name and renamed, so jobs that train the same tokenizer
at once all end up with one complete, identical file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

EOD_TOKEN = "<|endoftext|>"
MIN_VOCAB = 257  # the 256 byte symbols and the EOD


def train_bpe(
    texts: Iterable[str], vocab_size: int, path: str | Path, *, progress: bool = False
) -> Path:
    """Trains a byte-level BPE of `vocab_size` tokens on `texts`; writes it to `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB:
        raise ValueError(
            f"a byte-level BPE needs at least {MIN_VOCAB} tokens (256 bytes and "
            f"{EOD_TOKEN}); got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tok.save(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
