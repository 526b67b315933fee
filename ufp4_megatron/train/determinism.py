"""`train.deterministic=true`: the same command gives the same bits, run after run and across
resumes, at any shape, at a cost in speed (docs/training.md).

    config_problem(cfg)          None, or one line: an option this mode cannot make
                                 deterministic (validate.check_config)
    environment_problem(env)     None, or one line: a determinism variable of the environment
                                 set to a value that is not deterministic (check_machine)
    scope(cfg)                   a context the whole run executes in; what it turns on below

Without it a GPU run differs from an identical run in the last bits from the first steps on:
FlashAttention's backward sums dQ with atomic adds, cuDNN's attention backward likewise,
PyTorch's embedding backward and `index_add` on CUDA accumulate in whichever order the
threads arrive. With it:
  - Megatron-Core's `TransformerConfig.deterministic_mode` (train/model.py): its embedding
    gathers with an index (a deterministic backward under the torch switch below), its MoE
    token combine uses `index_add`;
  - `torch.use_deterministic_algorithms(True)`: the deterministic kernels where PyTorch has two
    (FlashAttention-2's deterministic backward, the memory-efficient attention backward in one
    key split, `index_add`/`index_put` with sorting), cuDNN attention left out of SDPA's choice,
    and an error for any op without a deterministic kernel; cuDNN's deterministic
    convolutions, no benchmarking;
  - the environment Megatron-LM's --deterministic-mode sets, before the first cuBLAS handle,
    NCCL communicator and TransformerEngine attention exist: CUBLAS_WORKSPACE_CONFIG=:4096:8
    (cuBLAS is reproducible across runs only with a fixed workspace configuration, cuBLAS's
    "Results reproducibility"; PyTorch's deterministic mode refuses GEMMs without it),
    NCCL_ALGO=Ring (a fixed reduction order), NVTE_ALLOW_NONDETERMINISTIC_ALGO=0. A value the
    user set is kept when it is one Megatron-LM accepts as deterministic, else refused.
The plugin's own Triton kernels need nothing: each output element is written by one program
and none uses atomics, and stochastic rounding draws from a counter-based stream keyed by
position and step. Refused: Megatron's fused cross entropy (torch.compile; Megatron-LM
refuses it under --deterministic-mode too) and an SDPA kernel list holding only cuDNN (PyTorch
has no deterministic cuDNN attention backward).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from .schema import Config

# Megatron-LM's megatron/training/determinism.py (DETERMINISM_ENV_VAR_DEFAULTS and the values
# it accepts); that module is not importable here (megatron/training needs Python 3.12)
ENV_DEFAULTS = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}
ACCEPTED = {
    "CUBLAS_WORKSPACE_CONFIG": (":4096:8", ":16:8"),
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": ("0",),
}
NCCL_ALGOS = ("Ring", "CollnetDirect", "CollnetChain", "^NVLS")


def config_problem(cfg: Config) -> str | None:
    if not cfg.train.deterministic:
        return None
    m = cfg.model
    if m.cross_entropy_fusion:
        return (
            "train.deterministic=true with model.cross_entropy_fusion=true: the fused loss "
            "is a torch.compile kernel with no deterministic guarantee (Megatron-LM refuses "
            "it under --deterministic-mode too); set model.cross_entropy_fusion=false"
        )
    if m.attention_backend == "sdpa" and m.sdpa_kernels and set(m.sdpa_kernels) == {"cudnn"}:
        return (
            f"train.deterministic=true with model.sdpa_kernels={list(m.sdpa_kernels)}: "
            "cuDNN attention has no deterministic backward (PyTorch leaves it out under "
            "deterministic algorithms); add flash or efficient, or set "
            "model.sdpa_kernels=null"
        )
    return None


def environment_problem(env: Mapping[str, str]) -> str | None:
    for name, accepted in ACCEPTED.items():
        value = env.get(name)
        if value is not None and value not in accepted:
            return (
                f"train.deterministic=true but {name}={value!r} in the environment is not "
                f"a deterministic setting; unset it or use {' or '.join(accepted)}"
            )
    algo = env.get("NCCL_ALGO")
    if algo is not None:
        tokens = [t.strip() for t in algo.split(",") if t.strip()]
        if not tokens or any(t not in NCCL_ALGOS for t in tokens):
            return (
                f"train.deterministic=true but NCCL_ALGO={algo!r} in the environment may "
                f"reduce in a varying order (Tree's order is not fixed); unset it or use "
                f"{', '.join(NCCL_ALGOS)}"
            )
    return None


def describe() -> str:
    """One line for the run's log, naming what is in force."""
    env = " ".join(f"{k}={os.environ.get(k)}" for k in ENV_DEFAULTS)
    return f"deterministic: Megatron deterministic_mode, torch.use_deterministic_algorithms, {env}"


@contextlib.contextmanager
def scope(cfg: Config):
    """Everything `train.deterministic` turns on, for the block; restored on exit (the
    environment variables it added are removed, torch's switches set back)."""
    if not cfg.train.deterministic:
        yield
        return
    import torch

    added = [k for k in ENV_DEFAULTS if k not in os.environ]
    for k in added:
        os.environ[k] = ENV_DEFAULTS[k]
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]
        for k in added:
            os.environ.pop(k, None)
