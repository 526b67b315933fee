"""Loss gap against tokens, one line per recipe (per model and seed)."""
from __future__ import annotations

from pathlib import Path

from .gap import GapRow
from .runs import Run


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average: single-step gaps are noisy, their trend is the signal."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_gaps(rows: list[GapRow], runs: list[Run], path: Path, smooth: int = 1) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    tokens = {(r.model, r.seed, r.recipe): r.tokens for r in runs}
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        steps = sorted(row.series)
        tok = tokens[row.model, row.seed, row.recipe]
        x = [tok.get(s, s) for s in steps]
        y = [100 * v for v in _smooth([row.series[s] for s in steps], smooth)]
        ax.plot(x, y, label=f"{row.recipe} ({row.model}, seed {row.seed})")
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xlabel("tokens")
    smoothed = f", mean of {smooth} steps" if smooth > 1 else ""
    ax.set_ylabel("(L - L_bf16) / L_bf16  [%]" + smoothed)
    ax.set_title("BF16-relative training-loss gap")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
