"""Q-network: a sequence encoder over the feature window + a branching dueling C51 head.

    obs (B, W, F) ──► encoder (Mamba-style selective SSM, or GRU) ──► last position (B, d_model) ─┐
    env_state (B, S) ───────────────────────────────────────────────────────────────────────────┴► torso (B, H)
    torso ──► value stream V (B, 1, N)            ─┐
          └─► advantage stream A_b (B, A_b, N)     ├► logits_b = V + A_b - mean_a A_b    (per atom)
              one per branch b                    ─┘
    ──► logits (B, n_branches, A_max, N); probabilities = softmax over the atom axis.

Padding: branches with A_b < A_max actions are padded at the END of the action axis with a constant
row PAD_LOGITS (all mass on atom 0, i.e. the return V_MIN). `action_mask` (n_branches, A_max) bool
marks the real actions. A padded action never affects the mean advantage (the mean is over the
branch's A_b real actions only), never receives gradient (it is a constant), and is never chosen:
`trainer.agent.act` masks it, and even unmasked its E[Q] = V_MIN is <= every real action's E[Q]
and argmax breaks ties towards the lower (real) index.

Everything is CUDA-graph capturable: fixed shapes, no host syncs, no branching on tensor values.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.agent import scan_fused
from trainer.agent.c51 import make_support
from trainer.agent.config import AgentConfig

PAD_LOGIT = -1.0e4  # exp(-1e4) underflows to exactly 0 in float32: the padded row is a point mass at V_MIN


def branch_action_mask(branch_sizes: tuple[int, ...]) -> Tensor:
    """(n_branches, A_max) bool: True where the action exists in that branch."""
    a_max = max(branch_sizes)
    return torch.arange(a_max).unsqueeze(0) < torch.tensor(branch_sizes).unsqueeze(1)


def expected_q(logits: Tensor, support: Tensor) -> Tensor:
    """E[Q] = Σ_i softmax(logits)_i z_i: (..., N) -> (...)."""
    return (torch.softmax(logits, dim=-1) * support).sum(-1)


# --------------------------------------------------------------------------------------------------
# Selective scan: h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t ;  y_t = C_t · h_t + D u_t
# --------------------------------------------------------------------------------------------------

def _discretise(u: Tensor, delta: Tensor, A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """Zero-order hold on A, Euler on B (as in Mamba): returns dA, dBu, each (Bt, L, D, N)."""
    dA = torch.exp(delta.unsqueeze(-1) * A)  # (Bt, L, D, N), in (0, 1) since A < 0 and Δ > 0
    dBu = (delta * u).unsqueeze(-1) * B.unsqueeze(2)  # (Bt, L, D, N)
    return dA, dBu


def selective_scan_sequential(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor) -> Tensor:
    """Reference scan, one time step at a time. u, delta: (Bt, L, D); A: (D, N); B, C: (Bt, L, N);
    D: (D,). Returns y (Bt, L, D)."""
    dA, dBu = _discretise(u, delta, A, B)
    h = torch.zeros_like(dBu[:, 0])  # (Bt, D, N)
    ys = []
    for t in range(u.shape[1]):
        h = dA[:, t] * h + dBu[:, t]
        ys.append((h * C[:, t].unsqueeze(1)).sum(-1))  # (Bt, D)
    return torch.stack(ys, dim=1) + u * D


def selective_scan_parallel(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor) -> Tensor:
    """Same result as `selective_scan_sequential` by a Hillis-Steele scan: ⌈log2 L⌉ rounds of
    elementwise ops instead of L dependent steps (L = W is 32-64, so 5-6 rounds).

    The linear recurrence h_t = a_t h_{t-1} + b_t composes as (a, b) ∘ (a', b') = (a a', a b' + b);
    after the round with offset k, (a_t, b_t) summarises steps (t-2k, t], so b_t = h_t at the end.
    Cost: each round allocates two (Bt, L, D, N) tensors, kept for backward.
    """
    dA, dBu = _discretise(u, delta, A, B)
    a, b = dA, dBu
    length = u.shape[1]
    k = 1
    while k < length:
        # Positions t < k have nothing k steps back: identity element (a=1, b=0) is shifted in.
        b_prev = F.pad(b[:, :-k], (0, 0, 0, 0, k, 0))  # (Bt, L, D, N), zeros first
        a_prev = F.pad(a[:, :-k], (0, 0, 0, 0, k, 0), value=1.0)
        b = a * b_prev + b
        a = a * a_prev
        k *= 2
    return (b * C.unsqueeze(2)).sum(-1) + u * D  # (Bt, L, D)


def selective_scan_fused(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor) -> Tensor:
    """Same result as `selective_scan_sequential`, by the fused Triton kernels where they can run (CUDA),
    else by the sequential scan (trainer/agent/scan_fused.py)."""
    if not scan_fused.available(u.device):
        return selective_scan_sequential(u, delta, A, B, C, D)
    return scan_fused.fused_scan(u, delta, A, B, C) + u * D


def selective_scan_fused_last(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor) -> Tensor:
    """`selective_scan_fused(...)[:, -1]`, (Bt, D): on CUDA in closed form, h_{L-1} = Σ_t exp(A Σ_{s>t} Δ_s) Δ_t u_t
    B_t, by kernels with no dependent walk and no saved states (trainer/agent/scan_fused.py); elsewhere the
    sequential scan's last position."""
    if not scan_fused.available(u.device):
        return selective_scan_sequential(u, delta, A, B, C, D)[:, -1]
    return scan_fused.fused_scan_last(u, delta, A, B, C[:, -1]) + u[:, -1] * D


def _last_position(scan, *args: Tensor) -> Tensor:
    """A full-sequence scan's last position: (Bt, D)."""
    return scan(*args)[:, -1]


def causal_depthwise_conv(u: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Causal depthwise 1-d convolution along time: y_t = bias + Σ_k weight_k ⊙ u_{t-K+1+k} (u_s = 0 for s < 0).

    u (Bt, L, D); weight (D, 1, K) and bias (D,) as nn.Conv1d(D, D, K, groups=D) holds them. The same values as
    that Conv1d with padding K-1, first L outputs kept, but as a left pad, a strided window view and one
    multiply-sum in the (Bt, L, D) layout: no transposes, and elementwise work that torch.compile fuses with
    its neighbours (cuDNN/ATen's generic depthwise kernel was the slower, unfused path when measured on an H200:
    docs/BENCHMARKS.md's history, v3 profile).
    """
    k = weight.shape[-1]
    windows = F.pad(u, (0, 0, k - 1, 0)).unfold(1, k, 1)  # (Bt, L, D, K) view: windows[:, t, :, j] = u_{t-K+1+j}
    return (windows * weight.squeeze(1)).sum(-1) + bias


class MambaBlock(nn.Module):
    """Mamba (Gu & Dao 2023) mixer in pure PyTorch: in-projection to (x, z); causal depthwise conv +
    SiLU on x; input-dependent Δ, B, C from x; diagonal A < 0; selective scan; gate by SiLU(z)."""

    def __init__(self, d_model: int, d_state: int, d_conv: int, expand: int, scan: str = "fused"):
        super().__init__()
        self.scan = {"fused": selective_scan_fused, "parallel": selective_scan_parallel,
                     "sequential": selective_scan_sequential}[scan]
        self.scan_last = selective_scan_fused_last if scan == "fused" else functools.partial(_last_position, self.scan)
        d_inner = expand * d_model
        self.d_inner, self.d_state = d_inner, d_state
        self.dt_rank = math.ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        # Δ starts log-uniform in [1e-3, 1e-1] (Mamba's init): bias = softplus⁻¹(Δ) = Δ + log(1 - e^-Δ).
        dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        # S4D-real init: A_n = -(n+1), so channels decay at rates spread over the window.
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, x: Tensor, last_only: bool = False) -> Tensor:
        """x (Bt, L, d_model) -> (Bt, L, d_model), or (Bt, d_model) for the last position alone when `last_only`:
        the gate z, the gating and the out-projection run only at the last position (an encoder's final block
        needs nothing else), and so does the scan's output; the fused scan then computes the last state in
        closed form instead of walking the sequence (`selective_scan_fused_last`)."""
        if last_only:
            w_u, w_z = self.in_proj.weight.chunk(2, dim=0)
            u, z = F.linear(x, w_u), F.linear(x[:, -1], w_z)  # (Bt, L, d_inner), (Bt, d_inner)
        else:
            u, z = self.in_proj(x).chunk(2, dim=-1)  # (Bt, L, d_inner) each
        u = F.silu(causal_depthwise_conv(u, self.conv.weight, self.conv.bias))  # (Bt, L, d_inner)
        dt, B, C = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))  # (Bt, L, d_inner), > 0
        A = -torch.exp(self.A_log)  # (d_inner, N), < 0
        if last_only:
            return self.out_proj(self.scan_last(u, delta, A, B, C, self.D) * F.silu(z))  # (Bt, d_model)
        return self.out_proj(self.scan(u, delta, A, B, C, self.D) * F.silu(z))  # (Bt, L, d_model)


class MambaEncoder(nn.Module):
    """Embedding + pre-norm residual Mamba blocks; returns the last position (Bt, d_model). The final block
    computes its output at the last position only (`MambaBlock.forward(last_only=True)`): the same values as
    running it over every position and slicing, for about a third less of that block's work."""

    def __init__(self, cfg: AgentConfig):
        super().__init__()
        self.embed = nn.Linear(cfg.n_features, cfg.d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(cfg.d_model) for _ in range(cfg.n_layers))
        self.blocks = nn.ModuleList(MambaBlock(cfg.d_model, cfg.d_state, cfg.d_conv, cfg.expand, cfg.scan)
                                    for _ in range(cfg.n_layers))
        self.norm_out = nn.RMSNorm(cfg.d_model)

    def forward(self, obs: Tensor) -> Tensor:
        x = self.embed(obs)  # (Bt, W, d_model)
        *inner, final = zip(self.norms, self.blocks)
        for norm, block in inner:
            x = x + block(norm(x))
        norm, block = final
        return self.norm_out(x[:, -1] + block(norm(x), last_only=True))  # (Bt, d_model)


class GRUEncoder(nn.Module):
    """Embedding + multi-layer GRU; returns the last position (Bt, d_model)."""

    def __init__(self, cfg: AgentConfig):
        super().__init__()
        self.embed = nn.Linear(cfg.n_features, cfg.d_model)
        self.gru = nn.GRU(cfg.d_model, cfg.d_model, num_layers=cfg.n_layers, batch_first=True)
        self.norm_out = nn.RMSNorm(cfg.d_model)

    def forward(self, obs: Tensor) -> Tensor:
        out, _ = self.gru(self.embed(obs))  # (Bt, W, d_model)
        return self.norm_out(out[:, -1])


def _mean_zero_tilt(support: Tensor) -> Tensor:
    """Logits λ z whose softmax has mean 0 on the support (or as near as |λ z| <= 20 allows), found
    by bisection in float64 on the host at construction time. For a symmetric support λ = 0."""
    z = support.double().cpu()
    bound = 20.0 / float(z.abs().max())
    lo, hi = -bound, bound  # the tilted mean is increasing in λ
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if float((torch.softmax(mid * z, 0) * z).sum()) < 0.0:
            lo = mid
        else:
            hi = mid
    return (0.5 * (lo + hi) * z).float()


class QNetwork(nn.Module):
    """Branching dueling distributional Q-network. `forward(obs, env_state) -> logits`."""

    def __init__(self, cfg: AgentConfig):
        super().__init__()
        self.cfg = cfg
        n_atoms, hidden = cfg.n_atoms, cfg.head_hidden
        self.encoder = MambaEncoder(cfg) if cfg.encoder == "mamba" else GRUEncoder(cfg)
        self.torso = nn.Sequential(nn.Linear(cfg.d_model + cfg.env_state_dim, hidden), nn.SiLU())
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, n_atoms))
        self.advantages = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, a * n_atoms))
            for a in cfg.branch_sizes)
        # The auxiliary head (AgentConfig.aux_weight > 0): standardised mid change ahead, from the encoder output.
        self.aux_head = nn.Linear(cfg.d_model, 1) if cfg.aux_weight > 0 else None
        support = make_support(cfg.v_min, cfg.v_max, n_atoms)
        self.register_buffer("support", support)  # (N,)
        self.register_buffer("action_mask", branch_action_mask(cfg.branch_sizes))  # (n_branches, A_max)
        pad = torch.full((n_atoms,), PAD_LOGIT)
        pad[0] = 0.0
        self.register_buffer("pad_logits", pad)  # (N,)
        # Initial Q ≈ 0: tiny last-layer weights make every action's distribution ≈ the value
        # bias, which is the max-entropy distribution on the support with mean 0.
        with torch.no_grad():
            for head in [self.value, *self.advantages]:
                nn.init.normal_(head[-1].weight, std=1e-3)
                nn.init.zeros_(head[-1].bias)
            self.value[-1].bias.copy_(_mean_zero_tilt(support))

    def forward(self, obs: Tensor, env_state: Tensor) -> Tensor:
        """obs (B, W, F) float32, env_state (B, S) -> logits (B, n_branches, A_max, n_atoms)."""
        return self.head(self.encoder(obs), env_state)

    def head(self, z: Tensor, env_state: Tensor) -> Tensor:
        """Encoded windows z (B, d_model) and env_state (B, S) -> logits (B, n_branches, A_max, n_atoms).

        Split from `forward` because the encoder reads only the feature window, a function of the decision row:
        acting can encode each row of the window once and gather by row (see trainer/loop/step.py).

        The value stream and the advantage streams run batched: their first layers as one GEMM over the
        stacked weights, their last layers as one batched GEMM over weights zero-padded to the widest stream
        (2 matmuls instead of 2 per stream; the parameters stay per-stream modules). `head_per_stream` is the
        plain one-stream-at-a-time reference, tested to give the same logits."""
        h = self.torso(torch.cat([z, env_state], dim=-1))  # (B, H)
        streams = [self.value, *self.advantages]
        w1 = torch.cat([s[0].weight for s in streams])  # (n_streams H, H)
        b1 = torch.cat([s[0].bias for s in streams])
        hidden = F.silu(F.linear(h, w1, b1)).view(h.shape[0], len(streams), -1).transpose(0, 1)  # (n_streams, B, H)
        widest = max(s[2].out_features for s in streams)
        w2 = torch.stack([F.pad(s[2].weight, (0, 0, 0, widest - s[2].out_features)) for s in streams])  # (ns, O, H)
        b2 = torch.stack([F.pad(s[2].bias, (0, widest - s[2].out_features)) for s in streams])  # (ns, O)
        out = torch.baddbmm(b2.unsqueeze(1), hidden, w2.transpose(1, 2))  # (n_streams, B, widest)
        n_atoms = self.cfg.n_atoms
        v = out[0, :, :n_atoms]
        adv = [out[1 + i, :, :a_b * n_atoms] for i, a_b in enumerate(self.cfg.branch_sizes)]
        return self._duel(v, adv)

    def head_per_stream(self, z: Tensor, env_state: Tensor) -> Tensor:
        """`head` computed one stream at a time (the reference the batched head is tested against)."""
        h = self.torso(torch.cat([z, env_state], dim=-1))  # (B, H)
        return self._duel(self.value(h), [stream(h) for stream in self.advantages])

    def _duel(self, v: Tensor, adv: list[Tensor]) -> Tensor:
        """Value (B, N) and per-branch advantages (B, A_b N) -> logits (B, n_branches, A_max, N)."""
        batch = v.shape[0]
        n_atoms, a_max = self.cfg.n_atoms, self.cfg.max_actions
        v = v.unsqueeze(1)  # (B, 1, N)
        branches = []
        for adv_b, a_b in zip(adv, self.cfg.branch_sizes):
            adv_b = adv_b.reshape(batch, a_b, n_atoms)  # (B, A_b, N)
            logits_b = v + adv_b - adv_b.mean(dim=1, keepdim=True)  # mean over the A_b real actions only
            if a_b < a_max:
                logits_b = torch.cat([logits_b, self.pad_logits.expand(batch, a_max - a_b, n_atoms)], dim=1)
            branches.append(logits_b)
        return torch.stack(branches, dim=1)  # (B, n_branches, A_max, N)
