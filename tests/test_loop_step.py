"""The training step: observation gathering, one fold's loop on CPU, and (on CUDA) graph vs eager."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.loop.config import preset
from trainer.loop.fold import FoldTrainer, Window, direction_entropy
from trainer.loop.step import (ACT_CONFINED_MAX_WINDOWS_PER_ITEM, METRICS, GraphedStep, StepMetrics, acting_sm_share,
                               compile_options, gather_windows)
from trainer.sim.synthetic import random_decision_tape


def test_gather_windows_matches_slicing_reference():
    features = torch.arange(40 * 3, dtype=torch.float32).reshape(40, 3)
    rows = torch.tensor([4, 17, 39])
    got = gather_windows(features, rows, window=5)
    for i, r in enumerate(rows.tolist()):
        assert torch.equal(got[i], features[r - 4:r + 1])  # oldest first, row r last


def test_direction_entropy_uniform_and_collapsed():
    assert direction_entropy(torch.ones(4)).item() == pytest.approx(np.log(4))
    assert direction_entropy(torch.tensor([0.0, 10.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)


def _trainer(device: str = "cpu", n_envs: int = 16, seed: int = 0, rows: int = 3000,
             compile: str = "none", overlap: bool = True, **agent) -> FoldTrainer:
    cfg = preset("smoke").replace(
        sim={"n_envs": n_envs, "seed": seed},
        agent={"batch_size": 32, "window": 8, "d_model": 16, "mirror": False, "mirror_augment": False, **agent},
        loop={"device": device, "seed": seed, "learning_starts": 8, "n_steps": 40, "log_every": 20,
              "compile": compile, "overlap": overlap, "select_frac": 0.0, "max_exposure": 1.0},
    )
    tape = random_decision_tape(rows, levels=10, radius=16, seed=seed)
    features = np.random.default_rng(seed).standard_normal((rows, 23)).astype(np.float32)
    reflected = np.random.default_rng(seed + 1).standard_normal((rows, 23)).astype(np.float32) \
        if agent.get("mirror_augment") else None
    return FoldTrainer(cfg, features, tape, Window(0, rows), fold=0, reflected=reflected)


def test_fold_trainer_runs_steps_with_finite_loss_and_counts(capsys):
    trainer = _trainer()
    trainer.run()
    assert trainer.env_step == 40 and trainer.update_step == 40 - 8
    lines = [l for l in capsys.readouterr().out.splitlines() if '"event":"step"' in l]
    assert len(lines) == 2  # log_every 20 over 40 steps
    import json

    last = json.loads(lines[-1])
    for key in ("env_step", "update_step", "sps", "transitions_per_s", "loss", "q_mean", "grad_norm", "lr", "clip",
                "tau", "win_rate", "hold_frac", "dir_entropy", "trades"):
        assert key in last
    assert np.isfinite(last["loss"]) and last["update_step"] == 32


def test_training_under_a_minimum_holding_time_never_ends_a_young_trip():
    """AgentConfig.train_min_hold_steps: the Thompson-sampled behaviour of training sends an exit of a trip younger
    than the minimum as HOLD, so every trip the training envs close or reverse lasted at least that long; without
    it the same exploring agent closes trips after 1 decision."""
    for h, want_min in ((0, 1), (5, 5)):
        trainer = _trainer(n_envs=32, train_min_hold_steps=h, thompson_scale=1.0)
        st, ended = trainer.state, []
        for _ in range(60):
            age, pos = st.time_in_trade.clone(), st.position.clone()
            trainer.step_fn.act_and_store()
            ended += [int(a) for a, p0, p1 in zip(age, pos, st.position) if p0 != 0 and (p1 == 0 or p0 * p1 < 0)]
        assert len(ended) > 30 and min(ended) == want_min


def test_state_dict_round_trip_continues_identically():
    a = _trainer(seed=3)
    for _ in range(12):
        a.step_fn.act_and_store() if a.env_step < 8 else a.step_fn()
        a.env_step += 1
    saved = {k: {n: t.clone() for n, t in v.items()} for k, v in a.state_dict().items()}
    rng = torch.get_rng_state()
    b = _trainer(seed=3)  # (re-seeds the global RNG: both continue from `rng` below)
    b.load_state_dict(saved)
    torch.set_rng_state(rng)
    for _ in range(5):
        a.step_fn()
    torch.set_rng_state(rng)
    for _ in range(5):
        b.step_fn()
    for name, p in a.learner.online.state_dict().items():
        assert torch.equal(p, b.learner.online.state_dict()[name]), name


def _warm_then_run(trainer: FoldTrainer, mode: str, steps: int) -> torch.Tensor:
    """8 acting steps, 3 eager updates (the lazy inits a capture needs), then `steps` training steps run eagerly or
    as replays of the captured step. Returns each step's loss, (steps,)."""
    step = trainer.step_fn
    for _ in range(8):
        step.act_and_store()
    for _ in range(3):
        step()
    run = GraphedStep(step) if mode == "graph" else step
    losses = []
    for _ in range(steps):
        step.metrics.reset()
        run()
        losses.append(step.metrics.sums[0].clone())
    return torch.stack(losses)


@pytest.mark.gpu
@pytest.mark.parametrize("augment", [False, True])
def test_graph_and_eager_give_the_same_losses_for_the_same_seed(augment):
    """Same seed, same steps: eager vs CUDA-graph replay agree within TF32 tolerance (also with the batch's odd items
    drawn in the reflected market, AgentConfig.mirror_augment)."""
    losses = {}
    for mode in ("eager", "graph"):
        torch.manual_seed(0)
        torch.cuda.manual_seed(0)
        trainer = _trainer(device="cuda", n_envs=256, seed=0, mirror_augment=augment)
        losses[mode] = _warm_then_run(trainer, mode, 30).cpu().numpy()
    np.testing.assert_allclose(losses["graph"], losses["eager"], rtol=2e-2, atol=1e-3)


def test_only_autotune_on_cuda_turns_on_inductors_max_autotune():
    assert compile_options("autotune", torch.device("cuda")) == {"max_autotune": True}
    for compile, device in (("autotune", "cpu"), ("all", "cuda"), ("sim", "cuda"), ("none", "cuda")):
        assert compile_options(compile, torch.device(device)) is None


@pytest.mark.gpu
@pytest.mark.slow
def test_autotuned_graph_step_gives_the_eager_losses():
    """compile='autotune' (Triton GEMM templates picked by timing, captured in the step's CUDA graph) against the
    uncompiled eager step, Mamba with the fused scan: the same losses for the same seed within TF32 tolerance."""
    losses = {}
    for mode, compile in (("eager", "none"), ("graph", "autotune")):
        torch.manual_seed(0)
        torch.cuda.manual_seed(0)
        trainer = _trainer(device="cuda", n_envs=256, seed=0, compile=compile, encoder="mamba", scan="fused")
        losses[mode] = _warm_then_run(trainer, mode, 30).cpu().numpy()
    np.testing.assert_allclose(losses["graph"], losses["eager"], rtol=2e-2, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("encoder", ["gru", "mamba"])
def test_overlapping_acting_and_learning_on_side_streams_changes_no_value(encoder):
    """LoopConfig.overlap runs acting (on half the SMs, a green context) and the target forwards on side CUDA
    streams; the same seed gives the same actions, losses and weights as running everything on one stream, eagerly
    and graph-captured alike."""
    runs = {}
    for overlap, mode in ((False, "eager"), (True, "eager"), (False, "graph"), (True, "graph")):
        torch.manual_seed(0)
        # 256 envs, batch 64: acting encodes 4 windows per batch item, so it runs confined (acting_sm_share).
        trainer = _trainer(device="cuda", n_envs=256, seed=0, overlap=overlap, encoder=encoder, n_layers=2,
                           batch_size=64)
        assert (trainer.step_fn.side.stream is not None) == overlap
        assert (trainer.step_fn.side.sms is not None) == overlap  # acting confined to a green context (half the SMs)
        assert (trainer.learner.side.stream is not None) == overlap
        losses = _warm_then_run(trainer, mode, 20)
        runs[overlap, mode] = (losses, trainer.state.position.clone(), trainer.learner.flat_grad.clone(),
                               {k: v.clone() for k, v in trainer.learner.online.state_dict().items()})

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        if not a.is_floating_point():
            return 0.0 if torch.equal(a, b) else float("inf")
        return float((a - b).norm() / b.norm().clamp(min=1e-12))

    for mode in ("eager", "graph"):
        key, base = (True, mode), runs[False, mode]
        losses, position, grad, weights = runs[key]
        assert torch.equal(position, base[1]), key  # the same actions were taken
        # Floats to the run-to-run noise of the CUDA kernels (cuBLAS and cuDNN are not bit-reproducible across
        # streams without their deterministic settings), which 20 updates amplify. Measured on an H200
        # (2026-12-03): losses 1e-7, the last gradient and the weights at most 9.3e-5 relative.
        assert rel(losses, base[0]) < 1e-5, (key, rel(losses, base[0]))
        assert rel(grad, base[2]) < 1e-3, (key, rel(grad, base[2]))
        for name, p in weights.items():
            assert rel(p, base[3][name]) < 1e-3, (key, name, rel(p, base[3][name]))


def test_acting_is_confined_to_its_sm_share_only_while_it_encodes_at_most_4_windows_per_batch_item():
    assert ACT_CONFINED_MAX_WINDOWS_PER_ITEM == 4
    assert acting_sm_share(0.5, 1024, 256) == 0.5  # h100 preset at 1,024 envs: confined
    assert acting_sm_share(0.5, 256, 256) == 0.5
    assert acting_sm_share(0.5, 1025, 256) == 1.0  # acting outgrows the learner: every SM
    assert acting_sm_share(0.5, 2569, 256) == 1.0  # the row table at 4,096+ envs
    assert acting_sm_share(1.0, 16, 256) == 1.0


def test_acting_by_row_table_gives_the_same_logits_as_encoding_every_env():
    trainer = _trainer(n_envs=64, rows=600)  # 593 usable rows >= 64 envs: per-env encoding in the loop
    step = trainer.step_fn
    net = trainer.learner.online
    rows = torch.arange(7, 600)
    env_state = torch.zeros(5, 7)
    picks = torch.tensor([7, 8, 300, 599, 599])
    with torch.no_grad():
        direct = net(gather_windows(trainer.features, picks, 8), env_state)
        table = net.encoder(gather_windows(trainer.features, rows, 8))
        via_table = net.head(table.index_select(0, picks - rows[0]), env_state)
    torch.testing.assert_close(via_table, direct, rtol=1e-5, atol=1e-5)
    assert step.table_rows is None  # 593 usable rows >= 64 envs: acting encodes per env


def test_fold_trainer_acts_by_row_table_when_envs_outnumber_rows():
    trainer = _trainer(n_envs=64, rows=40)
    assert trainer.step_fn.table_rows is not None and trainer.step_fn.table_rows.shape[0] == 40 - 7
    for _ in range(12):
        trainer.step_fn.act_and_store() if trainer.env_step < 8 else trainer.step_fn()
        trainer.env_step += 1
    assert int(trainer.state.cursor.min()) >= 7 and int(trainer.state.cursor.max()) <= 39


@pytest.mark.slow
def test_compiled_step_follows_the_eager_step():
    """LoopConfig.compile='all' (simulator step, encoder and head through torch.compile) takes the same actions and
    reaches the same losses as eager within float rounding, on both acting paths (per env and by row table), and
    with the batch's odd items drawn in the reflected market (AgentConfig.mirror_augment)."""
    for rows, augment in ((3000, False), (20, False), (3000, True)):  # 20 rows < 16 envs + window: row table
        eager = _trainer(seed=5, rows=rows, mirror_augment=augment)
        compiled = _trainer(seed=5, rows=rows, compile="all", mirror_augment=augment)
        assert (compiled.step_fn.table_rows is not None) == (rows == 20)
        for t in (eager, compiled):
            torch.manual_seed(11)
            for k in range(14):
                t.step_fn.act_and_store() if k < 8 else t.step_fn()
        for name, p in eager.learner.online.state_dict().items():
            torch.testing.assert_close(compiled.learner.online.state_dict()[name], p, rtol=1e-4, atol=1e-5, msg=name)
        m_e, m_c = eager.step_fn.metrics, compiled.step_fn.metrics
        torch.testing.assert_close(m_c.sums, m_e.sums, rtol=1e-4, atol=1e-5)
        assert torch.equal(eager.state.position, compiled.state.position)  # the same actions were taken


def test_step_metrics_sum_each_statistic_into_its_named_slot():
    metrics = StepMetrics.zeros(torch.device("cpu"))
    stats = {"loss": torch.tensor(1.5), "q_mean": torch.tensor(-2.0), "grad_norm": torch.tensor(3.0),
             "lr": torch.tensor(1e-3), "clip": torch.tensor(10.0), "tau": torch.tensor(0.005),
             "td_error_mean": torch.tensor(99.0), "priorities": torch.ones(4)}
    metrics.add_update(stats)
    metrics.add_update({**stats, "loss": torch.tensor(0.5)})
    metrics.add_reward(torch.tensor([1.0, 3.0]))  # one env step, mean 2
    assert float(metrics.count) == 2
    got = {name: round(float(metrics.mean(name)), 6) for name in METRICS}
    assert got == {"loss": 1.0, "q_mean": -2.0, "grad_norm": 3.0, "lr": 0.001, "clip": 10.0, "tau": 0.005,
                   "reward": 1.0}
    assert dict(zip(StepMetrics.NAMES, (metrics.sums / metrics.count).tolist()))["reward"] == 1.0  # the log line's view


def test_feed_latency_gives_the_agent_the_undelayed_observation_k_rows_late():
    """SimConfig.feed_latency_steps = k: at cursor c the agent acts on the k = 0 observation of row c - k, and the
    replay stores those delayed rows (`Simulator.obs_rows`), for the act and for the n-step bootstrap."""
    rows, k = 400, 3

    def trainer(feed: int) -> FoldTrainer:
        cfg = preset("smoke").replace(sim={"n_envs": 8, "seed": 0, "feed_latency_steps": feed},
                                      agent={"batch_size": 32, "window": 8, "d_model": 16, "mirror": False,
                                             "mirror_augment": False},
                                      loop={"device": "cpu", "seed": 0, "learning_starts": 8, "n_steps": 40})
        tape = random_decision_tape(rows, levels=10, radius=16, seed=0)
        features = np.random.default_rng(0).standard_normal((rows, 23)).astype(np.float32)
        return FoldTrainer(cfg, features, tape, Window(0, rows), fold=0)

    now, late = trainer(0), trainer(k)
    start = now.state.cursor.clamp(max=rows - 2 - 2 * k)  # room for the shift and for two steps
    now.state.cursor.copy_(start)
    late.state.cursor.copy_(start + k)
    seen: dict[str, list[torch.Tensor]] = {"now": [], "late": []}
    pushed: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for name, t in (("now", now), ("late", late)):
        act = t.learner.act
        t.learner.act = lambda obs, env_state, explore, _a=act, _s=seen[name]: _s.append(obs.clone()) or _a(
            obs, env_state, explore=explore)
    push = late.step_fn.nstep.push
    late.step_fn.nstep.push = lambda row, *a, _p=push, **kw: pushed.append((row.clone(), a[4].clone())) or _p(
        row, *a, **kw)
    before = late.state.cursor.clone()
    now.step_fn.act_and_store()
    late.step_fn.act_and_store()
    assert torch.equal(seen["late"][0], seen["now"][0])  # (n_envs, W, F): the window ending at row c - k
    assert torch.equal(seen["late"][0], gather_windows(late.features, before - k, 8))
    row, next_row = pushed[0]
    assert torch.equal(row, before - k) and torch.equal(next_row, late.state.cursor - k)


def test_the_mirrored_fold_deploys_and_validates_a_policy_with_no_direction_of_its_own():
    """AgentConfig.mirror: the fold's policy reads [inputs, reflected inputs]. Handing a second trainer (same seed,
    same weights) the two swapped, with the env state reflected, must give the mirrored direction and the same
    other branches: the decision in the reflected market is the mirror of the decision in the observed one."""
    from trainer.loop.step import gather_windows
    from trainer.sim import ENV_FEATURES, ENV_REFLECTION, LONG, SHORT

    rows = 600
    cfg = preset("smoke").replace(
        sim={"n_envs": 8}, agent={"batch_size": 16, "window": 8, "d_model": 16, "mirror": True,
                                  "mirror_augment": False},
        loop={"device": "cpu", "learning_starts": 4, "n_steps": 12, "log_every": 12, "select_frac": 0.2,
              "select_every": 6, "max_exposure": 1.0})  # no margin: it is calibrated on each trainer's own slice
    tape = random_decision_tape(rows, levels=10, radius=16, seed=1)
    rng = np.random.default_rng(1)
    f, r = (rng.standard_normal((rows, 23)).astype(np.float32) for _ in range(2))
    with pytest.raises(ValueError, match="mirror"):
        FoldTrainer(cfg, f, tape, Window(0, rows), fold=0)  # mirror on, no reflected inputs
    with pytest.raises(ValueError, match="mirror"):
        FoldTrainer(cfg.replace(agent={"mirror": False}), f, tape, Window(0, rows), fold=0, reflected=r)
    a = FoldTrainer(cfg, f, tape, Window(0, rows), fold=0, reflected=r)
    b = FoldTrainer(cfg, r, tape, Window(0, rows), fold=0, reflected=f)
    assert a.policy_features.shape == (rows, 46) and a.weights_hash == b.weights_hash
    a.run()  # trains and validates through the mirrored policy (2F-column windows) on the held-out slice
    assert a.selector.summary()["select_validations"] == 2
    with torch.no_grad():  # varied weights, so the decisions differ from row to row
        for p in a.learner.params:
            p.add_(torch.randn_like(p) * 0.3)
    b.learner.online.load_state_dict(a.learner.online.state_dict())
    a.selector.best_params.copy_(b.selector.best_params.copy_(torch.cat(
        [p.detach().reshape(-1) for p in a.learner.params])))  # deploy the last weights in both
    a.selector.record[0] = b.selector.record[0] = 1e9  # as if validated with a profit: no standing aside
    obs_rows = torch.arange(100, 164)
    env = torch.rand(64, ENV_FEATURES) * 2 - 1
    here = a.deployed_policy()(gather_windows(a.policy_features, obs_rows, 8), env)
    there = b.deployed_policy()(gather_windows(b.policy_features, obs_rows, 8), env * torch.tensor(ENV_REFLECTION))
    swap = torch.tensor([LONG if x == SHORT else SHORT if x == LONG else x for x in range(4)])
    assert torch.equal(there[:, 0], swap[here[:, 0]]) and torch.equal(there[:, 1:], here[:, 1:])
    assert {int(x) for x in here[:, 0]} >= {LONG, SHORT}  # both directions decided: the check has teeth


def test_mirror_augment_draws_every_odd_batch_item_as_its_transition_in_the_reflected_market():
    """AgentConfig.mirror_augment against a slow reference: with the same random draws, the step's batch is the
    replay's sample with each odd item rebuilt by hand in the reflected market (windows from the reflected inputs,
    env states times ENV_REFLECTION, LONG <-> SHORT), and each even item untouched; rewards and discounts unchanged.
    The deployed policy still reads the inputs alone (mirror off)."""
    from trainer.sim import ENV_REFLECTION, LONG, SHORT

    rows, W = 600, 8
    cfg = preset("smoke").replace(
        sim={"n_envs": 16}, agent={"batch_size": 32, "window": W, "d_model": 16, "mirror": False,
                                   "mirror_augment": True},
        loop={"device": "cpu", "learning_starts": 8, "n_steps": 40, "select_frac": 0.0, "max_exposure": 1.0})
    tape = random_decision_tape(rows, levels=10, radius=16, seed=2)
    rng = np.random.default_rng(2)
    f, r = (rng.standard_normal((rows, 23)).astype(np.float32) for _ in range(2))
    with pytest.raises(ValueError, match="mirror_augment"):
        FoldTrainer(cfg, f, tape, Window(0, rows), fold=0)  # no reflected inputs
    trainer = FoldTrainer(cfg, f, tape, Window(0, rows), fold=0, reflected=r)
    assert trainer.policy_features.shape == (rows, 23)
    for _ in range(20):
        trainer.step_fn.act_and_store()
    torch.manual_seed(9)
    idx, got = trainer.step_fn._sample()
    torch.manual_seed(9)
    idx_ref, raw = trainer.replay.sample(32)
    assert torch.equal(idx, idx_ref)
    swap = {SHORT: LONG, LONG: SHORT}
    flipped = 0
    for i in range(32):
        row, nrow = int(raw.row[i]), int(raw.next_row[i])
        src = r if i % 2 == 1 else f
        env, nenv, act = raw.env_state[i].tolist(), raw.next_env_state[i].tolist(), raw.action[i].tolist()
        if i % 2 == 1:
            env = [x * s for x, s in zip(env, ENV_REFLECTION)]
            nenv = [x * s for x, s in zip(nenv, ENV_REFLECTION)]
            flipped += act[0] in swap
            act = [swap.get(act[0], act[0]), *act[1:]]
        assert torch.equal(got.obs[i], torch.from_numpy(src[row - W + 1:row + 1]))
        assert torch.equal(got.next_obs[i], torch.from_numpy(src[nrow - W + 1:nrow + 1]))
        assert got.env_state[i].tolist() == env and got.next_env_state[i].tolist() == nenv
        assert got.action[i].tolist() == act
    assert flipped > 0  # some reflected items held a LONG or SHORT: the swap was exercised
    assert torch.equal(got.return_n, raw.return_n) and torch.equal(got.discount_n, raw.discount_n)
    assert torch.equal(got.row, raw.row) and torch.equal(got.next_row, raw.next_row)
    trainer.run()  # the whole loop trains on it
    assert trainer.env_step == 40


def test_the_fold_deploys_the_stand_aside_margin_calibrated_on_the_held_out_slice():
    """LoopConfig.max_exposure: after selection the fold finds the margin on the slice once and deploys the greedy
    policy with it; the margin makes the policy go flat where the free policy held a position, never the reverse."""
    from trainer.loop.step import gather_windows
    from trainer.sim import ENV_FEATURES, FLAT

    rows = 600
    cfg = preset("smoke").replace(
        sim={"n_envs": 8}, agent={"batch_size": 16, "window": 8, "d_model": 16, "mirror": False,
                                  "mirror_augment": False},
        loop={"device": "cpu", "learning_starts": 4, "n_steps": 12, "log_every": 12, "select_frac": 0.2,
              "select_every": 6, "max_exposure": 0.3, "exposure_gain": 0.0})
    with pytest.raises(ValueError, match="select_frac"):
        cfg.replace(loop={"select_frac": 0.0})  # the cap is calibrated on the slice
    tape = random_decision_tape(rows, levels=10, radius=16, seed=2)
    features = np.random.default_rng(2).standard_normal((rows, 23)).astype(np.float32)
    fold = FoldTrainer(cfg, features, tape, Window(0, rows), fold=0)
    fold.run()
    with torch.no_grad():  # varied weights, so the policy trades
        for p in fold.learner.params:
            p.add_(torch.randn_like(p) * 0.3)
    fold.selector.best_params.copy_(torch.cat([p.detach().reshape(-1) for p in fold.learner.params]))
    fold.selector.record[0] = 1e9  # as if validated with a profit: no standing aside
    deployed = fold.deployed_policy()
    s = fold.selector.summary()
    assert s["select_free_time_in_market"] > 0.3 >= s["select_time_in_market"] and s["select_margin"] > 0
    probes = s["select_margin_probes"]
    assert fold.deployed_policy() is not None and fold.selector.summary()["select_margin_probes"] == probes  # once
    obs = gather_windows(fold.policy_features, torch.arange(100, 356), 8)
    env = torch.rand(256, ENV_FEATURES) * 2 - 1
    free, capped = fold._greedy()(obs, env), deployed(obs, env)
    assert torch.equal(capped, fold._greedy(s["select_margin"])(obs, env))
    changed = capped[:, 0] != free[:, 0]
    assert changed.any() and (capped[changed, 0] == FLAT).all()
    # LoopConfig.exposure_gain: the same fold deploys a controller that starts from that margin (trainer/loop/exposure)
    from trainer.loop.exposure import ExposureController

    fold.cfg = fold.cfg.replace(loop={"exposure_gain": 0.05})
    controlled = fold.deployed_policy()
    assert isinstance(controlled, ExposureController) and controlled.margin0 == s["select_margin"]
    controlled.start(torch.arange(100, 356))
    env[:, 0] = 0.0  # flat: the first decision lowers every margin by gain x cap
    want = fold._greedy(torch.full((256,), max(0.0, s["select_margin"] - 0.05 * 0.3)))(obs, env)
    assert torch.equal(controlled(obs, env), want)
