from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from test_features_synthetic_tape import random_tape
from trainer.data.tape import BookSeries, Instrument, MarketTape, TradeSeries
from trainer.errors import InputError
from trainer.features.clock import decision_rows
from trainer.features.compute import (
    FeatureSet, Normaliser, build_feature_set, compute_features, feature_names, reflection_signs)
from trainer.features.config import FeatureConfig

LOBSTER = "lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
SMALL = FeatureConfig(clock_events=3, ofi_levels=3, depth_levels=2, return_horizons_decisions=(1, 4),
                      trade_flow_horizons_decisions=(1, 3), vol_window_decisions=5)


# ---------------------------------------------------------------- slow reference


def reference_features(tape: MarketTape, rows: np.ndarray, cfg: FeatureConfig) -> np.ndarray:
    """Per-decision Python loops straight from the definitions in docs/features.md."""
    b, tr = tape.book, tape.trades
    n_ofi, n_depth = min(cfg.ofi_levels, b.levels), min(cfg.depth_levels, b.levels)

    def level_ofi(i: int, lv: int) -> int:
        pb = b.bid_px[i, lv] if b.bid_sz[i, lv] > 0 else -math.inf
        pb0 = b.bid_px[i - 1, lv] if b.bid_sz[i - 1, lv] > 0 else -math.inf
        pa = b.ask_px[i, lv] if b.ask_sz[i, lv] > 0 else math.inf
        pa0 = b.ask_px[i - 1, lv] if b.ask_sz[i - 1, lv] > 0 else math.inf
        e = 0
        e += b.bid_sz[i, lv] if pb >= pb0 else 0
        e -= b.bid_sz[i - 1, lv] if pb <= pb0 else 0
        e -= b.ask_sz[i, lv] if pa <= pa0 else 0
        e += b.ask_sz[i - 1, lv] if pa >= pa0 else 0
        return int(e)

    def sign(j: int) -> int:
        if tr.side[j] != 0:
            return int(tr.side[j])
        prev = [i for i in range(len(b)) if b.ts_ns[i] < tr.ts_ns[j]]
        if not prev or b.bid_sz[prev[-1], 0] == 0 or b.ask_sz[prev[-1], 0] == 0:
            return 0
        mid = (b.bid_px[prev[-1], 0] + b.ask_px[prev[-1], 0]) / 2
        return int(np.sign(tr.px[j] - mid))

    signs = [sign(j) for j in range(len(tr))]
    mids = [(b.bid_px[r, 0] + b.ask_px[r, 0]) / 2 for r in rows]

    def flow(t: int, h: int) -> tuple[int, int]:
        """(signed, total) volume of trades in (ts of decision t-h, ts of decision t]; from the start if t < h."""
        since = b.ts_ns[rows[t - h]] if t - h >= 0 else -math.inf
        js = [j for j in range(len(tr)) if since < tr.ts_ns[j] <= b.ts_ns[rows[t]]]
        return sum(signs[j] * tr.size[j] for j in js), sum(abs(signs[j]) * tr.size[j] for j in js)

    out = []
    for t, r in enumerate(rows):
        lo = rows[t - 1] + 1 if t > 0 else 1
        ofi = [sum(level_ofi(i, lv) for i in range(lo, r + 1)) for lv in range(n_ofi)]
        row = ofi + [sum(ofi)]
        qb, qa = b.bid_sz[r, 0], b.ask_sz[r, 0]
        bid, ask = b.bid_px[r, 0], b.ask_px[r, 0]
        micro = (bid * qa + ask * qb) / (qa + qb)
        row += [micro - (bid + ask) / 2, ask - bid]
        for lv in range(n_depth):
            tot = b.bid_sz[r, lv] + b.ask_sz[r, lv]
            row.append((b.bid_sz[r, lv] - b.ask_sz[r, lv]) / tot if tot else 0.0)
        for h in cfg.trade_flow_horizons_decisions:
            signed, vol = flow(t, h)
            row.append(signed / vol if vol else 0.0)
        row.append(math.log1p(flow(t, 1)[1]))
        for h in cfg.return_horizons_decisions:
            row.append(mids[t] - mids[max(t - h, 0)])
        w = cfg.vol_window_decisions
        row.append(math.sqrt(sum((mids[s] - mids[s - 1]) ** 2 for s in range(max(t - w + 1, 1), t + 1))))
        sec = (b.ts_ns[r] % 86_400_000_000_000) / 86_400_000_000_000
        row += [math.sin(2 * math.pi * sec), math.cos(2 * math.pi * sec)]
        row.append(math.log1p((b.ts_ns[r] - b.ts_ns[rows[t - 1]]) / 1e6) if t else 0.0)
        out.append(row)
    return np.array(out, dtype=np.float64)


def _book(rows: list[tuple]) -> BookSeries:
    """rows of (ts, [bid px], [bid sz], [ask px], [ask sz])."""
    cols = list(zip(*rows))
    return BookSeries(np.array(cols[0], np.int64), *(np.array(c, np.int64) for c in cols[1:]))


def _tape(book: BookSeries, trades: TradeSeries | None = None) -> MarketTape:
    if trades is None:
        trades = TradeSeries(*(np.array([book.ts_ns[0]], np.int64),) * 1, np.array([1], np.int64),
                             np.array([1], np.int64), np.array([1], np.int8))
    return MarketTape(Instrument("X", 1.0, 1.0), book, trades, ("hand",))


def _col(raw: np.ndarray, names: list[str], name: str) -> list[float]:
    return raw[:, names.index(name)].tolist()


# ---------------------------------------------------------------- hand-checked math


def test_order_flow_imbalance_hand_checked_per_level_with_vanishing_levels():
    # Two levels. Events (row i vs row i-1), level 0 | level 1:
    #  1: bid0 size 10->12 at the same px: +2; asks unchanged     |  nothing changes: 0
    #  2: bid0 px up 100->101, size 3: +3; ask0 unchanged          |  ask1 vanishes (4 shares of supply left): +4
    #  3: ask0 size 5->1 at the same px: +4                        |  bid1 px up 99->100 size 6: +6;
    #                                                              |  ask1 reappears at 104 size 2: -2
    book = _book([
        (0, [100, 99], [10, 6], [102, 103], [5, 4]),
        (1, [100, 99], [12, 6], [102, 103], [5, 4]),
        (2, [101, 99], [3, 6], [102, 0], [5, 0]),
        (3, [101, 100], [3, 6], [102, 104], [1, 2]),
    ])
    cfg = dataclasses.replace(SMALL, ofi_levels=2)
    raw, names = compute_features(_tape(book), np.array([1, 3]), cfg)
    assert _col(raw, names, "ofi_l0") == [2.0, 3.0 + 4.0]  # t=1 sums events 2 and 3
    assert _col(raw, names, "ofi_l1") == [0.0, 4.0 + 4.0]
    assert _col(raw, names, "ofi_sum") == [2.0, 15.0]
    # A decision at row 0 has seen no event; the next one sums events 1..3.
    raw, names = compute_features(_tape(book), np.array([0, 3]), cfg)
    assert _col(raw, names, "ofi_l0") == [0.0, 9.0] and _col(raw, names, "ofi_l1") == [0.0, 8.0]


def test_book_shape_features_hand_checked():
    book = _book([(0, [100, 99], [30, 0], [102, 103], [10, 5])])
    raw, names = compute_features(_tape(book), np.array([0]), SMALL)
    # microprice = (100*10 + 102*30)/40 = 101.5; mid 101 -> +0.5.
    assert _col(raw, names, "microprice_minus_mid_ticks") == [0.5]
    assert _col(raw, names, "spread_ticks") == [2.0]
    assert _col(raw, names, "depth_imbalance_l0") == [0.5]
    assert _col(raw, names, "depth_imbalance_l1") == [-1.0]  # absent bid level: all depth on the ask


def test_trade_flow_returns_and_volatility_hand_checked():
    book = _book([(10 * i, [100 + d], [5], [102 + d], [5]) for i, d in enumerate([0, 1, 1, -1, 2])])
    trades = TradeSeries(
        ts_ns=np.array([5, 10, 15, 25, 30, 40], np.int64), px=np.array([102, 99, 103, 100, 101, 200], np.int64),
        size=np.array([4, 1, 2, 8, 3, 5], np.int64), side=np.array([1, -1, 0, 0, 0, 1], np.int8))
    cfg = dataclasses.replace(SMALL, return_horizons_decisions=(1, 2), trade_flow_horizons_decisions=(1, 2),
                              vol_window_decisions=2)
    raw, names = compute_features(_tape(book, trades), np.arange(5), cfg)
    # Intervals (ts[t-1], ts[t]] with ts = 0, 10, 20, 30, 40 and mids 101, 102, 102, 100, 103:
    #   t=0: none; t=1: 5 buy +4, 10 sell -1; t=2: 15@103 unknown vs the row-1 mid 102 -> +2;
    #   t=3: 25@100 vs row-2 mid 102 -> -8, 30@101 vs row 2 (row 3 is at the same instant) -> -3; t=4: +5.
    assert _col(raw, names, "trade_flow_imbalance_1") == pytest.approx([0.0, 3 / 5, 1.0, -1.0, 1.0])
    assert _col(raw, names, "trade_flow_imbalance_2") == pytest.approx([0.0, 3 / 5, 5 / 7, -9 / 13, -6 / 16])
    assert raw[:, names.index("trade_volume_log1p")] == pytest.approx(np.log1p([0, 5, 2, 11, 5]))
    # mids 101, 102, 102, 100, 103
    assert _col(raw, names, "mid_return_1_ticks") == [0, 1, 0, -2, 3]
    assert _col(raw, names, "mid_return_2_ticks") == [0, 1, 1, -2, 1]
    assert raw[:, names.index("realised_vol_2_ticks")] == pytest.approx(np.sqrt([0, 1, 1, 4, 13]))
    assert _col(raw, names, "since_last_decision_log1p_ms") == pytest.approx([0] + [np.log1p(1e-5)] * 4)


def test_time_of_day_is_utc_phase_on_the_unit_circle():
    six_am = 6 * 3600 * 10**9 + 40 * 86_400 * 10**9
    book = _book([(six_am, [100], [1], [101], [1])])
    raw, names = compute_features(_tape(book), np.array([0]), SMALL)
    assert _col(raw, names, "time_of_day_sin") == pytest.approx([1.0])
    assert _col(raw, names, "time_of_day_cos") == pytest.approx([0.0], abs=1e-7)


# ---------------------------------------------------------------- vectorised vs reference


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cfg", [SMALL, FeatureConfig(clock="time", clock_time_ns=4_000_000, ofi_levels=9)])
def test_vectorised_features_match_slow_reference_on_random_tapes(seed, cfg):
    tape = random_tape(n_rows=300, n_trades=200, seed=seed)
    rows = decision_rows(tape.book, cfg)
    raw, names = compute_features(tape, rows, cfg)
    assert raw.dtype == np.float32 and raw.shape == (rows.size, len(names)) == (rows.size, len(set(names)))
    assert names == feature_names(cfg, tape.book.levels)
    want = reference_features(tape, rows, cfg)
    for f, name in enumerate(names):
        np.testing.assert_allclose(raw[:, f], want[:, f], rtol=1e-6, atol=1e-5, err_msg=name)


# ---------------------------------------------------------------- causality


def perturb_after(tape: MarketTape, cut_ns: int, seed: int) -> MarketTape:
    """Same tape up to and including cut_ns; every book and trade record after it changed at random."""
    rng = np.random.default_rng(seed)
    b, tr = tape.book, tape.trades
    fb = b.ts_ns > cut_ns
    ft = tr.ts_ns > cut_ns

    def bump(a: np.ndarray, mask: np.ndarray, lo: int, hi: int) -> np.ndarray:
        out = a.copy()
        out[mask] = out[mask] + rng.integers(lo, hi, out[mask].shape)
        return out

    shift = rng.integers(-5, 6, (fb.sum(), 1))
    bid_px, ask_px = b.bid_px.copy(), b.ask_px.copy()
    bid_px[fb] = np.where(b.bid_sz[fb] > 0, b.bid_px[fb] + shift, 0)
    ask_px[fb] = np.where(b.ask_sz[fb] > 0, b.ask_px[fb] + shift, 0)
    book = BookSeries(ts_ns=b.ts_ns, bid_px=bid_px, bid_sz=bump(b.bid_sz, fb[:, None] & (b.bid_sz > 0), 1, 40),
                      ask_px=ask_px, ask_sz=bump(b.ask_sz, fb[:, None] & (b.ask_sz > 0), 1, 40))
    side = tr.side.copy()
    side[ft] = rng.choice(np.array([-1, 0, 1], np.int8), ft.sum())
    trades = TradeSeries(ts_ns=tr.ts_ns, px=bump(tr.px, ft, -9, 10), size=bump(tr.size, ft, 1, 50), side=side)
    return dataclasses.replace(tape, book=book, trades=trades)


def truncate_after(tape: MarketTape, cut_ns: int) -> MarketTape:
    """The tape as it existed at cut_ns: later records do not exist yet."""
    nb = int(np.searchsorted(tape.book.ts_ns, cut_ns, side="right"))
    nt = int(np.searchsorted(tape.trades.ts_ns, cut_ns, side="right"))
    b, tr = tape.book, tape.trades
    return dataclasses.replace(
        tape, book=BookSeries(b.ts_ns[:nb], b.bid_px[:nb], b.bid_sz[:nb], b.ask_px[:nb], b.ask_sz[:nb]),
        trades=TradeSeries(tr.ts_ns[:nt], tr.px[:nt], tr.size[:nt], tr.side[:nt]))


def future_leaks(features, tape: MarketTape, cfg: FeatureConfig, cuts: list[int]) -> list[str]:
    """Names of the feature columns whose rows <= t change when data after decision t's time changes."""
    rows = decision_rows(tape.book, cfg)
    base, names = features(tape, rows, cfg)
    leaky: set[str] = set()
    for k, t in enumerate(cuts):
        cut_ns = int(tape.book.ts_ns[rows[t]])
        for other in (perturb_after(tape, cut_ns, seed=k), truncate_after(tape, cut_ns)):
            # The clock must also be causal: same decisions up to t on the altered tape.
            other_rows = decision_rows(other.book, cfg)
            assert np.array_equal(other_rows[: t + 1], rows[: t + 1])
            got, _ = features(other, other_rows, cfg)
            for f, name in enumerate(names):
                if not np.array_equal(got[: t + 1, f], base[: t + 1, f]):  # bit-identical, not close
                    leaky.add(name)
    return sorted(leaky)


@pytest.mark.parametrize("cfg", [SMALL, FeatureConfig(clock="time", clock_time_ns=2_000_000)])
def test_no_feature_reads_data_after_its_decision(cfg):
    tape = random_tape(n_rows=1500, n_trades=1200, seed=11)
    n = decision_rows(tape.book, cfg).size
    assert future_leaks(compute_features, tape, cfg, [0, 1, n // 3, n // 2, n - 2]) == []


def test_future_leak_check_catches_a_deliberately_leaky_feature():
    def with_leak(tape, rows, cfg):
        raw, names = compute_features(tape, rows, cfg)
        # Next decision's mid: the classic label leak.
        nxt = np.minimum(np.arange(rows.size) + 1, rows.size - 1)
        mid_next = (tape.book.bid_px[rows[nxt], 0] + tape.book.ask_px[rows[nxt], 0]) / 2
        # A subtler one: the first trade *at or after* the decision time (>= instead of >).
        k = np.minimum(np.searchsorted(tape.trades.ts_ns, tape.book.ts_ns[rows] + 1), len(tape.trades) - 1)
        return (np.column_stack([raw, mid_next, tape.trades.size[k]]).astype(np.float32),
                names + ["leak_next_mid", "leak_next_trade_size"])

    tape = random_tape(n_rows=800, n_trades=600, seed=12)
    n = decision_rows(tape.book, SMALL).size
    assert future_leaks(with_leak, tape, SMALL, [5, n // 2]) == ["leak_next_mid", "leak_next_trade_size"]


# ---------------------------------------------------------------- robustness and validation


def test_features_are_finite_with_thin_books_and_duplicate_timestamps():
    tape = random_tape(n_rows=2000, n_trades=1500, seed=13, dup_prob=0.5, hole_prob=0.6, unknown_prob=0.9)
    raw, _ = compute_features(tape, decision_rows(tape.book, SMALL), SMALL)
    assert np.isfinite(raw).all()


def test_decision_at_a_one_sided_book_is_refused_naming_the_row():
    book = _book([(0, [100], [5], [101], [5]), (1, [100], [5], [0], [0])])
    with pytest.raises(InputError, match="record 1.*both best levels"):
        compute_features(_tape(book), np.array([0, 1]), SMALL)
    with pytest.raises(InputError, match="strictly increasing"):
        compute_features(_tape(book), np.array([0, 0]), SMALL)


# ---------------------------------------------------------------- normaliser


def test_normaliser_fit_ignores_the_eval_window():
    raw = np.random.default_rng(0).normal(3.0, 2.0, (1000, 4)).astype(np.float32)
    train = slice(0, 600)
    norm = Normaliser.fit(raw[train])
    changed = raw.copy()
    changed[600:] = 1e6  # wildly different eval data
    again = Normaliser.fit(changed[train])
    assert np.array_equal(norm.mean, again.mean) and np.array_equal(norm.std, again.std)
    z = norm.apply(raw)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z[train].mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(z[train].std(axis=0), 1, atol=1e-5)
    assert np.array_equal(norm.apply(changed)[train], z[train])
    assert np.all(norm.apply(changed)[600:] == 10.0)  # clipped


def test_normaliser_handles_constant_features_and_round_trips_arrays():
    raw = np.column_stack([np.full(50, 7.0), np.arange(50.0)]).astype(np.float32)
    norm = Normaliser.fit(raw)
    z = norm.apply(raw)
    assert np.all(z[:, 0] == 0) and np.isfinite(z).all() and norm.std[0] == 1.0
    back = Normaliser.from_arrays(norm.arrays())
    assert np.array_equal(back.apply(raw), z)
    with pytest.raises(ValueError, match="non-finite"):
        Normaliser.fit(np.array([[np.nan]]))
    with pytest.raises(ValueError, match=r"\(T, 2\)"):
        norm.apply(np.zeros((3, 3), np.float32))


# ---------------------------------------------------------------- real data


def test_feature_set_on_real_lobster_amzn_day(shared_data):
    from trainer.data.spec import load_tape

    tape = load_tape(f"lobster:{shared_data / LOBSTER}")
    fs = build_feature_set(tape, FeatureConfig(clock_events=10))
    assert isinstance(fs, FeatureSet) and fs.instrument.symbol == "AMZN"
    t, f = fs.raw.shape
    assert 15_000 < t < 15_600 and f == len(fs.names) and len(fs.decision) == t
    assert np.isfinite(fs.raw).all() and fs.raw.dtype == np.float32
    col = {n: fs.raw[:, i] for i, n in enumerate(fs.names)}
    assert np.all(col["spread_ticks"] >= 1)  # a real NASDAQ book is never locked or crossed at a decision
    assert np.all(np.abs(col["depth_imbalance_l0"]) <= 1) and np.all(np.abs(col["trade_flow_imbalance_1"]) <= 1)
    # The reader puts LOBSTER's seconds-after-midnight on the UTC epoch: 09:30-16:00 EDT = 13:30-20:00 UTC.
    hours = (fs.decision.ts_ns % 86_400_000_000_000) / 3.6e12
    assert 13.49 < hours.min() < 13.6 and 19.9 < hours.max() < 20.01
    # OFI is a real signal here: it correlates positively with the same-interval mid move (Cont et al.).
    assert np.corrcoef(col["ofi_l0"], col["mid_return_1_ticks"])[0, 1] > 0.2


# ---------------------------------------------------------------- reflection (AgentConfig.mirror)


def reflect(tape: MarketTape, c: int = 40_000) -> MarketTape:
    """The same market upside down: every price p -> c - p, bids and asks swapped, buyers and sellers swapped."""
    b = tape.book

    def mirrored(px, sz):  # an absent level (size 0) keeps price 0
        return np.where(sz > 0, c - px, 0)

    book = BookSeries(ts_ns=b.ts_ns, bid_px=mirrored(b.ask_px, b.ask_sz), bid_sz=b.ask_sz.copy(),
                      ask_px=mirrored(b.bid_px, b.bid_sz), ask_sz=b.bid_sz.copy())
    t = tape.trades
    trades = TradeSeries(ts_ns=t.ts_ns, px=c - t.px, size=t.size, side=(-t.side).astype(np.int8))
    return dataclasses.replace(tape, book=book, trades=trades)


@pytest.mark.parametrize("seed", range(2))
def test_reflection_signs_say_which_features_change_sign_when_the_market_is_turned_upside_down(seed):
    tape = random_tape(n_rows=300, n_trades=200, seed=seed, one_sided_prob=0.0)
    rows = decision_rows(tape.book, SMALL)
    raw, names = compute_features(tape, rows, SMALL)
    upside_down, again = compute_features(reflect(tape), rows, SMALL)
    assert again == names
    signs = reflection_signs(names)
    assert sorted(set(signs)) == [-1.0, 1.0]
    for f, name in enumerate(names):
        np.testing.assert_allclose(upside_down[:, f], signs[f] * raw[:, f], rtol=1e-5, atol=1e-5, err_msg=name)
    assert signs[names.index("ofi_sum")] == -1 and signs[names.index("spread_ticks")] == 1
    with pytest.raises(ValueError, match="'new_feature' has no known behaviour under reflection"):
        reflection_signs([*names, "new_feature"])
