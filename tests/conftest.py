import os

import pytest

# W&B never reaches the network from tests; runs that log go offline into temp dirs.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="module")
def hydra_configs():
    """One Hydra context over the package's configs for a whole module (composing is then
    milliseconds): `pytestmark = pytest.mark.usefixtures("hydra_configs")`."""
    from _hydra_configs import package_configs

    with package_configs():
        yield
