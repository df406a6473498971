"""The per-fold linear forecast column (AgentConfig.forecast_lags): lags on a hand case, an exact linear target
recovered, the fit rows as its only training data, causality of the column, the fold's inputs with and without it,
and its baseline."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.forecast import FORECAST_COLUMN, append_forecast, lagged, ridge_forecast
from trainer.features.compute import Normaliser
from trainer.folds.baselines import OfiRuleConfig, baseline_policies, ofi_rule_policy, run_baselines
from trainer.folds.evaluate import EvalConfig, evaluate
from trainer.loop.config import preset
from trainer.loop.fold import Window, fold_inputs
from trainer.loop.select import split_validation
from trainer.sim import SimConfig
from trainer.sim.synthetic import random_decision_tape


def test_lagged_on_a_hand_case():
    x = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    # row t: [x_t, x_{t-1}], the first row repeating before the tape starts
    np.testing.assert_array_equal(lagged(x, 2), [[1, 10, 1, 10], [2, 20, 1, 10], [3, 30, 2, 20]])
    np.testing.assert_array_equal(lagged(x, 1), x)
    with pytest.raises(ValueError, match="lags"):
        lagged(x, 0)


def test_ridge_forecast_recovers_an_exact_linear_target_scaled_to_unit_sd_on_the_fit_rows():
    rng = np.random.default_rng(0)
    f = rng.standard_normal((300, 2))
    y = np.zeros(300)
    y[1:] = 2.0 * f[1:, 0] - f[:-1, 1] + 0.5  # reads row t and row t-1: inside a 2-row lag window
    fit = slice(1, 200)
    pred = ridge_forecast(f, y, fit, lags=2, ridge=1e-9)
    np.testing.assert_allclose(pred[1:], y[1:] / y[fit].std(), atol=1e-6)  # out of the fit rows too
    assert pred[fit].std() == pytest.approx(1.0)
    # a heavy ridge shrinks the weights, but the column is rescaled to unit sd on the fit rows all the same
    assert ridge_forecast(f, y, fit, 2, ridge=1e4)[fit].std() == pytest.approx(1.0)


@pytest.fixture(scope="module")
def tape_and_features():
    tape = random_decision_tape(400, seed=5)
    feats = np.random.default_rng(2).standard_normal((400, 3)).astype(np.float32)
    return tape, feats


def test_the_fit_reads_the_training_rows_only_and_the_column_is_causal(tape_and_features):
    tape, feats = tape_and_features
    bid, ask = tape.bid_px[:, 0], tape.ask_px[:, 0]
    start, stop = 50, 250
    out = append_forecast(feats, bid, ask, start, stop, lags=4, horizon=3, ridge=1.0)
    assert out.shape == (400, 4) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:, :3], feats)  # the features themselves untouched
    assert out[start + 3:stop - 3, 3].std() == pytest.approx(1.0, rel=1e-5)  # unit sd on the fit rows
    # prices at and after `stop` (selection slice, eval window) are never read: the same column everywhere
    later = ask.copy()
    later[stop:] += 7
    np.testing.assert_array_equal(append_forecast(feats, bid, later, start, stop, 4, 3, 1.0), out)
    # prices before `start` neither
    earlier = bid.copy()
    earlier[:start] -= 5
    np.testing.assert_array_equal(append_forecast(feats, earlier, ask, start, stop, 4, 3, 1.0), out)
    # a feature changed at row 300 (eval window) moves the column at rows 300..303 (its lag window) only
    moved = feats.copy()
    moved[300] += 10.0
    col = append_forecast(moved, bid, ask, start, stop, 4, 3, 1.0)[:, 3]
    np.testing.assert_array_equal(col[:300], out[:300, 3])
    np.testing.assert_array_equal(col[304:], out[304:, 3])
    assert not np.allclose(col[300:304], out[300:304, 3])
    # a training price does move it: the target is read
    assert not np.array_equal(append_forecast(feats, bid, np.r_[ask[:100], ask[100:] + 1], start, stop, 4, 3, 1.0)
                              [:, 3], out[:, 3])


def test_too_few_fit_rows_and_bad_settings_are_refused(tape_and_features):
    tape, feats = tape_and_features
    with pytest.raises(ValueError, match=r"forecast_lags=8, forecast_horizon=4: the training rows \[0, 12\) leave 1"):
        append_forecast(feats, tape.bid_px[:, 0], tape.ask_px[:, 0], 0, 12, 8, 4, 1.0)
    for field, value in (("forecast_lags", -1), ("forecast_horizon", 0), ("forecast_ridge", 0.0),
                         ("forecast_lags", 1.5)):
        with pytest.raises(ValueError, match=field):
            AgentConfig(n_features=3, env_state_dim=2, **{field: value})


def test_fold_inputs_with_and_without_the_forecast(tape_and_features):
    tape, raw = tape_and_features
    names = ["a", "ofi_sum", "c"]
    train = Window(0, 300)
    plain_cfg = preset("smoke").replace(agent={"mirror": False, "mirror_augment": False})  # no reflection
    plain, plain_names, _ = fold_inputs(plain_cfg, raw, names, tape, train)
    np.testing.assert_array_equal(plain, Normaliser.fit(raw[:300]).apply(raw))
    assert plain_names == names
    cfg = plain_cfg.replace(agent={"forecast_lags": 4})
    feats, with_names, _ = fold_inputs(cfg, raw, names, tape, train)
    assert with_names == [*names, FORECAST_COLUMN] and feats.shape == (400, 4)
    np.testing.assert_array_equal(feats[:, :3], plain)
    # fitted on the rows the agent trains on: the selection slice (smoke holds out 20 %) is not a target
    train_stop, _ = split_validation(0, 300, cfg.loop.select_frac, cfg.agent.window)
    assert train_stop == 240
    np.testing.assert_array_equal(
        feats, append_forecast(plain, tape.bid_px[:, 0], tape.ask_px[:, 0], 0, 240, 4, 4, 1.0))


def test_the_forecast_rule_baseline_exists_with_the_column_and_reads_it(tape_and_features):
    tape, raw = tape_and_features
    names = ("spread_ticks", "ofi_sum")
    assert "forecast_rule_max" not in baseline_policies(names, 0, "cpu")
    # a forecast column equal to ofi_sum: the forecast rule must then trade exactly as ofi_rule_max
    feats = torch.as_tensor(np.c_[raw[:, :2], raw[:, 1]], dtype=torch.float32)
    with_col = (*names, FORECAST_COLUMN)
    sim = SimConfig(n_envs=1, seed=3, max_position=3)
    b = run_baselines(with_col, feats, tape, sim, 4, 100, 400, EvalConfig(n_envs=8), seed=5)
    assert b["forecast_rule_max"] == b["ofi_rule_max"] and b["ofi_rule_max"]["trades"] > 0
    # and a different column trades differently, through the same rule at full size
    other = feats.clone()
    other[:, 2] = -other[:, 1]
    flipped = run_baselines(with_col, other, tape, sim, 4, 100, 400, EvalConfig(n_envs=8), seed=5)
    expect = evaluate(ofi_rule_policy(with_col, OfiRuleConfig(column=FORECAST_COLUMN, magnitude=2)), other, tape, sim,
                      4, 100, 400, cfg=EvalConfig(n_envs=8)).metrics
    assert flipped["forecast_rule_max"]["net_pnl"] == expect["net_pnl"] != b["ofi_rule_max"]["net_pnl"]


def test_the_option_is_in_the_checkpoint_fingerprint():
    from trainer.loop.config import fingerprint_config

    base = preset("smoke").replace(agent={"mirror": False, "mirror_augment": False})  # no reflection
    a = fingerprint_config(base.to_dict())
    b = fingerprint_config(base.replace(agent={"forecast_lags": 8}).to_dict())
    assert a["agent"]["forecast_lags"] == 0 and b["agent"]["forecast_lags"] == 8 and a != b
