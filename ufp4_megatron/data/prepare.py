"""Text files -> Megatron indexed data (.bin/.idx) with the offline byte tokenizer.

    python -m ufp4_megatron.prepare_data --out data/mytext file1.txt dir2/ ...
    python -m ufp4_megatron.prepare_data --out data/stdlib           # the embedded corpus

Each file is one document followed by EOD. Directories are walked for *.txt, *.md, *.rst and
*.py, in sorted order. Train with `data.prefixes=[data/mytext]`.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterable

from .corpus import stdlib_documents
from .indexed import write_indexed

_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")


def _read_inputs(paths: list[str]) -> Iterable[str]:
    for p in map(Path, paths):
        files = sorted(f for f in p.rglob("*") if f.suffix in _TEXT_SUFFIXES) if p.is_dir() else [p]
        for f in files:
            yield f.read_text(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="ufp4-prepare-data",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help="text files or dirs; none: the embedded corpus")
    ap.add_argument("--out", required=True, help="output prefix (writes <out>.bin and <out>.idx)")
    ap.add_argument("--max-bytes", type=int, default=8_000_000, help="embedded corpus size")
    args = ap.parse_args(argv)
    docs = _read_inputs(args.inputs) if args.inputs else stdlib_documents(args.max_bytes)
    n_docs, n_tokens = write_indexed(docs, args.out)
    print(f"wrote {args.out}.bin/.idx: {n_docs} documents, {n_tokens} tokens")
