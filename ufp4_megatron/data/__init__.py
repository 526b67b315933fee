"""Tokens in, batches out: tokenizers, the embedded corpus, Megatron indexed data and datasets.

    tokenizers.py  the tokenizer a run trains with (byte-level by default)
    corpus.py      the embedded corpus: this Python's standard-library sources
    indexed.py     documents -> Megatron's .bin/.idx (IndexedDatasetBuilder), atomically
    prepare.py     `python -m ufp4_megatron.prepare_data`: files -> indexed data
    datasets.py    Megatron's GPTDataset over indexed data, and each step's micro-batches

Imports Megatron's dataset code only inside functions; nothing here imports the trainer.
"""
