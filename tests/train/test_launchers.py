"""A Hydra launcher whose plugin is missing is refused in one line that names the extra.

test_every_submitit_launcher_config_is_checked    the configs that run through
                                                  hydra-submitit-launcher are the names the
                                                  check knows
test_launcher_problem_names_the_extra             only when a submitit launcher is chosen
                                                  and the plugin is missing
test_trainer_refuses_a_sweep_without_the_plugin   `ufp4-train -m hydra/launcher=local` with
                                                  the plugin hidden: `error:`, exit 2,
                                                  nothing written
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _cli import ROOT, run

from ufp4_megatron.configs import CONFIG_DIR
from ufp4_megatron.train.launchers import PLUGIN, SUBMITIT_LAUNCHERS, launcher_problem


def test_every_submitit_launcher_config_is_checked():
    configs = sorted((Path(CONFIG_DIR) / "hydra" / "launcher").glob("*.yaml"))
    through_submitit = {
        p.stem for p in configs if "submitit" in p.read_text() or p.stem == "slurm_cpu"
    }  # slurm_cpu extends slurm
    assert through_submitit == {"local", "slurm", "slurm_cpu"}
    assert through_submitit <= set(SUBMITIT_LAUNCHERS)


@pytest.mark.parametrize(
    "overrides,refused",
    [
        (["hydra/launcher=local"], True),
        (["model=tiny", "hydra/launcher=slurm_cpu"], True),
        (["+hydra/launcher=submitit_local"], True),
        (["hydra/launcher=basic"], False),  # Hydra's own, nothing to install
        (["hydra/launcher=locl"], False),  # a typo: Hydra's compose names the options
        (["model=tiny", "precision=ufp4"], False),
        (["hydra.launcher.partition=local"], False),
    ],
)
def test_launcher_problem_names_the_extra(overrides, refused):
    problem = launcher_problem(overrides, installed=lambda: False)
    assert (problem is not None) == refused, problem
    if refused:
        assert "pip install 'ufp4-megatron[slurm]'" in problem and "\n" not in problem
    assert launcher_problem(overrides, installed=lambda: True) is None


HIDE = f"""\
import importlib.abc, runpy, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {PLUGIN!r}:
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
sys.argv[0] = "ufp4-train"
runpy.run_module("ufp4_megatron.train", run_name="__main__")
"""


def test_trainer_refuses_a_sweep_without_the_plugin(tmp_path):
    sweep = tmp_path / "sweep"
    r = run(
        [
            sys.executable,
            "-c",
            HIDE,
            "-m",
            "hydra/launcher=local",
            "model=tiny",
            "precision=bf16,ufp4",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
        cwd=ROOT,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(
        "error: hydra/launcher=local runs the sweep's jobs through hydra-submitit-launcher"
    ), line
    assert not sweep.exists()
