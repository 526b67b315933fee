"""The data layer's error types, in a module of their own: tokenizers.py builds the tokenizer
tokenizer_json.py defines and both raise TokenizerError, so neither may hold it without an
import circle; checks.py, datasets.py and the trainer share DataError."""


class DataError(ValueError):
    """Data that cannot be trained on as configured; the message says what to change. The
    trainer prints it as one `error:` line and exits 2."""


class TokenizerError(DataError):
    """A tokenizer config that cannot be built; the message names the key to change."""
