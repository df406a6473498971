"""Action selection: Thompson frequencies against exact enumeration, deterministic argmax, masking."""
from __future__ import annotations

import itertools

import pytest
import torch

from trainer.agent.act import select_actions, thompson_returns
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
