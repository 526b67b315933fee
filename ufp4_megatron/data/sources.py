"""Input files -> documents (lists of sentences) for prepare_data.

    collect(paths)                    the files to read: named files, and directories walked
                                      (sorted) for TEXT_SUFFIXES and JSONL_SUFFIXES
    read_documents(files, json_keys)  per document (where, {key: [sentence, ...]}), where =
                                      "file" or "file:line" for messages

A plain-text file is one document (so a single --json-keys key). A JSONL file
(.jsonl, .json) holds one JSON object per line, as Megatron-LM's preprocess_data.py reads it:
the document is the string under the key (or a list of strings: sentences); blank lines are
skipped; a line that is not JSON or lacks the key is refused, naming file and line.

Binary files (a NUL byte in the first 8 KiB) and files that are not UTF-8 are refused when
named on the command line and skipped, with a warning, when found in a directory: their
bytes would otherwise become U+FFFD tokens.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
JSONL_SUFFIXES = (".jsonl", ".json")
_SNIFF = 8192


class InputError(ValueError):
    """An input that cannot become documents; the message names the file (and line)."""


def collect(paths: list[str]) -> list[Path]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and f.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES
            )
            for f in found:
                why = _not_text(f)
                if why:
                    print(f"prepare_data: skipping {f}: {why}", file=sys.stderr)
                else:
                    files.append(f)
        elif p.is_file():
            why = _not_text(p) or ("empty (0 bytes)" if p.stat().st_size == 0 else None)
            if why:
                raise InputError(f"{p}: {why}; give text (UTF-8) or JSONL files")
            files.append(p)
        else:
            raise InputError(f"{p}: no such file or directory")
    return files


def read_documents(
    files: list[Path], json_keys: list[str], advance: Callable[[int], None] = lambda n: None
) -> Iterator[dict]:
    """(where, {key: sentences}) per document; advance(bytes) after each (progress bars)."""
    for f in files:
        if f.suffix in JSONL_SUFFIXES:
            yield from _jsonl(f, json_keys, advance)
            continue
        if len(json_keys) > 1:
            raise InputError(
                f"{f}: a plain-text file is one document and fills one dataset; "
                f"with several --json-keys give JSONL files only"
            )
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"{f}: not UTF-8 text (byte {e.start}); convert it, e.g. "
                f"`iconv -t utf-8`, or leave it out"
            ) from e
        advance(f.stat().st_size)
        yield str(f), {json_keys[0]: [text]}


def _jsonl(f: Path, keys: list[str], advance) -> Iterator[dict]:
    with open(f, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            advance(len(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{f}:{number}: not UTF-8 (byte {e.start} of the line)") from e
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(
                    f"{f}:{number}: not JSON ({e.msg}); JSONL holds one JSON object per line"
                ) from e
            if not isinstance(obj, dict):
                raise InputError(
                    f"{f}:{number}: a JSON {type(obj).__name__}, not an object "
                    f"with the key {keys[0]!r}"
                )
            doc = {}
            for key in keys:
                if key not in obj:
                    have = ", ".join(map(repr, list(obj)[:5])) or "none"
                    raise InputError(
                        f"{f}:{number}: no key {key!r} (keys: {have}); choose "
                        f"the text's key with --json-keys"
                    )
                value = obj[key]
                if isinstance(value, str):
                    doc[key] = [value]
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    doc[key] = value  # pre-split sentences, as preprocess_data.py reads them
                else:
                    raise InputError(
                        f"{f}:{number}: {key!r} is a {type(value).__name__}; "
                        f"expected a string or a list of strings"
                    )
            yield f"{f}:{number}", doc


def _not_text(f: Path) -> str | None:
    """Why `f` is not text (binary, not UTF-8), or None."""
    with open(f, "rb") as fh:
        head = fh.read(_SNIFF)
    if b"\0" in head:
        return "binary (a NUL byte in its first 8 KiB)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # not merely a character cut at the sniff's end
            return f"not UTF-8 text (byte {e.start})"
    return None
