"""The exposure cap kept out of sample, causally (LoopConfig.exposure_gain > 0; docs/walk-forward.md, "Exposure cap").

The cap of LoopConfig.max_exposure is calibrated on the held-out slice (trainer/loop/select.py, `calibrate`): one
margin m0 on FLAT's E[Q] that keeps the greedy policy in a position on at most `cap` of the slice's steps. A slice of
a hundred-odd rows is a small sample of a latent order-flow pressure with a long half-life: on the demo's one-day
windows its free policy was in the market 0.96-0.99 of its steps where the whole evaluation window's was 0.59-0.72,
so m0 came out large and the deployed policy held a position on 0.22-0.40 of the window (docs/RESULTS.md §10).

`ExposureController` wraps the greedy policy and moves the margin with what it does, a Robbins-Monro step towards
the cap:

    m_k = max(0, m_{k-1} + gain * (held_k - cap)),  m_{-1} = m0

held_k is 1 when the env holds a position at decision k (before acting: the outcome of decisions < k) and 0 when
flat; m_k is the margin decision k is taken with. So the margin at a row depends only on the market before it (and
on the policy's own earlier decisions): no look-ahead. Over a long stretch the share of steps held settles at the
cap where the free policy would hold more, and m reaches 0 (the free policy) where it holds less: a cap, never a
floor.

Evaluation (trainer/folds/evaluate.py) runs the continuous pass, one env over the whole window in time order, first
(`start(rows, record=True)`), and records the margin m_{k-1} each of its decisions starts from. Each segment
backtest then starts from the continuous pass's m_{k-1} at the segment's first row, and moves on with its own
decisions: still causal, since that margin was set by the rows before it. No host syncs while stepping.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from trainer.agent.act import Policy
from trainer.sim import ENV_POSITION


class ExposureController:
    """A `Policy` (plus the `start` hook evaluate calls at each reset): `policy_at(margin)` with the margin moved by
    `gain` per step towards holding a position on `cap` of the steps, from `margin0` (see the module docstring).
    policy_at(margin (B,) tensor) -> Policy is called once per pass; the policy it returns must read `margin` at
    each call (trainer.agent.act.flat_bonus does), since the controller updates that tensor in place."""

    def __init__(self, policy_at: Callable[[Tensor], Policy], margin0: float, cap: float, gain: float):
        if not 0.0 < cap < 1.0:
            raise ValueError(f"ExposureController: cap must be in (0, 1), got {cap!r}")
        if not gain > 0.0:
            raise ValueError(f"ExposureController: gain must be > 0, got {gain!r}")
        self.policy_at, self.margin0, self.cap, self.gain = policy_at, float(margin0), float(cap), float(gain)
        self._margin: Tensor | None = None  # (B,) the margin the next decision updates
        self._policy: Policy | None = None  # policy_at(self._margin), built once per pass
        self._trace: list[Tensor] | None = None  # while recording: the margin of each decision, (1,) each
        self.first_row: int | None = None  # the recorded pass's first cursor row
        self.path: Tensor | None = None  # (steps,) the recorded pass's m_{k-1}, the margin each decision starts from

    def start(self, rows: Tensor, record: bool = False) -> None:
        """A new pass whose envs start at cursor rows `rows` (B,): each at the recorded margin of its row, or at
        margin0 where nothing is recorded (or before a pass is). `record`: this pass (one env) is the recording."""
        self._finish()
        m = torch.full(rows.shape, self.margin0, dtype=torch.float32, device=rows.device)
        if self.path is not None and self.path.numel() and not record:
            k = rows - self.first_row
            inside = (k >= 0) & (k < self.path.numel())
            m = torch.where(inside, self.path[k.clamp(0, self.path.numel() - 1)], m)
        self._margin = m
        self._policy = self.policy_at(m)  # reads the margin tensor at every call; __call__ updates it in place
        if record:
            if rows.numel() != 1:
                raise ValueError(f"ExposureController: the recorded pass is one env, got {rows.numel()}")
            self.first_row, self.path, self._trace = int(rows[0]), None, []

    def _finish(self) -> None:
        if self._trace is not None:
            self.path = torch.cat(self._trace) if self._trace else torch.empty(0)
            self._trace = None

    def __call__(self, obs: Tensor, env_state: Tensor) -> Tensor:
        if self._margin is None:
            raise RuntimeError("ExposureController: call start(rows) before the first decision of a pass")
        if self._trace is not None:
            self._trace.append(self._margin.clone())  # the margin this decision starts from: m_{k-1}
        held = (env_state[:, ENV_POSITION] != 0).to(torch.float32)  # (B,)
        self._margin.add_(self.gain * (held - self.cap)).clamp_(min=0.0)
        return self._policy(obs, env_state)

    def summary(self) -> dict[str, float]:
        """The recorded pass's margins (result.json): margin0, their mean, the last, the share of decisions at 0."""
        self._finish()
        path = self.path if self.path is not None and self.path.numel() else torch.tensor([self.margin0])
        return {"eval_exposure_gain": self.gain, "eval_margin_start": self.margin0,
                "eval_margin_mean": float(path.mean()), "eval_margin_last": float(path[-1]),
                "eval_margin_zero_frac": float((path == 0).float().mean())}
