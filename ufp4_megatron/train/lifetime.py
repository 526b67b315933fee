"""Helper processes of the trainer end with it, SIGKILL included.

Megatron's checkpoint writer reports through a multiprocessing Manager, a Python process it
spawns at the first save (train/checkpoint.py, start_checkpoint_writer_queue). A trainer
that is SIGKILLed (the OOM killer, `kill -9`, a scheduler's hard stop) runs no cleanup, so the
Manager, idle and ~270 MB, would live on for hours: holding memory on a shared node, and
beside a resumed run changing its CPU threading. Megatron starts it without an initializer,
and a spawned child does not import a `pkg.__main__` entry module again, so no code of ours
runs in it to arm PR_SET_PDEATHSIG there.

reap_with_me(pids) starts a watchdog instead: a minimal Python process (`-S`, no imports
but os/signal/sys) holding the read end of a pipe whose only write end stays in the
trainer. The kernel closes that end when the trainer dies, however it dies; the read returns
empty and the watchdog SIGKILLs the processes it was given, through pidfds opened at its start
(Linux 5.3+: a pid reused by another process is never hit; elsewhere plain kill), then exits.
It runs in its own process session, so a terminal's Ctrl-C or a job step's SIGTERM to the trainer's
process group does not end it first.
"""

from __future__ import annotations

import os
import subprocess
import sys

_WATCHDOG = r"""
import os, signal, sys
targets = []
for p in sys.argv[2:]:
    try:
        targets.append((int(p), os.pidfd_open(int(p))))
    except (AttributeError, OSError):
        targets.append((int(p), None))
try:
    while os.read(int(sys.argv[1]), 64):
        pass
except OSError:
    pass
for pid, pidfd in targets:
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (AttributeError, OSError):
        pass
"""

_held: list[int] = []  # write ends, open for the life of this process


def reap_with_me(pids: list[int]) -> subprocess.Popen | None:
    """Kills `pids` when this process ends (see the module docstring); returns the watchdog."""
    if not pids:
        return None
    r, w = os.pipe()  # both close-on-exec: no other child inherits the write end
    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _WATCHDOG, str(r), *map(str, pids)],
            pass_fds=(r,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(r)
    _held.append(w)
    return proc
