"""Out-of-sample evaluation of a policy on the eval window: parallel segment backtests plus one continuous pass.

Segments: `n_envs` backtests start at evenly spaced rows and each replays its own slice of `seg_len` steps, so
together they cover the window once; a last step then sends every env a FLAT market order, so positions still
open at a segment's end are closed and counted (trade statistics, win rate, PnL, fees). Action frequencies and the
hold fraction are read before that forced step, so they are the policy's own. The continuous pass is one env that
replays the whole window from its first usable row, recording equity and position per step (equity curve → bar
returns → Sharpe, Sortino, drawdown, Calmar; position path → holding times), and the position decided at every
row against the next mid move (the cost-free mid edge of the leakage guard, docs/walk-forward.md). The simulator
flattens it at the window's last row.

Every policy — the agent's greedy argmax and the baselines in `trainer.folds.baselines` — runs through this same
function, so their numbers compare like for like.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from trainer.agent.act import Policy
from trainer.features.decision import DecisionTape
from trainer.folds.metrics import (TRADING_DAYS_PER_YEAR, bar_returns, bars_per_day, day_pnls, edge_stats, edge_sums,
                                   entropy_nats, equity_metrics, holding_time, mid_edge, trade_pnls)
from trainer.sim import FLAT, HOLD, LONG, MARKET, SHORT, Simulator, SimConfig
from trainer.settings import EvalConfig  # defined with the torch-free sections of the config tree
from trainer.sim.actions import DIRECTION_NAMES


HEADLINE = ("win_rate", "net_pnl", "gross_pnl", "fees", "trades", "sharpe", "max_drawdown", "hold_frac",
            "time_in_market", "mean_holding_seconds", "turnover_contracts", "mid_edge", "mid_edge_tstat", "mid_hit_rate",
            "mid_edge_n", "bar_pnl")
"""The metrics kept for baselines in result.json (a small dict each; `bar_pnl` is on the agent's bar grid, so the
report pairs it with the agent's for the reality check)."""


@dataclass
class EvalResult:
    metrics: dict[str, float]
    equity: np.ndarray  # (steps + 1,) float64 continuous-pass equity in currency, starting at 0
    ts_ns: np.ndarray  # (steps + 1,) int64 decision times of the equity points
    position: np.ndarray  # (steps + 1,) int64 continuous-pass position (contracts) at the equity points
    edge: np.ndarray  # (steps,) float64 continuous-pass mid edge e_t per decision step, currency (see mid_edge)


def _gather(features: torch.Tensor, rows: torch.Tensor, window: int) -> torch.Tensor:
    offsets = torch.arange(window - 1, -1, -1, device=rows.device)
    return features[rows[:, None] - offsets[None, :]]  # (B, W, F)


def _flat_all(n: int, device: torch.device) -> torch.Tensor:
    a = torch.zeros(n, 4, dtype=torch.int64, device=device)  # (n, n_branches): magnitude/urgency ignored by FLAT
    a[:, 0], a[:, 2] = FLAT, MARKET
    return a


@torch.no_grad()
def _segments(policy: Policy, features: torch.Tensor, sim: Simulator, start_rows: torch.Tensor, steps: int,
              window: int, start: int, stop: int) -> tuple[dict, dict]:
    """(stats after the closing FLAT step, stats before it) of the segment backtests."""
    state = sim.reset(start, stop, min_history=window - 1, start_rows=start_rows)
    if hasattr(policy, "start"):  # a stateful policy (trainer.loop.exposure.ExposureController)
        policy.start(start_rows)
    for _ in range(steps):
        obs = _gather(features, sim.obs_rows(state), window)
        sim.step(state, policy(obs, sim.env_features(state)))
    policy_stats = {k: float(v) for k, v in sim.stats(state).items()}  # host sync, once per evaluation
    sim.step(state, _flat_all(sim.cfg.n_envs, features.device))  # close what is still open
    return {k: float(v) for k, v in sim.stats(state).items()}, policy_stats


def decision_position(executed: torch.Tensor | None, position: torch.Tensor, target: torch.Tensor,
                      kinds: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) int64 position each env holds over the interval (t, t+1] as decided at row t, i.e. after the fills at
    the book of row t and before any fill inside the interval.

    executed: (B, n_branches) the action that reaches the exchange at row t (the one chosen latency_steps rows
    earlier; None when the delay line is still empty); position: (B,) contracts at row t before that action;
    target: (3,) contracts per magnitude (SimConfig.target_contracts); kinds: (3,) order kind per order-type choice
    (SimConfig.order_kind_codes; None = the default, choice 0 is MARKET). Simulator rules 2-3: a SHORT / LONG / FLAT
    market instruction fills completely at the book of row t, so the position becomes its target; HOLD and limit
    instructions (and IOC / FOK, whose fill size depends on the book: counted next step, conservatively) leave it
    as it is (a limit fill happens inside the interval, at a price set by what the market
    did, so it enters the next step's q: counting it here would credit adverse selection as direction).
    Everything here is known at row t, which is what makes E[e_t] = 0 on a martingale mid."""
    if executed is None:
        return position.clone()
    direction, magnitude, order_type = executed[:, 0], executed[:, 1], executed[:, 2]
    if kinds is not None:
        order_type = kinds[order_type]  # the kind the branch value means under SimConfig.order_types
    tgt = target[magnitude]
    goal = torch.where(direction == LONG, tgt, torch.where(direction == SHORT, -tgt, torch.zeros_like(tgt)))
    market = (direction != HOLD) & (order_type == MARKET)
    return torch.where(market, goal, position)


@torch.no_grad()
def _continuous(policy: Policy, features: torch.Tensor, sim: Simulator, first: int, steps: int, window: int,
                start: int, stop: int) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """One env over the whole window: (stats, equity (steps+1,), position (steps+1,), decision position (steps,))."""
    dev = features.device
    state = sim.reset(start, stop, min_history=window - 1, start_rows=torch.tensor([first], device=dev))
    if hasattr(policy, "start"):  # a stateful policy records this pass (trainer.loop.exposure.ExposureController)
        policy.start(torch.tensor([first], device=dev), record=True)
    equity = torch.empty(steps + 1, dtype=torch.float64, device=dev)  # (steps + 1,) filled on the device
    position = torch.empty(steps + 1, dtype=torch.int64, device=dev)
    held = torch.empty(steps, dtype=torch.int64, device=dev)  # (steps,) q_t of the mid edge
    target = torch.tensor(sim.cfg.target_contracts, dtype=torch.int64, device=dev)  # (3,)
    kinds = torch.tensor(sim.cfg.order_kind_codes, dtype=torch.int64, device=dev)  # (3,) order-type choice -> kind
    lag = sim.cfg.latency_steps
    sent: list[torch.Tensor] = []  # actions in flight: the continuous pass never re-places its env before the end
    equity[0], position[0] = sim.equity(state)[0], state.position[0]
    for k in range(steps):
        obs = _gather(features, sim.obs_rows(state), window)
        action = policy(obs, sim.env_features(state))
        sent.append(action)
        held[k] = decision_position(sent[k - lag] if k >= lag else None, state.position, target, kinds)[0]
        sim.step(state, action)
        equity[k + 1], position[k + 1] = sim.equity(state)[0], state.position[0]
    stats = {k: float(v) for k, v in sim.stats(state).items()}  # host sync, once per evaluation
    return stats, equity.cpu().numpy(), position.cpu().numpy(), held.cpu().numpy()


def evaluate(policy: Policy, features: torch.Tensor, tape: DecisionTape, sim_cfg: SimConfig, window: int,
             start: int, stop: int, n_envs: int | None = None, cfg: EvalConfig | None = None) -> EvalResult:
    """Evaluate `policy` on rows [start, stop) of `tape` (features already normalised, on the device).

    `n_envs` (if given) overrides cfg.n_envs. Metrics (currency = tape tick_value units):
      win_rate, trades          closed round trips of the segment backtests and the share with net PnL > 0
      segment_forced_closes     of those trips, the ones the closing FLAT step ended (open at a segment's end): a
                                segment shorter than the policy's holding time makes most of its trips these
      net_pnl, gross_pnl, fees  over those trips (fees: every fill, incl. the closing step)
      turnover_contracts        contracts filled (maker + taker) in the segments; turnover_per_step per env step
      hold_frac, action_freq    HOLD share and per-direction shares of the policy's own actions
      eval_dir_entropy          entropy (nats) of action_freq
      limit_fill_rate           limit orders completely filled / placed
      sharpe, sortino, max_drawdown, calmar, annual_pnl   continuous pass, bar returns (trainer.folds.metrics)
      mean_holding_steps/_seconds   continuous pass, closed trips
      bar_pnl, trade_pnl, day_pnl   continuous pass: PnL per non-empty bar, per closed trip, per trading day (lists)
      time_in_market            continuous pass: share of decision intervals spent with a nonzero position
      mid_edge, mid_edge_tstat, mid_hit_rate, mid_edge_n (+ mid_edge_sumsq, mid_edge_wins for exact pooling)
                                continuous pass: cost-free mark-to-mid PnL of the decided positions over the nonzero
                                steps (trainer.folds.metrics.mid_edge): the leakage guard's statistic
    """
    cfg = cfg or EvalConfig()
    if n_envs is not None:
        cfg = dataclasses.replace(cfg, n_envs=n_envs)
    device = features.device
    # The first row whose observed row (cursor - feed latency) has a full observation window inside the eval window.
    first = start + window - 1 + sim_cfg.feed_latency_steps
    span = stop - 1 - first  # steps a single env can take without reaching the window's last row
    if span < 1:
        raise ValueError(f"eval window [{start}, {stop}) is too short for an observation window of {window}")
    n_seg = max(1, min(cfg.n_envs, span))
    seg_len = span // n_seg
    seg_sim = Simulator(tape, dataclasses.replace(sim_cfg, n_envs=n_seg), device)
    starts = first + torch.arange(n_seg, device=device, dtype=torch.int64) * seg_len
    one_sim = Simulator(tape, dataclasses.replace(sim_cfg, n_envs=1), device)
    # A stateful policy (with `start`) runs the continuous pass first: the segments start from what it recorded.
    # Stateless policies keep the original order (the random baseline's draws depend on it).
    stateful = hasattr(policy, "start")
    if stateful:
        cont, equity, position, held = _continuous(policy, features, one_sim, first, span, window, start, stop)
    seg, seg_policy = _segments(policy, features, seg_sim, starts, seg_len, window, start, stop)
    if not stateful:
        cont, equity, position, held = _continuous(policy, features, one_sim, first, span, window, start, stop)
    equity = equity - equity[0]
    rows = slice(first, first + span + 1)
    mid_x2 = np.asarray(tape.bid_px[rows, 0], dtype=np.int64) + np.asarray(tape.ask_px[rows, 0], dtype=np.int64)
    edge = mid_edge(held, mid_x2, float(tape.tick_value))  # (span,) currency per decision step
    edge_summary = edge_stats(edge_sums(edge))

    ts = np.asarray(tape.ts_ns[first:first + span + 1], dtype=np.int64)
    bar_ns = cfg.bar_seconds * 1_000_000_000
    day_offset_ns = int(round(cfg.day_offset_hours * 3600e9))
    bars_year = TRADING_DAYS_PER_YEAR * bars_per_day(np.asarray(tape.ts_ns), bar_ns, day_offset_ns)
    actions = np.array([seg_policy[f"actions_{d}"] for d in DIRECTION_NAMES], dtype=np.float64)
    freq = actions / max(actions.sum(), 1.0)
    turnover = seg["maker_qty"] + seg["taker_qty"]
    metrics = {
        "win_rate": seg["win_rate"],
        "net_pnl": seg["net_pnl"],
        "gross_pnl": seg["gross_pnl"],
        "fees": seg["fees"],
        "trades": int(seg["round_trips"]),
        "segment_forced_closes": int(seg["round_trips"] - seg_policy["round_trips"]),
        "hold_frac": seg_policy["hold_frac"],
        "limit_fill_rate": seg["limit_fill_rate"],
        "limit_orders": int(seg["limit_orders"]),
        "turnover_contracts": turnover,
        "turnover_per_step": turnover / max(n_seg * seg_len, 1),
        "action_freq": {d: float(f) for d, f in zip(DIRECTION_NAMES, freq)},
        "eval_dir_entropy": entropy_nats(actions),
        "eval_envs": n_seg,
        "eval_steps": n_seg * seg_len,
        "continuous_net_pnl": float(equity[-1]),
        "continuous_trades": int(cont["round_trips"]),
        "continuous_win_rate": cont["win_rate"],
        "bar_seconds": cfg.bar_seconds,
        **equity_metrics(equity, ts, bar_ns, bars_year),
        **holding_time(position, ts),
        **edge_summary,
        # the samples behind the report's intervals (trainer.report.stats), continuous pass, currency
        "bar_pnl": [float(v) for v in bar_returns(equity, ts, bar_ns)],
        "trade_pnl": [float(v) for v in trade_pnls(equity, position)],
        "day_pnl": [float(v) for v in day_pnls(equity, ts, day_offset_ns)],
    }
    return EvalResult(metrics=metrics, equity=equity, ts_ns=ts, position=position, edge=edge)
