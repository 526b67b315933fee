"""patches/ against Megatron-LM core_r0.19.0 (`make patch-check` also runs tests/megatron_lm).

- the set is numbered and every patch is documented in patches/README.md;
- each patch passes `git apply --check` on pristine files: the megatron-core 0.19.2 wheel's
  megatron/training (identical to core_r0.19.0's) always, and a Megatron-LM checkout named by
  MEGATRON_LM_DIR when given (skipped without, saying so);
- the patches touch megatron/training only: megatron/core, which megatron-core users import
  as a library, stays stock.
What the patched command line does is tested in tests/megatron_lm (through pretrain_gpt.py's
path to the model).
"""

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
WHEEL = Path(importlib.util.find_spec("megatron.core").origin).resolve().parents[2]
CHECKOUT = Path(os.environ["MEGATRON_LM_DIR"]) if os.environ.get("MEGATRON_LM_DIR") else None
TARGETS = [
    pytest.param(WHEEL, id="wheel"),
    pytest.param(
        CHECKOUT,
        id="checkout",
        marks=pytest.mark.skipif(
            CHECKOUT is None,
            reason="set MEGATRON_LM_DIR to a Megatron-LM core_r0.19.0 "
            "checkout (not committed here) to check it too",
        ),
    ),
]


def _touched(patch: Path) -> list[str]:
    return re.findall(r"^--- a/(\S+)$", patch.read_text(), re.M)


def test_patch_set_is_numbered_and_documented():
    assert PATCHES, "no patches"
    assert [p.name[:4] for p in PATCHES] == [f"{i:04d}" for i in range(1, len(PATCHES) + 1)]
    readme = (ROOT / "patches" / "README.md").read_text()
    for patch in PATCHES:
        assert patch.name in readme
        for path in _touched(patch):
            assert f"`{path}`" in readme, f"{path} ({patch.name}) is not in patches/README.md"


def test_patches_touch_megatron_training_only():
    for patch in PATCHES:
        assert all(p.startswith("megatron/training/") for p in _touched(patch)), patch.name


@pytest.mark.parametrize("root", TARGETS)
def test_patches_apply_to_pristine_files(root, tmp_path):
    for patch in PATCHES:
        for rel in _touched(patch):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, tmp_path / rel)
    for patch in PATCHES:
        res = subprocess.run(
            ["git", "apply", "--check", "--verbose", str(patch)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, f"{patch.name}: {res.stderr}"
        res = subprocess.run(
            ["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True
        )
        assert res.returncode == 0, f"{patch.name}: {res.stderr}"
