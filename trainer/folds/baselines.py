"""Baseline policies, evaluated on the same window through the same simulator and `evaluate` as the agent.

Each is a `Policy`: (obs (B, W, F), env_state (B, S)) -> actions (B, 4) int64, so the comparison is like for like.

  flat      always FLAT: never holds a position (zero PnL, zero trades: the floor any strategy must beat after fees).
  random    every branch drawn uniformly (seeded, on the device): what a policy that learned nothing does.
  ofi_rule  order-flow imbalance, the signal planted in the synthetic market: LONG when the newest normalised
            `ofi_sum` feature is above +threshold, SHORT below -threshold, else HOLD (keep the position); market
            orders of the smallest size (one contract at the default max_position 3). The column is found by name
            in the FeatureSet's `names`.
  ofi_rule_max  the same rule at the largest magnitude: the agent's own position limit (max_position contracts).
            The agent may hold up to that many contracts, so this is the size-matched comparison: a net PnL above
            `ofi_rule` alone can come from holding a larger position, not from reading the market better
            (docs/RESULTS.md §7: on the demo market the agent held ~2.7 contracts per trip against the rule's one).
  forecast_rule_max  only where the inputs carry the per-fold linear forecast (AgentConfig.forecast_lags > 0,
            column `forecast`): the same rule at full size reading that column instead of `ofi_sum`. An agent that
            reads the forecast must beat this to show that the learning adds anything to it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from trainer.agent.forecast import FORECAST_COLUMN
from trainer.folds.evaluate import HEADLINE, EvalConfig, Policy, evaluate
from trainer.features.decision import DecisionTape
from trainer.sim import FLAT, HOLD, LONG, MARKET, SHORT, SimConfig
from trainer.sim.actions import BRANCH_SIZES

BASELINES = ("flat", "random", "ofi_rule", "ofi_rule_max")
"""The baselines of every fold; `forecast_rule_max` joins them where the inputs have the forecast column."""


@dataclass(frozen=True)
class OfiRuleConfig:
    column: str = "ofi_sum"
    """Feature name (in FeatureSet.names) of the normalised OFI the rule reads."""
    threshold: float = 1.0
    """Enter when |OFI| exceeds this many train-window standard deviations (> 0)."""
    magnitude: int = 0
    """Magnitude choice (index into SimConfig.magnitudes) of every entry: the position size the rule trades."""
    inside: int = HOLD
    """What the rule sends while |OFI| <= threshold: HOLD keeps the position (the baselines), FLAT closes it."""

    def __post_init__(self) -> None:
        if not self.column:
            raise ValueError(f"OfiRuleConfig.column must be a feature name, got {self.column!r}")
        if not (math.isfinite(self.threshold) and self.threshold > 0):
            raise ValueError(f"OfiRuleConfig.threshold must be finite and > 0, got {self.threshold!r}")
        if not (isinstance(self.magnitude, int) and 0 <= self.magnitude < BRANCH_SIZES[1]):
            raise ValueError(f"OfiRuleConfig.magnitude must be in [0, {BRANCH_SIZES[1]}), got {self.magnitude!r}")
        if self.inside not in (HOLD, FLAT):
            raise ValueError(f"OfiRuleConfig.inside must be HOLD ({HOLD}) or FLAT ({FLAT}), got {self.inside!r}")


def flat_policy() -> Policy:
    def policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        a = torch.zeros(obs.shape[0], len(BRANCH_SIZES), dtype=torch.int64, device=obs.device)
        a[:, 0], a[:, 2] = FLAT, MARKET
        return a

    return policy


def random_policy(seed: int, device: torch.device | str) -> Policy:
    """Uniform over every branch; its own generator, so it neither reads nor advances the global torch RNG."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sizes = torch.tensor(BRANCH_SIZES, dtype=torch.float64, device=device)  # (n_branches,)

    def policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        u = torch.rand(obs.shape[0], len(BRANCH_SIZES), generator=gen, device=obs.device, dtype=torch.float64)
        return (u * sizes).long().clamp_max(sizes.long() - 1)  # (B, n_branches): floor(u * size) in [0, size)

    return policy


def ofi_column(names: Sequence[str], column: str = "ofi_sum") -> int:
    """Index of `column` in the feature names; ValueError naming the known OFI columns if absent."""
    names = list(names)
    if column not in names:
        have = [n for n in names if n.startswith("ofi")]
        raise ValueError(f"OFI rule needs feature '{column}', the FeatureSet has {have or 'no OFI columns'}")
    return names.index(column)


def ofi_rule_policy(names: Sequence[str], cfg: OfiRuleConfig = OfiRuleConfig()) -> Policy:
    col = ofi_column(names, cfg.column)

    def policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        ofi = obs[:, -1, col]  # (B,) newest row of the window: known at the decision
        direction = torch.where(ofi > cfg.threshold, LONG, torch.where(ofi < -cfg.threshold, SHORT, cfg.inside))
        a = torch.zeros(obs.shape[0], len(BRANCH_SIZES), dtype=torch.int64, device=obs.device)
        a[:, 0], a[:, 1], a[:, 2] = direction, cfg.magnitude, MARKET
        return a

    return policy


def baseline_policies(names: Sequence[str], seed: int, device: torch.device | str,
                      ofi: OfiRuleConfig = OfiRuleConfig()) -> dict[str, Policy]:
    largest = dataclasses.replace(ofi, magnitude=BRANCH_SIZES[1] - 1)
    policies = {"flat": flat_policy(), "random": random_policy(seed, device), "ofi_rule": ofi_rule_policy(names, ofi),
                "ofi_rule_max": ofi_rule_policy(names, largest)}
    if FORECAST_COLUMN in names:
        policies["forecast_rule_max"] = ofi_rule_policy(names, dataclasses.replace(largest, column=FORECAST_COLUMN))
    return policies


def run_baselines(names: Sequence[str], features: torch.Tensor, tape: DecisionTape, sim_cfg: SimConfig,
                  window: int, start: int, stop: int, cfg: EvalConfig | None = None, seed: int = 0,
                  ofi: OfiRuleConfig = OfiRuleConfig()) -> dict[str, dict[str, float]]:
    """{baseline: headline metrics} on rows [start, stop): the same `evaluate` call the agent gets."""
    out = {}
    for name, policy in baseline_policies(names, seed, features.device, ofi).items():
        m = evaluate(policy, features, tape, sim_cfg, window, start, stop, cfg=cfg).metrics
        out[name] = {k: m[k] for k in HEADLINE}
    return out
