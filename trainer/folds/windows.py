"""Walk-forward windows over decision rows (pure: no torch, no I/O).

K folds need K+1 contiguous, non-overlapping windows: fold i is evaluated out of sample on window i+1 and trains
on window i ('rolling'), or on every row from window 0's start to window i's stop ('anchored': an expanding window
over windows 0..i and the embargo rows between them); `fold_windows` gives the pair. Boundaries are cut either by
row count (equal shares) or at trading-day boundaries (whole days, as equal a number of days per window as
possible). An embargo drops the first `embargo_rows` rows after every boundary, so quantities that look ahead from
the end of window i (n-step returns, label horizons) cannot overlap window i+1; an anchored training window ends
where window i does, so the embargo before window i+1 still separates it from the evaluation.

Both the observation window (the model reads the last W rows) and the features (which look back
`FeatureConfig.lookback_decisions` decisions) need history; `Window.usable(lookback)` gives the rows
of a window where that history lies entirely inside the window.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.settings import TRAIN_WINDOWS

NS_PER_DAY = 86_400 * 1_000_000_000


@dataclass(frozen=True)
class Window:
    start: int
    """First row (inclusive)."""
    stop: int
    """One past the last row (exclusive)."""

    def __post_init__(self) -> None:
        if not (0 <= self.start < self.stop):
            raise ValueError(f"Window needs 0 <= start < stop, got start={self.start}, stop={self.stop}")

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def slice(self) -> slice:
        return slice(self.start, self.stop)

    def first_usable(self, lookback_rows: int) -> int:
        """First row whose `lookback_rows` rows of history all lie inside this window."""
        if lookback_rows < 0:
            raise ValueError(f"lookback_rows must be >= 0, got {lookback_rows}")
        first = self.start + lookback_rows
        if first >= self.stop:
            raise ValueError(f"window [{self.start}, {self.stop}) has {len(self)} rows: too small for a "
                             f"look-back of {lookback_rows} rows")
        return first

    def usable(self, lookback_rows: int) -> "Window":
        """The rows [start + lookback_rows, stop): where a decision sees a full in-window history."""
        return Window(self.first_usable(lookback_rows), self.stop)


def walk_forward_windows(n_rows: int, folds: int, *, embargo_rows: int = 0, day_index: np.ndarray | None = None,
                         min_rows: int = 1) -> list[Window]:
    """K+1 = folds+1 contiguous, non-overlapping windows covering [0, n_rows) minus the embargoes.

    By rows: boundaries at round(j * n_rows / (K+1)). By day (`day_index`: (n_rows,) non-decreasing
    trading-day number per row): each window gets whole days, the D days split as evenly as possible.
    Every window after the first starts `embargo_rows` after its boundary. Raises ValueError for
    folds < 1, negative embargo, fewer days than windows, or any window shorter than `min_rows`.
    """
    if not isinstance(folds, (int, np.integer)) or folds < 1:
        raise ValueError(f"folds must be an int >= 1, got {folds!r}")
    if embargo_rows < 0:
        raise ValueError(f"embargo_rows must be >= 0, got {embargo_rows}")
    if min_rows < 1:
        raise ValueError(f"min_rows must be >= 1, got {min_rows}")
    n_windows = folds + 1
    if day_index is None:
        bounds = [round(j * n_rows / n_windows) for j in range(n_windows + 1)]
    else:
        day = np.asarray(day_index)
        if day.shape != (n_rows,):
            raise ValueError(f"day_index must have shape ({n_rows},), got {day.shape}")
        if n_rows and np.any(np.diff(day) < 0):
            raise ValueError("day_index must be non-decreasing (rows in time order)")
        day_starts = np.flatnonzero(np.r_[True, day[1:] != day[:-1]]) if n_rows else np.array([], np.int64)
        n_days = day_starts.size
        if n_days < n_windows:
            raise ValueError(f"{folds} folds need {n_windows} trading days, day_index has {n_days}")
        first_day = [round(j * n_days / n_windows) for j in range(n_windows)]
        bounds = [int(day_starts[d]) for d in first_day] + [n_rows]
    windows = []
    for i in range(n_windows):
        start = bounds[i] + (embargo_rows if i > 0 else 0)
        stop = bounds[i + 1]
        if stop - start < min_rows:
            raise ValueError(f"window {i} of {n_windows} has {max(stop - start, 0)} rows (< min_rows={min_rows}); "
                             f"n_rows={n_rows}, folds={folds}, embargo_rows={embargo_rows}")
        windows.append(Window(start, stop))
    return windows


def fold_windows(windows: list[Window], i: int, *, train_window: str = "rolling") -> tuple[Window, Window]:
    """(train, eval) of fold i. Eval is window i+1; train is window i ('rolling') or [windows[0].start,
    windows[i].stop) ('anchored': windows 0..i with the embargo rows between them). Fold 0 is the same either way."""
    if not 0 <= i < len(windows) - 1:
        raise ValueError(f"fold {i} out of range: {len(windows)} windows make {len(windows) - 1} folds")
    if train_window == "rolling":
        train = windows[i]
    elif train_window == "anchored":
        train = Window(windows[0].start, windows[i].stop)
    else:
        raise ValueError(f"train_window must be one of {TRAIN_WINDOWS}, got {train_window!r}")
    return train, windows[i + 1]


def day_index_from_ts(ts_ns: np.ndarray, day_start_offset_ns: int = 0) -> np.ndarray:
    """(n,) int64 trading-day number per row: days begin at UTC midnight + `day_start_offset_ns`.

    E.g. CME Globex days begin 17:00 Chicago (22:00 or 23:00 UTC): offset = -2 h puts the evening
    session with the next trading date.
    """
    return (np.asarray(ts_ns, np.int64) - day_start_offset_ns) // NS_PER_DAY
