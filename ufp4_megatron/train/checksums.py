"""A sha256 manifest of every file of a checkpoint, written with it and checked before a load.

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
can write the checkpoint can rewrite it; the restricted unpickling (train/unpickling.py) is
what keeps a planted file from running code.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

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
