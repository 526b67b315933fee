"""loss_gap.png: the gap against tokens, one panel per model and one line per recipe: the mean
over seeds with its pointwise confidence band, and the latest-N window of the table shaded."""

from __future__ import annotations

from pathlib import Path

from .gap import Comparison
from .stats import t_band
from .summary import RecipeSummary


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average: single-step gaps are noisy, their trend is the signal."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def seed_curves(cmp: Comparison, s: RecipeSummary, smooth: int = 1):
    """x (tokens, or steps where tokens were not logged) and one smoothed gap row per seed,
    on the model's common steps."""
    steps = cmp.windows[s.model].common
    tokens = s.seeds[0].run.tokens
    x = [tokens.get(st, st) for st in steps]
    return x, [_smooth([g.series[st] for st in steps], smooth) for g in s.seeds]


def pyplot():
    """matplotlib.pyplot on the Agg backend: the report writes files, never needs a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int) -> Path:
    """Lays out, writes (making its folder) and closes a report figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_gaps(
    cmp: Comparison,
    summaries: list[RecipeSummary],
    path: Path,
    smooth: int = 1,
    confidence: float = 0.95,
) -> Path:
    plt = pyplot()

    models = list(cmp.windows)
    fig, axes = plt.subplots(len(models), 1, figsize=(7.5, 3.8 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        w = cmp.windows[model]
        x_of = {}
        for s in (s for s in summaries if s.model == model):
            x, rows = seed_curves(cmp, s, smooth)
            mean, lo, hi = t_band(rows, confidence)
            x_of = dict(zip(w.common, x))
            n = len(s.seeds)
            (line,) = ax.plot(x, 100 * mean, label=f"{s.recipe} ({n} seed{'s' * (n > 1)})")
            if n > 1:
                ax.fill_between(x, 100 * lo, 100 * hi, color=line.get_color(), alpha=0.2, lw=0)
        if x_of:
            ax.axvspan(
                x_of[w.steps[0]],
                x_of[w.steps[-1]],
                color="gray",
                alpha=0.12,
                label=f"mean window: steps {w.first}-{w.last_common}",
            )
        ax.axhline(0.0, color="gray", lw=0.8)
        ax.set_xlabel("tokens")
        smoothed = f", {smooth}-step mean" if smooth > 1 else ""
        ax.set_ylabel(f"gap vs BF16 [%]{smoothed}")
        ax.set_title(f"{model}: (L - L_bf16) / L_bf16, mean over seeds, {confidence:.0%} band")
        ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=120)
