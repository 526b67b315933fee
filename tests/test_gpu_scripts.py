"""The GPU suites under gpu/ (and the benchmark code they drive) run as a user's runs would (issue 10: "every GPU run of record keeps
checkpointing on; a GPU script that turns it off to pass is a defect"): no script may switch
the trainer's saving off. Checked on the scripts' text, since they only run on a GPU."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the overrides that would make a GPU run save nothing
OFF = re.compile(r"checkpoint\.(save_at_end=false|interval=0\b|resume=false)")


def test_no_gpu_script_switches_checkpointing_off():
    # gpu/'s scripts and the benchmark code they drive (ufp4_megatron/bench: the step table)
    scripts = sorted(p for d in ("gpu", "ufp4_megatron/bench") for p in (ROOT / d).rglob("*")
                     if p.suffix in (".sh", ".py"))
    assert scripts, "gpu/ holds no scripts: this test looks in the wrong place"
    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in scripts
                 for i, line in enumerate(p.read_text().splitlines(), 1) if OFF.search(line)]
    assert not offenders, "GPU scripts that switch checkpointing off:\n" + "\n".join(offenders)


def test_the_check_sees_an_offending_line():
    assert OFF.search('run_trainer(name, ["checkpoint.save_at_end=false", *overrides])')
    assert OFF.search("python -m ufp4_megatron.train checkpoint.resume=false")
    assert not OFF.search("checkpoint.interval=10 checkpoint.keep=1")


def _study_sh(*args, **env):
    import os
    import subprocess
    return subprocess.run(["bash", "gpu/study.sh", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=30)


def test_study_sh_refuses_a_bad_round_or_grid_before_setting_up():
    # both refusals happen before gpu/setup.sh (nothing is installed or trained)
    bad_round = _study_sh("12")
    assert bad_round.returncode == 2 and "unknown round 12" in bad_round.stderr
    bad_grid = _study_sh("4", GRID="mian")
    assert bad_grid.returncode == 2
    assert "GRID=mian; give main, ablation, depth or small" in bad_grid.stderr


def test_study_sh_refuses_bad_steps_and_packages_before_setting_up():
    steps = _study_sh("3", STEPS="2k", CORPUS="pysrc")
    assert steps.returncode == 2 and "STEPS=2k; give a positive step count" in steps.stderr
    assert _study_sh("3", STEPS="0").returncode == 2
    pkgs = _study_sh("3", CORPUS="pysrc", PACKAGES="torch;rm")
    assert pkgs.returncode == 2 and "give importable names separated by commas" in pkgs.stderr
    stdlib = _study_sh("3", PACKAGES="numpy")
    assert stdlib.returncode == 2 and "PACKAGES is for CORPUS=pysrc" in stdlib.stderr


def _scripts_without_setup(paths):
    # a script that runs the package's modules needs the trainer's dependencies, which a CUDA
    # image lacks until gpu/setup.sh installs them (2026-12-02: `bash gpu/perf.sh` alone on a
    # fresh H200 died on `import hydra`)
    return [p.name for p in paths if re.search(r"-m ufp4_megatron\b", p.read_text())
            and "source gpu/setup.sh" not in p.read_text()]


def test_every_gpu_script_that_runs_the_package_sets_up_its_dependencies():
    scripts = sorted((ROOT / "gpu").glob("*.sh"))
    assert any(re.search(r"-m ufp4_megatron\b", p.read_text()) for p in scripts)
    assert _scripts_without_setup(scripts) == []


def test_the_setup_check_sees_a_script_without_it(tmp_path):
    bare = tmp_path / "bare.sh"
    bare.write_text("set -uo pipefail\npython3 -m ufp4_megatron.bench --suite step\n")
    guarded = tmp_path / "guarded.sh"
    guarded.write_text("python3 -c 'import hydra' || source gpu/setup.sh\npython3 -m ufp4_megatron.bench\n")
    assert _scripts_without_setup([bare, guarded]) == ["bare.sh"]
