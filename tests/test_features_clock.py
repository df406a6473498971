from __future__ import annotations

import numpy as np
import pytest

from test_features_synthetic_tape import random_tape
from trainer.data.tape import BookSeries
from trainer.features.clock import decision_rows, eligible_rows
from trainer.features.config import FeatureConfig


def _book(ts, bid_sz0=None, ask_sz0=None) -> BookSeries:
    ts = np.asarray(ts, np.int64)
    n = ts.size
    bid_sz = np.full((n, 2), 5, np.int64)
    ask_sz = np.full((n, 2), 5, np.int64)
    if bid_sz0 is not None:
        bid_sz[:, 0] = bid_sz0
    if ask_sz0 is not None:
        ask_sz[:, 0] = ask_sz0
    bid_px = np.where(bid_sz > 0, np.array([[100, 99]]), 0).astype(np.int64)
    ask_px = np.where(ask_sz > 0, np.array([[101, 102]]), 0).astype(np.int64)
    return BookSeries(ts_ns=ts, bid_px=bid_px, bid_sz=bid_sz, ask_px=ask_px, ask_sz=ask_sz)


def _events_reference(book: BookSeries, n_events: int, start_ns: int) -> list[int]:
    """Slow: walk the rows; after every n_events rows since the start, wait for the next eligible row."""
    ts = book.ts_ns
    out: list[int] = []
    first = next((i for i in range(len(book)) if ts[i] >= start_ns), len(book))
    pending_from = first + n_events - 1
    for i in range(first, len(book)):
        eligible = ((i == len(book) - 1 or ts[i + 1] != ts[i]) and book.bid_sz[i, 0] > 0
                    and book.ask_sz[i, 0] > 0)
        if i >= pending_from and eligible:
            out.append(i)
            while pending_from <= i:  # targets passed while waiting are merged into this decision
                pending_from += n_events
    return out


def _time_reference(book: BookSeries, dt_ns: int, start_ns: int) -> list[int]:
    out: list[int] = []
    last_bucket = None
    ts = book.ts_ns
    for i in range(len(book)):
        eligible = ((i == len(book) - 1 or ts[i + 1] != ts[i]) and book.bid_sz[i, 0] > 0
                    and book.ask_sz[i, 0] > 0 and ts[i] >= start_ns)
        if eligible and ts[i] // dt_ns != last_bucket:
            out.append(i)
            last_bucket = ts[i] // dt_ns
    return out


def test_events_clock_ticks_every_n_rows_on_a_plain_book():
    book = _book(np.arange(20) * 10)
    assert decision_rows(book, FeatureConfig(clock_events=4)).tolist() == [3, 7, 11, 15, 19]
    assert decision_rows(book, FeatureConfig(clock_events=1)).tolist() == list(range(20))


def test_events_clock_snaps_to_the_last_row_of_a_duplicate_timestamp():
    # rows 2,3,4 are one instant: deciding at row 3 would see a half-applied update.
    book = _book([0, 10, 20, 20, 20, 30, 40, 50])
    assert decision_rows(book, FeatureConfig(clock_events=4)).tolist() == [4, 7]


def test_clock_skips_one_sided_rows_and_the_preopen():
    book = _book(np.arange(10) * 10, bid_sz0=[5, 5, 5, 0, 0, 5, 5, 5, 5, 5])
    assert decision_rows(book, FeatureConfig(clock_events=2)).tolist() == [1, 5, 7, 9]
    # start_ns=35: counting starts at row 4, first target row 5.
    assert decision_rows(book, FeatureConfig(clock_events=2), start_ns=35).tolist() == [5, 7, 9]
    assert eligible_rows(book, start_ns=35).tolist() == [5, 6, 7, 8, 9]


def test_time_clock_takes_the_first_eligible_row_of_each_bucket():
    book = _book([0, 3, 9, 10, 10, 12, 25, 31, 31], ask_sz0=[5, 5, 5, 5, 5, 0, 5, 5, 5])
    cfg = FeatureConfig(clock="time", clock_time_ns=10)
    # bucket 0: row 0; bucket 1: rows 3-4 are one instant -> 4; bucket 2: 6; bucket 3: 8 (7 shares ts with 8).
    assert decision_rows(book, cfg).tolist() == [0, 4, 6, 8]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_events", [1, 3, 7, 50])
def test_events_clock_matches_slow_reference_on_random_books(seed, n_events):
    book = random_tape(n_rows=600, seed=seed, one_sided_prob=0.1).book
    start = int(book.ts_ns[37])
    got = decision_rows(book, FeatureConfig(clock_events=n_events), start_ns=start)
    assert got.tolist() == _events_reference(book, n_events, start)
    assert got.dtype == np.int64 and np.all(np.diff(got) > 0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dt_ns", [1, 500_000, 5_000_000, 10**9])
def test_time_clock_matches_slow_reference_on_random_books(seed, dt_ns):
    book = random_tape(n_rows=600, seed=seed, one_sided_prob=0.1).book
    start = int(book.ts_ns[11])
    got = decision_rows(book, FeatureConfig(clock="time", clock_time_ns=dt_ns), start_ns=start)
    assert got.tolist() == _time_reference(book, dt_ns, start)


@pytest.mark.parametrize("cfg", [FeatureConfig(clock_events=5), FeatureConfig(clock="time", clock_time_ns=3_000_000)])
def test_clock_decisions_do_not_change_when_the_future_is_cut_off(cfg):
    book = random_tape(n_rows=800, seed=4).book
    full = decision_rows(book, cfg)
    for cut_row in (100, 333, 650):
        cut_ts = book.ts_ns[cut_row]
        keep = int(np.searchsorted(book.ts_ns, cut_ts, side="right"))  # whole instants only
        short = BookSeries(*(a[:keep] for a in (book.ts_ns, book.bid_px, book.bid_sz, book.ask_px, book.ask_sz)))
        assert decision_rows(short, cfg).tolist() == full[full < keep].tolist()


def test_clock_on_a_book_with_no_eligible_row_is_empty():
    book = _book([0, 1, 2], bid_sz0=[0, 0, 0])
    assert decision_rows(book, FeatureConfig(clock_events=1)).size == 0


@pytest.mark.parametrize("kw", [{"clock": "ticks"}, {"clock_events": 0}, {"clock_time_ns": -1},
                                {"return_horizons_decisions": ()}, {"return_horizons_decisions": (1, 1)},
                                {"trade_flow_horizons_decisions": (0,)}, {"vol_window_decisions": 1.5},
                                {"trade_radius_ticks": True}])
def test_feature_config_refuses_bad_values_naming_the_field(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        FeatureConfig(**kw)


def test_feature_config_round_trips_through_dict():
    cfg = FeatureConfig(clock="time", clock_time_ns=5, return_horizons_decisions=(2, 7))
    assert FeatureConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.lookback_decisions == 20
    with pytest.raises(ValueError, match="unknown"):
        FeatureConfig.from_dict({**cfg.to_dict(), "bogus": 1})
