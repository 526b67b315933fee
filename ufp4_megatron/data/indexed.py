"""Documents -> Megatron indexed data (<prefix>.bin/.idx), written atomically."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from .corpus import stdlib_documents
from .tokenizers import ByteTokenizer


def write_indexed(documents: Iterable[str], prefix: str | Path) -> tuple[int, int]:
    """Tokenizes documents into <prefix>.bin/.idx atomically; returns (documents, tokens)."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp = prefix.with_name(f"{prefix.name}.tmp{os.getpid()}")
    tok = ByteTokenizer()
    builder = IndexedDatasetBuilder(f"{tmp}.bin", dtype=np.uint16)
    n_docs = n_tokens = 0
    for text in documents:
        ids = tok.tokenize(text) + [tok.eod]
        builder.add_document(torch.tensor(ids, dtype=torch.int64), [len(ids)])
        n_docs, n_tokens = n_docs + 1, n_tokens + len(ids)
    if n_docs == 0:
        raise ValueError("no documents to write: give text files or directories that hold some")
    builder.finalize(f"{tmp}.idx")
    for ext in (".bin", ".idx"):  # rename last, so a reader never sees half a dataset
        os.replace(f"{tmp}{ext}", f"{prefix}{ext}")
    return n_docs, n_tokens


def embedded_corpus(cache_dir: str | Path, max_bytes: int) -> str:
    """The embedded corpus's prefix under cache_dir, written on first use."""
    prefix = Path(cache_dir) / f"stdlib_bytes_{max_bytes}"
    if not Path(f"{prefix}.idx").exists():
        # Jobs sharing a cache dir (a compare sweep) may race: each writes under its own
        # name, then renames (.bin first: a visible .idx means both files are complete).
        tmp = prefix.with_name(f"{prefix.name}.tmp{os.getpid()}")
        write_indexed(stdlib_documents(max_bytes), tmp)
        os.replace(f"{tmp}.bin", f"{prefix}.bin")
        os.replace(f"{tmp}.idx", f"{prefix}.idx")
    return str(prefix)
