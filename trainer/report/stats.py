"""Statistics a quant signs off on: intervals, Sharpe at a horizon the sample carries, the deflated Sharpe ratio,
a reality check of the agent against the best baseline, and the interquartile mean over seeds.

Numpy-level, torch-free. Resampling is `arch.bootstrap` (Sheppard's `arch`, the package behind rliable's
bootstrap): percentile intervals, seeded so a report is reproducible. Every interval is 95 % two-sided.

Sharpe horizon rule (why no annualised 5-minute-bar Sharpe): a Sharpe ratio is shown only at a horizon with
enough independent observations to carry it —
  * per trade (closed round trips of the continuous pass, not annualised) when n >= MIN_TRADES (30);
  * per day, annualised by sqrt(252), when n >= MIN_DAYS (20) trading days: the standard error of an annualised
    Sharpe from n daily values is about sqrt(252 / n), i.e. ±3.5 at 20 days, so fewer days carry nothing.
Below the rule the value is None with a `sharpe_note` that says why; 5-minute bars of a few-hour window
annualised by sqrt(252 × 78) turned ordinary noise into Sharpe 59 or −313.

Deflated Sharpe ratio (Bailey & López de Prado 2014, "The Deflated Sharpe Ratio: Correcting for Selection Bias,
Backtest Overfitting and Non-Normality", J. Portfolio Management 40(5)):
  PSR(SR*) = Φ((SR − SR*) √(T − 1) / √(1 − γ3 SR + (γ4 − 1)/4 SR²))           (γ4: kurtosis, 3 for a normal)
  SR0      = √V · ((1 − γ) Φ⁻¹(1 − 1/N) + γ Φ⁻¹(1 − 1/(N e)))                  (γ: Euler–Mascheroni)
  DSR      = PSR(SR0)
with SR the non-annualised Sharpe of the selected strategy over T observations, N the number of independent
trials (every configuration and seed tried), V the variance of the trials' Sharpe ratios.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from arch.bootstrap import SPA, IIDBootstrap, IndependentSamplesBootstrap, StationaryBootstrap
from scipy import stats as sps

MIN_TRADES = 30
"""Fewest closed round trips for a per-trade Sharpe (and its interval)."""
MIN_DAYS = 20
"""Fewest trading days for a per-day Sharpe annualised by sqrt(252)."""
MIN_BARS = 10
"""Fewest paired bars for the agent-vs-baseline reality check."""
MIN_FOR_INTERVAL = 10
"""Fewest observations for a bootstrap interval of a mean: below it the resamples take too few distinct values
(3 days give 10) and a percentile interval under-covers badly."""
TRADING_DAYS = 252
REPS = 2000
"""Bootstrap resamples: the percentile interval's ends move by well under 1 % of its width between seeds."""
EULER_GAMMA = 0.5772156649015329


def _clean(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name}: every value must be finite")
    return v


def sharpe(x: np.ndarray) -> float | None:
    """mean / sample std (ddof 1) of the observations; None for n < 2 or no spread."""
    x = np.asarray(x, dtype=np.float64)
    if x.size < 2:
        return None
    sd = float(x.std(ddof=1))
    return float(x.mean()) / sd if sd > 0 else None


def bootstrap_interval(x: np.ndarray, func, seed: int = 0, reps: int = REPS) -> list[float] | None:
    """95 % percentile interval of func(x) under the iid bootstrap; None when n < 2 or func is undefined on a
    resample (e.g. a Sharpe of a resample with no spread)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size < 2:
        return None

    def f(a: np.ndarray) -> float:
        v = func(a)
        return np.nan if v is None else float(v)

    with np.errstate(all="ignore"):
        ci = IIDBootstrap(x, seed=seed).conf_int(f, reps=reps, method="percentile")
    lo, hi = float(ci[0, 0]), float(ci[1, 0])
    return [lo, hi] if math.isfinite(lo) and math.isfinite(hi) else None


def probabilistic_sharpe(sr: float, n_obs: int, skew: float, kurt: float, sr_benchmark: float = 0.0) -> float:
    """PSR: probability that the true Sharpe exceeds `sr_benchmark`, given the non-annualised `sr` over `n_obs`
    observations with skewness `skew` and kurtosis `kurt` (3 = normal; not excess). Bailey & López de Prado."""
    if n_obs < 2:
        raise ValueError(f"probabilistic_sharpe needs n_obs >= 2, got {n_obs}")
    var = 1.0 - skew * sr + (kurt - 1.0) / 4.0 * sr * sr
    if not var > 0:
        raise ValueError(f"probabilistic_sharpe: 1 - skew*SR + (kurt-1)/4*SR^2 must be > 0, got {var}")
    return float(sps.norm.cdf((sr - sr_benchmark) * math.sqrt(n_obs - 1) / math.sqrt(var)))


def expected_max_sharpe(n_trials: int, sr_var: float) -> float:
    """SR0: the expected largest of `n_trials` Sharpe ratios whose true value is 0 and whose variance across trials
    is `sr_var` (same horizon as the SR it deflates). One trial: nothing was selected, SR0 = 0."""
    if not (isinstance(n_trials, int) and n_trials >= 1):
        raise ValueError(f"n_trials must be an int >= 1, got {n_trials!r}")
    if not (math.isfinite(sr_var) and sr_var >= 0):
        raise ValueError(f"sr_var must be finite and >= 0, got {sr_var!r}")
    if n_trials == 1:
        return 0.0
    z = sps.norm.ppf
    return math.sqrt(sr_var) * ((1 - EULER_GAMMA) * z(1 - 1 / n_trials) + EULER_GAMMA * z(1 - 1 / (n_trials * math.e)))


def deflated_sharpe(sr: float, n_obs: int, skew: float, kurt: float, n_trials: int, sr_var: float) -> float:
    """DSR = PSR(SR0): probability that the selected strategy's true Sharpe is above what the best of `n_trials`
    skill-less trials would show. All Sharpe values non-annualised, at the horizon of the `n_obs` observations."""
    return probabilistic_sharpe(sr, n_obs, skew, kurt, expected_max_sharpe(n_trials, sr_var))


def pnl_summary(x: Sequence[float] | np.ndarray, horizon: str, n_trials: int = 1, sr_var: float | None = None,
                seed: int = 0) -> dict:
    """Mean and total PnL per observation with a bootstrap interval (n >= MIN_FOR_INTERVAL), and the Sharpe ratio at this horizon when the
    sample carries it (module docstring), with its interval, PSR(0) and the DSR over `n_trials` trials.

    horizon: "trade" (per closed round trip, not annualised) or "day" (per trading day, Sharpe × sqrt(252)).
    sr_var: variance of the Sharpe ratios across the trials, at this horizon; None takes the sampling variance of
    a Sharpe estimate under the null, 1 / (n − 1) (the spread that skill-less trials would show)."""
    if horizon not in ("trade", "day"):
        raise ValueError(f"horizon must be 'trade' or 'day', got {horizon!r}")
    v = _clean(x, f"{horizon} PnL")
    need, scale = (MIN_TRADES, 1.0) if horizon == "trade" else (MIN_DAYS, math.sqrt(TRADING_DAYS))
    out: dict = {"horizon": horizon, "n": int(v.size), "total": float(v.sum()),
                 "mean": float(v.mean()) if v.size else None,
                 "mean_ci": bootstrap_interval(v, np.mean, seed) if v.size >= MIN_FOR_INTERVAL else None,
                 "sharpe": None, "sharpe_ci": None,
                 "annualised": horizon == "day", "psr": None, "dsr": None, "n_trials": n_trials}
    sr = sharpe(v)
    if v.size < need:
        out["sharpe_note"] = f"not shown: {v.size} {horizon}s < {need} (rule: n >= {need})"
        return out
    if sr is None:
        out["sharpe_note"] = f"not shown: no spread over {v.size} {horizon}s"
        return out
    ci = bootstrap_interval(v, sharpe, seed)
    out["sharpe"] = sr * scale
    out["sharpe_ci"] = None if ci is None else [c * scale for c in ci]
    skew, kurt = float(sps.skew(v)), float(sps.kurtosis(v, fisher=False))
    out.update(skew=skew, kurtosis=kurt, sharpe_note=f"per {horizon}" + (", × sqrt(252)" if scale != 1 else ""))
    try:
        out["psr"] = probabilistic_sharpe(sr, v.size, skew, kurt)
        out["dsr"] = deflated_sharpe(sr, v.size, skew, kurt, n_trials, 1.0 / (v.size - 1) if sr_var is None else sr_var)
    except ValueError:  # heavy skew can make the PSR variance term negative: no probability then
        pass
    return out


def edge_vs_baselines(agent: Sequence[float] | np.ndarray, baselines: dict[str, Sequence[float] | np.ndarray],
                      seed: int = 0, reps: int = REPS) -> dict | None:
    """The agent against each baseline on paired PnL series (same bars), and against the best one.

    Per baseline: the mean paired difference (agent − baseline, per bar) with a 95 % stationary-bootstrap interval
    (serial dependence of bar PnL kept), and Hansen's SPA p-value (arch.bootstrap.SPA, losses = −PnL, the baseline
    as the benchmark, the agent as the one model; H0: the agent is not better). The best baseline is the one with
    the largest mean PnL on this sample. `p_value_all` = the largest per-baseline p-value: the agent beats every
    baseline at level α when it is below α (an intersection-union test needs no multiplicity correction).
    Interval and p-value need MIN_BARS bars where the two differ (else None; p 1.0 when they never differ; then
    `p_value_all` is None if any p is). None when there are fewer than MIN_BARS paired bars or no baseline."""
    a = _clean(agent, "agent bar PnL")
    if a.size < MIN_BARS or not baselines:
        return None
    out: dict = {"n_bars": int(a.size), "baselines": {}}
    for name in sorted(baselines):
        b = _clean(baselines[name], f"{name} bar PnL")
        if b.shape != a.shape:
            raise ValueError(f"baseline {name}: {b.size} bars, the agent has {a.size} (series must be paired)")
        d = a - b
        differ = int(np.count_nonzero(d))
        row = {"mean_pnl": float(b.mean()), "edge_mean": float(d.mean()), "edge_total": float(d.sum()),
               "bars_differ": differ, "edge_ci": None, "spa_p_value": 1.0 if differ == 0 else None}
        # a handful of differing bars makes every resample look alike (one lucky bar gave p 0.045 of 20): no test
        if differ >= MIN_BARS:
            ci = StationaryBootstrap(max(1.0, math.sqrt(a.size)), d, seed=seed).conf_int(
                np.mean, reps=reps, method="percentile")
            row["edge_ci"] = [float(ci[0, 0]), float(ci[1, 0])]
            spa = SPA(-b, -a[:, None], reps=reps, bootstrap="stationary", seed=seed)
            spa.compute()
            row["spa_p_value"] = float(spa.pvalues["consistent"])
        out["baselines"][name] = row
    best = max(out["baselines"], key=lambda k: out["baselines"][k]["mean_pnl"])
    out.update(best=best, **{k: out["baselines"][best][k] for k in ("edge_mean", "edge_total", "edge_ci")},
               p_value_best=out["baselines"][best]["spa_p_value"],
               p_value_all=None if any(r["spa_p_value"] is None for r in out["baselines"].values())
               else max(r["spa_p_value"] for r in out["baselines"].values()))
    return out


def iqm(x: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50 % (scipy trim_mean, 25 % cut each side, the same call as
    rliable's aggregate_iqm)."""
    v = _clean(x, "IQM input")
    if v.size == 0:
        raise ValueError("IQM of no values")
    return float(sps.trim_mean(v, 0.25))


def iqm_interval(strata: Sequence[Sequence[float]], seed: int = 0, reps: int = REPS) -> dict:
    """IQM over every run of every stratum (fold), with a 95 % stratified-bootstrap percentile interval: runs
    (seeds) are resampled with replacement within each fold, fold sizes kept — rliable's StratifiedBootstrap, done
    with arch's IndependentSamplesBootstrap (one sample per fold). interval None when no fold has two seeds (no
    spread to resample)."""
    parts = [_clean(s, f"fold {i} seed scores") for i, s in enumerate(strata)]
    parts = [p for p in parts if p.size]
    if not parts:
        raise ValueError("IQM of no values")
    out = {"iqm": iqm(np.concatenate(parts)), "ci": None, "n_runs": int(sum(p.size for p in parts)),
           "n_strata": len(parts)}
    if max(p.size for p in parts) >= 2:
        boot = IndependentSamplesBootstrap(*parts, seed=seed)
        ci = boot.conf_int(lambda *a: sps.trim_mean(np.concatenate(a), 0.25), reps=reps, method="percentile")
        out["ci"] = [float(ci[0, 0]), float(ci[1, 0])]
    return out
