"""Text files -> Megatron indexed data (.bin/.idx) with the offline byte tokenizer.

    python -m ufp4_megatron.prepare_data --out data/mytext file1.txt dir2/ ...
    python -m ufp4_megatron.prepare_data --out data/stdlib           # the embedded corpus

Each file is one document followed by EOD. Directories are walked for *.txt, *.md, *.rst and
*.py, in sorted order. Train with `data.prefixes=[data/mytext]`.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from .train.corpus import stdlib_documents
from .train.tokenizer import ByteTokenizer

_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")


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


def _read_inputs(paths: list[str]) -> Iterable[str]:
    for p in map(Path, paths):
        files = sorted(f for f in p.rglob("*") if f.suffix in _TEXT_SUFFIXES) if p.is_dir() else [p]
        for f in files:
            yield f.read_text(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help="text files or dirs; none: the embedded corpus")
    ap.add_argument("--out", required=True, help="output prefix (writes <out>.bin and <out>.idx)")
    ap.add_argument("--max-bytes", type=int, default=8_000_000, help="embedded corpus size")
    args = ap.parse_args(argv)
    docs = _read_inputs(args.inputs) if args.inputs else stdlib_documents(args.max_bytes)
    n_docs, n_tokens = write_indexed(docs, args.out)
    print(f"wrote {args.out}.bin/.idx: {n_docs} documents, {n_tokens} tokens")


if __name__ == "__main__":
    main()
