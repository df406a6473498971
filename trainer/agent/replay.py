"""Prioritised replay on the device, fed by an n-step return accumulator.

Two pieces, both pure tensor code with persistent buffers updated in place, so the whole
act → store → sample → learn → update step can be captured as one CUDA graph:

- `NStepAccumulator` turns the per-env stream of 1-step experience into n-step transitions
  (Hessel et al. 2018, "Rainbow"): return_n = Σ_{k<m} γ^k r_{t+k}, discount_n = γ^m, cut at `done`.
- `PrioritizedReplay` is proportional prioritised experience replay (Schaul et al. 2016):
  P(i) = p_i^α / Σ_j p_j^α, importance weights w_i = (N·P(i))^−β / max_batch w, β annealed on an
  on-device counter. Sampling is one cumsum + searchsorted over the flat priority array.

Neither stores observation windows: a transition holds the decision-row index of its observation
(and of its bootstrap observation); the learner gathers windows from the on-device feature tensor.

Host syncs: none in `push`, `add`, `sample`, `update_priorities` (no `.item()`, no data-dependent
shapes, no Python branching on tensor values). `state_dict`/`load_state_dict` copy tensors and are
meant for checkpoint intervals only. See docs/replay.md for the design choices.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

ACTION_STORE_DTYPE = torch.int16  # per-branch action indices; every branch must have < 32768 choices


def effective_capacity(requested: int, n_envs: int) -> int:
    """Replay capacity actually used: max(requested, 4 * n_envs), rounded up to a power of two.

    At least 4 pushes' worth of transitions, so one `add` never overwrites more than a quarter of
    the buffer; a power of two keeps allocations regular across configs.
    """
    if requested < 1:
        raise ValueError(f"capacity must be >= 1, got {requested}")
    if n_envs < 1:
        raise ValueError(f"n_envs must be >= 1, got {n_envs}")
    need = max(int(requested), 4 * int(n_envs))
    return 1 << (need - 1).bit_length()


@dataclass(frozen=True)
class ReplayConfig:
    """Prioritised-replay settings (one block of the training config).

    n_step and gamma live in the agent config (one source of truth) and go straight to
    `NStepAccumulator`, as does its `bootstrap_on_reset` switch.
    """

    capacity: int = 1 << 20
    """Requested number of stored transitions; the buffer uses `effective_capacity(capacity, n_envs)`."""
    alpha: float = 0.6
    """Priority exponent α at the start: P(i) ∝ p_i^α (0 = uniform over non-empty slots)."""
    alpha_end: float | None = None
    """α at the end of the schedule (linear over `beta_steps` samples); None keeps α constant."""
    beta_start: float = 0.4
    """Importance-sampling exponent β at the first sample."""
    beta_end: float = 1.0
    """β after `beta_steps` samples (1 = fully corrects the sampling bias)."""
    beta_steps: int = 100_000
    """Number of `sample` calls over which β (and α) move linearly from start to end."""
    eps: float = 1e-6
    """Added to every priority passed to `update_priorities`, so no seen transition starves."""

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        for name in ("alpha", "alpha_end"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        for name in ("beta_start", "beta_end"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        if self.beta_steps < 1:
            raise ValueError(f"beta_steps must be >= 1, got {self.beta_steps}")
        if not self.eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")


class Transitions(NamedTuple):
    """A batch of n-step transitions, one per row: the one batch type of the training step.

    `NStepAccumulator.push` emits it, `PrioritizedReplay.add` stores it, `PrioritizedReplay.sample` returns it with
    `weight` set, the step gathers `obs` and `next_obs` from the feature tensor (trainer/loop/step.py), and the
    learner trains on it (`Learner.backward` reads obs, env_state, action, return_n, discount_n, next_obs,
    next_env_state, weight).
    """

    row: torch.Tensor  # (N,) int64 decision row of obs
    env_state: torch.Tensor  # (N, S) float32 env's own state at obs
    action: torch.Tensor  # (N, n_branches) int64
    return_n: torch.Tensor  # (N,) float32 Σ_{k<m} γ^k r_{t+k}, cut at done / reset
    discount_n: torch.Tensor  # (N,) float32 γ^m to bootstrap with, 0 when cut by done
    next_row: torch.Tensor  # (N,) int64 decision row of the bootstrap obs
    next_env_state: torch.Tensor  # (N, S) float32
    weight: torch.Tensor | None = None  # (N,) importance-sampling weight, batch max 1 (set by `sample`)
    obs: torch.Tensor | None = None  # (N, W, F) float32 feature window ending at `row` (set by the step)
    next_obs: torch.Tensor | None = None  # (N, W, F) float32 feature window ending at `next_row`


def _check_state(sd: dict[str, torch.Tensor], own: dict[str, torch.Tensor], what: str) -> None:
    """Refuse a state dict whose keys, shapes or dtypes differ from ours (a layout mismatch)."""
    missing, extra = own.keys() - sd.keys(), sd.keys() - own.keys()
    if missing or extra:
        raise ValueError(f"{what} state: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}")
    for k, t in own.items():
        s = sd[k]
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"{what} state: '{k}' is a {type(s).__name__}, expected a tensor")
        if s.shape != t.shape or s.dtype != t.dtype:
            raise ValueError(
                f"{what} state: '{k}' has shape {tuple(s.shape)} {s.dtype}, expected {tuple(t.shape)} {t.dtype}"
            )


class NStepAccumulator:
    """Per-env ring of the last n steps that emits one n-step transition per env per `push`.

    Every pushed step's transition is emitted exactly once, at the `push` n−1 calls later, when its
    ring slot comes round again. A `done` (or `reset`) within its window freezes it early: return,
    discount and bootstrap state stop at the cut; it then waits in its slot until its turn. So the
    output is always exactly n_envs rows (fixed shapes for CUDA graphs); `valid` is False only for
    the first n−1 pushes, before any slot has come round. Steps after a cut start fresh windows.

    `bootstrap_on_reset`: on an env auto-reset, False cuts with discount 0 (treated as terminal, a
    small documented bias, safe whatever `next_row` comes with the reset); True bootstraps with γ^m
    from the `next_row`/`next_env_state` given with the reset, which must then be the pre-reset
    successor state.
    """

    def __init__(
        self,
        n_envs: int,
        n_step: int,
        gamma: float,
        env_state_dim: int,
        n_branches: int,
        device: torch.device | str,
        bootstrap_on_reset: bool = False,
    ):
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        if env_state_dim < 0:
            raise ValueError(f"env_state_dim must be >= 0, got {env_state_dim}")
        if n_branches < 1:
            raise ValueError(f"n_branches must be >= 1, got {n_branches}")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.n_envs, self.n_step, self.gamma = n_envs, n_step, float(gamma)
        self.env_state_dim, self.n_branches = env_state_dim, n_branches
        self.bootstrap_on_reset = bool(bootstrap_on_reset)
        self.device = torch.device(device)
        E, n, S, B, dev = n_envs, n_step, env_state_dim, n_branches, self.device
        # The ring: slot j of env e holds the transition pushed at a step t with t % n == j.
        self.row = torch.zeros(E, n, dtype=torch.int64, device=dev)
        self.env_state = torch.zeros(E, n, S, dtype=torch.float32, device=dev)
        self.action = torch.zeros(E, n, B, dtype=torch.int64, device=dev)
        self.return_n = torch.zeros(E, n, dtype=torch.float32, device=dev)
        # γ^k for the next reward while open; after the transition closes, its bootstrap discount.
        self.mult = torch.zeros(E, n, dtype=torch.float32, device=dev)
        self.open = torch.zeros(E, n, dtype=torch.bool, device=dev)
        self.next_row = torch.zeros(E, n, dtype=torch.int64, device=dev)
        self.next_env_state = torch.zeros(E, n, S, dtype=torch.float32, device=dev)
        self.pushes = torch.zeros((), dtype=torch.int64, device=dev)  # number of push calls so far
        self._gamma_t = torch.tensor(self.gamma, dtype=torch.float32, device=dev)

    def push(
        self,
        row: torch.Tensor,
        env_state: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
        next_row: torch.Tensor,
        next_env_state: torch.Tensor,
        reset: torch.Tensor | None = None,
    ) -> tuple[Transitions, torch.Tensor]:
        """Record one env step for all envs; return the transitions that mature now and their mask.

        Shapes: row, reward, done, next_row, reset (n_envs,); env_state, next_env_state (n_envs, S);
        action (n_envs, n_branches). `done` closes every open window of the env with discount 0 (a
        closed round trip); `reset` (auto-reset to a new offset) closes them too, with discount 0
        unless `bootstrap_on_reset`. Returns (Transitions with n_envs rows, valid (n_envs,) bool).
        """
        n = self.n_step
        slot = torch.remainder(self.pushes, n).view(1)  # (1,) ring slot of this step
        # 1. Open a new window in this step's slot.
        self.row.index_copy_(1, slot, row.view(-1, 1).to(torch.int64))
        self.env_state.index_copy_(1, slot, env_state.unsqueeze(1).to(torch.float32))
        self.action.index_copy_(1, slot, action.unsqueeze(1).to(torch.int64))
        self.return_n.index_fill_(1, slot, 0.0)
        self.mult.index_fill_(1, slot, 1.0)
        self.open.index_fill_(1, slot, True)
        # 2. Every open window takes this reward: G += γ^k r, then γ^k → γ^(k+1). Kept as a separate
        #    mul and add (no FMA) so the slow reference can reproduce the float32 rounding exactly.
        r = reward.to(torch.float32).unsqueeze(1)  # (n_envs, 1)
        self.return_n.add_(torch.where(self.open, self.mult * r, torch.zeros_like(self.mult)))
        self.mult.copy_(torch.where(self.open, self.mult * self._gamma_t, self.mult))
        self.next_row.copy_(torch.where(self.open, next_row.view(-1, 1).to(torch.int64), self.next_row))
        self.next_env_state.copy_(
            torch.where(self.open.unsqueeze(2), next_env_state.unsqueeze(1).to(torch.float32), self.next_env_state)
        )
        # 3. Cut: done zeroes the bootstrap; reset zeroes it unless configured to bootstrap.
        done_b = done.to(torch.bool).view(-1, 1)  # (n_envs, 1)
        reset_b = torch.zeros_like(done_b) if reset is None else reset.to(torch.bool).view(-1, 1)
        zero_boot = done_b if self.bootstrap_on_reset else (done_b | reset_b)
        self.mult.masked_fill_(self.open & zero_boot, 0.0)
        self.open.logical_and_(~(done_b | reset_b))
        # 4. Emit the oldest slot (pushed n−1 calls ago): it has seen n rewards, or was cut earlier.
        #    An open window at maturity bootstraps with mult = γ^n.
        emit = torch.remainder(self.pushes + 1, n).view(1)
        out = Transitions(
            row=self.row.index_select(1, emit).squeeze(1),
            env_state=self.env_state.index_select(1, emit).squeeze(1),
            action=self.action.index_select(1, emit).squeeze(1),
            return_n=self.return_n.index_select(1, emit).squeeze(1),
            discount_n=self.mult.index_select(1, emit).squeeze(1),
            next_row=self.next_row.index_select(1, emit).squeeze(1),
            next_env_state=self.next_env_state.index_select(1, emit).squeeze(1),
        )
        self.open.index_fill_(1, emit, False)
        valid = (self.pushes >= n - 1).expand(self.n_envs).clone()  # (n_envs,) bool
        self.pushes.add_(1)
        return out, valid

    def _state(self) -> dict[str, torch.Tensor]:
        names = ("row", "env_state", "action", "return_n", "mult", "open", "next_row", "next_env_state", "pushes")
        return {k: getattr(self, k) for k in names}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The ring and the push counter as plain tensors (references; the checkpointer copies them)."""
        return dict(self._state())

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore in place (buffer addresses stay valid for a captured CUDA graph)."""
        own = self._state()
        _check_state(state, own, "NStepAccumulator")
        for k, t in own.items():
            t.copy_(state[k])


class PrioritizedReplay:
    """Proportional prioritised replay (Schaul et al. 2016) held entirely on one device.

    Storage is a ring of `capacity` slots plus one scratch slot at index `capacity` that absorbs
    the writes of invalid rows, so `add` compacts the valid rows of a fixed-size batch with a
    cumsum and never branches on the mask. Empty slots have priority 0 and are never sampled.
    """

    def __init__(
        self,
        capacity: int,
        env_state_dim: int,
        n_branches: int,
        device: torch.device | str,
        alpha: float = 0.6,
        beta_start: float = 0.4,
        beta_end: float = 1.0,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        alpha_end: float | None = None,
    ):
        self.config = ReplayConfig(
            capacity=capacity, alpha=alpha, alpha_end=alpha_end, beta_start=beta_start,
            beta_end=beta_end, beta_steps=beta_steps, eps=eps,
        )
        if env_state_dim < 0:
            raise ValueError(f"env_state_dim must be >= 0, got {env_state_dim}")
        if n_branches < 1:
            raise ValueError(f"n_branches must be >= 1, got {n_branches}")
        self.capacity, self.env_state_dim, self.n_branches = capacity, env_state_dim, n_branches
        self.device = torch.device(device)
        C1, S, B, dev = capacity + 1, env_state_dim, n_branches, self.device
        self.row = torch.zeros(C1, dtype=torch.int64, device=dev)
        self.env_state = torch.zeros(C1, S, dtype=torch.float32, device=dev)
        self.action = torch.zeros(C1, B, dtype=ACTION_STORE_DTYPE, device=dev)
        self.return_n = torch.zeros(C1, dtype=torch.float32, device=dev)
        self.discount_n = torch.zeros(C1, dtype=torch.float32, device=dev)
        self.next_row = torch.zeros(C1, dtype=torch.int64, device=dev)
        self.next_env_state = torch.zeros(C1, S, dtype=torch.float32, device=dev)
        self.priority = torch.zeros(C1, dtype=torch.float32, device=dev)  # raw p_i (before ^α); 0 = empty
        # p_i^α kept up to date by add/update while α is constant, so sample skips an O(C) pow;
        # with α annealed it is recomputed in every sample instead (one extra pass over C).
        self.priority_alpha = torch.zeros(C1, dtype=torch.float32, device=dev)
        self._alpha_annealed = self.config.alpha_end is not None and self.config.alpha_end != self.config.alpha
        self.write_ptr = torch.zeros((), dtype=torch.int64, device=dev)
        self.size = torch.zeros((), dtype=torch.int64, device=dev)
        self.max_priority = torch.ones((), dtype=torch.float32, device=dev)  # running max, new items get it
        self.sample_step = torch.zeros((), dtype=torch.int64, device=dev)  # drives the α/β schedules

    # ---- schedules (0-dim tensors, no host sync) ----
    def _progress(self) -> torch.Tensor:
        return torch.clamp(self.sample_step.to(torch.float32) / self.config.beta_steps, max=1.0)

    @property
    def beta(self) -> torch.Tensor:
        """Current β as a 0-dim device tensor."""
        c = self.config
        return c.beta_start + (c.beta_end - c.beta_start) * self._progress()

    @property
    def alpha(self) -> torch.Tensor:
        """Current α as a 0-dim device tensor."""
        c = self.config
        end = c.alpha if c.alpha_end is None else c.alpha_end
        return c.alpha + (end - c.alpha) * self._progress()

    def _pow_alpha(self, p: torch.Tensor) -> torch.Tensor:
        # where(): 0^α must stay 0 for α = 0, or empty slots would get probability mass.
        return torch.where(p > 0, p.pow(self.alpha), torch.zeros_like(p))

    # ---- storage ----
    def add(self, transitions: Transitions, valid: torch.Tensor) -> None:
        """Append the rows of `transitions` where `valid` (n,) is True, at the write pointer.

        Valid rows land contiguously (ring order) with the running max priority; invalid rows are
        written to the scratch slot. Cost: O(n) plus one cumsum; no host sync.
        """
        n = transitions.row.shape[0]
        if n > self.capacity:  # a shape check, not a value check: no sync
            raise ValueError(f"add of {n} rows exceeds capacity {self.capacity}; use effective_capacity()")
        v = valid.to(torch.int64)  # (n,)
        offset = torch.cumsum(v, 0) - v  # (n,) exclusive prefix sum: rank among valid rows
        dest = torch.where(valid, torch.remainder(self.write_ptr + offset, self.capacity), self.capacity)
        self.row.index_copy_(0, dest, transitions.row.to(torch.int64))
        self.env_state.index_copy_(0, dest, transitions.env_state.to(torch.float32))
        self.action.index_copy_(0, dest, transitions.action.to(ACTION_STORE_DTYPE))
        self.return_n.index_copy_(0, dest, transitions.return_n.to(torch.float32))
        self.discount_n.index_copy_(0, dest, transitions.discount_n.to(torch.float32))
        self.next_row.index_copy_(0, dest, transitions.next_row.to(torch.int64))
        self.next_env_state.index_copy_(0, dest, transitions.next_env_state.to(torch.float32))
        self.priority.index_copy_(0, dest, self.max_priority.expand(n))
        self.priority_alpha.index_copy_(0, dest, self._pow_alpha(self.max_priority).expand(n))
        self.priority[self.capacity:].zero_()  # scratch slot never counts (a kernel, not a host→device copy)
        self.priority_alpha[self.capacity:].zero_()
        count = v.sum()
        self.write_ptr.copy_(torch.remainder(self.write_ptr + count, self.capacity))
        self.size.copy_(torch.clamp(self.size + count, max=self.capacity))

    def sample(self, batch_size: int) -> tuple[torch.Tensor, Transitions]:
        """Draw `batch_size` slots with P(i) = p_i^α / Σ p^α; return (indices (B,), the transitions with `weight`).

        Stratified as in Schaul et al. (2016) App. B.2.1: draw j uses u_j uniform in the j-th of
        batch_size equal segments of [0, Σ p^α). Importance weights (N·P(i))^−β are divided by their
        batch max (as in Dopamine/Rainbow), so the largest is 1. Advances the α/β schedule one step.
        Sampling an empty buffer is undefined (the caller warms up first; checking would sync).
        Cost: one O(capacity) cumsum + a batch_size·log(capacity) searchsorted (+ an O(capacity)
        pow when α is annealed).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._alpha_annealed:  # config, not a tensor value: fixed per buffer
            pa = self._pow_alpha(self.priority[: self.capacity])  # (C,)
        else:
            pa = self.priority_alpha[: self.capacity]  # (C,)
        cdf = torch.cumsum(pa, 0)  # (C,) non-decreasing in float too (adding x >= 0 never lowers)
        total = cdf[-1]
        strata = torch.arange(batch_size, device=self.device, dtype=torch.float32)
        u = (strata + torch.rand(batch_size, device=self.device)) / batch_size * total  # (batch,)
        # Keep u < total: then cdf[i-1] <= u < cdf[i] means pa[i] > 0, so zero-priority slots
        # (whose cdf step is exactly 0) can never be hit.
        u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
        idx = torch.searchsorted(cdf, u, right=True).clamp_(max=self.capacity - 1)  # (batch,) int64
        prob = pa.index_select(0, idx) / total
        w = (self.size.to(torch.float32) * prob).pow(-self.beta)  # (batch,)
        w = w / w.max()
        self.sample_step.add_(1)
        batch = Transitions(
            row=self.row.index_select(0, idx),
            env_state=self.env_state.index_select(0, idx),
            action=self.action.index_select(0, idx).to(torch.int64),
            return_n=self.return_n.index_select(0, idx),
            discount_n=self.discount_n.index_select(0, idx),
            next_row=self.next_row.index_select(0, idx),
            next_env_state=self.next_env_state.index_select(0, idx),
            weight=w,
        )
        return idx, batch

    def update_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """Set p_i = priorities + eps for the sampled `indices` (typically priorities = |TD error|).

        Duplicate indices in one call take the MAX of their new priorities (order-independent, so
        deterministic on every backend). Non-finite priorities keep the slot's old priority, so one
        NaN TD error cannot poison the cumsum (the loop's kill criteria catch the NaN itself).
        """
        idx = indices.to(torch.int64)
        old = self.priority.index_select(0, idx)
        new = priorities.detach().to(torch.float32).abs() + self.config.eps
        new = torch.where(torch.isfinite(new), new, old)
        self.priority.scatter_reduce_(0, idx, new, reduce="amax", include_self=False)
        # duplicates all write the same (post-max) value here, so this copy is deterministic too
        self.priority_alpha.index_copy_(0, idx, self._pow_alpha(self.priority.index_select(0, idx)))
        self.max_priority.copy_(torch.maximum(self.max_priority, new.max()))

    def _state(self) -> dict[str, torch.Tensor]:
        names = (
            "row", "env_state", "action", "return_n", "discount_n", "next_row", "next_env_state",
            "priority", "priority_alpha", "write_ptr", "size", "max_priority", "sample_step",
        )
        return {k: getattr(self, k) for k in names}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Contents, priorities, write pointer, size, max priority, schedule step (plain tensors)."""
        return dict(self._state())

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore in place; a different capacity, env_state_dim or n_branches is refused (ValueError)."""
        own = self._state()
        _check_state(state, own, "PrioritizedReplay")
        for k, t in own.items():
            t.copy_(state[k])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host sync: timing only


def bench_replay(
    capacity: int, n_envs: int, batch: int, device: torch.device | str, steps: int, env_state_dim: int = 8,
    n_branches: int = 4, n_step: int = 3,
) -> dict[str, float]:
    """Time push+add, sample and update_priorities separately; calls per second and rows per second.

    The buffer is first filled to capacity so sample/update see a full priority array.
    """
    dev = torch.device(device)
    acc = NStepAccumulator(n_envs, n_step, 0.99, env_state_dim, n_branches, dev)
    rb = PrioritizedReplay(capacity, env_state_dim, n_branches, dev)
    g = torch.Generator(device="cpu").manual_seed(0)

    def fake_step() -> tuple[torch.Tensor, ...]:
        return (
            torch.randint(0, 1 << 20, (n_envs,), generator=g).to(dev),
            torch.randn(n_envs, env_state_dim, generator=g).to(dev),
            torch.randint(0, 4, (n_envs, n_branches), generator=g).to(dev),
            torch.randn(n_envs, generator=g).to(dev),
            (torch.rand(n_envs, generator=g) < 0.05).to(dev),
            torch.randint(0, 1 << 20, (n_envs,), generator=g).to(dev),
            torch.randn(n_envs, env_state_dim, generator=g).to(dev),
        )

    inputs = [fake_step() for _ in range(8)]  # pre-made so input generation is not timed
    for i in range(-(-capacity // n_envs) + n_step):
        rb.add(*acc.push(*inputs[i % 8]))
    _sync(dev)

    t0 = time.perf_counter()
    for i in range(steps):
        rb.add(*acc.push(*inputs[i % 8]))
    _sync(dev)
    t_add = time.perf_counter() - t0

    t0 = time.perf_counter()
    for _ in range(steps):
        idx, _ = rb.sample(batch)
    _sync(dev)
    t_sample = time.perf_counter() - t0

    prios = torch.rand(batch, device=dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        rb.update_priorities(idx, prios)
    _sync(dev)
    t_update = time.perf_counter() - t0
    return {
        "capacity": float(capacity), "n_envs": float(n_envs), "batch": float(batch),
        "push_add_per_s": steps / t_add, "transitions_added_per_s": steps * n_envs / t_add,
        "sample_per_s": steps / t_sample, "rows_sampled_per_s": steps * batch / t_sample,
        "update_per_s": steps / t_update,
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.agent.replay --capacity 65536 --n-envs 256 --batch 256 --steps 200`: print a table."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--capacity", type=int, nargs="+", default=[1 << 16, 1 << 20])
    ap.add_argument("--n-envs", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    cols = ("capacity", "push_add_per_s", "transitions_added_per_s", "sample_per_s", "update_per_s")
    print(" | ".join(f"{c:>23}" for c in cols))
    for cap in a.capacity:
        r = bench_replay(cap, a.n_envs, a.batch, a.device, a.steps)
        print(" | ".join(f"{r[c]:>23,.0f}" for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
