"""Action selection: Thompson frequencies against exact enumeration, deterministic argmax, masking."""
from __future__ import annotations

import itertools

import pytest
import torch

from trainer.agent.act import (held_margin, min_hold, mirror_actions, mirror_directions, mirrored_greedy, select_actions,
                               thompson_returns, time_in_trade)
from trainer.agent.c51 import make_support
from trainer.agent.network import branch_action_mask


def exact_thompson_choice_probs(probs: list[list[float]]) -> list[float]:
    """P(action a is chosen) by enumerating every joint atom draw; tied maxima share uniformly."""
    n_actions, n_atoms = len(probs), len(probs[0])
    out = [0.0] * n_actions
    for draw in itertools.product(range(n_atoms), repeat=n_actions):
        p = 1.0
        for a, i in enumerate(draw):
            p *= probs[a][i]
        best = max(draw)
        winners = [a for a, i in enumerate(draw) if i == best]
        for a in winners:
            out[a] += p / len(winners)
    return out


def test_thompson_picks_each_direction_with_the_probability_its_sampled_return_is_max():
    torch.manual_seed(0)
    support = make_support(-2.0, 2.0, 5)
    # Hand-built direction distributions: SHORT middling, HOLD spike at 0, LONG and FLAT wide.
    probs = [[0.0, 0.1, 0.3, 0.6, 0.0],
             [0.0, 0.0, 1.0, 0.0, 0.0],
             [0.3, 0.1, 0.1, 0.2, 0.3],
             [0.4, 0.3, 0.0, 0.0, 0.3]]
    want = torch.tensor(exact_thompson_choice_probs(probs))
    n = 200_000
    logits = torch.tensor(probs).clamp_min(1e-12).log()  # (4, 5)
    logits = logits.expand(n, 1, 4, 5)
    actions = select_actions(logits, support, torch.ones(1, 4, dtype=torch.bool), explore=True)
    freq = torch.bincount(actions[:, 0], minlength=4).double() / n
    # Binomial standard error <= sqrt(0.25 / n) ≈ 0.0011: 5 sigma.
    torch.testing.assert_close(freq, want.double(), atol=0.006, rtol=0)
    assert want.min() > 0.05  # the case is not degenerate


def test_thompson_draws_follow_the_atom_distribution():
    torch.manual_seed(1)
    support = make_support(-1.0, 1.0, 5)
    probs = torch.tensor([0.1, 0.2, 0.4, 0.0, 0.3])
    draws = thompson_returns(probs.log().expand(100_000, 5), support)
    atom = torch.round((draws - support[0]) / 0.5 - 0.25).long()  # undo the [0, Δz/2) jitter
    assert torch.all((draws - support[atom] >= 0) & (draws - support[atom] < 0.25))
    freq = torch.bincount(atom, minlength=5).double() / 100_000
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)


def test_evaluation_takes_argmax_expected_q_and_is_deterministic():
    torch.manual_seed(2)
    support = make_support(-10.0, 10.0, 51)
    logits = torch.randn(64, 4, 4, 51) * 2
    mask = branch_action_mask((4, 3, 3, 3))
    a1 = select_actions(logits, support, mask, explore=False)
    a2 = select_actions(logits, support, mask, explore=False)
    assert a1.dtype == torch.int64 and a1.shape == (64, 4)
    assert torch.equal(a1, a2)
    # Slow reference: loop over envs and branches.
    q = (torch.softmax(logits, -1) * support).sum(-1)
    for b in range(64):
        for br, n_act in enumerate((4, 3, 3, 3)):
            assert a1[b, br] == max(range(n_act), key=lambda a: float(q[b, br, a]))


@pytest.mark.parametrize("explore", [True, False])
def test_padded_actions_are_never_chosen_even_when_they_look_best(explore):
    torch.manual_seed(3)
    support = make_support(-1.0, 1.0, 11)
    mask = branch_action_mask((4, 3, 3, 3))
    logits = torch.zeros(5000, 4, 4, 11)
    logits[:, 1:, 3, -1] = 50.0  # the padded slot of branches 1..3 puts all mass on V_MAX
    actions = select_actions(logits, support, mask, explore)
    assert actions[:, 1:].max() <= 2
    if explore:  # identical real distributions: every real action gets picked
        assert set(actions[:, 1].tolist()) == {0, 1, 2}


def test_thompson_scale_anneals_linearly_on_the_device_and_is_a_plain_float_without_an_anneal():
    from trainer.agent.act import thompson_scale_at

    assert thompson_scale_at(torch.tensor(7), 1.0, 1.0, 0) == 1.0  # no anneal: the Python float, no kernel
    assert thompson_scale_at(torch.tensor(7), 0.3, 0.1, 0) == 0.3
    # start 1.0 → final 0.2 over 100 updates: 1 − 0.8·t/100, then 0.2.
    got = [float(thompson_scale_at(torch.tensor(t), 1.0, 0.2, 100)) for t in (0, 25, 50, 100, 400)]
    assert got == pytest.approx([1.0, 0.8, 0.6, 0.2, 0.2])


def test_shrunk_thompson_draws_prefer_the_higher_mean_over_a_wider_distribution():
    # Support (-2, -1, 0, 1, 2). SHORT: a spike at +1 (mean 1.0). LONG: half at -2, half at +2 (mean 0), so a plain
    # draw beats SHORT's +1 whenever it lands on +2: P(LONG) = 0.5 exactly (HOLD/FLAT sit at -2, never chosen).
    # Shrunk by κ = 0.2 a LONG draw scores 0 + 0.2·(±2) = ±0.4 < 1, SHORT's score stays 1 (its draw is its mean,
    # up to the tie jitter < Δz/2 · κ): SHORT always. κ = 0 is the greedy choice.
    torch.manual_seed(1)
    support = make_support(-2.0, 2.0, 5)
    probs = [[0, 0, 0, 1, 0], [1, 0, 0, 0, 0], [0.5, 0, 0, 0, 0.5], [1, 0, 0, 0, 0]]
    n = 20_000
    logits = torch.tensor(probs, dtype=torch.float32).clamp_min(1e-12).log().expand(n, 1, 4, 5)
    mask = torch.ones(1, 4, dtype=torch.bool)
    plain = select_actions(logits, support, mask, explore=True)[:, 0]
    assert abs(float((plain == 2).float().mean()) - 0.5) < 0.02
    assert set(plain.unique().tolist()) == {0, 2}
    shrunk = select_actions(logits, support, mask, explore=True, noise_scale=0.2)[:, 0]
    assert bool((shrunk == 0).all())
    greedy = select_actions(logits, support, mask, explore=True, noise_scale=0.0)[:, 0]
    assert torch.equal(greedy, select_actions(logits, support, mask, explore=False)[:, 0])


def test_branch_epsilon_randomises_the_other_branches_uniformly_over_valid_actions_and_leaves_the_direction():
    # κ = 0: without ε every branch takes its greedy action. Branch 1 has 3 valid actions of 4 (the last is padding).
    n, eps = 40_000, 0.3
    support = make_support(-1.0, 1.0, 11)
    logits = torch.randn(1, 2, 4, 11, generator=torch.Generator().manual_seed(2)).expand(n, 2, 4, 11)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    greedy = select_actions(logits, support, mask, explore=False)[0]
    torch.manual_seed(0)
    got = select_actions(logits, support, mask, explore=True, noise_scale=0.0, branch_epsilon=eps)
    assert bool((got[:, 0] == greedy[0]).all())  # the direction: its draw, untouched
    freq = torch.bincount(got[:, 1], minlength=4).float() / n
    # each other valid action: ε/3; the greedy one: 1 − ε + ε/3; the padded one never
    want = torch.full((4,), eps / 3)
    want[greedy[1]] += 1 - eps
    want[3] = 0.0
    assert torch.allclose(freq, want, atol=0.01), (freq, want)
    assert torch.equal(select_actions(logits[:8], support, mask, explore=True, noise_scale=0.0, branch_epsilon=0.0),
                       greedy.expand(8, 2))
    with pytest.raises(ValueError, match="branch_epsilon"):
        select_actions(logits[:2], support, mask, explore=False, branch_epsilon=0.1)


def test_thompson_scale_one_draws_exactly_the_plain_thompson_actions():
    support = make_support(-1.0, 1.0, 11)
    logits = torch.randn(64, 4, 4, 11, generator=torch.Generator().manual_seed(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    torch.manual_seed(5)
    a = select_actions(logits, support, mask, explore=True)
    torch.manual_seed(5)
    b = select_actions(logits, support, mask, explore=True, noise_scale=1.0)
    assert torch.equal(a, b)


def _logits_for(q: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """C51 logits (B, nb, A, N) whose E[Q] is `q` (B, nb, A), for q inside the support: all mass on the two atoms
    around each value, split to hit it exactly."""
    dz = float(support[1] - support[0])
    pos = (q - support[0]) / dz
    lo = pos.floor().long().clamp(max=support.numel() - 2)
    frac = pos - lo
    p = torch.zeros(*q.shape, support.numel())
    p.scatter_(-1, lo.unsqueeze(-1), (1 - frac).unsqueeze(-1))
    p.scatter_add_(-1, (lo + 1).unsqueeze(-1), frac.unsqueeze(-1))
    return torch.log(p.clamp(min=1e-30))


def test_mirrored_greedy_averages_each_action_with_its_mirror_in_the_reflected_market():
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    support = make_support(-10.0, 10.0, 51)
    mask = branch_action_mask((4, 3))
    q = torch.zeros(1, 2, 4)
    q[0, 0, [SHORT, HOLD, LONG, FLAT]] = torch.tensor([1.0, 0.0, 3.0, 0.5])
    q[0, 1, :3] = torch.tensor([0.0, 2.0, 1.0])
    qr = torch.zeros(1, 2, 4)  # the reflected market: SHORT there is LONG here
    qr[0, 0, [SHORT, HOLD, LONG, FLAT]] = torch.tensor([5.0, 0.0, 0.0, 0.5])
    qr[0, 1, :3] = torch.tensor([4.0, 0.0, 0.0])
    swapped = mirror_directions(qr)
    assert swapped[0, 0, LONG] == 5.0 and swapped[0, 0, SHORT] == 0.0 and torch.equal(swapped[0, 1], qr[0, 1])
    # direction: LONG (3 + 5) / 2 = 4 beats SHORT (1 + 0) / 2; magnitude: (0 + 4) / 2 = 2 beats (2 + 0) / 2 = 1
    a = mirrored_greedy(_logits_for(q, support), _logits_for(qr, support), support, mask)
    assert a.tolist() == [[LONG, 0]]
    # the plain greedy policy on the observed market alone would pick LONG and magnitude 1
    assert select_actions(_logits_for(q, support), support, mask, explore=False).tolist() == [[LONG, 1]]


def test_mirror_actions_swaps_long_and_short_and_leaves_hold_flat_and_the_other_branches():
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    a = torch.tensor([[SHORT, 2, 1, 0], [HOLD, 0, 2, 1], [LONG, 1, 0, 2], [FLAT, 2, 2, 2]])
    assert mirror_actions(a).tolist() == [[LONG, 2, 1, 0], [HOLD, 0, 2, 1], [SHORT, 1, 0, 2], [FLAT, 2, 2, 2]]
    assert torch.equal(mirror_actions(mirror_actions(a)), a)


def test_mirrored_greedy_is_equivariant_the_reflected_market_gets_the_mirrored_direction():
    from trainer.sim import LONG, SHORT

    support = make_support(-10.0, 10.0, 51)
    mask = branch_action_mask((4, 3, 3))
    gen = torch.Generator().manual_seed(3)
    a_logits, b_logits = (torch.randn(64, 3, 4, 51, generator=gen) for _ in range(2))
    here = mirrored_greedy(a_logits, b_logits, support, mask)
    there = mirrored_greedy(b_logits, a_logits, support, mask)  # the same two views, taken from the other side
    swap = torch.tensor([LONG if x == SHORT else SHORT if x == LONG else x for x in range(4)])
    assert torch.equal(there[:, 0], swap[here[:, 0]]) and torch.equal(there[:, 1:], here[:, 1:])
    assert {int(x) for x in here[:, 0]} >= {SHORT, LONG}


def test_flat_margin_stands_aside_unless_a_position_beats_flat_by_more_than_the_margin():
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    support = make_support(-10.0, 10.0, 51)
    mask = branch_action_mask((4, 3))
    q = torch.zeros(3, 2, 4)
    # row 0: LONG 1.0 over FLAT 0.7 (gap 0.3); row 1: HOLD (keep the position) 0.9 over FLAT 0.75 (gap 0.15);
    # row 2: FLAT already best
    q[:, 0, [SHORT, HOLD, LONG, FLAT]] = torch.tensor([[0.2, 0.5, 1.0, 0.7], [0.1, 0.9, 0.3, 0.75],
                                                        [0.0, 0.1, 0.2, 0.4]])
    q[:, 1, :3] = torch.tensor([0.0, 2.0, 1.0])
    logits = _logits_for(q, support)

    def directions(margin: float) -> list[int]:
        return select_actions(logits, support, mask, explore=False, flat_margin=margin)[:, 0].tolist()

    assert directions(0.0) == [LONG, HOLD, FLAT]
    assert directions(0.2) == [LONG, FLAT, FLAT]  # 0.75 + 0.2 > 0.9; 0.7 + 0.2 < 1.0
    assert directions(0.35) == [FLAT, FLAT, FLAT]  # 0.7 + 0.35 > 1.0
    # only the direction branch moves: the magnitude is still argmax E[Q]
    assert select_actions(logits, support, mask, explore=False, flat_margin=0.35)[:, 1].tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="greedy"):
        select_actions(logits, support, mask, explore=True, flat_margin=0.1)
    # one margin per env (trainer/loop/exposure.py): row 0 at 0.35 (FLAT), row 1 at 0 (HOLD), row 2 at 0.2 (FLAT)
    assert directions(torch.tensor([0.35, 0.0, 0.2])) == [FLAT, HOLD, FLAT]
    assert directions(torch.tensor([0.2, 0.1, 0.0])) == [LONG, HOLD, FLAT]  # 0.75 + 0.1 < 0.9
    with pytest.raises(ValueError, match="greedy"):
        select_actions(logits, support, mask, explore=True, flat_margin=torch.zeros(3))


def test_mirrored_greedy_with_a_flat_margin_compares_the_mirrored_scores_with_flat():
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    support = make_support(-10.0, 10.0, 51)
    mask = branch_action_mask((4, 3))
    q, qr = torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    q[0, 0, [SHORT, HOLD, LONG, FLAT]] = torch.tensor([0.0, 0.0, 3.0, 1.0])
    qr[0, 0, [SHORT, HOLD, LONG, FLAT]] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # mirrored: LONG (3 + 1) / 2 = 2, FLAT (1 + 1) / 2 = 1; LONG alone here would beat FLAT by 2, mirrored by 1
    args = (_logits_for(q, support), _logits_for(qr, support), support, mask)
    assert mirrored_greedy(*args, flat_margin=0.9)[0, 0] == LONG
    assert mirrored_greedy(*args, flat_margin=1.1)[0, 0] == FLAT
    assert select_actions(args[0], support, mask, explore=False, flat_margin=1.1)[0, 0] == LONG


def test_held_margin_scales_the_margin_only_where_a_position_is_held():
    env = torch.zeros(4, 7)
    env[:, 0] = torch.tensor([0.0, 1.0 / 3, -1.0, 0.0])  # position / max_position: flat, long 1, short 3, flat
    assert held_margin(0.4, env, 1.0) == 0.4  # no hysteresis: the margin itself
    assert held_margin(0.0, env, 0.5) == 0.0  # no margin: nothing to scale
    assert torch.allclose(held_margin(0.4, env, 0.25), torch.tensor([0.4, 0.1, 0.1, 0.4]))
    assert torch.equal(held_margin(0.4, env, 0.0), torch.tensor([0.4, 0.0, 0.0, 0.4]))
    per_env = torch.tensor([0.2, 0.6, 0.8, 0.0])  # the controller's margins (trainer/loop/exposure.py)
    assert torch.allclose(held_margin(per_env, env, 0.5), torch.tensor([0.2, 0.3, 0.4, 0.0]))


def test_with_hysteresis_a_position_needs_the_margin_to_open_and_less_to_stay_open():
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    support = make_support(-10.0, 10.0, 51)
    mask = branch_action_mask((4, 3))
    q = torch.zeros(2, 2, 4)
    # both rows: the best way to hold a position leads FLAT by 0.15 (LONG 0.85 when flat; HOLD 0.85 when long)
    q[:, 0, [SHORT, HOLD, LONG, FLAT]] = torch.tensor([[0.1, 0.2, 0.85, 0.7], [0.1, 0.85, 0.3, 0.7]])
    q[:, 1, :3] = torch.tensor([0.0, 2.0, 1.0])
    logits = _logits_for(q, support)
    env = torch.zeros(2, 7)
    env[1, 0] = 1.0  # row 1 holds a long position

    def directions(margin: float, keep: float) -> list[int]:
        m = held_margin(margin, env, keep)
        return select_actions(logits, support, mask, explore=False, flat_margin=m)[:, 0].tolist()

    assert directions(0.1, 1.0) == [LONG, HOLD]  # 0.7 + 0.1 < 0.85 both ways
    assert directions(0.2, 1.0) == [FLAT, FLAT]  # 0.9 > 0.85: no entry, and the position is closed
    assert directions(0.2, 0.5) == [FLAT, HOLD]  # kept: 0.7 + 0.1 < 0.85, while flat still does not enter
    assert directions(0.4, 0.5) == [FLAT, FLAT]  # 0.7 + 0.2 > 0.85
    assert directions(5.0, 0.0) == [FLAT, HOLD]  # keep 0: held until FLAT scores best outright


def test_time_in_trade_recovers_the_simulators_trip_age_from_the_agent_visible_env_state():
    from trainer.sim import FLAT, HOLD, LONG, MARKET, SHORT, SimConfig, Simulator
    from trainer.sim.synthetic import random_decision_tape

    cfg = SimConfig(n_envs=1, time_scale_steps=50.0)
    sim = Simulator(random_decision_tape(200, seed=1), cfg, "cpu")
    st = sim.reset(0, 200, start_rows=torch.tensor([0]))
    ages = []
    for d in [LONG, HOLD, HOLD, SHORT, HOLD, FLAT, HOLD] + [LONG] * 120:  # open, keep, reverse (a new trip), close, ...
        sim.step(st, torch.tensor([[d, 2, MARKET, 0]]))
        ages.append(round(float(time_in_trade(sim.env_features(st), cfg.time_scale_steps)[0]), 3))
        assert ages[-1] == int(st.time_in_trade[0])  # exact to float32 rounding, far past time_scale_steps
    assert ages[:7] == [1, 2, 3, 1, 2, 0, 0] and ages[-1] == 120


def _directions(*rows: int):
    """A policy that sends these directions (one per env) and a fixed magnitude / order / urgency."""
    def policy(obs, env_state):
        a = torch.zeros(len(rows), 4, dtype=torch.int64)
        a[:, 0], a[:, 1], a[:, 2] = torch.tensor(rows), 2, 1
        return a
    return policy


def test_min_hold_sends_hold_for_a_decision_that_would_end_a_young_trip_and_passes_the_rest():
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    scale = 50.0
    # (position / max_position, trip age tt): env_state's time-in-trade column is tt / (tt + 50)
    env = torch.zeros(8, 7)
    env[:, 0] = torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3, -1.0, -1.0, 1 / 3, 2 / 3])
    tt = torch.tensor([0.0, 2.0, 3.0, 1.0, 1.0, 2.0, 2.0, 40.0])
    env[:, 6] = tt / (tt + scale)
    sent = (LONG, FLAT, FLAT, SHORT, SHORT, LONG, LONG, FLAT)
    got = min_hold(_directions(*sent), 3, scale)(torch.zeros(8, 2, 1), env)
    # flat: opens; long 2 old: FLAT held; long 3 old: may close; long 1 old: a reversal held; short 1 old, SHORT:
    # the same side passes (a resize, the trip goes on); short 2 old, LONG: a reversal held; long, LONG: passes;
    # long 40 old: may close
    assert got[:, 0].tolist() == [LONG, HOLD, FLAT, HOLD, SHORT, HOLD, LONG, FLAT]
    assert got[:, 1:].tolist() == [[2, 1, 0]] * 8  # the other branches as the policy sent them
    inner = _directions(*sent)
    assert min_hold(inner, 0, scale) is inner and min_hold(inner, 1, scale) is inner  # off


def test_hold_young_rewrites_only_the_direction_of_actions_already_chosen():
    from trainer.agent.act import hold_young
    from trainer.sim import FLAT, HOLD, LONG, SHORT

    scale = 50.0
    env = torch.zeros(4, 7)
    env[:, 0] = torch.tensor([1 / 3, 1 / 3, -2 / 3, 0.0])
    tt = torch.tensor([1.0, 4.0, 2.0, 0.0])
    env[:, 6] = tt / (tt + scale)
    actions = torch.tensor([[SHORT, 0, 1, 2], [FLAT, 1, 2, 0], [LONG, 2, 0, 1], [FLAT, 2, 2, 2]])
    got = hold_young(actions, env, 4, scale)
    # long 1 old reversing: held; long 4 old closing: may; short 2 old reversing: held; flat: nothing to hold
    assert got.tolist() == [[HOLD, 0, 1, 2], [FLAT, 1, 2, 0], [HOLD, 2, 0, 1], [FLAT, 2, 2, 2]]
    assert actions[0, 0] == SHORT  # a new tensor: the input is not written


def test_under_min_hold_every_trip_a_flipping_policy_opens_lasts_the_minimum_in_the_simulator():
    from trainer.sim import FLAT, LONG, MARKET, SHORT, SimConfig, Simulator
    from trainer.sim.synthetic import random_decision_tape

    cfg = SimConfig(n_envs=3, time_scale_steps=50.0)
    sim = Simulator(random_decision_tape(300, seed=4), cfg, "cpu")
    gen = torch.Generator().manual_seed(0)

    def flipping(obs, env_state):  # a new direction each decision: trips of 1-2 decisions on its own
        a = torch.zeros(3, 4, dtype=torch.int64)
        a[:, 0] = torch.tensor((SHORT, LONG, FLAT))[torch.randint(0, 3, (3,), generator=gen)]
        a[:, 1], a[:, 2] = 2, MARKET
        return a

    for h, want_min in ((0, 1), (5, 5)):
        policy = min_hold(flipping, h, cfg.time_scale_steps)
        st = sim.reset(0, 300, start_rows=torch.tensor([0, 0, 0]))
        ended = []  # the age of each trip when a decision ended it
        for _ in range(250):
            age, pos = st.time_in_trade.clone(), st.position.clone()
            sim.step(st, policy(torch.zeros(3, 2, 1), sim.env_features(st)))
            ended += [int(a) for a, p0, p1 in zip(age, pos, st.position) if p0 != 0 and (p1 == 0 or p0 * p1 < 0)]
        assert len(ended) > 30 and min(ended) == want_min
