"""trainer.folds.metrics: bar returns, Sharpe/Sortino/drawdown/Calmar on a hand-built curve, holding times, t-stat,
and the leakage guard's mid edge (per step, its sums, and their exact pooling across folds)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.folds.metrics import (bar_ends, bar_returns, bars_per_day, edge_stats, edge_sums, entropy_nats,
                                   day_pnls, equity_metrics, holding_periods, holding_time, max_drawdown, mid_edge,
                                   trade_pnls)
from trainer.numeric import t_statistic

S = 1_000_000_000  # ns per second
BAR = 300 * S
# Hand-built curve: 6 points in 4 five-minute bars; bar 0 holds 3 points (the intra-bar dip to 5 is not a bar
# return but is a drawdown point).
TS = np.array([0, 60, 120, 400, 700, 1000], dtype=np.int64) * S
EQ = np.array([0.0, 10.0, 5.0, 20.0, 10.0, 30.0])


def test_bar_returns_take_the_last_equity_of_each_nonempty_bar():
    assert bar_ends(TS, BAR).tolist() == [2, 3, 4, 5]
    # bar-end equities 5, 20, 10, 30 measured from equity[0] = 0
    assert bar_returns(EQ, TS, BAR).tolist() == [5.0, 15.0, -10.0, 20.0]


def test_equity_metrics_on_a_hand_built_curve():
    m = equity_metrics(EQ, TS, BAR, bars_per_year=100.0)
    # r = [5, 15, -10, 20]: mean 7.5, population variance (6.25 + 56.25 + 306.25 + 156.25) / 4 = 131.25
    assert m["sharpe"] == pytest.approx(7.5 / math.sqrt(131.25) * 10.0)
    assert m["sharpe"] == pytest.approx(6.546536707)
    # downside deviation sqrt((0 + 0 + 100 + 0) / 4) = 5
    assert m["sortino"] == pytest.approx(7.5 / 5.0 * 10.0)
    # running peak 0, 10, 10, 20, 20, 30 → largest fall 20 - 10 = 10
    assert m["max_drawdown"] == pytest.approx(10.0)
    assert m["annual_pnl"] == pytest.approx(750.0)
    assert m["calmar"] == pytest.approx(75.0)
    assert m["n_bars"] == 4


def test_sharpe_does_not_depend_on_how_many_decisions_fall_inside_a_bar():
    # The same bar-end equities, but ten extra intra-bar points: the per-decision Sharpe would change, ours must not.
    ts = np.r_[TS[:3], np.arange(401, 411) * S, TS[3:]]
    eq = np.r_[EQ[:3], np.full(10, 12.0), EQ[3:]]
    ts.sort()
    a = equity_metrics(EQ, TS, BAR, 100.0)
    b = equity_metrics(eq, ts, BAR, 100.0)
    assert b["sharpe"] == pytest.approx(a["sharpe"]) and b["sortino"] == pytest.approx(a["sortino"])


def test_degenerate_curves_give_zeros_not_nan():
    flat = equity_metrics(np.zeros(5), np.arange(5) * BAR, BAR, 100.0)
    assert flat["sharpe"] == flat["sortino"] == flat["max_drawdown"] == flat["calmar"] == 0.0
    rising = equity_metrics(np.arange(5.0), np.arange(5) * BAR, BAR, 100.0)
    assert rising["sharpe"] == 0.0  # zero variance: std 0, reported as 0
    assert rising["sortino"] == 0.0 and rising["max_drawdown"] == 0.0


def test_max_drawdown_counts_a_loss_from_the_zero_start():
    assert max_drawdown(np.array([-3.0, -1.0, -4.0])) == 4.0


def test_bars_per_day_is_the_median_over_trading_days():
    day = 86_400 * S
    ts = np.r_[np.arange(3) * BAR, day + np.arange(5) * BAR, 2 * day + np.arange(4) * BAR + 7 * S]
    assert bars_per_day(ts, BAR) == 4.0


def test_time_must_not_go_backwards():
    with pytest.raises(ValueError, match="non-decreasing"):
        bar_ends(np.array([0, 2, 1]) * S, BAR)
    with pytest.raises(ValueError, match="bars_per_year"):
        equity_metrics(EQ, TS, BAR, 0.0)


def _holding_reference(position):
    """Slow, obvious walk: a trip opens when the sign leaves 0, closes when it is 0 again or flips."""
    trips, open_at, sign = [], None, 0
    for i, p in enumerate(position):
        s = int(np.sign(p))
        if open_at is not None and s != sign:
            trips.append((open_at, i))
            open_at = None
        if open_at is None and s != 0:
            open_at, sign = i, s
        sign = s if open_at is not None else 0
    return trips


def test_holding_periods_hand_case_with_a_flip_and_a_size_change():
    pos = np.array([0, 1, 2, 0, -1, 1, 1, 0, 3])  # trips (1,3), (4,5) flip, (5,7); the last one stays open
    opens, closes = holding_periods(pos)
    assert list(zip(opens.tolist(), closes.tolist())) == [(1, 3), (4, 5), (5, 7)]
    ts = np.arange(pos.size) * 10 * S
    h = holding_time(pos, ts)
    assert h["holding_trips"] == 3
    assert h["mean_holding_steps"] == pytest.approx((2 + 1 + 2) / 3)
    assert h["mean_holding_seconds"] == pytest.approx(10 * (2 + 1 + 2) / 3)
    # intervals starting at positions 0,1,2,0,-1,1,1,0 (the last point starts none): 5 of 8 in the market
    assert h["time_in_market"] == pytest.approx(5 / 8)
    assert holding_time(np.zeros(4, dtype=int), ts[:4])["time_in_market"] == 0.0


def test_holding_periods_match_the_reference_on_random_paths():
    rng = np.random.default_rng(0)
    for _ in range(200):
        pos = rng.choice([-2, -1, 0, 0, 0, 1, 2], size=rng.integers(1, 40))
        opens, closes = holding_periods(pos)
        assert list(zip(opens.tolist(), closes.tolist())) == _holding_reference(pos.tolist())


def test_entropy_uniform_is_log_k_and_collapsed_is_zero():
    assert entropy_nats(np.array([5, 5, 5, 5])) == pytest.approx(math.log(4))
    assert entropy_nats(np.array([0, 9, 0, 0])) == 0.0
    assert entropy_nats(np.zeros(4)) == 0.0


def test_mid_edge_hand_case_marks_each_decided_position_to_the_next_mid():
    q = np.array([0, 1, 1, -2, 0, 3])
    mid_x2 = np.array([200, 201, 203, 203, 201, 200, 199])  # 2 x mid: half-tick moves +1, +2, 0, -2, -1, -1
    e = mid_edge(q, mid_x2, tick_value=12.5)
    # q x (mid move in ticks) x 12.5: 0, 1 x 1.0, 1 x 0, -2 x -1.0, 0, 3 x -0.5
    assert e.tolist() == [0.0, 12.5, 0.0, 25.0, 0.0, -18.75]
    s = edge_sums(e)
    assert s == {"mid_edge_n": 3, "mid_edge": 18.75, "mid_edge_sumsq": 12.5**2 + 25.0**2 + 18.75**2,
                 "mid_edge_wins": 2}
    st = edge_stats(s)
    # nonzero e = 12.5, 25, -18.75: mean 6.25, sample variance (39.0625 + 351.5625 + 625) / 2 = 507.8125
    assert st["mid_edge_tstat"] == pytest.approx(6.25 / math.sqrt(507.8125 / 3))
    assert st["mid_edge_tstat"] == pytest.approx(0.48038446)
    assert st["mid_hit_rate"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="mids"):
        mid_edge(q, mid_x2[:-1], 12.5)


def test_pooled_edge_statistics_equal_those_of_the_concatenated_steps():
    rng = np.random.default_rng(4)
    folds = [rng.integers(-3, 4, n) * rng.integers(-2, 3, n) * 6.25 + 0.0 for n in (50, 170, 333)]
    pooled = edge_stats([edge_sums(e) for e in folds])
    allv = np.concatenate(folds)
    nz = allv[allv != 0]
    assert pooled["mid_edge_n"] == nz.size > 300
    assert pooled["mid_edge"] == pytest.approx(nz.sum())
    assert pooled["mid_edge_tstat"] == pytest.approx(nz.mean() / (nz.std(ddof=1) / math.sqrt(nz.size)), rel=1e-12)
    assert pooled["mid_hit_rate"] == pytest.approx(float(np.mean(nz > 0)))
    assert pooled["mid_edge_tstat"] == pytest.approx(t_statistic(nz), rel=1e-12)


def test_edge_stats_without_spread_or_steps_give_no_t():
    assert edge_stats(edge_sums(np.zeros(10)))["mid_edge_tstat"] is None
    assert edge_stats(edge_sums(np.zeros(10)))["mid_hit_rate"] is None
    assert edge_stats(edge_sums(np.array([6.25])))["mid_edge_tstat"] is None  # n = 1
    same = edge_stats(edge_sums(np.full(1000, 0.1)))  # equal values: sums carry round-off, still no t
    assert same["mid_edge_tstat"] is None and same["mid_hit_rate"] == 1.0


def test_trade_pnls_hand_case_with_a_flip():
    # points:   0   1   2   3   4   5   6   7
    pos = [0, 1, 1, 0, 0, -2, 2, 0]
    eq = [0.0, -1.0, 4.0, 3.0, 3.0, 1.0, -6.0, 2.0]
    # trip 1 opens at 1 (flat at 0), closes at 3: 3 - 0; trip 2 opens at 5 (flat at 4), closes at the flip at 6:
    # -6 - 3 (the flip's fees land here); trip 3 opens at the flip point 6, closes at 7: 2 - (-6)
    assert trade_pnls(np.array(eq), np.array(pos)).tolist() == [3.0, -9.0, 8.0]
    assert trade_pnls(np.zeros(3), np.zeros(3, np.int64)).size == 0
    assert trade_pnls(np.array([0.0, 1.0, 2.0]), np.array([0, 1, 1])).size == 0  # still open: not a trade


def test_day_pnls_measure_each_day_from_the_previous_days_close():
    day = 86_400 * S
    ts = np.array([1, 2, 3, day + 1, day + 2, 3 * day + 5], dtype=np.int64)
    eq = np.array([0.0, 5.0, 4.0, 10.0, 7.0, 9.0])
    assert day_pnls(eq, ts).tolist() == [4.0, 3.0, 2.0]
    # days that open at 22:00 UTC (offset -2 h): 23:00 starts the next day; at UTC midnight all three are one day
    ts2 = np.array([0, 21 * 3600 * S, 23 * 3600 * S], dtype=np.int64)
    assert day_pnls(np.array([0.0, 1.0, 3.0]), ts2, day_offset_ns=-2 * 3600 * S).tolist() == [1.0, 2.0]
    assert day_pnls(np.array([0.0, 1.0, 3.0]), ts2).tolist() == [3.0]
