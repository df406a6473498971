"""Benchmarks: `python -m trainer.bench --sim-only --n-envs N --steps S --device cpu|cuda [--json]`.

--sim-only times `Simulator.step` alone (random actions on a random, well-formed DecisionTape) and reports
env steps/s = n_envs x steps / seconds. On CUDA the step is captured once in a CUDA graph and replayed,
as the training loop does. (The full act + learn step benchmark is added here by the loop.)
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from trainer.errors import exit_code_for
from trainer.sim import BRANCH_SIZES, SimConfig, Simulator
from trainer.sim.synthetic import random_decision_tape

_ACTION_POOL = 64  # distinct random action batches cycled through (generated up front, off the clock)


def run_sim_bench(n_envs: int, steps: int, device: str, *, tape_rows: int = 20_000, warmup: int = 20,
                  cuda_graph: bool = True, compile: bool = False) -> dict:
    """Time `steps` simulator steps of `n_envs` envs on `device`; returns a dict with `env_steps_per_s`."""
    if n_envs < 1 or steps < 1:
        raise ValueError(f"run_sim_bench: n_envs and steps must be >= 1, got n_envs={n_envs}, steps={steps}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("run_sim_bench: --device cuda asked for, but torch sees no CUDA device")
    tape = random_decision_tape(tape_rows, levels=10, radius=16, seed=0)
    cfg = SimConfig(n_envs=n_envs, latency_steps=1, on_expiry="market", seed=0)
    sim = Simulator(tape, cfg, dev)
    state = sim.reset(0, tape_rows, min_history=64)
    g = torch.Generator(device="cpu").manual_seed(0)
    pool = torch.stack(
        [torch.stack([torch.randint(0, b, (n_envs,), generator=g) for b in BRANCH_SIZES], 1) for _ in range(_ACTION_POOL)]
    ).to(dev)  # (pool, n_envs, 4) int64
    actions = pool[0].clone()  # static input buffer (its address is baked into a captured graph)
    # torch.compile fuses the ~500 small elementwise kernels of a step into a few; compile time is off the clock.
    step = torch.compile(sim.step, dynamic=False) if compile else sim.step

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # host sync: only around the timed region

    use_graph = cuda_graph and dev.type == "cuda"
    graph = None
    if use_graph:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for i in range(max(warmup, 3)):
                actions.copy_(pool[i % _ACTION_POOL])
                step(state, actions)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(state, actions)
    else:
        for i in range(warmup):
            actions.copy_(pool[i % _ACTION_POOL])
            step(state, actions)
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        actions.copy_(pool[i % _ACTION_POOL])
        if graph is not None:
            graph.replay()
        else:
            step(state, actions)
    sync()
    seconds = time.perf_counter() - t0
    return {
        "bench": "sim",
        "device": str(dev) if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        "n_envs": n_envs,
        "steps": steps,
        "seconds": seconds,
        "step_ms": 1e3 * seconds / steps,
        "env_steps_per_s": n_envs * steps / seconds,
        "cuda_graph": use_graph,
        "compiled": compile,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sim-only", action="store_true", help="benchmark the simulator step alone")
    parser.add_argument("--n-envs", type=int, default=16_384, help="environments stepped in lock-step")
    parser.add_argument("--steps", type=int, default=200, help="timed steps (after warm-up)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--no-cuda-graph", action="store_true", help="on CUDA, launch the step eagerly")
    parser.add_argument("--compile", action="store_true", help="torch.compile the step (compile time not timed)")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    args = parser.parse_args(argv)
    try:
        if not args.sim_only:
            raise ValueError("only --sim-only is implemented so far")
        if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
            raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
        result = run_sim_bench(args.n_envs, args.steps, args.device, cuda_graph=not args.no_cuda_graph,
                               compile=args.compile)
    except Exception as exc:  # process edge: one clear line on stderr, exit code per DESIGN.md
        print(f"trainer.bench: error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>16}  {value:,.1f}" if isinstance(value, float) else f"{key:>16}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
