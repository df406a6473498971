"""TrainConfig: one frozen config per stage under one root, plus the named presets.

The resolved config is written to run.json and into every checkpoint; on resume, settings that fix tensor shapes
come from the checkpoint (a mismatch is refused, naming the fields).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainer.agent.config import AgentConfig
from trainer.agent.replay import ReplayConfig
from trainer.features.config import FeatureConfig
from trainer.sim import ENV_FEATURES
from trainer.sim.config import SimConfig


COMPILE_CHOICES = ("none", "sim", "all", "autotune")


@dataclass(frozen=True)
class LoopConfig:
    n_steps: int = 25_000
    """Training steps per fold; each is n_envs env steps plus one gradient step."""
    learning_starts: int = 64
    """Env steps (per env) of acting only before gradient steps begin (fills replay past batch_size)."""
    log_every: int = 500
    """Steps between JSON log lines; metrics are read from the device only then (host sync)."""
    checkpoint_every: int = 5_000
    """Steps between checkpoints (the seed plan's cadence); a final one is written at the end."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept per fold (>= 2)."""
    mode: str = "auto"
    """'eager', 'graph' (CUDA graph of the whole step; CUDA only) or 'auto' (graph on CUDA, eager on CPU)."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda[:i]'."""
    compile: str = "none"
    """torch.compile inside the step: 'none', 'sim' (the simulator step: its ~500 small elementwise kernels fuse
    into a few) or 'all' (every tensor-only part of the step: acting, simulator, n-step store, replay sampling and
    priorities, the learner's target, loss with its backward, clip and statistics; backward bookkeeping, AdamW and
    Polyak stay eager). Paid once per process (about a minute on a GPU); the values match eager to float
    rounding, not bit for bit, so it is part of the checkpoint fingerprint. 'autotune' is 'all' with inductor's
    max_autotune on CUDA: each matrix product's kernel is picked by timing candidates on the device (cuBLAS, Triton
    templates with the neighbouring elementwise work fused in, decompose-K). On an H200 at 1,024 envs: 0.965
    against 1.024 ms per step, for about 5 minutes of compiling with a cold cache instead of 1 (docs/BENCHMARKS.md
    v11). On CPU it compiles as 'all'. It cannot be deterministic: the picks depend on timings (the compile cache
    keeps them for a retried attempt)."""
    overlap: bool = True
    """In graph mode (CUDA), run acting (act → simulator → store) and the learner's double-DQN target forwards on
    side streams, concurrently with the learner's online forward and backward (trainer/loop/step.py). Same values
    either way. Eager steps and --deterministic runs keep one stream: an eager step is bound by the host, which
    the side streams cost time (docs/BENCHMARKS.md v5)."""
    act_sm_share: float = 0.5
    """With `overlap`, the share of the GPU's SMs acting may use while the learner computes (a CUDA green context;
    1.0: all of them), as long as acting is the smaller of the two: at most 4 windows per batch item (beyond that,
    acting gets every SM; trainer/loop/step.py). The learner may use every SM. Half measured best on an H200
    (docs/BENCHMARKS.md v9): acting given the whole device holds SMs the learner's chain waits for, and given much
    less it runs long enough to slow the learner longer. Same values either way."""
    seed: int = 0
    """Seed for torch, numpy, python and the simulator's reset hash."""
    deterministic: bool = False
    """Seeded everything plus torch.use_deterministic_algorithms: a killed-and-resumed run ends bit-identical."""
    eval_envs: int = 256
    """Parallel greedy backtests spread over the evaluation window (plus one continuous pass)."""
    grace_seconds: float = 30.0
    """After SIGTERM/SIGINT: finish the step, checkpoint, exit 143 within this budget."""
    select_frac: float = 0.0
    """Share of the training window's rows, at its end, held out for model selection (trainer/loop/select.py): never
    trained on; the greedy policy is backtested there every `select_every` steps and the best weights, not the
    last, go to out-of-sample evaluation. 0 turns selection off (the last weights are evaluated)."""
    select_every: int = 250
    """Steps between validation backtests when `select_frac` > 0 (each is one host sync); one more runs at the end."""
    select_envs: int = 16
    """Validation backtests, at evenly spaced start rows of the held-out slice, each over its own contiguous part."""
    select_min_net: float = 0.0
    """The fold stands aside (never opens a position out of sample) unless the best validated network netted more
    than this (currency, after fees) on the held-out slice."""

    def __post_init__(self) -> None:
        for name in ("n_steps", "log_every", "checkpoint_every", "eval_envs", "select_every", "select_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.learning_starts < 0:
            raise ValueError(f"LoopConfig.learning_starts must be >= 0, got {self.learning_starts!r}")
        if self.keep_checkpoints < 2:
            raise ValueError(f"LoopConfig.keep_checkpoints must be >= 2, got {self.keep_checkpoints!r}")
        if not 0.0 <= self.select_frac < 1.0:
            raise ValueError(f"LoopConfig.select_frac must be in [0, 1), got {self.select_frac!r}")
        if self.mode not in ("auto", "eager", "graph"):
            raise ValueError(f"LoopConfig.mode must be auto|eager|graph, got {self.mode!r}")
        if not 0.0 < self.act_sm_share <= 1.0:
            raise ValueError(f"LoopConfig.act_sm_share must be in (0, 1], got {self.act_sm_share!r}")
        if self.compile not in COMPILE_CHOICES:
            raise ValueError(f"LoopConfig.compile must be one of {COMPILE_CHOICES}, got {self.compile!r}")
        if self.deterministic and self.compile == "autotune":
            raise ValueError("LoopConfig.compile='autotune' picks kernels by timing them, so it cannot be "
                             "deterministic: use compile='all' with deterministic=True")


@dataclass(frozen=True)
class TrainConfig:
    data: str = "synthetic"
    """Data SPEC (see docs/data.md), e.g. synthetic:seed=7,days=4,signal=1 or lobster:PATH."""
    features: FeatureConfig = field(default_factory=FeatureConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(n_features=1, env_state_dim=ENV_FEATURES))
    """Agent settings; n_features is filled in from the feature set when a fold is built."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **sections: dict[str, Any]) -> "TrainConfig":
        """Copy with fields of named sections replaced: cfg.replace(loop={"n_steps": 10})."""
        updates = {}
        for name, fields_ in sections.items():
            if name == "data":
                updates["data"] = fields_
            else:
                updates[name] = dataclasses.replace(getattr(self, name), **fields_)
        return dataclasses.replace(self, **updates)


def preset(name: str) -> TrainConfig:
    """Named presets: 'smoke' (CPU, about a minute per fold on 2 cores) and 'h100' (the seed plan's GPU run)."""
    base = TrainConfig()
    if name == "smoke":
        return base.replace(
            sim={"n_envs": 64},
            # GRU on CPU: the pure-PyTorch Mamba scan is ~10x slower per update there (docs/agent.md); the
            # GPU presets use Mamba.
            agent={"d_model": 32, "window": 16, "batch_size": 128, "n_layers": 1, "encoder": "gru"},
            replay={"capacity": 8192},
            loop={"n_steps": 1500, "log_every": 250, "checkpoint_every": 500, "learning_starts": 32,
                  "eval_envs": 64, "device": "cpu"},
        )
    if name == "h100":
        return base.replace(
            sim={"n_envs": 1024},
            replay={"capacity": 65_536},
            # compile='all': 2x the graph-captured step rate on an H200 for ~1 min of compiling per process
            # (docs/BENCHMARKS.md, v4).
            loop={"n_steps": 25_000, "log_every": 500, "checkpoint_every": 5_000, "compile": "all"},
        )
    raise ValueError(f"unknown preset {name!r}: choose smoke or h100")


PRESETS = ("smoke", "h100")
