"""The wheel's declared dependencies: what `pip install ufp4-megatron` chooses, per Python.

    test_megatron_core_range_is_the_one_accepted_at_import   pyproject's megatron-core range
                                                             admits exactly the versions
                                                             ufp4_megatron.megatron accepts,
                                                             for Python >= 3.12 only; install.sh
                                                             and wheelhouse.sh pin the same one
    test_wheel_resolves_with_megatron_core_0_19              pip resolves the built wheel
                                                             against the registries for Python
                                                             3.12 (megatron-core 0.19.x, torch,
                                                             triton, everything declared) and
                                                             3.11 (everything but megatron-core,
                                                             whose documented --no-deps install
                                                             then finds its own dependencies)

How the resolve runs from this machine's Python for another one: `pip install --dry-run --report`
with `--python-version`, `--only-binary=:all:` and the manylinux platforms of a glibc 2.28 Linux
x86_64 node (nothing is downloaded beyond metadata), by a pip >= 24 in a venv of its own (older
ones check Requires-Python against the Python they run on). Two stand-ins, both for limits of
pip, not of the package: pip evaluates environment markers against the Python it runs on, not
the target, so the requirements whose markers hold for the target Python are also passed
explicitly (with the wheel, so pip must satisfy them together); and antlr4-python3-runtime 4.9.3
(hydra-core's pin) is published as an sdist only, so its wheel is built first and offered
through --find-links. The three resolves run at once: 40-90 s, mostly waiting on the registry.
Offline, deselect it with -m "not network".
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, run_env
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from test_wheel_install import _build_wheel

# read without importing ufp4_megatron.megatron (which imports megatron.core: seconds)
_spec = importlib.util.spec_from_file_location(
    "_mcore_version", ROOT / "ufp4_megatron" / "megatron" / "_version.py"
)
_version = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_version)
MEGATRON_CORE_VERSION, SUPPORTED_MEGATRON_CORE = (
    _version.MEGATRON_CORE_VERSION,
    _version.SUPPORTED_MEGATRON_CORE,
)

# a glibc 2.28 Linux x86_64 node: pip does not widen a manylinux_2_28 tag to older glibcs itself
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 29)] + ["manylinux2014_x86_64"]
ANTLR = "antlr4-python3-runtime==4.9.3"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    return [Requirement(r) for r in _project()["dependencies"]]


def _environment(python: str) -> dict:
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0")
    return env


def _holds(req: Requirement, python: str) -> bool:
    return req.marker is None or req.marker.evaluate(_environment(python))


def test_megatron_core_range_is_the_one_accepted_at_import():
    assert _project()["requires-python"] == ">=3.11"
    (mcore,) = [r for r in _requirements() if r.name == "megatron-core"]
    candidates = ["0.16.1", "0.19.0", "0.19.1", "0.19.2", "0.19.3", "0.20.0", "1.0.0"]
    assert [v for v in candidates if mcore.specifier.contains(v)] == list(SUPPORTED_MEGATRON_CORE)
    # declared where pip can install it (0.19 says Requires-Python >= 3.12), not on 3.11
    assert [p for p in ("3.11", "3.12", "3.13") if _holds(mcore, p)] == ["3.12", "3.13"]
    # the other declared requirements hold on every supported Python
    assert all(
        _holds(r, p) for r in _requirements() if r.name != "megatron-core" for p in ("3.11", "3.12")
    )
    names = {r.name for r in _requirements()}
    assert {"torch", "triton", "hydra-core", "omegaconf", "wandb", "tqdm", "scipy"} <= names
    extras = _project()["optional-dependencies"]
    assert {Requirement(r).name for r in extras["slurm"]} == {"submitit", "hydra-submitit-launcher"}
    assert [Requirement(r).name for r in extras["te"]] == ["transformer-engine"]
    # the scripts that install megatron-core by hand pin the version the package is written for
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert f"MEGATRON_VERSION={MEGATRON_CORE_VERSION}\n" in install
    assert (
        f"megatron-core=={MEGATRON_CORE_VERSION}"
        in (ROOT / "scripts" / "wheelhouse.sh").read_text()
    )


def _pip(args: list, tmp: Path, python=sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", *map(str, args)],
        env=run_env(tmp),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _resolver(tmp: Path) -> Path:
    """A Python with pip >= 24 in a venv of its own: older pips check Requires-Python against the
    running Python instead of --python-version (pip install --dry-run)."""
    venv = tmp / "pip-venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    python = venv / "bin" / "python"
    r = _pip(["install", "--quiet", "pip>=24"], tmp, python)
    assert r.returncode == 0, r.stderr[-3000:]
    return python


def _resolve(
    tmp: Path, pip_python: Path, label: str, python: str, targets: list, *options: str
) -> list[dict]:
    """The metadata of what `pip install` would install for `python` (pip's report)."""
    report = tmp / f"report-{label}.json"
    platform = [a for p in PLATFORMS for a in ("--platform", p)]
    r = _pip(
        [
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            report,
            "--python-version",
            python,
            "--implementation",
            "cp",
            *platform,
            "--target",
            tmp / f"target-{python}",
            *options,
            *targets,
        ],
        tmp,
        pip_python,
    )
    said = "\n".join(line for line in r.stderr.splitlines() if "is ignored" not in line)
    assert r.returncode == 0, (
        f"pip could not resolve {targets} for Python {python} (is the "
        f"package registry reachable?):\n{said[-3000:]}"
    )
    return [i["metadata"] for i in json.loads(report.read_text())["install"]]


def _versions(metadata: list[dict]) -> dict[str, str]:
    return {canonicalize_name(m["name"]): m["version"] for m in metadata}


@pytest.mark.network
@pytest.mark.timeout(600)
def test_wheel_resolves_with_megatron_core_0_19(tmp_path):
    links = tmp_path / "links"
    with ThreadPoolExecutor(3) as pool:
        built = pool.submit(_build_wheel, tmp_path)
        venv = pool.submit(_resolver, tmp_path)
        r = _pip(["wheel", "--quiet", "--no-deps", "-w", links, ANTLR], tmp_path)
        wheel, pip_python = built.result(), venv.result()
    assert r.returncode == 0, r.stderr[-3000:]
    binary = ["--only-binary=:all:", "--find-links", links]

    def full(python: str) -> dict[str, str]:
        marked = [str(r) for r in _requirements() if r.marker is not None and _holds(r, python)]
        return _versions(
            _resolve(
                tmp_path,
                pip_python,
                python,
                python,
                [wheel, *[re.sub(r";.*", "", m) for m in marked]],
                *binary,
            )
        )

    with ThreadPoolExecutor(3) as pool:
        # the documented Python 3.11 step (README, Install)
        by_hand = pool.submit(
            _resolve,
            tmp_path,
            pip_python,
            "mcore-3.11",
            "3.11",
            [f"megatron-core=={MEGATRON_CORE_VERSION}"],
            "--no-deps",
            "--ignore-requires-python",
        )
        on312, on311 = pool.map(full, ["3.12", "3.11"])
        (meta,) = by_hand.result()

    declared = {canonicalize_name(r.name) for r in _requirements()}
    assert on312["ufp4-megatron"] == on311["ufp4-megatron"]
    assert on312["megatron-core"] in SUPPORTED_MEGATRON_CORE, on312.get("megatron-core")
    assert on312["megatron-core"].startswith("0.19.")
    assert declared <= set(on312), declared - set(on312)
    assert Version(on312["torch"]) >= Version("2.11") and Version(on312["triton"]) >= Version("3.6")
    # on 3.11 pip cannot take megatron-core 0.19 (Requires-Python >= 3.12) and is not asked to
    assert "megatron-core" not in on311
    assert declared - {"megatron-core"} <= set(on311), declared - set(on311)
    assert (meta["name"], meta["version"]) == ("megatron-core", MEGATRON_CORE_VERSION)
    # megatron-core's own runtime requirements are among what the wheel brings on 3.11
    needs = {
        canonicalize_name(Requirement(r).name)
        for r in meta.get("requires_dist", [])
        if "extra ==" not in r
    }
    assert needs and needs <= set(on311), needs - set(on311)
