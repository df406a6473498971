"""SimConfig: everything that fixes the simulator's rules and tensor shapes."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from trainer.sim.actions import ORDER_KINDS, ORDER_TYPE_NAMES


@dataclass(frozen=True)
class SimConfig:
    n_envs: int = 1024
    """Number of environments stepped in lock-step (the leading dimension of every state tensor)."""
    max_position: int = 3
    """Largest absolute position in contracts; targets are round(magnitude x max_position), at least 1."""
    magnitudes: tuple[float, float, float] = (1 / 3, 2 / 3, 1.0)
    """Fractions of max_position for the three magnitude choices, each in (0, 1]."""
    latency_steps: int = 0
    """Decision-to-exchange latency in decision steps: an action chosen at row t reaches the book of row t + latency_steps."""
    maker_fee: float = 1.40
    """Currency per contract per passive (limit) fill. Default: approximate CME all-in exchange + clearing + NFA fee
    for one E-mini S&P 500 (ES) contract per side for a non-member; ES has no maker rebate, so maker = taker."""
    taker_fee: float = 1.40
    """Currency per contract per aggressive (market) fill; default as for maker_fee (CME ES, approximate)."""
    fees: Literal["venue", "manual"] = "venue"
    """Where maker_fee / taker_fee come from: 'venue' (the trainer sets both from the data's venue fee schedule,
    trainer/data/fees.py: CME ES per contract for DBN and synthetic data, US equity per share with SEC/FINRA fees
    for LOBSTER, or the SPEC's `fee=NAME`) or 'manual' (the two fields as given)."""
    urgency_lifetimes: tuple[int, int, int] = (1, 5, 20)
    """Steps an unfilled limit order works, per urgency choice, before `on_expiry` applies (each >= 1)."""
    on_expiry: str = "cancel"
    """What happens to the unfilled rest of a limit order at the end of its lifetime: 'cancel' or 'market'."""
    beyond_depth_ticks: int = 1
    """A market order larger than the visible opposite depth fills its rest at the worst visible opposite price
    moved this many ticks further against the order (>= 0)."""
    reward_scale: float = 0.01
    """Reward = reward_scale x (change of mark-to-market equity net of fees, in currency) - inventory penalty."""
    inventory_penalty: float = 0.0
    """Bounded shaping: reward units subtracted per step at full position, linear in |position| / max_position (>= 0)."""
    unrealised_scale_ticks: float = 8.0
    """env_features: unrealised PnL is reported as tanh(ticks / (max_position x this))."""
    time_scale_steps: float = 50.0
    """env_features: time in trade is reported as steps / (steps + this), in [0, 1)."""
    seed: int = 0
    """Seed of the counter-based hash that draws reset offsets (hash of seed, env id, reset count)."""

    # --- order kinds and feed latency (issue 22 item 5); the defaults reproduce the original simulator exactly
    order_types: tuple[str, str, str] = ORDER_TYPE_NAMES
    """What the three choices of the order-type branch mean: 3 distinct names from trainer.sim.actions.ORDER_KINDS
    ('market', 'limit_touch', 'limit_passive', 'ioc', 'fok', 'post_only'). The branch keeps 3 choices, so the
    agent's action space is unchanged; e.g. ('ioc', 'limit_touch', 'post_only') swaps in marketable limits."""
    marketable_limit_ticks: int = 0
    """IOC / FOK limit price: the opposite best at execution moved this many ticks against the order (a buy's limit
    is best ask + this); 0 takes only the best level (>= 0)."""
    post_only_ticks: int = 1
    """POST_ONLY limit price: our side's best moved this many ticks towards the opposite side (a buy at best bid +
    this); rejected when that price would cross the opposite best, e.g. on a one-tick spread with the default 1."""
    feed_latency_steps: int = 0
    """Market-data latency in decision steps: at cursor row c the agent observes the market as of row c - this
    (feature window rows <= c - this, `Simulator.obs_rows`); own position and order state are not delayed (>= 0)."""

    def __post_init__(self) -> None:
        def bad(field: str, value: object, rule: str) -> ValueError:
            return ValueError(f"SimConfig.{field} {rule}, got {value!r}")

        if not (isinstance(self.n_envs, int) and self.n_envs >= 1):
            raise bad("n_envs", self.n_envs, "must be an int >= 1")
        if not (isinstance(self.max_position, int) and self.max_position >= 1):
            raise bad("max_position", self.max_position, "must be an int >= 1")
        if len(self.magnitudes) != 3 or not all(0 < float(m) <= 1 for m in self.magnitudes):
            raise bad("magnitudes", self.magnitudes, "must be 3 fractions in (0, 1]")
        if not (isinstance(self.latency_steps, int) and self.latency_steps >= 0):
            raise bad("latency_steps", self.latency_steps, "must be an int >= 0")
        for name in ("maker_fee", "taker_fee", "inventory_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise bad(name, v, "must be finite and >= 0")
        if len(self.urgency_lifetimes) != 3 or not all(isinstance(x, int) and x >= 1 for x in self.urgency_lifetimes):
            raise bad("urgency_lifetimes", self.urgency_lifetimes, "must be 3 ints >= 1")
        if self.fees not in ("venue", "manual"):
            raise bad("fees", self.fees, "must be 'venue' or 'manual'")
        if self.on_expiry not in ("cancel", "market"):
            raise bad("on_expiry", self.on_expiry, "must be 'cancel' or 'market'")
        if not (isinstance(self.beyond_depth_ticks, int) and self.beyond_depth_ticks >= 0):
            raise bad("beyond_depth_ticks", self.beyond_depth_ticks, "must be an int >= 0")
        if not (math.isfinite(self.reward_scale) and self.reward_scale > 0):
            raise bad("reward_scale", self.reward_scale, "must be finite and > 0")
        for name in ("unrealised_scale_ticks", "time_scale_steps"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise bad(name, v, "must be finite and > 0")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            raise bad("seed", self.seed, "must be an int in [0, 2**32)")
        if isinstance(self.order_types, list):  # a config file gives a list; keep the frozen value hashable
            object.__setattr__(self, "order_types", tuple(self.order_types))
        if not (isinstance(self.order_types, tuple) and len(self.order_types) == 3
                and all(name in ORDER_KINDS for name in self.order_types) and len(set(self.order_types)) == 3):
            raise bad("order_types", self.order_types, f"must be 3 distinct names from {ORDER_KINDS}")
        for name in ("marketable_limit_ticks", "post_only_ticks", "feed_latency_steps"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise bad(name, v, "must be an int >= 0")

    @property
    def order_kind_codes(self) -> tuple[int, int, int]:
        """Kind code (index into ORDER_KINDS) of each order-type branch choice."""
        return tuple(ORDER_KINDS.index(name) for name in self.order_types)  # type: ignore[return-value]

    @property
    def target_contracts(self) -> tuple[int, int, int]:
        """Target position size in contracts for each magnitude choice: max(1, round(m x max_position))."""
        return tuple(max(1, int(round(m * self.max_position))) for m in self.magnitudes)  # type: ignore[return-value]
