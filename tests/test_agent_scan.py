"""The fused selective scan (trainer/agent/scan_fused.py) against the sequential PyTorch reference: values and
every gradient, on CPU through Triton's interpreter and on CUDA with the compiled kernels, plus determinism and
CUDA-graph replay of the whole network with the fused scan."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.network import QNetwork, selective_scan_fused, selective_scan_fused_last, selective_scan_sequential

# (Bt, L, D, N): one channel block; D not a power of two (masked lanes); several channel blocks (partials summed);
# N not a power of two; L = 1; several full channel blocks (the kernels' unmasked EVEN path; so are the first and
# the L = 1 shapes).
SHAPES = [(3, 5, 8, 4), (2, 7, 40, 16), (2, 3, 300, 16), (2, 4, 6, 3), (4, 1, 8, 4), (2, 6, 32, 8)]


def scan_inputs(bt: int, length: int, d: int, n: int, device: str = "cpu", seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(bt, length, d, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(bt, length, d, generator=g))  # > 0 as in the network
    a = -torch.rand(d, n, generator=g) * 2 - 0.1  # < 0 as in the network
    b, c = torch.randn(bt, length, n, generator=g), torch.randn(bt, length, n, generator=g)
    dd = torch.randn(d, generator=g)
    return tuple(x.to(device).requires_grad_() for x in (u, delta, a, b, c, dd))


def values_and_grads(scan, args) -> list[torch.Tensor]:
    y = scan(*args)
    # A non-linear loss so that dy differs per position and channel.
    return [y.detach(), *torch.autograd.grad((y * torch.cos(y)).sum(), args)]


def sequential_last(*args) -> torch.Tensor:
    return selective_scan_sequential(*args)[:, -1]


def assert_matches_reference(args) -> None:
    """The full-sequence kernels against the sequential scan, and the last-position (closed-form) kernels against
    its last position."""
    for fused, reference in ((selective_scan_fused, selective_scan_sequential),
                             (selective_scan_fused_last, sequential_last)):
        got, want = values_and_grads(fused, args), values_and_grads(reference, args)
        for name, g, w in zip(("y", "du", "ddelta", "dA", "dB", "dC", "dD"), got, want):
            torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5 * float(w.abs().max()),
                                       msg=f"{fused.__name__} {name}")


def check_last_state_closed_form_by_hand() -> None:
    """`fused_scan_last` on two steps, one channel, one state, worked by hand. A = -ln 2 and Δ = 1, so each later
    step halves an earlier term: h_1 = ½ Δ_0 u_0 B_0 + Δ_1 u_1 B_1 = ½·2 + 4 = 5 and y = C_1 h_1 = 5. Gradients of
    y: ∂u = (½, 1); ∂Δ_0 = ½ u_0 B_0 = 1; ∂Δ_1 = u_1 B_1 + A ½ Δ_0 u_0 B_0 = 4 - ln 2 (Δ_1 is both in the last term
    and in the decay of the first); ∂A = Δ_1 ½ Δ_0 u_0 B_0 = 1; ∂B = (½ u_0, u_1) = (1, 4); ∂C_1 = h_1 = 5."""
    import math

    from trainer.agent import scan_fused

    u = torch.tensor([2.0, 4.0]).view(1, 2, 1).requires_grad_()
    delta, b = torch.ones(1, 2, 1, requires_grad=True), torch.ones(1, 2, 1, requires_grad=True)
    a, c_last = torch.tensor([[-math.log(2.0)]], requires_grad=True), torch.ones(1, 1, requires_grad=True)
    y = scan_fused.fused_scan_last(u, delta, a, b, c_last)
    grads = torch.autograd.grad(y.sum(), (u, delta, a, b, c_last))
    torch.testing.assert_close(y, torch.tensor([[5.0]]))
    for got, want in zip(grads, ([0.5, 1.0], [1.0, 4.0 - math.log(2.0)], [1.0], [1.0, 4.0], [5.0])):
        torch.testing.assert_close(got.flatten(), torch.tensor(want))


def test_fused_scan_matches_sequential_reference_values_and_gradients_in_triton_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (it comes with CUDA builds of PyTorch)")
    # The interpreter is chosen when the kernels are defined, so it runs in a fresh process.
    code = textwrap.dedent(f"""
        import torch
        from trainer.agent import scan_fused
        assert scan_fused.available(torch.device("cpu"))
        from tests.test_agent_scan import (SHAPES, assert_matches_reference, check_last_state_closed_form_by_hand,
                                           scan_inputs)
        check_last_state_closed_form_by_hand()
        for i, shape in enumerate(SHAPES):
            assert_matches_reference(scan_inputs(*shape, seed=i))
        print("ok", len(SHAPES))
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and f"ok {len(SHAPES)}" in proc.stdout, proc.stderr[-3000:]


def test_fused_scan_falls_back_to_the_sequential_scan_where_triton_cannot_run():
    from trainer.agent import scan_fused

    if scan_fused.INTERPRET:
        pytest.skip("TRITON_INTERPRET=1 runs the kernels on CPU: no fallback to check")
    assert not scan_fused.available(torch.device("cpu"))  # CPU tensors never reach a compiled kernel
    args = scan_inputs(2, 5, 8, 4)
    for g, w in zip(values_and_grads(selective_scan_fused, args), values_and_grads(selective_scan_sequential, args)):
        torch.testing.assert_close(g, w)
    for g, w in zip(values_and_grads(selective_scan_fused_last, args), values_and_grads(sequential_last, args)):
        torch.testing.assert_close(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [(256, 32, 128, 16), (1024, 32, 128, 16)])
def test_fused_scan_on_cuda_matches_sequential_reference(shape):
    torch.backends.cuda.matmul.allow_tf32 = False
    assert_matches_reference(scan_inputs(*shape, device="cuda"))


@pytest.mark.gpu
def test_fused_scan_on_cuda_is_deterministic_bit_for_bit():
    args = scan_inputs(64, 32, 128, 16, device="cuda")
    for scan in (selective_scan_fused, selective_scan_fused_last):
        first, second = values_and_grads(scan, args), values_and_grads(scan, args)
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
