"""The embedded corpus: this Python's standard-library sources, real text on every machine.

Files are read in sorted order (tests and vendored packages excluded) until `max_bytes`, so a
given Python version always yields the same corpus. Each file is one document.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path

_SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "lib2to3",
    "ensurepip",
}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_documents(max_bytes: int) -> Iterator[str]:
    """Yields whole files until their total size reaches max_bytes (at least one file)."""
    total = 0
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        total += len(text.encode("utf-8"))
        if total >= max_bytes:
            return


def embedded_bpe_path(cache_dir: str | Path, max_bytes: int, vocab_size: int) -> Path:
    """Where the BPE trained on the embedded corpus lives (`data.corpus_bpe_vocab`)."""
    return Path(cache_dir) / f"stdlib-bpe{vocab_size}-{max_bytes}.tokenizer.json"


def embedded_corpus(cache_dir: str | Path, max_bytes: int, tokenizer, name: str) -> str:
    """The embedded corpus tokenized by `tokenizer` under cache_dir, written on first use.

    name: the tokenizer's part of the file name ("byte", "bpe8192"): one file per tokenizer.
    Jobs sharing a cache dir (a compare sweep) may race: each writes under its own temporary
    name, then renames (write_indexed), so a visible .idx means both files are complete.
    """
    from .indexed import write_indexed

    prefix = Path(cache_dir) / f"stdlib-{name}-{max_bytes}"
    if not Path(f"{prefix}.idx").exists():
        write_indexed(([text] for text in stdlib_documents(max_bytes)), prefix, tokenizer)
    return str(prefix)


def train_embedded_bpe(cache_dir: str | Path, max_bytes: int, vocab_size: int) -> Path:
    """The byte-level BPE of the embedded corpus, trained once (deterministic, race-safe)."""
    from .bpe import train_bpe

    path = embedded_bpe_path(cache_dir, max_bytes, vocab_size)
    if not path.exists():
        train_bpe(stdlib_documents(max_bytes), vocab_size, path)
    return path
