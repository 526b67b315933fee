"""The study's larger corpus: this Python's standard library plus installed packages' sources.

The embedded corpus (the standard library alone, ~12 MB) is seen 2.7 times by a 32.8M-token
study run, which puts the study in a memorisation regime (docs/results.md). With torch's
Python sources added (~41 MB for torch 2.11) a run sees each byte at most once. This script
stages the files (tests excluded, sorted, so one Python + torch version always gives the same
corpus) and tokenizes them with the project's own prepare_data (byte tokens):

    python3 gpu/pysrc_corpus.py --out /tmp/corpus/pysrc [--packages torch]

Writes <out>.bin/.idx (Megatron indexed data) and <out>.manifest.json (file count, bytes, a
sha256 over the staged bytes, the packages' versions) and prints the trainer's overrides.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import shutil
import sys
import sysconfig
from pathlib import Path

SKIP_DIRS = {
    "test",
    "tests",
    "testing",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "lib2to3",
    "ensurepip",
}


def sources(root: Path) -> list[Path]:
    """root's *.py files outside test and vendored dirs, sorted by relative path."""
    files = [p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output prefix (<out>.bin/.idx)")
    ap.add_argument(
        "--packages",
        default="torch",
        help="comma-separated importable packages added after the stdlib",
    )
    args = ap.parse_args(argv)
    roots = [("stdlib", Path(sysconfig.get_paths()["stdlib"]), sys.version.split()[0])]
    for name in filter(None, args.packages.split(",")):
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            raise SystemExit(
                f"pysrc_corpus: --packages {name}: not importable here ({e})"
            ) from None
        roots.append((name, Path(mod.__file__).parent, getattr(mod, "__version__", "?")))
    out = Path(args.out)
    stage = out.parent / f"{out.name}.src"
    shutil.rmtree(stage, ignore_errors=True)
    digest, n_files, n_bytes = hashlib.sha256(), 0, 0
    for name, root, _ in roots:
        for f in sources(root):
            dst = stage / name / f.relative_to(root)
            dst.parent.mkdir(parents=True, exist_ok=True)
            data = f.read_bytes()
            dst.write_bytes(data)
            digest.update(data)
            n_files, n_bytes = n_files + 1, n_bytes + len(data)
    from ufp4_megatron.data.prepare import main as prepare

    prepare(["--out", str(out), "--progress", "off", str(stage)])
    manifest = dict(
        roots=[dict(name=n, root=str(r), version=v) for n, r, v in roots],
        files=n_files,
        bytes=n_bytes,
        sha256=digest.hexdigest(),
    )
    Path(f"{out}.manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(
        f"pysrc corpus: {n_files} files, {n_bytes / 1e6:.1f} MB, sha256 {digest.hexdigest()[:16]}"
    )
    shutil.rmtree(stage)
    return 0


if __name__ == "__main__":
    sys.exit(main())
