"""The Mamba block's inner part fused: Δ, the selective scan, the skip and the gate in one Triton kernel each way.

    Δ_t   = softplus(W_Δ r_t + b_Δ)                      r_t = x_dbl[t, :R] (the low-rank Δ input), W_Δ (D, R)
    h_t   = exp(Δ_t A) ⊙ h_{t-1} + (Δ_t u_t) B_t          h: (D, N) per sequence, h_{-1} = 0; B_t = x_dbl[t, R:R+N]
    y_t   = Σ_n C_{t,n} h_{t,n} + D_skip u_t             C_t = x_dbl[t, R+N:]
    out_t = y_t ⊙ silu(z_t)                              every t, or the last t only (`last_only`)

Why: the step is bound by chains of small kernels (docs/BENCHMARKS.md). Unfused, this part is a rank-R GEMM for Δ,
a softplus, copies of the B and C columns, the scan, and the skip-and-gate, each reading or writing a (Bt, L, D)
tensor, plus as many again in the backward. Here each program owns one sequence and a block of channels, keeps
its (BLOCK_D, N) state in registers, and walks the L steps once, reading u, z (Bt, L, D) and x_dbl (Bt, L, R+2N)
once and writing only the gated output; with `save_states` it also writes every h_t (Bt, L, D, N), which the
backward reads instead of recomputing. With `last_only` (an encoder's final block) the readout and the gate run
for the last position alone.

Backward (reverse-time walk, g = ∂loss/∂h_t accumulated from later steps; dy_t = dout_t ⊙ silu(z_t)):
    dz_t  = dout_t ⊙ y_t ⊙ silu'(z_t)                    dD_skip = Σ_{b,t} dy_t u_t
    g_t   = g_{t+1} ⊙ exp(Δ_{t+1} A) + C_t ⊗ dy_t
    dC_t  = Σ_d dy_t,d h_t,d                             dB_t = Σ_d g_t,d Δ_t,d u_t,d
    du_t  = Σ_n g_t B_t Δ_t + D_skip dy_t                dΔ_t = Σ_n g_t (B_t u_t + A exp(Δ_t A) h_{t-1})
    dA    = Σ_{b,t} g_t exp(Δ_t A) Δ_t h_{t-1}           dp_t = dΔ_t σ(W_Δ r_t + b_Δ)   (softplus' = sigmoid)
    dr_t  = W_Δᵀ dp_t        dW_Δ = Σ_{b,t} dp_t ⊗ r_t        db_Δ = Σ_{b,t} dp_t
Reductions across channel blocks and sequences are written as per-program partials and summed by torch, not
with atomics, so results are deterministic (the checkpoint resume contract needs bit-identical replays).

CUDA only; `network.MambaBlock` computes the same with PyTorch ops and the sequential scan on other devices
(`network.mamba_inner_reference`), so the same network runs in CPU CI. `TRITON_INTERPRET=1` runs the kernels on
CPU tensors (tests/test_agent_scan.py).
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
    def _softplus_sigmoid(pre):
        """softplus(pre) = max(pre, 0) + log1p(exp(-|pre|)), accurate for small and large |pre|, and its
        derivative sigmoid(pre). log1p(e) as log(1 + e) · e / ((1 + e) - 1): exact where 1 + e rounds to 1."""
        e = tl.exp(-tl.abs(pre))
        one_e = 1.0 + e
        log1p = tl.where(one_e == 1.0, e, tl.log(one_e) * e / (one_e - 1.0))
        sig = tl.where(pre >= 0, 1.0 / one_e, e / one_e)
        return tl.maximum(pre, 0.0) + log1p, sig

    @triton.jit
    def _inner_fwd(u_ptr, x_ptr, w_ptr, bias_ptr, a_ptr, dskip_ptr, z_ptr, out_ptr, hs_ptr,
                   L, D, N, R, stride_zb, stride_zt,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                   SAVE: tl.constexpr, LAST_ONLY: tl.constexpr):
        seq = tl.program_id(0)
        offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        offs_r = tl.arange(0, BLOCK_R)
        mask_d, mask_n, mask_r = offs_d < D, offs_n < N, offs_r < R
        mask_dn = mask_d[:, None] & mask_n[None, :]
        xw = R + 2 * N  # x_dbl row width: [r | B | C]
        a = tl.load(a_ptr + offs_d[:, None] * N + offs_n[None, :], mask=mask_dn, other=0.0)  # (BD, BN)
        w = tl.load(w_ptr + offs_d[:, None] * R + offs_r[None, :], mask=mask_d[:, None] & mask_r[None, :],
                    other=0.0)  # (BD, BR)
        bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0)
        dskip = tl.load(dskip_ptr + offs_d, mask=mask_d, other=0.0)
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
        # Software prefetch: step t+1's inputs are loaded before step t is computed, so the loads' latency
        # overlaps the arithmetic instead of stalling every step of the dependent walk.
        row = seq * L
        u_next = tl.load(u_ptr + row * D + offs_d, mask=mask_d, other=0.0)
        r_next = tl.load(x_ptr + row * xw + offs_r, mask=mask_r, other=0.0)
        b_next = tl.load(x_ptr + row * xw + R + offs_n, mask=mask_n, other=0.0)
        c_next = tl.load(x_ptr + row * xw + R + N + offs_n, mask=mask_n, other=0.0)
        for t in range(L):
            row = seq * L + t
            u, rr, bb, cc = u_next, r_next, b_next, c_next
            # Masks as vectors (offs * 0 + t): a scalar condition in a mask trips the interpreter.
            more_d = mask_d & (offs_d * 0 + t + 1 < L)
            more_n, more_r = mask_n & (offs_n * 0 + t + 1 < L), mask_r & (offs_r * 0 + t + 1 < L)
            u_next = tl.load(u_ptr + (row + 1) * D + offs_d, mask=more_d, other=0.0)
            r_next = tl.load(x_ptr + (row + 1) * xw + offs_r, mask=more_r, other=0.0)
            b_next = tl.load(x_ptr + (row + 1) * xw + R + offs_n, mask=more_n, other=0.0)
            c_next = tl.load(x_ptr + (row + 1) * xw + R + N + offs_n, mask=more_n, other=0.0)
            dt, _ = _softplus_sigmoid(tl.sum(w * rr[None, :], axis=1) + bias)  # Δ_t (BD,)
            h = tl.exp(dt[:, None] * a) * h + (dt * u)[:, None] * bb[None, :]
            if not LAST_ONLY:
                zz = tl.load(z_ptr + seq * stride_zb + t * stride_zt + offs_d, mask=mask_d, other=0.0)
                y = tl.sum(h * cc[None, :], axis=1) + dskip * u
                tl.store(out_ptr + row * D + offs_d, y * zz * tl.sigmoid(zz), mask=mask_d)
            if SAVE:
                tl.store(hs_ptr + (row * D + offs_d[:, None]) * N + offs_n[None, :], h, mask=mask_dn)
        if LAST_ONLY:
            row = seq * L + L - 1
            u = tl.load(u_ptr + row * D + offs_d, mask=mask_d, other=0.0)
            cc = tl.load(x_ptr + row * xw + R + N + offs_n, mask=mask_n, other=0.0)
            zz = tl.load(z_ptr + seq * stride_zb + offs_d, mask=mask_d, other=0.0)
            y = tl.sum(h * cc[None, :], axis=1) + dskip * u
            tl.store(out_ptr + seq * D + offs_d, y * zz * tl.sigmoid(zz), mask=mask_d)

    @triton.jit
    def _inner_bwd(u_ptr, x_ptr, w_ptr, bias_ptr, a_ptr, dskip_ptr, z_ptr, hs_ptr, dout_ptr,
                   du_ptr, dz_ptr, dx_part_ptr, dp_part_ptr,
                   n_seq, L, D, N, R, stride_zb, stride_zt,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                   LAST_ONLY: tl.constexpr):
        seq = tl.program_id(0)
        blk = tl.program_id(1)
        offs_d = blk * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        offs_r = tl.arange(0, BLOCK_R)
        mask_d, mask_n, mask_r = offs_d < D, offs_n < N, offs_r < R
        mask_dn = mask_d[:, None] & mask_n[None, :]
        xw = R + 2 * N
        a = tl.load(a_ptr + offs_d[:, None] * N + offs_n[None, :], mask=mask_dn, other=0.0)
        w = tl.load(w_ptr + offs_d[:, None] * R + offs_r[None, :], mask=mask_d[:, None] & mask_r[None, :],
                    other=0.0)
        bias = tl.load(bias_ptr + offs_d, mask=mask_d, other=0.0)
        dskip = tl.load(dskip_ptr + offs_d, mask=mask_d, other=0.0)
        g = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)        # ∂loss/∂h_t
        da_acc = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)   # this sequence's shares of ∂loss/∂A, ...
        dw_acc = tl.zeros((BLOCK_D, BLOCK_R), dtype=tl.float32)   # ... ∂loss/∂W_Δ, ...
        dbias_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)        # ... ∂loss/∂b_Δ
        dskip_acc = tl.zeros((BLOCK_D,), dtype=tl.float32)        # ... and ∂loss/∂D_skip
        # Software prefetch as in the forward, walking back: step t-1's inputs load while step t computes. h_t is
        # the previous iteration's h_{t-1}, so each saved state is read once; h_{-1} = 0 (masked load).
        row = seq * L + L - 1
        h = tl.load(hs_ptr + (row * D + offs_d[:, None]) * N + offs_n[None, :], mask=mask_dn, other=0.0)
        u_next = tl.load(u_ptr + row * D + offs_d, mask=mask_d, other=0.0)
        r_next = tl.load(x_ptr + row * xw + offs_r, mask=mask_r, other=0.0)
        b_next = tl.load(x_ptr + row * xw + R + offs_n, mask=mask_n, other=0.0)
        c_next = tl.load(x_ptr + row * xw + R + N + offs_n, mask=mask_n, other=0.0)
        hp_next = tl.load(hs_ptr + ((row - 1) * D + offs_d[:, None]) * N + offs_n[None, :],
                          mask=mask_dn & (offs_d[:, None] * 0 + L > 1), other=0.0)  # h_{L-2}
        if LAST_ONLY:
            # Only the last position was read out: its dy and dz here, dy = 0 at every earlier step.
            zz = tl.load(z_ptr + seq * stride_zb + offs_d, mask=mask_d, other=0.0)
            dout = tl.load(dout_ptr + seq * D + offs_d, mask=mask_d, other=0.0)
            y = tl.sum(h * c_next[None, :], axis=1) + dskip * u_next
            sz = tl.sigmoid(zz)
            tl.store(dz_ptr + seq * D + offs_d, dout * y * sz * (1.0 + zz * (1.0 - sz)), mask=mask_d)
            dy_last = dout * zz * sz
        else:
            dy_last = tl.zeros((BLOCK_D,), dtype=tl.float32)
            z_next = tl.load(z_ptr + seq * stride_zb + (L - 1) * stride_zt + offs_d, mask=mask_d, other=0.0)
            dout_next = tl.load(dout_ptr + row * D + offs_d, mask=mask_d, other=0.0)
        for i in range(L):
            t = L - 1 - i
            row = seq * L + t
            u, rr, bb, cc, h_prev = u_next, r_next, b_next, c_next, hp_next
            more_d, more_n = mask_d & (offs_d * 0 + t > 0), mask_n & (offs_n * 0 + t > 0)  # a step t-1 exists
            more_r = mask_r & (offs_r * 0 + t > 0)
            u_next = tl.load(u_ptr + (row - 1) * D + offs_d, mask=more_d, other=0.0)
            r_next = tl.load(x_ptr + (row - 1) * xw + offs_r, mask=more_r, other=0.0)
            b_next = tl.load(x_ptr + (row - 1) * xw + R + offs_n, mask=more_n, other=0.0)
            c_next = tl.load(x_ptr + (row - 1) * xw + R + N + offs_n, mask=more_n, other=0.0)
            hp_next = tl.load(hs_ptr + ((row - 2) * D + offs_d[:, None]) * N + offs_n[None, :],
                              mask=mask_dn & (offs_d[:, None] * 0 + t > 1), other=0.0)  # h_{t-2}
            if LAST_ONLY:
                dy = dy_last
                dy_last = dy_last * 0.0
            else:
                zz, dout = z_next, dout_next
                z_next = tl.load(z_ptr + seq * stride_zb + (t - 1) * stride_zt + offs_d, mask=more_d, other=0.0)
                dout_next = tl.load(dout_ptr + (row - 1) * D + offs_d, mask=more_d, other=0.0)
                y = tl.sum(h * cc[None, :], axis=1) + dskip * u
                sz = tl.sigmoid(zz)
                tl.store(dz_ptr + row * D + offs_d, dout * y * sz * (1.0 + zz * (1.0 - sz)), mask=mask_d)
                dy = dout * zz * sz
            dt, sig = _softplus_sigmoid(tl.sum(w * rr[None, :], axis=1) + bias)
            g += cc[None, :] * dy[:, None]
            decay = tl.exp(dt[:, None] * a)
            g_h_prev = g * h_prev * decay  # ∂loss/∂(Δ A) through the decay term
            gb = tl.sum(g * bb[None, :], axis=1)
            dp = (gb * u + tl.sum(g_h_prev * a, axis=1)) * sig  # ∂loss/∂(W_Δ r_t + b_Δ)
            tl.store(du_ptr + row * D + offs_d, gb * dt + dy * dskip, mask=mask_d)
            # Partials over this block's channels of the x_dbl row [r | B | C]; blocks are summed by torch.
            part = (blk * n_seq * L + row) * xw
            tl.store(dx_part_ptr + part + offs_r, tl.sum(dp[:, None] * w, axis=0), mask=mask_r)
            tl.store(dx_part_ptr + part + R + offs_n, tl.sum(g * (dt * u)[:, None], axis=0), mask=mask_n)
            tl.store(dx_part_ptr + part + R + N + offs_n, tl.sum(h * dy[:, None], axis=0), mask=mask_n)
            da_acc += g_h_prev * dt[:, None]
            dw_acc += dp[:, None] * rr[None, :]
            dbias_acc += dp
            dskip_acc += dy * u
            g = g * decay
            h = h_prev
        # This sequence's parameter gradients as one row [dA | dW_Δ | db_Δ | dD_skip] per channel: one sum over
        # sequences (torch) then serves all four.
        pw = N + R + 2
        base = (seq * D + offs_d) * pw
        tl.store(dp_part_ptr + base[:, None] + offs_n[None, :], da_acc, mask=mask_dn)
        tl.store(dp_part_ptr + base[:, None] + N + offs_r[None, :], dw_acc, mask=mask_d[:, None] & mask_r[None, :])
        tl.store(dp_part_ptr + base + N + R, dbias_acc, mask=mask_d)
        tl.store(dp_part_ptr + base + N + R + 1, dskip_acc, mask=mask_d)


def _blocks(n_seq: int, d: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_N, warps), a fixed function of the shapes (no autotuning: the backward's partial sums, and
    so its rounding, depend on BLOCK_D, and a resumed run must replay bit for bit).

    One warp per program and enough programs to fill the GPU: measured on an H200 at L=32, D=128, N=16
    (docs/BENCHMARKS.md, "scan launch shape", with the prefetching kernels), BLOCK_D=16 is fastest at 256
    sequences (forward / forward saving states / backward 18/33/39 µs against 27/34/43 at 32) and 64 at 1,024
    (38/112/137 µs; the acting pass there runs the forward alone)."""
    block_n = triton.next_power_of_2(n)
    block_d = 16 if n_seq < 512 else 64
    block_d = max(1, min(block_d, triton.next_power_of_2(d), 2048 // block_n))
    return block_d, block_n, 1


class _FusedMambaInner(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u: Tensor, x_dbl: Tensor, dt_weight: Tensor, dt_bias: Tensor, A: Tensor, D_skip: Tensor,
                z: Tensor, last_only: bool) -> Tensor:
        u, x_dbl, dt_weight, dt_bias, A, D_skip = (t.contiguous().float() for t in (u, x_dbl, dt_weight, dt_bias,
                                                                                      A, D_skip))
        z = z.float() if z.stride(-1) == 1 else z.float().contiguous()  # z may be a column slice of in_proj's out
        n_seq, length, d = u.shape
        n, r = A.shape[1], dt_weight.shape[1]
        save = any(ctx.needs_input_grad)
        out = u.new_empty((n_seq, d) if last_only else (n_seq, length, d))
        hs = u.new_empty((n_seq, length, d, n) if save else (1,))  # every h_t, for the backward
        block_d, block_n, warps = _blocks(n_seq, d, n)
        grid = (n_seq, triton.cdiv(d, block_d))
        _inner_fwd[grid](u, x_dbl, dt_weight, dt_bias, A, D_skip, z, out, hs, length, d, n, r,
                         z.stride(0), z.stride(1) if not last_only else 0,
                         BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_R=triton.next_power_of_2(r), SAVE=save,
                         LAST_ONLY=last_only, num_warps=warps)
        if save:
            ctx.save_for_backward(u, x_dbl, dt_weight, dt_bias, A, D_skip, z, hs)
        ctx.last_only = last_only
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        u, x_dbl, dt_weight, dt_bias, A, D_skip, z, hs = ctx.saved_tensors
        last_only = ctx.last_only
        n_seq, length, d = u.shape
        n, r = A.shape[1], dt_weight.shape[1]
        block_d, block_n, warps = _blocks(n_seq, d, n)
        n_blk = triton.cdiv(d, block_d)
        du = torch.empty_like(u)
        dz = u.new_empty(z.shape)  # contiguous, whatever z's strides
        dx_part = u.new_empty((n_blk, n_seq, length, r + 2 * n))
        dp_part = u.new_empty((n_seq, d, n + r + 2))  # per sequence and channel: [dA | dW_Δ | db_Δ | dD_skip]
        _inner_bwd[(n_seq, n_blk)](u, x_dbl, dt_weight, dt_bias, A, D_skip, z, hs, dout.contiguous().float(),
                                   du, dz, dx_part, dp_part,
                                   n_seq, length, d, n, r, z.stride(0), z.stride(1) if not last_only else 0,
                                   BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_R=triton.next_power_of_2(r),
                                   LAST_ONLY=last_only, num_warps=warps)
        da, dw, dbias, dskip = dp_part.sum(0).split([n, r, 1, 1], dim=1)
        return du, dx_part.sum(0), dw, dbias.squeeze(1), da, dskip.squeeze(1), dz, None


def mamba_inner(u: Tensor, x_dbl: Tensor, dt_weight: Tensor, dt_bias: Tensor, A: Tensor, D_skip: Tensor, z: Tensor,
                last_only: bool = False) -> Tensor:
    """The fused inner part of a Mamba block (module docstring), differentiable in every tensor argument.

    u (Bt, L, D) the conv's output; x_dbl (Bt, L, R + 2N) = [r | B | C] from the x-projection; dt_weight (D, R),
    dt_bias (D,) Δ's projection; A (D, N) < 0; D_skip (D,); z (Bt, L, D) the gate's input (any strides with the
    channels contiguous), or (Bt, D) at the last position when `last_only`. Returns out (Bt, L, D), or (Bt, D) when
    `last_only`, float32. Needs `available(u.device)`."""
    return _FusedMambaInner.apply(u, x_dbl, dt_weight, dt_bias, A, D_skip, z, last_only)
