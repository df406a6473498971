"""A seeded random MarketTape with the awkward cases the feature code must survive, and its own checks.

Other tests/test_features_*.py import `random_tape` from here (pytest puts tests/ on sys.path).
"""
from __future__ import annotations

import numpy as np

from trainer.data.tape import BookSeries, Instrument, MarketTape, TradeSeries

DAY0_NS = 1_340_000_000 * 1_000_000_000  # a 2012 epoch day: keeps ts realistic (large int64)


def random_tape(n_rows: int = 400, levels: int = 4, n_trades: int = 300, seed: int = 0, *,
                dup_prob: float = 0.2, hole_prob: float = 0.15, one_sided_prob: float = 0.03,
                unknown_prob: float = 0.3) -> MarketTape:
    """Random-walk book with duplicate timestamps, absent (size 0, price 0) levels at every depth incl. the
    best, and trades at book timestamps, between them, off the grid and with unknown aggressor side."""
    rng = np.random.default_rng(seed)
    gaps = np.where(rng.random(n_rows) < dup_prob, 0, rng.integers(1, 2_000_000, n_rows))
    gaps[0] = 0
    ts = DAY0_NS + 34_200 * 10**9 + np.cumsum(gaps).astype(np.int64)
    bid0 = 10_000 + np.cumsum(rng.choice([-2, -1, 0, 0, 0, 1, 2], n_rows)).astype(np.int64)
    ask0 = bid0 + rng.integers(1, 4, n_rows)
    depth = np.arange(levels, dtype=np.int64)
    bid_px = bid0[:, None] - depth[None, :] - rng.integers(0, 2, (n_rows, levels)).cumsum(axis=1)
    ask_px = ask0[:, None] + depth[None, :] + rng.integers(0, 2, (n_rows, levels)).cumsum(axis=1)
    bid_sz = rng.integers(1, 60, (n_rows, levels)).astype(np.int64)
    ask_sz = rng.integers(1, 60, (n_rows, levels)).astype(np.int64)
    for sz, px in ((bid_sz, bid_px), (ask_sz, ask_px)):
        hole = rng.random((n_rows, levels)) < hole_prob
        hole[:, 0] = rng.random(n_rows) < one_sided_prob  # the best level is absent far more rarely
        sz[hole] = 0
        px[hole] = 0
    book = BookSeries(ts_ns=ts, bid_px=bid_px, bid_sz=bid_sz, ask_px=ask_px, ask_sz=ask_sz)

    on_book_ts = rng.random(n_trades) < 0.4
    t_ts = np.where(on_book_ts, rng.choice(ts, n_trades), rng.integers(ts[0] - 10**6, ts[-1] + 10**6, n_trades))
    order = np.argsort(t_ts, kind="stable")
    t_ts = t_ts[order].astype(np.int64)
    near = np.searchsorted(ts, t_ts, side="right") - 1
    ref = bid0[np.clip(near, 0, n_rows - 1)]
    t_px = (ref + rng.integers(-8, 9, n_trades)).astype(np.int64)
    side = rng.choice(np.array([-1, 1], np.int8), n_trades)
    side[rng.random(n_trades) < unknown_prob] = 0
    t_sz = rng.integers(1, 30, n_trades).astype(np.int64)
    trades = TradeSeries(ts_ns=t_ts, px=t_px, size=t_sz, side=side)
    return MarketTape(instrument=Instrument("SYN", 0.25, 12.5), book=book, trades=trades, sources=("random",))


def test_random_tape_contains_the_awkward_cases():
    tape = random_tape(seed=3)
    b, tr = tape.book, tape.trades
    assert np.all(np.diff(b.ts_ns) >= 0) and np.all(np.diff(tr.ts_ns) >= 0)
    assert (np.diff(b.ts_ns) == 0).sum() > 20  # duplicate timestamps
    assert (b.bid_sz[:, 1:] == 0).any() and (b.ask_sz[:, 1:] == 0).any()  # holes below the best
    assert ((b.bid_sz[:, 0] == 0) | (b.ask_sz[:, 0] == 0)).any()  # one-sided rows
    assert np.all(b.bid_px[b.bid_sz == 0] == 0) and np.all(b.ask_px[b.ask_sz == 0] == 0)
    assert (tr.side == 0).sum() > 30 and np.isin(tr.ts_ns, b.ts_ns).sum() > 30
    two = (b.bid_sz[:, 0] > 0) & (b.ask_sz[:, 0] > 0)
    assert np.all(b.bid_px[two, 0] < b.ask_px[two, 0])  # never crossed


def test_random_tape_is_reproducible_from_its_seed():
    a, b = random_tape(seed=5), random_tape(seed=5)
    assert np.array_equal(a.book.bid_sz, b.book.bid_sz) and np.array_equal(a.trades.px, b.trades.px)
    assert not np.array_equal(a.book.bid_sz, random_tape(seed=6).book.bid_sz)


def test_benchmark_tiling_makes_later_days_with_the_same_book():
    from trainer.features.__main__ import tile_tape

    tape = random_tape(n_rows=200, n_trades=100, seed=8)
    tiled = tile_tape(tape, 3)
    n = len(tape.book)
    assert len(tiled.book) == 3 * n and len(tiled.trades) == 3 * len(tape.trades)
    assert np.all(np.diff(tiled.book.ts_ns) >= 0) and np.all(np.diff(tiled.trades.ts_ns) >= 0)
    assert (tiled.book.ts_ns[n] - tape.book.ts_ns[0]) % 86_400_000_000_000 == 0
    assert np.array_equal(tiled.book.bid_px[2 * n:], tape.book.bid_px)
    assert np.array_equal(tiled.book.bid_sz[n:2 * n] > 0, tape.book.bid_sz > 0)  # jitter keeps levels present
    assert np.abs(tiled.book.bid_sz[n:2 * n] - tape.book.bid_sz).max() <= 1
