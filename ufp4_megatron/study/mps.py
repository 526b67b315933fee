"""CUDA MPS for packed runs: the trainers on one GPU run their kernels side by side.

Each trainer process has its own CUDA context, and without MPS (NVIDIA's Multi-Process
Service) a GPU time-slices between contexts: one process's kernels at a time, however few
SMs they fill. A small study model's kernels fill few, so runs packed on one GPU add up their
kernel time (docs/comparing.md, "Packing"). Under MPS one server holds a context for all of
them and their kernels run concurrently. The kernels, their launch configurations and the
devices they see are the same, so a run's arithmetic does not change.

`--mps on|auto` starts a control daemon of the runner's own: its pipe directory is a fresh
0700 directory under /tmp (no other user, and no other job, reaches it), its logs go to
<study>/logs/mps/, it runs as the runner's child (PR_SET_PDEATHSIG: it dies with the runner)
and is told to quit when the runs are done. A probe process connects through it before any
run starts and reads the GPUs' UUIDs: MPS renumbers the devices it serves, so the runs get
CUDA_VISIBLE_DEVICES as the UUID of their GPU, which names the same GPU with or without MPS.
Where the daemon does not start or no server answers the probe, `on` refuses in one line
and `auto` says so in one line and runs as before. A daemon that already serves this
environment (CUDA_MPS_PIPE_DIRECTORY set, or one in the default /tmp/nvidia-mps) is used as
it is, and no other is started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .packing import Slot, available_cpus, spawn

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
PIPE_PARENT = "/tmp"  # where own pipe dirs go: local, and short (socket paths <= 108 bytes)
MODES = ("off", "auto", "on")
PROBE_TIMEOUT = 120.0  # seconds: a torch import and the first context through the server
# The probe: the UUIDs of the GPUs the server exposes, in CUDA's order, after a context on
# each (a context through the daemon is what starts its server).
PROBE = """
import json, torch
uuids = []
for i in range(torch.cuda.device_count()):
    torch.zeros(1, device=f"cuda:{i}").sum().item()
    uuids.append(str(torch.cuda.get_device_properties(i).uuid))
print(json.dumps(uuids))
"""


class MPS:
    """A running daemon: what the runs of each GPU add to their environment."""

    def __init__(self, pipe_dir: str, log_dir: str, uuids: dict[str, str], proc=None):
        self.pipe_dir, self.log_dir, self.uuids, self.proc = pipe_dir, log_dir, uuids, proc

    @property
    def own(self) -> bool:
        """Started by this runner (and so stopped by it)."""
        return self.proc is not None

    def client_env(self, slot: Slot) -> dict[str, str]:
        """What a run on `slot` adds to its environment: nothing for a daemon found running
        (the runs inherit what reaches it)."""
        if not self.own:
            return {}
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}
        if slot.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.uuids[slot.gpu]
        return env

    def stop(self) -> None:
        """Quits an own daemon (its server goes once its clients have exited) and removes its
        pipe directory; leaves a daemon it did not start alone."""
        if not self.own:
            return
        if self.proc.poll() is None:
            try:
                _control("quit", self.pipe_dir, timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.pipe_dir, ignore_errors=True)


def _control(command: str, pipe_dir: str, timeout: float) -> str:
    """One command to the daemon of pipe_dir (as `echo command | nvidia-cuda-mps-control`)."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir)
    out = subprocess.run(
        [CONTROL], input=command + "\n", capture_output=True, text=True, env=env, timeout=timeout
    )
    return out.stdout


def _normal_uuid(u: str) -> str:
    """torch prints a device UUID bare; CUDA_VISIBLE_DEVICES takes it as GPU-<uuid>."""
    return u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"


def _existing(env) -> str | None:
    """The pipe directory of a daemon this environment already reaches, or None."""
    if env.get("CUDA_MPS_PIPE_DIRECTORY"):
        return env["CUDA_MPS_PIPE_DIRECTORY"]
    if Path(DEFAULT_PIPE_DIR, "control").exists():
        return DEFAULT_PIPE_DIR
    return None


def check_request(mode: str, gpus: list[str]) -> None:
    """Refuses, in one line, a mode that is not one of MODES, and `on` without GPUs."""
    if mode not in MODES:
        raise SystemExit(f"ufp4-launch study: --mps {mode!r}; give one of {', '.join(MODES)}")
    if mode == "on" and not gpus:
        raise SystemExit(
            "ufp4-launch study: --mps on shares GPUs between runs, and this study has none "
            "(--gpus none, or no GPU visible); drop --mps or give GPUs"
        )


def start(
    mode: str, gpus: list[str], log_dir: Path, *, say=print, probe: list[str] | None = None
) -> MPS | None:
    """The daemon the runs of `gpus` (the runner's slot GPUs, as CUDA_VISIBLE_DEVICES names
    them) share, or None: mode off, no GPUs, or (auto) none could be started. probe: the
    command run through the daemon (default: PROBE under this Python), printing the JSON
    list of the exposed GPUs' UUIDs."""
    check_request(mode, gpus)
    if mode == "off" or not gpus:
        return None
    existing = _existing(os.environ)
    if existing is not None:
        say(f"MPS: the runs use the daemon already serving {existing} (not started here)")
        return MPS(existing, os.environ.get("CUDA_MPS_LOG_DIRECTORY", ""), {})
    problem, daemon = _start_own(gpus, Path(log_dir), probe)
    if daemon is not None:
        say(f"MPS: the runs of {len(gpus)} GPU(s) share a server (pipe dir {daemon.pipe_dir})")
        return daemon
    if mode == "on":
        raise SystemExit(f"ufp4-launch study: --mps on: {problem}; run with --mps off")
    say(f"MPS: not used ({problem}); the runs on a GPU take turns on it")
    return None


def _start_own(gpus: list[str], log_dir: Path, probe) -> tuple[str, MPS | None]:
    """(what went wrong, None) or ("", the daemon, probed)."""
    exe = shutil.which(CONTROL)
    if exe is None:
        return f"{CONTROL} is not on PATH", None
    log_dir.mkdir(parents=True, exist_ok=True)
    pipe_dir = tempfile.mkdtemp(prefix="ufp4-mps-", dir=PIPE_PARENT)  # 0700
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir, CUDA_MPS_LOG_DIRECTORY=str(log_dir))
    # the server sees the GPUs the runner sees, in the runner's order
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    log = open(log_dir / "control.out", "ab")
    try:
        proc = spawn([exe, "-f"], Slot(-1, None, tuple(available_cpus())), env, log)
    finally:
        log.close()
    daemon = MPS(pipe_dir, str(log_dir), {}, proc)
    problem = _probe(daemon, gpus, env, probe)
    if problem:
        daemon.stop()
        return problem, None
    return "", daemon


def _probe(daemon: MPS, gpus: list[str], env: dict, probe) -> str:
    """'' when a client reached a server of the daemon and the UUIDs of `gpus` are known
    (daemon.uuids filled), else what went wrong."""
    deadline = time.monotonic() + 10
    while not Path(daemon.pipe_dir, "control").exists():  # the daemon's socket
        if daemon.proc.poll() is not None:
            return f"{CONTROL} -f exited with {daemon.proc.returncode} ({_last_log(daemon)})"
        if time.monotonic() > deadline:
            return f"{CONTROL} made no control socket in 10 s ({_last_log(daemon)})"
        time.sleep(0.1)
    client = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    argv = probe or [sys.executable, "-c", PROBE]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, env=client, timeout=PROBE_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return f"the probe took over {PROBE_TIMEOUT:.0f} s to reach the server"
    lines = out.stdout.strip().splitlines()
    try:
        uuids = [_normal_uuid(str(u)) for u in json.loads(lines[-1])]
    except (IndexError, ValueError, TypeError):
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the probe failed (exit {out.returncode}: {tail})"
    if len(uuids) != len(gpus):
        return f"the server exposes {len(uuids)} GPU(s) for the runner's {len(gpus)}"
    try:
        servers = _control("get_server_list", daemon.pipe_dir, timeout=10).split()
    except (OSError, subprocess.SubprocessError) as e:
        return f"get_server_list failed ({e})"
    if not servers:
        return f"no server started for the probe ({_last_log(daemon)})"
    # a GPU the runner already names by UUID (GPU-..., or a MIG instance's MIG-...) keeps it
    daemon.uuids = {g: g if g.startswith(("GPU-", "MIG-")) else u for g, u in zip(gpus, uuids)}
    return ""


def _last_log(daemon: MPS) -> str:
    """The last line of the daemon's own logs, for a one-line reason."""
    for name in ("control.log", "server.log", "control.out"):
        p = Path(daemon.log_dir, name)
        if p.exists():
            lines = p.read_text(errors="replace").strip().splitlines()
            if lines:
                return f"{name}: {lines[-1].strip()}"
    return "no log"
