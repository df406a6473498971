"""FeatureConfig: the decision clock and the causal feature set, in one frozen, validated config."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

CLOCK_KINDS = ("events", "time")


@dataclass(frozen=True)
class FeatureConfig:
    clock: str = "events"
    """Decision clock kind: 'events' ticks every `clock_events` book events, 'time' at most once per `clock_time_ns`."""
    clock_events: int = 100
    """Book events (MarketTape.book rows) between decisions when clock='events'."""
    clock_time_ns: int = 1_000_000_000
    """Bucket width in ns when clock='time': one decision at the first book event of each bucket (epoch-aligned)."""
    ofi_levels: int = 5
    """Book levels with their own order-flow-imbalance column (capped at the book's levels)."""
    depth_levels: int = 5
    """Book levels with their own depth-imbalance column (capped at the book's levels)."""
    return_horizons_decisions: tuple[int, ...] = (1, 5, 20)
    """Mid-price return look-backs, in decisions (one column each, in ticks)."""
    trade_flow_horizons_decisions: tuple[int, ...] = (1, 5)
    """Trade-flow-imbalance look-backs, in decisions (signed / total traded volume over that many intervals)."""
    vol_window_decisions: int = 20
    """Realised-volatility window, in decisions (root of summed squared one-decision mid changes, ticks)."""
    trade_radius_ticks: int = 16
    """R: the DecisionTape's trade histograms cover best bid ± R ticks (2R+1 buckets)."""

    def __post_init__(self) -> None:
        if self.clock not in CLOCK_KINDS:
            raise ValueError(f"FeatureConfig.clock must be one of {CLOCK_KINDS}, got {self.clock!r}")
        for name in ("clock_events", "clock_time_ns", "ofi_levels", "depth_levels", "vol_window_decisions",
                     "trade_radius_ticks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"FeatureConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("return_horizons_decisions", "trade_flow_horizons_decisions"):
            value = getattr(self, name)
            if (not isinstance(value, tuple) or not value
                    or any(not isinstance(h, int) or isinstance(h, bool) or h < 1 for h in value)
                    or len(set(value)) != len(value)):
                raise ValueError(f"FeatureConfig.{name} must be a non-empty tuple of distinct ints >= 1, got {value!r}")

    @property
    def lookback_decisions(self) -> int:
        """Decisions of history the longest feature reads; rows before `start + lookback` see a clamped window."""
        return max(*self.return_horizons_decisions, *self.trade_flow_horizons_decisions, self.vol_window_decisions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists); stable field order, used in the fxcache key."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FeatureConfig":
        """Inverse of `to_dict`; unknown keys are refused (ValueError) rather than silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"FeatureConfig: unknown field(s) {sorted(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
