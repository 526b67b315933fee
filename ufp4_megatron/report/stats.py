"""Confidence intervals over seeds: a mean (Student t), a ratio of paired means (Fieller), a
difference of paired means (paired t) and a difference of unpaired means (Welch).

Each seed gives one number per recipe (its mean BF16-relative gap over the latest steps), and
the seeds are independent draws of the same experiment: the t-interval is the textbook answer
for their mean at the 3-10 seeds a study affords, exact when the per-seed values are normal.

The paper's "gap reduction" is 1 - gap_x / gap_e2m1, a ratio of two means measured on the same
seeds (same data order, same initial weights), so the two are correlated. Fieller's interval
for rho = E[x] / E[y] inverts the paired t-test of x_i - rho * y_i = 0: it uses that
correlation, is exact under normality like the t-interval beside it, is deterministic (no
resampling seed), and, unlike the delta method, says when no finite interval exists: when
E2M1's own gap is not resolved (its t-interval contains zero) the set of plausible ratios is
unbounded. A bootstrap over 3-8 seeds would be neither exact nor honest about that case (its
percentile intervals are too narrow at small n), which is why it is not used here.

The ratio's interval is wide whenever the baseline's gap is small against its spread (at
11M parameters, E2M1's gap of ~2.5% with a seed-to-seed sd of ~2 points gives reductions
like [-97%, +108%]), and it says nothing about the sign of the effect that the difference
does not say better: the paired difference gap_x - gap_y per seed, in points, with the
paired t-interval and its p-value, is the well-behaved statistic of the same question
("does x have a smaller gap than the baseline on the same seeds?").

When a recipe and its baseline were completed on different seeds (a round cut short), the
pairs are few and Fieller's interval over them says little; Welch's interval for the
difference of the two means uses every seed of each, not paired. The runs of a seed share
their BF16 reference, which correlates the two gaps positively, so ignoring the pairing makes
that interval wider than it would be, not narrower.

The t-interval, the paired t-test and Welch's interval are scipy.stats' (`ttest_1samp`,
`ttest_rel`, `ttest_ind(equal_var=False)` and their `confidence_interval`); what this module
adds is the cases scipy answers with NaN, each with its exact answer: one value (no interval),
values that are all equal (the interval is the mean itself, p 0 or 1). Fieller's interval,
which scipy lacks, is written out below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student-t critical value: P(|T_df| <= t) = confidence."""
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def _check(values, confidence: float) -> list[float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}; must be between 0 and 1")
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no values")
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"non-finite value among {vals}")
    return vals


@dataclass(frozen=True)
class Interval:
    """Mean of n values and its two-sided confidence interval (lo, hi None when n = 1)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def resolved(self) -> bool:
        """The interval excludes zero (a single value never resolves anything)."""
        return self.lo is not None and (self.lo > 0 or self.hi < 0)


def _constant(vals) -> bool:
    return all(v == vals[0] for v in vals)


def t_interval(values, confidence: float = 0.95) -> Interval:
    """mean +- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample standard deviation (ddof 1):
    scipy.stats.ttest_1samp(values, 0).confidence_interval(confidence)."""
    from scipy.stats import ttest_1samp

    vals = _check(values, confidence)
    n = len(vals)
    mean = sum(vals) / n
    if n == 1:
        return Interval(mean, None, None, 1)
    if _constant(vals):  # s = 0: scipy gives NaN; the mean is known exactly
        return Interval(mean, mean, mean, n)
    ci = ttest_1samp(vals, 0.0).confidence_interval(confidence)
    return Interval(mean, float(ci.low), float(ci.high), n)


@dataclass(frozen=True)
class Ratio:
    """rho = mean(x) / mean(y) over paired values, with Fieller's interval.

    bounded False: the confidence set is not a finite interval (lo, hi None), which happens
    exactly when mean(y) is not distinguishable from zero at this confidence.
    """

    ratio: float | None  # None when mean(y) == 0
    lo: float | None
    hi: float | None
    n: int

    @property
    def bounded(self) -> bool:
        return self.lo is not None

    def excludes(self, value: float) -> bool:
        return self.bounded and (self.lo > value or self.hi < value)


def fieller_ratio(x, y, confidence: float = 0.95) -> Ratio:
    """Fieller's interval for mean(x) / mean(y) from n pairs (x_i, y_i).

    The set {rho : |mean(d)| <= t * sd(d) / sqrt(n)} with d_i = x_i - rho * y_i, t the
    Student-t quantile with n - 1 degrees of freedom. Squared, with q = t^2 / n and the sample
    (co)variances s_xx, s_xy, s_yy (ddof 1), it is a * rho^2 - 2 b * rho + c <= 0 with
        a = ybar^2 - q s_yy,   b = xbar ybar - q s_xy,   c = xbar^2 - q s_xx,
    an interval [(b - sqrt(b^2 - ac)) / a, (b + sqrt(b^2 - ac)) / a] when a > 0, i.e. when
    |ybar| / (s_y / sqrt(n)) > t; otherwise unbounded.
    """
    xs, ys = _check(x, confidence), _check(y, confidence)
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values: pairs needed")
    n = len(xs)
    xbar, ybar = sum(xs) / n, sum(ys) / n
    ratio = xbar / ybar if ybar != 0 else None
    if n == 1:
        return Ratio(ratio, None, None, 1)
    sxx = sum((v - xbar) ** 2 for v in xs) / (n - 1)
    syy = sum((v - ybar) ** 2 for v in ys) / (n - 1)
    sxy = sum((u - xbar) * (v - ybar) for u, v in zip(xs, ys)) / (n - 1)
    q = t_quantile(confidence, n - 1) ** 2 / n
    a, b, c = ybar**2 - q * syy, xbar * ybar - q * sxy, xbar**2 - q * sxx
    if a <= 0:
        return Ratio(ratio, None, None, n)
    root = math.sqrt(max(b * b - a * c, 0.0))  # >= 0 when a > 0 (rho = xbar/ybar is inside)
    return Ratio(ratio, (b - root) / a, (b + root) / a, n)


def paired_difference(
    x, y, confidence: float = 0.95
) -> tuple[Interval, float | None, float | None]:
    """mean(x_i - y_i) over n pairs with the paired t-interval (t_interval of the
    differences), the two-sided p-value of the paired t-test of a zero mean difference (None
    for one pair; 0 or 1 when every difference is the same, nonzero or zero), and the
    differences' sample standard deviation (None for one pair): scipy.stats.ttest_rel."""
    import numpy as np
    from scipy.stats import ttest_rel

    xs, ys = _check(x, confidence), _check(y, confidence)
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values: pairs needed")
    d = [u - v for u, v in zip(xs, ys)]
    n, mean = len(d), sum(d) / len(d)
    if n == 1:
        return Interval(mean, None, None, 1), None, None
    if _constant(d):  # every difference the same: known exactly, scipy gives NaN
        return Interval(mean, mean, mean, n), 0.0 if mean != 0 else 1.0, 0.0
    res = ttest_rel(xs, ys)
    ci = res.confidence_interval(confidence)
    sd = float(np.std(d, ddof=1))
    return Interval(mean, float(ci.low), float(ci.high), n), float(res.pvalue), sd


MOST_SEEDS = 10_000  # seeds_for_power looks no further


def seeds_for_power(
    diff: float, sd: float, power: float = 0.8, confidence: float = 0.95, most: int = MOST_SEEDS
) -> int | None:
    """The fewest pairs n at which a paired t-test at `confidence` (two-sided) detects a true
    mean difference `diff` with probability `power`, when the differences have standard
    deviation `sd`: the noncentral t with n - 1 dof and noncentrality diff / (sd / sqrt n).
    None when diff or sd is 0, or when more than `most` pairs would be needed. A planning
    number for the next study, not a result of this one."""
    from scipy.stats import nct, norm, t

    if not 0 < power < 1:
        raise ValueError(f"power={power}; must be between 0 and 1")
    _check([diff, sd], confidence)
    if diff == 0 or sd == 0:
        return None
    alpha = 1 - confidence
    # the normal approximation, which the t-based answer never undercuts, is where to start
    z = (norm.ppf(1 - alpha / 2) + norm.ppf(power)) * sd / abs(diff)
    n = max(2, math.floor(z * z))
    while n <= most:
        crit = t.ppf(1 - alpha / 2, n - 1)
        ncp = abs(diff) / (sd / math.sqrt(n))
        if nct.sf(crit, n - 1, ncp) + nct.cdf(-crit, n - 1, ncp) >= power:
            return n
        n += 1
    return None


def welch_difference(x, y, confidence: float = 0.95) -> Interval:
    """mean(x) - mean(y) from independent samples, with Welch's interval: half width
    t_{(1+c)/2, df} * se, se^2 = s_x^2 / n_x + s_y^2 / n_y, df by Welch-Satterthwaite
    se^4 / ((s_x^2 / n_x)^2 / (n_x - 1) + (s_y^2 / n_y)^2 / (n_y - 1)):
    scipy.stats.ttest_ind(x, y, equal_var=False).confidence_interval(confidence). No interval
    (lo, hi None) unless both samples have 2 values or more; n is n_x + n_y."""
    from scipy.stats import ttest_ind

    xs, ys = _check(x, confidence), _check(y, confidence)
    nx, ny = len(xs), len(ys)
    diff = sum(xs) / nx - sum(ys) / ny
    if nx < 2 or ny < 2:
        return Interval(diff, None, None, nx + ny)
    if _constant(xs) and _constant(ys):  # se = 0: the difference is known exactly
        return Interval(diff, diff, diff, nx + ny)
    ci = ttest_ind(xs, ys, equal_var=False).confidence_interval(confidence)
    return Interval(diff, float(ci.low), float(ci.high), nx + ny)


def t_band(rows, confidence: float = 0.95):
    """Pointwise t-interval over seeds: rows is (n_seeds, n_points); returns mean, lo, hi
    arrays (lo = hi = mean for one seed or a column of equal values). t_interval per column,
    through the same scipy.stats.ttest_1samp."""
    import numpy as np
    from scipy.stats import ttest_1samp

    a = np.asarray(rows, dtype=float)
    mean = a.mean(axis=0)
    if a.shape[0] == 1:
        return mean, mean.copy(), mean.copy()
    constant = (a == a[0]).all(axis=0)
    # a column of equal values has no spread (scipy: NaN and a warning): any non-constant
    # stand-in goes to scipy, and the band there is the mean itself
    stand_in = np.where(constant, (np.arange(a.shape[0]) % 2)[:, None], a)
    ci = ttest_1samp(stand_in, 0.0, axis=0).confidence_interval(confidence)
    return mean, np.where(constant, mean, ci.low), np.where(constant, mean, ci.high)
