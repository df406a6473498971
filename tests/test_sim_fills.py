"""Hand-computed tiny cases (2 envs, <= 3 steps) for each fill rule, plus reset, latency, expiry, window end,
accounting, env features and the config / tape contracts. Every expected number is worked out in a comment."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from trainer.errors import InputError
from trainer.features.decision import NO_BUY_PX, NO_SELL_PX, DecisionTape
from trainer.sim import (ENV_FEATURES, ENV_REFLECTION, FLAT, HOLD, LIMIT_PASSIVE, LIMIT_TOUCH, LONG, MARKET, SHORT,
                         SimConfig, Simulator)
from trainer.sim.reference import offset_hash_py
from trainer.sim.state import offset_hash
from trainer.sim.synthetic import random_decision_tape

LEVELS, RADIUS, TICK_VALUE = 3, 2, 12.5


def make_tape(rows: list[dict]) -> DecisionTape:
    """rows[t] = dict(bids=[(px, sz), ...], asks=[...], sells=[(px, sz), ...], buys=[...]); trades are in (t, t+1]."""
    n, width = len(rows), 2 * RADIUS + 1
    bid_px, bid_sz, ask_px, ask_sz = (np.zeros((n, LEVELS), np.int64) for _ in range(4))
    sell_vol, buy_vol = np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
    sell_min, buy_max = np.full(n, NO_SELL_PX, np.int64), np.full(n, NO_BUY_PX, np.int64)
    for t, r in enumerate(rows):
        for i, (p, s) in enumerate(r["bids"]):
            bid_px[t, i], bid_sz[t, i] = p, s
        for i, (p, s) in enumerate(r["asks"]):
            ask_px[t, i], ask_sz[t, i] = p, s
        for trades, vol, is_sell in ((r.get("sells", []), sell_vol, True), (r.get("buys", []), buy_vol, False)):
            for p, s in trades:
                k = p - r["bids"][0][0] + RADIUS
                if 0 <= k < width:
                    vol[t, k] += s
                if is_sell:
                    sell_min[t] = min(sell_min[t], p)
                else:
                    buy_max[t] = max(buy_max[t], p)
    return DecisionTape(ts_ns=np.arange(n, dtype=np.int64), book_row=np.arange(n, dtype=np.int64), bid_px=bid_px,
                        bid_sz=bid_sz, ask_px=ask_px, ask_sz=ask_sz, anchor_px=bid_px[:, 0].copy(), sell_vol=sell_vol,
                        buy_vol=buy_vol, sell_min_px=sell_min, buy_max_px=buy_max, tick_value=TICK_VALUE,
                        trade_radius_ticks=RADIUS)


def cfg(**kw) -> SimConfig:
    base = dict(n_envs=2, max_position=3, maker_fee=0.5, taker_fee=1.0, reward_scale=1.0,
                urgency_lifetimes=(1, 2, 20), beyond_depth_ticks=2)
    base.update(kw)
    return SimConfig(**base)


def act(*rows: tuple[int, int, int, int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


HOLD_ALL = act((HOLD, 0, 0, 0), (HOLD, 0, 0, 0))
STD = dict(bids=[(100, 5), (99, 8), (98, 5)], asks=[(101, 4), (102, 4), (103, 4)])


def ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t]


def test_sim_market_order_walks_levels_and_prices_beyond_visible_depth() -> None:
    thin = dict(bids=[(100, 5), (99, 5), (98, 5)], asks=[(101, 1), (102, 1)])  # only 2 ask levels visible
    sim = Simulator(make_tape([thin] * 4), cfg(), "cpu")
    st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
    out = sim.step(st, act((LONG, 1, MARKET, 0), (LONG, 2, MARKET, 0)))
    # env0 buys 2: 1@101 + 1@102 = 203. env1 buys 3: 1@101 + 1@102 + 1@(102 + beyond_depth_ticks 2 = 104) = 307.
    assert ints(st.position) == [2, 3] and ints(st.cash_ticks) == [-203, -307]
    assert ints(st.taker_qty) == [2, 3] and ints(out.filled_qty) == [2, 3]
    assert out.fees.tolist() == [2.0, 3.0]
    # Mark at mid 100.5: env0 -203 + 201 = -2 ticks = -25.0, minus 2 fees = -27.0; env1 -307 + 301.5 = -5.5 ticks
    # = -68.75, minus 3 = -71.75.
    assert out.reward.tolist() == [-27.0, -71.75]
    assert not out.done.any()

    # env0 goes short 1 by market: sells 3 into the 5 @ 100; the first 2 close the long trip, the 3rd opens a short.
    out = sim.step(st, act((SHORT, 0, MARKET, 0), (HOLD, 0, 0, 0)))
    assert ints(st.position) == [-1, 3]
    # Trip gross: bought 203, sold 200 -> -3 ticks = -37.5; its fees are 4 taker contracts -> net -41.5: a loss.
    assert out.done.tolist() == [True, False] and ints(out.trip_closed) == [1, 0]
    assert out.trip_pnl.tolist() == [-41.5, 0.0]
    assert ints(st.round_trips) == [1, 0] and ints(st.wins) == [0, 0] and ints(st.realised_ticks) == [-3, 0]
    # The new short trip carries only its own contract: entry cost -100, one taker fee.
    assert ints(st.entry_cost_ticks) == [-100, 307] and ints(st.trip_taker_qty) == [1, 3]
    assert ints(st.time_in_trade) == [1, 2]


def test_sim_ioc_walks_the_book_only_up_to_its_limit_price_and_cancels_the_rest() -> None:
    thin = dict(bids=[(100, 5), (99, 5), (98, 5)], asks=[(101, 1), (102, 1)])  # only 2 ask levels visible
    tape = make_tape([STD, STD, STD])
    config = cfg(max_position=9, order_types=("ioc", "fok", "post_only"), marketable_limit_ticks=1)  # targets 3/6/9
    sim = Simulator(tape, config, "cpu")
    st = sim.reset(0, 3, start_rows=torch.tensor([0, 0]))
    out = sim.step(st, act((LONG, 2, 0, 0), (SHORT, 0, 0, 0)))
    # env0 buys 9 with limit 101 + 1 = 102: takes 4 @ 101 + 4 @ 102 = 812 and stops (103 is beyond the limit); the
    # 9th contract is cancelled. env1 sells 3 with limit 100 - 1 = 99: all 3 @ 100 (the best bid shows 5).
    assert ints(st.position) == [8, -3] and ints(st.cash_ticks) == [-812, 300] and ints(out.filled_qty) == [8, -3]
    assert ints(st.taker_qty) == [8, 3] and ints(st.market_orders) == [1, 1] and ints(st.rejected_orders) == [0, 0]
    assert ints(st.order_side) == [0, 0] and ints(st.limit_orders) == [0, 0]  # nothing rests
    # Never past the visible depth: a limit 5 ticks through the ask of a 2-level book takes those 2 contracts only
    # (a MARKET order would fill its 3rd contract at 102 + beyond_depth_ticks).
    sim = Simulator(make_tape([thin] * 3), cfg(order_types=("ioc", "fok", "post_only"), marketable_limit_ticks=5),
                    "cpu")
    st = sim.reset(0, 3, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 2, 0, 0), (LONG, 0, 0, 0)))
    assert ints(st.position) == [2, 1] and ints(st.cash_ticks) == [-203, -101]
    # With marketable_limit_ticks = 0 only the best level is taken: 1 @ 101, then nothing is left within the limit.
    sim = Simulator(make_tape([thin] * 3), cfg(order_types=("ioc", "fok", "post_only")), "cpu")
    st = sim.reset(0, 3, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 2, 0, 0), (SHORT, 2, 0, 0)))
    assert ints(st.position) == [1, -3] and ints(st.cash_ticks) == [-101, 300]


def test_sim_fok_fills_completely_within_its_limit_or_not_at_all() -> None:
    sim = Simulator(make_tape([STD] * 3), cfg(max_position=9, order_types=("ioc", "fok", "post_only"),
                                              marketable_limit_ticks=1), "cpu")
    st = sim.reset(0, 3, start_rows=torch.tensor([0, 0]))
    out = sim.step(st, act((LONG, 2, 1, 0), (LONG, 1, 1, 0)))
    # Limit 102 leaves 4 + 4 = 8 contracts in reach. env0 wants 9 > 8: killed, nothing fills, no fee.
    # env1 wants 6 <= 8: 4 @ 101 + 2 @ 102 = 608.
    assert ints(st.position) == [0, 6] and ints(st.cash_ticks) == [0, -608] and out.fees.tolist() == [0.0, 6.0]
    assert ints(st.rejected_orders) == [1, 0] and ints(st.market_orders) == [1, 1] and ints(st.order_side) == [0, 0]
    assert int(sim.stats(st)["rejected_orders"]) == 1


def test_sim_post_only_rests_inside_the_spread_and_is_rejected_when_it_would_cross() -> None:
    wide = dict(bids=[(100, 5), (99, 8), (98, 5)], asks=[(103, 4), (104, 4), (105, 4)], sells=[(101, 2)])
    sim = Simulator(make_tape([wide, STD, STD, STD]), cfg(order_types=("market", "limit_touch", "post_only")), "cpu")
    st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
    out = sim.step(st, act((LONG, 0, 2, 2), (SHORT, 0, 2, 2)))
    # Spread 100/103: env0 rests a buy @ 100 + 1 = 101, env1 a sell @ 103 - 1 = 102, both alone at a new price
    # (queue 0). Sellers print 2 @ 101 in (0, 1]: env0 fills 1 @ 101 as a maker. env1 keeps working; row 1 shows 4
    # @ 102 on the ask, which joined behind it (queue stays 0).
    assert ints(st.position) == [1, 0] and ints(st.maker_qty) == [1, 0] and ints(st.cash_ticks) == [-101, 0]
    assert ints(st.order_side) == [0, -1] and ints(st.order_px) == [0, 102] and ints(st.order_queue) == [0, 0]
    assert ints(st.limit_orders) == [1, 1] and ints(st.rejected_orders) == [0, 0]
    # Mark at row 1's mid 100.5: -101 + 100.5 = -0.5 tick = -6.25, minus one 0.5 maker fee.
    assert out.reward.tolist() == [-6.75, 0.0]
    sim.step(st, act((FLAT, 0, 2, 2), (SHORT, 1, 2, 2)))
    # Row 1 has a one-tick spread 100/101: a sell post-only @ 101 - 1 = 100 would hit the bid -> rejected. env0 keeps
    # its long; env1's new instruction still cancels its working sell @ 102 and places nothing.
    assert ints(st.position) == [1, 0] and ints(st.order_side) == [0, 0] and ints(st.rejected_orders) == [1, 1]
    assert ints(st.taker_qty) == [0, 0] and ints(st.limit_orders) == [1, 1]


def test_sim_unknown_aggressor_trade_inside_the_spread_fills_a_post_only_order_on_the_nearer_side() -> None:
    from trainer.data.tape import BookSeries, Instrument, MarketTape, TradeSeries
    from trainer.features.decision import build_decision_tape

    book = BookSeries(ts_ns=np.array([100, 200, 300], np.int64), bid_px=np.full((3, 1), 50, np.int64),
                      bid_sz=np.full((3, 1), 3, np.int64), ask_px=np.full((3, 1), 54, np.int64),
                      ask_sz=np.full((3, 1), 2, np.int64))
    # Prints with no aggressor flag (DBN side 'N') in (100, 200]: 2 @ 51 and 5 @ 53, inside the 50/54 spread.
    trades = TradeSeries(ts_ns=np.array([150, 160], np.int64), px=np.array([51, 53], np.int64),
                         size=np.array([2, 5], np.int64), side=np.zeros(2, np.int8))
    tape = build_decision_tape(MarketTape(Instrument("X", 1.0, 12.5), book, trades, ("tiny",)), np.arange(3), 4)
    sim = Simulator(tape, cfg(order_types=("market", "limit_touch", "post_only")), "cpu")
    st = sim.reset(0, 3, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 0, 2, 2), (SHORT, 2, 2, 2)))
    # Quote rule against 50/54 (mid 52): 51 was a seller, 53 a buyer. Our post-only buy @ 51 (alone at its price)
    # takes 1 of the 2 sold; our post-only sell of 3 @ 53 takes 3 of the 5 bought. Both as makers.
    assert ints(st.position) == [1, -3] and ints(st.cash_ticks) == [-51, 159] and ints(st.maker_qty) == [1, 3]


def test_sim_limit_queue_is_consumed_first_and_only_excess_fills_then_capped_when_level_shrinks() -> None:
    row0 = dict(STD, sells=[(100, 7)])  # sellers hit 7 @ 100 during (0, 1]
    row1 = dict(bids=[(100, 3), (99, 6), (98, 5)], asks=STD["asks"])
    sim = Simulator(make_tape([row0, row1, row1, row1]), cfg(), "cpu")
    st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
    out = sim.step(st, act((LONG, 2, LIMIT_TOUCH, 2), (LONG, 2, LIMIT_PASSIVE, 2)))
    # env0: buy 3 @ 100 behind 5; 7 sold @ 100 -> the 5 ahead trade first, 2 fill us; 1 left, nobody ahead.
    # env1: buy 3 @ 99 behind 8; no trade at 99; at row 1 the 99 level shows 6 -> queue capped 8 -> 6.
    assert ints(st.order_px) == [100, 99] and ints(st.order_remaining) == [1, 3] and ints(st.order_queue) == [0, 6]
    assert ints(st.position) == [2, 0] and ints(st.maker_qty) == [2, 0] and ints(st.cash_ticks) == [-200, 0]
    assert ints(st.limit_orders) == [1, 1] and ints(st.order_age) == [1, 1]
    # env0 equity: -200 + 2 x 100.5 = 1 tick = 12.5, minus 2 maker fees of 0.5 -> 11.5.
    assert out.reward.tolist() == [11.5, 0.0]


def test_sim_depth_increase_at_our_price_never_moves_us_forward_in_the_queue() -> None:
    # Our buy @ 100 joins 5 ahead at row 0. Row 1 shows 100 with 5 (unchanged) or 50 (45 joined, behind us);
    # sellers print 6 @ 100 in (1, 2]. Either way 5 trade ahead of us and the 6th fills us: the increase neither
    # helps (queue < 5) nor hurts (queue := 50, no fill).
    results = []
    for shown in (5, 50):
        row1 = dict(bids=[(100, shown), (99, 8), (98, 5)], asks=STD["asks"], sells=[(100, 6)])
        sim = Simulator(make_tape([STD, row1, STD, STD]), cfg(), "cpu")
        st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
        sim.step(st, act((LONG, 0, LIMIT_TOUCH, 2), (LONG, 1, LIMIT_TOUCH, 2)))
        assert ints(st.order_queue) == [5, 5]
        sim.step(st, HOLD_ALL)
        # env0 (1 contract) filled by the 6th; env1 (2 contracts) got 1 of them and keeps working with nobody ahead.
        assert ints(st.position) == [1, 1] and ints(st.order_remaining) == [0, 1] and ints(st.order_queue) == [0, 0]
        results.append({k: v.clone() for k, v in st.state_dict().items()})
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_sim_trade_at_our_price_and_the_depth_drop_it_causes_count_once() -> None:
    # Buy 3 @ 100 behind 5. Sellers print 3 @ 100 in (0, 1], so row 1 shows 5 - 3 = 2 at 100: the same 3 contracts,
    # seen once as trades and once as a smaller level. Queue 5 - 3 = 2, capped at min(2, 2) = 2; no fill (counting
    # both would leave 5 - 3 - 3 < 0 ahead and fill us). With one more cancelled (row 1 shows 1), the cap applies
    # the extra drop only: queue 1.
    for shown, queue_after in ((2, 2), (1, 1)):
        row0 = dict(STD, sells=[(100, 3)])
        row1 = dict(bids=[(100, shown), (99, 8), (98, 5)], asks=STD["asks"], sells=[(100, queue_after + 1)])
        sim = Simulator(make_tape([row0, row1, row1, row1]), cfg(), "cpu")
        st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
        sim.step(st, act((LONG, 2, LIMIT_TOUCH, 2), (HOLD, 0, 0, 0)))
        assert ints(st.order_queue)[0] == queue_after and ints(st.position)[0] == 0 and ints(st.order_remaining)[0] == 3
        # In (1, 2] sellers print queue + 1 @ 100: the queue trades away and exactly 1 contract fills us.
        sim.step(st, HOLD_ALL)
        assert ints(st.position)[0] == 1 and ints(st.order_remaining)[0] == 2 and ints(st.maker_qty)[0] == 1


def test_sim_trade_through_or_crossing_opposite_best_fills_the_rest_at_the_limit_price() -> None:
    row0 = dict(STD, sells=[(99, 1)])  # a seller trades 1 @ 99: through our 100 bid
    row1 = dict(bids=[(101, 2), (100, 5), (99, 8)], asks=[(102, 4), (103, 4), (104, 4)])  # best bid 101 crosses 101
    sim = Simulator(make_tape([row0, row1, row1, row1]), cfg(), "cpu")
    st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
    out = sim.step(st, act((LONG, 2, LIMIT_TOUCH, 2), (SHORT, 2, LIMIT_TOUCH, 2)))
    # env0 bought 3 @ 100 (queue of 5 ignored: traded through); env1 sold 3 @ 101 (bid moved onto our ask).
    assert ints(st.position) == [3, -3] and ints(st.cash_ticks) == [-300, 303]
    assert ints(st.maker_qty) == [3, 3] and ints(st.limit_filled) == [1, 1] and ints(st.order_side) == [0, 0]
    # Mid 101.5: env0 -300 + 304.5 = 4.5 ticks = 56.25 - 1.5 fees = 54.75; env1 303 - 304.5 = -18.75 - 1.5 = -20.25.
    assert out.reward.tolist() == [54.75, -20.25]


def test_sim_queue_kept_when_level_leaves_visible_depth_and_zeroed_when_displayed_level_empties() -> None:
    row1 = dict(bids=[(103, 5), (102, 5), (101, 5)], asks=[(104, 4), (105, 4), (106, 4)])  # full, all above 100
    row2 = dict(bids=[(101, 5), (99, 2)], asks=[(102, 4), (103, 4), (104, 4)])  # thin: 2 bid levels, no 100
    sim = Simulator(make_tape([STD, row1, row2, row2, row2]), cfg(), "cpu")
    st = sim.reset(0, 5, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 2, LIMIT_PASSIVE, 2), (LONG, 2, LIMIT_TOUCH, 2)))
    # env0 @ 99 behind 8, env1 @ 100 behind 5. Row 1 shows 3 full levels down to 101: both prices are below the
    # visible depth, so the queues are unknown and kept.
    assert ints(st.order_queue) == [8, 5]
    sim.step(st, HOLD_ALL)
    # Row 2 shows only 2 bid levels: 99 is displayed with 2 -> queue capped to 2; 100 is inside the visible range
    # but absent -> that level is empty, nobody is ahead.
    assert ints(st.order_queue) == [2, 0] and ints(st.order_remaining) == [3, 3] and ints(st.order_age) == [2, 2]


def test_sim_latency_delays_execution_to_a_later_book() -> None:
    rows = [dict(STD), dict(bids=[(101, 5)], asks=[(102, 4)]), dict(bids=[(102, 5)], asks=[(103, 4)])] + [STD] * 2
    sim = Simulator(make_tape(rows), cfg(latency_steps=1), "cpu")
    st = sim.reset(0, 5, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 0, MARKET, 0), (HOLD, 0, 0, 0)))
    assert ints(st.position) == [0, 0] and ints(st.pending[:, 0]) == [(LONG * 3 + 0) * 9, (HOLD * 3) * 9]
    sim.step(st, HOLD_ALL)
    # The buy chosen at row 0 reached the exchange at row 1 and paid row 1's ask, 102 (not row 0's 101).
    assert ints(st.position) == [1, 0] and ints(st.cash_ticks) == [-102, 0]
    assert ints(st.action_counts[0]) == [0, 1, 1, 0]


@pytest.mark.parametrize("on_expiry", ["cancel", "market"])
def test_sim_unfilled_limit_expires_after_its_lifetime(on_expiry: str) -> None:
    rows = [STD, dict(bids=[(101, 5)], asks=[(102, 4)]), dict(bids=[(102, 5)], asks=[(103, 4)])] + [STD] * 2
    sim = Simulator(make_tape(rows), cfg(on_expiry=on_expiry), "cpu")
    st = sim.reset(0, 5, start_rows=torch.tensor([0, 0]))
    # Both buy 1 @ 100 (touch) with no sellers around; env0 lives 1 step, env1 2 steps.
    sim.step(st, act((LONG, 0, LIMIT_TOUCH, 0), (LONG, 0, LIMIT_TOUCH, 1)))
    assert ints(st.expired_orders) == [1, 0] and ints(st.order_side) == [0, 1]
    sim.step(st, HOLD_ALL)
    assert ints(st.expired_orders) == [1, 1] and ints(st.order_side) == [0, 0]
    if on_expiry == "market":
        # env0 converted at row 1's ask 102, env1 at row 2's ask 103, both as takers.
        assert ints(st.position) == [1, 1] and ints(st.cash_ticks) == [-102, -103] and ints(st.taker_qty) == [1, 1]
        assert ints(st.market_orders) == [1, 1]
    else:
        assert ints(st.position) == [0, 0] and ints(st.taker_qty) == [0, 0] and ints(st.market_orders) == [0, 0]


def test_sim_same_price_limit_amends_in_place_keeping_queue_and_a_new_price_replaces() -> None:
    sim = Simulator(make_tape([STD] * 5), cfg(), "cpu")
    st = sim.reset(0, 5, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 2, LIMIT_TOUCH, 2), (LONG, 2, LIMIT_TOUCH, 2)))
    st.order_queue.copy_(torch.tensor([1, 1]))  # pretend the queue ahead has mostly traded away
    sim.step(st, act((LONG, 0, LIMIT_TOUCH, 2), (LONG, 0, LIMIT_PASSIVE, 2)))
    # env0: same side and price -> amended to 1 contract, keeps its queue place (then capped to the displayed 5
    # it already was below) and its age. env1: price 99 -> a fresh order behind 99's 8 (capped by row 2's 8).
    assert ints(st.order_px) == [100, 99] and ints(st.order_remaining) == [1, 1]
    assert ints(st.order_queue) == [1, 8] and ints(st.order_age) == [2, 1] and ints(st.limit_orders) == [1, 2]


def test_sim_window_end_flattens_counts_the_trip_and_replaces_the_env_keeping_stats() -> None:
    last = dict(bids=[(105, 5)], asks=[(106, 4)])
    sim = Simulator(make_tape([STD, STD, STD, last]), cfg(seed=9), "cpu")
    st = sim.reset(0, 4, start_rows=torch.tensor([0, 1]))
    sim.step(st, act((LONG, 0, MARKET, 0), (LONG, 0, MARKET, 0)))  # both buy 1 @ 101
    out = sim.step(st, HOLD_ALL)
    # env1 reached row 3 = window_stop - 1: sold 1 @ 105 (taker). Gross 4 ticks = 50, fees 2 -> +48, a win.
    assert out.truncated.tolist() == [False, True] and out.done.tolist() == [False, True]
    assert out.trip_pnl.tolist() == [0.0, 48.0] and ints(st.wins) == [0, 1] and ints(st.position) == [1, 0]
    assert ints(st.reset_count) == [0, 1]
    # Re-placed by the counter hash in [0, 2]; statistics survive the re-placement.
    assert int(st.cursor[1]) == offset_hash_py(9, 1, 1) % 3
    assert ints(st.round_trips) == [0, 1] and ints(st.taker_qty) == [1, 2]
    # Reward of env1 this step: equity went from 1 x 100.5 - 101 = -0.5 ticks to +4 ticks: 4.5 x 12.5 = 56.25,
    # minus the 1.0 taker fee of the liquidation.
    assert float(out.reward[1]) == 55.25


def test_sim_flat_closes_with_a_limit_and_hold_keeps_everything() -> None:
    row0 = dict(STD, buys=[(101, 9)])  # buyers lift 9 @ 101 during (0, 1]
    sim = Simulator(make_tape([STD, row0, STD, STD, STD]), cfg(), "cpu")
    st = sim.reset(0, 5, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 1, MARKET, 0), (LONG, 1, MARKET, 0)))  # both long 2 @ 101 (4 shown) = 202
    out = sim.step(st, act((FLAT, 2, LIMIT_TOUCH, 2), (HOLD, 2, LIMIT_TOUCH, 2)))
    # env0 sells 2 @ 101 behind 4: 9 bought -> 4 ahead trade, 2 of the 5 excess fill us; trip closed:
    # gross 202 - 202 = 0, fees 2 taker x 1.0 + 2 maker x 0.5 = 3.0 -> -3.0 (not a win). env1 untouched.
    assert ints(st.position) == [0, 2] and out.done.tolist() == [True, False] and out.trip_pnl.tolist() == [-3.0, 0.0]
    assert ints(st.wins) == [0, 0] and ints(st.maker_qty) == [2, 0] and ints(st.limit_filled) == [1, 0]
    assert ints(st.time_in_trade) == [0, 2] and ints(st.action_counts[:, HOLD]) == [0, 1]


def test_sim_inventory_penalty_is_bounded_by_its_coefficient() -> None:
    tape = make_tape([STD] * 4)
    plain, shaped = Simulator(tape, cfg(), "cpu"), Simulator(tape, cfg(inventory_penalty=0.3), "cpu")
    a, b = plain.reset(0, 4, start_rows=torch.tensor([0, 0])), shaped.reset(0, 4, start_rows=torch.tensor([0, 0]))
    acts = act((LONG, 2, MARKET, 0), (SHORT, 0, MARKET, 0))
    diff = plain.step(a, acts).reward - shaped.step(b, acts).reward
    # |position| / max_position = 3/3 and 1/3 -> penalties 0.3 and 0.1.
    assert torch.allclose(diff, torch.tensor([0.3, 0.1]))


def test_sim_env_features_and_equity_on_a_hand_case() -> None:
    sim = Simulator(make_tape([STD] * 4), cfg(), "cpu")
    st = sim.reset(0, 4, start_rows=torch.tensor([0, 0]))
    sim.step(st, act((LONG, 1, MARKET, 0), (SHORT, 2, LIMIT_PASSIVE, 2)))
    f = sim.env_features(st)
    assert f.shape == (2, ENV_FEATURES) and f.dtype == torch.float32
    # env0: long 2 bought @ 101 for 202, mid 100.5 -> unrealised 2 x 100.5 - 202 = -1 tick -> tanh(-1 / (3 x 8)).
    want0 = [2 / 3, math.tanh(-1 / 24), 0.0, 0.0, 0.0, 0.0, 1 / 51]
    # env1: sell 3 @ 102 behind 4, age 1 of 20 -> queue fraction 4 / 7, remaining 3/3.
    want1 = [0.0, 0.0, -1.0, 1 / 20, 4 / 7, 1.0, 0.0]
    assert torch.allclose(f, torch.tensor([want0, want1]), atol=1e-6)
    # Equity: env0 -1 tick x 12.5 - 2 taker fees = -14.5; env1 nothing filled.
    assert sim.equity(st).tolist() == [-14.5, 0.0]
    stats = sim.stats(st)
    assert float(stats["fees"]) == 2.0 and int(stats["limit_orders"]) == 1 and int(stats["actions_short"]) == 1


def test_sim_feed_latency_shows_the_market_k_rows_late_but_orders_meet_the_true_book() -> None:
    rows = [STD, STD, dict(bids=[(102, 5)], asks=[(103, 4)]), dict(bids=[(104, 5)], asks=[(105, 4)]), STD, STD]
    tape = make_tape(rows)
    late, now = Simulator(tape, cfg(feed_latency_steps=2), "cpu"), Simulator(tape, cfg(), "cpu")
    starts = torch.tensor([2, 3])
    st_late, st_now = late.reset(0, 6, start_rows=starts), now.reset(0, 6, start_rows=starts)
    assert ints(late.obs_rows(st_late)) == [0, 1] and ints(now.obs_rows(st_now)) == [2, 3]
    acts = act((LONG, 0, MARKET, 0), (HOLD, 0, 0, 0))
    late.step(st_late, acts)
    now.step(st_now, acts)
    # The buy executes at the true book of its cursor row 2 (ask 103) in both: feed latency delays what the agent
    # sees, not where its order lands. Equity is marked at the true row 3 mid 104.5: +1.5 ticks = 18.75 - 1.0 fee.
    assert ints(st_late.cash_ticks) == [-103, 0] and ints(st_late.cursor) == [3, 4]
    assert late.equity(st_late).tolist() == now.equity(st_now).tolist() == [17.75, 0.0]
    # The agent sees row 1 (mid 100.5): unrealised 100.5 - 103 = -2.5 ticks; without feed latency row 3: +1.5.
    assert float(late.env_features(st_late)[0, 1]) == pytest.approx(math.tanh(-2.5 / 24))
    assert float(now.env_features(st_now)[0, 1]) == pytest.approx(math.tanh(1.5 / 24))
    own_state = [0, 2, 3, 4, 5, 6]  # position, order side / age / queue / remaining, time in trade: not delayed
    assert torch.equal(late.env_features(st_late)[:, own_state], now.env_features(st_now)[:, own_state])
    # Reset keeps the observed row's look-back inside the window: cursors start at window_start + min_history + k.
    drawn = Simulator(make_tape([STD] * 40), cfg(n_envs=64, feed_latency_steps=3), "cpu").reset(10, 40, min_history=5)
    assert int(drawn.cursor.min()) == 18 and int(drawn.cursor.max()) <= 38
    with pytest.raises(ValueError, match="feed_latency_steps=2 leaves no start row"):
        late.reset(0, 6, min_history=3)


def test_sim_reset_offsets_are_deterministic_in_range_and_seeded() -> None:
    tape = make_tape([STD] * 50)
    a = Simulator(tape, cfg(n_envs=64, seed=1), "cpu").reset(10, 50, min_history=5)
    b = Simulator(tape, cfg(n_envs=64, seed=1), "cpu").reset(10, 50, min_history=5)
    c = Simulator(tape, cfg(n_envs=64, seed=2), "cpu").reset(10, 50, min_history=5)
    assert torch.equal(a.cursor, b.cursor) and not torch.equal(a.cursor, c.cursor)
    assert int(a.cursor.min()) >= 15 and int(a.cursor.max()) <= 48 and len(set(ints(a.cursor))) > 20
    with pytest.raises(ValueError, match="leaves no start row"):
        Simulator(tape, cfg(), "cpu").reset(10, 12, min_history=1)


def test_sim_offset_hash_matches_plain_python_integers() -> None:
    env = torch.arange(0, 5000, 7, dtype=torch.int64)
    count = (env * 7919) % 100_003
    got = offset_hash(0xDEADBEEF, env, count)
    want = [offset_hash_py(0xDEADBEEF, int(e), int(k)) for e, k in zip(env, count)]
    assert ints(got) == want and int(got.min()) >= 0 and int(got.max()) < 2**32


def test_sim_state_dict_resume_continues_identically() -> None:
    from trainer.sim.synthetic import random_decision_tape

    tape = random_decision_tape(200, levels=4, radius=3, seed=4)
    sim = Simulator(tape, cfg(n_envs=8, latency_steps=2), "cpu")
    g = torch.Generator().manual_seed(0)
    acts = [torch.stack([torch.randint(0, b, (8,), generator=g) for b in (4, 3, 3, 3)], 1) for _ in range(60)]
    st = sim.reset(0, 60)
    for a in acts[:30]:
        sim.step(st, a)
    saved = {k: v.clone() for k, v in st.state_dict().items()}
    resumed = sim.reset(0, 60)
    resumed.load_state_dict(saved)
    for a in acts[30:]:
        r1, r2 = sim.step(st, a).reward, sim.step(resumed, a).reward
        assert torch.equal(r1, r2)
    assert all(torch.equal(x, y) for x, y in zip(st.state_dict().values(), resumed.state_dict().values()))
    with pytest.raises(ValueError, match="position"):
        bad = dict(saved, position=torch.zeros(3, dtype=torch.int64))
        resumed.load_state_dict(bad)


def test_sim_config_rejects_bad_values_naming_the_field() -> None:
    for kw, field in ((dict(n_envs=0), "n_envs"), (dict(on_expiry="later"), "on_expiry"),
                      (dict(magnitudes=(0.0, 0.5, 1.0)), "magnitudes"), (dict(taker_fee=float("nan")), "taker_fee"),
                      (dict(urgency_lifetimes=(0, 1, 2)), "urgency_lifetimes"), (dict(latency_steps=-1), "latency"),
                      (dict(order_types=("market", "ioc", "market")), "order_types"),
                      (dict(order_types=("market", "limit", "fok")), "order_types"),
                      (dict(order_types=("market", "ioc")), "order_types"),
                      (dict(marketable_limit_ticks=-1), "marketable_limit_ticks"),
                      (dict(post_only_ticks=1.5), "post_only_ticks"), (dict(feed_latency_steps=-2), "feed_latency")):
        with pytest.raises(ValueError, match=field):
            SimConfig(**kw)
    assert SimConfig(max_position=6).target_contracts == (2, 4, 6)
    assert SimConfig(order_types=["post_only", "ioc", "fok"]).order_kind_codes == (5, 3, 4)  # a list from a file


def test_sim_refuses_one_sided_or_crossed_books_naming_the_row() -> None:
    one_sided = dict(bids=[(100, 5)], asks=[])
    with pytest.raises(InputError, match="record 2.*one-sided"):
        Simulator(make_tape([STD, STD, one_sided]), cfg(), "cpu")
    crossed = dict(bids=[(101, 5)], asks=[(101, 4)])
    with pytest.raises(InputError, match="record 1.*crossed"):
        Simulator(make_tape([STD, crossed]), cfg(), "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("order_types,feed", [(("market", "limit_touch", "limit_passive"), 0),
                                              (("ioc", "fok", "post_only"), 2)])
def test_sim_cuda_matches_cpu_and_steps_under_a_cuda_graph_without_host_syncs(order_types, feed) -> None:
    from trainer.sim.synthetic import random_decision_tape

    tape = random_decision_tape(500, levels=10, radius=8, seed=2)
    config = cfg(n_envs=256, latency_steps=1, on_expiry="market", order_types=order_types, feed_latency_steps=feed,
                 marketable_limit_ticks=1)
    cpu, gpu = Simulator(tape, config, "cpu"), Simulator(tape, config, "cuda")
    sc, sg = cpu.reset(0, 500, 20), gpu.reset(0, 500, 20)
    g = torch.Generator().manual_seed(1)
    acts = [torch.stack([torch.randint(0, b, (256,), generator=g) for b in (4, 3, 3, 3)], 1) for _ in range(50)]
    acts_gpu = [a.cuda() for a in acts]  # host→device copies happen before the no-sync region
    rewards_gpu = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for a in acts_gpu:
            rewards_gpu.append(gpu.step(sg, a).reward.clone())  # any host sync inside step raises here
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, rg in zip(acts, rewards_gpu):
        assert torch.allclose(cpu.step(sc, a).reward, rg.cpu())
    assert all(torch.equal(x, y.cpu()) for x, y in zip(sc.state_dict().values(), sg.state_dict().values()))
    static_a = acts[0].cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            gpu.step(sg, static_a)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gpu.step(sg, static_a)
    before = sg.action_counts.sum().item()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert sg.action_counts.sum().item() == before + 5 * 256 and torch.isfinite(out.reward).all()


def reflect_tape(tape: DecisionTape, c: int = 50_000) -> DecisionTape:
    """The market upside down (every price p -> c - p, bids and asks swapped); the tape must carry no trades."""
    assert not tape.sell_vol.any() and not tape.buy_vol.any()
    bid_px = np.where(tape.ask_sz > 0, c - tape.ask_px, 0)
    ask_px = np.where(tape.bid_sz > 0, c - tape.bid_px, 0)
    return dataclasses.replace(tape, bid_px=bid_px, bid_sz=tape.ask_sz.copy(), ask_px=ask_px,
                               ask_sz=tape.bid_sz.copy(), anchor_px=bid_px[:, 0].copy())


def test_env_features_of_the_reflected_market_under_mirrored_orders_are_the_reflection_signs_times_the_originals():
    """ENV_REFLECTION (what AgentConfig.mirror reflects the env state with): the same market upside down, every LONG
    sent as SHORT and back, gives the same rewards and PnL, and env features equal to the signs times the originals."""
    n = 240
    tape = random_decision_tape(n, seed=4)
    tape = dataclasses.replace(tape, sell_vol=np.zeros_like(tape.sell_vol), buy_vol=np.zeros_like(tape.buy_vol),
                               sell_min_px=np.full(n, NO_SELL_PX), buy_max_px=np.full(n, NO_BUY_PX))
    sims = [Simulator(t, cfg(n_envs=4, inventory_penalty=0.2), "cpu") for t in (tape, reflect_tape(tape))]
    states = [s.reset(10, n, start_rows=torch.tensor([10, 40, 70, 100])) for s in sims]
    signs = torch.tensor(ENV_REFLECTION)
    gen = torch.Generator().manual_seed(0)
    positions = set()
    for _ in range(100):
        a = torch.stack([torch.randint(0, 4, (4,), generator=gen), torch.randint(0, 3, (4,), generator=gen),
                         torch.full((4,), MARKET), torch.zeros(4, dtype=torch.int64)], dim=1)
        mirrored = a.clone()
        mirrored[:, 0] = torch.where(a[:, 0] == LONG, SHORT, torch.where(a[:, 0] == SHORT, LONG, a[:, 0]))
        up, down = sims[0].step(states[0], a), sims[1].step(states[1], mirrored)
        torch.testing.assert_close(down.reward, up.reward)
        torch.testing.assert_close(sims[1].env_features(states[1]), sims[0].env_features(states[0]) * signs)
        positions.update(int(p) for p in states[0].position)
    assert {-3, 3} <= positions  # both sides, at full size, were visited
    up_stats, down_stats = (s.stats(st) for s, st in zip(sims, states))
    assert float(up_stats["round_trips"]) > 10
    for key in ("net_pnl", "round_trips", "win_rate"):
        torch.testing.assert_close(down_stats[key], up_stats[key])
