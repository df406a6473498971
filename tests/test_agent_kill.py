"""Kill criteria: each fires on a planted case and stays silent on a healthy synthetic trajectory."""
from __future__ import annotations

import random

import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.kill import KillMonitor
from trainer.errors import EXIT_KILLED, KillCriterion, exit_code_for


def cfg_(**kw) -> AgentConfig:
    base = dict(n_features=2, env_state_dim=1, kill_collapse_updates=20, kill_warmup_updates=50)
    base.update(kw)
    return AgentConfig(**base)


def t(x: float) -> torch.Tensor:
    return torch.tensor(x)


def run_interval(mon: KillMonitor, q: float, rng: random.Random, n: int = 10, ret: float = 0.5,
                 grad: float = 1.0, loss: float = 2.0) -> dict[str, float]:
    for _ in range(n):
        mon.observe(t(loss), t(grad * (1 + 0.1 * rng.random())), t(q + 0.01 * rng.gauss(0, 1)), t(ret))
    return mon.check()


def test_healthy_trajectory_never_fires():
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(0)
    for i in range(300):  # a learning curve rising to ~8, each interval's mean 0.5 % noisy
        q = 8.0 * (1.0 - 0.98 ** i) + 0.04 * rng.gauss(0, 1)
        stats = run_interval(mon, q, rng)
    assert stats["interval_updates"] == 10.0 and abs(stats["q_interval_mean"] - q) < 0.05


def test_stationary_noisy_q_never_fires_yet_the_armed_monitor_fires_on_a_jump():
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(10)
    for _ in range(300):
        stats = run_interval(mon, 6.0 + 0.06 * rng.gauss(0, 1), rng)  # interval means 1 % noisy
    # Silent because the noise is inside the band, not because the test never armed it: the window is full,
    # its median sits on 6, and the band is the relative floor 0.05 * 6 = 0.3 (the 1 % noise's MAD is smaller).
    assert stats["updates"] == 3000.0
    assert abs(stats["q_median"] - 6.0) < 0.02 and abs(stats["q_mad"] - 0.3) < 0.02
    # 6 + 4 * 0.3 = 7.2 is the edge: 7.0 is still noise, 8.0 is drift.
    run_interval(mon, 7.0, rng)
    with pytest.raises(KillCriterion, match="q_drift"):
        run_interval(mon, 8.0, rng)


def test_non_finite_loss_fires_at_the_next_check_and_stays_set():
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(1)
    run_interval(mon, 1.0, rng)
    mon.observe(t(float("nan")), t(1.0), t(1.0), t(0.5))
    for _ in range(5):  # healthy updates after the NaN do not clear the sticky flag
        mon.observe(t(2.0), t(1.0), t(1.0), t(0.5))
    with pytest.raises(KillCriterion) as err:
        mon.check()
    assert err.value.reason == "non_finite" and exit_code_for(err.value) == EXIT_KILLED
    with pytest.raises(KillCriterion, match="non_finite"):
        mon.check()


def test_infinite_gradient_norm_fires_non_finite():
    mon = KillMonitor(cfg_(), "cpu")
    mon.observe(t(1.0), t(float("inf")), t(0.0), t(0.5))
    with pytest.raises(KillCriterion, match="non_finite"):
        mon.check()


def test_q_jump_far_outside_the_rolling_mad_fires_q_drift():
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(2)
    for i in range(10):
        run_interval(mon, 2.0 + 0.05 * rng.gauss(0, 1), rng)
    with pytest.raises(KillCriterion) as err:
        run_interval(mon, 9.0, rng)
    assert err.value.reason == "q_drift"


def test_q_drift_waits_for_three_earlier_samples():
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(3)
    run_interval(mon, 2.0, rng)
    run_interval(mon, 2.0, rng)
    run_interval(mon, 9.0, rng)  # only two earlier samples: silent
    mon2 = KillMonitor(cfg_(), "cpu")
    for q in (2.0, 2.0, 2.0):
        run_interval(mon2, q, rng)
    with pytest.raises(KillCriterion, match="q_drift"):
        run_interval(mon2, 9.0, rng)


def test_q_jump_below_the_adaptive_magnitude_floor_is_silent():
    # Returns of ~0.5 set the floor to max(1, 10 * 0.5) = 5: a jump from 0.1 to 0.9 is noise-scale.
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(4)
    for _ in range(10):
        run_interval(mon, 0.1, rng, ret=0.5)
    run_interval(mon, 0.9, rng, ret=0.5)
    # The same relative jump on a larger scale fires.
    for _ in range(10):
        run_interval(mon, 0.9, rng, ret=0.5)
    with pytest.raises(KillCriterion, match="q_drift"):
        run_interval(mon, 7.0, rng, ret=0.5)


def test_gradient_collapse_fires_after_n_consecutive_zero_norms_past_warmup():
    mon, rng = KillMonitor(cfg_(), "cpu"), random.Random(5)
    run_interval(mon, 1.0, rng, n=60)  # past the 50-update warm-up
    run_interval(mon, 1.0, rng, n=19, grad=0.0)  # 19 < 20: silent
    run_interval(mon, 1.0, rng, n=1, grad=1.0)  # the run is broken
    run_interval(mon, 1.0, rng, n=19, grad=0.0)
    with pytest.raises(KillCriterion) as err:
        run_interval(mon, 1.0, rng, n=1, grad=0.0)
    assert err.value.reason == "grad_collapse"


def test_gradient_collapse_is_ignored_during_warmup_and_fires_at_the_first_update_past_it():
    mon, rng = KillMonitor(cfg_(kill_warmup_updates=100), "cpu"), random.Random(6)
    stats = run_interval(mon, 1.0, rng, n=40, grad=0.0)  # 40 zero norms, twice the 20 that fire after warm-up
    assert stats["updates"] == 40.0
    run_interval(mon, 1.0, rng, n=59, grad=0.0)  # a 99-long run of zero norms, still all before update 100
    with pytest.raises(KillCriterion) as err:
        run_interval(mon, 1.0, rng, n=1, grad=0.0)  # update 100: the run counted during warm-up now counts
    assert err.value.reason == "grad_collapse"
    assert "100 consecutive gradient norms" in str(err.value) and "(at update 100)" in str(err.value)


def test_state_dict_round_trip_carries_the_window_and_flags():
    rng = random.Random(7)
    a = KillMonitor(cfg_(), "cpu")
    for _ in range(4):
        run_interval(a, 3.0, rng)
    b = KillMonitor(cfg_(), "cpu")
    b.load_state_dict(a.state_dict())
    with pytest.raises(KillCriterion, match="q_drift"):  # b knows a's history
        run_interval(b, 30.0, rng)
    with pytest.raises(ValueError, match="kill state"):
        b.load_state_dict({"acc": torch.zeros(7, dtype=torch.float64), "window": torch.zeros(3),
                           "window_pos": torch.zeros((), dtype=torch.int64)})
