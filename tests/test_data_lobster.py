"""LOBSTER reader on the real AMZN level-5 sample: counts, time, sides, empty levels, input forms."""
from __future__ import annotations

import datetime as dt
import zipfile

import numpy as np
import pytest

from trainer.data.lobster import parse_csv_numbers, read_lobster
from trainer.data.tape import BUY, SELL
from trainer.errors import InputError

ZIP = "lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
MSG = "AMZN_2012-06-21_34200000_57600000_message_5.csv"
OB = "AMZN_2012-06-21_34200000_57600000_orderbook_5.csv"


@pytest.fixture(scope="module")
def amzn(shared_data):
    return read_lobster(shared_data / ZIP)


def test_amzn_sample_loads_all_155935_events_at_5_levels(amzn):
    assert len(amzn.book) == 155_935 and amzn.book.levels == 5
    assert amzn.instrument.symbol == "AMZN"
    assert (amzn.instrument.tick_size, amzn.instrument.tick_value) == (0.01, 0.01)


def test_trades_are_the_type_4_and_5_executions(shared_data, amzn):
    with zipfile.ZipFile(shared_data / ZIP) as z:
        msg = np.loadtxt(z.open(MSG), delimiter=",")  # slow, obvious reference parse
    kinds = msg[:, 1]
    assert len(amzn.trades) == int(((kinds == 4) | (kinds == 5)).sum()) == 11_419
    ex = msg[(kinds == 4) | (kinds == 5)]
    np.testing.assert_array_equal(amzn.trades.size, ex[:, 3].astype(np.int64))
    # Resting sell (-1) executed = buyer-initiated; resting buy (+1) executed = seller-initiated.
    np.testing.assert_array_equal(amzn.trades.side, np.where(ex[:, 5] == -1, BUY, SELL))


def test_first_message_time_is_0930_new_york_in_ns_since_epoch(amzn):
    # 34200.017459617 s after midnight EDT (UTC-4) on 2012-06-21 = 13:30:00.017459617 UTC.
    want = int(dt.datetime(2012, 6, 21, 13, 30, tzinfo=dt.timezone.utc).timestamp()) * 10**9 + 17_459_617
    assert amzn.book.ts_ns[0] == want


def test_first_book_row_in_cent_ticks(amzn):
    # Row 0: 2239500,100,2231800,100,2239900,100,2230700,200,... (ask px, ask sz, bid px, bid sz per level).
    assert amzn.book.ask_px[0, :2].tolist() == [22395, 22399]
    assert amzn.book.bid_px[0, :2].tolist() == [22318, 22307]
    assert amzn.book.bid_sz[0, :2].tolist() == [100, 200]


def test_hidden_midpoint_execution_is_rounded_toward_the_aggressor(amzn):
    # Message "34352.757715015,5,0,63,2237950,1": resting buy executed = SELL at $223.795 -> 22380 ticks.
    t = amzn.trades
    i = int(np.flatnonzero((t.size == 63) & (t.ts_ns % 10**9 == 757_715_015))[0])
    assert (t.side[i], t.px[i]) == (SELL, 22380)


def test_dummy_empty_levels_become_size_zero_price_zero(tmp_path):
    ob = b"2239500,100,9999999999,0\n2239600,50,2231800,10\n"
    msg = b"34200.1,1,1,100,2239500,-1\n34200.2,1,2,10,2231800,1\n"
    (tmp_path / "X_2012-06-21_0_1_message_1.csv").write_bytes(msg)
    (tmp_path / "X_2012-06-21_0_1_orderbook_1.csv").write_bytes(ob)
    with pytest.raises(InputError, match="both mandatory"):  # no executions: trades side is missing
        read_lobster(tmp_path)
    msg2 = msg + b"34200.3,4,1,5,2239500,-1\n"
    ob2 = ob + b"2239500,95,-9999999999,0\n"
    (tmp_path / "X_2012-06-21_0_1_message_1.csv").write_bytes(msg2)
    (tmp_path / "X_2012-06-21_0_1_orderbook_1.csv").write_bytes(ob2)
    tape = read_lobster(tmp_path / "X_2012-06-21_0_1_message_1.csv")
    assert tape.book.bid_sz[:, 0].tolist() == [0, 10, 0]
    assert tape.book.bid_px[:, 0].tolist() == [0, 22318, 0]
    assert tape.trades.px.tolist() == [22395] and tape.trades.side.tolist() == [BUY]


def test_directory_and_levels_subset_match_the_zip(shared_data, tmp_path, amzn):
    with zipfile.ZipFile(shared_data / ZIP) as z:
        z.extract(MSG, tmp_path)
        z.extract(OB, tmp_path)
    three = read_lobster(tmp_path, levels=3)
    assert three.book.levels == 3
    np.testing.assert_array_equal(three.book.ask_px, amzn.book.ask_px[:, :3])
    np.testing.assert_array_equal(three.trades.ts_ns, amzn.trades.ts_ns)


def test_csv_parser_matches_python_split_on_a_real_slice(shared_data):
    with zipfile.ZipFile(shared_data / ZIP) as z:
        text = b"\n".join(z.read(OB).split(b"\n")[:500])
    want = np.array([[float(x) for x in line.split(b",")] for line in text.split(b"\n")])
    np.testing.assert_array_equal(parse_csv_numbers(text, 20, "ob"), want)
