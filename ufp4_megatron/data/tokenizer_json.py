"""A HuggingFace tokenizer.json as a megatron-core text tokenizer, without transformers.

megatron-core's own HuggingFaceTokenizer goes through `transformers.AutoTokenizer`, which is
not installed here nor on the GPU image, and resolves names on the Hub. A tokenizer.json is
the `tokenizers` library's own format (transformers' fast tokenizers wrap it), so this reads
it with `tokenizers.Tokenizer` and plugs it into megatron-core's `MegatronTokenizerText` at its
library seam (`_restore_model`): every property GPTDataset and prepare_data use (`tokenize`,
`detokenize`, `eod`, `pad`, `vocab_size`, `unique_identifiers`) is megatron-core's.

Text to ids is `Tokenizer.encode(text).ids`, special tokens included (a BOS the file's
post-processor adds is kept), as megatron-core's wrapper does by default. The EOD is, in order:
the `eod_id` given, tokenizer_config.json's `eos_token` beside the file, or the first of
_EOD_NAMES in the vocabulary. The pad is tokenizer_config.json's `pad_token` when it differs
from the EOD, else none (-1, Megatron's "no pad").
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron.core.tokenizers.text.libraries.abstract_tokenizer import (
    MegatronTokenizerTextAbstract,
)
from megatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText

from .errors import TokenizerError

# End-of-document names of common byte-level BPEs (GPT-2/our BPE, Llama/Mistral, Llama 3, Gemma).
_EOD_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
NO_PAD = -1


class TokenizerJsonText(MegatronTokenizerText):
    """megatron-core's text tokenizer over a tokenizer.json (see the module docstring)."""

    def _restore_model(self, **kwargs) -> TokenizerJson:
        return TokenizerJson(self.path, **kwargs)


class TokenizerJson(MegatronTokenizerTextAbstract):
    def __init__(self, path: str, eod_id: int | None = None):
        from tokenizers import Tokenizer

        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(
                f"{path}: no tokenizer.json there (a sentencepiece-only "
                f"directory needs data.tokenizer.type=sentencepiece)"
            )
        try:
            self.tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust parser's errors carry no file name
            raise TokenizerError(f"{file} is not a HuggingFace tokenizer.json ({e})") from e
        self.file = file
        self._vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self._inv = {i: t for t, i in self._vocab.items()}
        special = _special_tokens(file.with_name("tokenizer_config.json"))
        self._eod = self._find_eod(eod_id, special.get("eos_token"))
        pad = self._vocab.get(special.get("pad_token"), NO_PAD)
        self._pad = NO_PAD if pad == self._eod else pad
        self.space_sensitive = self.text_to_tokens("x y") != (
            self.text_to_tokens("x") + self.text_to_tokens("y")
        )

    def _find_eod(self, eod_id: int | None, eos_token: str | None) -> int:
        if eod_id is not None:
            if eod_id not in self._inv:
                raise TokenizerError(f"data.tokenizer.eod_id={eod_id} is not an id of {self.file}")
            return eod_id
        for name in ((eos_token,) if eos_token else ()) + _EOD_NAMES:
            if name in self._vocab:
                return self._vocab[name]
        raise TokenizerError(
            f"{self.file} names no end-of-document token (no tokenizer_config.json "
            f"eos_token, none of {', '.join(_EOD_NAMES)}): set "
            f"data.tokenizer.eod_id (--eod-id) to its id"
        )

    # text <-> ids
    def text_to_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def ids_to_text(self, ids, remove_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=remove_special_tokens)

    def text_to_tokens(self, text: str) -> list[str]:
        return self.tokenizer.encode(text).tokens

    def tokens_to_text(self, tokens: list[str]) -> str:
        return self.ids_to_text(self.tokens_to_ids(tokens))

    def tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self._vocab[t] for t in tokens]

    def ids_to_tokens(self, ids) -> list[str]:
        return [self._inv[i] for i in ids]

    def add_special_tokens(self, special_tokens) -> None:
        raise NotImplementedError("a tokenizer.json is read as it is; add tokens when training it")

    # what GPTDataset and the vocabulary checks read
    @property
    def vocab_size(self) -> int:
        return max(self._inv) + 1  # ids may have holes: the embedding needs max id + 1 rows

    @property
    def vocab(self) -> dict:
        return self._vocab

    @property
    def inv_vocab(self) -> dict:
        return self._inv

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def eos_id(self) -> int:
        return self._eod

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def bos_id(self):
        return None

    @property
    def unk_id(self):
        return None


def _special_tokens(config: Path) -> dict[str, str]:
    """eos_token / pad_token of a transformers tokenizer_config.json (str or AddedToken dict)."""
    if not config.is_file():
        return {}
    data = json.loads(config.read_text())
    out = {}
    for key in ("eos_token", "pad_token"):
        v = data.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[key] = v
    return out
