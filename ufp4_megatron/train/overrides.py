"""Command-line overrides, composed as the trainer composes them and checked before anything runs.

    with training_configs(): compose_training(overrides)   the config, as the trainer sees it
    compose_problem(overrides)                               None, or one line saying what fails

One place registers the schema and opens Hydra's compose API over the package's configs: the
trainer's pre-check, `describe` and the footprint (train/footprint.py load_config), the study
runner's plan and the tests all compose through it.

Hydra reports a mistyped key, a wrong type or an unknown group option in 5-10 lines (what
failed, OmegaConf's full_key/object_type details, the config search path, a hint about
HYDRA_FULL_ERROR) and exits 1. The trainer and `describe` compose the overrides first with
Hydra's own compose API (nothing resolved, nothing written) and print that message as one
`error:` line with exit status 2, like every other refusal of the trainer. Hydra's hint for a
mistyped key ("To append to your config use +train.stepz=3") leads to a config that composes
and trains with the key ignored: a key the schema (train/schema.py) does not declare is
refused too, except inside its free-form dicts (precision.overrides).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

_DETAIL = (
    "full_key:",
    "object_type=",
    "reference_type=",
    "Set the environment variable HYDRA_FULL_ERROR",
)


def one_line(message: str) -> str:
    """A Hydra/OmegaConf error message without its detail lines, joined with '; '."""
    lines = [line.strip() for line in message.split("Config search path:")[0].splitlines()]
    kept = [line for line in lines if line and not line.startswith(_DETAIL)]
    out = []
    for line in kept:  # "Available options in 'model':" + one option per line -> one clause
        if out and out[-1].endswith(":"):
            out[-1] += " " + line
        elif out and out[-1].startswith("Available options") and ":" in out[-1]:
            out[-1] += ", " + line
        else:
            out.append(line)
    text = ""
    for clause in out:  # sentences run on; list items ("1. ...") and clauses get a "; "
        text += ("" if not text else " " if text.endswith(".") else "; ") + clause
    return text


def describe_error(e: BaseException) -> str:
    """one_line of e, with its cause (OmegaConf's validation error under Hydra's)."""
    cause = e.__cause__
    text = one_line(str(e))
    if cause is not None and str(cause).strip():
        text += f" ({one_line(str(cause))})"
    return text


@contextlib.contextmanager
def training_configs():
    """Hydra's compose API over the package's configs, with the structured schema and the
    run-id resolver registered as the trainer registers them; cleared on exit."""
    from hydra import initialize_config_dir

    from ..configs import CONFIG_DIR
    from .rundir.identity import register_resolver
    from .schema import register_configs

    register_configs()
    register_resolver()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield


def compose_training(overrides: list[str], config_dir: str | None = None):
    """The training config (a DictConfig, unresolved) as `python -m ufp4_megatron.train`
    composes it, inside `training_configs()`; raises Hydra's errors. `config_dir`: the
    trainer's --config-dir (a user's own config groups)."""
    from hydra import compose

    if config_dir is not None:  # what --config-dir does for the trainer
        overrides = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]", *overrides]
    return compose("config", overrides=list(overrides))


def compose_problem(overrides: list[str], config_dir: str | None = None) -> str | None:
    """None if `overrides` compose into the training config; else Hydra's complaint, one line."""
    return composed(overrides, config_dir)[1]


def composed(overrides: list[str], config_dir: str | None = None):
    """(the composed config, None), or (None, one line saying why it does not compose: Hydra's
    complaint, a key outside the schema, a mandatory value left unset)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with _configs():
            cfg = compose_training(overrides, config_dir)
    except (HydraException, OmegaConfBaseException) as e:
        return None, describe_error(e)
    problem = schema_problem(cfg) or missing_problem(cfg)
    return (None, problem) if problem else (cfg, None)


def _configs():
    """training_configs(), or nothing where a caller is already inside it (tests compose
    many configs in one context)."""
    from hydra.core.global_hydra import GlobalHydra

    return (
        contextlib.nullcontext() if GlobalHydra.instance().is_initialized() else training_configs()
    )


def missing_problem(cfg) -> str | None:
    """None, or one line naming the mandatory values a composed config leaves unset: a group
    removed with `~precision`, a key a user's own YAML does not give."""
    from omegaconf import OmegaConf

    from ..configs import CONFIG_DIR

    # not OmegaConf.missing_keys: it resolves every value on the way, and ${hydra:run.dir}
    # (data.cache_dir='${hydra:run.dir}/data-cache') resolves only inside a Hydra run
    missing = sorted(_missing_keys(OmegaConf.to_container(cfg, resolve=False)))
    if not missing:
        return None
    groups = [k for k in missing if "." not in k]
    if groups:
        options = sorted(p.stem for p in (Path(CONFIG_DIR) / groups[0]).glob("*.yaml"))
        hint = (
            f"; the trainer has no default for it (`~{groups[0]}` removes the group): "
            f"choose one of {', '.join(options)}, e.g. {groups[0]}={options[0]}"
        )
    else:
        hint = "; set it on the command line or in the YAML that leaves it out"
    return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set{hint}"


def _missing_keys(node, key: str = ""):
    """The full keys of the values that are '???' in a config's unresolved container."""
    if node == "???":
        yield key
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _missing_keys(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _missing_keys(v, f"{key}[{i}]")


def schema_problem(cfg) -> str | None:
    """None, or one line for the first key of a composed config that the schema does not
    declare (what a `+` override adds: composes, then nothing reads it)."""
    for key, fields in _keys_outside_schema(cfg):
        return (
            f"{key} is not a key of the training config, so nothing would read it (a '+' "
            f"adds it, as Hydra's hint says, but the trainer ignores it); check the "
            f"spelling: {key.rpartition('.')[0] or 'the top level'} has {', '.join(fields)}"
        )
    return None


def _keys_outside_schema(node, prefix: str = ""):
    """(key, the valid ones) for each key a `+` override put into a dataclass section of the
    schema (train/schema.py) that the dataclass does not declare; free-form sections (dicts,
    e.g. precision.overrides) take any key."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    schema = OmegaConf.get_type(node)
    names = None
    if dataclasses.is_dataclass(schema):
        names = [f.name for f in dataclasses.fields(schema)]
    for key in node:
        if names is not None and key not in names:
            yield f"{prefix}{key}", names
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue  # nothing under it yet (and an interpolation is not resolved here)
        child = node[key]
        if isinstance(child, DictConfig):
            yield from _keys_outside_schema(child, f"{prefix}{key}.")


def precheckable(argv: list[str]) -> tuple[list[str], str | None] | None:
    """(overrides, --config-dir) of a plain trainer command line; None where Hydra's flags
    (--multirun, --cfg, --help, ...) ask for Hydra's own handling."""
    overrides, config_dir, args = [], None, iter(argv)
    for a in args:
        if a in ("--config-dir", "-cd"):
            config_dir = next(args, None)
            if config_dir is None:
                return None
        elif a.startswith("--config-dir="):
            config_dir = a.split("=", 1)[1]
        elif a.startswith("-"):
            return None
        else:
            overrides.append(a)
    return overrides, config_dir
