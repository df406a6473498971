"""Action selection from the C51 logits, one action per branch.

Evaluation (explore=False): argmax of E[Q] per branch; deterministic.
Training (explore=True): Thompson sampling on EVERY branch. For each (env, branch, action) one
return is drawn from that action's categorical over atoms (inverse CDF with one torch.rand), and
the action with the largest draw is taken. Exploration therefore concentrates on actions whose
return distributions overlap the best one, and needs no ε schedule. Ties between equal atoms are
broken uniformly at random by adding a jitter in [0, Δz/2) to each draw: it cannot reorder draws
on different atoms (they differ by >= Δz) and avoids argmax's bias towards the lowest index.
Padded actions (`action_mask` False) get -inf and are never chosen.

Sampling from the C51 distribution draws from the *return* distribution (aleatoric noise), not from a posterior
over the mean: on order-book returns the spread of one return (~atoms wide) dwarfs the differences of the means
between directions, so plain draws choose directions almost uniformly (docs/RESULTS.md, diagnosis). `noise_scale`
κ shrinks each draw towards its action's mean, score = E[Q] + κ·(z − E[Q]): κ = 1 is plain Thompson sampling, κ = 0
is greedy, in between the exploration still concentrates on actions whose distributions overlap the best one
(AgentConfig.thompson_scale, with an optional linear anneal: `thompson_scale_at`).

No host syncs, fixed shapes, no branching on tensor values: CUDA-graph capturable. The random
draws come from the default generator of the logits' device (generator-free, so a captured graph
replays with fresh numbers through PyTorch's graph-safe Philox offsets).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from trainer.agent.network import expected_q
from trainer.sim.actions import FLAT, HOLD, LONG, SHORT
from trainer.sim.engine import ENV_POSITION, ENV_TIME_IN_TRADE

Policy = Callable[[Tensor, Tensor], Tensor]
"""policy(obs (B, W, F), env_state (B, S)) -> actions (B, n_branches) int64: what evaluation, the baselines and the
exposure controller (trainer/loop/exposure.py) run."""


def thompson_returns(logits: Tensor, support: Tensor) -> Tensor:
    """One return drawn per action from softmax(logits) on the support, plus a tie-breaking jitter
    in [0, Δz/2). logits (..., N) -> (...)."""
    n_atoms = support.shape[-1]
    cdf = torch.softmax(logits, dim=-1).cumsum(-1)  # (..., N)
    u = torch.rand(cdf.shape[:-1] + (1,), device=cdf.device, dtype=cdf.dtype)  # (..., 1)
    # Inverse CDF: the first atom whose CDF reaches u. The final CDF entry can round below 1, so clamp.
    atom = (cdf < u).sum(-1).clamp(max=n_atoms - 1)  # (...) int64
    delta_z = (support[-1] - support[0]) / (n_atoms - 1)
    jitter = torch.rand(atom.shape, device=cdf.device, dtype=cdf.dtype) * (0.5 * delta_z)
    return support[atom] + jitter


def thompson_scale_at(update_step: Tensor, start: float, final: float, anneal_updates: int) -> Tensor | float:
    """κ at `update_step` (0-dim device tensor): linear from `start` to `final` over `anneal_updates` gradient
    steps, then `final`. Without an anneal (anneal_updates == 0 or final == start) the Python float `start`, so the
    default κ = 1 adds no kernel. Tensor math on the device: no host sync, graph-capturable."""
    if anneal_updates == 0 or final == start:
        return start
    frac = (update_step.to(torch.float32) / anneal_updates).clamp(max=1.0)  # ()
    return start + (final - start) * frac


def flat_bonus(score: Tensor, margin: Tensor | float) -> Tensor:
    """score (B, n_branches, A_max) with `margin` added to the direction branch's FLAT: a position is then opened
    or kept only where some way of holding one (SHORT, LONG, or HOLD while in a position) scores more than going flat
    by over the margin. The stand-aside margin of LoopConfig.max_exposure (trainer/loop/select.py calibrates it):
    one float for every env, or a (B,) tensor, one margin per env (trainer/loop/exposure.py); the float 0 returns
    `score` itself."""
    if isinstance(margin, float) and margin == 0.0:
        return score
    score = score.clone()
    score[:, 0, FLAT] += margin
    return score


def held_margin(margin: Tensor | float, env_state: Tensor, keep_frac: float) -> Tensor | float:
    """The stand-aside margin per env with hysteresis (LoopConfig.keep_margin_frac): `margin` where the env is flat,
    `keep_frac` × `margin` where it holds a position (env_state (B, S), column ENV_POSITION). margin: a float or a
    (B,) tensor, read at this call. keep_frac 1 returns `margin` itself."""
    if keep_frac == 1.0 or (isinstance(margin, float) and margin == 0.0):
        return margin
    held = env_state[:, ENV_POSITION] != 0  # (B,)
    return margin * torch.where(held, keep_frac, 1.0)


def time_in_trade(env_state: Tensor, time_scale_steps: float) -> Tensor:
    """(B,) decisions the current trip of each env has been open (0 when flat), recovered from the agent-visible column
    ENV_TIME_IN_TRADE = tt / (tt + time_scale_steps) (SimConfig.time_scale_steps): tt = s·x / (1 − x), a float within
    float32 rounding of the integer count."""
    x = env_state[:, ENV_TIME_IN_TRADE]
    return time_scale_steps * x / (1.0 - x)


def min_hold(policy: Policy, min_steps: int, time_scale_steps: float) -> Policy:
    """`policy` that keeps every position it opens for at least `min_steps` decisions (LoopConfig.min_hold_steps): while
    an env's trip has been open for fewer, a direction that would end the trip (FLAT, or the opposite side) is sent
    as HOLD, which keeps the position and its working order as they are (simulator rule 2); the same side, which
    resizes the position without closing the trip, and the other branches pass unchanged. The trip's age is read from
    the env state (`time_in_trade`), so the rule sees only what the agent sees. min_steps 0 or 1 returns `policy`
    itself (a trip is 1 decision old at the first decision after it opened)."""
    if min_steps <= 1:
        return policy

    def held(obs: Tensor, env_state: Tensor) -> Tensor:
        return hold_young(policy(obs, env_state), env_state, min_steps, time_scale_steps)

    return held


def hold_young(actions: Tensor, env_state: Tensor, min_steps: int, time_scale_steps: float) -> Tensor:
    """actions (B, n_branches) with each direction that would end a trip open fewer than `min_steps` decisions (FLAT,
    or the side opposite the position) replaced by HOLD; `min_hold`'s rule on actions already chosen, so that the
    deployed policy (LoopConfig.min_hold_steps) and training under the rule (AgentConfig.train_min_hold_steps:
    acting and the double-DQN target's a*) apply one definition. A new tensor; fixed shapes, no host sync."""
    position = env_state[:, ENV_POSITION]
    young = (position != 0) & (time_in_trade(env_state, time_scale_steps) < min_steps - 0.5)
    d = actions[:, 0]
    ends = (d == FLAT) | ((d == SHORT) & (position > 0)) | ((d == LONG) & (position < 0))
    return torch.cat([torch.where(young & ends, HOLD, d).unsqueeze(1), actions[:, 1:]], dim=1)


def select_actions(logits: Tensor, support: Tensor, action_mask: Tensor, explore: bool,
                   noise_scale: Tensor | float = 1.0, flat_margin: Tensor | float = 0.0,
                   branch_epsilon: float = 0.0) -> Tensor:
    """logits (B, n_branches, A_max, N); support (N,); action_mask (n_branches, A_max) bool.
    Returns actions (B, n_branches) int64: Thompson draws shrunk by `noise_scale` towards E[Q] when `explore`
    (see the module docstring), else argmax E[Q], FLAT's score raised by `flat_margin` (`flat_bonus`; greedy only).
    `branch_epsilon` (explore only; AgentConfig.branch_epsilon): each branch but the direction (branch 0) takes, with
    this probability and independently per env and branch, a uniformly random valid action instead of its draw."""
    if explore and (isinstance(flat_margin, Tensor) or flat_margin != 0.0):
        raise ValueError("flat_margin applies to greedy decisions only (explore=False)")
    if branch_epsilon and not explore:
        raise ValueError("branch_epsilon applies to exploring decisions only (explore=True)")
    if not explore:
        score = flat_bonus(expected_q(logits, support), flat_margin)  # (B, nb, A_max)
    elif isinstance(noise_scale, float) and noise_scale == 1.0:
        score = thompson_returns(logits, support)  # plain Thompson: the draws themselves
    else:
        mean = expected_q(logits, support)
        score = mean + noise_scale * (thompson_returns(logits, support) - mean)
    if branch_epsilon > 0.0:
        b, nb, a_max = score.shape
        uniform = torch.rand(b, nb, a_max, device=score.device)  # argmax over the valid ones: a uniform valid action
        coin = torch.rand(b, nb, 1, device=score.device) < branch_epsilon
        coin[:, 0] = False  # the direction explores by its draws alone
        score = torch.where(coin, uniform, score)
    score = score.masked_fill(~action_mask, float("-inf"))
    return score.argmax(dim=-1)


def mirror_directions(q: Tensor) -> Tensor:
    """q (B, n_branches, A_max) with the direction branch's LONG and SHORT swapped: the scores of the mirrored actions.
    Magnitude, order type and urgency are the same on either side and stay."""
    direction = q[:, 0].clone()
    direction[:, LONG], direction[:, SHORT] = q[:, 0, SHORT], q[:, 0, LONG]
    return torch.cat([direction.unsqueeze(1), q[:, 1:]], dim=1)


def mirror_actions(actions: Tensor) -> Tensor:
    """actions (B, n_branches) int64 with LONG and SHORT swapped in the direction branch: the same decision in the
    reflected market (AgentConfig.mirror_augment). HOLD, FLAT and the other branches stay."""
    d = actions[:, 0]
    swapped = torch.where(d == LONG, SHORT, torch.where(d == SHORT, LONG, d))
    return torch.cat([swapped.unsqueeze(1), actions[:, 1:]], dim=1)


def mirrored_greedy(logits: Tensor, logits_reflected: Tensor, support: Tensor, action_mask: Tensor,
                    flat_margin: Tensor | float = 0.0) -> Tensor:
    """Greedy actions (B, n_branches) on the mean of each action's E[Q] in the observed market and of its mirror's
    E[Q] in the reflected one (AgentConfig.mirror): a policy with no preferred direction of its own. logits: the
    network on the observation; logits_reflected: on the reflected observation and env state. FLAT's score is
    raised by `flat_margin` (`flat_bonus`; FLAT is its own mirror, so the policy stays side-free)."""
    score = 0.5 * (expected_q(logits, support) + mirror_directions(expected_q(logits_reflected, support)))
    score = flat_bonus(score, flat_margin)
    return score.masked_fill(~action_mask, float("-inf")).argmax(dim=-1)
