"""SimState (all per-env simulator state, on the device) and StepOut (what one step returns)."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

# Per-env int64 state fields of shape (n_envs,), in checkpoint order. Prices are integer ticks; money is kept as
# integer tick-contracts and fill-contract counts so that vectorised and reference runs agree exactly; currency
# is derived (x tick_value, x fee) only where it is reported.
_VECTOR_FIELDS = (
    "cursor",  # decision row each env observes now
    "reset_count",  # times this env was placed (hash counter for its next offset)
    "position",  # signed contracts
    "cash_ticks",  # -sum(side x qty x price) over all fills, tick-contracts
    "entry_cost_ticks",  # signed net cost of the open trip (long: +, short: -); avg entry = this / position
    "realised_ticks",  # gross PnL of closed round trips, tick-contracts
    "maker_qty",  # contracts filled passively (maker fee each)
    "taker_qty",  # contracts filled aggressively (taker fee each)
    "trip_maker_qty",  # maker contracts of the open trip
    "trip_taker_qty",  # taker contracts of the open trip
    "time_in_trade",  # steps the current trip has been open (0 when flat)
    "order_side",  # working limit order: +1 buy, -1 sell, 0 none
    "order_px",  # its price, ticks
    "order_size",  # contracts when placed (or last amended)
    "order_remaining",  # unfilled contracts
    "order_queue",  # displayed contracts ahead of it at its price
    "order_age",  # steps it has worked
    "order_lifetime",  # steps it may work before on_expiry applies
    "round_trips",  # closed round trips (flat again, or flipped)
    "wins",  # closed round trips with net PnL > 0
    "closed_maker_qty",  # maker contracts of closed trips
    "closed_taker_qty",  # taker contracts of closed trips
    "limit_orders",  # limit orders placed (amendments not counted)
    "limit_filled",  # limit orders completely filled
    "market_orders",  # aggressive orders sent: MARKET, IOC, FOK actions and expiry conversions (not window-end)
    "expired_orders",  # limit orders that reached their lifetime unfilled
    "rejected_orders",  # orders that did nothing: POST_ONLY that would cross, IOC / FOK that filled nothing
)


@dataclass
class SimState:
    """All simulator state as device tensors; `step` mutates them in place (stable addresses for CUDA graphs)."""

    cursor: torch.Tensor
    reset_count: torch.Tensor
    position: torch.Tensor
    cash_ticks: torch.Tensor
    entry_cost_ticks: torch.Tensor
    realised_ticks: torch.Tensor
    maker_qty: torch.Tensor
    taker_qty: torch.Tensor
    trip_maker_qty: torch.Tensor
    trip_taker_qty: torch.Tensor
    time_in_trade: torch.Tensor
    order_side: torch.Tensor
    order_px: torch.Tensor
    order_size: torch.Tensor
    order_remaining: torch.Tensor
    order_queue: torch.Tensor
    order_age: torch.Tensor
    order_lifetime: torch.Tensor
    round_trips: torch.Tensor
    wins: torch.Tensor
    closed_maker_qty: torch.Tensor
    closed_taker_qty: torch.Tensor
    limit_orders: torch.Tensor
    limit_filled: torch.Tensor
    market_orders: torch.Tensor
    expired_orders: torch.Tensor
    rejected_orders: torch.Tensor
    action_counts: torch.Tensor  # (n_envs, 4) int64 actions issued per direction
    pending: torch.Tensor  # (n_envs, latency_steps) int64 joint action codes in flight, oldest first; -1 = none
    window_lo: torch.Tensor  # () int64 lowest row a (re-)placed env starts at = window_start + min_history
    window_last: torch.Tensor  # () int64 last row of the window = window_stop - 1; reaching it re-places the env

    @classmethod
    def zeros(cls, n_envs: int, latency_steps: int, device: torch.device) -> "SimState":
        kw = {name: torch.zeros(n_envs, dtype=torch.int64, device=device) for name in _VECTOR_FIELDS}
        kw["action_counts"] = torch.zeros(n_envs, 4, dtype=torch.int64, device=device)
        kw["pending"] = torch.full((n_envs, latency_steps), -1, dtype=torch.int64, device=device)
        kw["window_lo"] = torch.zeros((), dtype=torch.int64, device=device)
        kw["window_last"] = torch.zeros((), dtype=torch.int64, device=device)
        return cls(**kw)

    @property
    def n_envs(self) -> int:
        return int(self.cursor.shape[0])

    def avg_entry_px(self) -> torch.Tensor:
        """(n_envs,) float64 break-even average entry price of the open trip in ticks (NaN when flat)."""
        return self.entry_cost_ticks.double() / self.position.double().where(self.position != 0, torch.nan)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors by field name (for checkpoints; no pickle needed)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Copy `d` into this state's tensors in place (addresses stay valid for a captured graph)."""
        names = [f.name for f in fields(self)]
        missing = sorted(set(names) - set(d))
        extra = sorted(set(d) - set(names))
        if missing or extra:
            raise ValueError(f"SimState.load_state_dict: missing {missing}, unexpected {extra}")
        for name in names:
            dst, src = getattr(self, name), d[name]
            if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
                raise ValueError(
                    f"SimState.load_state_dict: {name} has shape {tuple(src.shape)} {src.dtype}, "
                    f"this simulator needs {tuple(dst.shape)} {dst.dtype}"
                )
            dst.copy_(src)


@dataclass
class StepOut:
    reward: torch.Tensor  # (n_envs,) float32 scaled change of equity net of fees, minus bounded shaping
    done: torch.Tensor  # (n_envs,) bool a round trip closed this step, or the env was re-placed (truncated)
    truncated: torch.Tensor  # (n_envs,) bool the env hit its window end: flattened and re-placed at a new offset
    trip_closed: torch.Tensor  # (n_envs,) int64 round trips closed this step (0, 1, rarely 2)
    trip_pnl: torch.Tensor  # (n_envs,) float32 net PnL (currency) of the trips closed this step, 0 if none
    filled_qty: torch.Tensor  # (n_envs,) int64 signed contracts filled this step (buys +)
    fees: torch.Tensor  # (n_envs,) float32 fees paid this step, currency


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2**32 for x in [0, 2**32), done in 16-bit halves so no int64 product overflows."""
    lo, hi = m & 0xFFFF, m >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & 0xFFFFFFFF


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser (a bijection with full avalanche)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def offset_hash(seed: int, env_id: torch.Tensor, reset_count: torch.Tensor) -> torch.Tensor:
    """Counter-based hash in [0, 2**32) of (seed, env id, reset count): deterministic, stateless, graph-safe.

    Pure integer tensor math (int64 holding 32-bit values), so CPU and CUDA give identical offsets.
    """
    h = _fmix32(torch.full_like(env_id, seed & 0xFFFFFFFF) ^ 0x9E3779B9)
    h = _fmix32(h ^ (env_id & 0xFFFFFFFF))
    return _fmix32(h ^ _mul32(reset_count & 0xFFFFFFFF, 0x9E3779B1))
