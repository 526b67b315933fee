import os

import torch

# Without a GPU the kernels run in Triton's CPU interpreter. The variable must be set before
# ufp4_megatron.kernels is imported: triton.jit reads it when it decorates a kernel.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
