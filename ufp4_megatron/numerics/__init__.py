"""The numerics spec in plain PyTorch: grids, block scaling, rounding, Philox, Hadamard.

Imports nothing from Megatron, kernels or autograd code; every kernel is tested against it.
"""
