"""Reading a checkpoint never runs code from it: pickle may build only the plain data types a
checkpoint holds.

A dist_checkpointing step dir is pickles all the way down: torch DCP's `.metadata` is read
with a plain `pickle.load` (FileSystemReader.read_metadata), and every non-tensor record of a
`.distcp` file (Megatron's common state, each ShardedObject: RNG states, the LR schedule, the
SR-seed stream) with `torch.load(weights_only=False)` (DefaultLoadPlanner.load_bytes). A
pickle can name any importable callable (`os.system`) and call it while it loads, so a file
planted in a run dir would run as the trainer, `report.mechanism` or anything else that
resumes from it.

Both readers sit inside Megatron's `dist_checkpointing.load`, which builds its own reader, so
the restriction is applied where every unpickler looks a name up: CPython raises the audit
event `pickle.find_class` (PEP 578) for each global a pickle names, in the C and the Python
unpickler alike, before importing it. While `restricted()` is active, a hook refuses every
name outside ALLOWED, so loading aborts before anything outside the list is imported or
called. This is the check Python's documentation gives for "restricting globals"
(Unpickler.find_class), applied without replacing Megatron's or torch's readers.

ALLOWED is what torch's weights-only unpickler accepts for tensors (tensor rebuild functions,
dtypes, layouts, `torch.Size`, OrderedDict), the DCP metadata classes, the numpy array
pieces of numpy's RNG state, the ShardedTensor/ShardedObject records Megatron exchanges
between ranks during a load, and Megatron-Core's own list of checkpoint-safe globals
(megatron/core/safe_globals.py). Each builds data; none runs a command or opens a file.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading

import torch

# (module, name) pairs a checkpoint read may unpickle.
_BUILTINS = {
    ("builtins", n)
    for n in (
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "int",
        "float",
        "complex",
        "bool",
        "bytes",
        "bytearray",
        "str",
        "slice",
        "range",
    )
}
_TORCH = {
    ("torch", "Size"),
    ("torch", "device"),
    ("torch", "Generator"),
    ("torch._C", "Generator"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.serialization", "_get_layout"),
    ("torch.storage", "UntypedStorage"),
    ("torch.storage", "_load_from_bytes"),
}  # its nested torch.load is checked too
_TORCH |= {("torch", n) for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
_DCP = {
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
}
_DCP |= {("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
_DCP |= {
    ("torch.distributed.checkpoint.planner", n)
    for n in (
        "SavePlan",
        "LoadPlan",
        "WriteItem",
        "ReadItem",
        "WriteItemType",
        "LoadItemType",
        "TensorWriteData",
    )
}
_NUMPY = {
    (m, n)
    for m in ("numpy._core.multiarray", "numpy.core.multiarray")
    for n in ("_reconstruct", "scalar")
} | {("numpy", "ndarray"), ("numpy", "dtype")}
_OTHER = {
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),  # bytes in protocol 2
    ("megatron.core.dist_checkpointing.mapping", "ShardedTensor"),
    ("megatron.core.dist_checkpointing.mapping", "ShardedObject"),
    # TransformerEngine's recipe objects in a TE module's extra state, as Megatron-Core's
    # SafeUnpickler allows them (megatron/core/safe_globals.py)
    *(
        ("transformer_engine.common.recipe", n)
        for n in (
            "DelayedScaling",
            "Float8CurrentScaling",
            "Float8BlockScaling",
            "MXFP8BlockScaling",
            "NVFP4BlockScaling",
            "Format",
            "_FormatHelper",
            "MMParams",
            "QParams",
        )
    ),
    ("megatron.core.extensions.transformer_engine", "TEDelayedScaling"),
    ("megatron.core.safe_globals", "safe_load_from_bytes"),
}


def _megatron_safe_globals() -> set[tuple[str, str]]:
    """Megatron-Core's SAFE_GLOBALS (what it registers with torch's weights-only unpickler),
    as (module, name); numpy dtype classes among them."""
    try:
        from megatron.core.safe_globals import SAFE_GLOBALS
    except ImportError:  # the unit tests of this module run without Megatron too
        return set()
    return {(g.__module__, g.__qualname__) for g in SAFE_GLOBALS}


ALLOWED: frozenset[tuple[str, str]] = frozenset()  # filled on first use (imports Megatron)


class ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle in a checkpoint names something a checkpoint never holds."""


_depth = 0  # restricted() nesting, process-wide: a reader thread of DCP is covered too
_refused: list[str] = []  # "module.name" of each refusal since the outermost restricted()
_hook_installed = False
_lock = threading.Lock()


def _hook(event: str, args) -> None:
    if event != "pickle.find_class" or not _depth:
        return
    module, name = args
    if (module, name) in ALLOWED:
        return
    _refused.append(f"{module}.{name}")
    raise ForbiddenGlobal(
        f"refused to unpickle {module}.{name}: a checkpoint holds only tensors and plain data"
    )


def _install() -> None:
    global _hook_installed, ALLOWED
    with _lock:
        if not _hook_installed:
            ALLOWED = frozenset(
                _BUILTINS | _TORCH | _DCP | _NUMPY | _OTHER | _megatron_safe_globals()
            )
            sys.addaudithook(_hook)  # cannot be removed; inert outside restricted()
            _hook_installed = True


class Scope:
    """What restricted() yields: `refused` names the first global refused inside the block.
    Readers wrap the ForbiddenGlobal in their own errors (torch DCP's CheckpointException,
    with a traceback in its text), so the caller asks here to say it in one line."""

    def __init__(self, start: int):
        self._start = start

    @property
    def refused(self) -> str | None:
        new = _refused[self._start :]
        return new[0] if new else None


@contextlib.contextmanager
def restricted():
    """Unpickling inside this block may build only ALLOWED globals; anything else raises
    ForbiddenGlobal where pickle looks it up (before importing or calling it)."""
    global _depth
    _install()
    with _lock:
        if not _depth:
            _refused.clear()
        _depth += 1
        scope = Scope(len(_refused))
    try:
        yield scope
    finally:
        with _lock:
            _depth -= 1
