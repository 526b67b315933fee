"""data.tokenizer: each type builds a megatron-core tokenizer from local files, with its own
EOD/pad ids; bad configs fail with one line naming the key and the fix.

    test_byte_tokenizer_keeps_the_fixed_ids           0-255 bytes, EOD 256, pad 257, 258 ids
    test_null_tokenizer_has_no_pad                    vocab_size, EOD vocab_size-1, no pad
    test_huggingface_tokenizer_json_file_or_directory  our BPE: EOD <|endoftext|> = 0, no pad
    test_huggingface_tokenizer_config_names_eos_and_pad  tokenizer_config.json is honoured
    test_huggingface_matches_the_tokenizers_library    ids equal Tokenizer.encode's
    test_tiktoken_and_sentencepiece_through_megatron  megatron-core's own classes, their ids
    test_bad_tokenizer_configs_name_the_fix           unknown type, missing files, hub names...
"""

from __future__ import annotations

import json
import shutil

import pytest

from ufp4_megatron.data.tokenizers import (
    TokenizerConfig,
    TokenizerError,
    build_tokenizer,
    pad_id,
)

TEXT = "def naïve(x):\n    return x ∑ 1  # the end\n"


def test_byte_tokenizer_keeps_the_fixed_ids():
    tok = build_tokenizer(TokenizerConfig())
    ids = tok.tokenize(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert (tok.vocab_size, tok.eod, pad_id(tok)) == (258, 256, 257)
    assert tok.detokenize(ids + [tok.eod]) == TEXT.rstrip()  # megatron's decoder strips


def test_null_tokenizer_has_no_pad():
    tok = build_tokenizer(TokenizerConfig(type="null-text", vocab_size=50257))
    assert (tok.vocab_size, tok.eod, pad_id(tok)) == (50257, 50256, None)
    tok = build_tokenizer(TokenizerConfig(type="null-text", vocab_size=32000, eod_id=2))
    assert tok.eod == 2


def test_huggingface_tokenizer_json_file_or_directory(bpe_json):
    for path in (bpe_json, bpe_json.parent):
        tok = build_tokenizer(TokenizerConfig(type="huggingface", path=str(path)))
        assert (tok.vocab_size, tok.eod, pad_id(tok)) == (512, 0, None)
        ids = tok.tokenize(TEXT)
        assert max(ids) < 512 and len(ids) < len(TEXT.encode())  # merges were learned
        assert tok.detokenize(ids) == TEXT


def test_huggingface_tokenizer_config_names_eos_and_pad(bpe_json, tmp_path):
    shutil.copy(bpe_json, tmp_path / "tokenizer.json")
    vocab = json.loads(bpe_json.read_text())["model"]["vocab"]
    eos, pad = "Ġthe", "Ġreturn"  # any two tokens of the vocabulary
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": eos}, "pad_token": pad})
    )
    tok = build_tokenizer(TokenizerConfig(type="huggingface", path=str(tmp_path)))
    assert (tok.eod, pad_id(tok)) == (vocab[eos], vocab[pad])
    tok = build_tokenizer(TokenizerConfig(type="huggingface", path=str(tmp_path), eod_id=7))
    assert tok.eod == 7


def test_huggingface_matches_the_tokenizers_library(bpe_json, corpus_texts):
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(bpe_json))
    tok = build_tokenizer(TokenizerConfig(type="huggingface", path=str(bpe_json)))
    for text in corpus_texts[:5]:
        assert tok.tokenize(text) == ref.encode(text).ids


def test_tiktoken_and_sentencepiece_through_megatron(tiktoken_ranks, sentencepiece_model):
    from megatron.core.tokenizers.text.libraries import SentencePieceTokenizer, TikTokenTokenizer

    tik = build_tokenizer(TokenizerConfig(type="tiktoken", path=str(tiktoken_ranks)))
    assert isinstance(tik._tokenizer, TikTokenTokenizer)
    # 1000 specials + 266 ranks; EOD and pad are Megatron's </s> and <pad>
    assert (tik.vocab_size, tik.eod, pad_id(tik)) == (1266, 2, 4)
    ids = tik.tokenize(" the thing")
    assert 1000 + 256 + 4 in ids and tik.detokenize(ids) == " the thing"  # " the" merged
    sp = build_tokenizer(TokenizerConfig(type="sentencepiece", path=str(sentencepiece_model)))
    assert isinstance(sp._tokenizer, SentencePieceTokenizer)
    assert (sp.vocab_size, sp.eod, pad_id(sp)) == (300, 2, 3)
    assert sp.detokenize(sp.tokenize("import os")) == "import os"


@pytest.mark.parametrize(
    "cfg, message",
    [
        (dict(type="gpt2"), "data.tokenizer.type='gpt2'; valid: byte-level, null-text"),
        (dict(type="null-text"), "needs data.tokenizer.vocab_size"),
        (dict(type="null-text", vocab_size=10, eod_id=10), "eod_id=10 is outside 0..9"),
        (dict(type="huggingface"), "needs data.tokenizer.path"),
        (dict(type="huggingface", path="gpt2"), "nothing is downloaded"),
        (dict(type="sentencepiece", path="/no/such.model"), "/no/such.model does not exist"),
        (dict(type="tiktoken", path="{ranks}", eod_id=3), "eod_id applies to types null-text and"),
    ],
)
def test_bad_tokenizer_configs_name_the_fix(cfg, message, tiktoken_ranks):
    cfg = {k: (v.format(ranks=tiktoken_ranks) if isinstance(v, str) else v) for k, v in cfg.items()}
    with pytest.raises(TokenizerError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build_tokenizer(TokenizerConfig(**cfg))


def test_huggingface_file_errors_name_the_file(tmp_path, bpe_json):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=f"{bad} is not a HuggingFace tokenizer.json"):
        build_tokenizer(TokenizerConfig(type="huggingface", path=str(bad)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no tokenizer.json there"):
        build_tokenizer(TokenizerConfig(type="huggingface", path=str(tmp_path / "empty")))
    # a BPE whose only special token is unknown to us: the EOD must be named
    data = json.loads(bpe_json.read_text())
    data["added_tokens"][0]["content"] = "<my_eod>"
    vocab = data["model"]["vocab"]
    vocab["<my_eod>"] = vocab.pop("<|endoftext|>")
    (tmp_path / "odd.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="names no end-of-document token"):
        build_tokenizer(TokenizerConfig(type="huggingface", path=str(tmp_path / "odd.json")))


def test_data_configs_compose_into_the_schema():
    from hydra import compose
    from omegaconf import OmegaConf

    from ufp4_megatron.train.overrides import training_configs

    with training_configs():
        byte = OmegaConf.to_object(compose("config")).data
        bpe = OmegaConf.to_object(compose("config", overrides=["data=embedded_bpe"])).data
        tik = OmegaConf.to_object(
            compose(
                "config", overrides=["data.tokenizer.type=tiktoken", "data.tokenizer.path=x.json"]
            )
        ).data
        null = OmegaConf.to_object(
            compose(
                "config",
                overrides=[  # a string, not Hydra's null
                    "data.tokenizer.type=null-text",
                    "data.tokenizer.vocab_size=50257",
                ],
            )
        ).data
    assert byte.tokenizer == TokenizerConfig() and byte.corpus_bpe_vocab == 0
    assert (bpe.corpus_bpe_vocab, bpe.tokenizer.type, bpe.tokenizer.path) == (
        8192,
        "huggingface",
        None,
    )
    assert isinstance(tik.tokenizer, TokenizerConfig) and tik.tokenizer.path == "x.json"
    assert (null.tokenizer.type, null.tokenizer.vocab_size) == ("null-text", 50257)
