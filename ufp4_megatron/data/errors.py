"""The tokenizer's error type, in a module of its own: tokenizers.py builds the tokenizer
tokenizer_json.py defines and both raise it, so neither may hold it without an import circle."""


class TokenizerError(ValueError):
    """A tokenizer config that cannot be built; the message names the key to change."""
