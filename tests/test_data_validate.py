"""Every validation rule, one test each, on real fixture bytes mutated in tmp_path."""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from trainer.data.dbn import MBP10_DTYPE, TRADE_DTYPE, read_dbn_pair
from trainer.data.lobster import read_lobster
from trainer.data.mbo import read_dbn_mbo
from trainer.errors import InputError, exit_code_for

LOBSTER_ZIP = "lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
MSG = "AMZN_2012-06-21_34200000_57600000_message_5.csv"
OB = "AMZN_2012-06-21_34200000_57600000_orderbook_5.csv"


def _split(path: Path, dtype: np.dtype) -> tuple[bytes, np.ndarray]:
    raw = path.read_bytes()
    start = 8 + int.from_bytes(raw[4:8], "little")
    return raw[:start], np.frombuffer(raw, dtype, offset=start).copy()


def _write(path: Path, head: bytes, recs: np.ndarray) -> Path:
    path.write_bytes(head + recs.tobytes())
    return path


@pytest.fixture
def pair(shared_data):
    d = shared_data / "dbn"
    return d / "test_data.mbp-10.dbn", d / "test_data.trades.dbn"


@pytest.fixture
def lobster_dir(shared_data, tmp_path) -> Path:
    """The first 2,000 rows of the real AMZN pair, as plain CSV files."""
    out = tmp_path / "lob"
    out.mkdir()
    with zipfile.ZipFile(shared_data / LOBSTER_ZIP) as z:
        for name in (MSG, OB):
            lines = z.read(name).split(b"\n")[:2000]
            (out / name).write_bytes(b"\n".join(lines) + b"\n")
    return out


def _raises(rule: str, fn, *args, path: Path | None = None, record: int | None = None, **kw) -> InputError:
    with pytest.raises(InputError, match=rule) as ei:
        fn(*args, **kw)
    e = ei.value
    if path is not None:
        assert str(path) in str(e.path)
    if record is not None:
        assert e.record == record
    assert exit_code_for(e) == 2
    return e


def test_missing_file_is_refused(pair, tmp_path):
    _raises("does not exist", read_dbn_pair, tmp_path / "nope.dbn", pair[1], path=tmp_path / "nope.dbn")


def test_empty_file_is_refused(pair, tmp_path):
    (tmp_path / "e.dbn").write_bytes(b"")
    _raises("file is empty", read_dbn_pair, tmp_path / "e.dbn", pair[1], path=tmp_path / "e.dbn")


def test_truncated_dbn_record_is_refused_with_its_index(pair, tmp_path):
    bad = tmp_path / "cut.dbn"
    bad.write_bytes(pair[0].read_bytes()[:-100])  # the second 368-byte record loses its tail
    _raises("truncated record", read_dbn_pair, bad, pair[1], path=bad, record=1)


def test_truncated_zstd_stream_is_refused(shared_data, pair, tmp_path):
    src = shared_data / "dbn" / "test_data.mbp-10.v3.dbn.zst"
    bad = tmp_path / "cut.dbn.zst"
    bad.write_bytes(src.read_bytes()[:-40])
    _raises("truncated|corrupt", read_dbn_pair, bad, pair[1], path=bad)


def test_non_dbn_bytes_are_refused(shared_data, pair, tmp_path):
    bad = tmp_path / "readme.dbn"
    bad.write_bytes((shared_data / "lobster" / "LOBSTER_SampleFiles_ReadMe.txt").read_bytes())
    _raises("not a DBN file", read_dbn_pair, bad, pair[1], path=bad)


def test_trades_file_given_as_book_is_a_wrong_schema(pair):
    _raises("wrong schema 'trades', expected mbp-10", read_dbn_pair, pair[1], pair[1], path=pair[1])


def test_ohlcv_record_inside_a_book_file_is_a_wrong_schema(pair, tmp_path):
    head, recs = _split(pair[0], MBP10_DTYPE)
    recs["rtype"][1] = 0x21  # OHLCV-1m
    bad = _write(tmp_path / "x.dbn", head, recs)
    _raises("wrong record type ohlcv-1m", read_dbn_pair, bad, pair[1], path=bad, record=1)


def test_crossed_book_after_the_preopen_is_refused(pair, tmp_path):
    head, recs = _split(pair[0], MBP10_DTYPE)
    recs["levels"]["bid_px"][1, 0] = recs["levels"]["ask_px"][1, 0]  # bid0 == ask0 on record 1
    book = _write(tmp_path / "b.dbn", head, recs)
    t_head, trades = _split(pair[1], TRADE_DTYPE)
    trades["ts_recv"] -= np.uint64(10**9)  # first print before the book: the pre-open is over
    tr = _write(tmp_path / "t.dbn", t_head, trades)
    _raises("crossed book outside the pre-open", read_dbn_pair, book, tr, path=book, record=1)


def test_crossed_book_inside_the_preopen_is_allowed(pair, tmp_path):
    head, recs = _split(pair[0], MBP10_DTYPE)
    recs["levels"]["bid_px"][1, 0] = recs["levels"]["ask_px"][1, 0]
    book = _write(tmp_path / "b.dbn", head, recs)
    tape = read_dbn_pair(book, pair[1])  # fixture trades print after both book records
    assert tape.book.bid_px[1, 0] == tape.book.ask_px[1, 0]
    assert tape.book.ts_ns[1] < tape.preopen_end_ns


def test_non_monotonic_timestamps_are_refused(pair, tmp_path):
    head, recs = _split(pair[0], MBP10_DTYPE)
    bad = _write(tmp_path / "swap.dbn", head, recs[::-1].copy())
    _raises("non-monotonic book timestamp", read_dbn_pair, bad, pair[1], path=bad, record=1)


def test_null_trade_price_is_refused_as_non_finite(pair, tmp_path):
    head, recs = _split(pair[1], TRADE_DTYPE)
    recs["price"][1] = np.iinfo(np.int64).max  # DBN UNDEF_PRICE
    bad = _write(tmp_path / "t.dbn", head, recs)
    _raises("non-finite", read_dbn_pair, pair[0], bad, path=bad, record=1)


def test_non_positive_book_price_is_refused(pair, tmp_path):
    head, recs = _split(pair[0], MBP10_DTYPE)
    recs["levels"]["bid_px"][0, 2] = -recs["levels"]["bid_px"][0, 2]
    bad = _write(tmp_path / "b.dbn", head, recs)
    _raises("non-positive bid price", read_dbn_pair, bad, pair[1], path=bad, record=0)


def test_non_positive_trade_price_is_refused(pair, tmp_path):
    head, recs = _split(pair[1], TRADE_DTYPE)
    recs["price"][0] = 0
    bad = _write(tmp_path / "t.dbn", head, recs)
    _raises("non-positive trade price", read_dbn_pair, pair[0], bad, path=bad, record=0)


def test_negative_size_is_refused(lobster_dir):
    ob = lobster_dir / OB
    lines = ob.read_bytes().split(b"\n")
    cols = lines[7].split(b",")
    cols[1] = b"-" + cols[1]  # ask size 1 of book row 7
    lines[7] = b",".join(cols)
    ob.write_bytes(b"\n".join(lines))
    _raises("negative ask size", read_lobster, lobster_dir, path=ob, record=7)


def test_non_finite_lobster_price_is_refused(lobster_dir):
    msg = lobster_dir / MSG
    lines = msg.read_bytes().split(b"\n")
    cols = lines[3].split(b",")
    cols[4] = b"nan"
    lines[3] = b",".join(cols)
    msg.write_bytes(b"\n".join(lines))
    _raises("non-finite message field", read_lobster, lobster_dir, path=msg, record=3)


def test_several_instruments_without_a_symbol_choice_are_refused(pair, tmp_path):
    head, recs = _split(pair[1], TRADE_DTYPE)
    recs["instrument_id"][1] = 999
    bad = _write(tmp_path / "t.dbn", head, recs)
    _raises("several instruments", read_dbn_pair, pair[0], bad, path=bad, record=1)


def test_lobster_row_count_mismatch_is_refused(lobster_dir):
    ob = lobster_dir / OB
    ob.write_bytes(b"\n".join(ob.read_bytes().rstrip(b"\n").split(b"\n")[:-1]) + b"\n")
    _raises("row-count mismatch: 2000 messages vs 1999", read_lobster, lobster_dir, path=ob)


def test_lobster_without_orderbook_file_is_refused_as_missing_side(lobster_dir):
    (lobster_dir / OB).unlink()
    _raises("book and trades are both mandatory", read_lobster, lobster_dir)


def test_dbn_trades_file_without_records_is_refused_as_missing_side(pair, tmp_path):
    head, _ = _split(pair[1], TRADE_DTYPE)
    empty = tmp_path / "t.dbn"
    empty.write_bytes(head)  # valid metadata, zero trade records
    _raises("book and trades are both mandatory", read_dbn_pair, pair[0], empty, path=empty)


def test_mbo_input_is_validated_like_the_others(shared_data, tmp_path):
    src = shared_data / "dbn" / "test_data.mbo.dbn"
    bad = tmp_path / "m.dbn"
    bad.write_bytes(src.read_bytes()[:-7])
    _raises("truncated record", read_dbn_mbo, bad, path=bad, record=1)


def _first_violation_reference(ts, bid_px, bid_sz, ask_px, ask_sz, preopen_end_ns):
    """Slow, obvious row-by-row version of the fused book check."""
    for i in range(len(ts)):
        for k in range(bid_px.shape[1]):
            for code, bad in ((1, bid_sz[i, k] < 0), (2, ask_sz[i, k] < 0),
                              (3, bid_sz[i, k] > 0 and bid_px[i, k] <= 0), (4, ask_sz[i, k] > 0 and ask_px[i, k] <= 0)):
                if bad:
                    return i, code
        if ts[i] >= preopen_end_ns and bid_sz[i, 0] > 0 and ask_sz[i, 0] > 0 and bid_px[i, 0] >= ask_px[i, 0]:
            return i, 5
    return -1, 0


def test_fused_book_check_matches_row_by_row_reference():
    from trainer.data.validate import _first_book_violation

    rng = np.random.default_rng(1)
    for trial in range(200):
        n, levels = 30, 3
        ts = np.arange(n, dtype=np.int64)
        bid_px = 100 - np.arange(levels)[None, :] + np.zeros((n, 1), np.int64)
        ask_px = 101 + np.arange(levels)[None, :] + np.zeros((n, 1), np.int64)
        bid_sz, ask_sz = rng.integers(0, 5, (n, levels)), rng.integers(0, 5, (n, levels))
        for _ in range(rng.integers(0, 3)):  # plant 0-2 random violations
            i, k = rng.integers(n), rng.integers(levels)
            arr = [bid_sz, ask_sz, bid_px, ask_px][rng.integers(4)]
            arr[i, k] = -rng.integers(0, 3) if arr is bid_sz or arr is ask_sz else rng.integers(-1, 1)
            if rng.random() < 0.3:
                bid_px[i, 0] = ask_px[i, 0] + rng.integers(0, 2)
        pre = int(rng.integers(0, n))
        args = (ts, *(a.astype(np.int64) for a in (bid_px, bid_sz, ask_px, ask_sz)), pre)
        assert tuple(_first_book_violation(*args)) == _first_violation_reference(*args), trial
