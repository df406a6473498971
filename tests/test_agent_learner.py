"""Learner: the loss against a slow per-item reference, Polyak τ = 0 / 1, the tensor lr driving
AdamW, non-finite handling, checkpoint round-trip, and a contextual bandit learned end to end."""
from __future__ import annotations

import copy

import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.learner import Learner
from trainer.agent.network import QNetwork, expected_q
from trainer.agent.replay import Transitions
from trainer.errors import KillCriterion


def eq7_reference(values: list[float], probs: list[float], support: list[float]) -> list[float]:
    """Bellemare et al. (2017) Eq. 7 term by term, in plain Python (as in test_agent_c51)."""
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (len(support) - 1)
    return [sum(min(max(1.0 - abs(min(max(tz, v_min), v_max) - z_i) / dz, 0.0), 1.0) * p
                for tz, p in zip(values, probs)) for z_i in support]


def tiny_cfg(**kw) -> AgentConfig:
    base = dict(n_features=3, env_state_dim=2, window=6, d_model=16, d_state=4, n_layers=1, head_hidden=32,
                n_atoms=11, v_min=-2.0, v_max=2.0, batch_size=16)
    base.update(kw)
    return AgentConfig(**base)


def learner_batch(obs, env_state, action, return_n, discount_n, next_obs, next_env_state, weight) -> Transitions:
    """Transitions as the step hands them to the learner, with windows made up rather than gathered (the learner
    reads obs and next_obs, never the rows)."""
    rows = torch.zeros(obs.shape[0], dtype=torch.int64)
    return Transitions(row=rows, env_state=env_state, action=action, return_n=return_n, discount_n=discount_n,
                       next_row=rows, next_env_state=next_env_state, weight=weight, obs=obs, next_obs=next_obs)


def random_batch(cfg: AgentConfig, seed: int = 0, batch: int = 16) -> Transitions:
    g = torch.Generator().manual_seed(seed)
    actions = torch.stack([torch.randint(0, n, (batch,), generator=g) for n in cfg.branch_sizes], dim=1)
    return learner_batch(obs=torch.randn(batch, cfg.window, cfg.n_features, generator=g),
                         env_state=torch.randn(batch, cfg.env_state_dim, generator=g),
                         action=actions,
                         return_n=torch.randn(batch, generator=g),
                         discount_n=torch.where(torch.rand(batch, generator=g) < 0.25, 0.0, 0.97),
                         next_obs=torch.randn(batch, cfg.window, cfg.n_features, generator=g),
                         next_env_state=torch.randn(batch, cfg.env_state_dim, generator=g),
                         weight=torch.rand(batch, generator=g) + 0.5)


def perturbed_learner(cfg: AgentConfig, seed: int = 0, **kw) -> Learner:
    """A learner whose target differs from its online net and whose heads are not near-zero."""
    torch.manual_seed(seed)
    learner = Learner(QNetwork(cfg), cfg, "cpu", **kw)
    with torch.no_grad():
        for net in (learner.online, learner.target):
            for head in [net.value[-1], *[a[-1] for a in net.advantages]]:
                head.weight.normal_(0.0, 0.3)
    return learner


def test_per_item_loss_matches_a_slow_double_dqn_c51_reference():
    cfg = tiny_cfg()
    learner = perturbed_learner(cfg)
    online, target = copy.deepcopy(learner.online), copy.deepcopy(learner.target)
    b = random_batch(cfg)
    metrics = learner.update(b)
    support = online.support.tolist()
    with torch.no_grad():
        logits = online(b.obs, b.env_state)
        next_online = online(b.next_obs, b.next_env_state)
        next_target = target(b.next_obs, b.next_env_state)
    want = []
    for i in range(16):
        per_branch = []
        for br, n_act in enumerate(cfg.branch_sizes):
            q_next = [float(expected_q(next_online[i, br, a], online.support)) for a in range(n_act)]
            a_star = max(range(n_act), key=lambda a: q_next[a])  # online net picks ...
            p_next = torch.softmax(next_target[i, br, a_star], -1).tolist()  # ... target net evaluates
            tz = [float(b.return_n[i]) + float(b.discount_n[i]) * z for z in support]
            m = eq7_reference(tz, p_next, support)
            log_p = torch.log_softmax(logits[i, br, int(b.action[i, br])], -1).tolist()
            per_branch.append(-sum(mj * lj for mj, lj in zip(m, log_p)))
        want.append(sum(per_branch) / len(per_branch))
    want = torch.tensor(want)
    torch.testing.assert_close(metrics["priorities"], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(metrics["loss"], (b.weight * want).mean(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(metrics["td_error_mean"], want.mean(), atol=1e-4, rtol=1e-4)


def test_train_min_hold_takes_the_targets_a_star_as_the_rule_sends_it():
    """AgentConfig.train_min_hold_steps: a* at x' is the online argmax, then, where x' holds a trip younger than the
    minimum, an exit (FLAT or the opposite side) becomes HOLD; checked against the slow reference with that rule in
    plain Python, on weights where the rule changes some a*."""
    from trainer.sim.actions import FLAT, HOLD, LONG, SHORT

    h, scale = 4, 50.0
    cfg = tiny_cfg(env_state_dim=7, train_min_hold_steps=h)
    learner = perturbed_learner(cfg, time_scale_steps=scale)
    free = perturbed_learner(tiny_cfg(env_state_dim=7), time_scale_steps=scale)  # the same weights, no rule
    online, target = copy.deepcopy(learner.online), copy.deepcopy(learner.target)
    b = random_batch(cfg, batch=32)
    g = torch.Generator().manual_seed(5)
    position = torch.tensor([-1.0, 0.0, 1.0])[torch.randint(0, 3, (32,), generator=g)]
    age = torch.randint(1, 8, (32,), generator=g).float() * (position != 0)
    nes = b.next_env_state.clone()
    nes[:, 0], nes[:, 6] = position, age / (age + scale)
    b = b._replace(next_env_state=nes)
    with torch.no_grad():
        next_online = online(b.next_obs, b.next_env_state)
        next_target = target(b.next_obs, b.next_env_state)
        logits = online(b.obs, b.env_state)
    support = online.support.tolist()
    want, changed = [], 0
    for i in range(32):
        per_branch = []
        for br, n_act in enumerate(cfg.branch_sizes):
            q_next = [float(expected_q(next_online[i, br, a], online.support)) for a in range(n_act)]
            a_star = max(range(n_act), key=lambda a: q_next[a])
            pos, young = float(position[i]), 0 < float(age[i]) < h
            ends = a_star == FLAT or (a_star == SHORT and pos > 0) or (a_star == LONG and pos < 0)
            if br == 0 and pos != 0 and young and ends:
                a_star, changed = HOLD, changed + 1
            p_next = torch.softmax(next_target[i, br, a_star], -1).tolist()
            tz = [float(b.return_n[i]) + float(b.discount_n[i]) * z for z in support]
            m = eq7_reference(tz, p_next, support)
            log_p = torch.log_softmax(logits[i, br, int(b.action[i, br])], -1).tolist()
            per_branch.append(-sum(mj * lj for mj, lj in zip(m, log_p)))
        want.append(sum(per_branch) / len(per_branch))
    assert changed >= 2  # the rule acted on this batch
    got = learner.update(b)["priorities"]
    torch.testing.assert_close(got, torch.tensor(want), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(free.update(b)["priorities"], got, atol=1e-4)  # without the rule: other targets


def test_branch_epsilon_explores_the_other_branches_in_training_acting_only():
    learner = perturbed_learner(tiny_cfg(thompson_scale=0.0, branch_epsilon=1.0))  # κ 0: the draws are greedy
    b = random_batch(learner.cfg, batch=64)
    greedy = learner.act(b.obs, b.env_state, explore=False)
    torch.manual_seed(0)
    explored = learner.act(b.obs, b.env_state, explore=True)
    assert torch.equal(explored[:, 0], greedy[:, 0])          # the direction as κ = 0 draws it
    assert not torch.equal(explored[:, 1:], greedy[:, 1:])    # the others uniformly random at ε = 1
    assert torch.equal(learner.act(b.obs, b.env_state, explore=False), greedy)


def test_metrics_are_zero_dim_tensors_and_priorities_per_item():
    cfg = tiny_cfg()
    learner = perturbed_learner(cfg)
    metrics = learner.update(random_batch(cfg))
    for name in ("loss", "q_mean", "grad_norm", "lr", "clip", "tau", "td_error_mean"):
        assert metrics[name].shape == () and torch.isfinite(metrics[name]), name
    assert metrics["priorities"].shape == (16,) and (metrics["priorities"] > 0).all()
    assert int(learner.update_step) == 1


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_polyak_tau_zero_keeps_target_and_tau_one_copies_online(tau):
    cfg = tiny_cfg()
    learner = perturbed_learner(cfg)
    before = [p.clone() for p in learner.target.parameters()]
    learner.polyak_update(torch.tensor(tau))
    for p_t, p_o, p_0 in zip(learner.target.parameters(), learner.online.parameters(), before):
        assert torch.equal(p_t, p_o if tau == 1.0 else p_0)


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_update_applies_the_configured_tau(tau):
    cfg = tiny_cfg(tau=tau)
    learner = perturbed_learner(cfg, adaptive=False)
    before = [p.clone() for p in learner.target.parameters()]
    learner.update(random_batch(cfg))
    for p_t, p_o, p_0 in zip(learner.target.parameters(), learner.online.parameters(), before):
        assert torch.equal(p_t, p_o if tau == 1.0 else p_0)


def test_adamw_reads_the_controller_lr_tensor_in_place():
    cfg = tiny_cfg()
    learner = perturbed_learner(cfg, adaptive=False)
    learner.update(random_batch(cfg, seed=1))  # creates the AdamW state
    learner.controllers.lr.zero_()
    before = [p.clone() for p in learner.online.parameters()]
    learner.update(random_batch(cfg, seed=2))
    assert all(torch.equal(a, b) for a, b in zip(before, learner.online.parameters()))
    learner.controllers.lr.fill_(1e-3)
    learner.update(random_batch(cfg, seed=3))
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.online.parameters()))


def test_gradient_is_clipped_to_the_controller_clip():
    cfg = tiny_cfg(clip_init=1e-3)
    learner = perturbed_learner(cfg, adaptive=False)
    metrics = learner.update(random_batch(cfg))
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in learner.online.parameters()]))
    assert metrics["grad_norm"] > 1e-2
    torch.testing.assert_close(clipped, torch.tensor(1e-3), rtol=1e-3, atol=0)


def test_gradients_are_views_into_one_flat_buffer_that_each_update_overwrites():
    cfg = tiny_cfg(clip_init=1e6)  # no clipping: the buffer holds the raw gradient after the update
    learner = perturbed_learner(cfg, adaptive=False)
    addresses = [p.grad.data_ptr() for p in learner.params]
    learner.update(random_batch(cfg, seed=1))
    fresh = perturbed_learner(cfg, adaptive=False)  # same state, but no gradient left over from update 1
    fresh.load_state_dict(learner.state_dict())
    metrics = learner.update(random_batch(cfg, seed=2))
    fresh.update(random_batch(cfg, seed=2))
    assert [p.grad.data_ptr() for p in learner.params] == addresses  # stable storage: a captured graph stays valid
    flat = torch.cat([p.grad.flatten() for p in learner.params])
    assert torch.equal(flat, learner.flat_grad) and torch.count_nonzero(flat) > 0
    assert torch.equal(learner.flat_grad, fresh.flat_grad)  # this update's gradient, not a sum over updates
    # The reported pre-clip norm is the norm of the whole gradient, as the per-tensor formula gives it.
    per_tensor = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in learner.params]))
    torch.testing.assert_close(metrics["grad_norm"], per_tensor, rtol=1e-6, atol=0)


def test_non_finite_batch_keeps_parameters_finite_and_trips_the_kill_check():
    cfg = tiny_cfg()
    learner = perturbed_learner(cfg)
    b = random_batch(cfg)
    learner.update(b)
    bad = b._replace(return_n=b.return_n.clone().index_fill_(0, torch.tensor([3]), float("nan")))
    metrics = learner.update(bad)
    assert not torch.isfinite(metrics["loss"])
    assert all(torch.isfinite(p).all() for p in learner.online.parameters())
    assert all(torch.isfinite(p).all() for p in learner.target.parameters())
    with pytest.raises(KillCriterion, match="non_finite"):
        learner.kill.check()


def test_state_dict_round_trip_continues_identically():
    cfg = tiny_cfg()
    a = perturbed_learner(cfg, seed=0)
    for s in range(3):
        a.update(random_batch(cfg, seed=s))
    sd = a.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    b = Learner(QNetwork(cfg), cfg, "cpu")  # fresh: no AdamW state yet
    b.load_state_dict(sd)
    ma, mb = a.update(random_batch(cfg, seed=9)), b.update(random_batch(cfg, seed=9))
    for k in ma:
        torch.testing.assert_close(ma[k], mb[k], rtol=0, atol=0)
    for pa, pb in zip(a.online.parameters(), b.online.parameters()):
        assert torch.equal(pa, pb)
    bad = dict(sd)
    bad.pop("online.value.2.bias")
    with pytest.raises(ValueError, match="online"):
        b.load_state_dict(bad)


@pytest.mark.parametrize("encoder", ["mamba", "gru"])
def test_contextual_bandit_learns_to_rank_the_better_direction_first(encoder):
    """Feature 0 of the latest step says which side wins: LONG pays +1 when it is positive, SHORT
    when it is negative, the wrong side pays -1, HOLD/FLAT pay 0; rewards are noisy and terminal."""
    cfg = tiny_cfg(encoder=encoder, lr=3e-3, n_atoms=21, batch_size=64)
    torch.manual_seed(0)
    learner = Learner(QNetwork(cfg), cfg, "cpu")
    g = torch.Generator().manual_seed(1)

    def draw(n: int):
        obs = torch.randn(n, cfg.window, cfg.n_features, generator=g)
        return obs, torch.randn(n, cfg.env_state_dim, generator=g), torch.sign(obs[:, -1, 0])

    for _ in range(300):
        obs, env_state, side = draw(64)
        actions = torch.stack([torch.randint(0, n, (64,), generator=g) for n in cfg.branch_sizes], 1)
        direction = actions[:, 0]
        payoff = torch.where(direction == 2, side, torch.where(direction == 0, -side, 0.0))
        returns = payoff + 0.3 * torch.randn(64, generator=g)
        metrics = learner.update(learner_batch(obs, env_state, actions, returns, torch.zeros(64), obs, env_state,
                                               torch.ones(64)))
        assert torch.isfinite(metrics["loss"])
    obs, env_state, side = draw(512)
    with torch.no_grad():
        q_dir = expected_q(learner.online(obs, env_state), learner.online.support)[:, 0]  # (512, 4)
    best = torch.where(side > 0, 2, 0)
    accuracy = (q_dir.argmax(-1) == best).float().mean()
    assert accuracy > 0.9, float(accuracy)
    greedy = learner.act(obs, env_state, explore=False)[:, 0]
    assert torch.equal(greedy, q_dir.argmax(-1))
    learner.kill.check()  # a healthy run trips nothing


@pytest.mark.gpu
@pytest.mark.parametrize("aux_weight", [0.0, 1.0])
def test_update_and_act_replay_in_a_cuda_graph_like_eager(aux_weight):
    cfg = tiny_cfg(aux_weight=aux_weight)
    torch.manual_seed(0)
    net = QNetwork(cfg)
    eager = Learner(copy.deepcopy(net), cfg, "cuda")
    graphed = Learner(copy.deepcopy(net), cfg, "cuda")
    eager.aux_target = graphed.aux_target = torch.randn(4, device="cuda")  # the batches' rows are all 0
    batches = [Transitions(*(t.cuda() for t in random_batch(cfg, seed=s))) for s in range(8)]
    static = Transitions(*(t.clone() for t in batches[0]))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: AdamW state and autograd buffers are created here
        for b in batches[:3]:
            for dst, src in zip(static, b):
                dst.copy_(src)
            graphed.update(static)
    torch.cuda.current_stream().wait_stream(side)
    for b in batches[:3]:
        eager.update(b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = graphed.update(static)
        actions = graphed.act(static.obs, static.env_state, explore=True)
    for b in batches[3:]:
        for dst, src in zip(static, b):
            dst.copy_(src)
        graph.replay()
        want = eager.update(b)
        torch.testing.assert_close(out["loss"], want["loss"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out["priorities"], want["priorities"], rtol=1e-4, atol=1e-5)
    for pa, pb in zip(eager.online.parameters(), graphed.online.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-3, atol=1e-5)
    assert actions.shape == (16, 4) and bool((actions[:, 1:] < 3).all())
    graphed.kill.check()
