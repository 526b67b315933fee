"""Argument checks shared by the entry points: one-line errors that say what to pass instead.

Booleans must be bool and integers int (numpy/torch integer scalars are accepted and
converted), never a bool where an int is meant: `True` would otherwise pass as 1, "yes" as
a truthy flag, 1.5 would reach a kernel's int64 argument.
"""

from __future__ import annotations

import numbers

import torch

# dtypes the QDQ computes from and returns to; float8/float4 are themselves quantized formats
# (returning QDQ values in them would round them a second time, silently)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SEED_LIMIT = 2**63  # seeds travel to kernels as int64 and key Philox as two uint32 words


def check_float_tensor(t, name: str, what: str) -> None:
    """t is a tensor of a dtype in FLOAT_DTYPES (TypeError otherwise)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(
            f"{what} takes float32/bfloat16/float16/float64 tensors; {name} is "
            f"{got}: convert it, e.g. {name}.float()"
        )


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_int(value, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """value as an int in [lo, hi) (either bound optional)."""
    if type(value) is not int and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral)
    ):
        raise ValueError(f"{name} must be an int{_range(lo, hi)}, got {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value >= hi):
        raise ValueError(f"{name} must be an int{_range(lo, hi)}, got {value}")
    return value


def check_seed(seed, name: str = "seed") -> int:
    return check_int(seed, name, 0, SEED_LIMIT)


def check_dim(dim, ndim: int) -> int:
    """dim normalized to [0, ndim), refusing what torch refuses (with our message)."""
    if type(dim) is not int and (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)):
        raise ValueError(f"dim must be an int, got {dim!r}")
    if ndim == 0:
        raise ValueError(
            "the tensor has no dimensions: quantize/RHT need at least one dim "
            "to block along (reshape it, e.g. x.reshape(1, -1))"
        )
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"dim {dim} is out of range for a {ndim}-D tensor: pass a dim in [{-ndim}, {ndim - 1}]"
        )
    return int(dim) % ndim


def _range(lo, hi) -> str:
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f" >= {lo}"
    hi_s = "2^63" if hi == SEED_LIMIT else str(hi)
    return f" in [{lo if lo is not None else '-inf'}, {hi_s})"
