"""gpu/pysrc_corpus.py, the study's larger corpus (stdlib + packages' sources), on CPU: the
staged files become Megatron indexed data through prepare_data, byte for byte, with a
manifest that pins what went in; an unknown package is one line."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "gpu" / "pysrc_corpus.py"
sys.path.insert(0, str(SCRIPT.parent))
import pysrc_corpus  # noqa: E402


def _run(*args, cwd):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def test_corpus_is_stdlib_then_package_sources_without_tests(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    r = _run("--out", str(tmp_path / "py"), "--packages", "yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((tmp_path / "py.manifest.json").read_text())
    stdlib = pysrc_corpus.sources(Path(sysconfig.get_paths()["stdlib"]))
    pkg = pysrc_corpus.sources(Path(yaml.__file__).parent)
    assert [x["name"] for x in m["roots"]] == ["stdlib", "yaml"]
    assert m["files"] == len(stdlib) + len(pkg)
    assert m["bytes"] == sum(f.stat().st_size for f in stdlib + pkg)
    assert not any({"test", "tests"} & set(f.parts) for f in stdlib)
    ds = IndexedDataset(str(tmp_path / "py"))
    # one document per non-empty file (an empty __init__.py makes none), in the staged order
    assert len(ds) == sum(1 for f in stdlib + pkg if f.stat().st_size) <= m["files"]
    last = ds[len(ds) - 1]
    assert bytes(int(t) for t in last[:-1]) == pkg[-1].read_bytes()  # byte tokens, then EOD
    assert not (tmp_path / "py.src").exists()  # the staging copy is removed


def test_unknown_package_is_one_line(tmp_path):
    r = _run("--out", str(tmp_path / "py"), "--packages", "no_such_pkg_xyz", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "pysrc_corpus: --packages no_such_pkg_xyz: not importable here "
        "(No module named 'no_such_pkg_xyz')"
    ]
