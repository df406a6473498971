"""The branching action space of the simulator.

An action is four integers, one per branch, shape (n_envs, 4) int64:

- direction: SHORT / HOLD / LONG / FLAT. SHORT and LONG set a target position of
  -/+ magnitude x max_position; FLAT targets 0; HOLD sends nothing (the position and any
  working limit order are left alone).
- magnitude: index into SimConfig.magnitudes (fractions of max_position); ignored by HOLD/FLAT.
- order type: an index into SimConfig.order_types, whose default ("market", "limit_touch",
  "limit_passive") gives MARKET, LIMIT_TOUCH (join the best price on our side), LIMIT_PASSIVE (one tick
  behind the best on our side). A config may offer the marketable-limit kinds instead: "ioc"
  (immediate-or-cancel), "fok" (fill-or-kill) and "post_only" (see ORDER_KINDS).
- urgency: index into SimConfig.urgency_lifetimes (steps an unfilled limit order works before
  it is cancelled or converted to a market order, SimConfig.on_expiry); ignored by MARKET.
"""
from __future__ import annotations

SHORT, HOLD, LONG, FLAT = 0, 1, 2, 3
DIRECTION_NAMES = ("short", "hold", "long", "flat")

MARKET, LIMIT_TOUCH, LIMIT_PASSIVE = 0, 1, 2
ORDER_TYPE_NAMES = ("market", "limit_touch", "limit_passive")
"""The default meaning of the order-type branch (SimConfig.order_types)."""

IOC, FOK, POST_ONLY = 3, 4, 5
ORDER_KINDS = ("market", "limit_touch", "limit_passive", "ioc", "fok", "post_only")
"""Every order kind the simulator knows; the kind code is the index here (MARKET=0 ... POST_ONLY=5).

- ioc: a marketable limit at the opposite best moved SimConfig.marketable_limit_ticks against us; takes the
  visible opposite depth up to that price at once (taker), the rest is cancelled.
- fok: the same limit price, but all or nothing: fills only if the visible depth up to the price covers the
  whole order, else nothing fills.
- post_only: a resting limit at our best moved SimConfig.post_only_ticks towards the opposite side; rejected
  (nothing placed) when that price would cross the opposite best, so it can only ever fill as a maker.
"""

BRANCH_SIZES = (4, 3, 3, 3)
"""Sizes of the (direction, magnitude, order type, urgency) branches."""
BRANCH_NAMES = ("direction", "magnitude", "order_type", "urgency")

N_ACTIONS = BRANCH_SIZES[0] * BRANCH_SIZES[1] * BRANCH_SIZES[2] * BRANCH_SIZES[3]
"""Number of joint actions (108); `encode` maps a branch tuple into [0, N_ACTIONS)."""


def encode(direction, magnitude, order_type, urgency):
    """Joint action code ((d*3 + m)*3 + o)*3 + u; works on ints and on integer tensors alike."""
    return ((direction * BRANCH_SIZES[1] + magnitude) * BRANCH_SIZES[2] + order_type) * BRANCH_SIZES[3] + urgency


def decode(code):
    """Inverse of `encode` for a non-negative code: (direction, magnitude, order_type, urgency)."""
    urgency = code % BRANCH_SIZES[3]
    rest = code // BRANCH_SIZES[3]
    order_type = rest % BRANCH_SIZES[2]
    rest = rest // BRANCH_SIZES[2]
    magnitude = rest % BRANCH_SIZES[1]
    direction = rest // BRANCH_SIZES[1]
    return direction, magnitude, order_type, urgency
