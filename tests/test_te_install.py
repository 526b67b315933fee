"""TransformerEngine for an offline node: scripts/te_wheels.py's fatbinary pruning and parts, and
gpu/te_setup.sh's staging of parts that arrive over several runs (before it installs anything).

    test_prune_keeps_one_architecture_and_every_offset   a synthetic ELF with two fatbinaries:
                                                         only the other architectures' payloads
                                                         are zeroed, headers and sizes kept
    test_prune_refuses_a_fatbinary_without_the_arch      or one it cannot read (the published
                                                         library would be needed)
    test_split_parts_join_to_the_file
    test_downloads_are_kept_outside_what_travels         the ~290 MB of downloads go to a user
                                                         cache, not into --out
    test_te_setup_stages_parts_until_all_are_there       exit 3 naming what is missing; a damaged
                                                         file stops it before pip (exit 1)
Whether a pruned library loads and runs on an H200 only the GPU shows (gpu/te_setup.sh checks it
with a TE linear layer).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("te_wheels", ROOT / "scripts" / "te_wheels.py")
te_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(te_wheels)


def _fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    """A fatbinary: header (magic, version, header size, size) and ELF entries whose header
    holds kind, version, header size, payload size and, at offset 28, the architecture."""
    body = b""
    for arch, payload in entries:
        head = struct.pack("<HHIQ", 2, 0x101, 64, len(payload)) + bytes(12)
        head += struct.pack("<I", arch) + bytes(64 - 32)
        assert len(head) == 64
        body += head + payload
    return struct.pack("<IHHQ", te_wheels.FATBIN_MAGIC, 1, 16, len(body)) + body


def _elf(sections: dict[str, bytes]) -> bytearray:
    """A minimal ELF64 holding `sections` (and the section-name table) after a 64-byte header."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in (*sections, ".shstrtab"))
    data, offsets = b"", {}
    for name, blob in (*sections.items(), (".shstrtab", names)):
        offsets[name] = 64 + len(data)
        data += blob + bytes(-len(blob) % 8)
    shoff = 64 + len(data)
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    struct.pack_into("<Q", header, 0x28, shoff)
    n = len(sections) + 2  # the null section, ours, .shstrtab
    struct.pack_into("<HHH", header, 0x3A, 64, n, n - 1)
    shdrs = bytes(64)
    for name, blob in (*sections.items(), (".shstrtab", names)):
        shdrs += struct.pack(
            "<IIQQQQIIQQ",
            names.index(name.encode() + b"\0"),
            1,
            0,
            0,
            offsets[name],
            len(blob),
            0,
            0,
            8,
            0,
        )
    return bytearray(header + data + shdrs)


def test_prune_keeps_one_architecture_and_every_offset():
    fat = _fatbin([(80, b"A" * 40), (90, b"B" * 24), (100, b"C" * 56)]) + _fatbin(
        [(90, b"D" * 8), (120, b"E" * 16)]
    )
    lib = _elf({".text": b"\x90" * 24, ".nv_fatbin": fat})
    before = bytes(lib)
    per_arch = te_wheels.prune_fatbins(lib, 90)
    assert per_arch == {80: 40, 90: 32, 100: 56, 120: 16}
    assert len(lib) == len(before)
    for kept in (b"B" * 24, b"D" * 8, b"\x90" * 24):
        assert kept in lib
    for zeroed in (b"A" * 40, b"C" * 56, b"E" * 16):
        assert zeroed not in lib
    changed = [i for i in range(len(lib)) if lib[i] != before[i]]
    assert len(changed) == 40 + 56 + 16  # the payloads, nothing else (headers, offsets)


def test_prune_refuses_a_fatbinary_without_the_arch():
    lib = _elf({".nv_fatbin": _fatbin([(80, b"A" * 8)])})
    with pytest.raises(SystemExit, match="no sm_90 entry: use --full"):
        te_wheels.prune_fatbins(lib, 90)
    bad = bytearray(_fatbin([(90, b"A" * 8)]))
    struct.pack_into("<I", bad, 16 + 4, 0)  # an entry header size of 0 would never advance
    with pytest.raises(SystemExit, match="is not one this tool reads: use --full"):
        te_wheels.prune_fatbins(_elf({".nv_fatbin": bytes(bad)}), 90)


def test_split_parts_join_to_the_file(tmp_path):
    f = tmp_path / "big.whl"
    f.write_bytes(os.urandom(2500))
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    parts = te_wheels.split(f, 1000)
    assert [p.name for p in parts] == ["big.whl.part00", "big.whl.part01", "big.whl.part02"]
    assert not f.exists()
    assert hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest() == digest


def _setup(tmp_path, carried: list[Path]):
    carry = tmp_path / "carry"
    if carry.exists():
        for old in carry.iterdir():
            old.unlink()
    carry.mkdir(exist_ok=True)
    for p in carried:
        (carry / p.name).write_bytes(p.read_bytes())
    env = {
        **os.environ,
        "TE_STAGE": str(tmp_path / "stage"),
        "TE_SITE": str(tmp_path / "site"),
        "PYTHON": "false",
    }  # anything past staging would fail loudly
    return subprocess.run(
        ["bash", "gpu/te_setup.sh", str(carry)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_downloads_are_kept_outside_what_travels(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert te_wheels.downloads_dir() == tmp_path / "cache" / "ufp4-megatron" / "te-2.20.2"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    where = te_wheels.downloads_dir()
    assert where.is_relative_to(tmp_path / "home" / ".cache")
    assert not where.is_relative_to(Path("te-wheels").resolve())


def test_te_setup_stages_parts_until_all_are_there(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    wheel = src / "core.whl"
    wheel.write_bytes(os.urandom(3000))
    small = src / "small.tar.gz"
    small.write_bytes(b"small")
    sums = "".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in (wheel, small)
    )
    (src / "SHA256SUMS").write_text(sums)
    (src / "PARTS").write_text("core.whl 3 3000\nsmall.tar.gz 1 5\n")
    parts = te_wheels.split(wheel, 1000)
    meta = [src / "SHA256SUMS", src / "PARTS"]
    first = _setup(tmp_path, [*meta, parts[0], small])  # one run carries the first part
    assert first.returncode == 3, first.stdout + first.stderr
    assert "still missing 2: core.whl.part01 core.whl.part02" in first.stdout
    second = _setup(tmp_path, [parts[1], parts[2]])  # the next run, the rest (meta staged)
    assert "joined core.whl from 3 parts" in second.stdout
    assert "staged and verified" in second.stdout
    assert second.returncode == 1  # it went on to install, where PYTHON=false stops it
    assert (tmp_path / "stage" / "core.whl").read_bytes() == b"".join(p.read_bytes() for p in parts)
    (tmp_path / "stage" / "small.tar.gz").write_bytes(b"smalL")  # damaged in transit
    third = _setup(tmp_path, [])
    assert third.returncode == 1 and "does not match SHA256SUMS" in third.stdout
