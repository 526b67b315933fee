"""Whether TransformerEngine >= 2.19 is installed and loads here (the trainer asks before it
builds a TE model; Megatron-LM finds out at its first FP4 layer)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from .checks import TE_MIN_VERSION, check_te_version


def te_version() -> str | None:
    """The installed transformer_engine's version, None when it is not installed."""
    if importlib.util.find_spec("transformer_engine") is None:
        return None
    try:
        return importlib.metadata.version("transformer_engine")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path
        import transformer_engine

        return getattr(transformer_engine, "__version__", "0")


def check_installed() -> str:
    """The version of a TransformerEngine that is recent enough and loads (its C++ extension
    and CUDA library); ValueError, one line, otherwise."""
    need = ".".join(map(str, TE_MIN_VERSION))
    version = te_version()
    if version is None:
        raise ValueError(f"needs TransformerEngine >= {need}, which is not installed here")
    check_te_version(version)
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as e:  # a load failure of TE's libraries, whatever its type
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(
            f"TransformerEngine {version} does not load here ({type(e).__name__}: {first})"
        ) from None
    return version
