"""Many arms compared on the same seeds: one pooled two-way model, contrasts, Holm's correction.

An ablation trains A arms on the same S seeds. Comparing arms two at a time, each with its own
paired t-test, estimates the noise from S - 1 degrees of freedom per pair, and among many
pairs one lands in the lowest tail of its spread by chance: a 4-seed paired p = 0.0044 rested
on a paired SD in the lowest decile of the 66 pairwise SDs of its arms. The pooled model
estimates one residual variance from every arm and seed at once:

    y[a, s] = mu[a] + beta[s] + e[a, s],   e ~ N(0, sigma^2) independent

(arm effects mu, seed effects beta: the seed's data order and initial weights, shared by every
arm), fitted by least squares, sigma^2 = RSS / (N - rank) with N - rank degrees of freedom
((A - 1)(S - 1) when every arm has every seed). A contrast mu[a] - mu[b] is estimated with
the standard error from the fit and tested with Student t on those degrees of freedom. The
family's p-values are then adjusted by Holm's step-down method, which controls the
family-wise error rate at alpha for any dependence between the tests.

numpy for the fit, scipy.stats for t; missing cells (a run that failed) are allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Contrast:
    a: str  # mu[a] - mu[b]
    b: str
    estimate: float
    se: float
    df: int
    p: float  # two-sided, unadjusted
    lo: float  # two-sided interval at the confidence asked for
    hi: float
    p_holm: float | None = None  # adjusted over the family it was tested in


@dataclass(frozen=True)
class PooledFit:
    arms: list[str]
    seeds: list[int]
    coef: np.ndarray  # mu for every arm, then beta for every seed but the first
    cov_unscaled: np.ndarray  # (X^T X)^-1 (pseudo-inverse)
    sigma: float  # residual standard deviation
    df: int  # residual degrees of freedom
    n: int  # observations used

    def contrast(self, a: str, b: str, confidence: float = 0.95) -> Contrast:
        from scipy.stats import t

        if a not in self.arms or b not in self.arms:
            missing = [x for x in (a, b) if x not in self.arms]
            raise ValueError(
                f"contrast {a} - {b}: no arm {', '.join(missing)} in the fit "
                f"(arms: {', '.join(self.arms)})"
            )
        c = np.zeros(len(self.coef))
        c[self.arms.index(a)], c[self.arms.index(b)] = 1.0, -1.0
        est = float(c @ self.coef)
        se = self.sigma * math.sqrt(float(c @ self.cov_unscaled @ c))
        stat = est / se if se > 0 else math.copysign(math.inf, est) if est else 0.0
        p = float(2 * t.sf(abs(stat), self.df))
        half = float(t.ppf(0.5 + confidence / 2, self.df)) * se
        return Contrast(a, b, est, se, self.df, p, est - half, est + half)


def fit_two_way(values: dict[tuple[str, int], float]) -> PooledFit:
    """Least squares of y = mu[arm] + beta[seed] on {(arm, seed): y}; needs a residual
    degree of freedom (at least two arms on two seeds, with some seed shared)."""
    if not values:
        raise ValueError("no values to fit")
    vals = {k: float(v) for k, v in values.items()}
    if not all(math.isfinite(v) for v in vals.values()):
        raise ValueError("non-finite value among the pooled model's observations")
    arms = list(dict.fromkeys(a for a, _ in vals))  # in the order first given
    seeds = sorted({s for _, s in vals})
    keys = list(vals)
    x = np.zeros((len(keys), len(arms) + len(seeds) - 1))
    for i, (a, s) in enumerate(keys):
        x[i, arms.index(a)] = 1.0
        j = seeds.index(s)
        if j:  # the first seed's effect is absorbed by the arm means
            x[i, len(arms) + j - 1] = 1.0
    y = np.array([vals[k] for k in keys])
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - int(rank)
    if df < 1:
        raise ValueError(
            f"{len(arms)} arms x {len(seeds)} seeds ({len(y)} values) leave no "
            f"residual degree of freedom: the pooled model needs more seeds"
        )
    rss = float(((y - x @ coef) ** 2).sum())
    return PooledFit(
        arms=arms,
        seeds=seeds,
        coef=coef,
        cov_unscaled=np.linalg.pinv(x.T @ x),
        sigma=math.sqrt(rss / df),
        df=df,
        n=len(y),
    )


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest p times
    (m - i + 1), made monotone, capped at 1. Rejecting where adjusted p <= alpha keeps the
    family-wise error rate at alpha."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def family(
    fit: PooledFit, pairs: list[tuple[str, str]], confidence: float = 0.95
) -> list[Contrast]:
    """The contrasts a - b of a pre-stated family from one fit, with Holm-adjusted p."""
    cs = [fit.contrast(a, b, confidence) for a, b in pairs]
    adj = holm([c.p for c in cs])
    return [Contrast(**{**c.__dict__, "p_holm": p}) for c, p in zip(cs, adj)]
