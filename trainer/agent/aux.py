"""The auxiliary target (AgentConfig.aux_weight): the mid change over the next decision rows, standardised.

The C51 loss reaches the encoder only through n-step returns of the agent's own positions: a noisy, policy-dependent
signal. The auxiliary regression gives the encoder a direct one: from the feature window ending at row t, predict

    y_t = (mid_{min(t + h, stop - 1)} − mid_t) / σ,   σ = standard deviation of the unscaled y over [start, stop)

for the rows [start, stop) the agent trains on (the held-out selection slice and the eval window are neither
targets nor read: a horizon that runs past `stop - 1` stops there). Mid in ticks from the tape's best bid and ask.
Like the reward, the target is the training window's future; the network's input stays causal. numpy, no torch.
"""
from __future__ import annotations

import numpy as np


def mid_change_target(bid_px: np.ndarray, ask_px: np.ndarray, start: int, stop: int, horizon: int) -> np.ndarray:
    """(T,) float32: y_t as above for t in [start, stop), 0 elsewhere. bid_px, ask_px: (T,) best prices in ticks."""
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    n = len(bid_px)
    if not 0 <= start < stop <= n:
        raise ValueError(f"rows [{start}, {stop}) are not inside a tape of {n} rows")
    mid2 = np.asarray(bid_px, dtype=np.int64) + np.asarray(ask_px, dtype=np.int64)  # 2 x mid, exact
    rows = np.arange(start, stop)
    ahead = np.minimum(rows + horizon, stop - 1)
    change = (mid2[ahead] - mid2[rows]) / 2.0  # ticks
    sd = float(change.std())
    out = np.zeros(n, dtype=np.float32)
    out[start:stop] = change / sd if sd > 0 else 0.0
    return out
