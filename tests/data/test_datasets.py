"""build_datasets: Megatron's GPTDataset over checked data; the tokenizer's own pad (or none)
is what gets masked; the index cache follows the files; bad data is refused at start.

    test_no_pad_tokenizer_masks_nothing          null tokenizer: id 257 is trained on, kept
    test_byte_tokenizer_masks_its_pad            the byte pad 257 is masked (and mapped to 0)
    test_index_cache_follows_rewritten_data      prepare_data again on a prefix: a new index
    test_truncated_or_corrupt_files_name_the_file  .bin shorter/longer than the .idx; bad .idx
    test_vocab_checks_name_both_numbers_and_the_fix  model < tokenizer, data > tokenizer
    test_token_range_is_cached_by_file_identity  one pass per file version
    test_embedded_corpus_is_real_stdlib_text_in_a_fixed_order
    test_embedded_bpe_is_deterministic_and_race_safe   two jobs at once, one identical result
    test_embedded_bpe_config_errors               corpus_bpe_vocab with prefixes / a path
    test_what_the_data_refuses_is_a_data_error    a glob, a directory, an empty split, a run
                                                  whose index would not fit in memory, a
                                                  tokenizer dir without tokenizer.json: each a
                                                  DataError (one `error:` line, exit 2)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ufp4_megatron.data import checks
from ufp4_megatron.data.corpus import stdlib_documents
from ufp4_megatron.data.datasets import build_datasets
from ufp4_megatron.data.indexed import write_indexed
from ufp4_megatron.data.tokenizers import TokenizerConfig, build_tokenizer
from ufp4_megatron.train.schema import DataConfig

SEQ = 16


def _data(tmp_path, prefix=None, **kw) -> DataConfig:
    return DataConfig(
        prefixes=[str(prefix)] if prefix else [],
        split="50,50,0",
        cache_dir=str(tmp_path / "cache"),
        **kw,
    )


def _build(data, vocab_size=384, n=8):
    return build_datasets(data, seed=1, seq_len=SEQ, vocab_size=vocab_size, n_train=n, n_valid=n)


def _null_data(tmp_path, docs, vocab=50257, name="d"):
    tok = build_tokenizer(TokenizerConfig(type="null-text", vocab_size=vocab))
    write_indexed(([" ".join(map(str, d))] for d in docs), tmp_path / name, tok)
    return tmp_path / name


def test_no_pad_tokenizer_masks_nothing(tmp_path):
    # GPT-2-BPE-like data where id 257 is an ordinary token (it was masked and zeroed before)
    prefix = _null_data(tmp_path, [[257, 1000, 257, 5] * 10] * 8)
    data = _data(tmp_path, prefix, tokenizer=TokenizerConfig(type="null-text", vocab_size=50257))
    train, _ = _build(data, vocab_size=50304)
    for i in range(len(train)):
        s = train[i]
        assert bool(s["loss_mask"].all()) and (s["tokens"] == 257).sum() > 0


def test_byte_tokenizer_masks_its_pad(tmp_path):
    prefix = tmp_path / "pad"
    write_indexed([["x" * 40]] * 8, prefix, build_tokenizer(TokenizerConfig()))
    raw = bytearray(Path(f"{prefix}.bin").read_bytes())
    for pos in range(0, len(raw), 14):  # every 7th token becomes the pad id (uint16)
        raw[pos : pos + 2] = (257).to_bytes(2, "little")
    Path(f"{prefix}.bin").write_bytes(bytes(raw))
    train, _ = _build(_data(tmp_path, prefix))
    for i in range(len(train)):
        s = train[i]
        assert (s["tokens"] != 257).all() and (s["labels"] != 257).all()  # mapped to 0
        assert 0 < s["loss_mask"].sum() < SEQ  # the pad positions, and only they, masked


def test_index_cache_follows_rewritten_data(tmp_path):
    tok = build_tokenizer(TokenizerConfig())
    prefix = tmp_path / "p"
    write_indexed(([f"{i:03d}" * (5 + i)] for i in range(40)), prefix, tok)
    first = _build(_data(tmp_path, prefix))[0]
    # rewrite the prefix with other documents (as prepare_data again would): same number of
    # documents, other lengths; a stale index would cut samples at the old boundaries
    write_indexed(([chr(65 + i % 26) * (40 - i)] for i in range(40)), prefix, tok)
    again = _build(_data(tmp_path, prefix))[0]
    fresh = _build(_data(tmp_path / "fresh", prefix))[0]
    assert len(list((tmp_path / "cache" / "index").glob("*/"))) >= 2
    for i in range(len(fresh)):
        assert torch.equal(again[i]["tokens"], fresh[i]["tokens"])
    assert any(not torch.equal(first[i]["tokens"], fresh[i]["tokens"]) for i in range(len(fresh)))


def test_truncated_or_corrupt_files_name_the_file(tmp_path):
    prefix = tmp_path / "t"
    write_indexed([["hello world"]] * 20, prefix, build_tokenizer(TokenizerConfig()))
    bin_path = Path(f"{prefix}.bin")
    whole = bin_path.read_bytes()
    bin_path.write_bytes(whole[:100])
    with pytest.raises(
        checks.DataError,
        match=rf"{prefix}\.bin is truncated: 100 bytes, "
        rf"{prefix}\.idx expects {len(whole)}",
    ):
        _build(_data(tmp_path, prefix))
    bin_path.write_bytes(whole + b"\0\0")
    with pytest.raises(checks.DataError, match="longer than its index says"):
        _build(_data(tmp_path, prefix))
    bin_path.write_bytes(whole)
    Path(f"{prefix}.idx").write_bytes(Path(f"{prefix}.idx").read_bytes()[:20])
    with pytest.raises(checks.DataError, match=rf"{prefix}\.idx is not a readable Megatron index"):
        _build(_data(tmp_path, prefix))
    with pytest.raises(checks.DataError, match=r"nope\.idx not found; write it with"):
        _build(_data(tmp_path, tmp_path / "nope"))


def test_vocab_checks_name_both_numbers_and_the_fix(tmp_path):
    prefix = _null_data(tmp_path, [[50256, 7, 300] * 20] * 4)
    with pytest.raises(
        checks.DataError,
        match=(
            rf"{prefix}\.bin holds token id 50256, but the tokenizer \(data\.tokenizer: byte-level\) "
            r"has 258 ids: the data was made with another tokenizer"
        ),
    ):
        _build(_data(tmp_path, prefix))  # Megatron-LM GPT-2 data with the default tokenizer
    null = TokenizerConfig(type="null-text", vocab_size=50257)
    with pytest.raises(
        checks.DataError,
        match=(
            r"model\.vocab_size=384 is smaller than the tokenizer's 50257 ids \(data\.tokenizer: "
            r"null-text, vocab_size=50257\); set model\.vocab_size=50304"
        ),
    ):
        _build(_data(tmp_path, prefix, tokenizer=null))
    _build(_data(tmp_path, prefix, tokenizer=null), vocab_size=50304)  # the fix works
    with pytest.raises(
        checks.DataError, match="model.vocab_size=384 is smaller than the tokenizer's 8192 ids"
    ):
        _build(
            _data(
                tmp_path,
                corpus_bpe_vocab=8192,  # refused before training anything
                tokenizer=TokenizerConfig(type="huggingface"),
            )
        )
    assert not list((tmp_path / "cache").glob("stdlib-bpe*"))


def test_token_range_is_cached_by_file_identity(tmp_path):
    prefix = _null_data(tmp_path, [[3, 9, 4]] * 5, vocab=100)
    index = tmp_path / "index"
    assert checks.token_range(str(prefix), index) == (3, 99)  # 99: the EOD
    cached = list(index.glob("tokens-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["max_id"] == 99
    _null_data(tmp_path, [[1, 2]] * 5, vocab=50)  # rewritten: another identity, another pass
    assert checks.token_range(str(prefix), index) == (1, 49)
    assert len(list(index.glob("tokens-*.json"))) == 2


def test_embedded_corpus_is_real_stdlib_text_in_a_fixed_order():
    docs = list(stdlib_documents(200_000))
    assert docs == list(stdlib_documents(200_000))
    assert sum(len(d) for d in docs) >= 200_000 and all("import" in d or "def " in d for d in docs)


_BPE_JOB = """
import sys
from ufp4_megatron.data.datasets import build_datasets
from ufp4_megatron.train.schema import DataConfig, TokenizerConfig
data = DataConfig(cache_dir=sys.argv[1], corpus_max_bytes=400_000, corpus_bpe_vocab=600,
                  split="50,50,0", tokenizer=TokenizerConfig(type="huggingface"))
train, _ = build_datasets(data, seed=1, seq_len=16, vocab_size=640, n_train=4, n_valid=4)
print(train[0]["tokens"].tolist())
"""


def test_embedded_bpe_is_deterministic_and_race_safe(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", _BPE_JOB, str(tmp_path / "shared")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [j.communicate(timeout=300) for j in jobs]
    assert all(j.returncode == 0 for j in jobs), outs[0][1][-2000:]
    solo = DataConfig(
        cache_dir=str(tmp_path / "solo"),
        corpus_max_bytes=400_000,
        corpus_bpe_vocab=600,
        split="50,50,0",
        tokenizer=TokenizerConfig(type="huggingface"),
    )
    first = build_datasets(solo, seed=1, seq_len=16, vocab_size=640, n_train=4, n_valid=4)[0][0]
    assert outs[0][0] == outs[1][0] == f"{first['tokens'].tolist()}\n"  # the same everywhere
    names = sorted(p.name for p in (tmp_path / "shared").iterdir())
    assert names == [
        "index",
        "stdlib-bpe600-400000.bin",
        "stdlib-bpe600-400000.idx",
        "stdlib-bpe600-400000.tokenizer.json",
    ]  # no temporary file left
    for name in names[1:]:
        assert (tmp_path / "shared" / name).read_bytes() == (tmp_path / "solo" / name).read_bytes()


def test_embedded_bpe_config_errors(tmp_path):
    hf = TokenizerConfig(type="huggingface")
    with pytest.raises(
        checks.DataError,
        match="data.corpus_bpe_vocab=600 trains a BPE on the "
        "embedded corpus, but data.prefixes is set",
    ):
        _build(_data(tmp_path, tmp_path / "x", corpus_bpe_vocab=600, tokenizer=hf), 640)
    with pytest.raises(checks.DataError, match="brings its own tokenizer"):
        _build(_data(tmp_path, corpus_bpe_vocab=600, tokenizer=TokenizerConfig()), 640)
    with pytest.raises(checks.DataError, match="the corpus is tokenized with bytes or its own BPE"):
        _build(_data(tmp_path, tokenizer=replace(hf, path=str(tmp_path))), 640)


def test_valid_seed_fixes_the_validation_samples_across_train_seeds(tmp_path):
    """data.valid_seed: the validation split is shuffled with it, not with train.seed, so runs
    of every seed validate on the same samples (a study's fixed validation set); without it
    each seed draws its own, and the training samples follow train.seed either way."""
    tok = build_tokenizer(TokenizerConfig())
    prefix = tmp_path / "v"
    write_indexed(([f"doc {i:03d} " * (3 + i % 7)] for i in range(60)), prefix, tok)

    def build(seed, valid_seed):
        data = _data(tmp_path, prefix, valid_seed=valid_seed)
        train, valid = build_datasets(
            data, seed=seed, seq_len=SEQ, vocab_size=384, n_train=8, n_valid=8
        )
        return (
            [train[i]["tokens"].tolist() for i in range(8)],
            [valid[i]["tokens"].tolist() for i in range(8)],
        )

    (t1, v1), (t2, v2) = build(1, 99), build(2, 99)
    assert v1 == v2 and t1 != t2
    (_, w1), (_, w2) = build(1, None), build(2, None)
    assert w1 != w2
    assert build(99, None)[1] == v1  # valid_seed 99 draws what train.seed 99 would


def test_what_the_data_refuses_is_a_data_error(tmp_path):
    prefix = tmp_path / "d" / "t"
    prefix.parent.mkdir()
    write_indexed([["hello world " * 40]] * 30, prefix, build_tokenizer(TokenizerConfig()))
    with pytest.raises(
        checks.DataError,
        match=r"d/\* is a pattern, and prefixes are not "
        r"expanded: list each file prefix",
    ):
        _build(_data(tmp_path, tmp_path / "d" / "*"))
    with pytest.raises(checks.DataError, match=r"d is a directory: give the prefix of the files"):
        _build(_data(tmp_path, tmp_path / "d"))
    one_doc = tmp_path / "one"
    write_indexed([["a single document"]], one_doc, build_tokenizer(TokenizerConfig()))
    with pytest.raises(
        checks.DataError,
        match=r"data.split='50,50,0' leaves the train split of "
        r".*one \(1 documents\) empty",
    ):
        _build(_data(tmp_path, one_doc))
    # 2**31 - 1 steps of 8 sequences of 16 tokens from 15 kB: terabytes of Megatron's index
    with pytest.raises(
        checks.DataError,
        match=r"17,179,869,176 training samples \(train.steps x "
        r"train.global_batch\) of 16 tokens .* would take "
        r"about [\d,]+ GiB of memory, more than this "
        r"machine's",
    ):
        _build(_data(tmp_path, prefix), n=(2**31 - 1) * 8)
    no_json = tmp_path / "tokdir"
    no_json.mkdir()
    hf = TokenizerConfig(type="huggingface", path=str(no_json))
    with pytest.raises(checks.DataError, match="no tokenizer.json there"):
        _build(_data(tmp_path, prefix, tokenizer=hf))
