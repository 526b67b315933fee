"""One trainer per run dir and per checkpoint dir: an exclusive flock held for the run's life.

Two trainers on one run dir cut each other's metrics.jsonl and prune each other's steps; two
run dirs sharing one checkpoint.dir mix their steps. The trainer's rank 0 takes
`<dir>/trainer.lock` of both dirs before it reads the run dir for the resume decision, and
holds them until it exits; the other ranks take none (rank 0 decides for the job, and they
write nothing before the process group, which waits for rank 0, is up). A second start is
refused with the holder's pid, host and start time, which the lock file records.

flock locks belong to the open file and end with the process that holds them, SIGKILL
included: a lock file left by a dead trainer is taken over at once, with a note naming it.
Across machines: on NFS the Linux client turns flock into an NFS byte-range lock (NLM or
NFSv4), exclusive across clients; a lock of a machine that died is released when the server
gives up its lease (NFSv4: ~90 s). Lustre makes flock cluster-wide only when mounted with
`-o flock`; with `-o localflock` it excludes only on one node, and with `noflock` flock fails:
the trainer then warns and runs without the lock. A lock file is deleted by its holder at
the end (after checking, like the next taker, that the path still names the locked file).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from ..checkpoint import CheckpointError

NAME = "trainer.lock"
_MAX_INFO = 4096


class Held:
    """A taken lock: release() unlocks and removes the file."""

    def __init__(self, path: Path, fd: int | None, created_dir: Path | None):
        self.path, self.fd, self.created_dir = path, fd, created_dir

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _same_file(self.fd, self.path):
                os.unlink(self.path)  # still ours: no one else can hold it
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        if self.created_dir is not None:
            try:
                self.created_dir.rmdir()  # made for the lock and still empty
            except OSError:
                pass


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, _MAX_INFO).decode() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(info: dict) -> str:
    if not info:
        return "a process that did not record itself"
    return (
        f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started "
        f"{info.get('started', '?')}"
    )


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # exists (another user's), or unknown: assume alive
    return True


def take(directory: Path, what: str) -> Held:
    """Takes <directory>/trainer.lock (making the directory if needed) or raises
    CheckpointError naming the holder. `what`: 'run dir' or 'checkpoint dir', for messages."""
    directory = Path(directory)
    path = directory / NAME
    created = None
    if not directory.exists():
        try:
            directory.mkdir(parents=True)
            created = directory
        except OSError as e:
            raise CheckpointError(
                f"cannot create the {what} {directory}: {e.strerror or e}; give a writable one"
            ) from None
    if not directory.is_dir():
        raise CheckpointError(f"the {what} {directory} is not a directory")
    for _ in range(10):  # a holder may remove the file between our open and our lock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise CheckpointError(_open_problem(path, what, e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                info = _holder(fd)
                os.close(fd)
                raise CheckpointError(_busy(path, what, info)) from None
            os.close(fd)  # flock unsupported here (Lustre noflock, some FUSE mounts)
            print(
                f"warning: cannot lock {path} ({e.strerror or e}): this filesystem does not "
                f"support flock, so a second trainer on this {what} would not be refused",
                file=sys.stderr,
                flush=True,
            )
            return Held(path, None, created)
        if not _same_file(fd, path):  # removed or replaced under us: take the new one
            os.close(fd)
            continue
        stale = _holder(fd)
        if stale.get("pid") is not None:
            print(
                f"note: {path} was left by {_describe(stale)}, which no longer holds it "
                "(it ended without removing it, e.g. killed): taken over",
                flush=True,
            )
        _record(fd)
        return Held(path, fd, created)
    raise CheckpointError(
        f"cannot take {path}: it keeps being replaced (another trainer starting on this {what}?)"
    )


def _record(fd: int) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(info) + "\n").encode()[:_MAX_INFO])


def _busy(path: Path, what: str, info: dict) -> str:
    here = info.get("host") == socket.gethostname()
    if here and info.get("pid") is not None and not _alive(info["pid"]):
        return (
            f"the {what} {path.parent} is locked ({path}), and the pid it names, "
            f"{info['pid']}, is not running: a process it started still holds the lock "
            f"(find it with `fuser {path}`); stop that process, then rerun"
        )
    if not here and info:
        return (
            f"the {what} {path.parent} is in use by another trainer ({_describe(info)}); "
            f"two trainers on one {what} would cut each other's metrics and checkpoints. "
            f"Wait for it to end or stop it; if host {info.get('host')} is down, its lock "
            f"is released when the file server drops that host's lease (NFSv4: about 90 "
            f"s); if it stays, check that nothing runs there and remove {path}"
        )
    return (
        f"the {what} {path.parent} is in use by another trainer ({_describe(info)}); two "
        f"trainers on one {what} would cut each other's metrics and checkpoints. Wait for "
        "it to end or stop it, or train in another run dir (hydra.run.dir=...)"
    )


def _open_problem(path: Path, what: str, e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return (
            f"{path} is a symbolic link; a lock file is a regular file the trainer makes "
            "itself: remove the link"
        )
    if e.errno == errno.EISDIR:
        return f"{path} is a directory, not a lock file: remove it"
    return (
        f"cannot write to the {what} {path.parent} ({e.strerror or e}: {path}); give a writable one"
    )
