"""A byte-level tokenizer: nothing to download, the same ids on every machine.

Ids 0-255 are the UTF-8 bytes, 256 ends a document (EOD), 257 pads. Megatron's GPTDataset
needs only `eod`, `pad` and `vocab_size` from a tokenizer.
"""
from __future__ import annotations


class ByteTokenizer:
    eod = 256
    pad = 257
    vocab_size = 258

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    @property
    def unique_identifiers(self) -> dict:  # Megatron hashes the dataset config, tokenizer too
        return {"class": "ByteTokenizer", "vocab_size": self.vocab_size}
