"""Controllers: the tensor implementation against a plain-Python reference of the documented
formulas, plus the behaviours the loop relies on (clip from the slow EMA, spikes capped, fold
warm-up, drift damping, state round-trip in place)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.controllers import Controllers


def cfg_(**kw) -> AgentConfig:
    return AgentConfig(n_features=2, env_state_dim=1, **kw)


class ReferenceControllers:
    """The module docstring's formulas, one Python float at a time."""

    def __init__(self, cfg: AgentConfig):
        self.c = cfg
        self.fast = self.slow = self.slow_w = 0.0
        self.q_mag = self.reward = self.stat_w = 0.0
        self.q_prev = self.drift = self.drift_w = 0.0
        self.seen = False
        self.active = False
        self.lr, self.clip, self.tau = cfg.lr, cfg.clip_init, cfg.tau

    def clip_base(self) -> float:
        if self.slow_w == 0:
            return self.c.clip_init
        return min(max(self.c.clip_k * self.slow / self.slow_w, self.c.clip_min), self.c.clip_max)

    def observe(self, g: float, q: float, r: float) -> None:
        c = self.c
        if math.isfinite(g):
            g = min(g, self.clip)
            self.fast += c.grad_ema_fast * (g - self.fast)
            self.slow += c.grad_ema_slow * (g - self.slow)
            self.slow_w += c.grad_ema_slow * (1 - self.slow_w)
        self.q_mag += c.stat_ema * (abs(q) - self.q_mag)
        self.reward += c.stat_ema * (r - self.reward)
        self.stat_w += c.stat_ema * (1 - self.stat_w)
        if self.seen:
            self.drift += c.stat_ema * (abs(q - self.q_prev) - self.drift)
            self.drift_w += c.stat_ema * (1 - self.drift_w)
        self.q_prev, self.seen = q, True
        slow_hat = self.slow / self.slow_w if self.slow_w > 0 else 0.0
        f = min(max(self.fast / slow_hat, 0.0), 1.0) if slow_hat > 0 else 1.0
        self.active = self.active and f < 0.999
        f = f if self.active else 1.0
        scale = max(max(self.q_mag, self.reward) / self.stat_w, 1e-3 * (c.v_max - c.v_min))
        rel = (self.drift / self.drift_w if self.drift_w > 0 else 0.0) / scale
        damp = min(max(c.drift_ref / max(rel, 1e-12), 0.0), 1.0)
        self.lr = c.lr * max(0.05, f) * max(c.drift_lr_floor, damp)
        self.clip = self.clip_base() * (0.1 + 0.9 * f)
        self.tau = c.tau * max(c.drift_tau_floor, damp)

    def reset_for_new_fold(self) -> None:
        self.fast = self.drift = self.drift_w = 0.0
        self.seen, self.active = False, True
        self.lr, self.clip = self.c.lr * 0.05, self.clip_base() * 0.1


def test_controllers_match_the_python_reference_through_a_fold_reset():
    cfg = cfg_()
    ctl, ref = Controllers(cfg, "cpu"), ReferenceControllers(cfg)
    rng = random.Random(0)
    q = 0.0
    for step in range(400):
        if step == 250:
            ctl.reset_for_new_fold()
            ref.reset_for_new_fold()
        g = abs(rng.gauss(2.0, 0.5)) * (30.0 if step % 97 == 5 else 1.0)  # occasional spikes
        g = float("nan") if step == 123 else g
        q += rng.gauss(0.01, 0.05)
        r = abs(rng.gauss(0.5, 0.2))
        ctl.observe(torch.tensor(g), torch.tensor(q), torch.tensor(r))
        ref.observe(g, q, r)
        got = ctl.state
        assert math.isclose(float(got[12]), ref.lr, rel_tol=1e-4), step
        assert math.isclose(float(got[13]), ref.clip, rel_tol=1e-4), step
        assert math.isclose(float(got[14]), ref.tau, rel_tol=1e-4), step
        assert float(ctl.lr) == float(got[12])


def test_clip_is_k_times_the_debiased_slow_grad_norm_from_the_first_update():
    cfg = cfg_(clip_k=3.0, clip_init=10.0)
    ctl = Controllers(cfg, "cpu")
    assert float(ctl.clip) == 10.0
    for _ in range(5):
        ctl.observe(torch.tensor(2.0), torch.tensor(0.0), torch.tensor(1.0))
    assert math.isclose(float(ctl.clip), 6.0, rel_tol=1e-5)


def test_a_gradient_spike_enters_the_statistics_capped_at_the_clip():
    cfg = cfg_(clip_k=3.0)
    ctl = Controllers(cfg, "cpu")
    for _ in range(50):
        ctl.observe(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(1.0))
    before = float(ctl.clip)
    ctl.observe(torch.tensor(1e6), torch.tensor(0.0), torch.tensor(1.0))
    # The spike counts as 3.0 (the clip in force), so the debiased slow EMA moves from 1 to
    # 1 + 0.01 (3 - 1) / w, w = 1 - 0.99^51 its debiasing weight; the clip is 3x that.
    w = 1 - 0.99 ** 51
    assert math.isclose(before, 3.0, rel_tol=1e-5)
    assert math.isclose(float(ctl.clip), 3.0 * (1 + 0.02 / w), rel_tol=1e-4)


def test_clip_is_clamped_to_its_bounds():
    ctl = Controllers(cfg_(clip_min=0.5, clip_max=4.0), "cpu")
    for _ in range(200):
        ctl.observe(torch.tensor(1e-4), torch.tensor(0.0), torch.tensor(1.0))
    assert math.isclose(float(ctl.clip), 0.5, rel_tol=1e-6)


def test_fold_reset_warms_lr_and_clip_up_and_keeps_the_slow_ema():
    cfg = cfg_(lr=1e-3)
    ctl = Controllers(cfg, "cpu")
    for _ in range(300):
        ctl.observe(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(1.0))
    settled_clip = float(ctl.clip)
    slow = float(ctl.state[1])
    ctl.reset_for_new_fold()
    assert math.isclose(float(ctl.lr), 0.05e-3, rel_tol=1e-5)
    assert math.isclose(float(ctl.clip), 0.1 * settled_clip, rel_tol=1e-5)
    assert float(ctl.state[0]) == 0.0 and float(ctl.state[1]) == slow
    lrs, factors = [], []
    for _ in range(100):
        ctl.observe(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(1.0))
        lrs.append(float(ctl.lr))
        factors.append(float(ctl.warmup_factor))
    assert all(b >= a for a, b in zip(lrs, lrs[1:]))  # monotone ramp
    assert lrs[0] < 0.2e-3 and math.isclose(lrs[-1], 1e-3, rel_tol=1e-5)
    assert factors[-1] == 1.0 and float(ctl.state[10]) == 0.0  # warm-up switched itself off


def test_fast_q_drift_damps_tau_and_lr_to_their_floors_and_steady_q_does_not():
    cfg = cfg_(tau=0.01, lr=1e-3, drift_tau_floor=0.1, drift_lr_floor=0.25)
    steady, drifting = Controllers(cfg, "cpu"), Controllers(cfg, "cpu")
    for i in range(300):
        steady.observe(torch.tensor(1.0), torch.tensor(1.0 + 1e-4 * i), torch.tensor(1.0))
        drifting.observe(torch.tensor(1.0), torch.tensor(1.2 ** i), torch.tensor(1.0))  # diverging: 20 %/update
    assert math.isclose(float(steady.tau), 0.01, rel_tol=1e-6)
    assert math.isclose(float(steady.lr), 1e-3, rel_tol=1e-6)
    assert math.isclose(float(drifting.tau), 0.001, rel_tol=1e-5)
    assert math.isclose(float(drifting.lr), 0.25e-3, rel_tol=1e-5)


def test_non_adaptive_controllers_hold_the_base_values():
    cfg = cfg_(tau=0.02, lr=3e-4, clip_init=7.0)
    ctl = Controllers(cfg, "cpu", adaptive=False)
    for i in range(50):
        ctl.observe(torch.tensor(100.0), torch.tensor(float(i)), torch.tensor(1.0))
    ctl.reset_for_new_fold()
    assert (float(ctl.lr), float(ctl.clip), float(ctl.tau)) == pytest.approx((3e-4, 7.0, 0.02))


def test_state_dict_round_trip_restores_in_place():
    cfg = cfg_()
    a, b = Controllers(cfg, "cpu"), Controllers(cfg, "cpu")
    for i in range(20):
        a.observe(torch.tensor(1.0 + i), torch.tensor(0.1 * i), torch.tensor(0.5))
    lr_tensor, state_tensor = b.lr, b.state
    b.load_state_dict(a.state_dict())
    assert b.lr is lr_tensor and b.state is state_tensor
    assert torch.equal(b.state, a.state) and torch.equal(b.lr, a.lr)
    with pytest.raises(ValueError, match="controller state"):
        b.load_state_dict({"state": torch.zeros(3), "lr": torch.tensor(0.0)})
