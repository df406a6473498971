"""Out-of-sample evaluation and baselines: vectorised segments against one-env-at-a-time reference replays, the
continuous pass against the simulator's own counts, and the baseline policies' defining behaviour."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from trainer.features.cache import load_or_build
from trainer.folds.baselines import (OfiRuleConfig, flat_policy, ofi_column, ofi_rule_policy, random_policy,
                                     run_baselines)
from trainer.folds.evaluate import HEADLINE, EvalConfig, decision_position, evaluate
from trainer.folds.windows import fold_windows, walk_forward_windows
from trainer.loop.config import preset
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
    total = {"round_trips": 0.0, "wins": 0.0, "net_pnl": 0.0, "fees": 0.0, "hold": 0.0, "actions": 0.0,
             "open_at_end": 0.0}
    for i in range(n_seg):
        sim = Simulator(tape, SIM, "cpu")
        st = sim.reset(START, STOP, min_history=W - 1, start_rows=torch.tensor([first + i * seg_len]))
        for _ in range(seg_len):
            rows = st.cursor[:, None] - torch.arange(W - 1, -1, -1)[None, :]
            sim.step(st, _sign_policy(feats[rows], sim.env_features(st)))
        total["hold"] += float(st.action_counts[0, HOLD])
        total["actions"] += float(st.action_counts.sum())
        total["open_at_end"] += float(st.position[0] != 0)
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


def _always_long(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
    a = torch.zeros(obs.shape[0], 4, dtype=torch.int64)
    a[:, 0], a[:, 2] = LONG, MARKET
    return a


def test_forced_closes_count_the_trips_the_segment_end_closed(market):
    tape, feats = market
    # Always long: each segment opens one position and never closes it, so the closing step ends every trip. 7
    # segments of 256 // 7 = 36 steps end before the window's last row.
    m = evaluate(_always_long, feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=7)).metrics
    assert m["trades"] == m["segment_forced_closes"] == 7
    # One segment of all 256 steps reaches the window's last row, where the simulator flattens it itself: one trip,
    # none left for the closing step. FLAT never opens one.
    m = evaluate(_always_long, feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=1)).metrics
    assert (m["trades"], m["segment_forced_closes"]) == (1, 0)
    assert evaluate(flat_policy(), feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8)).metrics[
        "segment_forced_closes"] == 0
    # A policy that trades often: the forced closes are the segments still open at their end (reference replay).
    m = evaluate(_sign_policy, feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=7)).metrics
    assert m["segment_forced_closes"] == _reference_segments(tape, feats, 7)["open_at_end"]
    assert 0 <= m["segment_forced_closes"] < m["trades"]


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
    assert res.metrics["time_in_market"] == pytest.approx(float(np.mean(res.position[:-1] != 0)))
    assert 0 < res.metrics["time_in_market"] < 1
    # 5-minute bars over 30 s decisions: 10 decisions per bar
    assert res.metrics["n_bars"] == pytest.approx(span / 10, abs=2)
    assert all(math.isfinite(res.metrics[k]) for k in ("sharpe", "sortino", "calmar", "max_drawdown"))


def test_continuous_pass_samples_add_up_to_its_net_pnl_and_count_its_trips(market):
    tape, feats = market
    m = evaluate(_sign_policy, feats, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8)).metrics
    net = m["continuous_net_pnl"]
    # the path starts and ends flat: bars, days and closed trips each partition the whole PnL
    assert len(m["trade_pnl"]) == m["continuous_trades"] and sum(m["trade_pnl"]) == pytest.approx(net)
    assert len(m["bar_pnl"]) == m["n_bars"] and sum(m["bar_pnl"]) == pytest.approx(net)
    assert len(m["day_pnl"]) == 2 and sum(m["day_pnl"]) == pytest.approx(net)  # the window spans two UTC days


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
    big = ofi_rule_policy(NAMES, OfiRuleConfig(magnitude=2))(obs, torch.zeros(4, 7))
    assert torch.equal(big[:, 0], a[:, 0]) and (big[:, 1] == 2).all()  # same decisions, the largest position
    with pytest.raises(ValueError, match="magnitude"):
        OfiRuleConfig(magnitude=3)
    closing = ofi_rule_policy(NAMES, OfiRuleConfig(inside=FLAT))(obs, torch.zeros(4, 7))
    assert closing[:, 0].tolist() == [LONG, SHORT, FLAT, FLAT]  # inside the band it closes instead of holding
    with pytest.raises(ValueError, match="inside"):
        OfiRuleConfig(inside=LONG)
    with pytest.raises(ValueError, match="ofi_sum.*ofi_l0"):
        ofi_column(("ofi_l0", "spread_ticks"))
    with pytest.raises(ValueError, match="threshold"):
        OfiRuleConfig(threshold=0.0)


def test_baselines_run_through_the_same_evaluation(market):
    tape, feats = market
    cfg = EvalConfig(n_envs=8)
    b = run_baselines(NAMES, feats, tape, SIM, W, START, STOP, cfg, seed=5)
    assert set(b) == {"flat", "random", "ofi_rule", "ofi_rule_max"}
    for name, m in b.items():
        assert set(m) == set(HEADLINE), name
    again = evaluate(ofi_rule_policy(NAMES), feats, tape, SIM, W, START, STOP, cfg=cfg).metrics
    assert b["ofi_rule"]["net_pnl"] == again["net_pnl"] and b["ofi_rule"]["trades"] == again["trades"] > 0
    assert b["flat"]["trades"] == 0 and b["random"]["trades"] > 0
    agent = evaluate(_sign_policy, feats, tape, SIM, W, START, STOP, cfg=cfg).metrics
    assert {len(m["bar_pnl"]) for m in b.values()} == {len(agent["bar_pnl"])}  # paired bars for the reality check


def test_ofi_rule_max_is_the_same_rule_at_the_position_limit_and_scales_its_pnl_in_a_deep_book(market):
    """max_position 3: the rule's entries become 3 contracts instead of 1. With every level 50 deep and a taker fee per
    contract, each market order fills at the same price whatever its size, so trips, win rate and the mid edge stay
    and PnL, fees and turnover triple exactly."""
    tape, feats = market
    deep = dataclasses.replace(tape, bid_sz=np.where(tape.bid_px > 0, 50, 0), ask_sz=np.where(tape.ask_px > 0, 50, 0))
    sim = dataclasses.replace(SIM, max_position=3, taker_fee=0.25)
    b = run_baselines(NAMES, feats, deep, sim, W, START, STOP, EvalConfig(n_envs=8), seed=5)
    one, three = b["ofi_rule"], b["ofi_rule_max"]
    assert one["trades"] == three["trades"] > 0 and one["win_rate"] == three["win_rate"]
    assert three["turnover_contracts"] == 3 * one["turnover_contracts"] > 0
    for key in ("net_pnl", "gross_pnl", "fees", "mid_edge"):
        assert three[key] == pytest.approx(3 * one[key], rel=1e-9, abs=1e-9), key
    assert three["mid_edge_tstat"] == pytest.approx(one["mid_edge_tstat"])


def test_eval_config_and_short_window_are_refused(market):
    tape, feats = market
    with pytest.raises(ValueError, match="bar_seconds"):
        EvalConfig(bar_seconds=0)
    with pytest.raises(ValueError, match="too short"):
        evaluate(flat_policy(), feats, tape, SIM, W, START, START + W)


def _reference_edge(tape, feats, sim_cfg: SimConfig, stop: int):
    """The continuous pass replayed one step at a time with the obvious bookkeeping: q_t is the simulator's own
    position after the step when the instruction reaching the exchange at t is a market order (it fills at the
    book of t), else its position before the step (HOLD, or a limit order that can only fill inside the interval).
    The simulator's window is one row longer than the evaluated one, so its window-end flattening does not touch
    the compared steps. Returns (e per step, market steps that moved the position, other steps that moved it)."""
    first = START + W - 1
    steps = stop - 1 - first
    sim = Simulator(tape, sim_cfg, "cpu")
    st = sim.reset(START, stop + 1, min_history=W - 1, start_rows=torch.tensor([first]))
    sent, edge, moved_market, moved_other = [], [], 0, 0
    for k in range(steps):
        c = int(st.cursor[0])
        a = _sign_policy(feats[c - W + 1:c + 1][None], sim.env_features(st))
        sent.append(a[0].tolist())
        before = int(st.position[0])
        sim.step(st, a)
        after = int(st.position[0])
        executed = sent[k - sim_cfg.latency_steps] if k >= sim_cfg.latency_steps else None
        market = executed is not None and executed[0] != HOLD and executed[2] == MARKET
        q = after if market else before
        moved_market += market and after != before
        moved_other += (not market) and after != before
        mid_now = (int(tape.bid_px[c, 0]) + int(tape.ask_px[c, 0])) / 2
        mid_next = (int(tape.bid_px[c + 1, 0]) + int(tape.ask_px[c + 1, 0])) / 2
        edge.append(q * (mid_next - mid_now) * tape.tick_value)
    return np.array(edge), moved_market, moved_other


@pytest.mark.parametrize("latency", [0, 2])
def test_mid_edge_matches_a_step_by_step_reference_replay(market, latency):
    tape, feats = market
    sim_cfg = dataclasses.replace(SIM, latency_steps=latency)
    res = evaluate(_sign_policy, feats, tape, sim_cfg, W, START, STOP - 1, cfg=EvalConfig(n_envs=8))
    ref, moved_market, moved_other = _reference_edge(tape, feats, sim_cfg, STOP - 1)
    # both kinds of position change occur, so the market/limit distinction is exercised
    assert moved_market > 10 and moved_other > 5
    assert res.edge.shape == ref.shape
    np.testing.assert_array_equal(res.edge, ref)  # multiples of 6.25: exact
    nz = ref[ref != 0]
    m = res.metrics
    assert m["mid_edge_n"] == nz.size > 50 and m["mid_edge"] == pytest.approx(nz.sum())
    assert m["mid_hit_rate"] == pytest.approx(float(np.mean(nz > 0)))
    assert m["mid_edge_tstat"] == pytest.approx(nz.mean() / (nz.std(ddof=1) / math.sqrt(nz.size)))


def _next_move_policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
    """LONG / SHORT at market on the sign of feature column 0 of the newest row, FLAT at 0."""
    x = obs[:, -1, 0]
    a = torch.zeros(obs.shape[0], 4, dtype=torch.int64)
    a[:, 0] = torch.where(x > 0, LONG, torch.where(x < 0, SHORT, FLAT))
    a[:, 2] = MARKET
    return a


def test_mid_edge_flags_a_policy_that_sees_the_next_mid_and_not_one_that_sees_noise(market):
    tape, _ = market
    mid_x2 = tape.bid_px[:, 0] + tape.ask_px[:, 0]
    future = np.r_[np.sign(np.diff(mid_x2)), 0.0]  # row t holds the sign of mid_{t+1} - mid_t: a leak
    leak = torch.as_tensor(future, dtype=torch.float32)[:, None]
    m = evaluate(_next_move_policy, leak, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8)).metrics
    assert m["mid_hit_rate"] == 1.0 and m["mid_edge_tstat"] > 10
    # 1-3 tick spreads against 1-tick moves: here even the leak loses money net of costs, so net PnL alone would
    # not reveal it; the mid edge does
    assert m["net_pnl"] < 0
    noise = torch.as_tensor(np.random.default_rng(5).choice([-1.0, 1.0], N_ROWS), dtype=torch.float32)[:, None]
    m0 = evaluate(_next_move_policy, noise, tape, SIM, W, START, STOP, cfg=EvalConfig(n_envs=8)).metrics
    assert m0["mid_edge_n"] > 100 and abs(m0["mid_edge_tstat"]) < 2 and abs(m0["mid_hit_rate"] - 0.5) < 0.1
    assert m0["net_pnl"] < m["net_pnl"]


@pytest.mark.parametrize("feed", [0, 3])
def test_evaluation_with_feed_latency_observes_rows_k_behind_the_cursor(market, feed):
    """SimConfig.feed_latency_steps = k: evaluation acts on the window ending at cursor - k, so over the eval window
    the policy sees rows START + W - 1 .. STOP - 2 - k (the last k rows' market reaches it too late to matter)."""
    tape, feats = market
    seen: list[int] = []

    def recording_policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        match = (feats[None, :, :] == obs[:, -1, None, :]).all(-1)  # (B, T): the row each window ends at
        rows = match.float().argmax(1)
        for b, r in enumerate(rows.tolist()):
            assert torch.equal(obs[b], feats[r - W + 1:r + 1])  # a whole, contiguous window
        seen.extend(rows.tolist())
        return _sign_policy(obs, env_state)

    evaluate(recording_policy, feats, tape, dataclasses.replace(SIM, feed_latency_steps=feed), W, START, STOP,
             n_envs=4)
    assert min(seen) == START + W - 1 and max(seen) == STOP - 2 - feed


def test_decision_position_counts_only_the_market_kind_under_other_order_types():
    """With SimConfig.order_types = ("post_only", "ioc", "fok") choice 0 is a resting POST_ONLY: the position it
    decides at row t is the one held before it (its fill, if any, comes inside the interval), not the target."""
    target = torch.tensor(SIM.target_contracts)  # (1, 2, 3) of max_position 3
    long_choice0 = torch.tensor([[LONG, 2, 0, 0]])
    default = decision_position(long_choice0, torch.tensor([0]), target)
    kinds = torch.tensor(SimConfig(order_types=("post_only", "ioc", "fok")).order_kind_codes)
    assert default.tolist() == [3] and decision_position(long_choice0, torch.tensor([0]), target, kinds).tolist() == [0]
    market_last = torch.tensor(SimConfig(order_types=("ioc", "fok", "market")).order_kind_codes)
    assert decision_position(torch.tensor([[SHORT, 0, 2, 0]]), torch.tensor([2]), target, market_last).tolist() == [-1]


def test_the_h100_preset_evaluates_segments_long_enough_to_hold_its_trips(tmp_path):
    """The h100 preset deploys with a minimum holding time (LoopConfig.min_hold_steps); its eval segments must be
    several times that long on the market its results come from, or the closing step ends nearly every trip
    (docs/RESULTS.md §15: 256 segments were 4 decisions long and every trip was a forced close)."""
    cfg = preset("h100")
    fs, _ = load_or_build("synthetic:seed=11,days=8,signal=1", cfg.features, tmp_path)
    windows = walk_forward_windows(fs.raw.shape[0], cfg.folds.folds, embargo_rows=cfg.folds.embargo_rows)
    _, ev = fold_windows(windows, 0)
    feats = torch.zeros(fs.raw.shape[0], 1)
    sim = dataclasses.replace(cfg.sim, n_envs=1)
    lengths = {}
    for n_envs in (cfg.eval.n_envs, 256):
        m = evaluate(_always_long, feats, fs.decision, sim, cfg.agent.window, ev.start, ev.stop,
                     cfg=dataclasses.replace(cfg.eval, n_envs=n_envs)).metrics
        lengths[n_envs] = m["eval_steps"] // m["eval_envs"]
    assert cfg.loop.min_hold_steps >= 2
    assert lengths[cfg.eval.n_envs] >= 8 * cfg.loop.min_hold_steps  # the preset's segments
    assert lengths[256] <= cfg.loop.min_hold_steps  # the default's: a trip cannot end before its segment does
