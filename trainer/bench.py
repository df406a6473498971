"""Benchmarks (commands that print tables; never timed tests).

    python -m trainer.bench --sim-only --n-envs N --steps S --device cpu|cuda [--json]
    python -m trainer.bench --n-envs N --steps S --mode eager|graph|both --device D [--preset h100] [--json]
                            [--act-sm-share F] [--no-overlap]        (where acting runs beside the learner; same values)
    python -m trainer.bench --profile --n-envs N --device D [--compile sim|all|autotune] [--mode graph]  (kernels/step)
    python -m trainer.bench --sweep [--n-envs-list 256,1024,4096,16384] --device cuda     (the issue-8 table)
    python -m trainer.bench --pieces --n-envs N --device D [--compile all] [--mode graph]  (ms per piece of a step)

--sim-only times `Simulator.step` alone (random actions on a random, well-formed DecisionTape) and reports
env steps/s = n_envs x steps / seconds. On CUDA the step is captured once in a CUDA graph and replayed.

The full step is the training loop's own `TrainStep` (act on n_envs envs with Thompson sampling → simulator step →
n-step accumulate → replay add → replay sample → one C51 gradient step → priorities) on a random tape and random
features of the preset's width, eager or captured as one CUDA graph. It reports steps/s, transitions/s
(= steps/s x n_envs), ms per step, peak GPU memory, and achieved model TFLOP/s (matmul FLOPs counted analytically by
torch.utils.flop_counter over one step) against a TF32 matmul ceiling measured in the same process.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from trainer.errors import exit_code_for
from trainer.loop.config import preset
from trainer.settings import COMPILE_CHOICES, ENCODERS, PRESET_NAMES, SCANS
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


def tf32_ceiling_tflops(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    """Measured TF32 matmul throughput (n x n x n float32 with TF32 on), the ceiling the model is compared to."""
    torch.backends.cuda.matmul.allow_tf32 = True
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


DEFAULT_WINDOW_ROWS = 2_600
"""Training-window length of the full-step benchmark: 4 synthetic trading days at the default 100-event clock."""


def _bench_trainer(preset_name: str, n_envs: int, device: str, seed: int = 0, tape_rows: int = DEFAULT_WINDOW_ROWS,
                   agent: dict | None = None, compile: str = "none", warm_updates: int = 3, loop: dict | None = None,
                   mode: str = "auto"):
    """A FoldTrainer at the preset's model size on a random tape with random features (no data pipeline), its
    replay filled past a batch (the n-step rings mature) and `warm_updates` eager steps run (lazy optimizer state,
    cuBLAS handles, the allocator, and torch.compile's compilation when `compile` asks for it). `loop` overrides
    more LoopConfig fields (`overlap`, `act_sm_share`)."""
    import numpy as np

    from trainer.loop.fold import FoldTrainer, Window

    cfg = preset(preset_name)
    cfg = cfg.replace(sim={"n_envs": n_envs, "seed": seed}, loop={"device": device, "seed": seed, "learning_starts": 8,
                                                                 "compile": compile, "mode": mode,
                                                                 **(loop or {})},
                      replay={"capacity": max(cfg.replay.capacity, 4 * n_envs)}, agent=agent or {})
    tape = random_decision_tape(tape_rows, levels=10, radius=16, seed=seed)
    features = np.random.default_rng(seed).standard_normal((tape_rows, 23)).astype(np.float32)
    # The reflected inputs (AgentConfig.mirror, the h100 preset: read by greedy decisions only; mirror_augment: by
    # the step's sampling): random columns of the same width time the same work.
    reflected = np.random.default_rng(seed + 1).standard_normal(features.shape).astype(np.float32) \
        if cfg.agent.mirror or cfg.agent.mirror_augment else None
    trainer = FoldTrainer(cfg, features, tape, Window(0, tape_rows), fold=0, reflected=reflected)
    for _ in range(cfg.loop.learning_starts):
        trainer.step_fn.act_and_store()
    for _ in range(warm_updates):
        trainer.step_fn()
    return trainer


def count_step_flops(preset_name: str, n_envs: int, device: str, seed: int = 0,
                     window_rows: int = DEFAULT_WINDOW_ROWS, agent: dict | None = None) -> int:
    """Matmul/conv FLOPs of one full step (act forward + target forwards + online forward/backward), counted by
    torch.utils.flop_counter from the ops' shapes (analytic, not measured), on an uncompiled twin of the timed
    trainer: compiled code hides its ops from the counter, and a step run under the counter's dispatch mode
    leaves torch.compile'd functions running eagerly afterwards (measured: a captured graph then ran the eager
    kernels, at less than half the speed)."""
    from torch.utils.flop_counter import FlopCounterMode

    twin = _bench_trainer(preset_name, n_envs, device, seed, window_rows, agent, "none", warm_updates=0)
    counter = FlopCounterMode(display=False)
    with counter:
        twin.step_fn()
    return int(counter.get_total_flops())


def run_step_bench(n_envs: int, steps: int, device: str, mode: str, preset_name: str = "h100",
                   seed: int = 0, window_rows: int = DEFAULT_WINDOW_ROWS, agent: dict | None = None,
                   compile: str = "none", loop: dict | None = None) -> dict:
    """Time `steps` full training steps; returns steps/s, transitions/s, ms/step, peak memory, losses."""
    from trainer.loop.step import GraphedStep

    dev = torch.device(device)
    if mode not in ("eager", "graph"):
        raise ValueError(f"mode must be eager or graph, got {mode!r}")
    if mode == "graph" and dev.type != "cuda":
        raise ValueError("graph mode needs --device cuda")
    torch.manual_seed(seed)
    # The trainer in the mode it is timed in: FoldTrainer uses side streams only for a captured graph.
    trainer = _bench_trainer(preset_name, n_envs, device, seed, window_rows, agent, compile, loop=loop, mode=mode)
    step = trainer.step_fn
    flops = count_step_flops(preset_name, n_envs, device, seed, window_rows, agent)
    run = GraphedStep(step) if mode == "graph" else step
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    losses = []
    t0 = time.perf_counter()
    for i in range(steps):
        run()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # host sync: end of the timed region only
    seconds = time.perf_counter() - t0
    losses.append(float(step.metrics.mean("loss")))  # host sync, once per run
    sps = steps / seconds
    return {
        "bench": "step", "mode": mode, "preset": preset_name, "n_envs": n_envs, "steps": steps,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "batch_size": trainer.agent_cfg.batch_size, "encoder": trainer.agent_cfg.encoder,
        "scan": trainer.agent_cfg.scan, "mirror_augment": trainer.agent_cfg.mirror_augment,
        "compile": compile, "overlap": step.side.stream is not None,
        "act_sms": step.side.sms,
        "window_rows": window_rows,
        "act_by_row_table": step.table_rows is not None,
        "steps_per_s": sps, "transitions_per_s": sps * n_envs, "ms_per_step": 1e3 / sps,
        "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
        "flops_per_step": flops, "model_tflops": flops * sps / 1e12, "mean_loss": losses[-1],
        "torch": torch.__version__,
    }


def profile_step(n_envs: int, device: str, preset_name: str = "h100", steps: int = 5,
                 window_rows: int = DEFAULT_WINDOW_ROWS, agent: dict | None = None, compile: str = "none",
                 graph: bool = False, loop: dict | None = None) -> dict:
    """Where a full step spends device time, from torch.profiler over `steps` steps: kernels per step, their
    summed duration, the span from the first kernel's start to the last one's end (summed / span = how busy
    the device is), and the top kernels. Eager steps also split kernels by labelled region of `TrainStep`
    (trainer.loop.step.REGIONS); `graph=True` profiles replays of the captured step instead (no regions).
    On CPU, leaf aten ops and their own CPU time stand in for kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from trainer.loop.step import REGIONS, GraphedStep

    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    if graph and not on_cuda:
        raise ValueError("profiling the graph needs --device cuda")
    torch.manual_seed(0)
    trainer = _bench_trainer(preset_name, n_envs, device, 0, window_rows, agent, compile, loop=loop,
                             mode="graph" if graph else "eager")
    step = trainer.step_fn
    run = GraphedStep(step) if graph else step
    run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            run()
        if on_cuda:
            torch.cuda.synchronize(dev)  # host sync: end of the profiled region only
    events = prof.events()
    if on_cuda:
        # Device-side events are kernels, plus mirrors of user ranges (step.*, Optimizer.step#...) that share a
        # CPU event's name: those are ranges, not work.
        ranges = {e.name for e in events if e.device_type == DeviceType.CPU}
        launched = [e for e in events if e.device_type == DeviceType.CUDA and e.name not in ranges
                    and not e.name.startswith(("Memcpy", "Memset"))]
    else:
        launched = [e for e in events if not e.cpu_children and e.name.startswith("aten::")]
    kernels: dict[str, list[float]] = {}
    for e in launched:
        kernels.setdefault(e.name, []).append(e.time_range.elapsed_us() if on_cuda else e.self_cpu_time_total)
    total_kernels = sum(len(v) for v in kernels.values())
    total_us = sum(sum(v) for v in kernels.values())
    span_us = (max(e.time_range.end for e in launched) - min(e.time_range.start for e in launched)
               if on_cuda and launched else None)

    regions = {name: {"kernels": 0, "device_us": 0.0} for name in REGIONS}

    def walk(event, region: str | None) -> None:
        name = event.name
        if name.startswith("step.") and name[5:] in regions:
            region = name[5:]
        if region is not None:
            if on_cuda:
                mine = [k.duration for k in event.kernels]
            elif not event.cpu_children and name.startswith("aten::"):
                mine = [event.self_cpu_time_total]
            else:
                mine = []
            regions[region]["kernels"] += len(mine)
            regions[region]["device_us"] += sum(mine)
        for child in event.cpu_children:
            walk(child, region)

    if not graph:
        for event in events:
            if event.cpu_parent is None and event.device_type == DeviceType.CPU:
                walk(event, None)
        # Kernels outside every labelled range: on CUDA, the backward pass (autograd runs it on its own thread).
        regions["unlabelled"] = {"kernels": total_kernels - sum(v["kernels"] for v in regions.values()),
                                 "device_us": total_us - sum(v["device_us"] for v in regions.values())}
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:25]
    return {
        "bench": "profile", "preset": preset_name, "n_envs": n_envs, "compile": compile,
        "overlap": step.side.stream is not None, "act_sms": step.side.sms,
        "steps": steps,
        "mode": "graph" if graph else "eager",
        "kernels_per_step": total_kernels / steps,
        "device_us_per_step": total_us / steps,
        "span_us_per_step": span_us / steps if span_us is not None else None,
        "regions": {} if graph else {k: {"kernels": v["kernels"] / steps, "device_us": v["device_us"] / steps}
                                     for k, v in regions.items()},
        "top_kernels": [{"name": name[:90], "calls_per_step": len(d) / steps, "us_per_step": sum(d) / steps}
                        for name, d in top],
    }


PIECES = ("step", "learner", "act_and_store", "sample", "loss_gradient", "apply")
"""Pieces of one training step that `time_pieces` times alone: the whole step; the learner's chain without acting
(sample → loss → gradient → AdamW etc. → priorities); acting + simulator + store; the prioritised sample with its
windows; the loss and its backward on one fixed batch (the three forwards and the gradient); and the update after
the gradient (clip, AdamW, Polyak, statistics)."""


def time_pieces(n_envs: int, steps: int, device: str, preset_name: str = "h100", mode: str = "eager",
                window_rows: int = DEFAULT_WINDOW_ROWS, agent: dict | None = None, compile: str = "none",
                loop: dict | None = None) -> dict:
    """Milliseconds per call of each of `PIECES`, each timed alone over `steps` calls. With mode='graph' (CUDA) each
    piece is captured as its own CUDA graph the way `GraphedStep` captures the step (`capture_graph`), and timed
    by CUDA events around its replays: what the device spends on that piece with no other piece beside it, without
    a profiler's per-kernel overhead. With mode='eager' (any device) the pieces run eagerly, timed by the host clock.

    A piece's time alone minus its share of the step says how much the others hide it; the learner's chain alone
    bounds the step from below however well acting overlaps it (docs/BENCHMARKS.md, "Pieces of the step")."""
    from trainer.agent.replay import Transitions
    from trainer.loop.step import capture_graph

    dev = torch.device(device)
    if mode not in ("eager", "graph"):
        raise ValueError(f"mode must be eager or graph, got {mode!r}")
    if mode == "graph" and dev.type != "cuda":
        raise ValueError("graph mode needs --device cuda")
    torch.manual_seed(0)
    trainer = _bench_trainer(preset_name, n_envs, device, 0, window_rows, agent, compile, loop=loop, mode=mode)
    step = trainer.step_fn
    learner = step.learner
    _, sampled = step.kernels.sample()
    batch = Transitions(*(t.clone() for t in sampled))  # the loss_gradient piece's fixed batch (static for a graph)
    grads = learner.backward(batch)  # what the apply piece applies, again and again

    def learner_chain() -> None:
        idx, b = step.kernels.sample()
        step.kernels.priorities(idx, learner.update(b))

    pieces = {"step": step, "learner": learner_chain, "act_and_store": step.act_and_store,
              "sample": step.kernels.sample,
              "loss_gradient": lambda: learner.backward(batch), "apply": lambda: learner.apply(grads)}
    ms = {}
    for name in PIECES:
        fn = pieces[name]
        for _ in range(2):
            fn()  # warm: compiles a piece called alone for the first time, settles the allocator
        if mode == "graph":
            graph = capture_graph(fn, dev)
            for _ in range(5):
                graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                graph.replay()
            end.record()
            torch.cuda.synchronize(dev)  # host sync: end of the timed region only
            ms[name] = start.elapsed_time(end) / steps
        else:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # host sync: end of the timed region only
            ms[name] = (time.perf_counter() - t0) * 1e3 / steps
    return {"bench": "pieces", "mode": mode, "preset": preset_name, "n_envs": n_envs, "steps": steps,
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "compile": compile,
            "overlap": step.side.stream is not None, "act_sms": step.side.sms, "ms": ms, "torch": torch.__version__}


def print_pieces(r: dict) -> None:
    print(f"pieces of a step: preset {r['preset']}, n_envs {r['n_envs']:,}, compile {r['compile']}, "
          f"overlap {r['overlap']}, acting SMs {r['act_sms'] or 'all'}, {r['mode']}, {r['steps']} calls each")
    print("| piece | ms per call |")
    print("|---|---:|")
    for name, value in r["ms"].items():
        print(f"| {name} | {value:.3f} |")


def print_profile(r: dict) -> None:
    print(f"profile: preset {r['preset']}, n_envs {r['n_envs']:,}, compile {r['compile']}, overlap {r['overlap']}, "
          f"{r['steps']} {r['mode']} steps")
    span = f", first-to-last kernel span {r['span_us_per_step']:.0f} us" if r["span_us_per_step"] else ""
    print(f"kernels per step {r['kernels_per_step']:.0f}, summed kernel time per step {r['device_us_per_step']:.0f} us"
          + span)
    if r["regions"]:
        print("| region | kernels/step | kernel us/step |")
        print("|---|---:|---:|")
        for name, v in r["regions"].items():
            print(f"| {name} | {v['kernels']:.0f} | {v['device_us']:.0f} |")
    print("| kernel | calls/step | us/step |")
    print("|---|---:|---:|")
    for k in r["top_kernels"]:
        print(f"| {k['name']} | {k['calls_per_step']:.1f} | {k['us_per_step']:.1f} |")


def sweep(device: str, n_envs_list: list[int], steps: int, preset_name: str, window_rows: int = DEFAULT_WINDOW_ROWS,
          agent: dict | None = None, compile: str = "none", loop: dict | None = None) -> list[dict]:
    dev = torch.device(device)
    ceiling = tf32_ceiling_tflops(dev) if dev.type == "cuda" else None
    rows = []
    for n in n_envs_list:
        for mode in (("eager", "graph") if dev.type == "cuda" else ("eager",)):
            r = run_step_bench(n, steps if mode == "graph" else max(steps // 4, 20), device, mode, preset_name,
                               window_rows=window_rows, agent=agent, compile=compile, loop=loop)
            r["tf32_ceiling_tflops"] = ceiling
            rows.append(r)
            print(json.dumps(r), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print("| n_envs | mode | steps/s | transitions/s | ms/step | peak GiB | model TFLOP/s | % of TF32 ceiling |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peak = f"{r['peak_mem_gib']:.2f}" if r.get("peak_mem_gib") is not None else "-"
        ceil = r.get("tf32_ceiling_tflops")
        share = f"{100 * r['model_tflops'] / ceil:.2f}%" if ceil else "-"
        print(f"| {r['n_envs']:,} | {r['mode']} | {r['steps_per_s']:,.1f} | {r['transitions_per_s']:,.0f} | "
              f"{r['ms_per_step']:.3f} | {peak} | {r['model_tflops']:.3f} | {share} |")
    if rows and rows[0].get("tf32_ceiling_tflops"):
        print(f"TF32 matmul ceiling measured in this run: {rows[0]['tf32_ceiling_tflops']:.1f} TFLOP/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sim-only", action="store_true", help="benchmark the simulator step alone")
    parser.add_argument("--n-envs", type=int, help="environments stepped in lock-step (default: the preset's sim.n_envs)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps (after warm-up)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--no-cuda-graph", action="store_true", help="on CUDA, launch the step eagerly")
    parser.add_argument("--compile", nargs="?", const="all", default="none", choices=COMPILE_CHOICES,
                        help="torch.compile (compile time not timed): sim-only, any value compiles the simulator "
                             "step; full step, 'sim', 'all' (also the Q-network) or 'autotune' (all, GEMMs picked "
                             "by timing on CUDA) as LoopConfig.compile")
    parser.add_argument("--no-overlap", action="store_true",
                        help="full step: run everything on one CUDA stream (LoopConfig.overlap=False; same values)")
    parser.add_argument("--act-sm-share", type=float,
                        help="full step: share of the SMs acting may use beside the learner (LoopConfig.act_sm_share; "
                             "1 = all; same values)")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    parser.add_argument("--mode", choices=("eager", "graph", "both"), default="both",
                        help="full step: eager, CUDA graph, or both side by side (graph needs CUDA)")
    parser.add_argument("--preset", default="h100", choices=PRESET_NAMES,
                        help="model, replay and env count of the benchmark (trainer/settings.py)")
    parser.add_argument("--profile", action="store_true",
                        help="full step: kernels and device time per step region (torch.profiler); with --mode graph, "
                             "of graph replays")
    parser.add_argument("--pieces", action="store_true",
                        help="time each piece of a step alone (graph replays on CUDA with --mode graph or both)")
    parser.add_argument("--sweep", action="store_true", help="full step over --n-envs-list, eager and graph")
    parser.add_argument("--n-envs-list", default="256,1024,4096,16384", help="n_envs values for --sweep")
    parser.add_argument("--window-rows", type=int, default=DEFAULT_WINDOW_ROWS,
                        help="full step: rows of the training window (acting encodes min(n_envs, rows) windows)")
    parser.add_argument("--encoder", choices=ENCODERS, help="full step: override the preset's encoder")
    parser.add_argument("--scan", choices=SCANS, help="full step: Mamba selective-scan variant")
    parser.add_argument("--mirror-augment", action=argparse.BooleanOptionalAction, default=None,
                        help="full step: override the preset's agent.mirror_augment (train on the reflected market "
                             "too: one gather from a table of both markets)")
    args = parser.parse_args(argv)
    if args.n_envs is None:
        args.n_envs = preset(args.preset).sim.n_envs
    agent = {k: v for k, v in {"encoder": args.encoder, "scan": args.scan}.items() if v}
    if args.mirror_augment is not None:
        agent["mirror_augment"] = args.mirror_augment
    loop = {"overlap": not args.no_overlap}
    if args.act_sm_share is not None:
        loop["act_sm_share"] = args.act_sm_share
    try:
        if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
            raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
        if args.profile:
            r = profile_step(args.n_envs, args.device, args.preset, window_rows=args.window_rows, agent=agent,
                             compile=args.compile, graph=args.mode == "graph", loop=loop)
            print(json.dumps(r)) if args.json else print_profile(r)
            return 0
        if args.pieces:
            on_cuda = torch.device(args.device).type == "cuda"
            mode = args.mode if args.mode != "both" else ("graph" if on_cuda else "eager")
            r = time_pieces(args.n_envs, args.steps, args.device, args.preset, mode, args.window_rows, agent,
                            args.compile, loop=loop)
            print(json.dumps(r)) if args.json else print_pieces(r)
            return 0
        if args.sweep:
            rows = sweep(args.device, [int(x) for x in args.n_envs_list.split(",")], args.steps, args.preset,
                         args.window_rows, agent, args.compile, loop=loop)
            print_table(rows)
            return 0
        if not args.sim_only:
            modes = ("eager", "graph") if args.mode == "both" else (args.mode,)
            if args.mode == "both" and torch.device(args.device).type != "cuda":
                modes = ("eager",)  # side by side needs CUDA; an explicit --mode graph on CPU is refused (exit 2)
            rows = [run_step_bench(args.n_envs, args.steps, args.device, m, args.preset, window_rows=args.window_rows,
                                   agent=agent, compile=args.compile, loop=loop) for m in modes]
            if args.json:
                for r in rows:
                    print(json.dumps(r))
            else:
                print_table(rows)
            return 0
        result = run_sim_bench(args.n_envs, args.steps, args.device, cuda_graph=not args.no_cuda_graph,
                               compile=args.compile != "none")
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
