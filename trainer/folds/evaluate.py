"""Out-of-sample evaluation of a policy on the eval window: parallel segment backtests plus one continuous pass.

Segments: `n_envs` greedy backtests start at evenly spaced rows and each replays its own slice, so together they
cover the window once (trade statistics, win rate, PnL, fees, hold fraction, action frequencies). The continuous
pass is one env that replays the whole window from its first usable row (equity curve → Sharpe, drawdown).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from trainer.features.decision import DecisionTape
from trainer.sim import Simulator, SimConfig

# policy(obs (B, W, F), env_state (B, S)) -> actions (B, n_branches) int64
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class EvalResult:
    metrics: dict[str, float]
    equity: np.ndarray  # (steps + 1,) float64 continuous-pass equity in currency, starting at 0
    ts_ns: np.ndarray  # (steps + 1,) int64 decision times of the equity points


def _gather(features: torch.Tensor, rows: torch.Tensor, window: int) -> torch.Tensor:
    offsets = torch.arange(window - 1, -1, -1, device=rows.device)
    return features[rows[:, None] - offsets[None, :]]  # (B, W, F)


@torch.no_grad()
def _replay(policy: Policy, features: torch.Tensor, sim: Simulator, start_rows: torch.Tensor, steps: int,
            window: int, start: int, stop: int, track_equity: bool) -> tuple[dict, np.ndarray]:
    state = sim.reset(start, stop, min_history=window - 1, start_rows=start_rows)
    equity = [sim.equity(state).double()] if track_equity else []
    for _ in range(steps):
        obs = _gather(features, state.cursor, window)
        sim.step(state, policy(obs, sim.env_features(state)))
        if track_equity:
            equity.append(sim.equity(state).double())
    stats = {k: float(v) for k, v in sim.stats(state).items()}  # host sync, once per evaluation
    curve = torch.stack(equity).sum(1).cpu().numpy() if track_equity else np.zeros(0)
    return stats, curve


def equity_metrics(equity: np.ndarray, periods_per_year: float) -> dict[str, float]:
    """Sharpe, Sortino, max drawdown and Calmar of an equity curve in currency (per-step PnL changes).

    Returns are per-step PnL changes (currency); Sharpe = mean/std × sqrt(periods_per_year), Sortino uses the
    downside deviation (root mean square of the negative changes). Max drawdown is the largest peak-to-trough fall
    of the equity (currency, >= 0); Calmar = annualised PnL / max drawdown.
    """
    pnl = np.diff(np.asarray(equity, dtype=np.float64))
    out = {"sharpe": 0.0, "sortino": 0.0, "max_drawdown": 0.0, "calmar": 0.0}
    if pnl.size == 0:
        return out
    ann = math.sqrt(periods_per_year)
    sd = pnl.std()
    out["sharpe"] = float(pnl.mean() / sd * ann) if sd > 0 else 0.0
    downside = math.sqrt(float(np.mean(np.minimum(pnl, 0.0) ** 2)))
    out["sortino"] = float(pnl.mean() / downside * ann) if downside > 0 else 0.0
    peak = np.maximum.accumulate(np.concatenate([[0.0], equity]))
    out["max_drawdown"] = float(np.max(peak - np.concatenate([[0.0], equity])))
    annual_pnl = pnl.mean() * periods_per_year
    out["calmar"] = float(annual_pnl / out["max_drawdown"]) if out["max_drawdown"] > 0 else 0.0
    return out


def evaluate(policy: Policy, features: torch.Tensor, tape: DecisionTape, sim_cfg: SimConfig, window: int,
             start: int, stop: int, n_envs: int) -> EvalResult:
    """Evaluate `policy` on rows [start, stop) of `tape` (features already normalised, on the device)."""
    device = features.device
    first = start + window - 1  # the first row with a full observation window inside the eval window
    span = stop - 1 - first  # steps a single env can take without reaching the window's last row
    if span < 1:
        raise ValueError(f"eval window [{start}, {stop}) is too short for an observation window of {window}")
    n_envs = max(1, min(n_envs, span))
    seg_len = span // n_envs
    seg_cfg = dataclasses.replace(sim_cfg, n_envs=n_envs)
    seg_sim = Simulator(tape, seg_cfg, device)
    starts = first + torch.arange(n_envs, device=device, dtype=torch.int64) * seg_len
    seg_stats, _ = _replay(policy, features, seg_sim, starts, seg_len, window, start, stop, track_equity=False)

    one_sim = Simulator(tape, dataclasses.replace(sim_cfg, n_envs=1), device)
    one_start = torch.tensor([first], device=device, dtype=torch.int64)
    cont_stats, equity = _replay(policy, features, one_sim, one_start, span, window, start, stop, track_equity=True)

    ts = np.asarray(tape.ts_ns[first:first + span + 1], dtype=np.int64)
    days = max((int(ts[-1]) - int(ts[0])) / 86_400e9, 1e-9)
    periods_per_year = span / days * 252.0  # decision steps per trading day (observed) × 252 days
    actions = np.array([seg_stats[f"actions_{d}"] for d in ("short", "hold", "long", "flat")], dtype=np.float64)
    freq = actions / max(actions.sum(), 1.0)
    metrics = {
        "win_rate": seg_stats["win_rate"],
        "net_pnl": seg_stats["net_pnl"],
        "gross_pnl": seg_stats["gross_pnl"],
        "fees": seg_stats["fees"],
        "trades": int(seg_stats["round_trips"]),
        "hold_frac": seg_stats["hold_frac"],
        "limit_fill_rate": seg_stats["limit_fill_rate"],
        "turnover_contracts": seg_stats["maker_qty"] + seg_stats["taker_qty"],
        "action_freq": {d: float(f) for d, f in zip(("short", "hold", "long", "flat"), freq)},
        "eval_envs": n_envs,
        "eval_steps": n_envs * seg_len,
        "continuous_net_pnl": float(equity[-1] - equity[0]),
        "continuous_trades": int(cont_stats["round_trips"]),
        "continuous_win_rate": cont_stats["win_rate"],
        "periods_per_year": periods_per_year,
        **equity_metrics(equity - equity[0], periods_per_year),
    }
    return EvalResult(metrics=metrics, equity=equity - equity[0], ts_ns=ts)
