"""C51 projection: Dopamine's published 5-atom golden cases, Eq. 7 as a slow reference, invariants."""
from __future__ import annotations

import pytest
import torch

from trainer.agent.c51 import make_support, project_distribution, project_values


def eq7_reference(values: list[float], probs: list[float], support: list[float]) -> list[float]:
    """Bellemare et al. (2017) Eq. 7 term by term, in plain Python."""
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (len(support) - 1)
    out = []
    for z_i in support:
        total = 0.0
        for tz, p in zip(values, probs):
            tz = min(max(tz, v_min), v_max)
            total += min(max(1.0 - abs(tz - z_i) / dz, 0.0), 1.0) * p
        out.append(total)
    return out


# (source atoms, weights, target support, expected) from google/dopamine
# tests/dopamine/agents/rainbow/rainbow_agent_test.py, ProjectDistributionTest.
DOPAMINE_CASES = {
    "SingleIdenticalDistribution": (
        [[0, 1, 2, 3, 4]], [[0.1, 0.2, 0.1, 0.3, 0.3]], [0, 1, 2, 3, 4], [[0.1, 0.2, 0.1, 0.3, 0.3]]),
    "SingleDifferentDistribution": (
        [[0, 1, 2, 3, 4]], [[0.1, 0.2, 0.1, 0.3, 0.3]], [3, 4, 5, 6, 7], [[0.7, 0.3, 0.0, 0.0, 0.0]]),
    "FromNonMonotonicSupport": (
        [[4, 3, 2, 1, 0]], [[0.1, 0.2, 0.1, 0.3, 0.3]], [3, 4, 5, 6, 7], [[0.9, 0.1, 0.0, 0.0, 0.0]]),
    "ExampleFromCodeComments": (
        [[0, 2, 4, 6, 8], [1, 3, 4, 5, 6]],
        [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.2, 0.5, 0.1, 0.1]],
        [4, 5, 6, 7, 8],
        [[0.8, 0.0, 0.1, 0.0, 0.1], [0.8, 0.1, 0.1, 0.0, 0.0]]),
    "BatchOfDifferentDistributions": (
        [[0, 2, 4, 6, 8], [0, 1, 2, 3, 4], [3, 4, 5, 6, 7]],
        [[0.1, 0.2, 0.3, 0.2, 0.2], [0.1, 0.2, 0.1, 0.3, 0.3], [0.1, 0.2, 0.3, 0.2, 0.2]],
        [3, 4, 5, 6, 7],
        [[0.3, 0.3, 0.0, 0.2, 0.2], [0.7, 0.3, 0.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.2, 0.2]]),
    "BatchOfDifferentDistributionsWithLargerDelta": (
        [[0, 2, 4, 6, 8], [8, 9, 10, 12, 14]],
        [[0.1, 0.2, 0.2, 0.2, 0.3], [0.1, 0.2, 0.4, 0.1, 0.2]],
        [0, 4, 8, 12, 16],
        [[0.2, 0.4, 0.4, 0.0, 0.0], [0.0, 0.0, 0.45, 0.45, 0.1]]),
}


@pytest.mark.parametrize("name", sorted(DOPAMINE_CASES))
def test_project_values_matches_dopamine_golden_case(name):
    values, probs, support, expected = DOPAMINE_CASES[name]
    got = project_values(torch.tensor(values, dtype=torch.float32), torch.tensor(probs), torch.tensor(support,
                         dtype=torch.float32))
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=0)


# The golden cases whose source atoms are an affine image r + γ z of the target support, run
# through the (rewards, discounts) interface the learner uses.
@pytest.mark.parametrize("support,reward,discount,probs,expected", [
    ([3, 4, 5, 6, 7], -3.0, 1.0, [0.1, 0.2, 0.1, 0.3, 0.3], [0.7, 0.3, 0.0, 0.0, 0.0]),
    ([3, 4, 5, 6, 7], 7.0, -1.0, [0.1, 0.2, 0.1, 0.3, 0.3], [0.9, 0.1, 0.0, 0.0, 0.0]),
    ([3, 4, 5, 6, 7], -6.0, 2.0, [0.1, 0.2, 0.3, 0.2, 0.2], [0.3, 0.3, 0.0, 0.2, 0.2]),
    ([4, 5, 6, 7, 8], -8.0, 2.0, [0.1, 0.6, 0.1, 0.1, 0.1], [0.8, 0.0, 0.1, 0.0, 0.1]),
    ([0, 4, 8, 12, 16], 0.0, 0.5, [0.1, 0.2, 0.2, 0.2, 0.3], [0.2, 0.4, 0.4, 0.0, 0.0]),
])
def test_project_distribution_matches_dopamine_cases_as_reward_and_discount(support, reward, discount, probs,
                                                                            expected):
    got = project_distribution(torch.tensor([probs]), torch.tensor([reward]), torch.tensor([discount]),
                               torch.tensor(support, dtype=torch.float32))
    torch.testing.assert_close(got, torch.tensor([expected]), atol=1e-6, rtol=0)


def test_project_distribution_matches_eq7_reference_on_random_batches():
    g = torch.Generator().manual_seed(0)
    support = make_support(-2.0, 3.0, 11)
    probs = torch.softmax(torch.randn(64, 11, generator=g), -1)
    rewards = torch.randn(64, generator=g) * 2.0
    discounts = torch.rand(64, generator=g) * (torch.rand(64, generator=g) > 0.2)
    got = project_distribution(probs, rewards, discounts, support)
    for i in range(64):
        tz = (rewards[i] + discounts[i] * support).tolist()
        want = eq7_reference(tz, probs[i].tolist(), support.tolist())
        torch.testing.assert_close(got[i], torch.tensor(want), atol=1e-5, rtol=0)


def test_mass_is_conserved_including_integer_b():
    support = make_support(-4.0, 4.0, 9)  # Δz = 1: integer rewards with γ = 1 make every b_j integral
    probs = torch.softmax(torch.randn(5, 9, generator=torch.Generator().manual_seed(1)), -1)
    rewards = torch.tensor([0.0, 1.0, -2.0, 3.0, 0.37])
    discounts = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.9])
    got = project_distribution(probs, rewards, discounts, support)
    torch.testing.assert_close(got.sum(-1), torch.ones(5), atol=1e-6, rtol=0)
    # r = 1, γ = 1: a pure shift by one atom, the top two atoms' mass piling on V_MAX.
    shifted = torch.cat([torch.zeros(1), probs[1, :7], probs[1, 7:].sum(0, keepdim=True)])
    torch.testing.assert_close(got[1], shifted, atol=1e-6, rtol=0)


def test_mass_beyond_the_support_is_clipped_onto_the_end_atoms():
    support = make_support(-1.0, 1.0, 5)
    probs = torch.full((2, 5), 0.2)
    got = project_distribution(probs, torch.tensor([50.0, -50.0]), torch.tensor([1.0, 1.0]), support)
    torch.testing.assert_close(got, torch.tensor([[0, 0, 0, 0, 1.0], [1.0, 0, 0, 0, 0]]))


@pytest.mark.parametrize("reward,atom,upper_share", [(0.0, 2, 0.0), (0.25, 2, 0.5), (-0.8, 0, 0.4),
                                                      (7.0, 4, 0.0), (-7.0, 0, 0.0)])
def test_terminal_transition_leaves_a_spike_at_the_clipped_reward(reward, atom, upper_share):
    support = make_support(-1.0, 1.0, 5)  # Δz = 0.5
    probs = torch.softmax(torch.randn(1, 5), -1)
    got = project_distribution(probs, torch.tensor([reward]), torch.tensor([0.0]), support)[0]
    want = torch.zeros(5)
    want[atom] += 1.0 - upper_share
    if upper_share:
        want[atom + 1] += upper_share
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    clipped = min(max(reward, -1.0), 1.0)
    torch.testing.assert_close((got * support).sum(), torch.tensor(clipped), atol=1e-6, rtol=0)


def test_zero_reward_and_unit_discount_is_the_identity():
    support = make_support(-10.0, 10.0, 51)
    probs = torch.softmax(torch.randn(8, 51, generator=torch.Generator().manual_seed(2)) * 3, -1)
    got = project_distribution(probs, torch.zeros(8), torch.ones(8), support)
    torch.testing.assert_close(got, probs, atol=1e-5, rtol=0)  # float32 linspace: b_j off integers by ~1e-6


def test_projection_preserves_the_mean_when_nothing_is_clipped():
    # Splitting p_j between neighbours linearly keeps Σ m_i z_i = Σ p_j T̂z_j exactly.
    support = make_support(-10.0, 10.0, 51)
    probs = torch.softmax(torch.randn(16, 51, generator=torch.Generator().manual_seed(3)), -1)
    rewards, discounts = torch.full((16,), 0.3), torch.full((16,), 0.5)
    got = project_distribution(probs, rewards, discounts, support)
    want_mean = rewards + discounts * (probs * support).sum(-1)
    torch.testing.assert_close((got * support).sum(-1), want_mean, atol=1e-5, rtol=0)


def test_make_support_rejects_an_empty_range():
    with pytest.raises(ValueError, match="v_min < v_max"):
        make_support(1.0, 1.0, 5)


def test_nan_return_gives_nan_mass_not_an_out_of_range_index():
    support = make_support(-1.0, 1.0, 5)
    probs = torch.full((2, 5), 0.2)
    got = project_distribution(probs, torch.tensor([float("nan"), 0.0]), torch.tensor([0.9, 0.9]), support)
    assert torch.isnan(got[0]).any()
    torch.testing.assert_close(got[1].sum(), torch.tensor(1.0))
