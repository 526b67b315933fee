"""The wheel works without a checkout: build it, install it (not editable) into a fresh venv,
check that every requirement it declares for this Python holds there, and from a directory
outside the checkout train 2 steps, describe, and plan a Slurm sweep.

    test_wheel_trains_describes_and_launches_outside_the_checkout
    test_wheel_installs_its_own_dependencies_and_trains   (slow, network) pip resolves and
        installs everything the wheel declares into an empty venv, and it trains

How it stays offline and takes seconds: the wheel is built with `pip wheel --no-deps
--no-build-isolation` from a copy of pyproject.toml, README.md and ufp4_megatron/ (so the
checkout gets no build/ dir); the fresh venv is made `--without-pip`, gets one .pth line
naming this interpreter's site-packages (torch, megatron-core, hydra, ... are reused, not
installed), and the wheel goes in with this pip's `--python` option, `--no-deps --no-index`.
A .pth path line does not run that directory's own .pth files, so the editable install of
the checkout stays invisible: the test asserts ufp4_megatron is imported from the venv.
What pip itself chooses for these requirements from the registries, per Python:
test_wheel_dependencies.py.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT, run_env

# A user's own model, found through Hydra's --config-dir (not in the package).
USER_MODEL = """\
name: mine
num_layers: 1
hidden_size: 64
ffn_hidden_size: 128
num_attention_heads: 2
num_query_groups: 1
max_seq_len: 64
"""
# The installed wheel's requirements for this Python (markers evaluated here) that the venv does
# not satisfy, then whether torch and triton are among those declared.
UNMET = """\
import importlib.metadata as m
from packaging.requirements import Requirement
reqs = [Requirement(r) for r in m.requires("ufp4-megatron")]
for r in reqs:
    if r.marker is None or r.marker.evaluate({"extra": ""}):
        try:
            found = m.version(r.name)
        except m.PackageNotFoundError:
            found = None
        if found is None or not r.specifier.contains(found, prereleases=True):
            print("unmet:", r, found)
print("declared:", *sorted(r.name for r in reqs if r.name in ("torch", "triton")))
"""
TRAIN = [
    "train.steps=2",
    "train.device=cpu",
    "train.seq_len=32",
    "train.micro_batch=2",
    "train.global_batch=2",
    "logging.wandb.mode=disabled",
    "logging.progress=plain",
    "logging.print_interval=1",
    "data.corpus_max_bytes=300000",
    "data.split='80,20,0'",
    "data.cache_dir=${hydra:run.dir}/data-cache",
]


def _run(cmd, cwd, tmp, timeout=300):
    env = run_env(tmp)
    env.pop("PYTHONPATH", None)  # only what is installed in the venv under test
    r = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "ufp4_megatron",
        src / "ufp4_megatron",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            tmp / "dist",
            src,
        ],
        tmp,
        tmp,
    )
    (wheel,) = (tmp / "dist").glob("ufp4_megatron-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp, tmp)
    py = venv / "bin" / "python"
    purelib = Path(
        subprocess.check_output(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_ufp4_test_deps.pth").write_text("\n".join(deps) + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            py,
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            "--disable-pip-version-check",
            wheel,
        ],
        tmp,
        tmp,
    )
    return venv


def test_wheel_trains_describes_and_launches_outside_the_checkout(tmp_path):
    venv = _fresh_venv(tmp_path, _build_wheel(tmp_path))
    bin_ = venv / "bin"
    work = tmp_path / "work"  # outside the checkout: nothing of it is on the path or in cwd
    work.mkdir()
    (tmp_path / "mycfg" / "model").mkdir(parents=True)
    (tmp_path / "mycfg" / "model" / "mine.yaml").write_text(USER_MODEL)

    where = _run(
        [bin_ / "python", "-c", "import ufp4_megatron; print(ufp4_megatron.__file__)"],
        work,
        tmp_path,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(ROOT), where
    assert sysconfig.get_paths()["purelib"] not in where
    # what the installed wheel declares for this Python is what it runs with here
    r = _run([bin_ / "python", "-c", UNMET], work, tmp_path)
    assert r.stdout.split() == ["declared:", "torch", "triton"], r.stdout

    # 2 training steps of a model from the user's own config dir, configs from the package
    r = _run(
        [bin_ / "ufp4-train", "--config-dir", tmp_path / "mycfg", "model=mine", *TRAIN],
        work,
        tmp_path,
    )
    (run_dir,) = (work / "runs" / "default").glob("mine-ufp4-s1234-*")
    assert [line.split()[1] for line in r.stdout.splitlines() if line.startswith("step")] == [
        "1",
        "2",
    ]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "data-cache").is_dir()  # ${hydra:run.dir} resolved into the run's dir

    r = _run(
        [
            bin_ / "ufp4-describe",
            "model=moe_7p9b",
            "parallel.tp=2",
            "parallel.ep=8",
            "parallel.dp=8",
        ],
        work,
        tmp_path,
    )
    assert "total_params: 7910017024" in r.stdout
    r = _run(
        [
            bin_ / "ufp4-describe",
            "--config-dir",
            tmp_path / "mycfg",
            "model=mine",
            "train.seq_len=64",
        ],
        work,
        tmp_path,
    )
    assert "model: mine" in r.stdout

    # the sweep plan submits the installed package's Slurm script, which finds torchrun.sh
    r = _run(
        [bin_ / "ufp4-launch", "compare", "--out", work / "sweep", "--dry-run", "--", "model=tiny"],
        work,
        tmp_path,
    )
    sbatch = Path(where).parent / "scripts" / "slurm.sbatch"
    assert f" {sbatch} " in r.stdout.splitlines()[0]
    assert sbatch.is_file() and (sbatch.parent / "torchrun.sh").is_file()
    r = _run(["bash", sbatch.parent / "torchrun.sh", "--help"], work, tmp_path)
    assert "--nproc-per-node" in r.stdout


TORCH = "torch==2.13.0"  # scripts/install.sh's pin: the CPU build where a CPU index is set up


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.timeout(1800)
def test_wheel_installs_its_own_dependencies_and_trains(tmp_path):
    """A fresh venv with pip and nothing else: torch first (README: a CPU machine installs it
    before the package), then the wheel with its declared dependencies resolved by pip from
    the registries, then on Python 3.11 megatron-core by the documented --no-deps step; the
    trainer then runs 2 steps from outside the checkout. About 3-6 minutes (triton alone is
    ~640 MB installed)."""
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", venv], tmp_path, tmp_path)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, TORCH], tmp_path, tmp_path, timeout=900)
    _run([*pip, wheel], tmp_path, tmp_path, timeout=900)
    if sys.version_info < (3, 12):
        _run(
            [*pip, "--no-deps", "--ignore-requires-python", "megatron-core==0.19.2"],
            tmp_path,
            tmp_path,
        )
    r = _run([venv / "bin" / "python", "-c", UNMET], tmp_path, tmp_path)
    assert r.stdout.split() == ["declared:", "torch", "triton"], r.stdout
    _run([venv / "bin" / "python", "-m", "pip", "check"], tmp_path, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    r = _run([venv / "bin" / "ufp4-train", "model=tiny", *TRAIN], work, tmp_path)
    assert [line.split()[1] for line in r.stdout.splitlines() if line.startswith("step")] == [
        "1",
        "2",
    ]
    where = _run(
        [
            venv / "bin" / "python",
            "-c",
            "import ufp4_megatron, megatron.core as m; "
            "print(ufp4_megatron.__file__, m.__version__)",
        ],
        work,
        tmp_path,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(venv) and where[1].startswith("0.19.2"), where
