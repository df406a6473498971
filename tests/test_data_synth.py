"""trainer.data.synth: the embedded synthetic market, its DBN files and its planted signal."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import zlib

import databento_dbn as dbn
import numpy as np
import pytest
import zstandard

from trainer.data import synth
from trainer.data.synth import (
    F_LAST,
    MBP10_DTYPE,
    TRADE_DTYPE,
    DayArrays,
    SynthConfig,
    decision_sample,
    multilevel_ofi,
    ofi_forecast_corr,
    ofi_rule_backtest,
    ofi_signal,
    simulate,
    write_dataset,
    write_synthetic,
)

SMALL = dict(events_per_day=5000)


@pytest.fixture(scope="module")
def small_days() -> list[tuple[dt.date, DayArrays]]:
    return simulate(SynthConfig(seed=11, days=2, **SMALL))


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    cfg = SynthConfig(seed=11, days=2, **SMALL)
    return cfg, write_dataset(cfg, out), simulate(cfg)


def _decode(path) -> list:
    raw = path.read_bytes()
    if path.suffix == ".zst":
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    dec = dbn.DBNDecoder()
    dec.write(raw)
    return dec.decode()


def _enum_str(v) -> str:
    return v if isinstance(v, str) else v.value


# ------------------------------------------------------------------ DBN layout and encoding


def test_record_dtypes_match_databento_layout_field_for_field():
    for ours, theirs, size in ((MBP10_DTYPE, dbn.MBP10Msg._dtypes, 368), (TRADE_DTYPE, dbn.TradeMsg._dtypes, 48)):
        assert ours.itemsize == size
        assert ours.names == tuple(n for n, _ in theirs)
        for name, fmt in theirs:
            assert ours[name] == np.dtype(fmt).newbyteorder("<"), name


def test_fast_encoding_is_byte_identical_to_databento_record_objects(small_days):
    """The numpy encoder against the slow, obvious reference: databento_dbn's own record classes."""
    cfg = SynthConfig(seed=11, days=2, **SMALL)
    _, d = small_days[0]
    book, trades = synth.mbp10_records(cfg, d), synth.trade_records(cfg, d)
    # Every event kind at least once, plus the first and last records.
    rows = sorted({0, len(book) - 1} | {int(np.flatnonzero(d.kind == k)[0]) for k in np.unique(d.kind)})
    for i in rows:
        levels = [dbn.BidAskPair(int(d.bid_px[i, k]) * cfg.tick_scale, int(d.ask_px[i, k]) * cfg.tick_scale,
                                 int(d.bid_sz[i, k]), int(d.ask_sz[i, k]),
                                 (int(d.bid_sz[i, k]) + 2) // 3, (int(d.ask_sz[i, k]) + 2) // 3) for k in range(10)]
        ref = dbn.MBP10Msg(0, cfg.instrument_id, int(d.ts_event[i]), int(d.price[i]) * cfg.tick_scale, int(d.size[i]),
                           dbn.Action(chr(d.action[i])), dbn.Side(chr(d.side[i])), int(d.depth[i]), int(d.ts_recv[i]),
                           flags=int(d.flags[i]), ts_in_delta=int(d.ts_in_delta[i]), sequence=i + 1, levels=levels)
        assert bytes(ref) == book[i].tobytes(), f"MBP-10 record {i}"
    for j in [0, 1, 2, len(trades) - 1]:
        ref = dbn.TradeMsg(0, cfg.instrument_id, int(d.trade_ts_event[j]), int(d.trade_px[j]) * cfg.tick_scale,
                           int(d.trade_size[j]), dbn.Action.TRADE, dbn.Side(chr(d.trade_side[j])),
                           int(d.trade_depth[j]), int(d.trade_ts_recv[j]), flags=int(d.trade_flags[j]),
                           ts_in_delta=int(d.trade_ts_in_delta[j]), sequence=int(d.trade_book_row[j]) + 1)
        assert bytes(ref) == trades[j].tobytes(), f"trade record {j}"


@pytest.mark.parametrize("compress", [False, True])
def test_files_decode_with_dbn_decoder_and_fields_match_the_simulation(tmp_path, compress):
    cfg = SynthConfig(seed=5, days=2, compress=compress, **SMALL)
    summary = write_dataset(cfg, tmp_path)
    sims = simulate(cfg)
    ext = ".dbn.zst" if compress else ".dbn"
    assert [p.name for p, _ in summary.files] == [f"syn-2024010{n}.mbp-10{ext}" for n in (2, 3)]
    for (mpath, tpath), (day, d) in zip(summary.files, sims):
        recs = _decode(mpath)
        meta, book = recs[0], recs[1:]
        assert isinstance(meta, dbn.Metadata)
        assert (meta.version, meta.dataset, meta.schema, meta.symbols) == (3, "SYNTH.SIM", dbn.Schema.MBP_10, ["SYN"])
        open_utc = dt.datetime(day.year, day.month, day.day, 14, 30, tzinfo=dt.timezone.utc)
        assert meta.start == int(open_utc.timestamp()) * 10**9
        assert meta.start <= book[0].ts_event and book[-1].ts_event <= meta.end
        assert len(book) == len(d.ts_event)
        for i in np.linspace(0, len(book) - 1, 25).astype(int):
            r = book[i]
            assert isinstance(r, dbn.MBP10Msg)
            assert (r.ts_event, r.ts_recv, r.ts_in_delta, r.sequence) == (
                d.ts_event[i], d.ts_recv[i], d.ts_in_delta[i], i + 1)
            assert (r.price, r.size, r.depth, r.flags) == (
                d.price[i] * cfg.tick_scale, d.size[i], d.depth[i], d.flags[i])
            assert (_enum_str(r.action), _enum_str(r.side)) == (chr(d.action[i]), chr(d.side[i]))
            assert r.instrument_id == cfg.instrument_id
            for k, lv in enumerate(r.levels):
                assert (lv.bid_px, lv.ask_px) == (d.bid_px[i, k] * cfg.tick_scale, d.ask_px[i, k] * cfg.tick_scale)
                assert (lv.bid_sz, lv.ask_sz) == (d.bid_sz[i, k], d.ask_sz[i, k])
                assert lv.bid_ct >= 1 and lv.ask_ct >= 1
        trecs = _decode(tpath)
        assert trecs[0].schema == dbn.Schema.TRADES
        trades = trecs[1:]
        assert len(trades) == len(d.trade_px)
        for j in np.linspace(0, len(trades) - 1, 25).astype(int):
            t = trades[j]
            assert isinstance(t, dbn.TradeMsg)
            assert (t.ts_event, t.ts_recv, t.price, t.size) == (d.trade_ts_event[j], d.trade_ts_recv[j],
                                                                d.trade_px[j] * cfg.tick_scale, d.trade_size[j])
            assert (_enum_str(t.action), _enum_str(t.side)) == ("T", chr(d.trade_side[j]))


def test_same_arguments_write_byte_identical_files_and_another_seed_does_not(tmp_path):
    def digest(out, seed):
        write_synthetic(out, seed=seed, days=2, signal=1.0, **SMALL)
        return [zlib.crc32(p.read_bytes()) for p in sorted(out.rglob("*.dbn*"))]

    a, b, c = digest(tmp_path / "a", 3), digest(tmp_path / "b", 3), digest(tmp_path / "c", 4)
    assert len(a) == 4 and a == b
    assert all(x != y for x, y in zip(a, c))


def test_rewrite_with_fewer_days_removes_stale_day_files(tmp_path):
    write_synthetic(tmp_path, seed=1, days=3, **SMALL)
    mdir, tdir = write_synthetic(tmp_path, seed=1, days=2, **SMALL)
    assert len(list(mdir.iterdir())) == 2 and len(list(tdir.iterdir())) == 2
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_real_dbn_reader_accepts_the_files_and_sees_the_simulated_book(small_dataset):
    dbn_reader = pytest.importorskip("trainer.data.dbn")
    cfg, summary, sims = small_dataset
    tape = dbn_reader.read_dbn_pair(summary.mbp10_dir, summary.trades_dir, tick_size=cfg.tick_size,
                                    tick_value=cfg.tick_value)
    assert tape.instrument.symbol == "SYN"
    np.testing.assert_array_equal(tape.book.bid_px, np.concatenate([d.bid_px for _, d in sims]))
    np.testing.assert_array_equal(tape.book.ask_sz, np.concatenate([d.ask_sz for _, d in sims]))
    np.testing.assert_array_equal(tape.trades.size, np.concatenate([d.trade_size for _, d in sims]))
    # DBN 'B' aggressor = buyer-initiated = tape BUY (+1)
    np.testing.assert_array_equal(tape.trades.side, np.concatenate([np.where(d.trade_side == ord("B"), 1, -1)
                                                                    for _, d in sims]))


# ------------------------------------------------------------------ the book


def test_book_is_dense_never_crossed_and_has_positive_prices_and_sizes(small_days):
    for _, d in small_days:
        assert (d.bid_sz >= 1).all() and (d.ask_sz >= 1).all()  # all 10 levels always present
        assert (d.bid_px > 0).all()
        assert (d.ask_px[:, 0] > d.bid_px[:, 0]).all()
        np.testing.assert_array_equal(np.diff(d.bid_px, axis=1), -1)  # ES-like: one tick per level
        np.testing.assert_array_equal(np.diff(d.ask_px, axis=1), 1)
        spread = d.ask_px[:, 0] - d.bid_px[:, 0]
        assert spread.max() <= 3
        frac = np.bincount(spread, minlength=4)[1:] / len(spread)
        assert frac[0] > 0.7 and frac[1] > 0.05 and frac[2] > 0.005  # mostly 1 tick, sometimes 2-3
        assert 20 < d.bid_sz.mean() < 200 and d.ask_sz.max() > 100  # tens to hundreds


def test_timestamps_strictly_increase_per_event_and_never_decrease_per_record(small_days):
    prev_end = 0
    for day, d in small_days:
        assert (np.diff(d.ts_event) >= 0).all() and (np.diff(d.ts_recv) >= 0).all()
        ends = d.ts_event[d.flags & F_LAST != 0]
        assert (np.diff(ends) > 0).all()
        # Records of one event share its timestamp; only the last carries F_LAST.
        same = np.diff(d.ts_event) == 0
        assert (d.flags[:-1][same] & F_LAST == 0).all()
        assert (np.diff(d.trade_ts_event) >= 0).all() and (np.diff(d.trade_ts_recv) >= 0).all()
        start = dt.datetime(day.year, day.month, day.day, 14, 30, tzinfo=dt.timezone.utc).timestamp() * 1e9
        assert start <= d.ts_event[0] and d.ts_event[-1] <= start + 6.5 * 3600e9
        assert d.ts_event[0] > prev_end
        prev_end = d.ts_event[-1]
        gaps = np.diff(ends)
        assert 1e9 < gaps.mean() < 10e9  # 6.5 h / 5000 events = 4.7 s mean gap


def test_each_record_describes_the_change_between_consecutive_snapshots(small_days):
    """Slow replay: applying a record's (action, side, price, size) to the previous snapshot gives
    the size at that price in the record's own snapshot (0 = the level emptied)."""
    _, d = small_days[0]
    for i in range(1, len(d.ts_event)):
        bid = d.side[i] == ord("B")
        px0, sz0 = (d.bid_px, d.bid_sz) if bid else (d.ask_px, d.ask_sz)
        before = dict(zip(px0[i - 1].tolist(), sz0[i - 1].tolist()))
        after = dict(zip(px0[i].tolist(), sz0[i].tolist()))
        p, q = int(d.price[i]), int(d.size[i])
        assert q > 0
        if d.action[i] == ord("A"):
            assert after[p] == before.get(p, 0) + q, i
        else:
            assert d.action[i] == ord("C")
            assert after.get(p, 0) == before[p] - q, i
        assert px0[i][d.depth[i]] == p or after.get(p, 0) == 0


def test_every_trade_consumes_the_touch_it_printed_at(small_days):
    _, d = small_days[0]
    row = d.trade_book_row
    for j in range(len(d.trade_px)):
        buy = d.trade_side[j] == ord("B")
        i = row[j]
        # the book record(s) of the same event include a cancel of exactly this size at this price
        ev = np.flatnonzero(d.ts_event == d.trade_ts_event[j])
        hit = [r for r in ev if d.price[r] == d.trade_px[j] and d.size[r] == d.trade_size[j]]
        assert hit, j
        assert d.action[hit[0]] == ord("C") and d.side[hit[0]] == (ord("A") if buy else ord("B"))
        assert d.ts_event[i] == d.trade_ts_event[j]
        if hit[0] == 0:
            continue  # the book before the day's first record is not in the file
        # a buyer pays at least the best ask before its record, a seller at most the best bid
        before = hit[0] - 1
        assert (d.trade_px[j] >= d.ask_px[before, 0]) if buy else (d.trade_px[j] <= d.bid_px[before, 0])


# ------------------------------------------------------------------ the OFI helpers (hand-checked)


def test_multilevel_ofi_on_hand_checked_rows():
    # one level; rows: (bid px, bid sz, ask px, ask sz)
    rows = [(100, 10, 101, 8),  # start
            (100, 15, 101, 8),  # bid queue +5           -> +5
            (100, 15, 101, 3),  # ask queue -5           -> +5
            (101, 4, 102, 9),   # bid improves to 101 (new 4), ask moves up (old 3 gone) -> +4 + 3 = 7
            (100, 20, 102, 9)]  # bid drops (old 4 lost) -> -4
    a = np.array(rows, dtype=np.int64)
    e = multilevel_ofi(a[:, [0]], a[:, [1]], a[:, [2]], a[:, [3]])
    np.testing.assert_array_equal(e, [5, 5, 7, -4])
    # two levels sum
    e2 = multilevel_ofi(np.repeat(a[:, [0]], 2, 1), np.repeat(a[:, [1]], 2, 1),
                        np.repeat(a[:, [2]], 2, 1), np.repeat(a[:, [3]], 2, 1))
    np.testing.assert_array_equal(e2, 2 * e)


def test_ofi_signal_is_a_causal_trailing_sum():
    ofi = np.array([0, 1, 2, 3, 4, 5], dtype=np.int64)
    np.testing.assert_array_equal(ofi_signal(ofi, 2), [0, 1, 3, 5, 7, 9])
    slow = [ofi[max(0, t - 3 + 1): t + 1].sum() for t in range(len(ofi))]
    np.testing.assert_array_equal(ofi_signal(ofi, 3), slow)


def test_ofi_rule_backtest_pays_the_spread_and_fees_on_a_hand_checked_path():
    s = synth.DecisionSample(
        mid2=np.array([201, 201, 203, 205, 205, 203]), bid=np.array([100, 100, 101, 102, 102, 101]),
        ask=np.array([101, 101, 102, 103, 103, 102]), ofi=np.array([0, 10, 0, -10, 0, 0]),
        pressure=np.zeros(6))
    # k=1, h=2: decisions at t=1 (ofi +10 -> long), t=3 (ofi -10 -> short); thr = 1 sd of x = 6.32
    r = ofi_rule_backtest([s], k=1, h=2, threshold_sd=1.0, fee_ticks=0.04)
    assert r.trades == 2
    np.testing.assert_allclose(r.net_ticks, [102 - 101 - 0.08, 102 - 102 - 0.08])
    np.testing.assert_allclose(r.gross_ticks, [(205 - 201) / 2, -(203 - 205) / 2])


# ------------------------------------------------------------------ the planted signal


def _samples(signal: float, seeds) -> list:
    return [decision_sample(d) for s in seeds for _, d in simulate(SynthConfig(seed=s, signal=signal))]


@pytest.fixture(scope="module")
def samples_signal_one():
    return [_samples(1.0, [s]) for s in range(3)]


@pytest.fixture(scope="module")
def samples_signal_zero():
    return _samples(0.0, range(8))


def test_past_ofi_predicts_the_mid_at_signal_one_on_every_seed(samples_signal_one):
    for per_seed in samples_signal_one:
        assert ofi_forecast_corr(per_seed, k=4, h=4) > 0.15


def test_past_ofi_does_not_predict_the_mid_at_signal_zero(samples_signal_zero):
    # 8 seeds x 4 default days pooled (~38k decisions): the standard error is ~0.01
    assert abs(ofi_forecast_corr(samples_signal_zero, k=4, h=4)) < 0.03
    for k, h in ((1, 1), (8, 8)):
        assert abs(ofi_forecast_corr(samples_signal_zero, k=k, h=h)) < 0.03


def _flow_vs_pressure(d: DayArrays, every: int = 50, k: int = 4) -> tuple[float, float]:
    """corr(pressure, 10-level depth imbalance) and corr(pressure, signed trade volume over k decisions)."""
    rows = np.flatnonzero(d.flags & F_LAST)[::every]
    b, a = d.bid_sz[rows].sum(1), d.ask_sz[rows].sum(1)
    depth_imb = (b - a) / (b + a)
    signed = np.where(d.trade_side == ord("B"), d.trade_size, -d.trade_size)
    c = np.concatenate([[0], np.cumsum(signed)])
    at = np.searchsorted(d.trade_book_row, rows, side="right")  # trades up to and including row
    flow = c[at[k:]] - c[at[:-k]]
    p = d.pressure[rows]
    return float(np.corrcoef(depth_imb, p)[0, 1]), float(np.corrcoef(flow, p[k:])[0, 1])


@pytest.mark.parametrize("signal", [0.0, 1.0])
def test_half_tick_price_steps_follow_the_planted_law(signal):
    """Simulator truth: each +-1/2-tick mid step is up with P = (1 + tanh(signal * beta * p)) / 2.
    At signal 0 a fair coin, independent of the pressure that drives the flow."""
    cfg = SynthConfig(seed=4, days=2, signal=signal)
    dirs, pressure = [], []
    for _, d in simulate(cfg):
        dmid = np.diff(d.bid_px[:, 0] + d.ask_px[:, 0])  # (n-1,) in half ticks
        rows = np.flatnonzero(dmid) + 1
        assert set(np.unique(dmid[rows - 1]).tolist()) <= {-1, 1}
        dirs.append(dmid[rows - 1])
        pressure.append(d.pressure[rows])
    up, p = np.concatenate(dirs) > 0, np.concatenate(pressure)
    p_up = 0.5 * (1 + np.tanh(signal * cfg.drift_beta * p))
    n = len(up)
    assert n > 20_000
    for lo, hi in ((0.0, 0.45), (0.45, 0.55), (0.55, 1.0)):  # calibration per bin of the model's P(up)
        m = (p_up >= lo) & (p_up < hi)
        if m.sum() > 500:
            se = np.sqrt(p_up[m].mean() * (1 - p_up[m].mean()) / m.sum())
            assert abs(up[m].mean() - p_up[m].mean()) < 4 * se
    corr = np.corrcoef(up, p)[0, 1]
    if signal == 0:
        assert abs(corr) < 4 / np.sqrt(n)
    else:
        assert corr > 0.1


@pytest.mark.parametrize("signal", [0.0, 1.0])
def test_order_flow_tracks_the_latent_pressure_with_or_without_the_signal(signal):
    """The control differs only in the price response: adds, cancels and market orders are tilted
    by the pressure either way, visible as depth imbalance and signed trade flow."""
    for _, d in simulate(SynthConfig(seed=0, days=2, signal=signal)):
        depth_corr, flow_corr = _flow_vs_pressure(d)
        assert depth_corr > 0.6
        assert flow_corr > 0.2


def test_ofi_rule_nets_a_profit_after_spread_and_fees_only_at_signal_one(samples_signal_one, samples_signal_zero):
    fee_ticks = synth.RECOMMENDED_FEE_USD_PER_SIDE / 12.5
    one = ofi_rule_backtest([s for g in samples_signal_one for s in g], fee_ticks=fee_ticks)
    assert one.net_mean > 0 and one.net_t > 3
    zero = ofi_rule_backtest(samples_signal_zero, fee_ticks=fee_ticks)
    assert abs(zero.gross_t) < 2  # before costs: nothing to earn
    assert zero.net_mean < 0  # after costs: paying the spread for nothing
    assert zero.trades > 1000


# ------------------------------------------------------------------ config and CLI


@pytest.mark.parametrize("field,value", [
    ("days", 0), ("signal", -1.0), ("signal", float("nan")), ("events_per_day", 10), ("tick_size", 0.0),
    ("base_price", 4800.1), ("flow_tilt", 0.6), ("depth_profile", (5,) * 9), ("add_prob", 0.9),
    ("start_date", "2024-13-01"),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SynthConfig(**{field: value})


def test_write_synthetic_rejects_unknown_override(tmp_path):
    with pytest.raises(TypeError):
        write_synthetic(tmp_path, no_such_field=1)


def _cli(argv):
    parser = argparse.ArgumentParser()
    synth.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_run_writes_files_and_prints_one_json_line(tmp_path, capsys):
    rc = synth.run(_cli(["--out", str(tmp_path), "--seed", "2", "--days", "2", "--signal", "0.3",
                         "--events-per-day", "3000"]))
    assert len(list((tmp_path / "mbp10").glob("*.mbp-10.dbn.zst"))) == 2  # zstd by default
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1
    info = json.loads(out[0])
    assert set(info) == {"mbp10_dir", "trades_dir", "days", "book_events", "trades"}
    assert info["days"] == 2
    book = sum(len(_decode(p)) - 1 for p in sorted((tmp_path / "mbp10").iterdir()))
    trades = sum(len(_decode(p)) - 1 for p in sorted((tmp_path / "trades").iterdir()))
    assert (info["book_events"], info["trades"]) == (book, trades)
    assert book >= 6000 and trades > 500


def test_cli_run_bad_config_exits_2_with_one_line_on_stderr(tmp_path, capsys):
    rc = synth.run(_cli(["--out", str(tmp_path), "--days", "0"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "days" in err[0]


def test_trainer_data_main_synth_subcommand(tmp_path, capsys):
    main = pytest.importorskip("trainer.data.__main__")
    rc = main.main(["synth", "--out", str(tmp_path), "--days", "1", "--events-per-day", "2000", "--no-compress"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["days"] == 1
    assert [p.name for p in (tmp_path / "mbp10").iterdir()] == ["syn-20240102.mbp-10.dbn"]
