"""A slow, obvious reference simulator: plain Python, one env at a time, Python ints and floats.

Written from the rules in `trainer.sim.engine`'s docstring (not from the vectorised code): fills are
booked one price chunk at a time through an explicit position/round-trip ledger. Tests compare it with
`Simulator` step by step. Only for tests; it is thousands of times slower.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainer.features.decision import DecisionTape
from trainer.sim.actions import FLAT, HOLD, LONG, SHORT
from trainer.sim.config import SimConfig

M32 = 0xFFFFFFFF


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def offset_hash_py(seed: int, env_id: int, reset_count: int) -> int:
    """The reset-offset hash in plain Python integers (same definition as trainer.sim.state.offset_hash)."""
    h = _fmix32((seed & M32) ^ 0x9E3779B9)
    h = _fmix32(h ^ (env_id & M32))
    return _fmix32(h ^ (((reset_count & M32) * 0x9E3779B1) & M32))


@dataclass
class RefOrder:
    side: int  # +1 buy, -1 sell
    px: int
    size: int
    remaining: int
    queue: int
    age: int
    lifetime: int


@dataclass
class RefEnv:
    env_id: int
    cursor: int
    reset_count: int = 0
    position: int = 0
    cash_ticks: int = 0
    entry_cost_ticks: int = 0
    realised_ticks: int = 0
    maker_qty: int = 0
    taker_qty: int = 0
    trip_maker_qty: int = 0
    trip_taker_qty: int = 0
    time_in_trade: int = 0
    order: RefOrder | None = None
    round_trips: int = 0
    wins: int = 0
    closed_maker_qty: int = 0
    closed_taker_qty: int = 0
    limit_orders: int = 0
    limit_filled: int = 0
    market_orders: int = 0
    expired_orders: int = 0
    rejected_orders: int = 0
    action_counts: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    pending: list[tuple[int, int, int, int] | None] = field(default_factory=list)


@dataclass
class RefStepOut:
    reward: float
    done: bool
    truncated: bool
    trip_closed: int
    trip_pnl: float
    filled_qty: int
    fees: float


class ReferenceSimulator:
    def __init__(self, tape: DecisionTape, cfg: SimConfig):
        self.tape = tape
        self.cfg = cfg
        self.tv = float(tape.tick_value)
        self.R = int(tape.trade_radius_ticks)

    # -------------------------------------------------- tape access (Python ints)

    def bids(self, row: int) -> list[tuple[int, int]]:
        """Displayed bid levels of `row`, best first, as (price, size); absent levels dropped."""
        t = self.tape
        return [(int(p), int(s)) for p, s in zip(t.bid_px[row], t.bid_sz[row]) if s > 0]

    def asks(self, row: int) -> list[tuple[int, int]]:
        t = self.tape
        return [(int(p), int(s)) for p, s in zip(t.ask_px[row], t.ask_sz[row]) if s > 0]

    def mid_x2(self, row: int) -> int:
        return self.bids(row)[0][0] + self.asks(row)[0][0]

    # -------------------------------------------------- reset

    def reset(self, window_start: int, window_stop: int, min_history: int = 0, start_rows=None) -> None:
        self.lo = window_start + min_history + self.cfg.feed_latency_steps  # history before the observed row
        self.last = window_stop - 1
        self.envs = []
        for i in range(self.cfg.n_envs):
            env = RefEnv(env_id=i, cursor=0)
            env.pending = [None] * self.cfg.latency_steps
            env.cursor = int(start_rows[i]) if start_rows is not None else self.draw(env)
            self.envs.append(env)

    def draw(self, env: RefEnv) -> int:
        span = self.last - self.lo  # start rows lo .. last - 1
        return self.lo + offset_hash_py(self.cfg.seed, env.env_id, env.reset_count) % span

    # -------------------------------------------------- ledger

    def book_fill(self, env: RefEnv, side: int, qty: int, px: int, maker: bool, out: dict) -> None:
        """Book one chunk of `qty` contracts at one price `px`, splitting it where the position crosses 0."""
        while qty > 0:
            if env.position != 0 and (env.position > 0) != (side > 0):
                part = min(qty, abs(env.position))  # this part reduces the open trip
            else:
                part = qty  # this part opens or extends a trip
                if env.position == 0:
                    out["new_trip"] = True
            env.cash_ticks -= side * part * px
            env.entry_cost_ticks += side * part * px
            env.position += side * part
            if maker:
                env.maker_qty += part
                env.trip_maker_qty += part
            else:
                env.taker_qty += part
                env.trip_taker_qty += part
            out["filled"] += side * part
            if env.position == 0:  # the trip just closed
                gross = -env.entry_cost_ticks
                net = gross * self.tv - env.trip_maker_qty * self.cfg.maker_fee - env.trip_taker_qty * self.cfg.taker_fee
                env.round_trips += 1
                env.wins += 1 if net > 0 else 0
                env.realised_ticks += gross
                env.closed_maker_qty += env.trip_maker_qty
                env.closed_taker_qty += env.trip_taker_qty
                env.entry_cost_ticks = 0
                env.trip_maker_qty = 0
                env.trip_taker_qty = 0
                out["trip_closed"] += 1
                out["trip_pnl"] += net
            qty -= part

    def market(self, env: RefEnv, row: int, side: int, qty: int, out: dict) -> None:
        """Walk the opposite side of `row`, best level first; beyond the visible depth use the penalty price."""
        levels = self.asks(row) if side > 0 else self.bids(row)
        for px, size in levels:
            if qty == 0:
                break
            take = min(qty, size)
            self.book_fill(env, side, take, px, False, out)
            qty -= take
        if qty > 0:
            worst = levels[-1][0]
            self.book_fill(env, side, qty, worst + side * self.cfg.beyond_depth_ticks, False, out)

    # -------------------------------------------------- step

    def step(self, actions: list[tuple[int, int, int, int]]) -> list[RefStepOut]:
        return [self.step_env(env, tuple(int(x) for x in a)) for env, a in zip(self.envs, actions)]

    def step_env(self, env: RefEnv, action: tuple[int, int, int, int]) -> RefStepOut:
        cfg, t = self.cfg, self.tape
        c = env.cursor
        out = {"filled": 0, "trip_closed": 0, "trip_pnl": 0.0, "new_trip": False}
        env.action_counts[action[0]] += 1
        if cfg.latency_steps > 0:
            env.pending.append(action)
            act = env.pending.pop(0)
        else:
            act = action
        eq_before = 2 * env.cash_ticks + env.position * self.mid_x2(c)
        maker0, taker0 = env.maker_qty, env.taker_qty

        # instruction
        if act is not None and act[0] != HOLD:
            direction, magnitude, order_type, urgency = act
            size = cfg.target_contracts[magnitude]
            target = {SHORT: -size, LONG: size, FLAT: 0}[direction]
            delta = target - env.position
            side = 1 if delta > 0 else -1
            qty = abs(delta)
            kind = cfg.order_types[order_type]
            best = self.bids(c)[0][0] if side > 0 else self.asks(c)[0][0]
            opposite_best = self.asks(c)[0][0] if side > 0 else self.bids(c)[0][0]
            resting_px = {"limit_touch": best, "limit_passive": best - side, "post_only": best + side * cfg.post_only_ticks}
            px = resting_px.get(kind, 0)
            would_cross = px >= opposite_best if side > 0 else px <= opposite_best
            if delta != 0 and kind == "post_only" and would_cross:
                env.order = None  # the instruction still replaces the working order; nothing new rests
                env.rejected_orders += 1
            elif delta != 0 and kind in ("ioc", "fok"):
                env.order = None
                env.market_orders += 1
                limit = opposite_best + side * cfg.marketable_limit_ticks
                levels = self.asks(c) if side > 0 else self.bids(c)
                available = sum(s for p, s in levels if (p <= limit if side > 0 else p >= limit))
                fill = min(qty, available) if kind == "ioc" else (qty if available >= qty else 0)
                if fill == 0:
                    env.rejected_orders += 1
                else:
                    self.market(env, c, side, fill, out)  # fill <= available: the walk stays within the limit
            elif delta != 0 and kind != "market":
                life = cfg.urgency_lifetimes[urgency]
                if env.order is not None and env.order.side == side and env.order.px == px:
                    env.order.remaining = qty  # amend: keeps queue place and age
                    env.order.size = qty
                    env.order.lifetime = life
                else:
                    own = self.bids(c) if side > 0 else self.asks(c)
                    queue = sum(s for p, s in own if p == px)
                    env.order = RefOrder(side, px, qty, qty, queue, 0, life)
                    env.limit_orders += 1
            else:
                env.order = None
                if delta != 0:
                    env.market_orders += 1
                    self.market(env, c, side, qty, out)

        # working limit order over (c, c+1]
        o = env.order
        nxt = c + 1
        at_end = nxt == self.last
        market_side, market_qty = 0, 0
        if o is not None:
            k = o.px - int(t.anchor_px[c]) + self.R
            vols = t.sell_vol if o.side > 0 else t.buy_vol
            vol = int(vols[c, k]) if 0 <= k <= 2 * self.R else 0
            if o.side > 0:
                through = int(t.sell_min_px[c]) < o.px
                crossed = self.asks(nxt)[0][0] <= o.px
            else:
                through = int(t.buy_max_px[c]) > o.px
                crossed = self.bids(nxt)[0][0] >= o.px
            if through or crossed:
                fill = o.remaining
            else:
                fill = min(max(vol - o.queue, 0), o.remaining)
            o.queue = max(o.queue - vol, 0)
            self.book_fill(env, o.side, fill, o.px, True, out)
            o.remaining -= fill
            if o.remaining == 0:
                if fill > 0:
                    env.limit_filled += 1
                env.order = None
            else:
                own = self.bids(nxt) if o.side > 0 else self.asks(nxt)
                at_px = [s for p, s in own if p == o.px]
                if at_px:
                    o.queue = min(o.queue, at_px[0])
                else:
                    full = len(own) == t.levels
                    beyond = full and (o.px < own[-1][0] if o.side > 0 else o.px > own[-1][0])
                    if not beyond:
                        o.queue = 0
                o.age += 1
                if at_end:
                    env.order = None
                elif o.age >= o.lifetime:
                    env.expired_orders += 1
                    env.order = None
                    if cfg.on_expiry == "market":
                        env.market_orders += 1
                        market_side, market_qty = o.side, o.remaining
        if at_end:
            env.order = None
            market_side, market_qty = (-1 if env.position > 0 else 1), abs(env.position)
        if market_qty > 0:
            self.market(env, nxt, market_side, market_qty, out)

        env.cursor = nxt
        if env.position == 0:
            env.time_in_trade = 0
        elif out["new_trip"]:
            env.time_in_trade = 1
        else:
            env.time_in_trade += 1
        fees = (env.maker_qty - maker0) * cfg.maker_fee + (env.taker_qty - taker0) * cfg.taker_fee
        d_equity = (2 * env.cash_ticks + env.position * self.mid_x2(nxt) - eq_before) * (self.tv / 2) - fees
        reward = cfg.reward_scale * d_equity - cfg.inventory_penalty * (abs(env.position) / cfg.max_position)
        if at_end:
            env.reset_count += 1
            env.cursor = self.draw(env)
            env.pending = [None] * cfg.latency_steps
        return RefStepOut(
            reward=reward,
            done=out["trip_closed"] > 0 or at_end,
            truncated=at_end,
            trip_closed=out["trip_closed"],
            trip_pnl=out["trip_pnl"],
            filled_qty=out["filled"],
            fees=fees,
        )

    def equity(self, env: RefEnv) -> float:
        fees = env.maker_qty * self.cfg.maker_fee + env.taker_qty * self.cfg.taker_fee
        return (2 * env.cash_ticks + env.position * self.mid_x2(env.cursor)) * (self.tv / 2) - fees
