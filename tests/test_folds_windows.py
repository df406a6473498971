from __future__ import annotations

import numpy as np
import pytest

from trainer.folds.windows import NS_PER_DAY, Window, day_index_from_ts, fold_windows, walk_forward_windows


def _spans(ws: list[Window]) -> list[tuple[int, int]]:
    return [(w.start, w.stop) for w in ws]


def test_row_windows_split_evenly_and_tile_the_range():
    assert _spans(walk_forward_windows(100, 3)) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert _spans(walk_forward_windows(10, 2)) == [(0, 3), (3, 7), (7, 10)]


@pytest.mark.parametrize("n_rows", [7, 100, 1001, 99_991])
@pytest.mark.parametrize("folds", [1, 2, 5])
@pytest.mark.parametrize("embargo", [0, 3])
def test_windows_are_ordered_disjoint_and_separated_by_exactly_the_embargo(n_rows, folds, embargo):
    if n_rows // (folds + 1) <= embargo:
        with pytest.raises(ValueError, match="min_rows"):
            walk_forward_windows(n_rows, folds, embargo_rows=embargo)
        return
    ws = walk_forward_windows(n_rows, folds, embargo_rows=embargo)
    assert len(ws) == folds + 1 and ws[0].start == 0 and ws[-1].stop == n_rows
    for a, b in zip(ws, ws[1:]):
        assert b.start - a.stop == embargo
    assert max(map(len, ws)) - min(map(len, ws)) <= 1 + embargo
    assert sum(map(len, ws)) == n_rows - folds * embargo


def test_embargo_drops_the_first_rows_after_each_boundary():
    assert _spans(walk_forward_windows(100, 3, embargo_rows=5)) == [(0, 25), (30, 50), (55, 75), (80, 100)]


def test_fold_i_trains_on_window_i_and_evaluates_on_window_i_plus_1():
    ws = walk_forward_windows(90, 2)
    assert fold_windows(ws, 0) == (ws[0], ws[1])
    assert fold_windows(ws, 1) == (ws[1], ws[2])
    with pytest.raises(ValueError, match="2 folds"):
        fold_windows(ws, 2)
    with pytest.raises(ValueError):
        fold_windows(ws, -1)


def test_anchored_fold_trains_from_window_0_start_to_window_i_stop_embargoes_included():
    ws = walk_forward_windows(100, 3, embargo_rows=2)
    assert _spans(ws) == [(0, 25), (27, 50), (52, 75), (77, 100)]
    assert _spans(fold_windows(ws, 2, train_window="anchored")) == [(0, 75), (77, 100)]
    assert _spans(fold_windows(ws, 2, train_window="rolling")) == [(52, 75), (77, 100)]
    assert _spans(fold_windows(ws, 1, train_window="anchored")) == [(0, 50), (52, 75)]


def test_fold_0_is_the_same_under_both_train_windows():
    ws = walk_forward_windows(100, 3, embargo_rows=2)
    assert fold_windows(ws, 0, train_window="anchored") == fold_windows(ws, 0, train_window="rolling") \
        == (Window(0, 25), Window(27, 50))


def test_anchored_fold_on_day_windows_starts_at_the_first_day():
    # 5 days of 2, 3, 1, 2, 2 rows; 3 windows start at days round(j * 5 / 3) = 0, 2, 3 -> rows [0, 5), [5, 6), [6, 10)
    day = np.repeat([0, 1, 2, 3, 4], [2, 3, 1, 2, 2])
    ws = walk_forward_windows(day.size, 2, day_index=day)
    assert _spans(ws) == [(0, 5), (5, 6), (6, 10)]
    assert _spans(fold_windows(ws, 1, train_window="anchored")) == [(0, 6), (6, 10)]


def test_unknown_train_window_is_refused_naming_the_choices():
    ws = walk_forward_windows(90, 2)
    with pytest.raises(ValueError, match=r"train_window must be one of \('rolling', 'anchored'\), got 'expanding'"):
        fold_windows(ws, 1, train_window="expanding")


def test_day_windows_cut_only_at_day_boundaries():
    # 5 days of unequal length: 4, 1, 3, 2, 5 rows.
    day = np.repeat([10, 11, 12, 13, 14], [4, 1, 3, 2, 5])
    ws = walk_forward_windows(day.size, 1, day_index=day)
    # 5 days into 2 windows: days [0, 2) and [2, 5) by round(j * 5 / 2) = 0, 2 (round-half-even).
    assert _spans(ws) == [(0, 5), (5, 15)]
    ws = walk_forward_windows(day.size, 4, day_index=day)
    assert _spans(ws) == [(0, 4), (4, 5), (5, 8), (8, 10), (10, 15)]
    for w in ws:
        assert np.unique(day[w.slice]).size == 1
    ws = walk_forward_windows(day.size, 2, day_index=day, embargo_rows=1)
    # 5 days into 3 windows start at days round(0, 5/3, 10/3) = 0, 2, 3 -> rows 0, 5, 8; each later
    # window loses its first row to the embargo.
    assert _spans(ws) == [(0, 5), (6, 8), (9, 15)]


def test_day_windows_refuse_too_few_days_and_unsorted_days():
    with pytest.raises(ValueError, match="need 3 trading days"):
        walk_forward_windows(6, 2, day_index=np.array([1, 1, 1, 2, 2, 2]))
    with pytest.raises(ValueError, match="non-decreasing"):
        walk_forward_windows(3, 1, day_index=np.array([2, 1, 3]))
    with pytest.raises(ValueError, match="shape"):
        walk_forward_windows(4, 1, day_index=np.array([1, 2]))
    with pytest.raises(ValueError, match="min_rows"):
        walk_forward_windows(4, 1, day_index=np.array([1, 1, 1, 2]), embargo_rows=1)


@pytest.mark.parametrize("kw", [{"folds": 0}, {"folds": -1}, {"folds": 1.5}, {"embargo_rows": -1},
                                {"min_rows": 0}])
def test_bad_arguments_are_refused(kw):
    args = {"n_rows": 100, "folds": 2, **kw}
    with pytest.raises(ValueError, match=next(iter(kw))):
        walk_forward_windows(args.pop("n_rows"), args.pop("folds"), **args)


def test_windows_too_small_for_min_rows_are_refused():
    with pytest.raises(ValueError, match="min_rows=30"):
        walk_forward_windows(100, 3, min_rows=30)
    with pytest.raises(ValueError, match="0 rows"):
        walk_forward_windows(2, 3)


def test_first_usable_row_leaves_room_for_the_look_back():
    w = Window(100, 150)
    assert w.first_usable(0) == 100 and w.first_usable(49) == 149
    assert w.usable(20) == Window(120, 150) and len(w.usable(20)) == 30
    with pytest.raises(ValueError, match="too small"):
        w.first_usable(50)
    with pytest.raises(ValueError):
        Window(5, 5)


def test_day_index_from_timestamps_with_a_session_offset():
    ts = np.array([0, NS_PER_DAY - 1, NS_PER_DAY, 22 * 3600 * 10**9 + NS_PER_DAY], np.int64)
    assert day_index_from_ts(ts).tolist() == [0, 0, 1, 1]
    # Globex-style: the session starting 22:00 UTC belongs to the next date.
    assert day_index_from_ts(ts, day_start_offset_ns=-2 * 3600 * 10**9).tolist() == [0, 1, 1, 2]
