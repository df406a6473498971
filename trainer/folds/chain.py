"""Warm-start chain (`--fold-mode chain`): fold i starts from fold i-1's final state, with the fold-boundary treatment.

The boundary treatment (the seed system's), applied once, before fold i's first step:
  1. shrink-and-perturb the online network toward a fresh initialisation: θ ← α θ_prev + (1 − α) θ_fresh, α = 0.8
     (θ_fresh is a new init drawn from a fold-specific seed); the target network is then set to the new online
     network (a stale target would pull Q back toward the previous fold's values);
  2. AdamW moments scaled m ← 0.1 m, v ← 0.01 v, and the bias-correction step restarted (step ← 0): the first
     update divides by (1 − β^t) afresh, so the damped old moments still dominate the new gradients early on and
     the first steps are small;
  3. replay cleared (the new fold's replay and n-step accumulator start empty: transitions of window i-1 are not
     the new fold's data);
  4. per-fold controller and kill-criterion state reset: the Q-drift window, the gradient-collapse counter and the
     rest of the kill accumulator start empty; `Controllers.reset_for_new_fold` restarts the fast grad-norm EMA and
     the drift statistics (the slow grad-norm EMA, Q magnitude and reward scale persist);
  5. the warm-up factor f = clamp(fast / slow grad-norm EMA, 0, 1) then damps lr by max(0.05, f) and the clip by
     (0.1 + 0.9 f) over the fold's first updates (computed inside `Controllers.observe`, on the device).

fold i's own checkpoints take precedence: a restarted chain fold resumes from them and does not warm-start again.
The previous fold's final state is its newest valid checkpoint in RUN/fold<i-1>/, read only once fold i-1 has
written result.json (the fold is finished); otherwise fold i refuses (InputError → exit 2) after an optional wait.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from trainer.agent.kill import KillMonitor
from trainer.agent.learner import Learner
from trainer.agent.network import QNetwork
from trainer.checkpoint.store import fingerprint_mismatch, latest_valid
from trainer.checkpoint.tensors import decode_json, decode_tensors
from trainer.errors import InputError
from trainer.settings import ChainConfig  # defined with the torch-free sections of the config tree
from trainer.folds import layout


def previous_fold_dir(run_dir: Path, fold: int, replica: int = 0) -> Path:
    """Fold i-1's directory of the same seed index: a seed replica chains through its own folds only."""
    if fold < 1:
        raise ValueError(f"chain mode: fold {fold} has no previous fold (fold 0 trains from scratch)")
    return layout.fold_dir(run_dir, fold - 1, replica)


def wait_for_previous(run_dir: Path, fold: int, wait_seconds: float = 0.0, poll_seconds: float = 2.0,
                      sleep: Callable[[float], None] = time.sleep, replica: int = 0) -> Path:
    """RUN/fold<i-1>/result.json once it exists (polling up to `wait_seconds`); InputError if it never appears."""
    result = previous_fold_dir(run_dir, fold, replica) / "result.json"
    deadline = time.monotonic() + max(wait_seconds, 0.0)
    while not result.exists():
        if time.monotonic() >= deadline:
            raise InputError(result, None, f"chain mode: fold {fold} starts from fold {fold - 1}'s final state, but "
                             f"fold {fold - 1} has not finished (no result.json"
                             f"{f' after waiting {wait_seconds:g} s' if wait_seconds > 0 else ''}); run fold "
                             f"{fold - 1} first or use --fold-mode independent")
        sleep(min(poll_seconds, max(deadline - time.monotonic(), 0.0)))
    return result


def load_final_state(run_dir: Path, fold: int, fingerprint: dict | None = None,
                     device: torch.device | str = "cpu", replica: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """State sections of fold i-1's newest valid checkpoint (its final state once result.json exists).

    `fingerprint` (this fold's; trainer.train.fingerprint) must match the checkpoint's: same config, data and
    tensor layout, else InputError naming the differing fields."""
    prev = previous_fold_dir(run_dir, fold, replica)
    ckpt = latest_valid(prev, log=lambda p, why: None)
    if ckpt is None:
        raise InputError(prev, None, f"chain mode: fold {fold - 1} finished but has no valid checkpoint to start from")
    meta = decode_json(ckpt.sections["meta"])
    if meta.get("fold") != fold - 1:
        raise InputError(ckpt.path, None, f"chain mode: checkpoint belongs to fold {meta.get('fold')}, expected {fold - 1}")
    if fingerprint is not None:
        differing = fingerprint_mismatch(fingerprint, meta["fingerprint"])
        if differing:
            raise InputError(ckpt.path, None, f"chain mode: fold {fold - 1} was trained with a different config, data "
                             f"or tensor layout ({', '.join(differing[:5])})")
    return {name.split("/", 1)[1]: decode_tensors(data, device=device)
            for name, data in ckpt.sections.items() if name.startswith("state/")}


@torch.no_grad()
def shrink_perturb(net: torch.nn.Module, fresh: torch.nn.Module, alpha: float) -> None:
    """θ ← α θ + (1 − α) θ_fresh for every parameter, in place (buffers are constants: left alone)."""
    for p, q in zip(net.parameters(), fresh.parameters(), strict=True):
        p.mul_(alpha).add_(q.to(p.device, p.dtype), alpha=1.0 - alpha)


@torch.no_grad()
def damp_adam_moments(optimizer: torch.optim.Optimizer, m_scale: float, v_scale: float) -> int:
    """m ← m_scale·m, v ← v_scale·v, step ← 0 for every parameter with AdamW state; returns how many had state."""
    n = 0
    for state in optimizer.state.values():
        if "exp_avg" not in state:
            continue
        state["exp_avg"].mul_(m_scale)
        state["exp_avg_sq"].mul_(v_scale)
        state["step"].zero_()  # a tensor (0-dim) in PyTorch >= 1.12, on the device when capturable
        n += 1
    return n


@torch.no_grad()
def reset_kill_state(kill: KillMonitor) -> None:
    """Empty Q-drift window, zero collapse counter and interval accumulators: the state of a fresh KillMonitor,
    copied in place (so any state a later KillMonitor grows is reset too, and captured graphs stay valid)."""
    kill.load_state_dict(KillMonitor(kill.cfg, kill.acc.device).state_dict())


def fresh_network(learner: Learner, seed: int) -> QNetwork:
    """A new initialisation of the learner's network from `seed`, without touching the global RNG streams."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return QNetwork(learner.cfg)  # on the CPU; shrink_perturb moves each tensor


def fold_boundary(learner: Learner, previous: dict[str, torch.Tensor], fold: int, seed: int,
                  cfg: ChainConfig = ChainConfig()) -> dict[str, float]:
    """Load fold i-1's learner state into `learner` and apply the boundary treatment (module docstring, 1, 2, 4, 5).

    `learner` must be freshly built for fold i (its replay is the caller's, and starts empty). Returns a few numbers
    for the log line."""
    learner.load_state_dict(previous)
    fresh = fresh_network(learner, seed + fold * cfg.seed_stride)
    shrink_perturb(learner.online, fresh, cfg.shrink_alpha)
    learner.target.load_state_dict(learner.online.state_dict())
    n_adam = damp_adam_moments(learner.optimizer, cfg.adam_m_scale, cfg.adam_v_scale)
    reset_kill_state(learner.kill)
    learner.controllers.reset_for_new_fold()
    learner.update_step.zero_()
    return {"shrink_alpha": cfg.shrink_alpha, "adam_params": n_adam,
            "grad_slow": float(learner.controllers.state[1]),  # host sync, once per fold
            "lr": float(learner.controllers.lr)}


def warm_start(trainer, run_dir: Path, fingerprint: dict | None, cfg: ChainConfig = ChainConfig(),
               replica: int = 0) -> dict:
    """Chain-mode start of a fresh FoldTrainer for fold i >= 1 (called by trainer.train when no own checkpoint exists).

    Only the learner section is carried over: replay, n-step ring, simulator state and counters are fold i's own,
    freshly built (the replay clear of the boundary treatment)."""
    state = load_final_state(run_dir, trainer.fold, fingerprint, device=trainer.device, replica=replica)
    info = fold_boundary(trainer.learner, state["learner"], trainer.fold, trainer.cfg.loop.seed, cfg)
    return {"from": str(previous_fold_dir(run_dir, trainer.fold, replica)), "replay_size": int(trainer.replay.size),
            **info}
