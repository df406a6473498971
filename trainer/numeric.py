"""Small statistics shared by every stage (pure numpy: no torch, no I/O)."""
from __future__ import annotations

import math

import numpy as np


def t_statistic(values: list[float] | np.ndarray) -> float | None:
    """One-sample t-statistic of the mean against 0: mean / (sample std / sqrt(n)); None for n < 2 or zero spread.

    Across folds this asks whether the out-of-sample net PnL is distinguishable from zero, treating folds as
    independent draws (they are not quite: adjacent windows share regimes, so read it as optimistic)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return None
    sd = float(v.std(ddof=1))
    if sd == 0.0:
        return None
    return float(v.mean() / (sd / math.sqrt(v.size)))
