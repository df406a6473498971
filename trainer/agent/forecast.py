"""A per-fold linear forecast as one more input column (AgentConfig.forecast_lags).

docs/RESULTS.md §7 found that a ridge regression of the mid change a few rows ahead on the last rows of every
normalised feature, fitted on the training window, out-earns the agent with a one-line threshold rule: the features
carry more than the learning extracts. This module fits that forecaster on the fold's training rows and appends its
prediction as a column, so the agent reads it beside the raw features:

    x_t  = [f_t, f_{t-1}, ..., f_{t-L+1}, 1]                 (the last L rows of every feature; earlier rows repeat
                                                               the first row of the tape)
    y_t  = mid change over the next h rows, standardised     (trainer/agent/aux.py, the training rows only)
    w    = argmin Σ_{t in fit} (x_t·w − y_t)² + λ|w|²        (fit: the training rows with a full lag window and a
                                                               full horizon inside them)
    forecast_t = x_t·w / sd_{t in fit}(x_t·w)                 for every row of the tape

The weights see the training rows' features and their future mid changes only (like the reward); the held-out
selection slice and the eval window are never read by the fit. The column at row t reads rows <= t: causal.
numpy, no torch.
"""
from __future__ import annotations

import numpy as np

from trainer.agent.aux import mid_change_target

FORECAST_COLUMN = "forecast"
"""Name of the appended column (in the names the baselines read: trainer/folds/baselines.py)."""


def lagged(x: np.ndarray, lags: int) -> np.ndarray:
    """(T, F * lags): rows t, t-1, ..., t-lags+1 side by side (before the first row, the first row repeats)."""
    if lags < 1:
        raise ValueError(f"lags must be >= 1, got {lags}")
    cols = [np.concatenate([np.repeat(x[:1], k, axis=0), x[:len(x) - k]]) for k in range(lags)]
    return np.concatenate(cols, axis=1)


def ridge_forecast(features: np.ndarray, target: np.ndarray, fit: slice, lags: int, ridge: float) -> np.ndarray:
    """(T,) float64: the ridge regression of `target` on the last `lags` rows of every feature (plus an intercept),
    fitted on rows `fit` only, evaluated on every row and scaled to unit standard deviation on the `fit` rows."""
    x = np.c_[lagged(np.asarray(features, dtype=np.float64), lags), np.ones(len(features))]
    a, b = x[fit], np.asarray(target, dtype=np.float64)[fit]
    if len(a) < 2:
        raise ValueError(f"the forecast's fit rows {fit.start}..{fit.stop} hold {len(a)} rows: too few to fit")
    w = np.linalg.solve(a.T @ a + ridge * np.eye(x.shape[1]), a.T @ b)
    pred = x @ w
    sd = float(pred[fit].std())
    return pred / sd if sd > 0 else pred


def append_forecast(features: np.ndarray, bid_px: np.ndarray, ask_px: np.ndarray, start: int, stop: int,
                    lags: int, horizon: int, ridge: float) -> np.ndarray:
    """(T, F + 1) float32: `features` (normalised, (T, F)) with the forecast column appended, fitted on the training
    rows [start, stop) (the rows the agent trains on: the selection slice excluded). bid_px, ask_px: (T,) best
    prices in ticks. Fit rows: [start + lags - 1, stop - horizon), where both the lag window and the target's
    horizon lie inside [start, stop); ValueError naming the rows when fewer than 2 remain."""
    target = mid_change_target(bid_px, ask_px, start, stop, horizon)
    fit = slice(start + lags - 1, stop - horizon)
    if fit.stop - fit.start < 2:
        raise ValueError(f"AgentConfig.forecast_lags={lags}, forecast_horizon={horizon}: the training rows "
                         f"[{start}, {stop}) leave {max(fit.stop - fit.start, 0)} rows to fit the forecast on")
    column = ridge_forecast(features, target, fit, lags, ridge)
    return np.concatenate([np.asarray(features, dtype=np.float32), column[:, None].astype(np.float32)], axis=1)
