"""Decision clock: which book rows the agent decides at.

A book row is *eligible* for a decision when
  - it is the last row of its timestamp (rows sharing a ts_ns are one instant; deciding in the middle of
    them would show a half-applied update while trades at that same ts_ns already count as past),
  - both best levels exist (size > 0), so mid, spread and the trade-histogram anchor are defined,
  - its time is at or after `start_ns` (the end of the pre-open, where crossed books are allowed).

'events' clock: the first eligible row at or after every `clock_events`-th row (counted from the first
row at/after start_ns). 'time' clock: the first eligible row of each epoch-aligned `clock_time_ns`
bucket. Both are prefix-stable: whether row i is a decision depends only on rows <= i and on whether
row i+1 shares its timestamp, so truncating the future never changes earlier decisions.
"""
from __future__ import annotations

import numpy as np

from trainer.data.tape import BookSeries
from trainer.features.config import FeatureConfig


def eligible_rows(book: BookSeries, start_ns: int = 0) -> np.ndarray:
    """(k,) int64 ascending indices of book rows a decision may use (see module docstring)."""
    ts = book.ts_ns
    n = ts.shape[0]
    end_of_instant = np.ones(n, dtype=bool)
    end_of_instant[:-1] = ts[1:] != ts[:-1]
    two_sided = (book.bid_sz[:, 0] > 0) & (book.ask_sz[:, 0] > 0)
    return np.flatnonzero(end_of_instant & two_sided & (ts >= start_ns)).astype(np.int64)


def decision_rows(book: BookSeries, cfg: FeatureConfig, *, start_ns: int = 0) -> np.ndarray:
    """(T,) int64 strictly increasing indices into `book` rows, one per decision."""
    ok = eligible_rows(book, start_ns)
    if ok.size == 0:
        return ok
    if cfg.clock == "events":
        first = int(np.searchsorted(book.ts_ns, start_ns, side="left"))
        targets = np.arange(first + cfg.clock_events - 1, len(book), cfg.clock_events, dtype=np.int64)
        pos = np.searchsorted(ok, targets, side="left")  # first eligible row at or after each target
        rows = ok[pos[pos < ok.size]]  # sorted; a long ineligible stretch snaps several targets to one row
        keep = np.ones(rows.size, dtype=bool)
        keep[1:] = rows[1:] != rows[:-1]  # dedupe sorted rows (np.unique would re-sort: 20x slower)
        return rows[keep]
    bucket = book.ts_ns[ok] // cfg.clock_time_ns
    first_in_bucket = np.ones(ok.size, dtype=bool)
    first_in_bucket[1:] = bucket[1:] != bucket[:-1]
    return ok[first_in_bucket]
