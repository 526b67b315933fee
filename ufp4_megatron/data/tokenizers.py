"""The tokenizer a run's data is made with, built by megatron-core from local files only.

    build_tokenizer(cfg)   a `megatron.core.tokenizers` text tokenizer for a TokenizerConfig
                           (train/schema.py; prepare_data's --tokenizer flags build the same)
    pad_id(tok)            its pad id, or None when it has none (nothing is masked as pad)

`type` is megatron-core's library name (so `data.tokenizer.type=null-text`, never Hydra's null):

| type | files | ids | EOD | pad |
| --- | --- | --- | --- | --- |
| byte-level (default) | none | 0-255 UTF-8 bytes | 256 | 257 |
| null-text | none: data made elsewhere (Megatron-LM's preprocess_data.py) | 0..vocab_size-1 | eod_id (vocab_size - 1) | none |
| huggingface | tokenizer.json, or a directory holding one | the file's | tokenizer_config.json's eos_token, or a known name | tokenizer_config.json's pad_token, or none |
| tiktoken | Megatron's ranks .json | special tokens first | `</s>` | `<pad>` |
| sentencepiece | a .model | the model's | its eos | its pad, or none |

Nothing is downloaded: a path that is not a local file is refused, naming the fix. Megatron's
GPTDataset reads `eod`, `pad` and `vocab_size` from the object returned here; a pad of -1 (as
Megatron's NullTokenizer uses) never equals a token, so no token is loss-masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import TokenizerError

TOKENIZER_TYPES = ("byte-level", "null-text", "huggingface", "tiktoken", "sentencepiece")
# The byte tokenizer's ids, fixed since the first release: 0-255 bytes, then EOD, then pad.
BYTE_EOD, BYTE_PAD = 256, 257
_PACKAGE = {"huggingface": "tokenizers", "tiktoken": "tiktoken", "sentencepiece": "sentencepiece"}


@dataclass(kw_only=True)
class TokenizerConfig:
    """`data.tokenizer` (train/schema.py's DataConfig) and prepare_data's --tokenizer flags."""

    type: str = "byte-level"  # megatron-core's library: byte-level | null-text |
    # huggingface | tiktoken | sentencepiece
    # huggingface: a tokenizer.json or its directory; tiktoken: a ranks .json (Megatron's
    # TikTokenizer format); sentencepiece: a .model file. Local files only.
    path: str | None = None
    vocab_size: int | None = None  # null: required; tiktoken: None = specials + the file's ranks
    eod_id: int | None = None  # null: None = vocab_size - 1; huggingface: None = its EOS
    tiktoken_pattern: str = "v2"  # Megatron's TikTokenizer split pattern: v1 or v2
    tiktoken_num_special_tokens: int = 1000  # ids below this are special (Megatron's default)


def build_tokenizer(cfg, *, key: str = "data.tokenizer"):
    """The megatron-core tokenizer that `cfg` (a TokenizerConfig) names.

    key: how the user spells the config in messages ("data.tokenizer" or "--tokenizer").
    """
    from megatron.core.tokenizers import MegatronTokenizer

    kind = cfg.type
    if kind not in TOKENIZER_TYPES:
        raise TokenizerError(f"{key}.type={kind!r}; valid: {', '.join(TOKENIZER_TYPES)}")
    _check_package(kind, key)
    metadata = {"library": kind}
    if kind == "byte-level":
        # Megatron's ByteLevelTokenizer decodes ids below its first special id as bytes: the
        # two specials take 256 and 257 and ids are set explicitly to the fixed EOD and pad.
        return MegatronTokenizer.from_pretrained(
            metadata_path=metadata,
            vocab_size=256,
            special_tokens=["<pad>", "<eod>"],
            _eos_id=BYTE_EOD,
            _pad_id=BYTE_PAD,
        )
    if kind == "null-text":
        if not cfg.vocab_size or cfg.vocab_size <= 0:
            raise TokenizerError(
                f"{key}.type=null-text needs {key}.vocab_size (the data's ids are "
                f"0..vocab_size-1), e.g. {key}.vocab_size=50257 for GPT-2 BPE"
            )
        eod = cfg.vocab_size - 1 if cfg.eod_id is None else cfg.eod_id
        if not 0 <= eod < cfg.vocab_size:
            raise TokenizerError(f"{key}.eod_id={eod} is outside 0..{cfg.vocab_size - 1}")
        return MegatronTokenizer.from_pretrained(
            metadata_path=metadata, vocab_size=cfg.vocab_size, eod_id=eod
        )
    path = _local_path(cfg, key)
    if kind == "huggingface":
        from .tokenizer_json import TokenizerJsonText

        return TokenizerJsonText(str(path), dict(metadata, model_type=None), eod_id=cfg.eod_id)
    if cfg.eod_id is not None:
        raise TokenizerError(
            f"{key}.eod_id applies to types null-text and huggingface; "
            f"{kind} takes its EOD from {path.name}"
        )
    kwargs = {}
    if kind == "tiktoken":
        kwargs = {
            "pattern": cfg.tiktoken_pattern,
            "num_special_tokens": cfg.tiktoken_num_special_tokens,
            "vocab_size": cfg.vocab_size or _tiktoken_vocab(path, cfg),
        }
    try:
        return MegatronTokenizer.from_pretrained(
            tokenizer_path=str(path), metadata_path=metadata, **kwargs
        )
    except (AssertionError, ValueError, OSError, RuntimeError) as e:
        raise TokenizerError(
            f"{key}.path={cfg.path}: not a {kind} tokenizer megatron-core "
            f"can load ({type(e).__name__}: {e})"
        ) from e


def pad_id(tok) -> int | None:
    """The pad id Megatron's GPTDataset masks, or None when the tokenizer has none."""
    try:
        p = tok.pad
    except (AttributeError, NotImplementedError):
        return None
    return None if p is None or p < 0 else int(p)


def describe(cfg) -> str:
    """One line naming a tokenizer config, for messages: 'huggingface data/x.json'."""
    if cfg.type == "null-text":
        return f"null-text, vocab_size={cfg.vocab_size}"
    return cfg.type + (f" {cfg.path}" if cfg.path else "")


def _tiktoken_vocab(path: Path, cfg) -> int:
    """Megatron's TikTokenizer wants vocab_size = special tokens + ranks it uses, exactly;
    by default all of the file's ranks, up to Megatron's 131072."""
    import json

    try:
        ranks = len(json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise TokenizerError(f"{path} is not a tiktoken ranks .json ({e})") from e
    return min(cfg.tiktoken_num_special_tokens + ranks, 2**17)


def _check_package(kind: str, key: str) -> None:
    import importlib.util

    pkg = _PACKAGE.get(kind)
    if pkg and importlib.util.find_spec(pkg) is None:
        raise TokenizerError(f"{key}.type={kind} needs the `{pkg}` package: pip install {pkg}")


def _local_path(cfg, key: str) -> Path:
    what = {
        "huggingface": "a tokenizer.json or the directory holding it",
        "tiktoken": "a tiktoken ranks .json (Megatron's TikTokenizer format)",
        "sentencepiece": "a sentencepiece .model file",
    }[cfg.type]
    if not cfg.path:
        raise TokenizerError(f"{key}.type={cfg.type} needs {key}.path: {what}")
    path = Path(cfg.path).expanduser()
    if not path.exists():
        hint = ""
        if "/" not in cfg.path and cfg.type == "huggingface":  # a hub name such as "gpt2"
            hint = (
                f"; nothing is downloaded: fetch it where there is network (e.g. "
                f"`hf download {cfg.path} tokenizer.json --local-dir tok/`) and set "
                f"{key}.path=tok/tokenizer.json"
            )
        raise TokenizerError(f"{key}.path={cfg.path} does not exist: give {what}{hint}")
    return path
