"""study/mps.py against a stand-in for nvidia-cuda-mps-control (no GPU here): the daemon's
life (started private, probed, quit, killed with its runner), the runs' environment, and
every way it can fail, in both modes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from study_helpers import env, study_cmd

from ufp4_megatron.study import manifest as mf
from ufp4_megatron.study import mps
from ufp4_megatron.study.packing import Slot

# -f: the daemon (records its pid and CUDA_VISIBLE_DEVICES, makes the control socket, waits
# for quit); otherwise one command on stdin, as the real tool takes them
FAKE_CONTROL = r"""#!/usr/bin/env bash
P=$CUDA_MPS_PIPE_DIRECTORY
if [[ ${1:-} == -f ]]; then
  if [[ -n ${FAKE_MPS_FAIL:-} ]]; then
    echo "fake daemon: cannot start" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 3
  fi
  echo "$$ ${CUDA_VISIBLE_DEVICES-unset}" > "$P/daemon"
  [[ -n ${FAKE_MPS_NO_SOCKET:-} ]] || touch "$P/control"
  while [[ ! -f $P/quit ]]; do sleep 0.05; done
  exit 0
fi
read -r cmd
case $cmd in
  quit) touch "$P/quit" ;;
  get_server_list) [[ -f $P/server ]] && echo 4242 ;;
esac
exit 0
"""
# the probe: what a client sees through the daemon (CUDA_VISIBLE_DEVICES must be unset)
FAKE_PROBE = """
import json, os, pathlib, sys
p = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
assert "CUDA_VISIBLE_DEVICES" not in os.environ, "the probe must see the server's devices"
if os.environ.get("FAKE_PROBE_FAIL"):
    sys.exit("RuntimeError: CUDA error: no device")
if not os.environ.get("FAKE_NO_SERVER"):
    pathlib.Path(p, "server").touch()
print("torch says hello")
print(json.dumps(os.environ["FAKE_UUIDS"].split(",")))
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / mps.CONTROL
    tool.write_text(FAKE_CONTROL)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    probe = tmp_path / "probe.py"
    probe.write_text(FAKE_PROBE)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(tmp_path / "no-system-daemon"))
    (tmp_path / "pipes").mkdir()
    monkeypatch.setattr(mps, "PIPE_PARENT", str(tmp_path / "pipes"))
    monkeypatch.setenv("FAKE_UUIDS", "aaaa-1,GPU-bbbb-2")
    return [sys.executable, str(probe)]


def _start(mode, gpus, tmp_path, probe):
    said = []
    daemon = mps.start(mode, gpus, tmp_path / "logs" / "mps", say=said.append, probe=probe)
    return daemon, said


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_private_daemon_serves_the_runs_by_uuid_and_quits(tmp_path, fake):
    daemon, said = _start("on", ["2", "5"], tmp_path, fake)
    try:
        pipe = Path(daemon.pipe_dir)
        assert stat.S_IMODE(pipe.stat().st_mode) == 0o700  # no other user or job reaches it
        pid, visible = (pipe / "daemon").read_text().split()
        assert visible == "2,5"  # the server sees the runner's GPUs in its order
        # MPS renumbers what it serves: each run names its GPU by UUID
        env = daemon.client_env(Slot(0, "5", (0,)))
        assert env == {
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "logs" / "mps"),
            "CUDA_VISIBLE_DEVICES": "GPU-bbbb-2",
        }
        assert daemon.client_env(Slot(1, "2", (1,)))["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa-1"
        assert said == [f"MPS: the runs of 2 GPU(s) share a server (pipe dir {pipe})"]
    finally:
        daemon.stop()
    assert _gone(int(pid)) and not pipe.exists()
    assert daemon.proc.returncode == 0  # quit, not killed


def test_a_gpu_named_by_uuid_keeps_its_name(tmp_path, fake):
    daemon, _ = _start("on", ["MIG-cccc-3", "1"], tmp_path, fake)
    try:
        assert daemon.uuids == {"MIG-cccc-3": "MIG-cccc-3", "1": "GPU-bbbb-2"}
    finally:
        daemon.stop()


def test_off_and_cpu_only_start_nothing(tmp_path, fake):
    assert _start("off", ["0"], tmp_path, fake) == (None, [])
    assert _start("auto", [], tmp_path, fake) == (None, [])
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "break_it, reason",
    [
        ({"PATH": "/nonexistent"}, "nvidia-cuda-mps-control is not on PATH"),
        ({"FAKE_MPS_FAIL": "1"}, "exited with 3 (control.log: fake daemon: cannot start)"),
        ({"FAKE_PROBE_FAIL": "1"}, "the probe failed (exit 1: RuntimeError: CUDA error"),
        ({"FAKE_NO_SERVER": "1"}, "no server started for the probe"),
        ({"FAKE_UUIDS": "only-one"}, "the server exposes 1 GPU(s) for the runner's 2"),
    ],
)
def test_a_daemon_that_does_not_serve_is_refused_or_skipped_in_one_line(
    tmp_path, fake, monkeypatch, break_it, reason
):
    for k, v in break_it.items():
        monkeypatch.setenv(k, v)
    daemon, said = _start("auto", ["0", "1"], tmp_path, fake)
    assert daemon is None and len(said) == 1
    assert said[0].startswith("MPS: not used (") and reason in said[0], said
    assert said[0].endswith("the runs on a GPU take turns on it")
    with pytest.raises(SystemExit) as e:
        _start("on", ["0", "1"], tmp_path, fake)
    msg = str(e.value)
    assert "\n" not in msg and reason in msg and msg.endswith("run with --mps off")
    # nothing left behind: every daemon quit, every pipe dir removed
    assert not list((tmp_path / "pipes").iterdir())


def test_a_daemon_without_a_socket_is_given_up_on(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_NO_SOCKET", "1")
    t0 = time.monotonic()
    daemon, said = _start("auto", ["0"], tmp_path, fake)
    assert daemon is None and "made no control socket in 10 s" in said[0]
    assert time.monotonic() - t0 < 40  # the daemon was killed, not waited for


def test_a_daemon_already_serving_this_environment_is_used_as_it_is(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "site-mps"))
    daemon, said = _start("on", ["0"], tmp_path, fake)
    assert not daemon.own and daemon.client_env(Slot(0, "0", (0,))) == {}
    assert said == [
        f"MPS: the runs use the daemon already serving {tmp_path / 'site-mps'} (not started here)"
    ]
    daemon.stop()  # leaves it alone
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY")
    default = tmp_path / "default-mps"
    default.mkdir()
    (default / "control").touch()
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(default))
    daemon, said = _start("auto", ["0"], tmp_path, fake)
    assert not daemon.own and str(default) in said[0]


def test_bad_requests_are_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"--mps 'yes'; give one of off, auto, on"):
        mps.check_request("yes", ["0"])
    with pytest.raises(SystemExit, match=r"--mps on shares GPUs .* drop --mps or give GPUs"):
        mps.check_request("on", [])
    mps.check_request("auto", [])  # auto without GPUs: nothing to do


def test_the_daemon_dies_with_its_runner(tmp_path, fake):
    """A runner killed with SIGKILL leaves no daemon behind (PR_SET_PDEATHSIG)."""
    script = tmp_path / "runner.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from pathlib import Path
            from ufp4_megatron.study import mps
            mps.DEFAULT_PIPE_DIR = {str(tmp_path / "none")!r}
            mps.PIPE_PARENT = {str(tmp_path / "pipes")!r}
            d = mps.start("on", ["0", "1"], Path({str(tmp_path / "logs")!r}),
                          probe={fake!r}, say=lambda m: None)
            print(d.pipe_dir, flush=True)
            time.sleep(600)
            """
        )
    )
    runner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pipe = Path(runner.stdout.readline().strip())
        pid = int((pipe / "daemon").read_text().split()[0])
        assert not _gone(pid, within=0.5)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    assert _gone(pid), "the daemon outlived its runner"


def test_the_runner_refuses_mps_on_without_gpus(tmp_path):
    out = subprocess.run(
        study_cmd(tmp_path / "s", "--grid", "demo", "--mps", "on", "--dry-run"),
        capture_output=True,
        text=True,
        env=env(tmp_path),
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        "ufp4-launch study: --mps on shares GPUs between runs, and this study has none "
        "(--gpus none, or no GPU visible); drop --mps or give GPUs"
    )
    assert not (tmp_path / "s").exists()


def test_launch_json_says_whether_the_run_shared_its_gpu_through_mps(tmp_path):
    mf.write_launch(tmp_path, attempt=2, from_step=0, mps=True)
    assert json.loads((tmp_path / "launch.json").read_text()) == {
        "attempt": 2,
        "from_step": 0,
        "mps": True,
    }
