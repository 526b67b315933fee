"""W&B with a key but no reachable server: the run logs offline, said in one line, at once.

Without the probe, wandb.init in online mode waits its init_timeout (90 s) and raises
CommError. Here the server is 127.0.0.1 on a port nothing listens on (the connection is
refused at once, as on a node without network), in-process, W&B dirs in tmp.

    test_unreachable_names_why                  refused, no host; a listening port is reachable
    test_online_without_a_server_logs_offline   the trainer's W&B start: offline, one line
    test_compare_logs_offline_too               compare's W&B run: the same
"""

from __future__ import annotations

import socket

import pytest

from ufp4_megatron.train.logs import wandb_run


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends


@pytest.fixture
def no_server(tmp_path, monkeypatch):
    for key, sub in (
        ("WANDB_DIR", "wb"),
        ("WANDB_CACHE_DIR", "wbc"),
        ("WANDB_CONFIG_DIR", "wbcfg"),
        ("WANDB_DATA_DIR", "wbd"),
    ):
        monkeypatch.setenv(key, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return tmp_path


def test_unreachable_names_why():
    port = _closed_port()
    assert "refused" in wandb_run.unreachable(f"http://127.0.0.1:{port}").lower()
    assert wandb_run.unreachable("http:///nohost") == "no host in 'http:///nohost'"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert wandb_run.unreachable(f"http://127.0.0.1:{s.getsockname()[1]}") is None


@pytest.mark.usefixtures("hydra_configs")
def test_online_without_a_server_logs_offline(no_server, capsys):
    from omegaconf import OmegaConf

    from ufp4_megatron.train.overrides import compose_training

    cfg = OmegaConf.to_object(compose_training([]))  # logging.wandb.mode=auto, a key is set
    assert wandb_run.resolve_mode(cfg.logging.wandb.mode) == "online"
    run = wandb_run.start(cfg, no_server / "run")
    try:
        assert run.settings.mode == "offline"
    finally:
        run.finish()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("W&B")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("W&B: http://127.0.0.1:") and "is unreachable (" in lines[0]
    assert f"logging offline to {no_server / 'run'} instead; `wandb sync`" in lines[0]
    assert list((no_server / "run" / "wandb").glob("offline-run-*"))


def test_compare_logs_offline_too(no_server, monkeypatch, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from _runs import write_run

    from ufp4_megatron.report.compare import main

    runs = [
        write_run(no_server / "b", "bf16", 1, [3.0, 2.5, 2.2]),
        write_run(no_server / "u", "ufp4", 1, [3.1, 2.6, 2.3]),
    ]
    monkeypatch.setenv("MPLCONFIGDIR", str(no_server / "mpl"))
    assert main([*runs, "--out", str(no_server / "cmp")]) == 0
    out = capsys.readouterr().out
    assert out.count("is unreachable (") == 1 and "W&B (offline): run compare-t" in out
