"""The embedded synthetic market: a seeded event-driven order book written as real Databento DBN files.

One MBP-10 file and one trades file per trading day (DBN version 3, uncompressed or zstd), which then
go through the same DBN reader as production data. The market is an ES-like limit order book on a
tick grid (tick 0.25, 10 dense visible levels, spread mostly 1 tick) driven event by event by limit
adds, cancels and market orders, with a *planted, tunable signal*:

  latent order-flow pressure   p_n = phi * p_{n-1} + sqrt(1 - phi^2) * z_n,  z_n ~ N(0, 1)
                               (AR(1), stationary N(0, 1), half-life `pressure_half_life_events`)
  order flow (any signal)      P(bid add) = 1/2 + flow_tilt * tanh(p_n), same tilt for ask cancels
                               and buy market orders: visible as depth imbalance, signed trade
                               flow and (with the signal's drift) multi-level OFI.
  mid price (the signal)       each price event moves the mid by +-1/2 tick with
                               P(up) = 1/2 * (1 + tanh(signal * drift_beta * p_n)).

Price events are the only events that change the best prices; every other event (noise adds,
cancels, market orders that never empty the touch) only changes sizes. So with `signal=0` the mid
is a random walk whose +-1/2-tick steps are fair coins independent of everything before them: past
order flow, book shape and trades carry no information about future mid moves, while the flow stays
exactly as imbalanced as with a signal (the features look alike). With `signal>0` the pressure that
tilts the flow also tilts future price steps, so OFI predicts the mid over the pressure's half-life.

Generation is one numba kernel per day over pre-drawn numpy random numbers (PCG64 seeded from
`seed`), so files are byte-identical for the same arguments. The records are encoded through numpy
structured arrays with the exact DBN v3 record layout (`MBP10_DTYPE`, `TRADE_DTYPE`).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import databento_dbn as dbn
import numpy as np

from trainer.errors import exit_code_for
from trainer.fsutil import atomic_write_bytes
from trainer.jit import njit

LEVELS = 10  # MBP-10: visible depth, and the number of dense price levels the simulator keeps per side
FIXED_PRICE_SCALE = 1_000_000_000  # DBN prices are int64 in units of 1e-9
F_LAST = 128  # DBN flag: last record of an event (the book is consistent after it)
RTYPE_MBP_0 = 0x00  # trades schema record type
RTYPE_MBP_10 = 0x0A
DBN_VERSION = 3
GENERATOR_VERSION = 1
"""Bumped whenever the same SynthConfig would produce different bytes; put it in cache keys."""

# Exact DBN v3 record layouts (little-endian, packed, 8-byte multiple), field for field as
# databento_dbn's MBP10Msg._dtypes / TradeMsg._dtypes and rust/dbn/src/record.rs (Mbp10Msg, TradeMsg).
_HEADER_AND_BODY = [
    ("length", "u1"),  # record size / 4
    ("rtype", "u1"),
    ("publisher_id", "<u2"),
    ("instrument_id", "<u4"),
    ("ts_event", "<u8"),
    ("price", "<i8"),
    ("size", "<u4"),
    ("action", "S1"),
    ("side", "S1"),
    ("flags", "u1"),
    ("depth", "u1"),
    ("ts_recv", "<u8"),
    ("ts_in_delta", "<i4"),
    ("sequence", "<u4"),
]
TRADE_DTYPE = np.dtype(_HEADER_AND_BODY)  # 48 bytes
MBP10_DTYPE = np.dtype(
    _HEADER_AND_BODY
    + [
        (f"{name}_{k:02d}", t)
        for k in range(LEVELS)
        for name, t in (
            ("bid_px", "<i8"),
            ("ask_px", "<i8"),
            ("bid_sz", "<u4"),
            ("ask_sz", "<u4"),
            ("bid_ct", "<u4"),
            ("ask_ct", "<u4"),
        )
    ]
)  # 368 bytes

# The same 368 bytes seen as a 48-byte head and a (10,) array of BidAskPair (32 bytes each).
_LEVEL_DTYPE = np.dtype([("bid_px", "<i8"), ("ask_px", "<i8"), ("bid_sz", "<u4"), ("ask_sz", "<u4"),
                         ("bid_ct", "<u4"), ("ask_ct", "<u4")])
_MBP10_LEVELS_VIEW = np.dtype([("head", "V48"), ("levels", _LEVEL_DTYPE, (LEVELS,))])
assert _MBP10_LEVELS_VIEW.itemsize == MBP10_DTYPE.itemsize

# Event-kind codes the kernel writes per book record (for tests and statistics; not in the DBN file).
# REMOVE_CANCEL also marks the pull of most of a queue just before its last lots trade (REMOVE_TRADE).
KIND_ADD, KIND_CANCEL, KIND_MARKET, KIND_REMOVE_TRADE, KIND_REMOVE_CANCEL, KIND_IMPROVE, KIND_WALK = range(7)


@dataclass(frozen=True)
class SynthConfig:
    seed: int = 7
    """Seed of the PCG64 generator; the same config gives byte-identical files."""
    days: int = 4
    """Trading days (one MBP-10 and one trades file each). Walk-forward default: 3 folds = 4 windows."""
    signal: float = 1.0
    """Strength of the planted signal: 0 = control (mid independent of past flow), 0.3 = realistic
    (OFI is predictive, a naive market-order rule roughly breaks even), 1 = default, 2 = strong."""
    events_per_day: int = 60_000
    """Simulated book events per day (MBP-10 records are ~8% more: a traded removal writes 2-3)."""
    tick_size: float = 0.25
    """Price increment in index points (ES: 0.25)."""
    tick_value: float = 12.5
    """USD per tick per contract (ES: 12.5). Not stored in the DBN files; readers take it from config."""
    symbol: str = "SYN"
    """Raw symbol written to the DBN metadata."""
    instrument_id: int = 1
    """Numeric instrument id written in every record and in the metadata symbol mapping."""
    dataset: str = "SYNTH.SIM"
    """DBN metadata dataset code."""
    base_price: float = 4800.0
    """Opening price of day 0 in index points (must be a multiple of tick_size)."""
    start_date: str = "2024-01-02"
    """First trading day (ISO date); weekends are skipped."""
    session_open_utc: str = "14:30"
    """Session open, UTC (ES regular trading hours 09:30 ET in winter)."""
    session_hours: float = 6.5
    """Session length in hours (ES RTH 09:30-16:00 ET); events are spread over it."""
    intraday_u_shape: float = 2.0
    """Event intensity at open/close relative to midday minus 1 (0 = flat; 2 = 3x busier at the ends)."""
    depth_profile: tuple[int, ...] = (80, 90, 85, 75, 65, 55, 45, 40, 40, 40)
    """Reference size per level 0..9 (contracts): the initial book and levels that appear at the far
    end are drawn around it, and cancels pull each level back toward it."""
    price_event_prob: float = 0.12
    """P(an event is a price event) while the spread is 1 tick; sets volatility (~55 ticks/day)."""
    refill_prob: float = 0.7
    """P(an event is a price event) while the spread is wider than 1 tick (how fast gaps close)."""
    widen_prob: float = 0.15
    """At a 2-tick spread, P(a price event widens it to 3 instead of closing the gap)."""
    sweep_trade_prob: float = 0.6
    """P(an emptied touch level was consumed by a market order, printing trades) vs cancelled."""
    walk_prob: float = 0.25
    """P(a sweeping market order also trades into the next level)."""
    add_prob: float = 0.50
    """Among non-price events: P(limit add)."""
    cancel_prob: float = 0.38
    """Among non-price events: P(cancel); the rest (1 - add - cancel) are market orders."""
    order_size_mean: float = 15.0
    """Mean size of a limit add (geometric), contracts."""
    add_depth_decay: float = 1.5
    """Limit adds land on level k with weight exp(-k / add_depth_decay) + add_depth_floor."""
    add_depth_floor: float = 0.05
    """Flat part of the add intensity over levels (see add_depth_decay)."""
    market_size_mean: float = 4.0
    """Mean size of a noise market order (geometric), contracts; capped so it never empties the touch."""
    pressure_half_life_events: float = 300.0
    """Half-life of the latent pressure AR(1), in book events."""
    flow_tilt: float = 0.25
    """Order-flow imbalance per unit tanh(pressure): P(bid add) = 1/2 + flow_tilt * tanh(p)."""
    drift_beta: float = 0.15
    """Price-step tilt per unit pressure at signal 1: P(up) = (1 + tanh(signal * drift_beta * p)) / 2."""
    overnight_gap_ticks: float = 8.0
    """Std of the open-vs-previous-close gap, ticks."""
    compress: bool = True
    """Write zstd-compressed `*.dbn.zst` (~2 MB/day, 12x smaller) instead of plain `*.dbn`."""

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"SynthConfig.{name} {rule}, got {getattr(self, name)!r}")

        if not 0 <= self.seed < 2**63:
            raise bad("seed", "must be in [0, 2**63)")
        if not 1 <= self.days <= 366:
            raise bad("days", "must be in [1, 366]")
        if not (math.isfinite(self.signal) and 0 <= self.signal <= 10):
            raise bad("signal", "must be finite and in [0, 10]")
        if not 1_000 <= self.events_per_day <= 5_000_000:
            raise bad("events_per_day", "must be in [1000, 5000000]")
        for name in ("tick_size", "tick_value", "base_price", "session_hours", "order_size_mean",
                     "market_size_mean", "pressure_half_life_events"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise bad(name, "must be finite and > 0")
        if self.order_size_mean < 1 or self.market_size_mean < 1:
            raise bad("order_size_mean" if self.order_size_mean < 1 else "market_size_mean", "must be >= 1")
        if self.session_hours > 24:
            raise bad("session_hours", "must be <= 24")
        ticks = self.base_price / self.tick_size
        if abs(ticks - round(ticks)) > 1e-9 or round(ticks) < 100:
            raise bad("base_price", f"must be a multiple of tick_size {self.tick_size} and >= 100 ticks")
        if (self.tick_size * FIXED_PRICE_SCALE) % 1:
            raise bad("tick_size", "must be a whole number of 1e-9 price units")
        for name in ("price_event_prob", "refill_prob", "widen_prob", "sweep_trade_prob", "walk_prob",
                     "add_prob", "cancel_prob"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise bad(name, "must be in [0, 1]")
        if self.price_event_prob == 0 or self.refill_prob == 0:
            raise bad("price_event_prob" if self.price_event_prob == 0 else "refill_prob", "must be > 0")
        if self.add_prob + self.cancel_prob > 1:
            raise bad("cancel_prob", f"plus add_prob {self.add_prob} must be <= 1")
        if not 0 <= self.flow_tilt < 0.5:
            raise bad("flow_tilt", "must be in [0, 0.5)")
        if not (math.isfinite(self.drift_beta) and self.drift_beta >= 0):
            raise bad("drift_beta", "must be finite and >= 0")
        if not (math.isfinite(self.overnight_gap_ticks) and self.overnight_gap_ticks >= 0):
            raise bad("overnight_gap_ticks", "must be finite and >= 0")
        if not (math.isfinite(self.add_depth_decay) and self.add_depth_decay > 0):
            raise bad("add_depth_decay", "must be finite and > 0")
        if not (math.isfinite(self.add_depth_floor) and self.add_depth_floor >= 0):
            raise bad("add_depth_floor", "must be finite and >= 0")
        if not self.intraday_u_shape >= 0:
            raise bad("intraday_u_shape", "must be >= 0")
        if len(self.depth_profile) != LEVELS or any(int(s) < 2 for s in self.depth_profile):
            raise bad("depth_profile", f"must be {LEVELS} mean sizes, each >= 2")
        if not self.symbol or len(self.symbol) > 20:
            raise bad("symbol", "must be 1..20 characters")
        if not 0 <= self.instrument_id < 2**32:
            raise bad("instrument_id", "must fit in u32")
        try:
            dt.date.fromisoformat(self.start_date)
            dt.time.fromisoformat(self.session_open_utc)
        except ValueError:
            raise bad("start_date",
                      f"and session_open_utc {self.session_open_utc!r} must be ISO date / HH:MM") from None

    @property
    def tick_scale(self) -> int:
        """DBN fixed-point price units per tick."""
        return int(round(self.tick_size * FIXED_PRICE_SCALE))

    def trading_days(self) -> list[dt.date]:
        d, out = dt.date.fromisoformat(self.start_date), []
        while len(out) < self.days:
            if d.weekday() < 5:
                out.append(d)
            d += dt.timedelta(days=1)
        return out


@dataclass(frozen=True)
class DayArrays:
    """One simulated day, before encoding. Book rows are MBP-10 records; prices are int64 ticks."""

    ts_event: np.ndarray  # (n,) int64 ns, non-decreasing (equal only within one event)
    ts_recv: np.ndarray  # (n,) int64 ns, non-decreasing
    ts_in_delta: np.ndarray  # (n,) int32 ns
    action: np.ndarray  # (n,) uint8 ASCII 'A' / 'C'
    side: np.ndarray  # (n,) uint8 ASCII 'B' / 'A'
    depth: np.ndarray  # (n,) uint8 level of the change
    price: np.ndarray  # (n,) int64 ticks of the changed level
    size: np.ndarray  # (n,) int64 size added / removed
    flags: np.ndarray  # (n,) uint8 (F_LAST on the last record of an event)
    kind: np.ndarray  # (n,) uint8 KIND_* (simulator bookkeeping, not written)
    bid_px: np.ndarray  # (n, 10) int64 ticks, level 0 = best
    ask_px: np.ndarray  # (n, 10) int64 ticks
    bid_sz: np.ndarray  # (n, 10) int64
    ask_sz: np.ndarray  # (n, 10) int64
    pressure: np.ndarray  # (n,) float64 latent pressure when the record's event happened (not written)
    trade_ts_event: np.ndarray  # (m,) int64 ns
    trade_ts_recv: np.ndarray  # (m,) int64 ns
    trade_ts_in_delta: np.ndarray  # (m,) int32
    trade_px: np.ndarray  # (m,) int64 ticks
    trade_size: np.ndarray  # (m,) int64
    trade_side: np.ndarray  # (m,) uint8 aggressor: 'B' buyer, 'A' seller (DBN convention)
    trade_depth: np.ndarray  # (m,) uint8 book level the trade hit
    trade_flags: np.ndarray  # (m,) uint8
    trade_book_row: np.ndarray  # (m,) int64 book record written by the same event (its last record)
    end_bid_px: int
    end_pressure: float


# ---------------------------------------------------------------------------------------------
# The simulator kernel
# ---------------------------------------------------------------------------------------------

@njit(cache=True)
def _geometric(u: float, mean: float) -> int:
    """Inverse-CDF geometric on {1, 2, ...} with the given mean."""
    if mean <= 1.0:
        return 1
    return 1 + int(math.log(1.0 - u) / math.log(1.0 - 1.0 / mean))


@njit(cache=True)
def _fresh_size(u: float, mean: float) -> int:
    """Size of a level that appears at the far end of the book: uniform in [0.5, 1.5] x mean."""
    return max(1, int(mean * (0.5 + u)))


@njit(cache=True)
def _book_record(book, nr: int, i: int, action: int, side: int, depth: int, price: int, size: int, kind: int,
                 bid: np.ndarray, ask: np.ndarray, b: int, a: int, p: float) -> int:
    """Write MBP-10 record `nr` of event `i` (the change, then the book after it) into the `book` arrays;
    returns nr + 1. Flags are set per event by the caller (F_LAST on its last record)."""
    rec_event, rec_action, rec_side, rec_depth, rec_price, rec_size, rec_kind, rec_p, out_bid, out_ask, out_b, out_a = book
    rec_event[nr] = i
    rec_action[nr] = action
    rec_side[nr] = side
    rec_depth[nr] = depth
    rec_price[nr] = price
    rec_size[nr] = size
    rec_kind[nr] = kind
    out_bid[nr] = bid
    out_ask[nr] = ask
    out_b[nr] = b
    out_a[nr] = a
    rec_p[nr] = p
    return nr + 1


@njit(cache=True)
def _trade_record(trades, nt: int, i: int, price: int, size: int, side: int, depth: int) -> int:
    """Write trade record `nt` of event `i` (side = the aggressor) into the `trades` arrays; returns nt + 1."""
    tr_event, tr_px, tr_size, tr_side, tr_depth = trades
    tr_event[nt] = i
    tr_px[nt] = price
    tr_size[nt] = size
    tr_side[nt] = side
    tr_depth[nt] = depth
    return nt + 1


@njit(cache=True)
def _simulate_day(  # noqa: PLR0913, PLR0915 - one flat kernel is the point
    bid0: int, p0: float, phi: float, profile: np.ndarray, add_w_cum: np.ndarray,
    price_event_prob: float, refill_prob: float, widen_prob: float, sweep_trade_prob: float,
    walk_prob: float, add_prob: float, cancel_prob: float, order_size_mean: float,
    market_size_mean: float, flow_tilt: float, drift: float,
    u: np.ndarray, z: np.ndarray, u_init: np.ndarray,
):
    """One session, event by event. Returns per-record arrays (book), per-trade arrays, end state.

    Random inputs are drawn outside (numpy PCG64) so the kernel is a pure function of them:
    z (n,) N(0,1) pressure innovations; u (n, 8) uniforms, columns 0 price event?, 1 step
    direction / noise kind, 2 noise side / walk size, 3 size, 4 level / widen?, 5 traded?,
    6 far-level size, 7 walk?; u_init (2, 10) the opening book sizes.
    """
    n = z.shape[0]
    cap = 3 * n  # a traded removal writes up to three book records (pull, last lots, walk)
    rec_event = np.empty(cap, np.int64)
    rec_action = np.empty(cap, np.uint8)
    rec_side = np.empty(cap, np.uint8)
    rec_depth = np.empty(cap, np.uint8)
    rec_price = np.empty(cap, np.int64)
    rec_size = np.empty(cap, np.int64)
    rec_flags = np.zeros(cap, np.uint8)
    rec_kind = np.empty(cap, np.uint8)
    rec_p = np.empty(cap, np.float64)
    out_bid = np.empty((cap, 10), np.int64)  # sizes; prices follow from the best price (dense grid)
    out_ask = np.empty((cap, 10), np.int64)
    out_b = np.empty(cap, np.int64)
    out_a = np.empty(cap, np.int64)
    book = (rec_event, rec_action, rec_side, rec_depth, rec_price, rec_size, rec_kind, rec_p, out_bid, out_ask,
            out_b, out_a)
    tr_event = np.empty(cap, np.int64)
    tr_px = np.empty(cap, np.int64)
    tr_size = np.empty(cap, np.int64)
    tr_side = np.empty(cap, np.uint8)
    tr_depth = np.empty(cap, np.uint8)
    tr_flags = np.zeros(cap, np.uint8)
    tr_row = np.empty(cap, np.int64)
    trades = (tr_event, tr_px, tr_size, tr_side, tr_depth)

    bid = np.empty(10, np.int64)
    ask = np.empty(10, np.int64)
    for k in range(10):
        bid[k] = _fresh_size(u_init[0, k], profile[k])
        ask[k] = _fresh_size(u_init[1, k], profile[k])
    b = bid0
    a = bid0 + 1
    p = p0
    innov = math.sqrt(1.0 - phi * phi)
    nr = 0
    nt = 0
    BID, ASK, ADD, CAN = 66, 65, 65, 67  # ASCII 'B', 'A', 'A', 'C'

    for i in range(n):
        p = phi * p + innov * z[i]
        tp = math.tanh(p)
        spread = a - b
        first_tr = nt
        is_price = u[i, 0] < (price_event_prob if spread == 1 else refill_prob)
        if is_price:
            # The signal: direction of the half-tick mid step. At drift == 0 a fair coin.
            up = u[i, 1] < 0.5 * (1.0 + math.tanh(drift * p))
            if spread == 1:
                remove = True
            elif spread == 2:
                remove = u[i, 4] < widen_prob
            else:
                remove = False
            if remove:
                # Empty the touch on the side the price moves away from: ask when up, bid when down.
                side_sz = ask if up else bid
                touch_side = ASK if up else BID
                aggressor = BID if up else ASK
                touch_px = a if up else b  # the level being emptied, before the best price moves
                q0 = side_sz[0]
                traded = u[i, 5] < sweep_trade_prob
                if traded:
                    # The last lots of the queue trade (a market-order-sized print); the rest of the
                    # queue is pulled first, in the same event, as resting orders flee the tick.
                    tq = min(q0, _geometric(u[i, 3], 2.0 * market_size_mean))
                    if tq < q0:
                        side_sz[0] = tq
                        nr = _book_record(book, nr, i, CAN, touch_side, 0, touch_px, q0 - tq, KIND_REMOVE_CANCEL,
                                          bid, ask, b, a, p)
                        q0 = tq
                    nt = _trade_record(trades, nt, i, touch_px, q0, aggressor, 0)
                for k in range(9):
                    side_sz[k] = side_sz[k + 1]
                side_sz[9] = _fresh_size(u[i, 6], profile[9])
                if up:
                    a += 1
                else:
                    b -= 1
                nr = _book_record(book, nr, i, CAN, touch_side, 0, touch_px, q0,
                                  KIND_REMOVE_TRADE if traded else KIND_REMOVE_CANCEL, bid, ask, b, a, p)
                if traded and u[i, 7] < walk_prob and side_sz[0] > 1:
                    # The sweeping order walks into the next level (never empties it).
                    extra = min(_geometric(u[i, 2], market_size_mean), side_sz[0] - 1)
                    side_sz[0] -= extra
                    new_touch_px = a if up else b
                    nr = _book_record(book, nr, i, CAN, touch_side, 0, new_touch_px, extra, KIND_WALK,
                                      bid, ask, b, a, p)
                    nt = _trade_record(trades, nt, i, new_touch_px, extra, aggressor, 1)
            else:
                # Close the gap from the side the price moves toward: bid improves when up.
                side_sz = bid if up else ask
                for k in range(9, 0, -1):
                    side_sz[k] = side_sz[k - 1]
                # A new touch level opens with a few orders (mean 0.4 x profile[0]) and then fills in.
                side_sz[0] = _fresh_size(u[i, 3], 0.4 * profile[0])
                if up:
                    b += 1
                else:
                    a -= 1
                nr = _book_record(book, nr, i, ADD, BID if up else ASK, 0, b if up else a, side_sz[0],
                                  KIND_IMPROVE, bid, ask, b, a, p)
        else:
            # Noise flow: sizes only, never the best prices. Sides are tilted by the pressure.
            r = u[i, 1]
            kind = KIND_ADD if r < add_prob else (KIND_CANCEL if r < add_prob + cancel_prob else KIND_MARKET)
            # The record's change; a cancel or market order that would empty a level becomes an add.
            action, side, depth, price, size = ADD, BID, 0, b, 0
            if kind == KIND_CANCEL:
                on_bid = u[i, 2] >= 0.5 + flow_tilt * tp  # pressure up: asks get pulled
                side_sz = bid if on_bid else ask
                tot = 0.0
                for k in range(10):
                    tot += side_sz[k]
                x = u[i, 4] * tot
                lvl = 9
                acc = 0.0
                for k in range(10):
                    acc += side_sz[k]
                    if x < acc:
                        lvl = k
                        break
                # Cancel size grows with how full the level is relative to its profile: sizes
                # mean-revert to `profile` without a global random walk of total depth.
                csz = min(_geometric(u[i, 3], order_size_mean * side_sz[lvl] / profile[lvl]), side_sz[lvl] - 1)
                if csz < 1:
                    kind = KIND_ADD  # a 1-lot level cannot be cancelled without leaving a hole: add instead
                else:
                    side_sz[lvl] -= csz
                    action, side, depth = CAN, BID if on_bid else ASK, lvl
                    price, size = (b - lvl) if on_bid else (a + lvl), csz
            if kind == KIND_MARKET:
                buy = u[i, 2] < 0.5 + flow_tilt * tp
                side_sz = ask if buy else bid
                msz = min(_geometric(u[i, 3], market_size_mean), side_sz[0] - 1)
                if msz < 1:
                    kind = KIND_ADD  # the touch is down to 1 lot: add instead
                else:
                    side_sz[0] -= msz
                    action, side, depth, price, size = CAN, ASK if buy else BID, 0, a if buy else b, msz
                    nt = _trade_record(trades, nt, i, price, msz, BID if buy else ASK, 0)
            if kind == KIND_ADD:
                on_bid = u[i, 2] < 0.5 + flow_tilt * tp
                x = u[i, 4]
                lvl = 9
                for k in range(10):
                    if x < add_w_cum[k]:
                        lvl = k
                        break
                asz = _geometric(u[i, 3], order_size_mean)
                if on_bid:
                    bid[lvl] += asz
                else:
                    ask[lvl] += asz
                action, side, depth = ADD, BID if on_bid else ASK, lvl
                price, size = (b - lvl) if on_bid else (a + lvl), asz
            nr = _book_record(book, nr, i, action, side, depth, price, size, kind, bid, ask, b, a, p)
        rec_flags[nr - 1] = F_LAST
        if nt > first_tr:
            tr_flags[nt - 1] = F_LAST
        for j in range(first_tr, nt):
            tr_row[j] = nr - 1

    return (rec_event[:nr], rec_action[:nr], rec_side[:nr], rec_depth[:nr], rec_price[:nr],
            rec_size[:nr], rec_flags[:nr], rec_kind[:nr], rec_p[:nr], out_bid[:nr], out_ask[:nr],
            out_b[:nr], out_a[:nr], tr_event[:nt], tr_px[:nt], tr_size[:nt], tr_side[:nt],
            tr_depth[:nt], tr_flags[:nt], tr_row[:nt], b, p)


def _event_times(cfg: SynthConfig, day: dt.date, rng: np.random.Generator) -> np.ndarray:
    """(n,) int64 strictly increasing event times in the session, U-shaped intensity.

    n i.i.d. draws from the intensity shape, sorted, are a Poisson process conditioned on n events.
    Intensity lambda(x) = 1 + c (2x - 1)^2 on x in [0, 1]; CDF inverted on a grid.
    """
    n = cfg.events_per_day
    c = cfg.intraday_u_shape
    grid = np.linspace(0.0, 1.0, 4097)
    cdf = (grid + c * ((2 * grid - 1) ** 3 + 1) / 6) / (1 + c / 3)
    x = np.sort(np.interp(rng.random(n), cdf, grid))
    open_t = dt.time.fromisoformat(cfg.session_open_utc)
    open_ns = int(dt.datetime.combine(day, open_t, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000_000
    dur_ns = int(cfg.session_hours * 3600 * 1e9)
    ts = open_ns + (x * (dur_ns - n - 1)).astype(np.int64)
    # Strictly increasing: t_i - i is non-decreasing after a running max, then add i back.
    idx = np.arange(n, dtype=np.int64)
    return np.maximum.accumulate(ts - idx) + idx + 1


def simulate_day(cfg: SynthConfig, day: dt.date, rng: np.random.Generator, open_bid_ticks: int,
                 pressure: float) -> DayArrays:
    """Simulate one session starting with best bid `open_bid_ticks` and latent pressure `pressure`."""
    n = cfg.events_per_day
    ts = _event_times(cfg, day, rng)
    u = rng.random((n, 8))  # per-event uniforms; column meanings documented in the kernel
    z = rng.standard_normal(n)
    u_init = rng.random((2, LEVELS))
    delta = rng.integers(12_000, 30_000, size=n, dtype=np.int64)  # gateway latency, ns
    profile = np.asarray(cfg.depth_profile, dtype=np.float64)
    # Limit adds concentrate at the touch (as on CME); cancels hit levels in proportion to their
    # size, so depth decays from the touch and flattens where adds are rare.
    k = np.arange(LEVELS, dtype=np.float64)
    w = np.exp(-k / cfg.add_depth_decay) + cfg.add_depth_floor  # decaying-then-flat add intensity
    add_w_cum = np.cumsum(w) / w.sum()
    phi = 0.5 ** (1.0 / cfg.pressure_half_life_events)
    (ev, action, side, depth, price, size, flags, kind, rec_p, bsz, asz, b, a, tev, tpx, tsz, tside,
     tdepth, tflags, trow, end_b, end_p) = _simulate_day(
        int(open_bid_ticks), float(pressure), phi, profile, add_w_cum, cfg.price_event_prob,
        cfg.refill_prob, cfg.widen_prob, cfg.sweep_trade_prob, cfg.walk_prob, cfg.add_prob,
        cfg.cancel_prob, cfg.order_size_mean, cfg.market_size_mean, cfg.flow_tilt,
        cfg.signal * cfg.drift_beta, u, z, u_init)
    lv = np.arange(LEVELS, dtype=np.int64)
    ts_recv_ev = np.maximum.accumulate(ts + delta)  # (n,) receive time, non-decreasing
    return DayArrays(
        ts_event=ts[ev], ts_recv=ts_recv_ev[ev], ts_in_delta=delta[ev].astype(np.int32),
        action=action, side=side, depth=depth, price=price, size=size, flags=flags, kind=kind,
        bid_px=b[:, None] - lv, ask_px=a[:, None] + lv, bid_sz=bsz, ask_sz=asz, pressure=rec_p,
        trade_ts_event=ts[tev], trade_ts_recv=ts_recv_ev[tev], trade_ts_in_delta=delta[tev].astype(np.int32),
        trade_px=tpx, trade_size=tsz, trade_side=tside, trade_depth=tdepth, trade_flags=tflags,
        trade_book_row=trow, end_bid_px=int(end_b), end_pressure=float(end_p),
    )


def simulate(cfg: SynthConfig) -> list[tuple[dt.date, DayArrays]]:
    """All days in order; price and pressure carry over between days (plus an overnight gap)."""
    rng = np.random.Generator(np.random.PCG64(cfg.seed))
    bid = int(round(cfg.base_price / cfg.tick_size))
    pressure = float(rng.standard_normal())
    out = []
    for i, day in enumerate(cfg.trading_days()):
        if i:
            bid += int(round(rng.normal(0.0, cfg.overnight_gap_ticks)))
        arrays = simulate_day(cfg, day, rng, bid, pressure)
        out.append((day, arrays))
        bid, pressure = arrays.end_bid_px, arrays.end_pressure
    return out


# ---------------------------------------------------------------------------------------------
# DBN encoding
# ---------------------------------------------------------------------------------------------

def mbp10_records(cfg: SynthConfig, d: DayArrays) -> np.ndarray:
    """(n,) MBP10_DTYPE records of one day."""
    n = len(d.ts_event)
    rec = np.zeros(n, MBP10_DTYPE)
    _fill_common(rec, cfg, RTYPE_MBP_10, d.ts_event, d.ts_recv, d.ts_in_delta, d.price, d.size,
                 d.action, d.side, d.flags, d.depth)
    rec["sequence"] = np.arange(1, n + 1, dtype=np.uint32)
    scale = cfg.tick_scale
    lv = rec.view(_MBP10_LEVELS_VIEW)["levels"]  # (n, 10) view onto the level fields, no copy
    lv["bid_px"] = d.bid_px * scale
    lv["ask_px"] = d.ask_px * scale
    lv["bid_sz"] = d.bid_sz
    lv["ask_sz"] = d.ask_sz
    # Order counts: ES averages a few lots per resting order.
    lv["bid_ct"] = (d.bid_sz + 2) // 3
    lv["ask_ct"] = (d.ask_sz + 2) // 3
    return rec


def trade_records(cfg: SynthConfig, d: DayArrays) -> np.ndarray:
    """(m,) TRADE_DTYPE records of one day."""
    rec = np.zeros(len(d.trade_ts_event), TRADE_DTYPE)
    _fill_common(rec, cfg, RTYPE_MBP_0, d.trade_ts_event, d.trade_ts_recv, d.trade_ts_in_delta,
                 d.trade_px, d.trade_size, np.full(len(rec), ord("T"), np.uint8), d.trade_side,
                 d.trade_flags, d.trade_depth)
    # Trades share the book's sequence numbering: the sequence of the book record of the same event.
    rec["sequence"] = (d.trade_book_row + 1).astype(np.uint32)
    return rec


def _fill_common(rec, cfg, rtype, ts_event, ts_recv, ts_in_delta, price, size, action, side, flags, depth):
    rec["length"] = rec.dtype.itemsize // 4
    rec["rtype"] = rtype
    rec["publisher_id"] = 0
    rec["instrument_id"] = cfg.instrument_id
    rec["ts_event"] = ts_event
    rec["ts_recv"] = ts_recv
    rec["ts_in_delta"] = ts_in_delta
    rec["price"] = price * cfg.tick_scale
    rec["size"] = size
    rec["action"] = action.view("S1")
    rec["side"] = side.view("S1")
    rec["flags"] = flags
    rec["depth"] = depth


@dataclass(frozen=True)
class _Interval:
    start_date: dt.date
    end_date: dt.date
    symbol: str


@dataclass(frozen=True)
class _Mapping:
    raw_symbol: str
    intervals: tuple[_Interval, ...]


def _metadata(cfg: SynthConfig, day: dt.date, schema: dbn.Schema) -> bytes:
    open_t = dt.time.fromisoformat(cfg.session_open_utc)
    start = int(dt.datetime.combine(day, open_t, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000_000
    end = start + int(cfg.session_hours * 3600 * 1e9)
    mapping = _Mapping(cfg.symbol, (_Interval(day, day + dt.timedelta(days=1), str(cfg.instrument_id)),))
    meta = dbn.Metadata(
        dataset=cfg.dataset, start=start, end=end, stype_in=dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID, schema=schema, symbols=[cfg.symbol], mappings=[mapping],
        version=DBN_VERSION,
    )
    return bytes(meta.encode())


def _write_atomic(path: Path, payload: bytes, compress: bool) -> None:
    if compress:
        import zstandard

        # Single-threaded, no content checksum variance: deterministic bytes for the same input.
        payload = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)
    atomic_write_bytes(path, payload)


@dataclass(frozen=True)
class SynthSummary:
    mbp10_dir: Path
    trades_dir: Path
    days: int
    book_events: int
    """MBP-10 records written over all days."""
    trades: int
    """Trade records written over all days."""
    files: tuple[tuple[Path, Path], ...] = field(default=())
    """(mbp10 file, trades file) per day, in date order."""


def write_dataset(cfg: SynthConfig, out_dir: str | os.PathLike) -> SynthSummary:
    """Simulate `cfg` and write `out_dir/mbp10/*.mbp-10.dbn[.zst]` and `out_dir/trades/*.trades.dbn[.zst]`.

    Files of an earlier run with the same naming pattern that are not part of this one are removed,
    so a reader globbing the folders sees exactly this dataset.
    """
    out = Path(out_dir)
    mdir, tdir = out / "mbp10", out / "trades"
    mdir.mkdir(parents=True, exist_ok=True)
    tdir.mkdir(parents=True, exist_ok=True)
    ext = ".dbn.zst" if cfg.compress else ".dbn"
    stem = cfg.symbol.lower()
    written, n_book, n_trades = [], 0, 0
    for day, d in simulate(cfg):
        tag = day.strftime("%Y%m%d")
        mpath, tpath = mdir / f"{stem}-{tag}.mbp-10{ext}", tdir / f"{stem}-{tag}.trades{ext}"
        book, trades = mbp10_records(cfg, d), trade_records(cfg, d)
        _write_atomic(mpath, _metadata(cfg, day, dbn.Schema.MBP_10) + book.tobytes(), cfg.compress)
        _write_atomic(tpath, _metadata(cfg, day, dbn.Schema.TRADES) + trades.tobytes(), cfg.compress)
        written.append((mpath, tpath))
        n_book += len(book)
        n_trades += len(trades)
    keep = {p for pair in written for p in pair}
    for folder, pattern in ((mdir, f"{stem}-*.mbp-10.dbn*"), (tdir, f"{stem}-*.trades.dbn*")):
        for stale in folder.glob(pattern):
            if stale not in keep:
                stale.unlink()
    return SynthSummary(mdir, tdir, cfg.days, n_book, n_trades, tuple(written))


def write_synthetic(out_dir: str | os.PathLike, *, seed: int = 7, days: int = 4, signal: float = 1.0,
                    **overrides) -> tuple[Path, Path]:
    """Write the synthetic market as DBN files; returns (mbp10_dir, trades_dir).

    `overrides` are any other `SynthConfig` fields (e.g. `events_per_day=5000`, `compress=True`).
    """
    summary = write_dataset(SynthConfig(seed=seed, days=days, signal=signal, **overrides), out_dir)
    return summary.mbp10_dir, summary.trades_dir


# ---------------------------------------------------------------------------------------------
# Predictability of the planted signal (what docs/synthetic.md reports and the tests pin)
# ---------------------------------------------------------------------------------------------

def multilevel_ofi(bid_px: np.ndarray, bid_sz: np.ndarray, ask_px: np.ndarray, ask_sz: np.ndarray) -> np.ndarray:
    """(n-1,) order-flow imbalance between consecutive book rows, summed over levels.

    Per level m (Cont, Kukanov & Stoikov 2014, extended to depth as in Xu, Gould & Howison 2019):
      e_m = 1{Pb' >= Pb} qb' - 1{Pb' <= Pb} qb - 1{Pa' <= Pa} qa' + 1{Pa' >= Pa} qa
    where unprimed is row n-1 and primed row n. Inputs (n, L) int64 ticks / sizes.
    """
    bp0, bp1, bs0, bs1 = bid_px[:-1], bid_px[1:], bid_sz[:-1], bid_sz[1:]
    ap0, ap1, as0, as1 = ask_px[:-1], ask_px[1:], ask_sz[:-1], ask_sz[1:]
    e = (bp1 >= bp0) * bs1 - (bp1 <= bp0) * bs0 - (ap1 <= ap0) * as1 + (ap1 >= ap0) * as0  # (n-1, L)
    return e.sum(axis=1)


@dataclass(frozen=True)
class DecisionSample:
    """A day seen on a decision clock of every `every` events (one row per decision)."""

    mid2: np.ndarray  # (T,) int64 bid + ask in ticks (= 2 x mid; integer so nothing rounds)
    bid: np.ndarray  # (T,) int64 best bid, ticks
    ask: np.ndarray  # (T,) int64 best ask, ticks
    ofi: np.ndarray  # (T,) int64 multi-level OFI over the events in (t-1, t]; 0 at t = 0
    pressure: np.ndarray  # (T,) float64 latent pressure at t (simulator truth, for diagnostics)


def decision_sample(d: DayArrays, every: int = 50) -> DecisionSample:
    """Sample a day at the end of every `every`-th event (F_LAST rows: the book is consistent there)."""
    rows = np.flatnonzero(d.flags & F_LAST)[::every]
    e = np.concatenate([[0], np.cumsum(multilevel_ofi(d.bid_px, d.bid_sz, d.ask_px, d.ask_sz))])
    ofi = np.concatenate([[0], np.diff(e[rows])])
    bid, ask = d.bid_px[rows, 0], d.ask_px[rows, 0]
    return DecisionSample(bid + ask, bid, ask, ofi, d.pressure[rows])


def ofi_signal(ofi: np.ndarray, k: int) -> np.ndarray:
    """(T,) OFI summed over the last k decision intervals (t-k, t] (causal: row t uses ofi[t-k+1..t])."""
    c = np.concatenate([[0], np.cumsum(ofi)])
    out = c[1:].copy()
    out[k:] -= c[1:-k]
    return out


def ofi_forecast_corr(samples: list[DecisionSample], k: int = 4, h: int = 4) -> float:
    """Pooled corr(OFI over the last k decisions, mid change over the next h decisions)."""
    xs, ys = [], []
    for s in samples:
        x = ofi_signal(s.ofi, k)
        t = np.arange(k, len(s.mid2) - h)
        xs.append(x[t] / max(float(np.std(s.ofi)), 1e-12))  # per-day scale so days pool fairly
        ys.append((s.mid2[t + h] - s.mid2[t]) / 2.0)
    return float(np.corrcoef(np.concatenate(xs), np.concatenate(ys))[0, 1])


@dataclass(frozen=True)
class RuleResult:
    trades: int
    net_ticks: np.ndarray  # (trades,) PnL per round trip after crossing the spread and fees, ticks
    gross_ticks: np.ndarray  # (trades,) mid-to-mid PnL per round trip, ticks

    @staticmethod
    def _t(x: np.ndarray) -> float:
        return float(x.mean() / (x.std(ddof=1) / np.sqrt(len(x)))) if len(x) > 1 and x.std() > 0 else 0.0

    @property
    def net_mean(self) -> float:
        return float(self.net_ticks.mean()) if self.trades else 0.0

    @property
    def net_t(self) -> float:
        return self._t(self.net_ticks)

    @property
    def gross_mean(self) -> float:
        return float(self.gross_ticks.mean()) if self.trades else 0.0

    @property
    def gross_t(self) -> float:
        return self._t(self.gross_ticks)


def ofi_rule_backtest(samples: list[DecisionSample], k: int = 4, h: int = 4, threshold_sd: float = 1.0,
                      fee_ticks: float = 0.04) -> RuleResult:
    """The simplest OFI strategy with market orders, one contract, non-overlapping holds.

    Every h decisions: if the last-k OFI is above `threshold_sd` standard deviations (of that
    day's last-k OFI), buy at the ask and sell h decisions later at the bid; below minus the
    threshold, the mirror image; else stay flat. Fees `fee_ticks` per contract per side.
    """
    net, gross = [], []
    for s in samples:
        x = ofi_signal(s.ofi, k)
        thr = threshold_sd * float(np.std(x))
        t = np.arange(k, len(s.mid2) - h, h)
        pos = np.where(x[t] > thr, 1, np.where(x[t] < -thr, -1, 0))
        t, pos = t[pos != 0], pos[pos != 0]
        # long: sell at bid(t+h) - buy at ask(t); short: sell at bid(t) - buy at ask(t+h)
        pnl = np.where(pos > 0, s.bid[t + h] - s.ask[t], s.bid[t] - s.ask[t + h]) - 2 * fee_ticks
        net.append(pnl.astype(np.float64))
        gross.append(pos * (s.mid2[t + h] - s.mid2[t]) / 2.0)
    n, g = np.concatenate(net), np.concatenate(gross)
    return RuleResult(len(n), n, g)


RECOMMENDED_FEE_USD_PER_SIDE = 0.50
"""Default fee for backtests on this market: USD per contract per side (CME member-rate ES exchange
+ clearing is ~0.3-0.7; 0.50 = 0.04 ticks at 12.5 USD/tick). The spread, not the fee, dominates."""


def predictability_table(signals=(0.0, 0.3, 1.0, 2.0), seeds=range(10), every: int = 50, k: int = 4,
                         h: int = 4, **overrides) -> list[dict]:
    """One row per signal level: OFI->mid corr and OFI-rule PnL over `seeds` (default-size days)."""
    rows = []
    for sig in signals:
        samples = [decision_sample(d, every) for s in seeds
                   for _, d in simulate(SynthConfig(seed=s, signal=sig, **overrides))]
        cfg = SynthConfig(signal=sig, **overrides)
        r = ofi_rule_backtest(samples, k, h, fee_ticks=RECOMMENDED_FEE_USD_PER_SIDE / cfg.tick_value)
        rows.append({"signal": sig, "corr": round(ofi_forecast_corr(samples, k, h), 4), "trades": r.trades,
                     "net_ticks": round(r.net_mean, 3), "net_t": round(r.net_t, 2),
                     "gross_ticks": round(r.gross_mean, 3), "gross_t": round(r.gross_t, 2)})
    return rows


# ---------------------------------------------------------------------------------------------
# CLI: python -m trainer.data synth --out DIR --seed S --days D --signal X
# ---------------------------------------------------------------------------------------------

_CLI_FIELDS = ("seed", "days", "signal", "events_per_day", "base_price", "start_date", "compress")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `synth` subcommand's options (help text = the SynthConfig field docs)."""
    docs = _field_docs()
    defaults = SynthConfig()
    parser.add_argument("--out", required=True, help="output folder; gets mbp10/ and trades/")
    for name in _CLI_FIELDS:
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{docs.get(name, '')} (default {default})")
        else:
            parser.add_argument(flag, type=type(default), default=default,
                                help=f"{docs.get(name, '')} (default {default})")


def run(args: argparse.Namespace) -> int:
    """Write the dataset; print one JSON line {mbp10_dir, trades_dir, days, book_events, trades}."""
    try:
        cfg = SynthConfig(**{name: getattr(args, name) for name in _CLI_FIELDS})
        s = write_dataset(cfg, args.out)
    except Exception as exc:  # process edge: one clear line, exit code per DESIGN.md
        print(f"synth: error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    print(json.dumps({"mbp10_dir": str(s.mbp10_dir), "trades_dir": str(s.trades_dir), "days": s.days,
                      "book_events": s.book_events, "trades": s.trades}))
    return 0


def _field_docs() -> dict[str, str]:
    """Field docstrings of SynthConfig, parsed from this file's source (they become --help)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(SynthConfig))
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[stmt.target.id] = " ".join(str(nxt.value.value).split())
    return docs


__all__ = [
    "DayArrays", "DecisionSample", "GENERATOR_VERSION", "MBP10_DTYPE", "RECOMMENDED_FEE_USD_PER_SIDE",
    "RuleResult", "SynthConfig", "SynthSummary", "TRADE_DTYPE", "add_arguments", "decision_sample",
    "mbp10_records", "multilevel_ofi", "ofi_forecast_corr", "ofi_rule_backtest", "ofi_signal",
    "predictability_table", "run", "simulate", "simulate_day", "trade_records", "write_dataset",
    "write_synthetic",
]


if __name__ == "__main__":
    # python -m trainer.data.synth : the predictability table in docs/synthetic.md
    for row in predictability_table():
        print(json.dumps(row))
