"""NStepAccumulator: vectorised ring against a slow per-env reference, plus hand-checked n=3 cases."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.agent.replay import NStepAccumulator

S, B = 2, 3  # env_state_dim, n_branches used throughout


def reference_nstep(steps, n, gamma, bootstrap_on_reset):
    """Slow, obvious n-step returns for ONE env. `steps` is a list of dicts (one per push).

    Returns {emission push index: transition dict}. The transition of step t is emitted at push
    t+n-1. Float32 arithmetic in the same order as the vectorised code (mul, then add), so the
    comparison can be exact.
    """
    g = np.float32(gamma)
    out = {}
    T = len(steps)
    for t in range(T - n + 1):
        ret, mult = np.float32(0.0), np.float32(1.0)
        for k in range(n):
            s = steps[t + k]
            ret = np.float32(ret + np.float32(mult * np.float32(s["reward"])))
            mult = np.float32(mult * g)
            last = s
            if s["done"]:
                mult = np.float32(0.0)
                break
            if s["reset"]:
                if not bootstrap_on_reset:
                    mult = np.float32(0.0)
                break
        first = steps[t]
        out[t + n - 1] = dict(
            row=first["row"], env_state=first["env_state"], action=first["action"], return_n=ret,
            discount_n=mult, next_row=last["next_row"], next_env_state=last["next_env_state"],
        )
    return out


def random_stream(rng, n_envs, T, p_done, p_reset):
    """Random per-push inputs as tensors, and the same per env as python dicts for the reference."""
    pushes = []
    for t in range(T):
        pushes.append(dict(
            row=torch.from_numpy(rng.integers(0, 10_000, n_envs)),
            env_state=torch.from_numpy(rng.standard_normal((n_envs, S)).astype(np.float32)),
            action=torch.from_numpy(rng.integers(0, 5, (n_envs, B))),
            reward=torch.from_numpy(rng.standard_normal(n_envs).astype(np.float32)),
            done=torch.from_numpy(rng.random(n_envs) < p_done),
            next_row=torch.from_numpy(rng.integers(0, 10_000, n_envs)),
            next_env_state=torch.from_numpy(rng.standard_normal((n_envs, S)).astype(np.float32)),
            reset=torch.from_numpy(rng.random(n_envs) < p_reset),
        ))
    per_env = [
        [{k: (v[e].numpy() if v[e].dim() else v[e].item()) for k, v in p.items()} for p in pushes]
        for e in range(n_envs)
    ]
    return pushes, per_env


@pytest.mark.parametrize("n_step", [1, 2, 3, 5])
@pytest.mark.parametrize("bootstrap_on_reset", [False, True])
def test_vectorised_nstep_matches_per_env_reference_exactly(n_step, bootstrap_on_reset):
    rng = np.random.default_rng(100 + n_step)
    n_envs, T, gamma = 6, 60, 0.9
    pushes, per_env = random_stream(rng, n_envs, T, p_done=0.15, p_reset=0.08)
    refs = [reference_nstep(steps, n_step, gamma, bootstrap_on_reset) for steps in per_env]
    acc = NStepAccumulator(n_envs, n_step, gamma, S, B, "cpu", bootstrap_on_reset=bootstrap_on_reset)
    n_valid = 0
    for t, p in enumerate(pushes):
        out, valid = acc.push(**p)
        assert out.row.shape == (n_envs,) and out.env_state.shape == (n_envs, S) and out.action.shape == (n_envs, B)
        assert valid.tolist() == [t >= n_step - 1] * n_envs
        for e in range(n_envs):
            if not valid[e]:
                assert t not in refs[e]
                continue
            ref = refs[e][t]
            n_valid += 1
            assert out.row[e].item() == ref["row"]
            assert np.array_equal(out.env_state[e].numpy(), ref["env_state"])
            assert np.array_equal(out.action[e].numpy(), ref["action"])
            assert out.return_n[e].numpy() == ref["return_n"], (t, e)
            assert out.discount_n[e].numpy() == ref["discount_n"], (t, e)
            assert out.next_row[e].item() == ref["next_row"]
            assert np.array_equal(out.next_env_state[e].numpy(), ref["next_env_state"])
    # every step's transition is emitted exactly once (all that can mature within T pushes)
    assert n_valid == n_envs * (T - n_step + 1)


def _push_scalar_env(acc, t, reward, done=False, reset=False):
    """Push one step of a 1-env accumulator; row = 10*t, next_row = 10*t + 10, env_state = [t, -t]."""
    return acc.push(
        row=torch.tensor([10 * t]), env_state=torch.tensor([[float(t), -float(t)]]),
        action=torch.tensor([[t % 4, 1, 2]]), reward=torch.tensor([reward]), done=torch.tensor([done]),
        next_row=torch.tensor([10 * t + 10]), next_env_state=torch.tensor([[float(t + 1), -float(t + 1)]]),
        reset=torch.tensor([reset]),
    )


def test_hand_checked_n3_without_done_sums_three_rewards_and_bootstraps_with_gamma_cubed():
    acc = NStepAccumulator(1, 3, 0.5, S, B, "cpu")
    outs = [_push_scalar_env(acc, t, r) for t, r in enumerate([1.0, 2.0, 4.0, 8.0])]
    assert [v.item() for _, v in outs] == [False, False, True, True]
    o2, o3 = outs[2][0], outs[3][0]
    # step 0: 1 + 0.5*2 + 0.25*4 = 3; step 1: 2 + 0.5*4 + 0.25*8 = 6
    assert o2.return_n.item() == 3.0 and o2.discount_n.item() == 0.125
    assert o2.row.item() == 0 and o2.next_row.item() == 30 and o2.next_env_state.tolist() == [[3.0, -3.0]]
    assert o3.return_n.item() == 6.0 and o3.discount_n.item() == 0.125
    assert o3.row.item() == 10 and o3.next_row.item() == 40 and o3.action.tolist() == [[1, 1, 2]]


def test_hand_checked_n3_done_cuts_open_windows_with_zero_discount_and_restarts_after():
    acc = NStepAccumulator(1, 3, 0.5, S, B, "cpu")
    rewards, dones = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], [False, True, False, False, False, False]
    outs = [_push_scalar_env(acc, t, r, d)[0] for t, (r, d) in enumerate(zip(rewards, dones))]
    # step 0 window {0, 1}: 1 + 0.5*2 = 2, cut at done (step 1) → discount 0, next = step 1's next
    assert (outs[2].row.item(), outs[2].return_n.item(), outs[2].discount_n.item(), outs[2].next_row.item()) == (0, 2.0, 0.0, 20)
    # step 1 window {1}: 2, discount 0
    assert (outs[3].row.item(), outs[3].return_n.item(), outs[3].discount_n.item(), outs[3].next_row.item()) == (10, 2.0, 0.0, 20)
    # step 2 starts fresh after the done: 4 + 0.5*8 + 0.25*16 = 12, full bootstrap
    assert (outs[4].row.item(), outs[4].return_n.item(), outs[4].discount_n.item(), outs[4].next_row.item()) == (20, 12.0, 0.125, 50)
    # step 3: 8 + 0.5*16 + 0.25*32 = 24
    assert (outs[5].return_n.item(), outs[5].discount_n.item()) == (24.0, 0.125)


def test_hand_checked_n3_reset_cuts_with_zero_discount_by_default_and_gamma_m_when_bootstrapping():
    for bootstrap, expect_disc in ((False, 0.0), (True, 0.25)):
        acc = NStepAccumulator(1, 3, 0.5, S, B, "cpu", bootstrap_on_reset=bootstrap)
        outs = [_push_scalar_env(acc, t, r, reset=(t == 1))[0] for t, r in enumerate([1.0, 2.0, 4.0, 8.0])]
        # step 0 window {0, 1} (m = 2): return 2, discount γ^2 = 0.25 if bootstrapping from step 1's next
        assert (outs[2].return_n.item(), outs[2].discount_n.item(), outs[2].next_row.item()) == (2.0, expect_disc, 20)
        # step 1 window {1} (m = 1): return 2, discount γ = 0.5 if bootstrapping
        assert (outs[3].return_n.item(), outs[3].discount_n.item()) == (2.0, expect_disc * 2)


def test_done_on_one_env_does_not_touch_the_others():
    acc = NStepAccumulator(3, 2, 0.5, 0, 1, "cpu")
    z = torch.zeros(3, 0)
    kw = dict(env_state=z, action=torch.zeros(3, 1, dtype=torch.long), next_env_state=z, next_row=torch.arange(3))
    acc.push(row=torch.arange(3), reward=torch.ones(3), done=torch.tensor([False, True, False]), **kw)
    out, valid = acc.push(row=torch.arange(3), reward=torch.ones(3), done=torch.zeros(3, dtype=torch.bool), **kw)
    assert valid.all()
    assert out.return_n.tolist() == [1.5, 1.0, 1.5] and out.discount_n.tolist() == [0.25, 0.0, 0.25]


def test_state_dict_round_trip_continues_identically():
    rng = np.random.default_rng(7)
    pushes, _ = random_stream(rng, 4, 20, p_done=0.2, p_reset=0.1)
    a = NStepAccumulator(4, 3, 0.95, S, B, "cpu")
    for p in pushes[:7]:
        a.push(**p)
    saved = {k: v.clone() for k, v in a.state_dict().items()}
    b = NStepAccumulator(4, 3, 0.95, S, B, "cpu")
    b.load_state_dict(saved)
    for p in pushes[7:]:
        (oa, va), (ob, vb) = a.push(**p), b.push(**p)
        assert torch.equal(va, vb)
        for f in ("row", "env_state", "action", "return_n", "discount_n", "next_row", "next_env_state"):
            assert torch.equal(getattr(oa, f), getattr(ob, f)), f


def test_load_state_dict_refuses_a_different_layout():
    a = NStepAccumulator(4, 3, 0.95, S, B, "cpu")
    b = NStepAccumulator(4, 5, 0.95, S, B, "cpu")
    with pytest.raises(ValueError, match="'row' has shape"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="missing keys"):
        a.load_state_dict({k: v for k, v in a.state_dict().items() if k != "pushes"})


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(n_step=0), "n_step"), (dict(gamma=0.0), "gamma"), (dict(gamma=1.5), "gamma"), (dict(n_envs=0), "n_envs")],
)
def test_invalid_constructor_arguments_are_refused_naming_the_field(kwargs, field):
    base = dict(n_envs=2, n_step=3, gamma=0.9, env_state_dim=S, n_branches=B, device="cpu")
    with pytest.raises(ValueError, match=field):
        NStepAccumulator(**{**base, **kwargs})


def test_push_has_no_host_sync_on_meta_device():
    """Meta tensors have no data: any .item()/bool()/nonzero in push would raise here."""
    acc = NStepAccumulator(4, 3, 0.9, S, B, "meta")
    m = dict(device="meta")
    for _ in range(4):
        out, valid = acc.push(
            row=torch.zeros(4, dtype=torch.long, **m), env_state=torch.zeros(4, S, **m),
            action=torch.zeros(4, B, dtype=torch.long, **m), reward=torch.zeros(4, **m),
            done=torch.zeros(4, dtype=torch.bool, **m), next_row=torch.zeros(4, dtype=torch.long, **m),
            next_env_state=torch.zeros(4, S, **m), reset=torch.zeros(4, dtype=torch.bool, **m),
        )
    assert out.return_n.shape == (4,) and valid.shape == (4,)
