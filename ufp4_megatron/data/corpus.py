"""The embedded corpus: this Python's standard-library sources, real text on every machine.

Files are read in sorted order (tests and vendored packages excluded) until `max_bytes`, so a
given Python version always yields the same corpus. Each file is one document.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Iterator

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
              "lib2to3", "ensurepip"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if not _SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_documents(max_bytes: int) -> Iterator[str]:
    """Yields whole files until their total size reaches max_bytes (at least one file)."""
    total = 0
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        total += len(text.encode("utf-8"))
        if total >= max_bytes:
            return
