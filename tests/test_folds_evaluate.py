"""Out-of-sample evaluation and baselines: vectorised segments against one-env-at-a-time reference replays, the
continuous pass against the simulator's own counts, and the baseline policies' defining behaviour."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from trainer.folds.baselines import (OfiRuleConfig, flat_policy, ofi_column, ofi_rule_policy, random_policy,
                                     run_baselines)
from trainer.folds.evaluate import HEADLINE, EvalConfig, evaluate
from trainer.sim import FLAT, HOLD, LONG, MARKET, SHORT, SimConfig, Simulator
from trainer.sim.synthetic import random_decision_tape

W, N_ROWS, START, STOP = 4, 360, 100, 360
NAMES = ("spread_ticks", "ofi_l0", "ofi_sum", "mid_return_1_ticks")
SIM = SimConfig(n_envs=1, seed=3)


@pytest.fixture(scope="module")
def market():
    tape = random_decision_tape(N_ROWS, seed=11)
    # 30 s between decisions, over two UTC days, so bars (5 min) and days exist
    ts = np.arange(N_ROWS, dtype=np.int64) * 30_000_000_000 + 80_000 * 1_000_000_000
    tape = dataclasses.replace(tape, ts_ns=ts)
    feats = torch.as_tensor(np.random.default_rng(1).standard_normal((N_ROWS, len(NAMES))), dtype=torch.float32)
    return tape, feats


def _sign_policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
    """Deterministic in the observation: trades often, mixes market and limit orders, holds sometimes."""
    x = obs[:, -1, 0]
    a = torch.zeros(obs.shape[0], 4, dtype=torch.int64)
    a[:, 0] = torch.where(x > 0.5, LONG, torch.where(x < -0.5, SHORT, torch.where(x > 0, HOLD, FLAT)))
    a[:, 1] = (obs[:, -1, 1] > 0).long()
    a[:, 2] = torch.where(obs[:, -1, 3] > 0, MARKET, 1)
    a[:, 3] = 1
    return a


def _reference_segments(tape, feats, n_seg: int):
    """Each segment alone in a one-env simulator: seg_len policy steps, then one FLAT market step."""
    first = START + W - 1
    seg_len = (STOP - 1 - first) // n_seg
    total = {"round_trips": 0.0, "wins": 0.0, "net_pnl": 0.0, "fees": 0.0, "hold": 0.0, "actions": 0.0}
    for i in range(n_seg):
        sim = Simulator(tape, SIM, "cpu")
        st = sim.reset(START, STOP, min_history=W - 1, start_rows=torch.tensor([first + i * seg_len]))
        for _ in range(seg_len):
            rows = st.cursor[:, None] - torch.arange(W - 1, -1, -1)[None, :]
            sim.step(st, _sign_policy(feats[rows], sim.env_features(st)))
        total["hold"] += float(st.action_counts[0, HOLD])
        total["actions"] += float(st.action_counts.sum())
        close = torch.tensor([[FLAT, 0, MARKET, 0]])
        sim.step(st, close)
        stats = sim.stats(st)
        for k in ("round_trips", "wins", "net_pnl", "fees"):
            total[k] += float(stats[k])
        assert int(st.position[0]) == 0  # the closing step left nothing open
    return total


def test_segments_match_one_env_reference_replays(market):
    tape, feats = market
    m = evaluate(_sign_policy, feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8)).metrics
    ref = _reference_segments(tape, feats, 8)
    assert m["trades"] == ref["round_trips"] > 10
    assert m["win_rate"] == pytest.approx(ref["wins"] / ref["round_trips"])
    assert m["net_pnl"] == pytest.approx(ref["net_pnl"])
    assert m["fees"] == pytest.approx(ref["fees"])
    assert m["hold_frac"] == pytest.approx(ref["hold"] / ref["actions"])
    assert m["eval_envs"] == 8 and m["eval_steps"] == ref["actions"]
    assert sum(m["action_freq"].values()) == pytest.approx(1.0)


def test_continuous_pass_equity_positions_and_trip_count_are_consistent(market):
    tape, feats = market
    res = evaluate(_sign_policy, feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8))
    span = STOP - 1 - (START + W - 1)
    assert res.equity.shape == res.position.shape == res.ts_ns.shape == (span + 1,)
    assert res.equity[0] == 0.0 and res.position[0] == 0 and res.position[-1] == 0  # flattened at the window end
    # the holding-time trips derived from the recorded positions are the simulator's own round trips
    assert res.metrics["holding_trips"] == res.metrics["continuous_trades"] > 0
    assert res.metrics["continuous_net_pnl"] == pytest.approx(float(res.equity[-1]))
    assert res.metrics["mean_holding_seconds"] == pytest.approx(30.0 * res.metrics["mean_holding_steps"])
    # 5-minute bars over 30 s decisions: 10 decisions per bar
    assert res.metrics["n_bars"] == pytest.approx(span / 10, abs=2)
    assert all(math.isfinite(res.metrics[k]) for k in ("sharpe", "sortino", "calmar", "max_drawdown"))


def test_flat_baseline_never_trades(market):
    tape, feats = market
    m = evaluate(flat_policy(), feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8)).metrics
    assert m["trades"] == 0 and m["net_pnl"] == 0.0 and m["fees"] == 0.0 and m["turnover_contracts"] == 0
    assert m["sharpe"] == 0.0 and m["max_drawdown"] == 0.0
    assert m["action_freq"]["flat"] == 1.0 and m["hold_frac"] == 0.0 and m["eval_dir_entropy"] == 0.0


def test_random_baseline_is_uniform_and_seeded():
    obs = torch.zeros(20_000, W, len(NAMES))
    a = random_policy(7, "cpu")(obs, torch.zeros(20_000, 7))
    for branch, size in enumerate((4, 3, 3, 3)):
        freq = torch.bincount(a[:, branch], minlength=size).double() / a.shape[0]
        assert freq.shape == (size,) and torch.allclose(freq, torch.full((size,), 1 / size, dtype=torch.float64),
                                                        atol=0.02)
    assert torch.equal(random_policy(7, "cpu")(obs[:50], None), random_policy(7, "cpu")(obs[:50], None))
    assert not torch.equal(random_policy(7, "cpu")(obs[:50], None), random_policy(8, "cpu")(obs[:50], None))


def test_ofi_rule_reads_the_ofi_column_by_name():
    cfg = OfiRuleConfig(threshold=1.0)
    policy = ofi_rule_policy(NAMES, cfg)
    obs = torch.zeros(4, W, len(NAMES))
    obs[:, -1, 2] = torch.tensor([2.0, -2.0, 0.5, -0.5])  # ofi_sum is column 2
    obs[:, -1, 1] = 9.0  # ofi_l0 must be ignored
    obs[:, -2, 2] = 9.0  # and so must older rows
    a = policy(obs, torch.zeros(4, 7))
    assert a[:, 0].tolist() == [LONG, SHORT, HOLD, HOLD]
    assert (a[:, 2] == MARKET).all() and (a[:, 1] == 0).all()
    assert ofi_column(NAMES) == 2
    with pytest.raises(ValueError, match="ofi_sum.*ofi_l0"):
        ofi_column(("ofi_l0", "spread_ticks"))
    with pytest.raises(ValueError, match="threshold"):
        OfiRuleConfig(threshold=0.0)


def test_baselines_run_through_the_same_evaluation(market):
    tape, feats = market
    cfg = EvalConfig(n_envs=8)
    b = run_baselines(NAMES, feats, tape, SIM, W, START, STOP, cfg, seed=5)
    assert set(b) == {"flat", "random", "ofi_rule"}
    for name, m in b.items():
        assert set(m) == set(HEADLINE), name
    again = evaluate(ofi_rule_policy(NAMES), feats, tape, SIM, W, START, STOP, cfg=cfg).metrics
    assert b["ofi_rule"]["net_pnl"] == again["net_pnl"] and b["ofi_rule"]["trades"] == again["trades"] > 0
    assert b["flat"]["trades"] == 0 and b["random"]["trades"] > 0


def test_eval_config_and_short_window_are_refused(market):
    tape, feats = market
    with pytest.raises(ValueError, match="bar_seconds"):
        EvalConfig(bar_seconds=0)
    with pytest.raises(ValueError, match="too short"):
        evaluate(flat_policy(), feats, tape, SIM, W, START, START + W)
