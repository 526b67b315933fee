"""Tokens in, batches out: tokenizers, the embedded corpus, Megatron indexed data and datasets.

    tokenizers.py  the tokenizer a run trains with (byte-level by default)
    corpus.py      the embedded corpus: this Python's standard-library sources
    indexed.py     documents -> Megatron's .bin/.idx (IndexedDatasetBuilder), atomically
    prepare.py     files -> indexed data (`ufp4-prepare-data`, cli/prepare_data.py)
    errors.py      DataError, and TokenizerError (raised by tokenizers.py, tokenizer_json.py)
    datasets.py    Megatron's GPTDataset over indexed data, and each step's micro-batches

Imports Megatron's dataset code only inside functions; nothing here imports the trainer.
"""
