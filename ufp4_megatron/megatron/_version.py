"""The megatron-core version this glue is written against, checked at import.

The glue overrides `_forward_impl` of Megatron's parallel linears and rewrites its layer
specs; both are private seams that change between releases, so any other version is refused
with an error instead of failing later inside a forward pass.
"""
from __future__ import annotations

import importlib.metadata

MEGATRON_CORE_VERSION = "0.19.2"


def check_megatron_core() -> None:
    try:
        found = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"ufp4_megatron.megatron needs megatron-core=={MEGATRON_CORE_VERSION}, which is not "
            f"installed. Run `make install`, or `pip install --no-deps megatron-core=="
            f"{MEGATRON_CORE_VERSION}` (add --ignore-requires-python on Python 3.11).") from None
    if found.split("+")[0] != MEGATRON_CORE_VERSION:
        raise ImportError(
            f"ufp4_megatron.megatron is pinned to megatron-core=={MEGATRON_CORE_VERSION} (it "
            f"overrides private seams of ColumnParallelLinear/RowParallelLinear), but "
            f"megatron-core {found} is installed. Install megatron-core=={MEGATRON_CORE_VERSION}.")
