"""What is checked about indexed data before training, and the identity caches are keyed by.

    file_identity(prefix)      size and mtime of <prefix>.bin/.idx: rewriting the data (e.g.
                               prepare_data again on the same prefix) changes it
    cache_key(prefixes)        16 hex digits over the blend's file identities: Megatron's
                               GPTDataset index cache lives under index/<key>/, so an index
                               built for older files is never read for newer ones
    inspect(prefix)            the .idx readable, the .bin exactly as long as it says
    token_range(prefix, dir)   smallest and largest token id, one memory-mapped pass, cached
                               in <dir>/tokens-<identity>.json
    check_tokenizer_fits_model, check_data_fits   model.vocab_size >= the tokenizer's ids > the data's

Each failure is a DataError whose message names the file, the numbers and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError

_CHUNK = 1 << 26  # tokens per slice of the max-id pass: bounded memory on any file size


def file_identity(prefix: str) -> list:
    out = [os.path.realpath(prefix)]
    for ext in (".bin", ".idx"):
        st = os.stat(f"{prefix}{ext}")
        out += [st.st_size, st.st_mtime_ns]
    return out


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


def cache_key(prefixes: list[str]) -> str:
    return _digest([file_identity(p) for p in prefixes])


@dataclass(frozen=True)
class IndexedInfo:
    sequences: int
    tokens: int
    dtype: str


def inspect(prefix: str) -> IndexedInfo:
    """Opens <prefix>.idx and checks the .bin's size against it."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    if any(c in prefix for c in "*?[") and not Path(f"{prefix}.idx").is_file():
        raise DataError(
            f"data.prefixes: {prefix} is a pattern, and prefixes are not expanded: "
            "list each file prefix (the path without .bin/.idx)"
        )
    for ext in (".idx", ".bin"):
        if not Path(f"{prefix}{ext}").is_file():
            raise DataError(
                f"data.prefixes: {prefix}{ext} not found; write it with "
                f"`python -m ufp4_megatron.cli.prepare_data --out {prefix} <files>`"
                + (
                    f" ({prefix} is a directory: give the prefix of the files in "
                    "it, e.g. dir/name for dir/name.bin)"
                    if Path(prefix).is_dir()
                    else ""
                )
            )
    try:
        index = IndexedDataset(prefix).index
        lengths, pointers = index.sequence_lengths, index.sequence_pointers
        dtype = index.dtype
    except Exception as e:  # struct/numpy errors that name no file
        raise DataError(
            f"{prefix}.idx is not a readable Megatron index ({type(e).__name__}: "
            f"{e}); remake {prefix}.bin/.idx with prepare_data"
        ) from e
    itemsize = index.dtype_size
    tokens = int(lengths.sum()) if len(lengths) else 0
    expected = int(pointers[-1]) + int(lengths[-1]) * itemsize if len(lengths) else 0
    actual = os.path.getsize(f"{prefix}.bin")
    if actual != expected:
        what = "truncated" if actual < expected else "longer than its index says"
        raise DataError(
            f"{prefix}.bin is {what}: {actual} bytes, {prefix}.idx expects "
            f"{expected} ({tokens} {dtype.__name__} tokens); copy it again or remake "
            f"both files with prepare_data"
        )
    return IndexedInfo(sequences=len(lengths), tokens=tokens, dtype=dtype.__name__)


def token_range(prefix: str, cache_dir: str | Path) -> tuple[int, int]:
    """(min, max) token id of <prefix>.bin; computed once per file identity, then cached."""
    import numpy as np

    info = inspect(prefix)
    key = _digest(file_identity(prefix))
    cache = Path(cache_dir) / f"tokens-{key}.json"
    if cache.is_file():
        try:
            c = json.loads(cache.read_text())
            return c["min_id"], c["max_id"]
        except (ValueError, KeyError):
            pass  # a partial file from a killed job: compute again
    data = np.memmap(f"{prefix}.bin", dtype=info.dtype, mode="r")
    lo, hi = 0, -1  # an empty file: no ids
    for start in range(0, data.size, _CHUNK):
        part = data[start : start + _CHUNK]
        lo, hi = (
            (int(part.min()), int(part.max()))
            if start == 0
            else (min(lo, int(part.min())), max(hi, int(part.max())))
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.tmp{os.getpid()}")
    tmp.write_text(
        json.dumps(
            {
                "prefix": os.path.realpath(prefix),
                "min_id": lo,
                "max_id": hi,
                "tokens": info.tokens,
                "dtype": info.dtype,
            }
        )
    )
    os.replace(tmp, cache)
    return lo, hi


def check_tokenizer_fits_model(tokenizer_vocab: int, model_vocab: int, tokenizer_desc: str) -> None:
    if model_vocab < tokenizer_vocab:
        fix = -(-tokenizer_vocab // 128) * 128  # Megatron pads the vocabulary to a multiple of 128
        raise DataError(
            f"model.vocab_size={model_vocab} is smaller than the tokenizer's "
            f"{tokenizer_vocab} ids (data.tokenizer: {tokenizer_desc}); set "
            f"model.vocab_size={fix}"
        )


def check_data_fits(
    prefix: str, lo: int, hi: int, tokenizer_vocab: int, tokenizer_desc: str
) -> None:
    """Ids outside the tokenizer's range: data made with another tokenizer (with the model's
    vocabulary checked against the tokenizer's, this also keeps every id inside the model)."""
    if lo < 0:
        raise DataError(
            f"{prefix}.bin holds a negative token id ({lo}): not token data; "
            f"remake it with prepare_data"
        )
    if hi >= tokenizer_vocab:
        raise DataError(
            f"{prefix}.bin holds token id {hi}, but the tokenizer (data.tokenizer: "
            f"{tokenizer_desc}) has {tokenizer_vocab} ids: the data was made with another "
            f"tokenizer; set data.tokenizer to that one (for Megatron-LM data: "
            f"data.tokenizer.type=null-text data.tokenizer.vocab_size=<its vocabulary, >= {hi + 1}>)"
        )
