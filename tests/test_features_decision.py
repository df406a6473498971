from __future__ import annotations

import numpy as np
import pytest

from test_features_synthetic_tape import random_tape
from trainer.data.tape import BookSeries, Instrument, MarketTape, TradeSeries
from trainer.features.clock import decision_rows
from trainer.features.config import FeatureConfig
from trainer.features.decision import NO_BUY_PX, NO_SELL_PX, DecisionTape, build_decision_tape

LOBSTER = "lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"


def reference_decision_tape(tape: MarketTape, rows: np.ndarray, radius: int) -> dict[str, np.ndarray]:
    """Slow and obvious: one Python loop over trades, one linear scan for each trade's interval."""
    ts = [int(tape.book.ts_ns[r]) for r in rows]
    n, width = len(rows), 2 * radius + 1
    sell_vol = np.zeros((n, width), np.int64)
    buy_vol = np.zeros((n, width), np.int64)
    sell_min = [NO_SELL_PX] * n
    buy_max = [NO_BUY_PX] * n
    b = tape.book
    for x, px, size, side in zip(tape.trades.ts_ns.tolist(), tape.trades.px.tolist(),
                                 tape.trades.size.tolist(), tape.trades.side.tolist()):
        t = next((i for i in range(n - 1) if ts[i] < x <= ts[i + 1]), None)
        if t is None or size <= 0:
            continue
        r = rows[t]
        if side == 0:  # quote rule against the last book row strictly before the trade; at the mid: dropped
            before = [i for i in range(len(b.ts_ns)) if b.ts_ns[i] < x]
            if not before or b.bid_sz[before[-1], 0] <= 0 or b.ask_sz[before[-1], 0] <= 0:
                continue
            twice_mid = int(b.bid_px[before[-1], 0]) + int(b.ask_px[before[-1], 0])
            if 2 * px == twice_mid:
                continue
            side = 1 if 2 * px > twice_mid else -1
        k = px - int(b.bid_px[r, 0]) + radius
        if side == -1:
            sell_min[t] = min(sell_min[t], px)
            if 0 <= k < width:
                sell_vol[t, k] += size
        else:
            buy_max[t] = max(buy_max[t], px)
            if 0 <= k < width:
                buy_vol[t, k] += size
    return {"sell_vol": sell_vol, "buy_vol": buy_vol, "sell_min_px": np.array(sell_min, np.int64),
            "buy_max_px": np.array(buy_max, np.int64)}


def _assert_matches_reference(tape: MarketTape, rows: np.ndarray, radius: int) -> DecisionTape:
    got = build_decision_tape(tape, rows, radius)
    want = reference_decision_tape(tape, rows, radius)
    for name, arr in want.items():
        np.testing.assert_array_equal(getattr(got, name), arr, err_msg=name)
    np.testing.assert_array_equal(got.bid_sz, tape.book.bid_sz[rows])
    np.testing.assert_array_equal(got.ask_px, tape.book.ask_px[rows])
    np.testing.assert_array_equal(got.anchor_px, tape.book.bid_px[rows, 0])
    np.testing.assert_array_equal(got.ts_ns, tape.book.ts_ns[rows])
    np.testing.assert_array_equal(got.book_row, rows)
    for name, arr in got.arrays().items():
        assert arr.dtype == np.int64, name
    return got


def test_hand_checked_tiny_tape():
    # Decisions at book rows 0, 2, 3 -> ts 100, 300, 400. Best bid 50/51/49, best ask 52/53/51.
    book = BookSeries(
        ts_ns=np.array([100, 200, 300, 400], np.int64),
        bid_px=np.array([[50], [50], [51], [49]], np.int64), bid_sz=np.array([[3], [3], [4], [2]], np.int64),
        ask_px=np.array([[52], [52], [53], [51]], np.int64), ask_sz=np.array([[1], [1], [2], [5]], np.int64),
    )
    trades = TradeSeries(
        ts_ns=np.array([100, 150, 160, 170, 300, 301, 350, 400, 401], np.int64),
        px=np.array([99, 50, 52, 51, 60, 45, 51, 53, 70], np.int64),
        size=np.array([7, 2, 3, 4, 5, 6, 1, 8, 9], np.int64),
        side=np.array([1, 0, 0, 0, 1, -1, 0, 0, 1], np.int8),
    )
    tape = MarketTape(Instrument("X", 1.0, 1.0), book, trades, ("tiny",))
    d = build_decision_tape(tape, np.array([0, 2, 3]), radius=2)
    # t=0 covers (100, 300]: ts=100 trade belongs to no interval; 150@50 unknown vs bid 50 -> sell bucket 2;
    # 160@52 unknown vs ask 52 -> buy bucket 4; 170@51 at the mid of 50/52 -> unresolved, left out; 300@60 buy,
    # off grid.
    assert d.sell_vol.tolist()[0] == [0, 0, 2, 0, 0]
    assert d.buy_vol.tolist()[0] == [0, 0, 0, 0, 3]
    assert d.sell_min_px[0] == 50 and d.buy_max_px[0] == 60
    # t=1 (anchor 51) covers (300, 400]: 301@45 sell off grid; 350@51 unknown at bid 51 -> sell bucket 2;
    # 400@53 unknown at ask 53 of the book prevailing before ts 400 (row 2, 51/53) -> buy bucket 4.
    assert d.sell_vol.tolist()[1] == [0, 0, 1, 0, 0]
    assert d.buy_vol.tolist()[1] == [0, 0, 0, 0, 8]
    assert d.sell_min_px[1] == 45 and d.buy_max_px[1] == 53
    # The last row's interval is empty by contract (the 401 trade is after the last decision).
    assert d.sell_vol[2].sum() == 0 and d.buy_vol[2].sum() == 0
    assert d.sell_min_px[2] == NO_SELL_PX and d.buy_max_px[2] == NO_BUY_PX
    assert d.anchor_px.tolist() == [50, 51, 49] and d.trade_radius_ticks == 2 and d.tick_value == 1.0
    _assert_matches_reference(tape, np.array([0, 2, 3]), 2)


def test_unknown_aggressor_trades_inside_the_spread_go_to_the_nearer_side_of_the_prevailing_book():
    # Decisions at book rows 0 and 2 (ts 100, 300); the book between them moves at ts 200: 50/54 -> 56/60.
    book = BookSeries(
        ts_ns=np.array([100, 200, 300], np.int64),
        bid_px=np.array([[50], [56], [56]], np.int64), bid_sz=np.array([[3], [3], [3]], np.int64),
        ask_px=np.array([[54], [60], [60]], np.int64), ask_sz=np.array([[2], [2], [2]], np.int64),
    )
    trades = TradeSeries(  # all with unknown aggressor, all in the interval (100, 300] of decision 0
        ts_ns=np.array([110, 120, 130, 200, 250, 260], np.int64),
        px=np.array([51, 53, 52, 53, 57, 58], np.int64),
        size=np.array([1, 2, 4, 8, 16, 32], np.int64),
        side=np.zeros(6, np.int8),
    )
    tape = MarketTape(Instrument("X", 1.0, 1.0), book, trades, ("tiny",))
    d = build_decision_tape(tape, np.array([0, 2]), radius=8)  # anchor 50: bucket = px - 50 + 8
    # Against 50/54 (mid 52): 51 -> sell, 53 -> buy, 52 at the mid -> left out. ts 200 is still priced against the
    # row before it (50/54): 53 -> buy. Against 56/60 (mid 58) from ts 200 on: 57 -> sell, 58 at the mid -> left out
    # (against the decision's own book 50/54 the 57 would have been a buy: the prevailing book decides).
    sells, buys = np.zeros(17, np.int64), np.zeros(17, np.int64)
    sells[51 - 50 + 8], sells[57 - 50 + 8] = 1, 16
    buys[53 - 50 + 8] = 2 + 8
    assert d.sell_vol[0].tolist() == sells.tolist() and d.buy_vol[0].tolist() == buys.tolist()
    assert d.sell_min_px[0] == 51 and d.buy_max_px[0] == 53
    _assert_matches_reference(tape, np.array([0, 2]), 8)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("radius", [1, 3, 16])
def test_vectorised_builder_matches_per_trade_reference_on_random_tapes(seed, radius):
    tape = random_tape(n_rows=500, n_trades=400, seed=seed)
    rows = decision_rows(tape.book, FeatureConfig(clock_events=7))
    _assert_matches_reference(tape, rows, radius)


def test_builder_with_duplicate_decision_timestamps_gives_the_instant_to_the_later_decision():
    tape = random_tape(n_rows=300, n_trades=300, seed=9, dup_prob=0.6)
    rows = np.flatnonzero((tape.book.bid_sz[:, 0] > 0))  # not clock-snapped: several rows share a ts
    assert (np.diff(tape.book.ts_ns[rows]) == 0).any()
    _assert_matches_reference(tape, rows, 4)


def test_builder_refuses_bad_rows_and_radius():
    tape = random_tape(seed=1)
    for rows in (np.array([], np.int64), np.array([3, 3]), np.array([5, 2]), np.array([0, len(tape.book)])):
        with pytest.raises(ValueError, match="rows"):
            build_decision_tape(tape, rows, 4)
    with pytest.raises(ValueError, match="radius"):
        build_decision_tape(tape, np.array([1, 2]), 0)


def test_slice_keeps_rows_aligned():
    tape = random_tape(seed=2)
    d = build_decision_tape(tape, decision_rows(tape.book, FeatureConfig(clock_events=3)), 4)
    s = d.slice(5, 9)
    assert len(s) == 4 and np.array_equal(s.sell_vol, d.sell_vol[5:9]) and s.trade_radius_ticks == 4


def test_real_lobster_tape_matches_reference_and_accounts_for_every_trade(shared_data):
    from trainer.data.spec import load_tape

    tape = load_tape(f"lobster:{shared_data / LOBSTER}")
    rows = decision_rows(tape.book, FeatureConfig(clock_events=25), start_ns=tape.preopen_end_ns)
    # The reference scans all intervals per trade; use a slice of the day to keep it to a few seconds.
    sub = rows[: 800]
    d = _assert_matches_reference(tape, sub, 16)
    ts = d.ts_ns
    inside = (tape.trades.ts_ns > ts[0]) & (tape.trades.ts_ns <= ts[-1])
    # LOBSTER executions have a known side: histogram volume + off-grid volume = all traded volume.
    on_grid = d.sell_vol.sum() + d.buy_vol.sum()
    assert 0 < on_grid <= tape.trades.size[inside].sum()
    assert (d.sell_min_px != NO_SELL_PX).sum() > 50 and (d.buy_max_px != NO_BUY_PX).sum() > 50
