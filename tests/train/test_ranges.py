"""Every numeric option has a declared range, and a value outside it is refused in one line.

In-process: the enumeration sets each value on the composed default config and runs
validate.check_config (microseconds a case); the reported cases go through the trainer's whole
pre-check from the command line (tests/train/_config.py: composition, then checked_config, the
calls `python -m ufp4_megatron.train` makes before it writes anything);
tests/train/test_validate.py runs the CLI end to end for a few.

    test_every_numeric_field_has_a_declared_range   a new int/float field without a range fails
    test_out_of_range_values_are_refused            each numeric field: below its range, above
                                                    it, NaN and inf (floats), each refused
    test_defaults_and_shipped_configs_are_in_range  no false refusal of what ships
    test_issue_values_are_refused                   the reported cases (nan, inf, 0, -1, 1e10)
"""

from __future__ import annotations

import copy
import math

import pytest
from _config import refusal

from ufp4_megatron.train.ranges import INT_LIMIT, RANGES, numeric_fields
from ufp4_megatron.train.validate import ConfigError, check_config

pytestmark = pytest.mark.usefixtures("hydra_configs")  # tests/conftest.py

NUMERIC = numeric_fields()


def test_every_numeric_field_has_a_declared_range():
    keys = [k for k, _ in NUMERIC]
    assert len(keys) >= 50, keys  # the walk found the schema (data.tokenizer's fields too)
    assert "data.tokenizer.eod_id" in keys and "logging.wandb.diagnostics_layers" in keys
    missing = [k for k in keys if k not in RANGES]
    assert not missing, f"numeric fields without a range in train/ranges.py: {missing}"
    stale = [k for k in RANGES if k not in keys]
    assert not stale, f"ranges for fields the schema does not have: {stale}"


def _outside(key: str, kind: type) -> list:
    """Values just outside the field's range (and NaN/inf for floats)."""
    r = RANGES[key]
    out = []
    if r.lo is not None:
        out.append(r.lo if r.lo_open else (r.lo - 1 if kind is int else r.lo - 0.5))
    hi = r.hi if r.hi is not None else (INT_LIMIT if kind is int else None)
    if hi is not None:
        out.append(hi + (1 if kind is int else 0.5) if r.hi_closed else hi)
    if kind is float:
        out += [math.nan, math.inf, -math.inf]
    return out


@pytest.fixture(scope="module")
def default_config():
    from omegaconf import OmegaConf

    from ufp4_megatron.train.overrides import compose_training

    return OmegaConf.to_object(compose_training([]))


def _with(cfg, key: str, value):
    cfg = copy.deepcopy(cfg)
    *path, name = key.split(".")
    node = cfg
    for part in path:
        node = getattr(node, part)
    setattr(node, name, [value] if isinstance(getattr(node, name), list) else value)
    return cfg


CASES = [(key, v) for key, kind in NUMERIC for v in _outside(key, kind)]


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_out_of_range_values_are_refused(default_config, key, value):
    check_config(default_config)  # in range as composed
    with pytest.raises(ConfigError) as e:
        check_config(_with(default_config, key, value))
    line = str(e.value)
    assert line.startswith(key + "=") and "must be" in line, line
    assert "\n" not in line


def test_defaults_and_shipped_configs_are_in_range():
    assert refusal([]) is None
    for over in (
        ["model=small"],
        ["model=moe_small"],
        ["data=embedded_bpe"],
        ["optim=study", "train=study"],
        ["model=study11m"],
        ["checkpoint.keep=0"],
        ["train.seed=0"],
        ["optim.beta1=0"],
        ["model.rotary_base=500000"],
    ):
        assert refusal(over) is None, over


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["optim.weight_decay=nan"], "optim.weight_decay=nan must be a finite number >= 0"),
        (["model.init_std=nan"], "model.init_std=nan must be a finite number in (0, 1]"),
        (["optim.lr=inf"], "optim.lr=inf must be a finite number > 0"),
        (["model.rotary_base=0"], "model.rotary_base=0 must be >= 2"),
        (["checkpoint.interval=-1"], "checkpoint.interval=-1 must be >= 0 (0: only at the end"),
        (["train.steps=10000000000"], "train.steps=10000000000 must be < 2**31"),
        (["optim.beta1=-0.1"], "optim.beta1=-0.1 must be in [0, 1)"),
    ],
)
def test_issue_values_are_refused(overrides, message):
    line = refusal(overrides)
    assert line is not None and line.startswith(message), line
