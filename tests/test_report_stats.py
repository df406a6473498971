"""trainer.report.stats: PSR and DSR on hand and published cases, the Sharpe horizon rule, bootstrap intervals, the
reality check against baselines and the interquartile mean with stratified intervals."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.report.stats import (MIN_DAYS, MIN_TRADES, deflated_sharpe, edge_vs_baselines, expected_max_sharpe,
                                  iqm, iqm_interval, pnl_summary, probabilistic_sharpe)


def test_psr_on_hand_cases():
    # skew 0, kurtosis 1 make the variance term 1: z = SR sqrt(T - 1) = 0.2 * 5 = 1, Φ(1) = 0.841345
    assert probabilistic_sharpe(0.2, 26, skew=0.0, kurt=1.0) == pytest.approx(0.841345, abs=1e-6)
    # 1 - (-2)(0.5) + (5 - 1)/4 (0.25) = 2.25 -> sqrt 1.5; z = 0.5 * 6 / 1.5 = 2, Φ(2) = 0.977250
    assert probabilistic_sharpe(0.5, 37, skew=-2.0, kurt=5.0) == pytest.approx(0.977250, abs=1e-6)
    # against its own value as the benchmark: exactly one half
    assert probabilistic_sharpe(0.3, 50, skew=0.0, kurt=3.0, sr_benchmark=0.3) == 0.5


def test_dsr_reproduces_the_numerical_example_of_bailey_and_lopez_de_prado_2014():
    # Section "A numerical example": 100 trials, variance of the annualised Sharpe across trials 1/2, the selected
    # strategy's annualised SR 2.5 over 5 years of daily returns (T = 1250, 250 days a year), skew -3, kurtosis
    # 10. The paper: E[max SR] = 0.1132 (non-annualised) and DSR = 0.9004.
    sr0 = expected_max_sharpe(100, 0.5 / 250)
    assert sr0 == pytest.approx(0.1132, abs=5e-5)
    assert deflated_sharpe(2.5 / math.sqrt(250), 1250, skew=-3.0, kurt=10.0, n_trials=100,
                           sr_var=0.5 / 250) == pytest.approx(0.9004, abs=5e-4)
    # one trial: nothing selected, the DSR is the PSR against 0
    assert expected_max_sharpe(1, 0.5) == 0.0
    with pytest.raises(ValueError, match="n_trials"):
        expected_max_sharpe(0, 0.5)


def test_more_trials_deflate_more():
    d = [deflated_sharpe(0.1, 500, 0.0, 3.0, n, 1 / 499) for n in (1, 10, 100, 1000)]
    assert d[0] > d[1] > d[2] > d[3] and d[0] > 0.98 and d[3] < 0.5


def test_sharpe_is_withheld_below_the_horizon_rule_and_shown_with_an_interval_above_it():
    rng = np.random.default_rng(0)
    few = pnl_summary(rng.normal(5, 10, MIN_TRADES - 1), "trade")
    assert few["sharpe"] is None and few["sharpe_ci"] is None and "29 trades < 30" in few["sharpe_note"]
    assert few["mean_ci"] is not None  # the mean still gets its interval
    x = rng.normal(5, 10, 400)
    s = pnl_summary(x, "trade")
    assert s["sharpe"] == pytest.approx(x.mean() / x.std(ddof=1)) and not s["annualised"]
    lo, hi = s["sharpe_ci"]
    assert lo < s["sharpe"] < hi and hi - lo == pytest.approx(2 * 1.96 / math.sqrt(400), rel=0.25)
    assert s["mean_ci"][0] < 5 < s["mean_ci"][1]
    days = pnl_summary(rng.normal(1, 1, MIN_DAYS), "day")  # annualised by sqrt(252) only at the day horizon
    assert days["annualised"] and days["sharpe_ci"][0] < days["sharpe"] < days["sharpe_ci"][1]
    assert pnl_summary(rng.normal(1, 1, MIN_DAYS - 1), "day")["sharpe"] is None
    three = pnl_summary([1.0, 2.0, 4.0], "day")  # too few values for any interval
    assert three["mean"] == pytest.approx(7 / 3) and three["mean_ci"] is None and three["total"] == 7.0


def test_day_sharpe_is_annualised_by_sqrt_252_on_a_hand_case():
    x = np.tile([1.0, 3.0], 10)  # mean 2, sample std sqrt(20/19)
    s = pnl_summary(x, "day")
    assert s["sharpe"] == pytest.approx(2 / math.sqrt(20 / 19) * math.sqrt(252))


def test_pnl_summary_refuses_non_finite_values():
    with pytest.raises(ValueError, match="trade PnL: every value must be finite"):
        pnl_summary([1.0, float("nan")], "trade")
    with pytest.raises(ValueError, match="horizon"):
        pnl_summary([1.0], "bar")


def test_edge_vs_baselines_finds_a_planted_edge_and_not_a_null_one():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 10, 300)
    other = rng.normal(-5, 10, 300)
    edge = edge_vs_baselines(base + 3 + rng.normal(0, 2, 300), {"ofi_rule": base, "random": other})
    assert edge["best"] == "ofi_rule" and edge["n_bars"] == 300
    lo, hi = edge["edge_ci"]
    assert lo < 3 < hi and lo > 0
    assert edge["p_value_best"] < 0.01 and edge["p_value_all"] < 0.01
    null = edge_vs_baselines(base + rng.normal(0, 2, 300), {"ofi_rule": base})
    assert null["edge_ci"][0] < 0 < null["edge_ci"][1] and null["p_value_best"] > 0.05
    worse = edge_vs_baselines(base - 3 + rng.normal(0, 2, 300), {"ofi_rule": base})
    assert worse["p_value_best"] > 0.2 and worse["edge_ci"][1] < 0
    assert edge_vs_baselines(base[:5], {"ofi_rule": base[:5]}) is None  # too few bars
    spike = np.zeros(20)
    spike[3] = 5.0  # one lucky bar of 20: no interval, no test (the bootstrap once gave p 0.045 here)
    few = edge_vs_baselines(spike, {"flat": np.zeros(20), "same": spike})
    assert few["baselines"]["flat"]["spa_p_value"] is None and few["baselines"]["flat"]["edge_ci"] is None
    assert few["baselines"]["same"]["spa_p_value"] == 1.0 and few["p_value_all"] is None
    with pytest.raises(ValueError, match="paired"):
        edge_vs_baselines(base, {"flat": base[:-1]})


def test_iqm_on_hand_arrays():
    assert iqm(np.arange(1.0, 9.0)) == 4.5  # middle four of 1..8: 3, 4, 5, 6
    assert iqm([0, 0, 1, 1, 1, 1, 100, 100]) == 1.0  # the outliers are cut
    with pytest.raises(ValueError, match="no values"):
        iqm([])


def test_iqm_interval_resamples_within_folds():
    # stratified: every resample keeps four runs of fold 0 (all 0) and four of fold 1 (all 10), so the IQM of every
    # resample is 5 and the interval has no width; a pooled iid bootstrap would vary
    s = iqm_interval([[0, 0, 0, 0], [10, 10, 10, 10]])
    assert s["iqm"] == 5.0 and s["ci"] == [5.0, 5.0] and s["n_runs"] == 8 and s["n_strata"] == 2
    rng = np.random.default_rng(2)
    s = iqm_interval([rng.normal(1, 1, 5) for _ in range(4)])
    assert s["ci"][0] < s["iqm"] < s["ci"][1] and s["ci"][0] < 1 < s["ci"][1]
    assert iqm_interval([[3.0], [5.0]])["ci"] is None  # one seed per fold: no spread over seeds
