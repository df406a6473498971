"""DBN MBP-10 + trades reader: numpy record layout pinned to databento_dbn, pair reading, ticks, symbols."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from trainer.data import dbn
from trainer.data.dbn import (
    MBO_DTYPE,
    MBP10_DTYPE,
    TRADE_DTYPE,
    _mbp10_levels,
    instrument_for,
    read_dbn_file,
    read_dbn_pair,
)
from trainer.data.tape import BUY, SELL, UNKNOWN
from trainer.errors import InputError

FIXTURES = [
    "dbn/test_data.mbo.dbn",
    "dbn/test_data.mbo.v3.dbn.zst",
    "dbn/test_data.mbp-10.dbn",
    "dbn/test_data.mbp-10.v3.dbn.zst",
    "dbn/test_data.trades.dbn",
    "dbn/test_data.trades.v3.dbn.zst",
    "es-mbo/esh4-glbx-mdp3-20231224.mbo.dbn.zst",
    "es-mbo/esh4-glbx-mdp3-20231225.mbo.dbn.zst",
    "es-mbo/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst",
]


def _decoder_records(path: Path) -> list:
    """databento_dbn's own object decoding, records as written (no version upgrade)."""
    import databento_dbn
    import zstandard

    raw = path.read_bytes()
    if raw[:4] == dbn.ZSTD_MAGIC:
        raw = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
    dec = databento_dbn.DBNDecoder(upgrade_policy=databento_dbn.VersionUpgradePolicy.AS_IS)
    dec.write(raw)
    return dec.decode()[1:]


def _char(x) -> bytes:
    return str(getattr(x, "value", x)).encode()


@pytest.mark.parametrize("rel", FIXTURES)
def test_numpy_layout_matches_databento_decoder_field_by_field(shared_data, rel):
    path = shared_data / rel
    schema = "mbo" if ".mbo." in rel else "mbp-10" if "mbp-10" in rel else "trades"
    recs = read_dbn_file(path, schema).records
    objs = _decoder_records(path)
    assert len(recs) == len(objs) > 0
    step = max(1, len(objs) // 3000)  # every record for the small files, a spread sample of the big ones
    for i in range(0, len(objs), step):
        r, o = recs[i], objs[i]
        assert int(r["rtype"]) == int(o.rtype)
        assert int(r["publisher_id"]) == int(o.publisher_id)
        assert int(r["instrument_id"]) == o.instrument_id
        assert int(r["ts_event"]) == o.ts_event and int(r["ts_recv"]) == o.ts_recv
        assert int(r["price"]) == o.price and int(r["size"]) == o.size
        assert r["action"] == _char(o.action) and r["side"] == _char(o.side)
        assert int(r["flags"]) == int(o.flags)
        assert int(r["ts_in_delta"]) == o.ts_in_delta and int(r["sequence"]) == o.sequence
        if schema == "mbo":
            assert int(r["order_id"]) == o.order_id and int(r["channel_id"]) == o.channel_id
        else:
            assert int(r["depth"]) == o.depth
        if schema == "mbp-10":
            for k in range(10):
                lv = r["levels"][k]
                for f in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
                    assert int(lv[f]) == getattr(o, f"{f}_{k:02d}"), (i, k, f)


def test_record_sizes_are_the_dbn_struct_sizes():
    assert (TRADE_DTYPE.itemsize, MBO_DTYPE.itemsize, MBP10_DTYPE.itemsize) == (48, 56, 368)


def test_pair_reads_es_fixture_into_ticks_with_es_contract_specs(shared_data):
    d = shared_data / "dbn"
    tape = read_dbn_pair(d / "test_data.mbp-10.dbn", d / "test_data.trades.dbn")
    assert tape.instrument.symbol == "ESH1"
    assert (tape.instrument.tick_size, tape.instrument.tick_value) == (0.25, 12.5)
    # bid_px_00 = 3720.25 -> 14881 ticks of 0.25; ask 3720.50 -> 14882.
    assert tape.book.bid_px[0, 0] == 14881 and tape.book.ask_px[0, 0] == 14882
    assert tape.book.bid_sz[0].tolist() == [24, 31, 32, 39, 50, 42, 44, 64, 53, 67]
    assert tape.book.ts_ns[0] == 1609160400000704060
    assert tape.trades.px.tolist() == [14881, 14881] and tape.trades.size.tolist() == [5, 21]
    for a in (tape.book.ts_ns, tape.book.bid_px, tape.book.bid_sz, tape.trades.px, tape.trades.size):
        assert a.dtype == np.int64


def test_plain_v2_and_zstd_v3_fixtures_give_identical_tapes(shared_data):
    d = shared_data / "dbn"
    a = read_dbn_pair(d / "test_data.mbp-10.dbn", d / "test_data.trades.dbn")
    b = read_dbn_pair(d / "test_data.mbp-10.v3.dbn.zst", d / "test_data.trades.v3.dbn.zst")
    for x, y in ((a.book, b.book), (a.trades, b.trades)):
        for name in x.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name))


def test_trade_aggressor_side_maps_b_to_buy_a_to_sell_n_to_unknown():
    recs = np.zeros(3, TRADE_DTYPE)
    recs["side"] = [b"B", b"A", b"N"]
    assert dbn._sides(recs["side"]).tolist() == [BUY, SELL, UNKNOWN]


def test_es_trades_file_sides_match_the_decoder(shared_data):
    path = shared_data / "es-mbo" / "futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"
    recs = read_dbn_file(path, "trades").records
    want = [{"B": BUY, "A": SELL}.get(str(getattr(o.side, "value", o.side)), UNKNOWN) for o in _decoder_records(path)]
    assert dbn._sides(recs["side"]).tolist() == want


def _shifted_copy(src: Path, dst: Path, dt_ns: int) -> None:
    """Copy a plain DBN fixture with every record's ts_recv moved by dt_ns (editing the real bytes)."""
    raw = bytearray(src.read_bytes())
    start = 8 + int.from_bytes(raw[4:8], "little")
    dtype = read_dbn_file(src, ("mbp-10", "trades")).records.dtype
    recs = np.frombuffer(raw, dtype, offset=start).copy()
    recs["ts_recv"] += np.uint64(dt_ns)
    dst.write_bytes(bytes(raw[:start]) + recs.tobytes())


def test_directory_input_reads_files_sorted_by_name_in_time_order(shared_data, tmp_path):
    d = shared_data / "dbn"
    for kind in ("mbp-10", "trades"):
        (tmp_path / kind).mkdir()
        shutil.copy(d / f"test_data.{kind}.dbn", tmp_path / kind / "a.dbn")
        _shifted_copy(d / f"test_data.{kind}.dbn", tmp_path / kind / "b.dbn", 10**9)
        (tmp_path / kind / "notes.txt").write_text("ignored")
    tape = read_dbn_pair(tmp_path / "mbp-10", tmp_path / "trades")
    assert len(tape.book) == 4 and len(tape.trades) == 4
    assert np.all(np.diff(tape.book.ts_ns) >= 0)
    assert tape.book.ts_ns[2] - tape.book.ts_ns[0] == 10**9
    assert len(tape.sources) == 4


def test_known_root_table_and_argument_override():
    px = lambda: np.array([1_000_000_000])  # noqa: E731
    assert instrument_for("MESZ4", px) == dbn.Instrument("MESZ4", 0.25, 1.25)
    assert instrument_for("NQ.c.0", px) == dbn.Instrument("NQ.c.0", 0.25, 5.0)
    assert instrument_for("ESH4", px, tick_value=50.0).tick_value == 50.0
    assert instrument_for("ESH4", px, tick_size=0.5, tick_value=25.0) == dbn.Instrument("ESH4", 0.5, 25.0)


def test_unknown_root_infers_tick_as_gcd_of_price_increments():
    # 100.05, 100.10, 100.25 -> increments 0.05, 0.15 -> gcd 0.05; tick_value falls back to the tick size.
    px = np.array([100_050_000_000, 100_100_000_000, 100_250_000_000])
    inst = instrument_for("1234", lambda: px)
    assert inst.tick_size == pytest.approx(0.05) and inst.tick_value == inst.tick_size


def test_fused_mbp10_kernel_matches_numpy_reference(shared_data):
    recs = read_dbn_file(shared_data / "dbn" / "test_data.mbp-10.dbn", "mbp-10").records
    rng = np.random.default_rng(0)
    big = np.resize(recs, 500).copy()
    lv = big["levels"]
    lv["bid_px"] = (14800 + rng.integers(-50, 50, lv.shape)) * 250_000_000
    lv["ask_px"] = (14900 + rng.integers(-50, 50, lv.shape)) * 250_000_000
    # Zero (absent) and large sizes, up to the full u32 range, to pin the low/high word split.
    lv["bid_sz"] = (rng.integers(0, 3, lv.shape) > 0) * rng.integers(0, 2**32 - 1, lv.shape, dtype=np.uint64)
    lv["ask_sz"] = rng.integers(0, 3, lv.shape) * 7
    big["levels"] = lv
    words = big.view("<i8").reshape(len(big), 46)
    bid_px, bid_sz, ask_px, ask_sz, err_row, _ = _mbp10_levels(words, 250_000_000)
    assert err_row == -1
    want_bsz = big["levels"]["bid_sz"].astype(np.int64)
    want_asz = big["levels"]["ask_sz"].astype(np.int64)
    np.testing.assert_array_equal(bid_sz, want_bsz)
    np.testing.assert_array_equal(ask_sz, want_asz)
    np.testing.assert_array_equal(bid_px, np.where(want_bsz > 0, big["levels"]["bid_px"] // 250_000_000, 0))
    np.testing.assert_array_equal(ask_px, np.where(want_asz > 0, big["levels"]["ask_px"] // 250_000_000, 0))


def test_kernel_reports_first_off_grid_row(shared_data):
    recs = read_dbn_file(shared_data / "dbn" / "test_data.mbp-10.dbn", "mbp-10").records.copy()
    recs["levels"]["bid_px"][1, 3] += 1  # one nano off the 0.25 grid on record 1
    _, _, _, _, err_row, code = _mbp10_levels(recs.view("<i8").reshape(2, 46), 250_000_000)
    assert (err_row, code) == (1, 2)


def test_symbol_argument_selects_among_instruments_and_unknown_symbol_is_refused(shared_data, tmp_path):
    d = shared_data / "dbn"
    raw = bytearray((d / "test_data.trades.dbn").read_bytes())
    start = 8 + int.from_bytes(raw[4:8], "little")
    recs = np.frombuffer(raw, TRADE_DTYPE, offset=start).copy()
    recs["instrument_id"][1] = 999  # second trade now belongs to an unmapped instrument
    (tmp_path / "t.dbn").write_bytes(bytes(raw[:start]) + recs.tobytes())
    tape = read_dbn_pair(d / "test_data.mbp-10.dbn", tmp_path / "t.dbn", symbol="ESH1")
    assert len(tape.trades) == 1 and tape.trades.size.tolist() == [5]
    with pytest.raises(InputError, match="not in the input"):
        read_dbn_pair(d / "test_data.mbp-10.dbn", tmp_path / "t.dbn", symbol="NQZ4")
