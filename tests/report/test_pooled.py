"""report/pooled.py and report/power.py: the pooled two-way model, Holm, and power, on data
with known answers.

    test_additive_data_give_the_arm_differences_exactly   no noise: contrasts exact, also
        with a missing cell (a failed run)
    test_balanced_fit_matches_the_textbook_formulas       sigma^2 = RSS / ((A-1)(S-1)),
        se = sigma * sqrt(2 / S)
    test_pooled_contrast_keeps_its_level_under_the_null   5% of null contrasts reject
    test_holm_by_hand_and_its_family_wise_level           a worked example; FWER <= 5%
    test_power_matches_simulation_and_detectable_inverts_it
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ufp4_megatron.report.pooled import family, fit_two_way, holm
from ufp4_megatron.report.power import detectable, paired_power, power


def test_additive_data_give_the_arm_differences_exactly():
    mu = {"a": 1.0, "b": 2.5, "c": -0.5}
    beta = {1: 0.0, 2: 3.0, 3: -1.0, 4: 0.25}
    y = {(a, s): mu[a] + beta[s] for a in mu for s in beta}
    y[("a", 1)] += 1e-9  # a residual degree of freedom that is not exactly zero
    fit = fit_two_way(y)
    assert fit.df == (3 - 1) * (4 - 1)
    assert fit.contrast("b", "a").estimate == pytest.approx(1.5, abs=1e-6)
    del y[("c", 2)]  # a failed run: the additive model still identifies every contrast
    fit = fit_two_way(y)
    assert fit.df == 5 and fit.contrast("c", "b").estimate == pytest.approx(-3.0, abs=1e-6)
    with pytest.raises(ValueError, match="no arm d"):
        fit.contrast("d", "a")
    with pytest.raises(ValueError, match="no residual degree of freedom"):
        fit_two_way({("a", 1): 1.0, ("b", 1): 2.0})


def test_balanced_fit_matches_the_textbook_formulas():
    rng = np.random.default_rng(0)
    a, s = 5, 6
    y = rng.normal(size=(a, s)) + rng.normal(size=s)[None, :] * 3
    fit = fit_two_way({(f"arm{i}", j): y[i, j] for i in range(a) for j in range(s)})
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    sigma = math.sqrt((resid**2).sum() / ((a - 1) * (s - 1)))
    c = fit.contrast("arm3", "arm1")
    assert fit.sigma == pytest.approx(sigma)
    assert c.estimate == pytest.approx(y[3].mean() - y[1].mean())
    assert c.se == pytest.approx(sigma * math.sqrt(2 / s))
    assert c.df == (a - 1) * (s - 1)
    assert c.lo < c.estimate < c.hi


def test_pooled_contrast_keeps_its_level_under_the_null():
    """Arms equal, seeds with large effects: a contrast's p < 0.05 about 5% of the time
    (2000 studies of 12 arms x 4 seeds: 0.05 +- 0.015 holds with ~99.8%)."""
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(2000):
        seeds = rng.normal(scale=5, size=4)
        y = {(f"a{i}", s): seeds[s] + rng.normal() for i in range(12) for s in range(4)}
        hits += fit_two_way(y).contrast("a0", "a1").p < 0.05
    assert abs(hits / 2000 - 0.05) < 0.015


def test_holm_by_hand_and_its_family_wise_level():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.9, 0.8]) == [1.0, 1.0]
    rng = np.random.default_rng(2)
    any_hit = np.mean([min(holm(list(rng.uniform(size=10)))) < 0.05 for _ in range(4000)])
    assert any_hit < 0.05 + 0.01  # independent nulls: 1 - 0.995^10 = 0.049
    y = {
        (a, s): float(s) + (3.0 if a == "x" else 0.0) + 0.1 * ((s * 7 + len(a)) % 3)
        for a in ("x", "y", "z")
        for s in range(6)
    }
    cs = family(fit_two_way(y), [("x", "y"), ("z", "y")])
    assert cs[0].p_holm == pytest.approx(min(1, 2 * cs[0].p)) and cs[0].p_holm < 0.05


def test_power_matches_simulation_and_detectable_inverts_it():
    from scipy import stats

    rng = np.random.default_rng(3)
    n, sd, diff = 28, 1.0, 0.5
    d = rng.normal(diff, sd, size=(20000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    simulated = np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1))
    assert paired_power(diff, sd, n) == pytest.approx(simulated, abs=0.015)
    assert paired_power(diff, sd, n) == pytest.approx(0.72, abs=0.01)
    m = detectable(sd / math.sqrt(n), n - 1)
    assert power(m, sd / math.sqrt(n), n - 1) == pytest.approx(0.8, abs=1e-6)
    assert power(0.0, 1.0, 10) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="need se > 0"):
        power(1.0, 0.0, 10)
