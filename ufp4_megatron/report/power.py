"""Power of a two-sided t-test, for planning a study before it runs.

A test of a mean difference whose estimate has standard error `se` on `df` degrees of freedom
rejects at level alpha when |t| > t_{1 - alpha/2, df}; when the true difference is `diff`,
t follows the noncentral t with noncentrality diff / se. For n paired seeds with
differences of standard deviation sd, se = sd / sqrt(n) and df = n - 1.

    power(diff, se, df, alpha)            probability of rejecting
    detectable(se, df, alpha, power)      the true difference rejected with that probability
    paired_power(diff, sd, n, alpha)      power(diff, sd / sqrt(n), n - 1, alpha)
"""

from __future__ import annotations

import math


def power(diff: float, se: float, df: float, alpha: float = 0.05) -> float:
    from scipy.stats import nct, t

    if not (se > 0 and df > 0 and 0 < alpha < 1):
        raise ValueError(
            f"power: se={se}, df={df}, alpha={alpha}; need se > 0, df > 0, 0 < alpha < 1"
        )
    crit = t.ppf(1 - alpha / 2, df)
    ncp = abs(diff) / se
    return float(nct.sf(crit, df, ncp) + nct.cdf(-crit, df, ncp))


def detectable(se: float, df: float, alpha: float = 0.05, target: float = 0.8) -> float:
    """The smallest |difference| detected with probability `target` (power is increasing in
    |difference|: a root of power - target)."""
    if not 0 < target < 1:
        raise ValueError(f"detectable: power {target} must be between 0 and 1")
    from scipy.optimize import brentq

    hi = se
    while power(hi, se, df, alpha) < target:
        hi *= 2
    return float(brentq(lambda d: power(d, se, df, alpha) - target, 0.0, hi, xtol=1e-9 * se))


def paired_power(diff: float, sd: float, n: int, alpha: float = 0.05) -> float:
    if n < 2:
        raise ValueError(f"paired_power: n={n}; a paired t-test needs 2 pairs or more")
    return power(diff, sd / math.sqrt(n), n - 1, alpha)
