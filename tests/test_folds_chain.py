"""Warm-start chain: each fold-boundary reset, on a real Learner, and the trainer-level warm start from a checkpoint."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.controllers import (CLIP, DRIFT_SEEN, DRIFT_W, GRAD_FAST, GRAD_SLOW, GRAD_SLOW_W, LR, Q_DRIFT,
                                       Q_MAG, WARMUP_ACTIVE, WARMUP_FACTOR)
from trainer.agent.kill import UPDATES, ZERO_RUN
from trainer.agent.learner import Learner
from trainer.agent.network import QNetwork
from trainer.agent.replay import Transitions
from trainer.errors import InputError
from trainer.folds.chain import (ChainConfig, fold_boundary, fresh_network, load_final_state, wait_for_previous,
                                 warm_start)

W, F, S = 4, 5, 7


def _cfg(**kw) -> AgentConfig:
    # drift_ref huge → drift damping is 1, so lr and clip are the warm-up factor's alone
    base = dict(n_features=F, env_state_dim=S, window=W, encoder="gru", d_model=8, n_layers=1, head_hidden=16,
                n_atoms=11, batch_size=8, drift_ref=1e6)
    return AgentConfig(**{**base, **kw})


def _batch(gen: torch.Generator, n: int = 8) -> Transitions:
    obs, env_state = torch.randn(n, W, F, generator=gen), torch.rand(n, S, generator=gen)
    action, return_n = torch.randint(0, 3, (n, 4), generator=gen), torch.randn(n, generator=gen)
    next_obs, next_env_state = torch.randn(n, W, F, generator=gen), torch.rand(n, S, generator=gen)
    rows = torch.zeros(n, dtype=torch.int64)  # the learner reads the windows, not the rows
    return Transitions(row=rows, env_state=env_state, action=action, return_n=return_n,
                       discount_n=torch.full((n,), 0.9), next_row=rows, next_env_state=next_env_state,
                       weight=torch.ones(n), obs=obs, next_obs=next_obs)


def _trained_learner(cfg: AgentConfig, updates: int = 12) -> Learner:
    torch.manual_seed(1)
    learner = Learner(QNetwork(cfg), cfg, "cpu")
    gen = torch.Generator().manual_seed(2)
    for i in range(updates):
        learner.update(_batch(gen))
        if i % 3 == 2:
            learner.kill.check()  # pushes interval means into the Q-drift window
    learner.kill.acc[ZERO_RUN] = 7.0  # a collapse run in progress at the end of the fold
    return learner


@pytest.fixture(scope="module")
def boundary():
    cfg = _cfg()
    old = _trained_learner(cfg)
    prev = {k: v.clone() for k, v in old.state_dict().items()}
    torch.manual_seed(99)
    new = Learner(QNetwork(cfg), cfg, "cpu")
    info = fold_boundary(new, prev, fold=1, seed=0)
    return cfg, old, prev, new, info


def test_shrink_and_perturb_mixes_0_8_old_with_0_2_fresh_init(boundary):
    cfg, old, prev, new, _ = boundary
    fresh = fresh_network(new, 0 + 1 * ChainConfig().seed_stride)
    for (name, p), q in zip(new.online.named_parameters(), fresh.parameters()):
        expect = 0.8 * prev[f"online.{name}"] + 0.2 * q
        assert torch.allclose(p, expect, atol=1e-6), name
    # the perturbation is real: not the old weights, not the fresh ones
    first_old = prev[f"online.{next(iter(dict(new.online.named_parameters())))}"]
    assert not torch.allclose(next(new.online.parameters()), first_old)


def test_fresh_init_differs_by_fold_and_leaves_global_rng_alone(boundary):
    _, _, _, new, _ = boundary
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a, b = fresh_network(new, 1), fresh_network(new, 2)
    assert torch.equal(torch.rand(1), before)
    assert not torch.equal(next(a.parameters()), next(b.parameters()))


def test_target_network_is_set_to_the_new_online_network(boundary):
    _, _, _, new, _ = boundary
    for p, t in zip(new.online.parameters(), new.target.parameters()):
        assert torch.equal(p, t)


def test_adam_moments_scaled_and_bias_correction_step_restarted(boundary):
    _, old, prev, new, info = boundary
    assert info["adam_params"] == len(new.params) > 0
    for i, p in enumerate(new.params):
        st = new.optimizer.state[p]
        assert torch.allclose(st["exp_avg"], 0.1 * prev[f"optim.{i}.exp_avg"])
        assert torch.allclose(st["exp_avg_sq"], 0.01 * prev[f"optim.{i}.exp_avg_sq"])
        assert float(prev[f"optim.{i}.step"]) == 12.0 and float(st["step"]) == 0.0


def test_kill_state_reset_q_drift_window_and_collapse_counter(boundary):
    _, old, prev, new, _ = boundary
    assert int((~torch.isnan(prev["kill.window"])).sum()) == 4  # the old fold had filled its window
    assert torch.isnan(new.kill.window).all()
    assert int(new.kill.window_pos) == 0
    assert float(prev["kill.acc"][ZERO_RUN]) == 7.0 and float(new.kill.acc[ZERO_RUN]) == 0.0
    assert float(new.kill.acc[UPDATES]) == 0.0


def test_controllers_reset_fast_ema_and_drift_but_keep_slow_ema(boundary):
    cfg, _, prev, new, _ = boundary
    old_s, s = prev["controllers.state"], new.controllers.state
    assert float(old_s[GRAD_FAST]) > 0 and float(s[GRAD_FAST]) == 0.0
    for slot in (Q_DRIFT, DRIFT_W, DRIFT_SEEN):
        assert float(s[slot]) == 0.0
    for slot in (GRAD_SLOW, GRAD_SLOW_W, Q_MAG):
        assert float(s[slot]) == float(old_s[slot]) > 0
    assert float(s[WARMUP_ACTIVE]) == 1.0
    # the first update of the fold already runs at the warm-up floor: lr x 0.05, clip x 0.1
    assert float(new.controllers.lr) == pytest.approx(cfg.lr * 0.05)
    slow_hat = float(old_s[GRAD_SLOW] / old_s[GRAD_SLOW_W])
    base_clip = min(max(cfg.clip_k * slow_hat, cfg.clip_min), cfg.clip_max)
    assert float(s[CLIP]) == pytest.approx(base_clip * 0.1, rel=1e-5)
    assert int(new.update_step) == 0


def test_warm_up_factor_damps_lr_and_clip_then_releases():
    cfg = _cfg()
    old = _trained_learner(cfg)
    prev = {k: v.clone() for k, v in old.state_dict().items()}
    new = Learner(QNetwork(cfg), cfg, "cpu")
    fold_boundary(new, prev, fold=1, seed=0)
    gen = torch.Generator().manual_seed(3)
    factors = []
    for _ in range(60):
        new.update(_batch(gen))
        s = new.controllers.state
        f = float(s[WARMUP_FACTOR])
        factors.append(f)
        # f = clamp(fast / slow, 0, 1) while active; lr x max(0.05, f); clip x (0.1 + 0.9 f)
        slow_hat = float(s[GRAD_SLOW] / s[GRAD_SLOW_W])
        if float(s[WARMUP_ACTIVE]) > 0:
            assert f == pytest.approx(min(max(float(s[GRAD_FAST]) / slow_hat, 0.0), 1.0), rel=1e-5)
        assert float(s[LR]) == pytest.approx(cfg.lr * max(0.05, f), rel=1e-5)
        base_clip = min(max(cfg.clip_k * slow_hat, cfg.clip_min), cfg.clip_max)
        assert float(s[CLIP]) == pytest.approx(base_clip * (0.1 + 0.9 * f), rel=1e-5)
    assert factors[0] < 0.5  # damped at the start of the fold
    assert factors[-1] == 1.0  # and released once the fast EMA caught up


def test_chain_config_is_validated():
    with pytest.raises(ValueError, match="shrink_alpha"):
        ChainConfig(shrink_alpha=1.5)
    with pytest.raises(ValueError, match="adam_v_scale"):
        ChainConfig(adam_v_scale=-0.1)


def test_chain_fold_refuses_when_previous_fold_has_no_result(tmp_path):
    (tmp_path / "fold0").mkdir()
    with pytest.raises(InputError, match="fold 0 has not finished"):
        wait_for_previous(tmp_path, 1)
    with pytest.raises(ValueError, match="no previous fold"):
        wait_for_previous(tmp_path, 0)


def test_a_seed_replica_chains_through_its_own_previous_fold_only(tmp_path):
    # seed index 0 of fold 0 finished; seed index 1 of fold 0 did not: replica 1 of fold 1 must not start
    (tmp_path / "fold0" / "seed1").mkdir(parents=True)
    (tmp_path / "fold0" / "result.json").write_text("{}")
    assert wait_for_previous(tmp_path, 1) == tmp_path / "fold0" / "result.json"
    with pytest.raises(InputError, match=r"fold0/seed1/result\.json.*fold 0 has not finished"):
        wait_for_previous(tmp_path, 1, replica=1)
    (tmp_path / "fold0" / "seed1" / "result.json").write_text("{}")
    assert wait_for_previous(tmp_path, 1, replica=1) == tmp_path / "fold0" / "seed1" / "result.json"


def test_chain_fold_waits_for_previous_result(tmp_path):
    (tmp_path / "fold2").mkdir()
    calls = []

    def sleep(s):  # the previous fold finishes while we wait
        calls.append(s)
        (tmp_path / "fold2" / "result.json").write_text("{}")

    assert wait_for_previous(tmp_path, 3, wait_seconds=30, poll_seconds=1, sleep=sleep).name == "result.json"
    assert calls == [1]


def test_train_cli_chain_without_previous_fold_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer.train", "--run-dir", str(tmp_path), "--fold", "1",
                           "--folds", "2", "--fold-mode", "chain", "--data", "synthetic"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "fold 0 has not finished" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_chain_through_the_trainer_warm_starts_fold_1_and_refuses_other_fold_geometry(tmp_path):
    """`--fold-mode chain` end to end: fold 1 warm-starts from fold 0's final checkpoint (the fold index is not
    part of the fingerprint), but not when fold 1 is started with another --embargo-rows than fold 0 was."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ALPHA_RL_DATA_DIR": str(tmp_path / "data")}

    def train(run_dir, fold: int, *extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(run_dir), "--fold", str(fold), "--folds", "2",
               "--fold-mode", "chain", "--data", "synthetic:seed=3,days=2,signal=2", "--fxcache",
               str(tmp_path / "fxcache"), "--n-envs", "16", "--batch-size", "32", "--per-capacity", "2048",
               "--n-steps", "40", "--checkpoint-every", "20", "--log-every", "20", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    run_dir = tmp_path / "runs" / "abc"
    assert train(run_dir, 0).returncode == 0
    other = tmp_path / "runs" / "other"
    shutil.copytree(run_dir / "fold0", other / "fold0")
    warm = train(run_dir, 1)
    assert warm.returncode == 0, warm.stderr[-2000:]
    events = [json.loads(line) for line in warm.stdout.splitlines()]
    (start,) = [e for e in events if e["event"] == "chain_warm_start"]
    assert start["from"] == str(run_dir / "fold0") and start["replay_size"] == 0
    refused = train(other, 1, "--embargo-rows", "5")
    assert refused.returncode == 2
    assert "different config" in refused.stderr and "config.folds.embargo_rows" in refused.stderr


# ---------------------------------------------------------------- trainer level: checkpoint → warm start


def _train_cfg():
    from trainer.loop.config import preset

    cfg = preset("smoke")
    agent = {"encoder": "gru", "d_model": 8, "n_layers": 1, "head_hidden": 16, "n_atoms": 11, "batch_size": 8,
             "window": W, "mirror": False, "mirror_augment": False}
    return cfg.replace(loop={"n_steps": 12, "learning_starts": 4, "log_every": 6, "checkpoint_every": 6,
                             "device": "cpu"},
                       sim={"n_envs": 4}, replay={"capacity": 64}, agent=agent)


def test_warm_start_loads_previous_final_checkpoint_with_replay_cleared(tmp_path):
    from trainer.loop.fold import FoldTrainer, Window
    from trainer.loop.log import JsonLog
    from trainer.sim.synthetic import random_decision_tape
    from trainer.checkpoint.resume import FileCheckpointer, fingerprint, tensor_layout

    cfg = _train_cfg()
    tape = random_decision_tape(400, seed=4)
    features = np.random.default_rng(0).standard_normal((400, F)).astype(np.float32)
    log = JsonLog(0, copy_to=open(tmp_path / "log.jsonl", "w"))

    t0 = FoldTrainer(cfg, features, tape, Window(0, 200), 0, log)
    fp = fingerprint(dataclasses.asdict(cfg), "key", tensor_layout(t0.state_dict()))
    (tmp_path / "fold0").mkdir()
    t0.run(FileCheckpointer(tmp_path / "fold0", 2, {"fingerprint": fp, "fold": 0, "folds": 2}, log))
    assert int(t0.replay.size) > 0
    final = {k: v.clone() for k, v in t0.learner.state_dict().items()}

    t1 = FoldTrainer(cfg, features, tape, Window(200, 400), 1, log)
    (tmp_path / "fold0" / "result.json").write_text(json.dumps({"fold": 0}))
    info = warm_start(t1, tmp_path, fp)
    assert info["replay_size"] == 0 and int(t1.replay.size) == 0 and t1.env_step == 0
    assert float(t1.learner.controllers.state[GRAD_SLOW]) == float(final["controllers.state"][GRAD_SLOW])
    p_name, p = next(iter(t1.learner.online.named_parameters()))
    assert not torch.equal(p, final[f"online.{p_name}"])
    assert torch.allclose(p, 0.8 * final[f"online.{p_name}"]
                          + 0.2 * next(fresh_network(t1.learner, ChainConfig().seed_stride).parameters()), atol=1e-6)
    t1.run()  # the warm-started fold trains on
    assert t1.env_step == 12 and math.isfinite(float(t1.learner.controllers.lr))

    # a different config (tensor layout) is refused with the fields named
    other = dict(fp, config={**fp["config"], "agent": {**fp["config"]["agent"], "d_model": 16}})
    with pytest.raises(InputError, match="different config"):
        load_final_state(tmp_path, 1, other)
