"""Every entry point has a console script whose --help works and names the program, and the
launch scripts live once, in the package, with launch/ linking to them.

    test_console_script_help_names_the_program   ufp4-train ... ufp4-launch, as installed
    test_module_help_names_the_program           python -m ... gives the same names
    test_torchrun_sh_help_and_no_gpu_message
    test_launch_dir_links_to_the_packaged_scripts
"""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAUNCH, run_env

from ufp4_megatron.scripts import SLURM_SBATCH, TORCHRUN

BIN = Path(sys.executable).parent
PROGRAMS = {  # console script: (module, what its --help starts with)
    "ufp4-train": ("ufp4_megatron.train", "ufp4-train (python -m ufp4_megatron.train)"),
    "ufp4-compare": ("ufp4_megatron.cli.compare", "usage: ufp4-compare"),
    "ufp4-describe": ("ufp4_megatron.cli.describe", "usage: ufp4-describe"),
    "ufp4-prepare-data": ("ufp4_megatron.cli.prepare_data", "usage: ufp4-prepare-data"),
    "ufp4-diagnostics": ("ufp4_megatron.quant.diagnostics", "usage: ufp4-diagnostics"),
    "ufp4-launch": ("ufp4_megatron.cli.launch", "usage: ufp4-launch"),
}


def _help(cmd, tmp_path):
    return subprocess.run(
        [*cmd, "--help"],
        cwd=tmp_path,
        env=run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("script", sorted(PROGRAMS))
def test_console_script_help_names_the_program(script, tmp_path):
    r = _help([str(BIN / script)], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(PROGRAMS[script][1]), r.stdout[:300]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "script", ["ufp4-describe", "ufp4-compare", "ufp4-prepare-data", "ufp4-diagnostics"]
)
def test_module_help_names_the_program(script, tmp_path):
    module = PROGRAMS[script][0]
    r = _help([sys.executable, "-m", module], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.stdout.split("\n", 1)[0]  # the console script's name or how it was run
    assert first.startswith((f"usage: {script} ", f"usage: python -m {module} ")), first


def test_torchrun_sh_help_and_no_gpu_message(tmp_path):
    r = subprocess.run(
        [str(LAUNCH / "torchrun.sh"), "--help"],
        env=run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "--nproc-per-node" in r.stdout and not r.stderr
    assert not r.stdout.startswith("#!")
    r = subprocess.run(
        [str(LAUNCH / "torchrun.sh"), "--", "model=tiny"],
        timeout=120,
        env=run_env(tmp_path, NPROC_PER_NODE="gpu", CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no GPU visible" in r.stderr and "Traceback" not in r.stderr


def test_launch_dir_links_to_the_packaged_scripts():
    for name, packaged in (("torchrun.sh", TORCHRUN), ("slurm.sbatch", SLURM_SBATCH)):
        link = LAUNCH / name
        assert link.is_symlink() and link.resolve() == packaged.resolve(), link
