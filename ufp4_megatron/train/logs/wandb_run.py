"""The W&B run of one training run: offline unless a key is configured or mode=online.

Run name = <model>-<precision>-s<seed>, group = experiment, id = <run id>-<8 hex of the run
dir's absolute path>: a function of the run dir (whose default name carries the run id,
train/rundir/identity.py), so a resumed or requeued run logs to the same W&B run on every start and
two run dirs never share one. The config is logged as resolved by Hydra; nothing here reads,
prints or stores an API key (wandb finds its own, from WANDB_API_KEY or ~/.netrc, only in
online mode).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import threading
from pathlib import Path

from ..rundir.identity import run_id
from ..schema import Config

MODES = ("offline", "online", "disabled", "auto")
PROBE_S = 5.0  # how long the reachability probe of the W&B server may take


def resolve_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"logging.wandb.mode={mode!r}; valid: {', '.join(MODES)}")
    if mode == "auto":  # online only when the user has put a key in the environment
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def base_url() -> str:
    """The W&B server wandb would talk to (WANDB_BASE_URL, else its default)."""
    import wandb

    settings = wandb.Settings()
    settings.update_from_env_vars(dict(os.environ))
    return settings.base_url


def unreachable(url: str, timeout: float = PROBE_S) -> str | None:
    """None if a TCP connection to url's host opens within `timeout` seconds (name
    resolution included), else why not, in a few words."""
    from urllib.parse import urlparse

    u = urlparse(url)
    host, port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
    if not host:
        return f"no host in {url!r}"
    outcome: list[str | None] = []

    def probe():
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(None)
        except OSError as e:  # refused, unreachable network, no DNS, timed out
            outcome.append(str(e) or type(e).__name__)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of
    thread.start()  # its own: bound it here
    thread.join(timeout + 1)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def online_or_offline(mode: str, where: str) -> str:
    """mode, except that "online" with an unreachable W&B server becomes "offline", said in
    one line (where: the directory the offline run goes to)."""
    if mode != "online":
        return mode
    url = base_url()
    why = unreachable(url)
    if why is None:
        return mode
    print(
        f"W&B: {url} is unreachable ({why}): logging offline to {where} instead; "
        "`wandb sync` uploads it later",
        flush=True,
    )
    return "offline"


def init(where: str, **kw):
    """wandb.init(**kw) in online_or_offline's mode; an online init that fails anyway (no
    answer within wandb's own timeout, a rejected key) is said in one line and redone
    offline."""
    import wandb

    kw["mode"] = online_or_offline(kw["mode"], where)
    try:
        return wandb.init(**kw)
    except Exception as e:
        if kw["mode"] != "online":
            raise
        why = " ".join(str(e).split()) or type(e).__name__
        print(
            f"W&B: online start failed ({type(e).__name__}: {why}): logging offline to "
            f"{where} instead; `wandb sync` uploads it later",
            flush=True,
        )
        return wandb.init(**(kw | {"mode": "offline"}))


def run_name(cfg: Config) -> str:
    return f"{cfg.model.name}-{cfg.precision.name}-s{cfg.train.seed}"


def wandb_id(cfg: Config, run_dir: Path) -> str:
    """The W&B run id of the run in `run_dir` (W&B ids are unique per project)."""
    where = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:8]
    return f"{run_id(cfg)}-{where}"


def start(cfg: Config, run_dir: Path):
    """A wandb run (or None when disabled); resumes the same run id after a restart."""
    mode = resolve_mode(cfg.logging.wandb.mode)
    if mode == "disabled":
        return None
    import wandb

    w = cfg.logging.wandb
    wdir = Path(w.dir or run_dir)
    wdir.mkdir(parents=True, exist_ok=True)
    run = init(
        str(wdir),
        project=w.project,
        entity=w.entity,
        group=cfg.experiment,
        name=run_name(cfg),
        id=wandb_id(cfg, run_dir),
        resume="allow",
        mode=mode,
        dir=str(wdir),
        config=dataclasses.asdict(cfg),
        settings=wandb.Settings(quiet=True),
    )
    # tokens as the charts' x-axis, so runs of different batch sizes line up (live gaps:
    # train/live_gap.py defines their own x)
    run.define_metric("tokens")
    for key in ("loss", "val_loss", "lr", "grad_norm", "diag/*"):
        run.define_metric(key, step_metric="tokens")
    return run
