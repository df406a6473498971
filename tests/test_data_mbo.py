"""MBO -> MBP-10 rebuild: hand-checked tiny event sequence, numba kernel vs slow reference, real ES session."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainer.data.dbn import MBO_DTYPE, read_dbn_file
from trainer.data.mbo import read_dbn_mbo, rebuild_book, rebuild_book_reference
from trainer.data.tape import BUY

ES = "es-mbo/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
ES_SNAPSHOT = "es-mbo/esh4-glbx-mdp3-20231224.mbo.dbn.zst"
NANOS_PER_TICK = 250_000_000  # ES: 0.25 index points
LAST = 128


def _px(ticks: int) -> int:
    return ticks * NANOS_PER_TICK


def _tiny_file(shared_data: Path, tmp_path: Path) -> Path:
    """A hand-checkable MBO sequence made by editing copies of a real ESH1 fixture record."""
    src = shared_data / "dbn" / "test_data.mbo.dbn"
    raw = src.read_bytes()
    start = 8 + int.from_bytes(raw[4:8], "little")
    proto = np.frombuffer(raw, MBO_DTYPE, offset=start)[:1]
    # (action, side, order_id, price ticks, size, flags)
    seq = [
        (b"A", b"B", 1, 400, 5, LAST),  # 0 bid 400x5
        (b"A", b"A", 2, 401, 3, LAST),  # 1 ask 401x3
        (b"A", b"B", 3, 400, 2, 0),  # 2 bid 400 now 7 (event continues)
        (b"A", b"B", 4, 399, 1, LAST),  # 3 bids 400x7, 399x1
        (b"T", b"B", 0, 401, 2, 0),  # 4 buyer lifts 2 @ 401: no book change
        (b"F", b"A", 2, 401, 2, 0),  # 5 resting ask filled: no book change (the C below does it)
        (b"C", b"A", 2, 401, 2, LAST),  # 6 ask 401x1
        (b"M", b"B", 1, 399, 4, LAST),  # 7 order 1 moves 400x5 -> 399x4: bids 400x2, 399x5
        (b"C", b"B", 3, 400, 2, LAST),  # 8 bids 399x5
        (b"R", b"N", 0, 0, 0, LAST),  # 9 clear: empty book
        (b"A", b"A", 5, 404, 1, LAST),  # 10 ask 404x1
    ]
    recs = np.repeat(proto, len(seq))
    for i, (act, side, oid, px, sz, flags) in enumerate(seq):
        recs[i]["action"], recs[i]["side"], recs[i]["order_id"] = act, side, oid
        recs[i]["price"] = _px(px) if act != b"R" else np.iinfo(np.int64).max
        recs[i]["size"], recs[i]["flags"] = sz, flags
        recs[i]["ts_recv"] = proto["ts_recv"][0] + i
    out = tmp_path / "tiny.mbo.dbn"
    out.write_bytes(raw[:start] + recs.tobytes())
    return out


# Expected book after each F_LAST record, 2 levels: (record, bids [(px, sz)], asks [(px, sz)]).
TINY_EXPECTED = [
    (0, [(400, 5)], []),
    (1, [(400, 5)], [(401, 3)]),
    (3, [(400, 7), (399, 1)], [(401, 3)]),
    (6, [(400, 7), (399, 1)], [(401, 1)]),
    (7, [(400, 2), (399, 5)], [(401, 1)]),
    (8, [(399, 5)], [(401, 1)]),
    (9, [], []),
    (10, [], [(404, 1)]),
]


def _levels(pairs, n=2):
    pairs = pairs + [(0, 0)] * (n - len(pairs))
    return [p for p, _ in pairs], [s for _, s in pairs]


def test_tiny_sequence_rebuilds_the_hand_checked_book(shared_data, tmp_path):
    tape = read_dbn_mbo(_tiny_file(shared_data, tmp_path), levels=2, preopen_end_ns=0)
    b = tape.book
    assert len(b) == len(TINY_EXPECTED)
    for row, (rec, bids, asks) in enumerate(TINY_EXPECTED):
        bp, bs = _levels(bids)
        ap, as_ = _levels(asks)
        assert (b.bid_px[row].tolist(), b.bid_sz[row].tolist()) == (bp, bs), rec
        assert (b.ask_px[row].tolist(), b.ask_sz[row].tolist()) == (ap, as_), rec
    # One trade from the T record; the F of the same event is not a second trade.
    assert tape.trades.px.tolist() == [401] and tape.trades.size.tolist() == [2]
    assert tape.trades.side.tolist() == [BUY]


def test_reference_rebuild_agrees_on_the_tiny_sequence(shared_data, tmp_path):
    recs = read_dbn_file(_tiny_file(shared_data, tmp_path), "mbo").records
    fast, slow = rebuild_book(recs, 2), rebuild_book_reference(recs, 2)
    assert fast[0].tolist() == [r for r, _, _ in TINY_EXPECTED]
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)


def test_numba_rebuild_matches_python_reference_through_the_open(shared_data):
    recs = read_dbn_file(shared_data / ES, "mbo").records
    part = recs[: 8725 + 12_000]  # snapshot, pre-open, the opening auction (record 9650) and live trading
    fast, slow = rebuild_book(part, 10), rebuild_book_reference(part, 10)
    assert len(fast[0]) > 5000
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)


def test_es_session_gives_47022_book_states_and_2973_trades_uncrossed_after_the_preopen(shared_data):
    tape = read_dbn_mbo(shared_data / ES)
    b, t = tape.book, tape.trades
    assert tape.instrument.symbol == "ESH4" and tape.instrument.tick_value == 12.5
    assert (len(b), len(t), b.levels) == (47_022, 2_973, 10)
    assert int(t.size.sum()) == 9_892
    # The pre-open ends with the opening print at 23:00:00.1059 UTC; the book is crossed (indicative)
    # before it and uncrossed with all 10 levels on both sides afterwards.
    assert tape.preopen_end_ns == 1703545200105900877
    live = b.ts_ns >= tape.preopen_end_ns
    crossed = b.bid_px[:, 0] >= b.ask_px[:, 0]
    assert crossed[~live].any() and not crossed[live].any()
    assert (b.bid_sz[live] > 0).all() and (b.ask_sz[live] > 0).all()
    assert (np.diff(b.bid_px[live], axis=1) < 0).all() and (np.diff(b.ask_px[live], axis=1) > 0).all()


def test_opening_auction_fills_both_sides_but_counts_one_trade(shared_data):
    recs = read_dbn_file(shared_data / ES, "mbo").records
    at_open = recs["ts_recv"] == 1703545200105900877
    t = at_open & (recs["action"] == b"T")
    f = at_open & (recs["action"] == b"F")
    assert recs["size"][t].sum() == 44 and recs["size"][f].sum() == 88  # buyer and seller orders filled
    tape = read_dbn_mbo(shared_data / ES)
    assert tape.trades.size[tape.trades.ts_ns == 1703545200105900877].sum() == 44


def test_previous_day_snapshot_then_session_equals_session_alone(shared_data):
    both = read_dbn_mbo([shared_data / ES_SNAPSHOT, shared_data / ES])
    alone = read_dbn_mbo(shared_data / ES)
    # The session file opens with its own snapshot, which replaces the earlier one (one extra row).
    assert len(both.book) == len(alone.book) + 1
    np.testing.assert_array_equal(both.book.bid_px[1:], alone.book.bid_px)
    np.testing.assert_array_equal(both.book.ask_sz[1:], alone.book.ask_sz)


def test_levels_argument_truncates_the_book(shared_data):
    tape = read_dbn_mbo(shared_data / ES, levels=3)
    full = read_dbn_mbo(shared_data / ES)
    np.testing.assert_array_equal(tape.book.bid_px, full.book.bid_px[:, :3])
    with pytest.raises(ValueError, match="levels"):
        read_dbn_mbo(shared_data / ES, levels=0)
