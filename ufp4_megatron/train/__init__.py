"""Hydra-driven Megatron-Core pretraining: schema, config mapping and a straight-line loop.

Entry point: `python -m ufp4_megatron.train` (see docs/training.md). Importing this package
does not import Megatron; `loop.train(cfg, run_dir)` does.
"""
