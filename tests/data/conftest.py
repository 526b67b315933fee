"""Real tokenizer files made offline for the data tests: a byte-level BPE (HuggingFace
`tokenizers`), a tiktoken ranks file in Megatron's format, a sentencepiece model."""

from __future__ import annotations

import base64
import json
import warnings

import pytest

from ufp4_megatron.data.bpe import train_bpe
from ufp4_megatron.data.corpus import stdlib_documents

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|apex|absl).*")


@pytest.fixture(scope="session")
def corpus_texts() -> list[str]:
    return list(stdlib_documents(300_000))


@pytest.fixture(scope="session")
def bpe_json(tmp_path_factory, corpus_texts):
    """A 512-token byte-level BPE trained on 300 kB of the embedded corpus."""
    return train_bpe(corpus_texts, 512, tmp_path_factory.mktemp("bpe") / "tokenizer.json")


@pytest.fixture(scope="session")
def tiktoken_ranks(tmp_path_factory):
    """Megatron's TikTokenizer vocabulary: the 256 bytes, then a few merges."""
    merges = [b"th", b"he", b"the", b" t", b" the", b"in", b"ing", b"er", b"an", b"on"]
    tokens = [bytes([i]) for i in range(256)] + merges
    path = tmp_path_factory.mktemp("tiktoken") / "ranks.json"
    path.write_text(
        json.dumps(
            [
                {
                    "rank": i,
                    "token_bytes": base64.b64encode(t).decode(),
                    "token_str": t.decode("latin-1"),
                }
                for i, t in enumerate(tokens)
            ]
        )
    )
    return path


@pytest.fixture(scope="session")
def sentencepiece_model(tmp_path_factory, corpus_texts):
    import sentencepiece as spm

    prefix = tmp_path_factory.mktemp("spm") / "sp"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(line for t in corpus_texts for line in t.splitlines() if line),
        model_prefix=str(prefix),
        vocab_size=300,
        model_type="bpe",
        pad_id=3,
        minloglevel=2,
        num_threads=1,
    )
    return prefix.with_suffix(".model")
