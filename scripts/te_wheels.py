"""TransformerEngine 2.20.2 for an air-gapped CUDA 13 node, in pieces small enough to carry.

    python3 scripts/te_wheels.py [--out te-wheels] [--part-mb 45] [--arch 90] [--full]

Downloads (where there is network) what gpu/te_setup.sh installs on the node:
    transformer_engine-2.20.2-py3-none-any.whl             the Python package (1.2 MB)
    transformer_engine_cu13-2.20.2-...whl                  the core library (276 MB as published)
    transformer_engine_torch-2.20.2.tar.gz                 the PyTorch extension, source (0.5 MB)
    nvidia_cudnn_frontend-<v>-include.tar.gz               cudnn_frontend.h and the headers it
                                                           includes (0.4 MB), which that build
                                                           needs; the rest of that wheel is not
plus pydantic and its dependencies (TE's recipe module imports it; the GPU image lacks it),
copied from wheelhouse/ where `make wheelhouse PY=3.12` put them (the same versions the
trainer's node set-up installs), else downloaded. It writes them to --out (default te-wheels/,
ignored by git, beside wheelhouse/ so that the two travel separately), files larger than
--part-mb split into `<name>.partNN`, with SHA256SUMS (of every whole file) and PARTS (name,
number of parts, bytes) for the node to check after joining.

The core library's 263 MB of CUDA code are cubins for eight GPU generations (sm_75 ... sm_120);
an H200 runs the sm_90 ones (18 MB). Unless --full, the other generations' cubins are zeroed
in place (their fatbinary entry headers, and so every offset in the library, stay as they are;
the CUDA loader picks the entry of the device's architecture) and the wheel is written again
with its RECORD updated: 276 MB -> about 40 MB, one part instead of seven. Only a GPU shows that
such a library loads and runs: gpu/te_setup.sh checks it with a TE linear layer after
installing it, and --full gives the published wheel, split, for a node where it does not.

The downloads (about 290 MB) are kept in a cache outside --out (${XDG_CACHE_HOME:-~/.cache}/
ufp4-megatron/te-<version>/, or --downloads DIR), so that copying --out to the node carries
only what it installs; a second run reuses them.

pip cannot download the extension's sdist on a machine without CUDA PyTorch (its metadata step
imports torch.version.cuda); pip keeps the unpacked source with --no-clean, and it is packed
again here, every file and timestamp as published (content-identical, not byte-identical).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

VERSION = "2.20.2"
PIP_BINARY = [
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_27_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
]
FATBIN_MAGIC = 0xBA55ED50
CORE_LIB = "transformer_engine/wheel_lib/libtransformer_engine.so"


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", *args], capture_output=True, text=True
    )


PYDANTIC = (
    "pydantic-",
    "pydantic_core-",
    "annotated_types-",
    "typing_inspection-",
    "typing_extensions-",
)


def download(dest: Path, wheelhouse: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    have = [w for w in wheelhouse.glob("*.whl") if w.name.startswith(PYDANTIC)]
    if len({w.name.split("-")[0] for w in have}) == len(PYDANTIC):
        for w in have:
            shutil.copy2(w, dest / w.name)
    else:
        res = pip("--only-binary=:all:", *PIP_BINARY[2:], "-d", str(dest), "pydantic")
        if res.returncode:
            raise SystemExit(f"pip download pydantic failed:\n{res.stderr[-2000:]}")
    for req in (
        f"transformer-engine-cu13=={VERSION}",
        f"transformer-engine=={VERSION}",
        "nvidia-cudnn-frontend>=1.29.0",
    ):
        res = pip(*PIP_BINARY, "-d", str(dest), req)
        if res.returncode:
            raise SystemExit(f"pip download {req} failed:\n{res.stderr[-2000:]}")
    sdist = dest / f"transformer_engine_torch-{VERSION}.tar.gz"
    if sdist.exists():
        return
    res = pip(
        "--no-deps", "--no-binary=:all:", "-d", str(dest), f"transformer-engine-torch=={VERSION}"
    )
    if res.returncode == 0 and sdist.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:  # metadata needs CUDA torch: keep the source
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary=:all:",
                "--no-build-isolation",
                "--no-clean",
                "-d",
                tmp,
                f"transformer-engine-torch=={VERSION}",
            ],
            capture_output=True,
            env={**os.environ, "TMPDIR": tmp},
        )
        trees = [
            p
            for p in Path(tmp).glob("pip-download-*/transformer-engine-torch_*")
            if (p / "PKG-INFO").exists()
        ]
        if not trees:
            raise SystemExit("could not download the transformer-engine-torch source")
        name = f"transformer_engine_torch-{VERSION}"
        with tarfile.open(sdist, "w:gz") as tar:
            tar.add(trees[0], arcname=name, filter=_owner0)


def _owner0(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


# ----------------------------------------------------------------------------- fatbin pruning


def _section(elf: bytes | bytearray, name: str) -> tuple[int, int]:
    """(file offset, size) of an ELF64 section by name."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)

    stroff = sh(shstrndx)[4]
    for i in range(shnum):
        s = sh(i)
        end = elf.index(b"\0", stroff + s[0])
        if elf[stroff + s[0] : end].decode() == name:
            return s[4], s[5]
    raise SystemExit(f"no section {name} in the core library")


def prune_fatbins(lib: bytearray, keep_arch: int) -> dict[int, int]:
    """Zero the payload of every fatbinary entry whose architecture is not keep_arch; returns
    bytes kept and zeroed per architecture. Refuses a library where some fatbinary would be
    left without an entry for keep_arch."""
    off, size = _section(lib, ".nv_fatbin")
    pos, end_all, per_arch = off, off + size, {}
    while pos + 16 <= end_all:
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", lib, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # fatbinaries are 8-byte aligned inside the section
            continue
        entry, end = pos + hsize, pos + hsize + fsize
        entries = []
        while entry < end:
            _, _, ehsize, psize = struct.unpack_from("<HHIQ", lib, entry)
            if ehsize < 32 or entry + ehsize + psize > end:
                raise SystemExit(
                    f"a fatbinary entry at {entry:#x} is not one this tool reads: use --full"
                )
            (arch,) = struct.unpack_from("<I", lib, entry + 28)
            entries.append((arch, entry + ehsize, psize))
            entry += ehsize + psize
        if not any(a == keep_arch for a, _, _ in entries):
            raise SystemExit(f"a fatbinary at {pos:#x} has no sm_{keep_arch} entry: use --full")
        for arch, start, psize in entries:
            if arch != keep_arch:
                lib[start : start + psize] = bytes(psize)
            per_arch[arch] = per_arch.get(arch, 0) + psize
        pos = end
    return per_arch


def pruned_wheel(src: Path, dest: Path, keep_arch: int) -> None:
    """src wheel -> dest wheel (same name) with CORE_LIB pruned and RECORD updated."""
    with (
        zipfile.ZipFile(src) as zin,
        zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout,
    ):
        lib = bytearray(zin.read(CORE_LIB))
        per_arch = prune_fatbins(lib, keep_arch)
        digest = base64.urlsafe_b64encode(hashlib.sha256(lib).digest()).rstrip(b"=").decode()
        for info in zin.infolist():
            if info.filename == CORE_LIB:
                data = bytes(lib)
            elif info.filename.endswith(".dist-info/RECORD"):
                rows = []
                for row in zin.read(info).decode().splitlines():
                    if row.startswith(CORE_LIB + ","):
                        row = f"{CORE_LIB},sha256={digest},{len(lib)}"
                    rows.append(row)
                data = ("\n".join(rows) + "\n").encode()
            else:
                data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    kept = per_arch.get(keep_arch, 0)
    print(
        f"sm_{keep_arch} cubins kept: {kept / 1e6:.1f} MB; zeroed: "
        + ", ".join(
            f"sm_{a} {n / 1e6:.1f} MB" for a, n in sorted(per_arch.items()) if a != keep_arch
        )
    )


def headers(wheel: Path, dest: Path) -> None:
    """The wheel's include/ tree as a tar.gz (the build reads headers only)."""
    with (
        zipfile.ZipFile(wheel) as z,
        open(dest, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):  # the same bytes every time
        for info in z.infolist():
            if info.filename.startswith("include/") and not info.is_dir():
                data = z.read(info)
                ti = _owner0(tarfile.TarInfo(info.filename))
                ti.size, ti.mtime = len(data), 0
                tar.addfile(ti, io.BytesIO(data))


# ----------------------------------------------------------------------------- parts


def split(path: Path, part_bytes: int) -> list[Path]:
    if path.stat().st_size <= part_bytes:
        return [path]
    parts = []
    with open(path, "rb") as f:
        i = 0
        while chunk := f.read(part_bytes):
            part = path.with_name(f"{path.name}.part{i:02d}")
            part.write_bytes(chunk)
            parts.append(part)
            i += 1
    path.unlink()
    return parts


def downloads_dir() -> Path:
    """Where the downloads are kept between runs: a user cache, never inside --out (which is
    what travels to the node)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "ufp4-megatron" / f"te-{VERSION}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("te-wheels"))
    p.add_argument(
        "--wheelhouse",
        type=Path,
        default=Path("wheelhouse"),
        help="where make wheelhouse put the pydantic wheels (else downloaded)",
    )
    p.add_argument("--part-mb", type=float, default=45.0)
    p.add_argument("--arch", type=int, default=90, help="the GPU generation kept (sm_XX)")
    p.add_argument("--full", action="store_true", help="the published core wheel, unpruned")
    p.add_argument(
        "--downloads",
        type=Path,
        default=None,
        help="a folder holding the downloads: reused instead of downloading "
        f"(default: downloaded into {downloads_dir()})",
    )
    a = p.parse_args()
    src = a.downloads or downloads_dir()
    if a.downloads is None:
        download(src, a.wheelhouse)
    stale = a.out / ".downloads"  # where earlier versions of this script kept them
    if stale.is_dir():
        print(f"note: {stale} is no longer used; remove it before carrying {a.out}/")
    a.out.mkdir(parents=True, exist_ok=True)
    for old in a.out.glob("*"):
        if old.is_file():
            old.unlink()
    names = []
    for f in sorted(src.iterdir()):
        if not f.is_file() or not f.name.endswith((".whl", ".tar.gz")):
            continue
        target = a.out / f.name
        if f.name.startswith("transformer_engine_cu13-") and not a.full:
            pruned_wheel(f, target, a.arch)
        elif f.name.startswith("nvidia_cudnn_frontend-"):
            target = a.out / (f.name.split("-cp")[0] + "-include.tar.gz")
            headers(f, target)
        else:
            shutil.copy2(f, target)
        names.append(target.name)
    with open(a.out / "SHA256SUMS", "w") as sums:
        for name in names:
            sums.write(f"{hashlib.sha256((a.out / name).read_bytes()).hexdigest()}  {name}\n")
    part_bytes = int(a.part_mb * 1e6)
    with open(a.out / "PARTS", "w") as manifest:
        for name in names:
            size = (a.out / name).stat().st_size
            manifest.write(f"{name} {len(split(a.out / name, part_bytes))} {size}\n")
    total = 0
    for f in sorted(a.out.iterdir()):
        if f.is_file():
            total += f.stat().st_size
            print(f"{f.stat().st_size:>11,}  {f.name}")
    print(f"{total:>11,}  in {a.out}/ (carry to the node; bash gpu/te_setup.sh {a.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
