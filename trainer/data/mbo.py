"""DBN MBO (market by order) -> L-level book snapshots + trades, rebuilt with a numba kernel.

Databento MBO semantics (docs: schemas/mbo, examples/order-book/order-tracking, conventions/mbo-snapshot):
  A add            insert order (order_id, side, price, size)
  C cancel         remove `size` from the order (partial or full)
  M modify         new price and/or size for the order (unknown order_id: treated as an add)
  R clear          remove every resting order of the instrument
  T trade          the aggressor's print; side = aggressor side. Does NOT change the book.
  F fill           a resting order was filled. Does NOT change the book: every fill is accompanied by
                   a C (or M) record that removes the filled quantity, so applying F too would
                   double-count.
  N none           no book change
Flags: F_LAST (128) marks the last record of an event; the book is only consistent after it, so one
snapshot row is emitted per F_LAST record. F_SNAPSHOT (32) marks the records of a book snapshot
(normally R then A...). A snapshot that starts without an R (as in the ES sample, where each daily file
begins with the book at midnight) still replaces the book: the first F_SNAPSHOT record after a
non-snapshot record (or at the start of a file) clears the book.

Trades come from T records only (F records repeat the same volume from the resting side).
The pre-open ends at the first T record: before the opening print CME shows an indicative,
possibly crossed book.
"""
from __future__ import annotations

from pathlib import Path

from trainer.jit import njit
import numpy as np

from trainer.data.dbn import (
    F_LAST,
    F_SNAPSHOT,
    UNDEF_PRICE,
    _concat,
    _sides,
    expand_inputs,
    instrument_for,
    read_dbn_file,
    select_instrument,
    to_ticks,
)
from trainer.data.tape import BookSeries, MarketTape, TradeSeries
from trainer.data.validate import check_both_present, check_monotonic, validate_tape

__all__ = ["read_dbn_mbo", "decode_mbo", "rebuild_book", "rebuild_book_reference", "ACTION_CODES"]

# Action byte -> small int code for the kernel.
ACTION_CODES = {b"A": 1, b"C": 2, b"M": 3, b"R": 4, b"T": 5, b"F": 6, b"N": 0}
A_ADD, A_CANCEL, A_MODIFY, A_CLEAR = 1, 2, 3, 4


def decode_mbo(records: np.ndarray) -> dict[str, np.ndarray]:
    """Vectorised MBO columns for the kernel: action code, side (+1 bid, -1 ask, 0 none), clear flag."""
    action = np.zeros(records.shape[0], np.int8)
    for ch, code in ACTION_CODES.items():
        action[records["action"] == ch] = code
    side = np.where(records["side"] == b"B", 1, np.where(records["side"] == b"A", -1, 0)).astype(np.int8)
    flags = records["flags"]
    snap = (flags & F_SNAPSHOT) != 0
    prev_snap = np.concatenate([[False], snap[:-1]])
    # Snapshot start without an explicit R still clears (see module docstring).
    clear = (action == A_CLEAR) | (snap & ~prev_snap)
    return {"action": action, "side": side, "clear": clear, "last": (flags & F_LAST) != 0}


@njit(cache=True, nogil=True)
def _rebuild_kernel(action, side, clear, last, oid_idx, px_idx, size, n_orders, n_prices, levels):  # pragma: no cover
    n = action.shape[0]
    n_out = 0
    for i in range(n):
        if last[i]:
            n_out += 1
    out_rec = np.empty(n_out, np.int64)
    out_bid = np.full((n_out, levels), -1, np.int64)  # price index, -1 = absent
    out_bsz = np.zeros((n_out, levels), np.int64)
    out_ask = np.full((n_out, levels), -1, np.int64)
    out_asz = np.zeros((n_out, levels), np.int64)
    ord_px = np.full(n_orders, -1, np.int64)  # price index of a live order, -1 = not resting
    ord_sz = np.zeros(n_orders, np.int64)
    ord_side = np.zeros(n_orders, np.int8)
    bid_q = np.zeros(n_prices, np.int64)  # resting quantity per price index
    ask_q = np.zeros(n_prices, np.int64)
    best_bid = -1  # highest bid index with quantity (or -1)
    best_ask = n_prices  # lowest ask index with quantity (or n_prices)
    row = 0
    for i in range(n):
        if clear[i]:
            ord_px[:] = -1
            ord_sz[:] = 0
            bid_q[:] = 0
            ask_q[:] = 0
            best_bid = -1
            best_ask = n_prices
        a = action[i]
        o = oid_idx[i]
        if a == A_CANCEL or a == A_MODIFY or a == A_ADD:
            # Remove what the order has resting (all of it for M/A-replace, `size` for C).
            if ord_px[o] >= 0:
                p = ord_px[o]
                q = ord_sz[o] if a != A_CANCEL else min(size[i], ord_sz[o])
                if ord_side[o] > 0:
                    bid_q[p] -= q
                else:
                    ask_q[p] -= q
                ord_sz[o] -= q
                if ord_sz[o] <= 0:
                    ord_px[o] = -1
                    ord_sz[o] = 0
            if a != A_CANCEL and px_idx[i] >= 0 and size[i] > 0 and side[i] != 0:
                p = px_idx[i]
                ord_px[o] = p
                ord_sz[o] = size[i]
                ord_side[o] = side[i]
                if side[i] > 0:
                    bid_q[p] += size[i]
                    if p > best_bid:
                        best_bid = p
                else:
                    ask_q[p] += size[i]
                    if p < best_ask:
                        best_ask = p
            while best_bid >= 0 and bid_q[best_bid] <= 0:
                best_bid -= 1
            while best_ask < n_prices and ask_q[best_ask] <= 0:
                best_ask += 1
        if last[i]:
            out_rec[row] = i
            k = 0
            p = best_bid
            while k < levels and p >= 0:
                if bid_q[p] > 0:
                    out_bid[row, k] = p
                    out_bsz[row, k] = bid_q[p]
                    k += 1
                p -= 1
            k = 0
            p = best_ask
            while k < levels and p < n_prices:
                if ask_q[p] > 0:
                    out_ask[row, k] = p
                    out_asz[row, k] = ask_q[p]
                    k += 1
                p += 1
            row += 1
    return out_rec, out_bid, out_bsz, out_ask, out_asz


def rebuild_book(records: np.ndarray, levels: int = 10) -> tuple[np.ndarray, ...]:
    """MBO records of ONE instrument -> (rec_idx, bid_px, bid_sz, ask_px, ask_sz) per F_LAST record.

    Prices are returned in DBN int64 nanos (absent level: price 0, size 0); rec_idx is the index of the
    event's F_LAST record. Dense re-indexing (np.unique) of order ids and prices lets the kernel use flat
    arrays instead of hash maps.
    """
    cols = decode_mbo(records)
    _, oid_idx = np.unique(records["order_id"], return_inverse=True)
    price = records["price"]
    valid = price != UNDEF_PRICE
    uniq_px = np.unique(price[valid])  # (n_prices,) ascending nanos
    px_idx = np.full(price.shape[0], -1, np.int64)
    px_idx[valid] = np.searchsorted(uniq_px, price[valid])
    rec, bid, bsz, ask, asz = _rebuild_kernel(
        cols["action"], cols["side"], cols["clear"], cols["last"], oid_idx.astype(np.int64), px_idx,
        records["size"].astype(np.int64), int(oid_idx.max(initial=-1)) + 1, int(uniq_px.shape[0]), int(levels),
    )
    lookup = np.concatenate([uniq_px, [0]])  # index -1 -> 0 (absent level)
    return rec, lookup[bid], bsz, lookup[ask], asz


def rebuild_book_reference(records: np.ndarray, levels: int = 10) -> tuple[np.ndarray, ...]:
    """Slow, obvious pure-Python rebuild with dicts; same output as `rebuild_book` (for tests)."""
    orders: dict[int, tuple[int, int, int]] = {}  # order_id -> (side, price, size)
    book = {1: {}, -1: {}}  # side -> {price: qty}
    out = []
    prev_snap = False
    for i, r in enumerate(records.tolist()):
        names = records.dtype.names
        r = dict(zip(names, r))
        flags, action, s = r["flags"], r["action"], r["side"]
        snap = bool(flags & F_SNAPSHOT)
        if action == b"R" or (snap and not prev_snap):
            orders.clear()
            book = {1: {}, -1: {}}
        prev_snap = snap
        side = 1 if s == b"B" else (-1 if s == b"A" else 0)
        oid, px, sz = r["order_id"], r["price"], r["size"]
        if action in (b"A", b"C", b"M"):
            if oid in orders:
                o_side, o_px, o_sz = orders.pop(oid)
                q = min(sz, o_sz) if action == b"C" else o_sz
                book[o_side][o_px] -= q
                if book[o_side][o_px] == 0:
                    del book[o_side][o_px]
                if o_sz - q > 0:
                    orders[oid] = (o_side, o_px, o_sz - q)
            if action != b"C" and px != UNDEF_PRICE and sz > 0 and side != 0:
                orders[oid] = (side, px, sz)
                book[side][px] = book[side].get(px, 0) + sz
        if flags & F_LAST:
            bids = sorted(book[1].items(), reverse=True)[:levels]
            asks = sorted(book[-1].items())[:levels]
            bids += [(0, 0)] * (levels - len(bids))
            asks += [(0, 0)] * (levels - len(asks))
            out.append((i, [p for p, _ in bids], [q for _, q in bids], [p for p, _ in asks], [q for _, q in asks]))
    rec = np.array([o[0] for o in out], np.int64)
    return (rec,) + tuple(np.array([o[k] for o in out], np.int64).reshape(len(out), levels) for k in range(1, 5))


def read_dbn_mbo(
    paths: str | Path | list,
    symbol: str | None = None,
    levels: int = 10,
    tick_size: float | None = None,
    tick_value: float | None = None,
    preopen_end_ns: int | None = None,
) -> MarketTape:
    """MBO DBN files (first may be the day's snapshot) -> MarketTape with `levels` book levels.

    Several instruments and no `symbol`: the most active one (most records) is used.
    """
    if levels < 1:
        raise ValueError(f"levels must be >= 1, got {levels!r}")
    files = [read_dbn_file(p, "mbo") for p in expand_inputs(paths)]
    symbol = select_instrument(files, symbol, default_most_active=True)
    recs, org = _concat(files, symbol)
    srcs = tuple(str(f.path) for f in files)
    ts = recs["ts_recv"].astype(np.int64)
    check_monotonic(ts, org, "mbo")
    rec, bid_n, bsz, ask_n, asz = rebuild_book(recs, levels)
    is_trade = recs["action"] == b"T"
    trades = recs[is_trade]
    t_org = org.take(np.flatnonzero(is_trade))
    b_org = org.take(rec)
    check_both_present(rec.shape[0], trades.shape[0], ", ".join(srcs), ", ".join(srcs) + " (no T records)")
    present_px = np.concatenate([bid_n[bsz > 0], ask_n[asz > 0], trades["price"]])
    inst = instrument_for(symbol, present_px[present_px != UNDEF_PRICE], tick_size, tick_value)
    t_ts = ts[is_trade]
    tape = MarketTape(
        instrument=inst,
        book=BookSeries(
            ts[rec],
            to_ticks(bid_n, bsz > 0, inst.tick_size, b_org, "bid"),
            bsz,
            to_ticks(ask_n, asz > 0, inst.tick_size, b_org, "ask"),
            asz,
        ),
        trades=TradeSeries(
            t_ts,
            to_ticks(trades["price"], np.ones(trades.shape[0], bool), inst.tick_size, t_org, "trade"),
            trades["size"].astype(np.int64),
            _sides(trades["side"]),
        ),
        sources=srcs,
        preopen_end_ns=int(t_ts[0]) if preopen_end_ns is None else int(preopen_end_ns),
    )
    return validate_tape(tape, b_org, t_org)
