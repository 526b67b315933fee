"""Every shell script under launch/ passes shellcheck (installed by launch/ci/apt_deps.sh)."""

import subprocess

from conftest import LAUNCH, which_or_fail

SCRIPTS = sorted(p for p in LAUNCH.rglob("*") if p.suffix in (".sh", ".sbatch"))


def test_launch_scripts_exist():
    names = {p.relative_to(LAUNCH).as_posix() for p in SCRIPTS}
    assert {"torchrun.sh", "slurm.sbatch", "ci/slurm_up.sh", "ci/slurm_down.sh"} <= names


def test_shellcheck_passes_on_every_script(apt_tools):
    res = subprocess.run(
        [which_or_fail("shellcheck"), "--shell=bash", "--severity=style", *map(str, SCRIPTS)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
