"""The categorical (C51) distributional Bellman projection, Bellemare, Dabney & Munos (2017).

Notation of the paper's Eq. 7 / Algorithm 1: a fixed support z_i = V_MIN + i Δz, i = 0..N-1,
Δz = (V_MAX - V_MIN) / (N - 1). The target distribution puts mass p_j(x', a*) at
T̂z_j = r + γ z_j, which in general falls between atoms, so it is projected back:

    Φ T̂Z(x, a)_i = Σ_j [1 - |clip(T̂z_j, V_MIN, V_MAX) - z_i| / Δz]_0^1 p_j(x', a*)       (Eq. 7)

Algorithm 1 computes the same thing in O(N) by splitting each p_j between its two neighbouring
atoms l = ⌊b_j⌋ and u = ⌈b_j⌉ with b_j = (T̂z_j - V_MIN) / Δz. Everything here is vectorised
(no Python loops over batch or atoms), has no host syncs and no data-dependent shapes, so it is
CUDA-graph capturable.
"""
from __future__ import annotations

import torch
from torch import Tensor


def make_support(v_min: float, v_max: float, n_atoms: int, device: torch.device | str | None = None) -> Tensor:
    """z: (n_atoms,) float32, evenly spaced from v_min to v_max inclusive."""
    if not v_min < v_max or n_atoms < 2:
        raise ValueError(f"support needs v_min < v_max and n_atoms >= 2, got {v_min}, {v_max}, {n_atoms}")
    return torch.linspace(v_min, v_max, n_atoms, dtype=torch.float32, device=device)


def project_values(values: Tensor, probs: Tensor, support: Tensor) -> Tensor:
    """Project the categorical with atoms at `values` (..., N') and masses `probs` (..., N') onto
    the evenly spaced `support` (N,). Returns masses (..., N) on the support.

    `values` need not be sorted or inside [V_MIN, V_MAX]: mass beyond the ends lands on the end
    atoms. This is Algorithm 1 given T̂z_j directly; `project_distribution` builds T̂z_j = r + γ z_j.
    """
    n_atoms = support.shape[-1]
    v_min, v_max = support[0], support[-1]  # 0-dim device tensors: no host sync
    delta_z = (v_max - v_min) / (n_atoms - 1)  # Δz
    tz = values.clamp(min=v_min, max=v_max)  # T̂z_j ← [T̂z_j]_{V_MIN}^{V_MAX}
    b = (tz - v_min) / delta_z  # b_j ← (T̂z_j - V_MIN) / Δz, in [0, N-1]
    # Float error can leave b a hair outside [0, N-1] when T̂z_j sits on an end atom.
    b = b.clamp(0.0, n_atoms - 1)
    # A NaN return must surface as a NaN loss (the kill monitor's job), never as a wild index: the
    # indices come from a NaN-free copy of b, the weights from b itself, so the NaN stays in m.
    b_index = torch.nan_to_num(b, nan=0.0)
    lower = b_index.floor()  # l ← ⌊b_j⌋
    upper = b_index.ceil()  # u ← ⌈b_j⌉
    # Alg. 1 gives m_l += p_j (u - b_j): that is 0 when b_j is an integer (l == u) and would lose
    # the mass. (l + 1 - b_j) equals (u - b_j) whenever l < u and is 1 when l == u, so the whole
    # p_j lands on z_l; the u-share (b_j - l) is then 0.
    w_lower = probs * (lower + 1.0 - b)  # p_j (u - b_j), integer-safe
    w_upper = probs * (b - lower)  # p_j (b_j - l)
    m = torch.zeros(*probs.shape[:-1], n_atoms, dtype=probs.dtype, device=probs.device)  # m_i = 0
    m.scatter_add_(-1, lower.long(), w_lower)  # m_l ← m_l + p_j (u - b_j)
    m.scatter_add_(-1, upper.long(), w_upper)  # m_u ← m_u + p_j (b_j - l)
    return m


def project_distribution(next_probs: Tensor, rewards: Tensor, discounts: Tensor, support: Tensor) -> Tensor:
    """Φ T̂Z: project the target distribution r + γ Z(x', a*) onto the support.

    next_probs: (B, N) p_j(x', a*), rows summing to 1.
    rewards: (B,) the (n-step) return r.
    discounts: (B,) γ^n (1 - done): 0 for a terminal transition, which leaves a spike at clip(r).
    support: (N,) z_i.
    Returns (B, N) target masses, rows summing to 1.
    """
    tz = rewards.unsqueeze(-1) + discounts.unsqueeze(-1) * support  # T̂z_j ← r + γ z_j, (B, N)
    return project_values(tz, next_probs, support)
