"""trainer.sim: GPU-vectorised order-book replay (see engine.py for the rules, docs/simulator.md for users)."""
from __future__ import annotations

from trainer.sim.actions import (BRANCH_SIZES, FLAT, FOK, HOLD, IOC, LIMIT_PASSIVE, LIMIT_TOUCH, LONG, MARKET,
                                  ORDER_KINDS, POST_ONLY, SHORT)
from trainer.sim.config import SimConfig
from trainer.sim.engine import ENV_FEATURES, ENV_POSITION, ENV_REFLECTION, ENV_TIME_IN_TRADE, Simulator, validate_tape
from trainer.sim.state import SimState, StepOut

__all__ = [
    "BRANCH_SIZES", "ENV_FEATURES", "ENV_POSITION", "ENV_REFLECTION", "ENV_TIME_IN_TRADE", "FLAT", "FOK", "HOLD", "IOC",
    "LIMIT_PASSIVE", "LIMIT_TOUCH", "LONG", "MARKET", "ORDER_KINDS", "POST_ONLY", "SHORT",
    "SimConfig", "SimState", "Simulator", "StepOut", "validate_tape",
]
