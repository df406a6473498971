"""Fused selective scan: one Triton kernel for the forward recurrence, one for its backward.

    h_t = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t u_t) B_t        h: (D, N) per sequence, h_{-1} = 0
    y_t = Σ_n C_{t,n} h_{t,n}                           (the D·u skip term is added by the caller)

Why: the pure-PyTorch sequential scan issues ~4 small kernels per time step forward and ~10 backward, and
the Hillis-Steele scan moves log2(L) copies of a (Bt, L, D, N) tensor through memory; either way the h100
preset's training step was bound by them (docs/BENCHMARKS.md). Here each program owns one sequence and a
block of channels, keeps its (BLOCK_D, N) state in registers, and walks the L steps once: the forward reads
u, Δ (Bt, L, D) and B, C (Bt, L, N) once and writes y; with `save_states` it also writes every h_t
(Bt, L, D, N), which the backward reads instead of recomputing.

Backward (reverse-time walk, g = ∂loss/∂h_t accumulated from later steps):
    g_t   = g_{t+1} ⊙ exp(Δ_{t+1} A) + C_t ⊗ dy_t
    dC_t  = Σ_d dy_t,d h_t,d                           dB_t = Σ_d g_t,d Δ_t,d u_t,d
    du_t  = Σ_n g_t B_t Δ_t                            dΔ_t = Σ_n g_t (B_t u_t + A exp(Δ_t A) h_{t-1})
    dA    = Σ_{b,t} g_t exp(Δ_t A) Δ_t h_{t-1}
Reductions across channel blocks and sequences are written as per-program partials and summed by torch, not
with atomics, so results are deterministic (the checkpoint resume contract needs bit-identical replays).

`fused_scan_last` is the last position alone (an encoder's final block reads nothing else), computed in closed
form by a second pair of kernels: no dependent walk and no saved states (see the comment above `_last_fwd`).

CUDA only; `network.selective_scan_fused` falls back to the sequential PyTorch scan on other devices, so the
same network runs in CPU CI. `TRITON_INTERPRET=1` runs the kernels on CPU tensors (tests/test_agent_scan.py).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch; the CPU wheel CI installs has none.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only installs
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device) -> bool:
    """The fused kernels can run for tensors on `device`."""
    return triton is not None and (device.type == "cuda" or (INTERPRET and device.type == "cpu"))


if triton is not None:

    @triton.jit
    def _load_udb(u_ptr, dt_ptr, b_ptr, row, D, N, offs_d, offs_n, mask_d, mask_n, zero):
        """Time step `row`'s u and Δ (BLOCK_D,) and B (BLOCK_N,)."""
        u = tl.load(u_ptr + row * D + offs_d, mask=mask_d, other=zero)
        dt = tl.load(dt_ptr + row * D + offs_d, mask=mask_d, other=zero)
        b = tl.load(b_ptr + row * N + offs_n, mask=mask_n, other=zero)
        return u, dt, b

    @triton.jit
    def _load_step(u_ptr, dt_ptr, b_ptr, c_ptr, row, D, N, offs_d, offs_n, mask_d, mask_n, zero):
        """Time step `row`'s inputs: u and Δ (BLOCK_D,), B and C (BLOCK_N,)."""
        u, dt, b = _load_udb(u_ptr, dt_ptr, b_ptr, row, D, N, offs_d, offs_n, mask_d, mask_n, zero)
        c = tl.load(c_ptr + row * N + offs_n, mask=mask_n, other=zero)
        return u, dt, b, c

    @triton.jit
    def _channel_block(blk, D, N, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
        """Channel block `blk`'s offsets (BLOCK_D,), the state's (BLOCK_N,) and their (BLOCK_D, BLOCK_N) grid."""
        offs_d = blk * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        return offs_d, offs_n, offs_d[:, None] * N + offs_n[None, :]

    @triton.jit
    def _channel_masks(offs_d, offs_n, D, N):
        """Masks for a block with missing channels or states: (BLOCK_D,), (BLOCK_N,), (BLOCK_D, BLOCK_N)."""
        mask_d, mask_n = offs_d < D, offs_n < N
        return mask_d, mask_n, mask_d[:, None] & mask_n[None, :]

    @triton.jit
    def _scan_fwd(u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, y_ptr, hs_ptr, L, D, N,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SAVE: tl.constexpr, EVEN: tl.constexpr):
        seq = tl.program_id(0)
        offs_d, offs_n, off_dn = _channel_block(tl.program_id(1), D, N, BLOCK_D, BLOCK_N)
        # EVEN (D a multiple of BLOCK_D, N == BLOCK_N): no masks at all. The walk issues few instructions per
        # state and step, so masks and per-element address arithmetic are a real share of its time.
        if EVEN:
            mask_d, mask_n, mask_dn, zero = None, None, None, None
        else:
            zero = 0.0
            mask_d, mask_n, mask_dn = _channel_masks(offs_d, offs_n, D, N)
        # exp(Δ A) as exp2(Δ · A log2 e): one multiply fewer per state and step than tl.exp.
        a2 = tl.load(a_ptr + off_dn, mask=mask_dn, other=zero) * 1.4426950408889634  # (BD, BN)
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        # Software prefetch: step t+1's inputs are loaded before step t is computed, so the loads' latency
        # overlaps the arithmetic instead of stalling every step of the dependent walk. The last step reloads
        # its own row (a scalar clamp, no mask).
        row = seq * L
        u_next, dt_next, b_next, c_next = _load_step(u_ptr, dt_ptr, b_ptr, c_ptr, row, D, N, offs_d, offs_n,
                                                     mask_d, mask_n, zero)
        for t in range(L):
            row = seq * L + t
            nxt = seq * L + tl.minimum(t + 1, L - 1)
            u, dt, bb, cc = u_next, dt_next, b_next, c_next
            u_next, dt_next, b_next, c_next = _load_step(u_ptr, dt_ptr, b_ptr, c_ptr, nxt, D, N, offs_d, offs_n,
                                                         mask_d, mask_n, zero)
            h = tl.exp2(dt[:, None] * a2) * h + (dt * u)[:, None] * bb[None, :]
            tl.store(y_ptr + row * D + offs_d, tl.sum(h * cc[None, :], axis=1), mask=mask_d)
            if SAVE:
                tl.store(hs_ptr + row * D * N + off_dn, h, mask=mask_dn)

    @triton.jit
    def _scan_bwd(u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, hs_ptr, dy_ptr,
                  du_ptr, ddt_ptr, da_part_ptr, db_part_ptr, dc_part_ptr, n_seq, L, D, N,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
        seq = tl.program_id(0)
        blk = tl.program_id(1)
        offs_d, offs_n, off_dn = _channel_block(blk, D, N, BLOCK_D, BLOCK_N)
        if EVEN:  # as in the forward
            mask_d, mask_n, mask_dn, zero = None, None, None, None
        else:
            zero = 0.0
            mask_d, mask_n, mask_dn = _channel_masks(offs_d, offs_n, D, N)
        a = tl.load(a_ptr + off_dn, mask=mask_dn, other=zero)
        a2 = a * 1.4426950408889634  # exp(Δ A) = exp2(Δ · A log2 e), as in the forward
        g = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)       # ∂loss/∂h_t
        da_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)  # this sequence's share of ∂loss/∂A
        # Software prefetch as in the forward, walking back: step t-1's inputs load while step t computes. h_t is
        # the previous iteration's h_{t-1}, so each saved state is read once. Rows before the sequence's start
        # are clamped to its first row (scalar arithmetic) and h_{-1} = 0 is selected, not loaded.
        row = seq * L + L - 1
        h = tl.load(hs_ptr + row * D * N + off_dn, mask=mask_dn, other=zero)
        u_next, dt_next, b_next, c_next = _load_step(u_ptr, dt_ptr, b_ptr, c_ptr, row, D, N, offs_d, offs_n,
                                                     mask_d, mask_n, zero)
        dy_next = tl.load(dy_ptr + row * D + offs_d, mask=mask_d, other=zero)
        hp_next = tl.load(hs_ptr + (seq * L + tl.maximum(L - 2, 0)) * D * N + off_dn, mask=mask_dn, other=zero)
        for i in range(L):
            t = L - 1 - i
            row = seq * L + t
            prv = seq * L + tl.maximum(t - 1, 0)
            u, dt, bb, cc, dy = u_next, dt_next, b_next, c_next, dy_next
            h_prev = tl.where(t > 0, hp_next, 0.0)  # h_{t-1}
            u_next, dt_next, b_next, c_next = _load_step(u_ptr, dt_ptr, b_ptr, c_ptr, prv, D, N, offs_d, offs_n,
                                                         mask_d, mask_n, zero)
            dy_next = tl.load(dy_ptr + prv * D + offs_d, mask=mask_d, other=zero)
            hp_next = tl.load(hs_ptr + (seq * L + tl.maximum(t - 2, 0)) * D * N + off_dn, mask=mask_dn, other=zero)
            g += cc[None, :] * dy[:, None]
            decay = tl.exp2(dt[:, None] * a2)
            g_h_prev = g * h_prev * decay  # ∂loss/∂(Δ A) through the decay term
            # Partials over this block's channels; blocks are summed on the host side of the kernel (torch).
            part = (blk * n_seq * L + row) * N + offs_n
            gb = tl.sum(g * bb[None, :], axis=1)
            tl.store(dc_part_ptr + part, tl.sum(h * dy[:, None], axis=0), mask=mask_n)
            tl.store(db_part_ptr + part, tl.sum(g * (dt * u)[:, None], axis=0), mask=mask_n)
            tl.store(du_ptr + row * D + offs_d, gb * dt, mask=mask_d)
            tl.store(ddt_ptr + row * D + offs_d, gb * u + tl.sum(g_h_prev * a, axis=1), mask=mask_d)
            da_acc += g_h_prev * dt[:, None]
            g = g * decay
            h = h_prev
        tl.store(da_part_ptr + seq * D * N + off_dn, da_acc, mask=mask_dn)


    # ----------------------------------------------------------------------------------------------
    # The last position alone (an encoder's final block reads nothing else), in closed form:
    #     h_{L-1} = Σ_t exp(A S_t) (Δ_t u_t) B_t,   S_t = Σ_{s>t} Δ_s   (so S_{L-1} = 0)
    #     y_{L-1} = Σ_n C_{L-1,n} h_{L-1,n}
    # The same value as the recurrence (the product of the decays after step t is the exponential of their
    # summed exponents), but no term depends on another: no dependent walk, and no states to save, since the
    # backward needs none (with K_t = dy ⊗ C_{L-1} ⊙ exp(A S_t), which is ∂loss/∂h_t):
    #     ∂(Δu)_t = Σ_n K_t B_t        ∂S_t = (Δ_t u_t) Σ_n K_t B_t A        dB_t = Σ_d K_t (Δ_t u_t)
    #     dA = Σ_{b,t} K_t B_t (Δ_t u_t) S_t                                 dC_{L-1} = Σ_d dy h_{L-1}
    # and ∂loss/∂Δ_s gathers ∂S_t from every t < s (an exclusive prefix sum, done by torch).
    # ----------------------------------------------------------------------------------------------

    @triton.jit
    def _last_fwd(u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, y_ptr, L, D, N,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
        seq = tl.program_id(0)
        offs_d, offs_n, off_dn = _channel_block(tl.program_id(1), D, N, BLOCK_D, BLOCK_N)
        if EVEN:  # as in _scan_fwd
            mask_d, mask_n, mask_dn, zero = None, None, None, None
        else:
            zero = 0.0
            mask_d, mask_n, mask_dn = _channel_masks(offs_d, offs_n, D, N)
        a2 = tl.load(a_ptr + off_dn, mask=mask_dn, other=zero) * 1.4426950408889634
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        s = tl.zeros((BLOCK_D,), dtype=tl.float32)  # S_t, summed walking back from the last step
        c_last = tl.load(c_ptr + seq * N + offs_n, mask=mask_n, other=zero)  # C_{L-1}
        u_next, dt_next, b_next = _load_udb(u_ptr, dt_ptr, b_ptr, seq * L + L - 1, D, N, offs_d, offs_n,
                                            mask_d, mask_n, zero)
        for i in range(L):
            t = L - 1 - i
            u, dt, bb = u_next, dt_next, b_next
            prv = seq * L + tl.maximum(t - 1, 0)
            u_next, dt_next, b_next = _load_udb(u_ptr, dt_ptr, b_ptr, prv, D, N, offs_d, offs_n, mask_d, mask_n,
                                                zero)
            h += tl.exp2(s[:, None] * a2) * ((dt * u)[:, None] * bb[None, :])
            s += dt
        tl.store(y_ptr + seq * D + offs_d, tl.sum(h * c_last[None, :], axis=1), mask=mask_d)

    @triton.jit
    def _last_bwd(u_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, dy_ptr, du_ptr, dvu_ptr, ds_ptr,
                  da_part_ptr, db_part_ptr, dc_part_ptr, n_seq, L, D, N,
                  BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
        seq = tl.program_id(0)
        blk = tl.program_id(1)
        offs_d, offs_n, off_dn = _channel_block(blk, D, N, BLOCK_D, BLOCK_N)
        if EVEN:
            mask_d, mask_n, mask_dn, zero = None, None, None, None
        else:
            zero = 0.0
            mask_d, mask_n, mask_dn = _channel_masks(offs_d, offs_n, D, N)
        a = tl.load(a_ptr + off_dn, mask=mask_dn, other=zero)
        a2 = a * 1.4426950408889634
        dy = tl.load(dy_ptr + seq * D + offs_d, mask=mask_d, other=zero)
        s = tl.zeros((BLOCK_D,), dtype=tl.float32)
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)       # h_{L-1}, rebuilt for dC
        da_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)  # this sequence's share of dA
        c_last = tl.load(c_ptr + seq * N + offs_n, mask=mask_n, other=zero)  # C_{L-1}
        u_next, dt_next, b_next = _load_udb(u_ptr, dt_ptr, b_ptr, seq * L + L - 1, D, N, offs_d, offs_n,
                                            mask_d, mask_n, zero)
        dyc = dy[:, None] * c_last[None, :]  # (BD, BN)
        for i in range(L):
            t = L - 1 - i
            row = seq * L + t
            u, dt, bb = u_next, dt_next, b_next
            prv = seq * L + tl.maximum(t - 1, 0)
            u_next, dt_next, b_next = _load_udb(u_ptr, dt_ptr, b_ptr, prv, D, N, offs_d, offs_n, mask_d, mask_n,
                                                zero)
            decay = tl.exp2(s[:, None] * a2)
            vu = dt * u
            kb = dyc * decay * bb[None, :]  # K_t B_t
            dvu = tl.sum(kb, axis=1)  # ∂loss/∂(Δ_t u_t)
            tl.store(du_ptr + row * D + offs_d, dvu * dt, mask=mask_d)
            tl.store(dvu_ptr + row * D + offs_d, dvu * u, mask=mask_d)
            tl.store(ds_ptr + row * D + offs_d, vu * tl.sum(kb * a, axis=1), mask=mask_d)
            part = (blk * n_seq * L + row) * N + offs_n
            tl.store(db_part_ptr + part, tl.sum(dyc * decay * vu[:, None], axis=0), mask=mask_n)
            da_acc += kb * (vu * s)[:, None]
            h += decay * (vu[:, None] * bb[None, :])
            s += dt
        tl.store(da_part_ptr + seq * D * N + off_dn, da_acc, mask=mask_dn)
        tl.store(dc_part_ptr + (blk * n_seq + seq) * N + offs_n, tl.sum(h * dy[:, None], axis=0), mask=mask_n)


def _blocks(n_seq: int, d: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, warps), a fixed function of the shapes (no autotuning: the backward's partial sums, and
    so its rounding, depend on BLOCK_D, and a resumed run must replay bit for bit).

    One warp per program and enough programs to fill the GPU: measured on an H200 at L=32, D=128, N=16, BLOCK_D=16
    is fastest at 256 sequences (the learner's shape) and 64 at 1,024 (acting's, which runs the forward alone);
    the timings are in docs/BENCHMARKS.md, "Scan kernels"."""
    block_n = triton.next_power_of_2(n)
    block_d = 16 if n_seq < 512 else 64
    block_d = max(1, min(block_d, triton.next_power_of_2(d), 2048 // block_n))
    return block_d, block_n, 1


def _last_blocks(n_seq: int, d: int, n: int, backward: bool) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, warps) for the last-position kernels, a fixed function of the shapes as in `_blocks`.
    Measured on an H200 at L=32, D=128, N=16 (docs/BENCHMARKS.md, "Scan kernels"): at 256 sequences BLOCK_D 32
    with one warp both ways; at 1,024 sequences 64 forward and 16 backward."""
    block_n = triton.next_power_of_2(n)
    block_d = 32 if n_seq < 512 else (16 if backward else 64)
    block_d = max(1, min(block_d, triton.next_power_of_2(d), 2048 // block_n))
    return block_d, block_n, 1


def _even(d: int, n: int, block_d: int, block_n: int) -> bool:
    """Every channel block is full and the state fills its block: the kernels need no masks."""
    return d % block_d == 0 and n == block_n


class _FusedScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
        u, delta, A, B, C = (x.contiguous().float() for x in (u, delta, A, B, C))
        n_seq, length, d = u.shape
        n = A.shape[1]
        save = any(ctx.needs_input_grad)
        y = torch.empty_like(u)  # (Bt, L, D)
        hs = u.new_empty((n_seq, length, d, n) if save else (1,))  # every h_t, for the backward
        block_d, block_n, warps = _blocks(n_seq, d, n)
        grid = (n_seq, triton.cdiv(d, block_d))
        _scan_fwd[grid](u, delta, A, B, C, y, hs, length, d, n,
                        BLOCK_D=block_d, BLOCK_N=block_n, SAVE=save, EVEN=_even(d, n, block_d, block_n),
                        num_warps=warps)
        if save:
            ctx.save_for_backward(u, delta, A, B, C, hs)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        u, delta, A, B, C, hs = ctx.saved_tensors
        n_seq, length, d = u.shape
        n = A.shape[1]
        block_d, block_n, warps = _blocks(n_seq, d, n)
        n_blk = triton.cdiv(d, block_d)
        du, ddelta = torch.empty_like(u), torch.empty_like(u)
        da_part = u.new_empty((n_seq, d, n))
        db_part = u.new_empty((n_blk, n_seq, length, n))
        dc_part = u.new_empty((n_blk, n_seq, length, n))
        _scan_bwd[(n_seq, n_blk)](u, delta, A, B, C, hs, dy.contiguous().float(), du, ddelta, da_part,
                                  db_part, dc_part, n_seq, length, d, n,
                                  BLOCK_D=block_d, BLOCK_N=block_n, EVEN=_even(d, n, block_d, block_n),
                                  num_warps=warps)
        return du, ddelta, da_part.sum(0), db_part.sum(0), dc_part.sum(0)


def fused_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """y_t = C_t · h_t of the recurrence above (no D·u term), differentiable. u, delta: (Bt, L, D); A: (D, N);
    B, C: (Bt, L, N) -> y (Bt, L, D), float32. Needs `available(u.device)`."""
    return _FusedScan.apply(u, delta, A, B, C)


class _FusedScanLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, c_last: Tensor) -> Tensor:
        u, delta, A, B, C = (x.contiguous().float() for x in (u, delta, A, B, c_last))
        n_seq, length, d = u.shape
        n = A.shape[1]
        y = u.new_empty((n_seq, d))
        block_d, block_n, warps = _last_blocks(n_seq, d, n, backward=False)
        _last_fwd[(n_seq, triton.cdiv(d, block_d))](u, delta, A, B, C, y, length, d, n,
                                                    BLOCK_D=block_d, BLOCK_N=block_n,
                                                    EVEN=_even(d, n, block_d, block_n), num_warps=warps)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(u, delta, A, B, C)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        u, delta, A, B, C = ctx.saved_tensors
        n_seq, length, d = u.shape
        n = A.shape[1]
        block_d, block_n, warps = _last_blocks(n_seq, d, n, backward=True)
        n_blk = triton.cdiv(d, block_d)
        du, dvu, ds = torch.empty_like(u), torch.empty_like(u), torch.empty_like(u)
        da_part = u.new_empty((n_seq, d, n))
        db_part = u.new_empty((n_blk, n_seq, length, n))
        dc_part = u.new_empty((n_blk, n_seq, n))
        _last_bwd[(n_seq, n_blk)](u, delta, A, B, C, dy.contiguous().float(), du, dvu, ds, da_part, db_part,
                                  dc_part, n_seq, length, d, n, BLOCK_D=block_d, BLOCK_N=block_n,
                                  EVEN=_even(d, n, block_d, block_n), num_warps=warps)
        # Δ_s sits in every S_t with t < s: its share is the exclusive prefix sum of ∂S over time.
        ddelta = dvu + (ds.cumsum(1) - ds)
        return du, ddelta, da_part.sum(0), db_part.sum(0), dc_part.sum(0)


def fused_scan_last(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, c_last: Tensor) -> Tensor:
    """`fused_scan(u, delta, A, B, C)[:, -1]` given only c_last = C[:, -1] (Bt, N), differentiable, in closed
    form (the kernels above): (Bt, D), float32. Needs `available(u.device)`."""
    return _FusedScanLast.apply(u, delta, A, B, c_last)
