"""The fused Mamba inner part (trainer/agent/scan_fused.py: Δ, selective scan, skip, gate) against its PyTorch
reference with the sequential scan: values and every gradient, at every position and at the last only, on CPU
through Triton's interpreter and on CUDA with the compiled kernels, plus determinism and CUDA-graph replay of the
whole network with the fused kernels."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.network import MambaBlock, QNetwork, mamba_inner_reference

# (Bt, L, D, N, R): one channel block; D not a power of two (masked lanes); several channel blocks (partials
# summed); N and R not powers of two; L = 1.
SHAPES = [(3, 5, 8, 4, 2), (2, 7, 40, 16, 3), (2, 3, 300, 16, 4), (2, 4, 6, 3, 1), (4, 1, 8, 4, 2)]
NAMES = ("out", "du", "dx_dbl", "ddt_weight", "ddt_bias", "dA", "dD", "dz")


def inner_inputs(bt: int, length: int, d: int, n: int, r: int, last_only: bool, device: str = "cpu",
                 seed: int = 0) -> tuple:
    """Inputs as a Mamba block makes them. z is a column slice of a wider tensor (as of the in-projection's
    output), so the kernels see z with strides that are not its shape's."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(bt, length, d, generator=g)
    x_dbl = torch.randn(bt, length, r + 2 * n, generator=g)
    dt_weight = torch.randn(d, r, generator=g) * 0.5
    dt_bias = torch.randn(d, generator=g) - 2.0  # Δ mostly small, as Mamba initialises it
    a = -torch.rand(d, n, generator=g) * 2 - 0.1  # < 0 as in the network
    dd = torch.randn(d, generator=g)
    wide = torch.randn(bt, 2 * d, generator=g) if last_only else torch.randn(bt, length, 2 * d, generator=g)
    leaves = [x.to(device).requires_grad_() for x in (u, x_dbl, dt_weight, dt_bias, a, dd, wide)]
    z = leaves[-1][..., d:]
    return (*leaves[:-1], z, last_only), leaves


def values_and_grads(inner, args, leaves) -> list[torch.Tensor]:
    out = inner(*args)
    # A non-linear loss so that dout differs per position and channel.
    grads = torch.autograd.grad((out * torch.cos(out)).sum(), leaves)
    return [out.detach(), *grads[:-1], grads[-1][..., args[0].shape[-1]:]]


def assert_matches_reference(args, leaves) -> None:
    from trainer.agent import scan_fused

    got = values_and_grads(scan_fused.mamba_inner, args, leaves)
    want = values_and_grads(mamba_inner_reference, args, leaves)
    for name, g, w in zip(NAMES, got, want):
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5 * float(w.abs().max()), msg=name)


def test_fused_inner_matches_reference_values_and_gradients_in_triton_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (it comes with CUDA builds of PyTorch)")
    # The interpreter is chosen when the kernels are defined, so it runs in a fresh process.
    code = textwrap.dedent("""
        import torch
        from trainer.agent import scan_fused
        assert scan_fused.available(torch.device("cpu"))
        from tests.test_agent_scan import SHAPES, assert_matches_reference, inner_inputs
        for i, shape in enumerate(SHAPES):
            for last_only in (False, True):
                assert_matches_reference(*inner_inputs(*shape, last_only, seed=i))
        print("ok", len(SHAPES))
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and f"ok {len(SHAPES)}" in proc.stdout, proc.stderr[-3000:]


def test_fused_block_falls_back_to_the_sequential_scan_where_triton_cannot_run():
    from trainer.agent import scan_fused

    if scan_fused.INTERPRET:
        pytest.skip("TRITON_INTERPRET=1 runs the kernels on CPU: no fallback to check")
    assert not scan_fused.available(torch.device("cpu"))  # CPU tensors never reach a compiled kernel
    torch.manual_seed(0)
    fused, sequential = MambaBlock(16, 4, 4, 2, scan="fused"), MambaBlock(16, 4, 4, 2, scan="sequential")
    sequential.load_state_dict(fused.state_dict())
    x = torch.randn(3, 6, 16)
    for last_only in (False, True):
        torch.testing.assert_close(fused(x, last_only), sequential(x, last_only), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("last_only", [False, True])
@pytest.mark.parametrize("shape", SHAPES + [(256, 32, 128, 16, 4), (1024, 32, 128, 16, 4)])
def test_fused_inner_on_cuda_matches_reference(shape, last_only):
    torch.backends.cuda.matmul.allow_tf32 = False
    assert_matches_reference(*inner_inputs(*shape, last_only, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("last_only", [False, True])
def test_fused_inner_on_cuda_is_deterministic_bit_for_bit(last_only):
    from trainer.agent import scan_fused

    args, leaves = inner_inputs(64, 32, 128, 16, 4, last_only, device="cuda")
    first = values_and_grads(scan_fused.mamba_inner, args, leaves)
    second = values_and_grads(scan_fused.mamba_inner, args, leaves)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_network_with_fused_scan_replays_in_a_cuda_graph_like_eager():
    torch.manual_seed(0)
    cfg = AgentConfig(n_features=9, env_state_dim=5, window=32, d_model=64, d_state=16, n_layers=2, scan="fused")
    net = QNetwork(cfg).cuda()
    obs = torch.randn(128, cfg.window, cfg.n_features, device="cuda")
    env_state = torch.randn(128, cfg.env_state_dim, device="cuda")

    def fwd_bwd():
        net.zero_grad(set_to_none=False)
        loss = net(obs, env_state).square().mean()
        loss.backward()
        return loss

    eager_loss = fwd_bwd().detach().clone()
    eager_grads = [p.grad.clone() for p in net.parameters()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compiles the kernels and settles the allocator before capture
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = fwd_bwd()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_loss, eager_loss)
    for p, g in zip(net.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, g)
