"""A run's identity: the config keys that change what is trained, and a short hash of them.

Two commands whose identity is equal train the same run (and may resume each other); any
difference in these keys is another run, with another run dir and W&B id. Keys that only
change how or how long it runs (parallel layout, micro-batch, steps, logging, checkpointing,
device) are not part of it: a run may resume with them changed.

    identity(cfg)        {"model": ..., "precision": ..., "data": ..., "optim": ...,
                          "train": {seed, seq_len, global_batch, dtype}}
    run_id(cfg)          8 hex digits of sha256 over identity(cfg)
    sibling_key(cfg)     the same over identity(cfg) without "precision": runs that differ
                         only in their recipe (a BF16 reference and its 4-bit runs) share it
    differences(a, b)    the dotted identity keys where two configs differ
    register_resolver()  `${ufp4.run_id:}` for Hydra's run and sweep dirs

`cfg` is the resolved config as plain containers (OmegaConf.to_container(..., resolve=True)),
a dataclass Config, or a DictConfig (resolved key by key). All three give the same run_id.
Imports nothing of Megatron; usable on saved config.yaml files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Whole groups that define the run.
IDENTITY_GROUPS = ("model", "precision", "data", "optim")
# Keys of `train` that define the run; the rest (steps, micro_batch, eval_*, device) do not.
IDENTITY_TRAIN_KEYS = ("seed", "seq_len", "global_batch", "dtype")
# Keys inside the groups above that do not change the run (where files go, not what is in them;
# which held-out samples validation reads, not what is trained).
NON_IDENTITY_KEYS = {("data", "cache_dir"), ("data", "valid_seed")}
# Keys added to an identity group after runs had been recorded without them, each with the
# value those earlier runs trained with. At that value the key is left out of the identity, so
# an option that defaults to the old behaviour renames no run: an earlier run keeps its run dir
# (a resume finds it) and its BF16 sibling (compare pairs it): without this, a run recorded
# after the key existed finds no sibling among the runs recorded before it. A new identity
# key goes here, with the value that reproduces
# the earlier runs, and into tests/train/test_run_identity.py's IDENTITY_KEYS.
KEYS_ADDED_LATER: dict[tuple[str, str], Any] = {
    ("model", "cross_entropy_fusion"): False,
    ("model", "transformer_impl"): "local",
    ("model", "moe_capacity_factor"): None,
    ("model", "moe_pad_to_capacity"): False,
}


def _plain(cfg: Any) -> Mapping:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if type(cfg).__name__ == "DictConfig":  # a Mapping too, but resolved key by key
        return _resolved_identity_nodes(cfg)
    return cfg


def _resolved_identity_nodes(cfg: Any) -> dict:
    """The identity groups of a DictConfig, resolved key by key: keys outside the identity are
    never resolved, so one that points at the run dir (data.cache_dir='${hydra:run.dir}/x')
    cannot make the run dir depend on itself."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    def value(node, key):
        v = node[key]  # resolves an interpolation, relative to the whole config
        if isinstance(v, (DictConfig, ListConfig)):
            return OmegaConf.to_container(v, resolve=True)
        return v

    out = {}
    for group in (*IDENTITY_GROUPS, "train"):
        node = cfg.get(group)
        if node is None:
            continue
        keep = [
            k
            for k in node
            if (group, k) not in NON_IDENTITY_KEYS
            and (group != "train" or k in IDENTITY_TRAIN_KEYS)
        ]
        out[group] = {k: value(node, k) for k in keep}
    return out


def identity(cfg: Any) -> dict:
    """The run-defining part of a config, as plain, JSON-serialisable containers."""
    c = _plain(cfg)
    out = {}
    for group in IDENTITY_GROUPS:
        node = dict(c.get(group) or {})
        for g, key in NON_IDENTITY_KEYS:
            if g == group:
                node.pop(key, None)
        for (g, key), earlier in KEYS_ADDED_LATER.items():
            if g == group and node.get(key, earlier) == earlier:
                node.pop(key, None)
        out[group] = node
    train = c.get("train") or {}
    out["train"] = {k: train.get(k) for k in IDENTITY_TRAIN_KEYS}
    return out


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def run_id(cfg: Any) -> str:
    """8 hex digits naming the run: equal iff identity(cfg) is equal."""
    return _digest(identity(cfg))


def sibling_key(cfg: Any) -> str:
    """8 hex digits shared by runs that differ only in `precision` (same model, data, seed, ...)."""
    ident = identity(cfg)
    ident.pop("precision")
    return _digest(ident)


def register_resolver() -> None:
    """`${ufp4.run_id:}` in a Hydra config: run_id() of the config it sits in. Hydra's run and
    sweep dirs use it (configs/hydra/default.yaml), so every torchrun rank, given the same
    command, computes the same dir. Register before hydra.main / compose."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("ufp4.run_id", lambda *, _root_: run_id(_root_), replace=True)


def differences(old: Any, new: Any) -> list[str]:
    """Dotted keys whose identity value differs between two configs (sorted)."""
    a, b = identity(old), identity(new)
    out: list[str] = []

    def walk(x, y, path):
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}.{k}" if path else k)
        elif x != y:
            out.append(path)

    walk(a, b, "")
    return out
