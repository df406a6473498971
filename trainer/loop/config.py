"""TrainConfig: the one config tree (a frozen config per stage under one root), the named presets, and the checks
that span sections.

The stage configs stay with their stages (features, sim, agent, replay); loop, fold geometry, evaluation and chain
settings, the choices and the preset data live in the torch-free `trainer.settings`. The command line is generated
from this tree (trainer/cli.py). The resolved config is written to run.json and into every checkpoint; on resume,
settings that fix tensor shapes or change results must match the checkpoint (a mismatch is refused, naming the
fields).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from trainer.agent.config import AgentConfig
from trainer.agent.replay import ReplayConfig, effective_capacity
from trainer.features.config import FeatureConfig
from trainer.settings import (COMPILE_CHOICES, DEFAULT_PRESET, FINGERPRINT_EXCLUDED, PRESET_NAMES, PRESETS,
                              ChainConfig, EvalConfig, FoldConfig, LoopConfig)
from trainer.sim import ENV_FEATURES
from trainer.sim.config import SimConfig

__all__ = ["TrainConfig", "LoopConfig", "FoldConfig", "EvalConfig", "ChainConfig", "preset", "PRESETS",
           "PRESET_NAMES", "DEFAULT_PRESET", "COMPILE_CHOICES", "fingerprint_config"]

SECTIONS = ("features", "sim", "agent", "replay", "loop", "folds", "eval", "chain")
"""The sub-config fields of TrainConfig, in the order of the data flow (and of --help)."""


@dataclass(frozen=True)
class TrainConfig:
    data: str = "synthetic"
    """Data SPEC (see docs/data.md), e.g. synthetic:seed=7,days=4,signal=1 or lobster:PATH."""
    features: FeatureConfig = field(default_factory=FeatureConfig)
    """Decision clock and causal features (the fxcache key)."""
    sim: SimConfig = field(default_factory=SimConfig)
    """Simulator rules and the number of parallel backtests."""
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(n_features=1, env_state_dim=ENV_FEATURES))
    """Agent settings; n_features is filled in from the feature set when a fold is built."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Prioritised replay."""
    loop: LoopConfig = field(default_factory=LoopConfig)
    """The training loop of one fold."""
    folds: FoldConfig = field(default_factory=FoldConfig)
    """Walk-forward geometry and the fold this process trains."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Out-of-sample evaluation of the trained fold."""
    chain: ChainConfig = field(default_factory=ChainConfig)
    """Fold-boundary treatment of chain mode (folds.fold_mode='chain')."""

    def __post_init__(self) -> None:
        # Checks that span sections, in one place (each section checks its own fields when built).
        if self.loop.deterministic and self.loop.compile == "autotune":
            raise ValueError("LoopConfig.compile='autotune' picks kernels by timing them, so it cannot be "
                             "deterministic: use compile='all' with deterministic=True")
        if self.loop.mode == "graph" and self.loop.device == "cpu":
            raise ValueError("LoopConfig.mode='graph' captures a CUDA graph: it needs a CUDA device, got "
                             "LoopConfig.device='cpu'")
        # The replay holds max(capacity, 4 x n_envs) rounded up to a power of two (effective_capacity): a push of
        # n_envs transitions never overwrites more than a quarter of it. A batch must fit in what it holds.
        capacity = effective_capacity(self.replay.capacity, self.sim.n_envs)
        if self.agent.batch_size > capacity:
            raise ValueError(f"AgentConfig.batch_size={self.agent.batch_size} exceeds the replay's capacity "
                             f"{capacity} (ReplayConfig.capacity={self.replay.capacity}, raised to >= 4 x "
                             f"SimConfig.n_envs={self.sim.n_envs})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **sections: dict[str, Any] | str) -> "TrainConfig":
        """Copy with fields of named sections replaced: cfg.replace(loop={"n_steps": 10})."""
        updates: dict[str, Any] = {}
        for name, fields_ in sections.items():
            if name == "data":
                updates["data"] = fields_
            elif name not in SECTIONS:
                raise ValueError(f"TrainConfig has no section {name!r}; sections: {', '.join(SECTIONS)}")
            else:
                updates[name] = dataclasses.replace(getattr(self, name), **fields_)
        return dataclasses.replace(self, **updates)


def preset(name: str) -> TrainConfig:
    """The config of a named preset (trainer.settings.PRESETS): 'smoke' (CPU, about a minute per fold on 2 cores)
    or 'h100' (the seed plan's GPU run)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESET_NAMES)}")
    return TrainConfig().replace(**PRESETS[name])


def fingerprint_config(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config (TrainConfig.to_dict()) a checkpoint must match to be resumed: everything but
    trainer.settings.FINGERPRINT_EXCLUDED. A plain-JSON copy (tuples become lists), as it reads back from a file."""
    config = json.loads(json.dumps(cfg_dict))
    for path in FINGERPRINT_EXCLUDED:
        section, name = path.split(".")
        config.get(section, {}).pop(name, None)
    return config
