"""Diagnostics reproduce the paper's qualitative claims on synthetic data.

Contracts (4096x1024 would be the paper's size; 1024x512 keeps the suite fast while the
effects stay many standard errors wide):
- E2M1 shrinks Gaussian data (alpha < 1); E1M2 and INT4 do not (alpha >= 1 - 1e-4);
- RHT16 lowers E2M1's SQNR and raises E1M2's on Student-t(3) data;
- E2M1's levels 2 and 4 carry negative mean rounding error (Shrinkage Bias); a uniform
  grid's interior levels do not;
- bucket ratio in [1/K, 1]; sqnr/attenuation on known inputs.
"""

import math

import torch

from ufp4_megatron.quant import diagnostics as d


def test_attenuation_and_sqnr_on_known_inputs():
    x = torch.ones(100, dtype=torch.float64)
    assert abs(d.attenuation(x, 0.9 * x) - 0.9) < 1e-12
    assert abs(d.sqnr(x, 1.1 * x) - 20.0) < 1e-9
    assert d.sqnr(x, x) == math.inf


def test_e2m1_shrinks_gaussian_data_uniform_grids_do_not():
    x = d.sample("gaussian", (1024, 512), seed=1)
    a_e2m1 = d.quant_stats(x, "e2m1")["alpha"]
    assert a_e2m1 < 0.998
    for g in ("e1m2", "int4"):
        assert d.quant_stats(x, g)["alpha"] > 0.9999


def test_rht_lowers_e2m1_sqnr_and_raises_e1m2_sqnr_on_student_t():
    x = d.sample("student_t3", (1024, 512), seed=2)
    assert d.delta_sqnr(x, "e2m1") < -0.3
    assert d.delta_sqnr(x, "e1m2") > 2.0
    assert d.delta_sqnr(x, "int4") > 2.0


def test_shrinkage_bias_is_negative_at_e2m1_levels_2_and_4():
    x = d.sample("gaussian", (1024, 512), seed=3)
    e = d.shrinkage_bias(x, "e2m1")
    assert e[2.0][1] < -0.05 and e[4.0][1] < -0.1
    u = d.shrinkage_bias(x, "int4")
    # uniform bins: the falling Gaussian density puts more mass below each level, so the
    # interior levels' mean error is slightly positive, never a shrinkage
    assert all(err > -0.01 for lvl, (n, err) in u.items() if 0 < lvl < 7)


def test_bucket_ratio_bounds_and_effective_bits():
    x = d.sample("student_t3", (256, 256), seed=4)
    st = d.quant_stats(x, "e1m2", rht=16)
    assert 1 / 8 <= st["bucket_ratio"] <= 1 and 0 < st["effective_bits"] <= math.log2(15)
    one = torch.zeros(100, dtype=torch.int64)
    assert d.bucket_ratio(one, "e1m2") == 1 / 8 and d.effective_bits(one) == 0


def test_table_cli_prints_each_grid_with_and_without_rht(capsys):
    d.main(["--table", "--rows", "256", "--cols", "64"])
    out = capsys.readouterr().out
    for g in ("e2m1", "e1m2", "int4"):
        assert out.count(f"| {g} |") == 4  # 2 data kinds x (none, RHT16)
