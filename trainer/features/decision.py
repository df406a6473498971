"""DecisionTape: what the simulator replays, one row per decision of the decision clock.

Row t describes the market *at* decision t (the book right after the clock's t-th tick) and the
trades printed in the interval (ts_ns[t], ts_ns[t+1]] that follows it. The simulator acts at t and
fills against the book and trades of the steps after. The last row's interval is empty.

Trades are summarised per interval as volume histograms on an absolute price grid anchored at the
best bid of decision t: bucket k covers price `anchor_px[t] + k - trade_radius_ticks`, k in
[0, 2 * trade_radius_ticks]. Trades outside that grid count only through `sell_min_px`/`buy_max_px`
("traded through"). Trades with unknown aggressor side are classified against the book at t
(price <= best bid: seller-initiated; >= best ask: buyer-initiated; inside the spread: ignored).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

NO_SELL_PX = np.iinfo(np.int64).max  # sell_min_px sentinel: no seller-initiated trade in the interval
NO_BUY_PX = np.iinfo(np.int64).min  # buy_max_px sentinel: no buyer-initiated trade in the interval


@dataclass(frozen=True)
class DecisionTape:
    ts_ns: np.ndarray  # (T,) int64 time of decision t
    book_row: np.ndarray  # (T,) int64 index into MarketTape.book of the snapshot used at t
    bid_px: np.ndarray  # (T, L) int64 ticks (size 0 = absent level, price then 0)
    bid_sz: np.ndarray  # (T, L) int64
    ask_px: np.ndarray  # (T, L) int64 ticks
    ask_sz: np.ndarray  # (T, L) int64
    anchor_px: np.ndarray  # (T,) int64 ticks, = bid_px[:, 0]; origin of the trade histograms
    sell_vol: np.ndarray  # (T, 2R+1) int64 seller-initiated volume per price bucket in (t, t+1]
    buy_vol: np.ndarray  # (T, 2R+1) int64 buyer-initiated volume per price bucket in (t, t+1]
    sell_min_px: np.ndarray  # (T,) int64 lowest seller-initiated trade price in (t, t+1], or NO_SELL_PX
    buy_max_px: np.ndarray  # (T,) int64 highest buyer-initiated trade price in (t, t+1], or NO_BUY_PX
    tick_value: float  # currency per tick per contract
    trade_radius_ticks: int  # R

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])

    @property
    def levels(self) -> int:
        return int(self.bid_px.shape[1])

    def arrays(self) -> dict[str, np.ndarray]:
        """The array fields by name (for caching and moving to a device)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray)}

    def slice(self, start: int, stop: int) -> "DecisionTape":
        """Rows [start, stop) as a new tape (views, no copy)."""
        kw = {name: a[start:stop] for name, a in self.arrays().items()}
        return DecisionTape(**kw, tick_value=self.tick_value, trade_radius_ticks=self.trade_radius_ticks)
