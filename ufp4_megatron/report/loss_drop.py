"""When a run passes the sudden drop in loss that study11m's training goes through.

On the pysrc corpus every study11m run's training loss falls quickly from about 1.18 to about
0.90 nats per byte somewhere after step 300 (BF16 included); the step varies from run to run.
A run that passes it earlier than its comparison run is ahead by up to ~10 points of loss
mid-run and relaxes afterwards, so differences in that timing carry into the end-of-run gap.

    drop_step(loss)   the first step (after `after`) at which the loss, averaged over a centred
                      window of `width` steps, is below `level` (the middle of 1.18 and 0.90);
                      None if it never is
    r_squared(x, y)   the share of the variance of y a straight line in x explains
"""

from __future__ import annotations

import numpy as np

LEVEL = 1.04  # nats per byte: halfway down the drop
WIDTH = 25  # steps in the moving average (a single step's loss is noisy)
AFTER = 100  # the warm-up's steep early descent is not the drop


def drop_step(
    loss: np.ndarray, level: float = LEVEL, width: int = WIDTH, after: int = AFTER
) -> int | None:
    """loss[i] is step i + 1's. The returned step is the centre of the first window below."""
    x = np.asarray(loss, dtype=float)
    if len(x) < width + after:
        return None
    mean = np.convolve(x, np.ones(width) / width, mode="valid")  # mean[i]: steps i+1..i+width
    below = np.nonzero(mean[after:] < level)[0]
    return None if below.size == 0 else int(below[0] + after + width // 2 + 1)


def r_squared(x, y) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    r = np.corrcoef(x, y)[0, 1]
    return float(r * r)
