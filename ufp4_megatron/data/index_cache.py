"""Megatron's dataset index cache, checked before it is read and built by one process at a time.

GPTDataset (and BlendedDataset) cache their document, sample and shuffle indices as `.npy`
files in `path_to_cache`, written in place with numpy.save after a `-description.txt`; a
later build that finds all four files memory-maps them. A kill or a full disk mid-write
leaves a cut `.npy`, and every later run then fails with "mmap length is greater than file
size" until someone deletes it; two jobs building the same cache at once can each read the
other's half-written file. Megatron also loads them with `allow_pickle=True` (through its
restricted unpickler, megatron/core/safe_globals.py), so a non-array file there is
unpickled.

`guard(path_to_cache)` wraps the build: it takes an exclusive flock on
`<path_to_cache>/.build.lock` (waiting for another job's build to finish), then checks every
cached `.npy` (a numpy array header, a plain numeric dtype, and exactly the file size the
header implies); a set with one bad file is removed, with a warning naming it, and Megatron
rebuilds it inside the lock. The files it reads after the build are complete (written inside
the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path

LOCK = ".build.lock"


def npy_problem(path: Path) -> str | None:
    """Why `path` is not a complete numeric .npy array, or None."""
    import numpy as np
    from numpy.lib import format as npy

    try:
        with open(path, "rb") as f:
            try:
                version = npy.read_magic(f)
            except ValueError:
                return "not a .npy array file"
            if version == (1, 0):
                shape, _, dtype = npy.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = npy.read_array_header_2_0(f)
            else:
                return f"a .npy file of unknown version {version}"
            offset = f.tell()
    except (OSError, ValueError, SyntaxError) as e:
        return f"its .npy header is unreadable ({type(e).__name__}: {e})"
    if dtype.hasobject:
        return "it holds Python objects, not numbers (not written by Megatron)"
    size = os.path.getsize(path)
    want = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != want:
        return f"it is cut short ({size} of {want} bytes; a run killed while writing it)"
    return None


def repair(path_to_cache: Path) -> list[str]:
    """Removes every cache set (files sharing `<hash>-<Class>-<split>-`) with a bad .npy;
    returns one line per removed set."""
    d = Path(path_to_cache)
    if not d.is_dir():
        return []
    said = []
    for f in sorted(d.glob("*.npy")):
        if not f.exists():  # removed with an earlier set
            continue
        problem = "it is a symbolic link" if f.is_symlink() else npy_problem(f)
        if problem is None:
            continue
        stem = f.name.rsplit("-", 1)[0] + "-"  # <hash>-<Class>-<split>-
        for g in d.glob(f"{stem}*"):
            g.unlink(missing_ok=True)
        said.append(f"{f} {problem}: removed its index set; Megatron builds it again")
    return said


@contextlib.contextmanager
def guard(path_to_cache: Path, build_here: bool = True):
    """Around BlendedMegatronDatasetBuilder.build(): one builder at a time per cache dir, and
    no bad cache file read. `build_here`: False on ranks that only read what rank 0 built
    (Megatron builds on rank 0 first, then on the others after a barrier)."""
    if not build_here:
        yield
        return
    d = Path(path_to_cache)
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(
                    f"note: another job is building Megatron's index cache in {d}: waiting for it",
                    file=sys.stderr,
                    flush=True,
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock: build unguarded, as Megatron does
        for line in repair(d):
            print(f"WARNING: {line}", file=sys.stderr, flush=True)
        yield
    finally:
        os.close(fd)
