"""Controllers (the "ISV bus"): running statistics of the learner, kept in one small on-device
float tensor, that set the learning rate, the adaptive gradient clip and the target tau for the
next update. Pure tensor math inside the update: no host round-trips, CUDA-graph capturable
(every write is in place into the same persistent tensors).

Statistics (EMAs; "debiased" ones divide by 1 - (1 - α)^t as Adam does, so they are usable from
the first update):
  grad_fast     fast EMA of the gradient norm, NOT debiased: it restarts at 0 after
                `reset_for_new_fold()`, and its ramp back up to the slow EMA is the fold warm-up.
  grad_slow     slow EMA of the gradient norm (debiased; persists across folds).
  q_mag         EMA of |batch mean Q| (debiased).
  q_drift       EMA of |Δ batch mean Q| between consecutive updates (debiased; reset per fold).
  reward_scale  EMA of the batch mean |n-step return| (debiased).
Gradient norms enter the EMAs capped at the clip in force, so one exploding batch cannot drag the
clip up with it; non-finite norms are skipped (the kill monitor reports them).

Controls for the next update:
  warm-up f  = clamp(grad_fast / grad_slow, 0, 1) while a fold warm-up is active (it switches off
               the first time f reaches 1), else 1.
  drift damp = clamp(drift_ref / (q_drift / scale), 0, 1), scale = max(q_mag, reward_scale, 1e-3 (V_MAX - V_MIN)):
               Q moving faster than drift_ref (relative, per update) slows both learning and the target.
  lr   = lr_base  · max(0.05, f) · max(drift_lr_floor, damp)
  clip = clamp(clip_k · grad_slow, clip_min, clip_max) · (0.1 + 0.9 f)     (clip_init before any data)
  tau  = tau_base · max(drift_tau_floor, damp)
With `adaptive=False` the controls stay at lr_base, clip_init, tau_base (statistics still update).
"""
from __future__ import annotations

import torch
from torch import Tensor

from trainer.agent.config import AgentConfig

# Slots of the state vector.
GRAD_FAST, GRAD_SLOW, GRAD_SLOW_W = 0, 1, 2
Q_MAG, REWARD_SCALE, STAT_W = 3, 4, 5
Q_PREV, Q_DRIFT, DRIFT_W, DRIFT_SEEN = 6, 7, 8, 9
WARMUP_ACTIVE, WARMUP_FACTOR = 10, 11
LR, CLIP, TAU = 12, 13, 14
N_SLOTS = 15
SLOT_NAMES = ("grad_fast", "grad_slow", "grad_slow_w", "q_mag", "reward_scale", "stat_w", "q_prev", "q_drift",
              "drift_w", "drift_seen", "warmup_active", "warmup_factor", "lr", "clip", "tau")


class Controllers:
    """Owns `state` (N_SLOTS,) float32 and `lr` (0-dim, the tensor AdamW reads), both on `device`."""

    def __init__(self, cfg: AgentConfig, device: torch.device | str, adaptive: bool = True):
        self.cfg, self.adaptive = cfg, adaptive
        self.state = torch.zeros(N_SLOTS, dtype=torch.float32, device=device)
        self.state[WARMUP_FACTOR] = 1.0
        self.state[LR], self.state[CLIP], self.state[TAU] = cfg.lr, cfg.clip_init, cfg.tau
        self.lr = torch.tensor(cfg.lr, dtype=torch.float32, device=device)  # 0-dim: AdamW's lr

    # Views into the state vector (0-dim tensors on the device; reading them is not a sync).
    @property
    def clip(self) -> Tensor:
        return self.state[CLIP]

    @property
    def tau(self) -> Tensor:
        return self.state[TAU]

    @property
    def warmup_factor(self) -> Tensor:
        return self.state[WARMUP_FACTOR]

    def _clip_base(self, grad_slow: Tensor, grad_slow_w: Tensor) -> Tensor:
        """clamp(clip_k · debiased slow EMA, clip_min, clip_max), or clip_init before any gradient."""
        cfg = self.cfg
        slow_hat = grad_slow / grad_slow_w.clamp_min(1e-12)
        return torch.where(grad_slow_w > 0, (cfg.clip_k * slow_hat).clamp(cfg.clip_min, cfg.clip_max),
                           torch.full_like(slow_hat, cfg.clip_init))

    def observe(self, grad_norm: Tensor, q_mean: Tensor, reward_abs_mean: Tensor) -> None:
        """Fold one update's statistics in and set lr / clip / tau for the next update.

        grad_norm: 0-dim total gradient norm before clipping; q_mean: 0-dim batch mean E[Q] of the
        taken actions; reward_abs_mean: 0-dim batch mean |n-step return|. Tensor math only."""
        cfg, s = self.cfg, self.state
        a_fast, a_slow, a_stat = cfg.grad_ema_fast, cfg.grad_ema_slow, cfg.stat_ema

        # Gradient-norm EMAs (skip non-finite norms; cap at the clip that was in force).
        g_ok = torch.isfinite(grad_norm)
        g = torch.where(g_ok, torch.minimum(grad_norm, s[CLIP]), 0.0)
        grad_fast = torch.where(g_ok, s[GRAD_FAST] + a_fast * (g - s[GRAD_FAST]), s[GRAD_FAST])
        grad_slow = torch.where(g_ok, s[GRAD_SLOW] + a_slow * (g - s[GRAD_SLOW]), s[GRAD_SLOW])
        grad_slow_w = torch.where(g_ok, s[GRAD_SLOW_W] + a_slow * (1.0 - s[GRAD_SLOW_W]), s[GRAD_SLOW_W])
        slow_hat = grad_slow / grad_slow_w.clamp_min(1e-12)

        # Q and reward statistics (skip a non-finite batch).
        q_ok = torch.isfinite(q_mean) & torch.isfinite(reward_abs_mean)
        q = torch.where(q_ok, q_mean, s[Q_PREV])
        q_mag = torch.where(q_ok, s[Q_MAG] + a_stat * (q.abs() - s[Q_MAG]), s[Q_MAG])
        reward_scale = torch.where(q_ok, s[REWARD_SCALE] + a_stat * (reward_abs_mean - s[REWARD_SCALE]),
                                   s[REWARD_SCALE])
        stat_w = torch.where(q_ok, s[STAT_W] + a_stat * (1.0 - s[STAT_W]), s[STAT_W])
        # Drift needs a previous Q from this fold: the first update after a reset only records it.
        d_ok = q_ok & (s[DRIFT_SEEN] > 0)
        q_drift = torch.where(d_ok, s[Q_DRIFT] + a_stat * ((q - s[Q_PREV]).abs() - s[Q_DRIFT]), s[Q_DRIFT])
        drift_w = torch.where(d_ok, s[DRIFT_W] + a_stat * (1.0 - s[DRIFT_W]), s[DRIFT_W])
        drift_seen = torch.where(q_ok, torch.ones_like(s[DRIFT_SEEN]), s[DRIFT_SEEN])

        # Fold warm-up factor.
        f_raw = torch.where(slow_hat > 0, (grad_fast / slow_hat.clamp_min(1e-12)).clamp(0.0, 1.0),
                            torch.ones_like(slow_hat))
        warmup_active = s[WARMUP_ACTIVE] * (f_raw < 0.999).float()
        f = torch.where(warmup_active > 0, f_raw, torch.ones_like(f_raw))

        # Drift damping.
        scale = (torch.maximum(q_mag, reward_scale) / stat_w.clamp_min(1e-12)).clamp_min(1e-3 * (cfg.v_max - cfg.v_min))
        rel_drift = q_drift / drift_w.clamp_min(1e-12) / scale
        damp = (cfg.drift_ref / rel_drift.clamp_min(1e-12)).clamp(0.0, 1.0)

        if self.adaptive:
            lr = cfg.lr * f.clamp_min(0.05) * damp.clamp_min(cfg.drift_lr_floor)
            clip = self._clip_base(grad_slow, grad_slow_w) * (0.1 + 0.9 * f)
            tau = cfg.tau * damp.clamp_min(cfg.drift_tau_floor)
        else:
            lr, clip, tau = s[LR], s[CLIP], s[TAU]

        s.copy_(torch.stack([grad_fast, grad_slow, grad_slow_w, q_mag, reward_scale, stat_w, q, q_drift, drift_w,
                             drift_seen, warmup_active, f, lr, clip, tau]))
        self.lr.copy_(s[LR])

    def reset_for_new_fold(self) -> None:
        """Start a fold warm-up: the fast gradient EMA and the drift window restart; the slow EMA,
        Q magnitude and reward scale persist. Until the fast EMA catches up with the slow one, lr
        is damped by max(0.05, f) and the clip by (0.1 + 0.9 f)."""
        s = self.state
        for slot in (GRAD_FAST, Q_DRIFT, DRIFT_W, DRIFT_SEEN):
            s[slot] = 0.0
        s[WARMUP_ACTIVE] = 1.0
        if self.adaptive:
            # The first update of the fold already runs at the warm-up floor.
            s[WARMUP_FACTOR] = 0.0
            s[LR] = self.cfg.lr * 0.05
            s[CLIP] = self._clip_base(s[GRAD_SLOW], s[GRAD_SLOW_W]) * 0.1
            self.lr.copy_(s[LR])

    def named_stats(self) -> dict[str, Tensor]:
        """Every slot as a 0-dim device tensor, for logging (reading them is the caller's sync)."""
        return {name: self.state[i] for i, name in enumerate(SLOT_NAMES)}

    def state_dict(self) -> dict[str, Tensor]:
        return {"state": self.state.detach().clone(), "lr": self.lr.detach().clone()}

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Copies in place, so a captured CUDA graph and the optimiser keep pointing at the same tensors."""
        if sd["state"].shape != self.state.shape:
            raise ValueError(f"controller state has shape {tuple(sd['state'].shape)}, expected {(N_SLOTS,)}")
        self.state.copy_(sd["state"])
        self.lr.copy_(sd["lr"])
