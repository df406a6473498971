"""Simulator: n_envs order-book backtests stepped in lock-step on one device.

Replay without market impact: our orders never change the recorded book or trades. One step moves
every env from decision row c (its cursor) to c + 1. Rules, in the order they are applied:

1. Latency. The action chosen at row c is executed at row c + latency_steps (a delay line of
   `latency_steps` actions per env; empty slots do nothing). Below, "the action" is the one executed now.
2. Instruction. HOLD (or an empty slot) sends nothing. SHORT/LONG/FLAT set a target position
   (-/+ target_contracts[magnitude], or 0); the order is for delta = target - position, read when the
   instruction reaches the exchange. The order-type branch value picks a kind through
   `cfg.order_types` (default: MARKET, LIMIT_TOUCH, LIMIT_PASSIVE). Any working limit order is
   cancelled, except that a resting limit (LIMIT_TOUCH / LIMIT_PASSIVE / accepted POST_ONLY) at the
   same side and price as the working one amends it (remaining := |delta|, lifetime := new urgency;
   its queue place and age are kept). delta == 0 just cancels.
3. Market order (MARKET), at the book of row c: walks the opposite levels best first,
   filling min(remaining, level size) at each level's price; whatever exceeds the visible depth fills at
   the worst visible opposite price moved `beyond_depth_ticks` further against the order. Taker fee.
   Marketable limits, at the book of row c, limit price X = opposite best moved
   `marketable_limit_ticks` against the order: available = the visible opposite size at prices no worse
   than X (never beyond the visible depth). IOC fills min(|delta|, available) by the same walk and
   cancels the rest; FOK fills |delta| by the walk if available >= |delta|, else nothing. Taker fee. An
   IOC or FOK that fills nothing counts as rejected. Neither leaves a working order.
4. Limit order placement, at the book of row c: LIMIT_TOUCH joins our side's best price, LIMIT_PASSIVE
   one tick behind it, POST_ONLY `post_only_ticks` in front of it (towards the opposite side). A
   POST_ONLY whose price would cross (>= best ask for a buy, <= best bid for a sell) is rejected: nothing
   is placed (the working order is still cancelled by rule 2). Queue ahead = the displayed size at that
   price in row c (0 if not displayed, e.g. a POST_ONLY improving inside the spread).
5. Working limit order against the interval (c, c+1] (trades of row c, book of row c+1), price P:
   a. opposite-aggressor volume at exactly P (sellers for our buy, buyers for our sell) first consumes
      the queue ahead; only the excess fills us, at P;
   b. a trade through P (opposite-aggressor trade strictly beyond P: sell_min_px < P for a buy,
      buy_max_px > P for a sell) or the opposite best of row c+1 crossing P (best ask <= P for a buy,
      best bid >= P for a sell) fills all that remains, at P. Maker fee.
   c. queue ahead is then capped at the displayed size at P in row c+1 (min: a depth increase at P is
      orders joining behind us and never moves us forward; a decrease is applied only as far as the
      trades of 5a have not already taken it, so a trade and the depth drop it causes count once). If P
      is not displayed at c+1:
      when our side shows all its levels and P lies beyond the last one, the level has left the
      visible depth and the queue is left unchanged (we cannot see it); otherwise the level is empty
      and the queue becomes 0.
   d. age += 1; at age == lifetime the rest is cancelled, or (on_expiry='market') sent as a market
      order at the book of row c+1 (rule 3, taker fee).
6. Window end. When c + 1 is the window's last row, the working order is cancelled (it does not
   expire or convert) and the position is flattened by one market order at the book of row c+1
   (rule 3, taker fee); the step reports `truncated`, and the env is re-placed at a new offset
   (statistics kept, delay line emptied).
7. Accounting. Equity = cash + position x mid, in ticks, x tick_value, minus fees. reward =
   reward_scale x (equity after - equity before) - inventory_penalty x |position| / max_position (the
   shaping is bounded by inventory_penalty). A round trip opens when the position leaves 0 and closes
   when it returns to 0 or flips sign (the flip opens the next trip); its net PnL (gross minus the fees
   of its own contracts) decides a win, and `done` is set.

Reset offsets are drawn uniformly (via `offset_hash`) from
[window_start + min_history + feed_latency_steps, window_stop - 2], so every step reads rows inside
[window_start, window_stop - 1]; the W - 1 look-back rows before the observed row are the loop's concern
(min_history >= W - 1 keeps them inside the window).

Feed latency. The agent sees the market `feed_latency_steps` = k rows late: at cursor c it observes row
`obs_rows() = c - k` (the loop gathers the feature window ending there, and env_features marks the
unrealised PnL at that row's mid). Orders still execute against the true book (rules 1-6), so the
order-entry latency `latency_steps` and the feed latency add up to k + latency_steps rows between the
market an action was based on and the book it meets.

Everything in `step` is fixed-shape tensor math: no Python loop over envs, no host sync, no branching on
tensor values, so the same code runs on CPU and CUDA and can be captured in a CUDA graph.
"""
from __future__ import annotations

import numpy as np
import torch

from trainer.errors import InputError
from trainer.features.decision import DecisionTape
from trainer.sim.actions import FLAT, FOK, HOLD, IOC, LIMIT_PASSIVE, LIMIT_TOUCH, LONG, MARKET, POST_ONLY, SHORT
from trainer.sim.config import SimConfig
from trainer.sim.state import SimState, StepOut, offset_hash

ENV_FEATURES = 7
"""Width of `Simulator.env_features`: position, unrealised PnL, order side, order age, queue fraction,
order remaining, time in trade."""
ENV_POSITION = 0
"""Column of `env_features` holding position / max_position: 0 exactly when the env is flat."""
ENV_TIME_IN_TRADE = 6
"""Column of `env_features` holding tt / (tt + time_scale_steps), tt the decisions the current trip has been open (0
when flat): `time_in_trade` recovers tt from it."""
ENV_REFLECTION = (-1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0)
"""`env_features` of the reflected market (prices p -> C - p, bids and asks swapped) under mirrored actions (LONG <->
SHORT) are these signs times the original's: position and order side change sign, the rest do not."""

# Book planes of the packed (T, 4, L) book tensor.
_BID_PX, _BID_SZ, _ASK_PX, _ASK_SZ = 0, 1, 2, 3
# Columns of the packed (T, 3) per-row scalar tensor.
_ANCHOR, _SELL_MIN, _BUY_MAX = 0, 1, 2


def validate_tape(tape: DecisionTape, source: object = "DecisionTape") -> None:
    """Refuse a tape the simulator cannot replay: one-sided or crossed books, bad shapes (InputError)."""
    n, levels = tape.bid_px.shape
    width = 2 * tape.trade_radius_ticks + 1
    if n < 2:
        raise InputError(source, None, f"the simulator needs at least 2 decision rows, got {n}")
    for name in ("bid_px", "bid_sz", "ask_px", "ask_sz"):
        if getattr(tape, name).shape != (n, levels):
            raise InputError(source, None, f"{name} must have shape {(n, levels)}, got {getattr(tape, name).shape}")
    for name in ("sell_vol", "buy_vol"):
        if getattr(tape, name).shape != (n, width):
            raise InputError(source, None, f"{name} must have shape {(n, width)}, got {getattr(tape, name).shape}")
    one_sided = np.flatnonzero((tape.bid_sz[:, 0] <= 0) | (tape.ask_sz[:, 0] <= 0))
    if one_sided.size:
        raise InputError(source, int(one_sided[0]), "decision row has no best bid or no best ask (one-sided book)")
    crossed = np.flatnonzero(tape.bid_px[:, 0] >= tape.ask_px[:, 0])
    if crossed.size:
        raise InputError(source, int(crossed[0]), "decision row has a crossed or locked book (best bid >= best ask)")
    if np.any(tape.anchor_px != tape.bid_px[:, 0]):
        bad = int(np.flatnonzero(tape.anchor_px != tape.bid_px[:, 0])[0])
        raise InputError(source, bad, "anchor_px must equal the best bid")
    if not (np.isfinite(tape.tick_value) and tape.tick_value > 0):
        raise InputError(source, None, f"tick_value must be finite and > 0, got {tape.tick_value!r}")


class _StepAcc:
    """Per-step accumulators shared by the fill events of one step."""

    def __init__(self, n: int, device: torch.device):
        self.trip_closed = torch.zeros(n, dtype=torch.int64, device=device)
        self.trip_pnl = torch.zeros(n, dtype=torch.float64, device=device)
        self.new_trip = torch.zeros(n, dtype=torch.bool, device=device)
        self.filled = torch.zeros(n, dtype=torch.int64, device=device)


class Simulator:
    """Vectorised replay of a DecisionTape for `cfg.n_envs` envs on `device` (see the module docstring)."""

    def __init__(self, tape: DecisionTape, cfg: SimConfig, device: str | torch.device = "cpu"):
        validate_tape(tape)
        self.cfg = cfg
        self.device = torch.device(device)
        self.n_rows = len(tape)
        self.levels = tape.levels
        self.radius = int(tape.trade_radius_ticks)
        self.width = 2 * self.radius + 1
        self.tick_value = float(tape.tick_value)
        dev = self.device
        # The tape crosses to the device once; steps gather rows by cursor.
        book = np.stack([tape.bid_px, tape.bid_sz, tape.ask_px, tape.ask_sz], axis=1).astype(np.int64)
        # Stored 2-D (T, 4L): a dim-0 gather of 2-D rows is several times faster than of (T, 4, L) on CPU.
        self.book_rows = torch.as_tensor(book.reshape(len(tape), -1), device=dev)  # (T, 4L)
        scalars = np.stack([tape.anchor_px, tape.sell_min_px, tape.buy_max_px], axis=1).astype(np.int64)
        self.row_scalars = torch.as_tensor(scalars, device=dev)  # (T, 3)
        # Trade histograms interleaved as [..., (buy, sell)] so one gather picks the opposite aggressor's
        # volume: index ((row * width + bucket) * 2 + (our side is buy)).
        vols = np.stack([tape.buy_vol, tape.sell_vol], axis=2).astype(np.int64)  # (T, 2R+1, 2)
        self.trade_vol = torch.as_tensor(vols.reshape(-1), device=dev)  # (T * (2R+1) * 2,)
        self.target = torch.tensor(cfg.target_contracts, dtype=torch.int64, device=dev)  # (3,)
        self.lifetimes = torch.tensor(cfg.urgency_lifetimes, dtype=torch.int64, device=dev)  # (3,)
        self.order_kinds = torch.tensor(cfg.order_kind_codes, dtype=torch.int64, device=dev)  # (3,) branch -> kind
        self.env_ids = torch.arange(cfg.n_envs, dtype=torch.int64, device=dev)  # (n_envs,)
        self._direction_ids = torch.arange(4, dtype=torch.int64, device=dev).unsqueeze(0)  # (1, 4)

    # ------------------------------------------------------------------ reset

    def reset(
        self,
        window_start: int,
        window_stop: int,
        min_history: int = 0,
        start_rows: torch.Tensor | None = None,
    ) -> SimState:
        """A fresh state with every env placed in rows [window_start + min_history + feed_latency_steps,
        window_stop - 2]: `min_history` counts the look-back rows needed before the *observed* row.

        Offsets come from `offset_hash(seed, env id, 0)` unless `start_rows` (n_envs,) gives them
        (e.g. evaluation walking the window from its start); later re-placements always use the hash.
        """
        n = self.cfg.n_envs
        # The observed row trails the cursor by the feed latency, and its look-back must stay in the window.
        lo = window_start + min_history + self.cfg.feed_latency_steps
        if not (0 <= window_start and window_stop <= self.n_rows and min_history >= 0 and lo <= window_stop - 2):
            raise ValueError(
                f"Simulator.reset: window [{window_start}, {window_stop}) with min_history={min_history} and "
                f"feed_latency_steps={self.cfg.feed_latency_steps} leaves no start row in [{lo}, {window_stop - 2}] "
                f"(tape has {self.n_rows} rows)"
            )
        st = SimState.zeros(n, self.cfg.latency_steps, self.device)
        st.window_lo.fill_(lo)
        st.window_last.fill_(window_stop - 1)
        if start_rows is None:
            st.cursor.copy_(self._draw_offsets(st))
        else:
            rows = torch.as_tensor(start_rows, dtype=torch.int64, device=self.device)
            # Host sync, once per reset (not in step): validate caller-given rows.
            if rows.shape != (n,) or bool(((rows < lo) | (rows > window_stop - 2)).any()):
                raise ValueError(f"Simulator.reset: start_rows must be ({n},) ints in [{lo}, {window_stop - 2}]")
            st.cursor.copy_(rows)
        return st

    def _draw_offsets(self, st: SimState) -> torch.Tensor:
        span = st.window_last - st.window_lo  # () rows in [lo, last - 1]
        return st.window_lo + offset_hash(self.cfg.seed, self.env_ids, st.reset_count) % span

    # ------------------------------------------------------------------ helpers

    def _book(self, rows: torch.Tensor) -> torch.Tensor:
        return self.book_rows.index_select(0, rows).view(-1, 4, self.levels)  # (n, 4, L)

    def _walk_cost(
        self, px: torch.Tensor, sz: torch.Tensor, side: torch.Tensor, qty: torch.Tensor, close_qty: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tick-contract cost of the first `qty` and first `close_qty` contracts of a market walk.

        px, sz: (n, L) opposite side of the book, best first (absent levels have size 0 at the tail).
        """
        cum = sz.cumsum(1)  # (n, L) visible contracts up to and including each level
        before = cum - sz
        # Worst visible price = the farthest present level (highest ask for a buy, lowest bid for a sell);
        # absent levels (size 0) are pushed out of the max with a large negative key.
        key = torch.where(sz > 0, side.unsqueeze(1) * px, torch.iinfo(torch.int64).min)
        worst = side * key.amax(1)
        beyond_px = worst + side * self.cfg.beyond_depth_ticks
        visible = cum[:, -1]

        def cost(k: torch.Tensor) -> torch.Tensor:
            take = torch.minimum((k.unsqueeze(1) - before).clamp(min=0), sz)  # (n, L)
            return (take * px).sum(1) + (k - visible).clamp(min=0) * beyond_px

        return cost(qty), cost(close_qty)

    def _apply_fill(
        self,
        st: SimState,
        acc: _StepAcc,
        side: torch.Tensor,
        qty: torch.Tensor,
        close_qty: torch.Tensor,
        total_cost: torch.Tensor,
        close_cost: torch.Tensor,
        maker: bool,
    ) -> None:
        """Book `qty` contracts bought (side +1) or sold (-1) for `total_cost` tick-contracts; the first
        `close_qty` of them (costing `close_cost`) reduce the open position. qty == 0 is a no-op."""
        cfg = self.cfg
        pos0 = st.position
        closes = (close_qty > 0) & (close_qty == pos0.abs())  # the trip ends inside this fill
        open_qty = qty - close_qty
        close_maker = close_qty if maker else torch.zeros_like(close_qty)
        close_taker = torch.zeros_like(close_qty) if maker else close_qty
        entry_at_close = st.entry_cost_ticks + side * close_cost
        trip_mq = st.trip_maker_qty + close_maker
        trip_tq = st.trip_taker_qty + close_taker
        gross = -entry_at_close  # position is 0 at this point, so minus the net cost is the trip's gross PnL
        net = gross.double() * self.tick_value - trip_mq.double() * cfg.maker_fee - trip_tq.double() * cfg.taker_fee
        st.round_trips += closes
        st.wins += closes & (net > 0)
        st.realised_ticks += torch.where(closes, gross, 0)
        st.closed_maker_qty += torch.where(closes, trip_mq, 0)
        st.closed_taker_qty += torch.where(closes, trip_tq, 0)
        acc.trip_closed += closes
        acc.trip_pnl += torch.where(closes, net, 0.0)
        acc.new_trip |= (open_qty > 0) & (closes | (pos0 == 0))
        open_cost = side * (total_cost - close_cost)
        st.entry_cost_ticks.copy_(torch.where(closes, open_cost, entry_at_close + open_cost))
        open_maker = open_qty if maker else torch.zeros_like(open_qty)
        open_taker = torch.zeros_like(open_qty) if maker else open_qty
        st.trip_maker_qty.copy_(torch.where(closes, open_maker, trip_mq + open_maker))
        st.trip_taker_qty.copy_(torch.where(closes, open_taker, trip_tq + open_taker))
        st.position += side * qty
        st.cash_ticks -= side * total_cost
        if maker:
            st.maker_qty += qty
        else:
            st.taker_qty += qty
        acc.filled += side * qty

    @staticmethod
    def _close_qty(pos: torch.Tensor, side: torch.Tensor, qty: torch.Tensor) -> torch.Tensor:
        return torch.where(pos * side < 0, torch.minimum(qty, pos.abs()), 0)

    def _market(self, st: SimState, acc: _StepAcc, book: torch.Tensor, side: torch.Tensor, qty: torch.Tensor) -> None:
        """Market order of `qty` (0 = none) on `side` against `book` (n, 4, L)."""
        buy = (side > 0).unsqueeze(1)
        px = torch.where(buy, book[:, _ASK_PX], book[:, _BID_PX])  # (n, L) opposite side
        sz = torch.where(buy, book[:, _ASK_SZ], book[:, _BID_SZ])
        close_qty = self._close_qty(st.position, side, qty)
        total, close = self._walk_cost(px, sz, side, qty, close_qty)
        self._apply_fill(st, acc, side, qty, close_qty, total, close, maker=False)

    @staticmethod
    def _own_side(book: torch.Tensor, side: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buy = (side > 0).unsqueeze(1)
        return (
            torch.where(buy, book[:, _BID_PX], book[:, _ASK_PX]),  # (n, L)
            torch.where(buy, book[:, _BID_SZ], book[:, _ASK_SZ]),
        )

    @staticmethod
    def _displayed(px: torch.Tensor, sz: torch.Tensor, price: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        match = (px == price.unsqueeze(1)) & (sz > 0)  # (n, L)
        return match.any(1), (sz * match).sum(1)

    def _clear_order(self, st: SimState, mask: torch.Tensor) -> None:
        for t in (st.order_side, st.order_px, st.order_size, st.order_remaining, st.order_queue, st.order_age,
                  st.order_lifetime):
            t.masked_fill_(mask, 0)

    def _equity_half_ticks(self, st: SimState, book: torch.Tensor) -> torch.Tensor:
        """2 x (cash + position x mid) in ticks: integer, so exact."""
        return 2 * st.cash_ticks + st.position * (book[:, _BID_PX, 0] + book[:, _ASK_PX, 0])

    def _fees(self, maker_qty: torch.Tensor, taker_qty: torch.Tensor) -> torch.Tensor:
        return maker_qty.double() * self.cfg.maker_fee + taker_qty.double() * self.cfg.taker_fee

    # ------------------------------------------------------------------ step

    def step(self, st: SimState, actions: torch.Tensor) -> StepOut:
        """Advance every env one decision row; `actions` (n_envs, 4) int64 branch indices. Mutates `st`."""
        cfg = self.cfg
        n = cfg.n_envs
        acc = _StepAcc(n, self.device)
        c = st.cursor
        book_c = self._book(c)  # (n, 4, L) book at decision c
        book_n = self._book(c + 1)  # (n, 4, L) book at c + 1 (end of the interval)
        scal_c = self.row_scalars.index_select(0, c)  # (n, 3) anchor, sell_min_px, buy_max_px of (c, c+1]

        # --- issue: count the chosen actions, push them through the latency line
        st.action_counts += actions[:, :1] == self._direction_ids  # (n, 4) one-hot, no range-check sync
        code = ((actions[:, 0] * 3 + actions[:, 1]) * 3 + actions[:, 2]) * 3 + actions[:, 3]  # (n,)
        if cfg.latency_steps > 0:
            exec_code = st.pending[:, 0].clone()
            st.pending[:, :-1] = st.pending[:, 1:].clone()
            st.pending[:, -1] = code
        else:
            exec_code = code
        safe = exec_code.clamp(min=0)
        e_dir, e_mag, e_type, e_urg = safe // 27, (safe // 9) % 3, (safe // 3) % 3, safe % 3

        eq_before = self._equity_half_ticks(st, book_c)
        maker_before, taker_before = st.maker_qty.clone(), st.taker_qty.clone()

        # --- rule 2: instruction → delta to the target position
        active = (exec_code >= 0) & (e_dir != HOLD)
        tgt = self.target[e_mag]
        target = torch.where(e_dir == LONG, tgt, torch.where(e_dir == SHORT, -tgt, 0))
        delta = torch.where(active, target - st.position, 0)
        side, qty = delta.sign(), delta.abs()
        kind = self.order_kinds[e_type]  # (n,) order kind code (trainer.sim.actions.ORDER_KINDS)
        is_market = (qty > 0) & (kind == MARKET)
        is_take = (qty > 0) & ((kind == IOC) | (kind == FOK))
        own_px_c, own_sz_c = self._own_side(book_c, side)
        opp_best_c = torch.where(side > 0, book_c[:, _ASK_PX, 0], book_c[:, _BID_PX, 0])
        ticks_in_front = torch.where(kind == LIMIT_PASSIVE, -1, torch.where(kind == POST_ONLY, cfg.post_only_ticks, 0))
        limit_px = own_px_c[:, 0] + side * ticks_in_front
        crosses = side * (limit_px - opp_best_c) >= 0  # at or through the opposite best: would take liquidity
        is_resting = (kind == LIMIT_TOUCH) | (kind == LIMIT_PASSIVE) | (kind == POST_ONLY)
        rejected = (qty > 0) & (kind == POST_ONLY) & crosses
        is_limit = (qty > 0) & is_resting & ~rejected
        amend = is_limit & (st.order_side == side) & (st.order_px == limit_px)
        self._clear_order(st, active & ~amend)

        # --- rule 3: market order, or IOC / FOK up to their limit price, at the book of c
        opp_px_c, opp_sz_c = self._own_side(book_c, -side)  # (n, L) opposite side, best first
        take_px = opp_best_c + side * cfg.marketable_limit_ticks
        # Levels no worse than the limit form a prefix of the best-first levels, so a walk of at most `avail`
        # contracts never reaches past them (nor past the visible depth).
        within = (opp_sz_c > 0) & (side.unsqueeze(1) * (take_px.unsqueeze(1) - opp_px_c) >= 0)
        avail = (opp_sz_c * within).sum(1)  # (n,)
        take_qty = torch.where(kind == IOC, torch.minimum(qty, avail), torch.where(avail >= qty, qty, 0))
        take_qty = torch.where(is_take, take_qty, 0)
        rejected |= is_take & (take_qty == 0)
        self._market(st, acc, book_c, side, torch.where(is_market, qty, take_qty))
        st.market_orders += is_market | is_take
        st.rejected_orders += rejected

        # --- rule 4: place (or amend) the limit order at the book of c
        place = is_limit & ~amend
        _, queue_c = self._displayed(own_px_c, own_sz_c, limit_px)
        st.order_side.copy_(torch.where(place, side, st.order_side))
        st.order_px.copy_(torch.where(place, limit_px, st.order_px))
        st.order_queue.copy_(torch.where(place, queue_c, st.order_queue))
        st.order_size.copy_(torch.where(is_limit, qty, st.order_size))
        st.order_remaining.copy_(torch.where(is_limit, qty, st.order_remaining))
        st.order_lifetime.copy_(torch.where(is_limit, self.lifetimes[e_urg], st.order_lifetime))
        st.limit_orders += place

        # --- rule 5a/b: the working order against the trades of (c, c+1] and the book of c+1
        o_side, o_px, rem = st.order_side, st.order_px, st.order_remaining
        has = o_side != 0
        buy = o_side > 0
        bucket = o_px - scal_c[:, _ANCHOR] + self.radius
        in_grid = (bucket >= 0) & (bucket < self.width)
        vol_idx = (c * self.width + bucket.clamp(0, self.width - 1)) * 2 + buy.long()
        vol = self.trade_vol.index_select(0, vol_idx) * in_grid  # (n,) opposite-aggressor volume at P
        through = torch.where(buy, scal_c[:, _SELL_MIN] < o_px, scal_c[:, _BUY_MAX] > o_px)
        crossed = torch.where(buy, book_n[:, _ASK_PX, 0] <= o_px, book_n[:, _BID_PX, 0] >= o_px)
        excess = (vol - st.order_queue).clamp(min=0)
        fill = torch.where(has & (through | crossed), rem, torch.minimum(excess, rem))
        queue = (st.order_queue - vol).clamp(min=0)
        close_qty = self._close_qty(st.position, o_side, fill)
        self._apply_fill(st, acc, o_side, fill, close_qty, fill * o_px, close_qty * o_px, maker=True)
        rem_after = rem - fill
        st.limit_filled += has & (fill > 0) & (rem_after == 0)
        working = rem_after > 0

        # --- rule 5c: queue cap at the book of c+1; a level beyond the visible depth keeps its queue
        own_px_n, own_sz_n = self._own_side(book_n, o_side)
        shown, size_n = self._displayed(own_px_n, own_sz_n, o_px)
        last_px = own_px_n[:, -1]
        full_depth = (own_sz_n > 0).all(1)
        beyond = full_depth & torch.where(buy, o_px < last_px, o_px > last_px)
        queue = torch.where(shown, torch.minimum(queue, size_n), torch.where(beyond, queue, 0))
        st.order_queue.copy_(torch.where(working, queue, 0))
        st.order_remaining.copy_(rem_after)
        st.order_age += working

        # --- rule 5d + 6: expiry and window end, one market order at the book of c+1
        at_end = (c + 1) == st.window_last
        expire = working & (st.order_age >= st.order_lifetime) & ~at_end
        st.expired_orders += expire
        if cfg.on_expiry == "market":
            exp_qty = torch.where(expire, rem_after, 0)
            st.market_orders += expire
        else:
            exp_qty = torch.zeros_like(rem_after)
        end_side = -st.position.sign()
        m_side = torch.where(at_end, end_side, o_side)
        m_qty = torch.where(at_end, st.position.abs(), exp_qty)
        self._clear_order(st, ~working | expire | at_end)
        self._market(st, acc, book_n, m_side, m_qty)

        # --- rule 7: advance, time in trade, reward
        st.cursor += 1
        pos = st.position
        st.time_in_trade.copy_(torch.where(pos == 0, 0, torch.where(acc.new_trip, 1, st.time_in_trade + 1)))
        d_fee = self._fees(st.maker_qty - maker_before, st.taker_qty - taker_before)  # (n,) float64 currency
        d_equity = (self._equity_half_ticks(st, book_n) - eq_before).double() * (self.tick_value / 2) - d_fee
        reward = cfg.reward_scale * d_equity - cfg.inventory_penalty * (pos.abs().double() / cfg.max_position)

        # --- re-place envs that reached their window end (statistics kept)
        st.reset_count += at_end
        st.cursor.copy_(torch.where(at_end, self._draw_offsets(st), st.cursor))
        if cfg.latency_steps > 0:
            st.pending.masked_fill_(at_end.unsqueeze(1), -1)

        return StepOut(
            reward=reward.float(),
            done=(acc.trip_closed > 0) | at_end,
            truncated=at_end,
            trip_closed=acc.trip_closed,
            trip_pnl=acc.trip_pnl.float(),
            filled_qty=acc.filled,
            fees=d_fee.float(),
        )

    # ------------------------------------------------------------------ views

    def obs_rows(self, st: SimState) -> torch.Tensor:
        """(n_envs,) int64 decision row whose market data the agent has seen at the cursor: cursor - feed latency.

        The loop gathers the feature window ending at this row (rows <= cursor - feed_latency_steps)."""
        return st.cursor - self.cfg.feed_latency_steps

    def equity(self, st: SimState) -> torch.Tensor:
        """(n_envs,) float32 mark-to-market equity in currency (cash + position x mid - fees), since reset."""
        book = self._book(st.cursor)
        half = self._equity_half_ticks(st, book).double() * (self.tick_value / 2)
        return (half - self._fees(st.maker_qty, st.taker_qty)).float()

    def env_features(self, st: SimState) -> torch.Tensor:
        """(n_envs, ENV_FEATURES) float32 agent-visible env state, each column bounded in [-1, 1].

        Own position and order state are current; the unrealised PnL is marked at the observed row's mid
        (`obs_rows`), the only market price the agent has seen."""
        cfg = self.cfg
        book = self._book(self.obs_rows(st))
        pos = st.position.float()
        mid2 = (book[:, _BID_PX, 0] + book[:, _ASK_PX, 0]).float()
        unreal_ticks = (pos * mid2 - 2 * st.entry_cost_ticks.float()) / 2
        has = st.order_side != 0
        q, rem = st.order_queue.float(), st.order_remaining.float()
        tt = st.time_in_trade.float()
        cols = (
            pos / cfg.max_position,
            torch.tanh(unreal_ticks / (cfg.max_position * cfg.unrealised_scale_ticks)),
            st.order_side.float(),
            torch.where(has, st.order_age.float() / st.order_lifetime.clamp(min=1).float(), 0.0),
            torch.where(has, q / (q + rem).clamp(min=1.0), 0.0),
            rem / cfg.max_position,
            tt / (tt + cfg.time_scale_steps),
        )
        return torch.stack(cols, dim=1)  # (n_envs, ENV_FEATURES)

    def stats(self, st: SimState) -> dict[str, torch.Tensor]:
        """Scalar statistics summed over envs, as 0-d device tensors (reading them is a host sync)."""
        cfg = self.cfg
        trips = st.round_trips.sum()
        actions = st.action_counts.sum(0)  # (4,)
        n_actions = actions.sum().clamp(min=1)
        gross = st.realised_ticks.sum().double() * self.tick_value
        closed_fees = self._fees(st.closed_maker_qty.sum(), st.closed_taker_qty.sum())
        limit_orders = st.limit_orders.sum()
        out = {
            "round_trips": trips,
            "wins": st.wins.sum(),
            "win_rate": st.wins.sum().double() / trips.clamp(min=1),
            "gross_pnl": gross,
            "net_pnl": gross - closed_fees,
            "fees": self._fees(st.maker_qty.sum(), st.taker_qty.sum()),
            "equity": self.equity(st).double().sum(),
            "hold_frac": actions[HOLD].double() / n_actions,
            "limit_orders": limit_orders,
            "limit_fill_rate": st.limit_filled.sum().double() / limit_orders.clamp(min=1),
            "market_orders": st.market_orders.sum(),
            "expired_orders": st.expired_orders.sum(),
            "rejected_orders": st.rejected_orders.sum(),
            "maker_qty": st.maker_qty.sum(),
            "taker_qty": st.taker_qty.sum(),
        }
        for code, name in ((SHORT, "short"), (HOLD, "hold"), (LONG, "long"), (FLAT, "flat")):
            out[f"actions_{name}"] = actions[code]
        return out
