"""A trained fold's out-of-sample result (result.json) and the run's record (run.json).

`evaluate_fold` runs the greedy policy (argmax E[Q]) and the baselines on the evaluation window and returns a
typed `FoldResult`; `FoldResult.to_json()` keeps result.json's keys (trainer/report reads them): the fold's
bookkeeping fields, the evaluation metrics at the top level, and the baselines.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.features.compute import FeatureSet
from trainer.folds.baselines import run_baselines
from trainer.folds.evaluate import evaluate
from trainer.folds.windows import Window as FoldWindow
from trainer.fsutil import atomic_write_text
from trainer.loop.config import TrainConfig
from trainer.loop.fold import FoldTrainer, direction_entropy

__all__ = ["FoldResult", "evaluate_fold", "write_result", "write_run_json"]


@dataclass(frozen=True)
class FoldResult:
    """One fold's outcome; result.json is `to_json()` of this."""

    fold: int
    """Fold index N."""
    folds: int
    """Number of folds K."""
    train_window: tuple[int, int]
    """[start, stop) decision rows trained on."""
    eval_window: tuple[int, int]
    """[start, stop) decision rows evaluated on (out of sample)."""
    metrics: dict[str, Any]
    """The greedy policy's evaluation metrics (trainer.folds.evaluate); flattened into result.json's top level."""
    dir_entropy: float
    """Entropy (nats) of the training-time direction choices."""
    train_win_rate: float
    """Win rate of the round trips closed while training."""
    train_trades: int
    """Round trips closed while training."""
    env_steps: int
    """Loop steps trained (each is n_envs env steps)."""
    update_steps: int
    """Gradient steps taken."""
    transitions: int
    """env_steps x n_envs."""
    weights_sha256: str
    """sha256 of the online network's parameters (bit-identity checks for resume)."""
    feature_key: str
    """fxcache key of the features trained and evaluated on."""
    wall_seconds: float
    """Training wall-clock seconds, summed over attempts."""
    checkpoint_seconds: float
    """Seconds spent writing checkpoints, summed over attempts."""
    fold_mode: str
    """independent or chain."""
    baselines: dict[str, dict[str, Any]]
    """Headline metrics of each baseline policy on the same window (trainer.folds.baselines)."""
    evaluated_from: str | None = None
    """The fold directory whose final checkpoint was evaluated (`--evaluate-from`: another run's training under this
    run's deployment rules); None when this run trained the fold itself."""
    selection: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Model selection on the held-out slice (trainer/loop/select.py; empty when off): select_best_net_pnl,
    select_best_t (t-statistic over the validation segments; None when they had no spread), select_best_step,
    select_validations, select_last_net_pnl, stood_aside, select_rows; with LoopConfig.max_exposure < 1 also what
    Selector.calibrate found (select_margin, select_time_in_market, ...), and with LoopConfig.exposure_gain > 0 the
    margins the out-of-sample controller used (eval_margin_mean, ...: trainer/loop/exposure.py). Flattened into
    result.json's top level."""

    def to_json(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["train_window"], record["eval_window"] = list(self.train_window), list(self.eval_window)
        head = {k: record.pop(k) for k in ("fold", "folds", "train_window", "eval_window")}
        selection = record.pop("selection")
        return {**head, **record.pop("metrics"), **record, **selection}  # the precedence result.json always had


def evaluate_fold(trainer: FoldTrainer, fs: FeatureSet, cfg: TrainConfig, train_w: FoldWindow, eval_w: FoldWindow,
                  checkpoint_seconds: float, names: list[str] | None = None,
                  evaluated_from: str | None = None) -> tuple[FoldResult, np.ndarray]:
    """Greedy (argmax E[Q]) out-of-sample evaluation of the trained fold on `eval_w`, plus the baselines; returns
    the result and the continuous-pass equity curve (currency, one point per decision step). `names`: the names of
    the trainer's input columns (trainer.loop.fold.fold_inputs), fs.names when None. `evaluated_from`: recorded in
    the result (FoldResult.evaluated_from)."""
    greedy = trainer.deployed_policy()  # the selected weights, or always FLAT when selection stood aside

    window = trainer.agent_cfg.window
    names = fs.names if names is None else names
    baselines = run_baselines(names, trainer.features, fs.decision, cfg.sim, window, eval_w.start, eval_w.stop,
                              cfg.eval, seed=cfg.loop.seed)
    res = evaluate(greedy, trainer.policy_features, fs.decision, cfg.sim, window, eval_w.start, eval_w.stop,
                   cfg=cfg.eval)
    train_stats = {k: float(v) for k, v in trainer.sim.stats(trainer.state).items()}  # host sync, once
    result = FoldResult(
        fold=cfg.folds.fold, folds=cfg.folds.folds,
        train_window=(train_w.start, train_w.stop), eval_window=(eval_w.start, eval_w.stop),
        metrics=res.metrics, dir_entropy=float(direction_entropy(trainer.dir_counts)),
        train_win_rate=train_stats["win_rate"], train_trades=int(train_stats["round_trips"]),
        env_steps=trainer.env_step, update_steps=trainer.update_step,
        transitions=trainer.env_step * cfg.sim.n_envs, weights_sha256=trainer.weights_hash, feature_key=fs.key,
        wall_seconds=round(trainer.wall_seconds, 3), checkpoint_seconds=round(checkpoint_seconds, 3),
        fold_mode=cfg.folds.fold_mode, baselines=baselines, evaluated_from=evaluated_from,
        selection={**trainer.selection_summary(), **(greedy.summary() if hasattr(greedy, "summary") else {})})
    return result, res.equity


def write_result(fold_dir: Path, result: FoldResult, equity: np.ndarray) -> dict[str, Any]:
    """RUN/fold<N>/equity.npy (the continuous-pass equity curve, for the report), then result.json, atomically:
    its presence marks the fold done. Returns result.json's content."""
    record = result.to_json()
    np.save(fold_dir / "equity.npy", equity)
    atomic_write_text(fold_dir / "result.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def write_run_json(run_dir: Path, cfg: TrainConfig, fs: FeatureSet, trainer: FoldTrainer,
                   fees: dict | None = None, names: list[str] | None = None) -> dict:
    """RUN/run.json, once per run (the first fold to get here writes it): the resolved config without the fold
    index (the folds share it), the input columns' names (`names`, fs.names when None), the instrument, the venue
    fee schedule the simulator charged (`fees`, trainer.data.fees.venue_fees; absent with SimConfig.fees='manual')
    and the versions."""
    config = cfg.to_dict()
    config["folds"].pop("fold")
    info = {"config": config,
            "agent": dataclasses.asdict(trainer.agent_cfg),
            "feature_key": fs.key, "feature_names": list(fs.names if names is None else names),
            "instrument": dataclasses.asdict(fs.instrument),
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
            "data_fingerprint": hashlib.sha256(fs.key.encode()).hexdigest()}
    if fees is not None:
        info["fees"] = fees
    path = run_dir / "run.json"
    if not path.exists():
        atomic_write_text(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    return info
