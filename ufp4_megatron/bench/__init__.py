"""Benchmarks of the kernels, a quantized linear layer and (when the trainer exists) a step.

`python -m ufp4_megatron.bench --out docs/performance.md` runs them on the current CUDA
device and writes dated markdown tables with the command that produced them.
"""
