"""MarketTape: the validated, reader-independent form of order-book data.

Every reader (DBN MBP-10 + trades, DBN MBO rebuild, LOBSTER, synthetic) produces one.
Prices are integer ticks (int64) everywhere inside the project; `Instrument` converts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Trade aggressor side codes (TradeSeries.side).
BUY = 1  # buyer-initiated: lifted the ask
SELL = -1  # seller-initiated: hit the bid
UNKNOWN = 0


@dataclass(frozen=True)
class Instrument:
    symbol: str
    """Instrument symbol as the venue spells it (e.g. 'ESH4', 'AMZN', 'SYN')."""
    tick_size: float
    """Minimum price increment in price units (ES: 0.25 index points)."""
    tick_value: float
    """Currency value of one tick for one contract/share (ES: 12.5 USD)."""

    def __post_init__(self) -> None:
        if not (self.tick_size > 0 and np.isfinite(self.tick_size)):
            raise ValueError(f"Instrument.tick_size must be finite and > 0, got {self.tick_size!r}")
        if not (self.tick_value > 0 and np.isfinite(self.tick_value)):
            raise ValueError(f"Instrument.tick_value must be finite and > 0, got {self.tick_value!r}")


@dataclass(frozen=True)
class BookSeries:
    """L-level book snapshots after each book event, oldest first.

    A level that does not exist (thin book) has size 0; its price is then 0 and must be ignored.
    """

    ts_ns: np.ndarray  # (n,) int64, non-decreasing, exchange/receive time in ns since epoch
    bid_px: np.ndarray  # (n, L) int64 ticks, level 0 = best bid, descending
    bid_sz: np.ndarray  # (n, L) int64 contracts/shares
    ask_px: np.ndarray  # (n, L) int64 ticks, level 0 = best ask, ascending
    ask_sz: np.ndarray  # (n, L) int64

    @property
    def levels(self) -> int:
        return int(self.bid_px.shape[1])

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])


@dataclass(frozen=True)
class TradeSeries:
    ts_ns: np.ndarray  # (m,) int64, non-decreasing
    px: np.ndarray  # (m,) int64 ticks
    size: np.ndarray  # (m,) int64
    side: np.ndarray  # (m,) int8: BUY=+1, SELL=-1, UNKNOWN=0

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])


@dataclass(frozen=True)
class MarketTape:
    """Book + trades of one instrument. Both are mandatory and non-empty."""

    instrument: Instrument
    book: BookSeries
    trades: TradeSeries
    sources: tuple[str, ...]
    """Paths the tape was read from (for error messages and provenance)."""
    preopen_end_ns: int = 0
    """Book rows with ts_ns < this are pre-open (a crossed book is allowed there)."""
