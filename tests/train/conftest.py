"""The trainer's CPU tests run it as CI does, on the CPU: every process a test here starts
(trainers, torchrun, converters) sees no GPU, so on a GPU node `pytest tests/train` checks
what `make test` checks (the trainer refuses train.device=cpu where CUDA is visible, and a
GPU run prints MFU, picks NCCL and sizes the weight cache by the GPU's memory). The GPU runs
of the trainer are tests/gpu's. Module-scoped and autouse, so it is in place before the
module fixtures that train once for several tests."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def _subprocesses_see_no_gpu():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        yield
