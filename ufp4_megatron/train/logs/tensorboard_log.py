"""TensorBoard beside W&B: `logging.tensorboard=true` writes the logged steps' scalars to
<run dir>/tensorboard (torch.utils.tensorboard; needs the `tensorboard` package), x = step,
so `tensorboard --logdir runs/` shows every run. A resumed run appends to the same dir.
"""

from __future__ import annotations

import math
from pathlib import Path

MISSING = (
    "logging.tensorboard=true needs the tensorboard package, which is not installed: "
    "`pip install tensorboard`, or drop logging.tensorboard"
)


def problem() -> str | None:
    """Why logging.tensorboard=true cannot run here (checked before anything is written)."""
    try:
        import torch.utils.tensorboard  # noqa: F401 - imports `tensorboard` itself
    except ImportError:
        return MISSING
    return None


class TensorBoard:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, record: dict) -> None:
        step = record["step"]
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
