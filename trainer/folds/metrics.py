"""Performance metrics of an out-of-sample run (pure numpy: no torch, no I/O).

Return frequency and annualiser (why not per decision step): decisions arrive at irregular times and a tiny
synthetic window has a few hundred of them, so per-step PnL changes annualised by "decisions per day × 252" mix
two clocks and give four-digit Sharpe ratios. Here returns are **PnL changes per wall-clock bar**:

  * the continuous-pass equity (currency, mark-to-market, net of fees) is sampled at the LAST decision of every
    `bar_ns` bar (bars aligned to the UTC epoch, default 5 minutes) that holds at least one decision;
  * r_k = equity at the end of non-empty bar k − equity at the end of non-empty bar k−1 (r_0 starts from the first
    equity point, the state before any trade). Bars without decisions (overnight, halts) are skipped, so an overnight move lands in the first
    bar of the next session, as it would in a bar-sampled P&L;
  * annualiser = sqrt(bars_per_year), bars_per_year = 252 trading days × the median number of non-empty bars per
    trading day over the whole tape (the session length is a property of the market, not of the eval window, and a
    window cut in mid-day would otherwise under-count it).

Sharpe = mean(r) / std(r) × sqrt(bars_per_year) (population std, no risk-free rate: futures P&L is already excess);
Sortino = mean(r) / sqrt(mean(min(r, 0)²)) × sqrt(bars_per_year); max drawdown = largest fall of the equity from its
running peak (the peak starts at 0, the equity before the first trade); Calmar = annualised PnL / max drawdown with
annualised PnL = mean(r) × bars_per_year. All are PnL-based (currency), not percentage returns: the agent trades
a fixed number of contracts and has no capital base.
"""
from __future__ import annotations

import math

import numpy as np

NS_PER_DAY = 86_400 * 1_000_000_000
TRADING_DAYS_PER_YEAR = 252.0


def bar_ends(ts_ns: np.ndarray, bar_ns: int) -> np.ndarray:
    """(n_bars,) int64 indices of the last point of every non-empty bar, in time order.

    ts_ns: (n,) non-decreasing int64 times of the points. Bar of a point = ts_ns // bar_ns.
    """
    ts = np.asarray(ts_ns, dtype=np.int64)
    if bar_ns <= 0:
        raise ValueError(f"bar_ns must be > 0, got {bar_ns}")
    if ts.size == 0:
        return np.zeros(0, dtype=np.int64)
    if np.any(np.diff(ts) < 0):
        raise ValueError("ts_ns must be non-decreasing")
    bar = ts // bar_ns
    return np.flatnonzero(np.r_[bar[1:] != bar[:-1], True])


def bar_returns(equity: np.ndarray, ts_ns: np.ndarray, bar_ns: int) -> np.ndarray:
    """PnL per non-empty bar: equity at each bar's last point minus the previous bar's; the first bar is measured
    from equity[0] (when the first bar holds only that point it has no return, so n_bars - 1 values)."""
    eq = np.asarray(equity, dtype=np.float64)
    if eq.shape != np.shape(ts_ns):
        raise ValueError(f"equity {eq.shape} and ts_ns {np.shape(ts_ns)} must have the same shape")
    if eq.size == 0:
        return np.zeros(0)
    ends = bar_ends(ts_ns, bar_ns)
    refs = ends if ends[0] == 0 else np.r_[0, ends]  # start point, unless it is the first bar's only point
    return np.diff(eq[refs])


def bars_per_day(ts_ns: np.ndarray, bar_ns: int, day_offset_ns: int = 0) -> float:
    """Median number of non-empty bars per trading day (days start at UTC midnight + day_offset_ns)."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    if ts.size == 0:
        raise ValueError("bars_per_day needs at least one timestamp")
    bars = np.unique(ts // bar_ns)
    days = (bars * bar_ns - day_offset_ns) // NS_PER_DAY
    _, counts = np.unique(days, return_counts=True)
    return float(np.median(counts))


def equity_metrics(equity: np.ndarray, ts_ns: np.ndarray, bar_ns: int, bars_per_year: float) -> dict[str, float]:
    """Sharpe, Sortino, max drawdown, Calmar and annualised PnL of an equity curve (currency, starting at 0).

    See the module docstring for the return frequency and the annualiser. Degenerate cases give 0.0 (no bars,
    zero variance, no downside, no drawdown) rather than inf/NaN, so summary.json stays valid JSON."""
    if not (math.isfinite(bars_per_year) and bars_per_year > 0):
        raise ValueError(f"bars_per_year must be finite and > 0, got {bars_per_year}")
    eq = np.asarray(equity, dtype=np.float64)
    r = bar_returns(eq, ts_ns, bar_ns)
    out = {"sharpe": 0.0, "sortino": 0.0, "max_drawdown": 0.0, "calmar": 0.0, "annual_pnl": 0.0,
           "n_bars": int(r.size), "bars_per_year": float(bars_per_year)}
    if r.size == 0:
        return out
    ann = math.sqrt(bars_per_year)
    mean, sd = float(r.mean()), float(r.std())
    out["sharpe"] = mean / sd * ann if sd > 0 else 0.0
    downside = math.sqrt(float(np.mean(np.minimum(r, 0.0) ** 2)))
    out["sortino"] = mean / downside * ann if downside > 0 else 0.0
    out["max_drawdown"] = max_drawdown(eq)
    out["annual_pnl"] = mean * bars_per_year
    out["calmar"] = out["annual_pnl"] / out["max_drawdown"] if out["max_drawdown"] > 0 else 0.0
    return out


def max_drawdown(equity: np.ndarray) -> float:
    """Largest fall (>= 0, currency) of the equity from its running peak; the peak starts at 0."""
    eq = np.r_[0.0, np.asarray(equity, dtype=np.float64)]
    return float(np.max(np.maximum.accumulate(eq) - eq))


def holding_periods(position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(open_idx, close_idx) int64 arrays, one entry per round trip, from a position path.

    position: (n,) signed contracts at points 0..n-1 (point 0 is the start, normally flat). A trip opens at the
    first point where the position leaves 0 and closes at the first later point where it is 0 again or has the
    opposite sign (a flip closes one trip and opens the next at the same point), the simulator's definition. A
    trip still open at the last point is left out (not closed). Vectorised: the trips are the runs of equal
    nonzero sign.
    """
    pos = np.sign(np.asarray(position, dtype=np.int64))
    if pos.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.flatnonzero(pos[1:] != pos[:-1]) + 1  # points where the sign differs from the point before
    opens = change[pos[change] != 0]
    if pos[0] != 0:
        opens = np.r_[0, opens]
    # each open's close is the next sign change after it
    nxt = np.searchsorted(change, opens, side="right")
    closed = nxt < change.size
    return opens[closed].astype(np.int64), change[nxt[closed]].astype(np.int64)


def trade_pnls(equity: np.ndarray, position: np.ndarray) -> np.ndarray:
    """(n_trips,) float64 net PnL (currency) of each closed round trip of a recorded path, in close order.

    equity, position: (n,) at the same points (the continuous pass). Trip k runs from the point before it opens
    (flat there, so the entry fill and fee are inside) to its close; a trip opened by a flip starts at the flip
    point, so the flip step's fills and fees count once, in the trip it closes. Flat stretches between trips add
    nothing (no fills, no mark). The per-trip sample behind the per-trade Sharpe (trainer.report.stats)."""
    eq = np.asarray(equity, dtype=np.float64)
    pos = np.asarray(position, dtype=np.int64)
    if eq.shape != pos.shape:
        raise ValueError(f"equity {eq.shape} and position {pos.shape} must have the same shape")
    opens, closes = holding_periods(pos)
    if opens.size == 0:
        return np.zeros(0)
    flat_before = np.where(opens > 0, pos[np.maximum(opens - 1, 0)] == 0, False)
    starts = np.where(flat_before, opens - 1, opens)
    return eq[closes] - eq[starts]


def day_pnls(equity: np.ndarray, ts_ns: np.ndarray, day_offset_ns: int = 0) -> np.ndarray:
    """PnL per trading day with decisions (days start at UTC midnight + day_offset_ns): the equity at each day's
    last point minus the previous day's (the first from equity[0]); the per-day sample of the report."""
    ts = np.asarray(ts_ns, dtype=np.int64) - int(day_offset_ns)
    return bar_returns(equity, ts, NS_PER_DAY)


def holding_time(position: np.ndarray, ts_ns: np.ndarray) -> dict[str, float]:
    """Mean holding time of the closed round trips of a position path, in decision steps and in seconds, and
    `time_in_market`: the share of the path's intervals (t, t+1] that start with a nonzero position."""
    pos = np.asarray(position)
    in_market = float(np.mean(pos[:-1] != 0)) if pos.size > 1 else 0.0
    opens, closes = holding_periods(pos)
    ts = np.asarray(ts_ns, dtype=np.int64)
    if opens.size == 0:
        return {"mean_holding_steps": 0.0, "mean_holding_seconds": 0.0, "holding_trips": 0,
                "time_in_market": in_market}
    return {"mean_holding_steps": float(np.mean(closes - opens)),
            "mean_holding_seconds": float(np.mean(ts[closes] - ts[opens]) / 1e9),
            "holding_trips": int(opens.size), "time_in_market": in_market}


def entropy_nats(counts: np.ndarray) -> float:
    """Shannon entropy (nats) of the frequencies `counts`; log(k) is uniform over k outcomes, 0 is collapsed."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        return 0.0
    p = c[c > 0] / total
    return float(-(p * np.log(p)).sum())


def mid_edge(decision_position: np.ndarray, mid_x2: np.ndarray, tick_value: float) -> np.ndarray:
    """(n,) float64 cost-free mark-to-mid PnL per decision step (currency): e_t = q_t (mid_{t+1} − mid_t) tick_value.

    decision_position: (n,) signed contracts q_t held over the interval (t, t+1] as decided at row t (known at t:
    see trainer.folds.evaluate). mid_x2: (n + 1,) integer 2 × mid in ticks (best bid + best ask) at rows t..t+n.
    Fees, the spread and limit-fill prices are left out on purpose: this is the direction of the positions against
    the next mid move, which a causal policy cannot predict on a martingale market (E[e_t] = 0)."""
    q = np.asarray(decision_position, dtype=np.int64)
    m2 = np.asarray(mid_x2, dtype=np.int64)
    if q.ndim != 1 or m2.shape != (q.size + 1,):
        raise ValueError(f"mid_edge needs positions (n,) and mids (n + 1,), got {q.shape} and {m2.shape}")
    return (q * np.diff(m2)).astype(np.float64) * (tick_value / 2.0)  # exact integer half-ticks, then currency


def edge_sums(e: np.ndarray) -> dict[str, float | int]:
    """The sufficient statistics of the nonzero per-step edges (what folds store so the report can pool exactly):
    mid_edge_n (count), mid_edge (sum, currency), mid_edge_sumsq (sum of squares), mid_edge_wins (count > 0)."""
    v = np.asarray(e, dtype=np.float64)
    v = v[v != 0.0]  # flat steps and unchanged mids carry no information about direction
    return {"mid_edge_n": int(v.size), "mid_edge": float(v.sum()), "mid_edge_sumsq": float((v * v).sum()),
            "mid_edge_wins": int((v > 0).sum())}


def edge_stats(sums: dict[str, float | int] | list[dict[str, float | int]]) -> dict[str, float | int | None]:
    """t-statistic and hit rate of the nonzero edges from their sums (several folds' sums pool exactly: the result
    equals edge_stats of the concatenated steps).

    mid_edge_tstat = mean / (sample std / sqrt(n)), None for n < 2 or zero spread; mid_hit_rate = share > 0, None
    for n = 0. Under the null (a causal policy on a martingale mid) the e_t are martingale differences, so they are
    uncorrelated even though consecutive positions are not, and the t-statistic is asymptotically N(0, 1)."""
    parts = [sums] if isinstance(sums, dict) else list(sums)
    n = sum(int(p["mid_edge_n"]) for p in parts)
    s = math.fsum(float(p["mid_edge"]) for p in parts)
    ss = math.fsum(float(p["mid_edge_sumsq"]) for p in parts)
    wins = sum(int(p["mid_edge_wins"]) for p in parts)
    out: dict[str, float | int | None] = {"mid_edge_n": n, "mid_edge": s, "mid_edge_sumsq": ss, "mid_edge_wins": wins,
                                          "mid_edge_tstat": None, "mid_hit_rate": wins / n if n else None}
    if n >= 2:
        var = max(ss - s * s / n, 0.0) / (n - 1)  # sample variance from the sums
        if var > 1e-12 * ss / n:  # below this the spread is round-off of equal values: no t
            out["mid_edge_tstat"] = (s / n) / math.sqrt(var / n)
    return out
