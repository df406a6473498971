"""The torch-free half of the config tree: choices, the named presets, and the sections that import nothing heavy.

`trainer.loop.config.TrainConfig` is the one config tree; its sections are the stage configs (features, sim,
agent, replay) plus the four defined here (loop, folds, eval, chain). This module imports only the standard
library and `trainer.agent.config` (itself torch-free), so `workflows/` takes choices and preset names from here
instead of copying them: `python -c "import workflows.submit"` imports no torch (tests/test_workflows_submit.py).

Presets are data: per section, the fields that differ from the dataclass defaults. `trainer.loop.config.preset`
applies them; explicit command-line flags are applied after, so a flag always beats the preset.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Mapping, get_args

from trainer.agent.config import ENCODERS, SCANS

__all__ = ["COMPILE_CHOICES", "MODES", "DEVICES", "FOLD_MODES", "TRAIN_WINDOWS", "ENCODERS", "SCANS", "PRESETS",
           "PRESET_NAMES", "DEFAULT_PRESET", "FINGERPRINT_EXCLUDED", "EVALUATION_ONLY", "LoopConfig", "FoldConfig",
           "EvalConfig", "ChainConfig"]

# Literal types, so the generated CLI offers (and checks) the choices; the tuples are what other modules import.
Compile = Literal["none", "sim", "all", "autotune"]
Mode = Literal["auto", "eager", "graph"]
FoldMode = Literal["independent", "chain"]
TrainWindow = Literal["rolling", "anchored"]
COMPILE_CHOICES: tuple[str, ...] = get_args(Compile)
"""LoopConfig.compile: torch.compile inside the step (see the field's docstring)."""
MODES: tuple[str, ...] = get_args(Mode)
"""LoopConfig.mode: how the step is launched."""
FOLD_MODES: tuple[str, ...] = get_args(FoldMode)
"""FoldConfig.fold_mode: train each fold from scratch, or warm-start fold N from fold N-1's final state."""
TRAIN_WINDOWS: tuple[str, ...] = get_args(TrainWindow)
"""FoldConfig.train_window: fold N trains on window N alone, or on every row from window 0's start to window N's
stop (an expanding window)."""
DEVICES = ("auto", "cpu", "cuda")
"""Device kinds; the trainer also takes 'cuda:<i>'."""
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")

PRESETS: Mapping[str, Mapping[str, Mapping[str, Any]]] = MappingProxyType({
    # CPU, about a minute per fold on 2 cores. GRU: the pure-PyTorch Mamba scan is ~10x slower per update on a CPU
    # (docs/agent.md); the GPU preset uses Mamba.
    # Learning settings as h100's (docs/RESULTS.md), plus a price on exposure: 0.6 reward units per step at full
    # position (docs/RESULTS.md §4). Mirrored decisions and an exposure cap of 0.6 on the held-out slice (§9): on the
    # demo market every gate passed on 5 of 5 seeds (win rate 0.61–0.78, time in market 0.32–0.60), where the
    # penalty alone passed on 1 of 3 (fold-to-fold exposure 0.50–0.84). The cap kept out of sample by a causal
    # controller, exposure_gain 0.01 (§10): on the demo market and the slow test's, 5 seeds each, both gates on 30 of
    # 30 runs (26 of 30 with the slice's fixed margin), time in market 0.50–0.60, net +20 % on each market.
    # Trained on the reflected market too (agent.mirror_augment, §16): on the demo market, 10 seeds paired, net +17 %
    # (+14.2k a seed, 95 % interval [+6.9k, +21.8k]), up on 24 of 30 runs, every gate on 10 of 10 seeds, the control
    # standing aside on 9 of 9 folds. 1,000 steps (2,000 selected later weights that did worse, §16): the README
    # main job trains the control market too and stays a few minutes on 2 cores.
    "smoke": {
        "sim": {"n_envs": 64, "inventory_penalty": 0.6},
        "agent": {"d_model": 32, "window": 16, "batch_size": 128, "n_layers": 1, "encoder": "gru",
                  "thompson_scale": 0.2, "mirror": True, "mirror_augment": True},
        "replay": {"capacity": 8192},
        "loop": {"n_steps": 1000, "log_every": 250, "checkpoint_every": 500, "learning_starts": 32, "device": "cpu",
                 "select_frac": 0.2, "max_exposure": 0.6, "exposure_gain": 0.01},
        "eval": {"n_envs": 64},
    },
    # The seed plan's GPU run. compile='all': about twice the graph-captured step rate for about a minute of
    # compiling per process (docs/BENCHMARKS.md). Learning settings from docs/RESULTS.md (issue 20): Thompson draws
    # shrunk to κ = 0.2 and model selection on the last 20 % of the training window; the held-out net PnL peaked
    # at 500–2,250 steps in all 15 measured (seed, fold) runs and fell after, so 5,000 steps, not 25,000. Inventory
    # penalty 0.1 (docs/RESULTS.md §6): time in market 0.50–0.74 instead of 0.78–1.00 with the edge kept (15 of 15
    # runs above the OFI rule), and the signal=0 control loses less than half of what it lost without it. Mirrored
    # greedy decisions (docs/RESULTS.md §8): 14 of 15 runs above the OFI rule at the agent's own size
    # (`ofi_rule_max`) against 5 of 9 without, the control still without an edge. Exposure cap 0.6 (§9): time in
    # market 0.55–0.63 on 9 of 9 runs (0.66–0.91 without), net and the lead over `ofi_rule_max` about kept.
    # Deployed with a minimum holding time of 4 decisions, no hysteresis band beyond it (keep_margin_frac 0) and the
    # causal exposure controller (§13): every gate on 5 of 7 training seeds against 0 of 7 on the same weights
    # without them (2 of 2 on seeds 5 and 6, which took no part in choosing the rule), win rate up on 20 of 21 pairs,
    # net −21 % on the same weights (−5 % on seeds 5 and 6), still above the 1-lot OFI rule on 21 of 21 runs.
    # Evaluated on 16 segments (§15): on its ~1,030-decision eval windows the default 256 segments were 4 decisions
    # long, shorter than the trips it holds (~9) and no longer than its minimum holding time, so the closing step
    # ended every segment trip; 16 segments of ~64 decisions measure the trader the continuous pass shows.
    "h100": {
        "sim": {"n_envs": 1024, "inventory_penalty": 0.1},
        "agent": {"thompson_scale": 0.2, "mirror": True},
        "replay": {"capacity": 65_536},
        "loop": {"n_steps": 5_000, "log_every": 500, "checkpoint_every": 1_000, "compile": "all",
                 "select_frac": 0.2, "max_exposure": 0.6, "min_hold_steps": 4, "keep_margin_frac": 0.0,
                 "exposure_gain": 0.01},
        "eval": {"n_envs": 16},
    },
})
"""Named presets: section -> field -> value, applied over the dataclass defaults."""
PRESET_NAMES = tuple(PRESETS)
DEFAULT_PRESET = "smoke"
"""What `python -m trainer.train` runs without --preset (the workflow template passes its own, h100)."""

FINGERPRINT_EXCLUDED = (
    "loop.n_steps", "loop.log_every", "loop.checkpoint_every", "loop.keep_checkpoints", "loop.mode", "loop.device",
    "loop.grace_seconds", "loop.overlap", "loop.act_sm_share", "folds.chain_wait_seconds", "folds.fold",
)
"""Config fields left out of the checkpoint fingerprint. All but folds.fold may change between attempts without
changing what the run computes (how long, how often it logs or saves, where and how its kernels run: same values).
folds.fold is the fold's identity, not a setting: its checkpoints carry it in their counters (a wrong fold is
refused on load), and chain mode compares fold N's fingerprint with fold N-1's."""

EVALUATION_ONLY = (
    "loop.select_min_net", "loop.select_min_t", "loop.max_exposure", "loop.exposure_gain", "loop.keep_margin_frac",
    "loop.min_hold_steps", "eval.n_envs", "eval.bar_seconds", "eval.day_offset_hours",
)
"""Config fields read only after training, when the trained fold is deployed and evaluated: the stand-aside rule,
the exposure cap and its margin's rules, the evaluation's own settings. They stay in the fingerprint (a resumed run
must evaluate as it was asked to); `python -m trainer.train --evaluate-from FOLD_DIR` re-evaluates a finished fold's
training under other values of these, and of these alone, without training again."""


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
    mode: Mode = "auto"
    """'eager', 'graph' (CUDA graph of the whole step; CUDA only) or 'auto' (graph on CUDA, eager on CPU)."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda[:i]'."""
    compile: Compile = "none"
    """torch.compile inside the step: 'none'; 'sim' (the simulator step: its many small elementwise kernels fuse
    into a few); 'all' (every tensor-only part of the step: acting, simulator, n-step store, replay sampling and
    priorities, the learner's target, loss with its backward, clip and statistics; backward bookkeeping, AdamW and
    Polyak stay eager); 'autotune' ('all' with inductor's max_autotune on CUDA: each matrix product's kernel is
    picked by timing candidates on the device; minutes of compiling with a cold cache; on CPU it compiles as
    'all'). Paid once per process; values match eager to float rounding, not bit for bit, so it is part of the
    checkpoint fingerprint. 'autotune' cannot be deterministic: its picks depend on timings (the compile cache
    keeps them for a retried attempt). Speeds: docs/BENCHMARKS.md."""
    overlap: bool = True
    """In graph mode (CUDA), run acting (act -> simulator -> store) and the learner's double-DQN target forwards on
    side streams, concurrently with the learner's online forward and backward (trainer/loop/step.py). Same values
    either way. Eager steps and deterministic runs keep one stream: an eager step is bound by the host, which the
    side streams cost time (docs/BENCHMARKS.md)."""
    act_sm_share: float = 0.5
    """With `overlap`, the share of the GPU's SMs acting may use while the learner computes (a CUDA green context;
    1.0: all of them), as long as acting is the smaller of the two: at most 4 windows per batch item (beyond that,
    acting gets every SM; trainer/loop/step.py). The learner may use every SM. Half measured best on an H200
    (docs/BENCHMARKS.md). Same values either way."""
    seed: int = 0
    """Seed for torch, numpy and python (--seed also sets sim.seed)."""
    deterministic: bool = False
    """Seeded everything plus torch.use_deterministic_algorithms: a killed-and-resumed run ends bit-identical."""
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
    select_min_t: float = 0.0
    """... and unless the t-statistic of that network's net PnL over the `select_envs` validation segments exceeds
    this, where t is defined (two or more segments with some spread; otherwise the net floor alone decides). 0 adds
    nothing to `select_min_net` 0 (t > 0 exactly when the net is); 2 asks for an edge that held across
    the slice, not one lucky stretch. Neither preset sets it: on a small slice t is too noisy, and 2 would have
    stood aside on 7 of 15 smoke folds that beat the OFI rule (docs/RESULTS.md, "A stricter stand-aside rule")."""
    max_exposure: float = 1.0
    """A cap on the deployed policy's time in market (share of steps holding a position), kept on the held-out slice:
    after selection, the smallest stand-aside margin m >= 0 is found there (trainer/loop/select.py, `calibrate`) for
    which the selected network, deciding greedily with FLAT's E[Q] raised by m (trainer.agent.act.flat_bonus), holds
    a position on at most this share of the slice's steps; out-of-sample evaluation deploys that margin. The policy
    then takes or keeps a position only where it beats going flat by more than m: its most confident calls. A cap,
    never a floor: a policy already under it keeps m = 0, and a fold that stands aside still does. 1.0 turns it
    off; below 1 needs `select_frac` > 0. docs/RESULTS.md §9."""
    exposure_gain: float = 0.0
    """Out of sample, keep the cap causally (trainer/loop/exposure.py): starting from the slice's margin, the margin
    in force at each decision moves by this × (held − max_exposure), held being 1 while the policy holds a position
    at that decision and 0 while flat, and never goes below 0. E[Q] units per step. The margin at a row depends only
    on what the policy did before it, so the cap follows the evaluation window's own exposure instead of the slice's
    (a 130-row slice can be in the market 0.99 of its steps where the window's free policy is 0.65: docs/RESULTS.md
    §10). 0 turns it off (the slice's margin throughout); with `max_exposure` 1 there is no cap to keep and it does
    nothing."""
    keep_margin_frac: float = 1.0
    """Hysteresis of the stand-aside margin: while the policy holds a position, the margin FLAT's E[Q] is raised by is
    this share of the margin a flat policy must clear to open one (the calibrated margin, or the controller's). 1:
    the same margin both ways, so a position closes as soon as its lead over FLAT falls under the entry margin; 0: a
    position, once opened on a lead above the margin, is kept until FLAT scores best outright. Between the two, a
    band between entering and leaving, the no-trade band of a threshold rule. Acts only with a margin
    (`max_exposure` < 1); the calibration and the controller see the policy with it. docs/RESULTS.md §11."""
    min_hold_steps: int = 0
    """The deployed policy keeps every position it opens for at least this many decisions: before that, a decision
    that would end the trip (FLAT, or the opposite side) is sent as HOLD (trainer.agent.act.min_hold; the trip's age
    is the agent-visible time-in-trade column). Unlike `keep_margin_frac` it acts with or without a margin, where the
    calibrated margin is 0 too. 0 (or 1): off. Deployment only, like the cap: training, its exploration and model
    selection do not see it; the calibration and the controller do. docs/RESULTS.md §12."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.select_frac < 1.0:
            raise ValueError(f"LoopConfig.select_frac must be in [0, 1), got {self.select_frac!r}")
        for name in ("select_min_net", "select_min_t"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"LoopConfig.{name} must be finite, got {getattr(self, name)!r}")
        if not 0.0 < self.max_exposure <= 1.0:
            raise ValueError(f"LoopConfig.max_exposure must be in (0, 1], got {self.max_exposure!r}")
        if self.max_exposure < 1.0 and self.select_frac == 0.0:
            raise ValueError(f"LoopConfig.max_exposure={self.max_exposure} is calibrated on the held-out slice: it "
                             f"needs select_frac > 0 (or max_exposure 1: off)")
        if not (math.isfinite(self.exposure_gain) and self.exposure_gain >= 0.0):
            raise ValueError(f"LoopConfig.exposure_gain must be finite and >= 0, got {self.exposure_gain!r}")
        if not 0.0 <= self.keep_margin_frac <= 1.0:
            raise ValueError(f"LoopConfig.keep_margin_frac must be in [0, 1], got {self.keep_margin_frac!r}")
        if self.min_hold_steps < 0:
            raise ValueError(f"LoopConfig.min_hold_steps must be >= 0, got {self.min_hold_steps!r}")
        for name in ("n_steps", "log_every", "checkpoint_every", "select_every", "select_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.learning_starts < 0:
            raise ValueError(f"LoopConfig.learning_starts must be >= 0, got {self.learning_starts!r}")
        if self.keep_checkpoints < 2:
            raise ValueError(f"LoopConfig.keep_checkpoints must be >= 2, got {self.keep_checkpoints!r}")
        if self.mode not in MODES:
            raise ValueError(f"LoopConfig.mode must be one of {MODES}, got {self.mode!r}")
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"LoopConfig.device must be auto, cpu, cuda or cuda:<i>, got {self.device!r}")
        if not 0.0 < self.act_sm_share <= 1.0:
            raise ValueError(f"LoopConfig.act_sm_share must be in (0, 1], got {self.act_sm_share!r}")
        if self.compile not in COMPILE_CHOICES:
            raise ValueError(f"LoopConfig.compile must be one of {COMPILE_CHOICES}, got {self.compile!r}")
        if not (math.isfinite(self.grace_seconds) and self.grace_seconds > 0):
            raise ValueError(f"LoopConfig.grace_seconds must be finite and > 0, got {self.grace_seconds!r}")


@dataclass(frozen=True)
class FoldConfig:
    """Walk-forward geometry: which fold this process trains, and how the timeline is cut."""

    fold: int = 0
    """Fold index N in [0, folds): trains on window N (with `train_window` 'anchored', windows 0..N), evaluates out of
    sample on window N+1."""
    folds: int = 3
    """Number of folds K (K+1 equal windows over the decision timeline)."""
    embargo_rows: int = 0
    """Decision rows left out between consecutive windows (>= 0), so no label horizon leaks across a boundary."""
    train_window: TrainWindow = "rolling"
    """'rolling': fold N trains on window N; 'anchored': on every row from window 0's start to window N's stop (an
    expanding window: fold N trains on windows 0..N, the embargo rows between them included), evaluated on window N+1
    as before. Fold 0 is the same either way. Anchored folds see more data, which helps where the market's rules do
    not change (the synthetic market); on a real market old windows may teach what no longer holds. The
    normaliser, the forecast column and model selection's held-out slice (the window's last `loop.select_frac`)
    follow the training window (docs/walk-forward.md)."""
    fold_mode: FoldMode = "independent"
    """'independent': each fold trains from scratch; 'chain': fold N >= 1 warm-starts from fold N-1's final state
    (trainer/folds/chain.py)."""
    chain_wait_seconds: float = 0.0
    """Chain mode: wait this long for fold N-1's result.json before refusing (exit 2)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.folds, int) and self.folds >= 1):
            raise ValueError(f"FoldConfig.folds must be an int >= 1, got {self.folds!r}")
        if not (isinstance(self.fold, int) and 0 <= self.fold < self.folds):
            raise ValueError(f"FoldConfig.fold must be in [0, folds={self.folds}), got {self.fold!r}")
        if not (isinstance(self.embargo_rows, int) and self.embargo_rows >= 0):
            raise ValueError(f"FoldConfig.embargo_rows must be an int >= 0, got {self.embargo_rows!r}")
        if self.train_window not in TRAIN_WINDOWS:
            raise ValueError(f"FoldConfig.train_window must be one of {TRAIN_WINDOWS}, got {self.train_window!r}")
        if self.fold_mode not in FOLD_MODES:
            raise ValueError(f"FoldConfig.fold_mode must be one of {FOLD_MODES}, got {self.fold_mode!r}")
        if not (math.isfinite(self.chain_wait_seconds) and self.chain_wait_seconds >= 0):
            raise ValueError(f"FoldConfig.chain_wait_seconds must be finite and >= 0, got {self.chain_wait_seconds!r}")


@dataclass(frozen=True)
class EvalConfig:
    """Out-of-sample evaluation of a trained fold (trainer/folds/evaluate.py)."""

    n_envs: int = 256
    """Segment backtests spread over the eval window (capped at the number of usable steps)."""
    bar_seconds: int = 300
    """Bar length of the returns behind Sharpe / Sortino / Calmar (see trainer.folds.metrics)."""
    day_offset_hours: float = 0.0
    """Trading days start at UTC midnight + this (e.g. -2 for CME Globex's 22:00 UTC open); used to count bars per day."""

    def __post_init__(self) -> None:
        if not (isinstance(self.n_envs, int) and self.n_envs >= 1):
            raise ValueError(f"EvalConfig.n_envs must be an int >= 1, got {self.n_envs!r}")
        if not (isinstance(self.bar_seconds, int) and self.bar_seconds >= 1):
            raise ValueError(f"EvalConfig.bar_seconds must be an int >= 1, got {self.bar_seconds!r}")
        if not (math.isfinite(self.day_offset_hours) and -24 < self.day_offset_hours < 24):
            raise ValueError(f"EvalConfig.day_offset_hours must be in (-24, 24), got {self.day_offset_hours!r}")


@dataclass(frozen=True)
class ChainConfig:
    """The fold-boundary treatment of chain mode (trainer/folds/chain.py)."""

    shrink_alpha: float = 0.8
    """α of shrink-and-perturb: θ ← α θ_prev + (1 − α) θ_fresh, in [0, 1] (1 keeps the old weights exactly)."""
    adam_m_scale: float = 0.1
    """Factor on AdamW's first moments (exp_avg) at the fold boundary, in [0, 1]."""
    adam_v_scale: float = 0.01
    """Factor on AdamW's second moments (exp_avg_sq) at the fold boundary, in [0, 1]."""
    seed_stride: int = 1_000_003
    """The fresh initialisation of fold i uses seed + i × seed_stride, so each fold is perturbed differently."""

    def __post_init__(self) -> None:
        for name in ("shrink_alpha", "adam_m_scale", "adam_v_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"ChainConfig.{name} must be in [0, 1], got {v!r}")
        if not (isinstance(self.seed_stride, int) and self.seed_stride >= 1):
            raise ValueError(f"ChainConfig.seed_stride must be an int >= 1, got {self.seed_stride!r}")
