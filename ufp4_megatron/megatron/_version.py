"""The megatron-core versions this glue is written against, checked at import.

The glue overrides `_forward_impl` (and the extra-state hooks) of Megatron's parallel linears
and rewrites its layer specs; these are private seams that change between releases, so any
other version is refused with an error instead of failing later inside a forward pass.

Accepted: 0.19.1, the `megatron/` of Megatron-LM's branch `core_r0.19.0` (commit
f8837c04ef), which is what runs when `pretrain_gpt.py` is started from that checkout; and
0.19.2, the megatron-core wheel. Their code differs in five files, none of which holds a seam
the glue uses (in transformer_layer.py only the quantization-context helper changed);
`tests/megatron_lm/test_versions.py` checks this against a checkout. The version is read from
the `megatron.core` that is actually imported, not from pip's metadata: a Megatron-LM checkout
on sys.path shadows the installed wheel.
"""

from __future__ import annotations

SUPPORTED_MEGATRON_CORE = ("0.19.1", "0.19.2")
MEGATRON_CORE_VERSION = SUPPORTED_MEGATRON_CORE[-1]  # the wheel this package installs


def check_megatron_core() -> None:
    try:
        from megatron.core import package_info
    except ImportError as e:
        raise ImportError(
            f"ufp4_megatron.megatron needs megatron-core {' or '.join(SUPPORTED_MEGATRON_CORE)} "
            f"({e}). Run `make install`, or `pip install --no-deps megatron-core=="
            f"{MEGATRON_CORE_VERSION}` (add --ignore-requires-python on Python 3.11), or put "
            "a Megatron-LM core_r0.19.0 checkout on PYTHONPATH."
        ) from None
    check_version(package_info.__version__, where=package_info.__file__)


def check_version(found: str, where: str = "megatron.core") -> None:
    """Raises ImportError unless `found` (e.g. '0.19.1+f8837c04') is a supported version."""
    release = found.split("+")[0]
    if release not in SUPPORTED_MEGATRON_CORE:
        raise ImportError(
            f"ufp4_megatron.megatron supports megatron-core {' and '.join(SUPPORTED_MEGATRON_CORE)}"
            f" (it overrides private seams of ColumnParallelLinear/RowParallelLinear), but "
            f"megatron-core {found} is imported from {where}. Install megatron-core=="
            f"{MEGATRON_CORE_VERSION}, or run from a Megatron-LM checkout of branch "
            "core_r0.19.0 (commit f8837c04ef)."
        )
