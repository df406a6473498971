"""DecisionTape: what the simulator replays, one row per decision of the decision clock.

Row t describes the market *at* decision t (the book right after the clock's t-th tick) and the
trades printed in the interval (ts_ns[t], ts_ns[t+1]] that follows it. The simulator acts at t and
fills against the book and trades of the steps after. The last row's interval is empty.

Trades are summarised per interval as volume histograms on an absolute price grid anchored at the
best bid of decision t: bucket k covers price `anchor_px[t] + k - trade_radius_ticks`, k in
[0, 2 * trade_radius_ticks]. Trades outside that grid count only through `sell_min_px`/`buy_max_px`
("traded through"). Trades with unknown aggressor side are classified by `trade_signs`: the quote rule
against the book prevailing just before the trade (below its mid: seller-initiated, above: buyer-initiated,
so a trade inside the spread counts for the nearer side); only a trade exactly at that mid, or before any
two-sided book, is left out of the histograms and of sell_min_px / buy_max_px.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from trainer.data.tape import BUY, SELL, UNKNOWN, MarketTape

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


def trade_signs(tape: MarketTape) -> np.ndarray:
    """(m,) int64 aggressor sign per trade (BUY=+1, SELL=-1, 0 = unresolved); UNKNOWN resolved by the quote rule.

    The quote (midpoint) rule against the prevailing book, the last book row strictly before the trade's
    timestamp (a row at the same instant may already include the trade's effect): above the mid a buyer
    lifted, below it a seller hit, so a trade at or through the bid is a sell, at or through the ask a
    buy, and a trade inside the spread goes to the nearer side. At the mid exactly, or with no two-sided
    book yet, the side is unknowable and stays 0. The features' trade flow and the simulator's trade
    histograms both use this, so they agree on every trade.
    """
    side = tape.trades.side.astype(np.int64)
    unknown = np.flatnonzero(side == UNKNOWN)
    if unknown.size:
        book = tape.book
        prev = np.searchsorted(book.ts_ns, tape.trades.ts_ns[unknown], side="left") - 1
        has = prev >= 0
        pr = np.where(has, prev, 0)
        two_sided = has & (book.bid_sz[pr, 0] > 0) & (book.ask_sz[pr, 0] > 0)
        diff = 2 * tape.trades.px[unknown] - (book.bid_px[pr, 0] + book.ask_px[pr, 0])  # 2 x (price - mid)
        side[unknown] = np.where(two_sided, np.sign(diff), 0)
    return np.where((side == BUY) | (side == SELL), side, 0)


def build_decision_tape(tape: MarketTape, rows: np.ndarray, radius: int) -> DecisionTape:
    """DecisionTape for decisions at book rows `rows` (strictly increasing), trade grid radius R = `radius`.

    Vectorised: each trade finds its interval by one binary search over the decision times, the
    histograms are one np.add.at over (interval, bucket) pairs, and the per-interval min/max prices a
    reduceat over the (time-sorted, hence interval-sorted) trades. O((T + m) log T) for m trades.
    """
    rows = np.asarray(rows, dtype=np.int64)
    book, trades = tape.book, tape.trades
    if rows.ndim != 1 or rows.size == 0:
        raise ValueError(f"build_decision_tape: rows must be a non-empty 1-D index array, got shape {rows.shape}")
    if rows[0] < 0 or rows[-1] >= len(book) or np.any(np.diff(rows) <= 0):
        raise ValueError("build_decision_tape: rows must be strictly increasing indices into the book")
    if not isinstance(radius, int) or radius < 1:
        raise ValueError(f"build_decision_tape: radius must be an int >= 1, got {radius!r}")
    n_dec = rows.size
    n_buckets = 2 * radius + 1

    ts = book.ts_ns[rows]  # (T,)
    bid_px, bid_sz = book.bid_px[rows], book.bid_sz[rows]  # (T, L)
    ask_px, ask_sz = book.ask_px[rows], book.ask_sz[rows]  # (T, L)
    anchor = bid_px[:, 0].copy()  # (T,)

    # Interval of each trade: t with ts[t] < trade_ts <= ts[t+1]; trades before the first decision or
    # after the last one belong to no interval (the last row's interval is empty by contract).
    t_of = np.searchsorted(ts, trades.ts_ns, side="left") - 1  # (m,)
    keep = (t_of >= 0) & (t_of < n_dec - 1) & (trades.size > 0)
    t_of = t_of[keep]
    px, size, side = trades.px[keep], trades.size[keep], trade_signs(tape)[keep]  # side 0: unresolved, left out

    bucket = px - anchor[t_of] + radius  # (m',)
    on_grid = (bucket >= 0) & (bucket < n_buckets)

    def histogram(mask: np.ndarray) -> np.ndarray:
        out = np.zeros((n_dec, n_buckets), np.int64)  # (T, 2R+1): the dense output dominates the cost
        np.add.at(out.reshape(-1), t_of[mask] * n_buckets + bucket[mask], size[mask])  # exact int64 sums
        return out

    def extreme(mask: np.ndarray, fill: int, ufunc: np.ufunc) -> np.ndarray:
        out = np.full(n_dec, fill, dtype=np.int64)
        t_sel, p_sel = t_of[mask], px[mask]
        if t_sel.size:
            starts = np.flatnonzero(np.r_[True, t_sel[1:] != t_sel[:-1]])  # t_of is non-decreasing
            out[t_sel[starts]] = ufunc.reduceat(p_sel, starts)
        return out

    sells, buys = side == SELL, side == BUY
    return DecisionTape(
        ts_ns=ts,
        book_row=rows.copy(),
        bid_px=bid_px,
        bid_sz=bid_sz,
        ask_px=ask_px,
        ask_sz=ask_sz,
        anchor_px=anchor,
        sell_vol=histogram(sells & on_grid),
        buy_vol=histogram(buys & on_grid),
        sell_min_px=extreme(sells, NO_SELL_PX, np.minimum),
        buy_max_px=extreme(buys, NO_BUY_PX, np.maximum),
        tick_value=float(tape.instrument.tick_value),
        trade_radius_ticks=radius,
    )
