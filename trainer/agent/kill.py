"""Kill criteria: state on the device, updated by tensor math inside every update (`observe`),
read on the host only when the loop calls `check()` at log time (the one host sync).

Criteria (reason tags of trainer.errors.KillCriterion):
  'non_finite'     the loss or the gradient norm was NaN/inf in any update since the start (sticky flag).
  'q_drift'        the mean Q of the latest log interval is an outlier against the rolling window of
                   earlier interval means: |q - median| > kill_mad_k · max(MAD, mad_floor) (MAD
                   scaled to a σ estimate, ×1.4826, so k = 4 means ~4σ; mad_floor =
                   max(kill_mad_floor, kill_mad_floor_rel · |median|)), once the
                   window holds >= kill_warmup_samples earlier samples, and |q| is above the adaptive
                   magnitude floor max(kill_q_floor, kill_q_floor_return_mult · mean |n-step return|).
                   The floor keeps noise around Q ≈ 0 from firing; the MAD makes it scale-free.
  'grad_collapse'  kill_collapse_updates consecutive gradient norms below kill_collapse_eps, after
                   kill_warmup_updates updates (sticky flag).
"""
from __future__ import annotations

import torch
from torch import Tensor

from trainer.agent.config import AgentConfig
from trainer.errors import KillCriterion

# Slots of the accumulator (float64: counts stay exact far past 2^24 updates).
NON_FINITE, COLLAPSED, UPDATES, ZERO_RUN, Q_SUM, RET_SUM, N_INTERVAL = range(7)
N_SLOTS = 7
MAD_TO_SIGMA = 1.4826  # 1 / Φ⁻¹(3/4): MAD of a normal sample × this estimates its σ


class KillMonitor:
    def __init__(self, cfg: AgentConfig, device: torch.device | str):
        self.cfg = cfg
        self.acc = torch.zeros(N_SLOTS, dtype=torch.float64, device=device)
        self.window = torch.full((cfg.kill_window,), float("nan"), dtype=torch.float64, device=device)
        self.window_pos = torch.zeros((), dtype=torch.int64, device=device)

    def observe(self, loss: Tensor, grad_norm: Tensor, q_mean: Tensor, reward_abs_mean: Tensor) -> None:
        """Record one update (0-dim tensors). Tensor math only: graph capturable, no sync."""
        cfg, a = self.cfg, self.acc
        loss, grad_norm = loss.double(), grad_norm.double()
        q_mean, reward_abs_mean = q_mean.double(), reward_abs_mean.double()
        non_finite = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        updates = a[UPDATES] + 1.0
        # NaN < eps is False, so a NaN gradient breaks a collapse run (it is reported as non_finite).
        zero_run = (a[ZERO_RUN] + 1.0) * (grad_norm < cfg.kill_collapse_eps).double()
        collapsed = (zero_run >= cfg.kill_collapse_updates) & (updates >= cfg.kill_warmup_updates)
        q_ok = torch.isfinite(q_mean) & torch.isfinite(reward_abs_mean)
        a.copy_(torch.stack([
            torch.maximum(a[NON_FINITE], non_finite.double()),
            torch.maximum(a[COLLAPSED], collapsed.double()),
            updates,
            zero_run,
            a[Q_SUM] + torch.where(q_ok, q_mean, 0.0),
            a[RET_SUM] + torch.where(q_ok, reward_abs_mean, 0.0),
            a[N_INTERVAL] + q_ok.double(),
        ]))

    def check(self) -> dict[str, float]:
        """Close the log interval: push its mean Q into the window and test every criterion.

        HOST SYNC (one `.tolist()`): call at log intervals only. Raises KillCriterion; otherwise
        returns the interval's statistics for the log line."""
        cfg, a = self.cfg, self.acc
        n = a[N_INTERVAL].clone()  # the slot is zeroed below, before the report is read
        have_q = n > 0
        q = a[Q_SUM] / n.clamp_min(1.0)
        ret = a[RET_SUM] / n.clamp_min(1.0)
        history = self.window
        n_hist = (~torch.isnan(history)).sum()
        median = torch.nanmedian(history)  # NaN while the window is empty: every comparison is False
        # Normal-consistent MAD (σ̂ = 1.4826 · raw MAD): with the raw MAD, 4 × MAD is only 2.7σ and
        # pure Gaussian noise would fire on ~0.7 % of log intervals.
        mad = MAD_TO_SIGMA * torch.nanmedian((history - median).abs())
        mad_floor = torch.clamp_min(cfg.kill_mad_floor_rel * median.abs(), cfg.kill_mad_floor)
        q_floor = torch.clamp_min(cfg.kill_q_floor_return_mult * ret, cfg.kill_q_floor)
        drift = (have_q & (n_hist >= cfg.kill_warmup_samples)
                 & ((q - median).abs() > cfg.kill_mad_k * torch.maximum(mad, mad_floor))
                 & (q.abs() > q_floor))
        # Push this interval's mean (only if it had updates) and start the next interval.
        slot = self.window_pos % cfg.kill_window
        self.window[slot] = torch.where(have_q, q, self.window[slot])
        self.window_pos.add_(have_q.long())
        a[Q_SUM], a[RET_SUM], a[N_INTERVAL] = 0.0, 0.0, 0.0
        report = torch.stack([a[NON_FINITE], a[COLLAPSED], drift.double(), q, median, torch.maximum(mad, mad_floor),
                              q_floor, a[ZERO_RUN], a[UPDATES], n]).tolist()  # HOST SYNC: the only one per interval
        non_finite, collapsed, drift_hit, q, median, mad, q_floor, zero_run, updates, n = report
        if non_finite:
            raise KillCriterion("non_finite",
                                f"non-finite loss or gradient norm within the first {updates:.0f} updates")
        if collapsed:
            raise KillCriterion("grad_collapse", f"{zero_run:.0f} consecutive gradient norms below "
                                f"{cfg.kill_collapse_eps:g} (at update {updates:.0f})")
        if drift_hit:
            raise KillCriterion("q_drift", f"interval mean Q {q:.4g} vs rolling median {median:.4g}: deviation "
                                f"> {cfg.kill_mad_k:g} x max(MAD, floor) = {cfg.kill_mad_k * mad:.3g} and |Q| > "
                                f"floor {q_floor:.3g}")
        return {"q_interval_mean": q, "q_median": median, "q_mad": mad, "updates": updates,
                "interval_updates": n}

    def state_dict(self) -> dict[str, Tensor]:
        return {"acc": self.acc.detach().clone(), "window": self.window.detach().clone(),
                "window_pos": self.window_pos.detach().clone()}

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Copies in place (the tensors may be captured in a CUDA graph)."""
        if sd["window"].shape != self.window.shape or sd["acc"].shape != self.acc.shape:
            raise ValueError(f"kill state shapes {tuple(sd['acc'].shape)}, {tuple(sd['window'].shape)} do not "
                             f"match ({N_SLOTS},), ({self.cfg.kill_window},)")
        self.acc.copy_(sd["acc"])
        self.window.copy_(sd["window"])
        self.window_pos.copy_(sd["window_pos"])
