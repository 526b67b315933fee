import os

import pytest

# W&B never reaches the network from tests; runs that log go offline into temp dirs.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="module")
def hydra_configs():
    """One Hydra context over the package's configs for a whole module (composing is then
    milliseconds): `pytestmark = pytest.mark.usefixtures("hydra_configs")`."""
    from ufp4_megatron.train.overrides import training_configs

    with training_configs():
        yield
