"""Documents -> Megatron indexed data (<prefix>.bin/.idx), written atomically.

The format and the encoding are Megatron-LM's `tools/preprocess_data.py --append-eod`: each
document is a list of sentences (a plain-text file is one), each sentence tokenized on its own,
empty ones dropped, EOD appended to the last, one `IndexedDatasetBuilder.add_document` per
document; the token dtype is `DType.optimal_dtype(tokenizer.vocab_size)` (uint16 below 65500
ids, else int32). Files are written as <prefix>.tmp<pid>.bin/.idx and renamed when complete
(.bin first: a visible .idx means both are whole); on any error they are removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


class IndexedWriter:
    """with IndexedWriter(prefix, tokenizer) as w: w.add(["sentence", ...]) per document."""

    def __init__(self, prefix: str | Path, tokenizer):
        self.prefix = Path(prefix)
        self.tokenizer = tokenizer
        self.documents = self.tokens = 0

    def __enter__(self) -> IndexedWriter:
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.prefix.with_name(f"{self.prefix.name}.tmp{os.getpid()}")
        self._builder = IndexedDatasetBuilder(
            f"{self._tmp}.bin", dtype=DType.optimal_dtype(self.tokenizer.vocab_size)
        )
        return self

    def add(self, sentences: list[str]) -> int:
        """Adds one document; returns its number of tokens (0 for an empty document)."""
        return self.add_encoded(*encode(self.tokenizer, sentences))

    def add_encoded(self, ids: list[int], lengths: list[int]) -> int:
        """Adds one document `encode` made (in this process or a worker's)."""
        if ids:
            lo, hi = min(ids), max(ids)
            if lo < 0 or hi >= self.tokenizer.vocab_size:  # would wrap around in uint16
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"token id {bad} is outside the tokenizer's ids "
                    f"0..{self.tokenizer.vocab_size - 1}"
                )
        self._builder.add_document(ids, lengths)
        self.documents += 1
        self.tokens += len(ids)
        return len(ids)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.documents and self.tokens:
            self._builder.finalize(f"{self._tmp}.idx")
            for ext in (".bin", ".idx"):
                os.replace(f"{self._tmp}{ext}", f"{self.prefix}{ext}")
            return
        self._builder.data_file.close()  # an error, or nothing to write: leave no files
        for ext in (".bin", ".idx"):
            Path(f"{self._tmp}{ext}").unlink(missing_ok=True)
        if exc_type is None and self.documents:  # e.g. one empty text file
            raise ValueError(
                f"no text to write to {self.prefix}: all {self.documents} "
                "documents are empty; give files that hold text"
            )
        if exc_type is None:
            raise ValueError(
                f"no documents to write to {self.prefix}: give text or JSONL "
                f"files, or directories that hold some"
            )


def encode(tokenizer, sentences: list[str]) -> tuple[list[int], list[int]]:
    """(ids, sentence lengths) of one document: each sentence tokenized on its own, EOD
    appended to the last, as preprocess_data.py --append-eod does; empty sentences dropped."""
    ids, lengths = [], []
    for sentence in sentences:
        sentence_ids = tokenizer.tokenize(sentence)
        if sentence_ids:
            ids.extend(sentence_ids)
            lengths.append(len(sentence_ids))
    if ids:
        ids.append(tokenizer.eod)
        lengths[-1] += 1
    return ids, lengths


def write_indexed(documents: Iterable[list[str]], prefix: str | Path, tokenizer) -> tuple[int, int]:
    """Tokenizes documents (lists of sentences) into <prefix>.bin/.idx; (documents, tokens)."""
    with IndexedWriter(prefix, tokenizer) as w:
        for sentences in documents:
            w.add(sentences)
    return w.documents, w.tokens
