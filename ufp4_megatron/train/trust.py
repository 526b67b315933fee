"""Checkpoint trust: a checkpoint's files are the bytes that were saved, and reading them
never runs code from them. Checkpoint loads and saves (checkpoint.py,
checkpoint_megatron_lm.py) use both halves together.

Checksums.
A sha256 manifest of every file of a checkpoint, written with it and checked before a load.

A file's size says nothing about zeroed or flipped bytes inside it (a disk or filesystem
error, a bad copy): such a checkpoint loads and trains on with other numbers. The manifest
is Megatron-Core's own (dist_checkpointing/validation.py: `integrity.json`,
`{"algorithm": "sha256", "files": {name: hex digest}}`, so Megatron's
`load(..., verify_integrity=True)` reads it too), but computed in parallel: Megatron hashes
every file on rank 0 after the save; here each rank hashes the files it wrote itself (torch
DCP names them `__<rank>_<n>.distcp`), still in its page cache, and rank 0 hashes the rest
(`.metadata`, `metadata.json`) and writes the manifest. Verifying spreads the files over the
ranks the same way. One core hashes about 1.5 GB/s (sha256 with the SHA extensions; see
docs/training.md for the measured cost).

The manifest is written last, inside `step_N.saving/`, before the dir is renamed: a step dir
either has a complete manifest or (saved without one) none. It is not a signature: whoever
can write the checkpoint can rewrite it; the restricted unpickling (below) is
what keeps a planted file from running code.

Restricted unpickling.
Reading a checkpoint never runs code from it: pickle may build only the plain data types a
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
between ranks during a load, Megatron-Core's own list of checkpoint-safe globals
(megatron/core/safe_globals.py) and the TE modules' recipes in their extra state: TE's built-in
ones, and for the TransformerEngine route its CustomRecipe and the plugin's factory, which
unpickles as a lookup by name (te/factories.py). Each builds data; none runs a command or
opens a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import re
import sys
import threading
from pathlib import Path

import torch

from ..te.factories import CHECKPOINT_GLOBALS

MANIFEST = "integrity.json"  # Megatron-Core's INTEGRITY_FNAME
ALGORITHM = "sha256"
_CHUNK = 1 << 20
_WRITER = re.compile(r"__(\d+)_\d+\.distcp")  # the rank that wrote it (torch DCP's naming)
_MAX_MANIFEST = 64 << 20  # far above any real manifest (one line per file)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def share(names: list[str], rank: int, world: int) -> list[str]:
    """The files of `names` this rank hashes: those it wrote (when the writer rank exists in
    this world), the rest spread over the ranks in turn, so every file is read once."""
    mine = []
    for i, name in enumerate(sorted(names)):
        m = _WRITER.fullmatch(name)
        owner = int(m.group(1)) if m and int(m.group(1)) < world else i % world
        if owner == rank:
            mine.append(name)
    return mine


def checkpoint_files(step_dir: Path) -> list[str]:
    """The regular files of a step dir, the manifest excluded."""
    return sorted(
        p.name
        for p in Path(step_dir).iterdir()
        if p.is_file() and not p.is_symlink() and p.name != MANIFEST
    )


def hash_share(step_dir: Path, rank: int, world: int) -> dict[str, str]:
    step_dir = Path(step_dir)
    return {n: file_sha256(step_dir / n) for n in share(checkpoint_files(step_dir), rank, world)}


def manifest_text(digests: dict[str, str]) -> str:
    return (
        json.dumps({"algorithm": ALGORITHM, "files": dict(sorted(digests.items()))}, indent=2)
        + "\n"
    )


def read(step_dir: Path) -> dict[str, str] | None:
    """{file: digest} of a step dir's manifest; None when it has none (saved without);
    ValueError saying what is wrong with one that cannot be used."""
    path = Path(step_dir) / MANIFEST
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{MANIFEST} is not a regular file")
    if path.stat().st_size > _MAX_MANIFEST:
        raise ValueError(f"{MANIFEST} is {path.stat().st_size} bytes, not a manifest")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{MANIFEST} is not JSON ({e})") from None
    files = data.get("files") if isinstance(data, dict) else None
    if (
        (data.get("algorithm", ALGORITHM) if isinstance(data, dict) else None) != ALGORITHM
        or not isinstance(files, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ):
        raise ValueError(f"{MANIFEST} is not a {ALGORITHM} manifest")
    return files


def listing_problem(step_dir: Path, manifest: dict[str, str]) -> str | None:
    """Cheap (no file is read): a listed file missing, or a file the manifest does not list
    (Megatron reads a stray common.pt before the checkpoint's own common state)."""
    present = set(checkpoint_files(step_dir))
    for name in sorted(manifest):
        if "/" in name or name in ("", ".", "..") or name not in present:
            return f"{name} is missing (listed in {MANIFEST})"
    for name in sorted(present - set(manifest)):
        return f"holds {name}, which its {MANIFEST} does not list"
    return None


def verify_share(step_dir: Path, manifest: dict[str, str], rank: int, world: int) -> str | None:
    """The first of this rank's files whose digest differs from the manifest's, said in a
    clause; None when all match."""
    step_dir = Path(step_dir)
    for name in share(list(manifest), rank, world):
        try:
            got = file_sha256(step_dir / name)
        except OSError as e:
            return f"{name} is unreadable ({e.strerror or e})"
        if got != manifest[name]:
            return (
                f"{name} does not match its sha256 in {MANIFEST} (the file changed after "
                f"it was saved: {got[:12]}... != {manifest[name][:12]}...)"
            )
    return None


# --------------------------------------------------------------------- restricted unpickling


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
    # the TransformerEngine route's custom recipe and the plugin's factory, which pickles as
    # a lookup by name (te/factories.py)
    *CHECKPOINT_GLOBALS,
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
