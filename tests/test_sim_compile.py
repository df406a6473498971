"""The simulator step under torch.compile (LoopConfig.compile, `trainer.bench --compile`) gives the eager step's
trajectory: same integer state exactly, float state and rewards to float rounding (inductor may reorder float
arithmetic), on CPU and, through `device`, on CUDA replayed as a CUDA graph."""
from __future__ import annotations

import pytest
import torch

from trainer.sim import SimConfig, Simulator
from trainer.sim.synthetic import random_decision_tape

BRANCHES = (4, 3, 3, 3)


def _actions(n_envs: int, steps: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.stack([torch.randint(0, b, (n_envs,), generator=g) for b in BRANCHES], 1) for _ in range(steps)]


def _assert_same_state(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        g, w = got[key].cpu(), want[key].cpu()
        if w.is_floating_point():
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6 * max(1.0, float(w.abs().max())), msg=key)
        else:
            assert torch.equal(g, w), key


# The default order kinds, and the marketable-limit kinds with feed latency (a different set of kernels).
CONFIGS = {
    "default": {},
    "ioc_fok_post_only": {"order_types": ("ioc", "post_only", "fok"), "marketable_limit_ticks": 1,
                          "post_only_ticks": 1, "feed_latency_steps": 2, "max_position": 9},
}


def _compare(device: str, n_envs: int, steps: int, graph: bool, extra: dict) -> None:
    tape = random_decision_tape(600, levels=10, radius=8, seed=5)
    config = SimConfig(n_envs=n_envs, latency_steps=1, on_expiry="market", seed=3, **extra)
    eager, compiled = Simulator(tape, config, device), Simulator(tape, config, device)
    se, sc = eager.reset(0, 600, 20), compiled.reset(0, 600, 20)
    step = torch.compile(compiled.step, dynamic=False)
    acts = [a.to(device) for a in _actions(n_envs, steps, seed=7)]
    static = acts[0].clone()
    replay = None
    for k, a in enumerate(acts):
        want = eager.step(se, a)
        if graph and k == 3:  # first steps compile and warm up eagerly; the rest replay one captured graph
            torch.cuda.synchronize()
            replay = torch.cuda.CUDAGraph()
            with torch.cuda.graph(replay):  # records kernels without running them: the state is not advanced
                out = step(sc, static)
        if replay is not None:
            static.copy_(a)
            replay.replay()
            got = out
        else:
            got = step(sc, a)
        torch.testing.assert_close(got.reward, want.reward, rtol=1e-6, atol=1e-6)
        assert torch.equal(got.done, want.done) and torch.equal(got.truncated, want.truncated)
    _assert_same_state(sc.state_dict(), se.state_dict())
    assert se.action_counts.sum().item() == n_envs * steps  # the trajectory really ran
    if extra:
        assert se.rejected_orders.sum().item() > 0 and se.market_orders.sum().item() > 0  # the new kinds really ran


@pytest.mark.slow
@pytest.mark.parametrize("kinds", CONFIGS)
def test_sim_compiled_step_matches_eager_trajectory_on_cpu(kinds):
    _compare("cpu", n_envs=64, steps=40, graph=False, extra=CONFIGS[kinds])


@pytest.mark.gpu
@pytest.mark.parametrize("kinds", CONFIGS)
def test_sim_compiled_step_matches_eager_trajectory_on_cuda_under_a_cuda_graph(kinds):
    _compare("cuda", n_envs=1024, steps=60, graph=True, extra=CONFIGS[kinds])
