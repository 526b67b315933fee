"""Offline data: the byte tokenizer round-trips; prepare_data writes Megatron indexed data
that Megatron's IndexedDataset reads back token for token; the embedded corpus is real text.

    test_tokenizer_round_trip
    test_prepare_data_writes_readable_indexed_data
    test_embedded_corpus_is_real_stdlib_text_in_a_fixed_order
"""
from ufp4_megatron.prepare_data import main as prepare_main
from ufp4_megatron.data.corpus import stdlib_documents
from ufp4_megatron.data.tokenizers import ByteTokenizer


def test_tokenizer_round_trip():
    tok = ByteTokenizer()
    ids = tok.tokenize("naïve café ∑")
    assert max(ids) < 256 and tok.detokenize(ids + [tok.eod]) == "naïve café ∑"


def test_prepare_data_writes_readable_indexed_data(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello")
    (tmp_path / "docs" / "b.md").write_text("world!")
    (tmp_path / "docs" / "skip.bin").write_bytes(b"\0")
    prepare_main([str(tmp_path / "docs"), "--out", str(tmp_path / "out")])
    ds = IndexedDataset(str(tmp_path / "out"))
    tok = ByteTokenizer()
    assert len(ds) == 2
    assert list(ds[0]) == tok.tokenize("hello") + [tok.eod]
    assert list(ds[1]) == tok.tokenize("world!") + [tok.eod]


def test_embedded_corpus_is_real_stdlib_text_in_a_fixed_order():
    docs = list(stdlib_documents(200_000))
    assert docs == list(stdlib_documents(200_000))
    assert sum(len(d) for d in docs) >= 200_000 and all("import" in d or "def " in d for d in docs)
