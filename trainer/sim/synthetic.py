"""A random but well-formed DecisionTape for simulator tests and the `--sim-only` benchmark.

Not a market model (that is trainer/data/synth.py): a random walk of the best bid, 1-3 tick spreads,
random level sizes with an occasionally thin book, and random trades of both aggressor sides in each
interval, some of them outside the histogram grid so the trade-through fields are exercised.
"""
from __future__ import annotations

import numpy as np

from trainer.features.decision import NO_BUY_PX, NO_SELL_PX, DecisionTape


def random_decision_tape(
    n_rows: int, levels: int = 10, radius: int = 4, seed: int = 0, tick_value: float = 12.5, base_px: int = 20_000
) -> DecisionTape:
    rng = np.random.default_rng(seed)
    width = 2 * radius + 1
    bid0 = base_px + np.cumsum(rng.integers(-1, 2, n_rows))  # (T,) random walk, ticks
    spread = rng.choice([1, 1, 1, 2, 3], n_rows)
    steps = np.arange(levels)
    bid_px = bid0[:, None] - steps[None, :]  # (T, L) contiguous levels
    ask_px = (bid0 + spread)[:, None] + steps[None, :]
    bid_sz = rng.integers(1, 40, (n_rows, levels))
    ask_sz = rng.integers(1, 40, (n_rows, levels))
    # Thin books: drop a random tail of levels on ~10% of rows (size 0 and price 0, as the tape contract says).
    for sz, px in ((bid_sz, bid_px), (ask_sz, ask_px)):
        thin = rng.random(n_rows) < 0.1
        keep = rng.integers(1, levels + 1, n_rows)
        absent = thin[:, None] & (steps[None, :] >= keep[:, None])
        sz[absent] = 0
        px[absent] = 0
    sell_vol = np.zeros((n_rows, width), dtype=np.int64)
    buy_vol = np.zeros((n_rows, width), dtype=np.int64)
    sell_min = np.full(n_rows, NO_SELL_PX, dtype=np.int64)
    buy_max = np.full(n_rows, NO_BUY_PX, dtype=np.int64)
    # Up to 3 trades per side per interval; sellers hit around/below the bid, buyers lift around/above the ask,
    # reaching past the histogram grid now and then. The last row's interval is empty.
    for vol, extreme, ref_px, sign in ((sell_vol, sell_min, bid0, -1), (buy_vol, buy_max, bid0 + spread, 1)):
        present = np.arange(3)[None, :] < rng.integers(0, 4, n_rows)[:, None]  # (T, 3)
        present[-1] = False
        px = ref_px[:, None] + sign * rng.integers(-1, radius + 3, (n_rows, 3))  # (T, 3) ticks
        size = rng.integers(1, 30, (n_rows, 3))
        bucket = px - bid0[:, None] + radius
        on_grid = present & (bucket >= 0) & (bucket < width)
        rows = np.broadcast_to(np.arange(n_rows)[:, None], px.shape)
        np.add.at(vol, (rows[on_grid], bucket[on_grid]), size[on_grid])
        if sign < 0:
            extreme[:] = np.where(present, px, NO_SELL_PX).min(axis=1)
        else:
            extreme[:] = np.where(present, px, NO_BUY_PX).max(axis=1)
    return DecisionTape(
        ts_ns=np.arange(n_rows, dtype=np.int64) * 1_000_000,
        book_row=np.arange(n_rows, dtype=np.int64),
        bid_px=bid_px.astype(np.int64),
        bid_sz=bid_sz.astype(np.int64),
        ask_px=ask_px.astype(np.int64),
        ask_sz=ask_sz.astype(np.int64),
        anchor_px=bid0.astype(np.int64),
        sell_vol=sell_vol,
        buy_vol=buy_vol,
        sell_min_px=sell_min,
        buy_max_px=buy_max,
        tick_value=float(tick_value),
        trade_radius_ticks=int(radius),
    )
