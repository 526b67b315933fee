"""Megatron-Core glue for UFP4: parallel linears, MoE experts, spec rewrite, policy, CPU compat.

Glue only: every quantized GEMM is `ufp4_megatron.quant.ops`; nothing here does arithmetic.
Written against megatron-core 0.19.1 (Megatron-LM core_r0.19.0) and 0.19.2 (the wheel),
checked on import (_version.py).
"""

from ._version import MEGATRON_CORE_VERSION, check_megatron_core

check_megatron_core()

from .cpu_compat import enable_cpu_compat, seed_model_parallel  # noqa: E402
from .linear import UFP4ColumnParallelLinear, UFP4RowParallelLinear  # noqa: E402
from .policy import UFP4Binding, UFP4Policy  # noqa: E402
from .seeds import SRCaptureError, SRSeeds  # noqa: E402

__all__ = [
    "MEGATRON_CORE_VERSION",
    "enable_cpu_compat",
    "seed_model_parallel",
    "UFP4ColumnParallelLinear",
    "UFP4RowParallelLinear",
    "UFP4Binding",
    "UFP4Policy",
    "SRSeeds",
    "SRCaptureError",
]
