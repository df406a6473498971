"""The training step: sample a batch → act on all envs and store → one gradient step, over explicit state.

Everything here stays on the device. The same `TrainStep.__call__` runs eagerly or is captured once as a CUDA
graph and replayed (`GraphedStep`); host syncs happen only in `read_metrics`, at log intervals.

Order within a step, and what runs concurrently in graph mode on CUDA (trainer/streams.py):

    main:    sample ─┬─┬─┬─► online fwd at x ─┬─► loss ─► backward ──┬─► clip, AdamW ─► priorities
    learner:         │ │ └─► online fwd at x' ┤                      │
    learner:         │ └───► target fwd at x' ┘                      │
    acting:          └───► act ─► sim ─► store, replay add ──────────┘   (on half of the SMs, see below)

The batch is sampled before this step's transitions are added (they can be drawn from the next step on), so acting
and storing depend on nothing the learner computes before AdamW changes the weights. The learner's chain of small
kernels is the step's critical path (docs/BENCHMARKS.md v6 measures each part of this), so its streams have high
priority, and acting runs on a low-priority stream confined to `LoopConfig.act_sm_share` of the SMs (a CUDA green
context) while it is the smaller of the two (`acting_sm_share`): given the whole device, acting's large kernels
hold SMs that the learner's next kernel waits for (v9). Acting larger than the learner gets every SM.
The values do not depend on the overlap (`LoopConfig.overlap`): the host issues the same calls, random draws
included, in the same order either way. Eager steps run everything on one stream.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.agent.act import select_actions
from trainer.agent.learner import Batch, Learner
from trainer.agent.replay import NStepAccumulator, PrioritizedReplay
from trainer.sim import Simulator
from trainer.streams import HIGH_PRIORITY, LOW_PRIORITY, SideStream


REGIONS = ("act", "sim", "store", "sample", "update", "priorities")
"""Labelled parts of one step (torch.profiler ranges, read by `python -m trainer.bench --profile`)."""


def _region(name: str) -> torch.autograd.profiler.record_function:
    # A profiler range: a few hundred ns of host work when no profiler is active, nothing on the device.
    return torch.autograd.profiler.record_function(f"step.{name}")


def gather_windows(features: torch.Tensor, rows: torch.Tensor, window: int) -> torch.Tensor:
    """Observation windows by row index: features[rows - W + 1 : rows + 1] for every row.

    features (T, F) float32 on the device; rows (B,) int64 → (B, W, F). Rows are never below W - 1 (the simulator
    places envs at least `window` rows into their window), so no clamping hides a bug.
    """
    offsets = torch.arange(window - 1, -1, -1, device=rows.device)  # (W,) newest last
    return features[rows[:, None] - offsets[None, :]]  # (B, W, F)


@dataclass
class StepMetrics:
    """Device-side running sums over the current log interval (read at log time only)."""

    sums: torch.Tensor  # (len(NAMES),) float32
    count: torch.Tensor  # () float32

    NAMES = ("loss", "q_mean", "grad_norm", "lr", "clip", "tau", "reward")

    @classmethod
    def zeros(cls, device: torch.device) -> "StepMetrics":
        return cls(torch.zeros(len(cls.NAMES), device=device), torch.zeros((), device=device))

    def reset(self) -> None:
        self.sums.zero_()
        self.count.zero_()


ACT_CONFINED_MAX_WINDOWS_PER_ITEM = 4
"""Acting is confined to a share of the SMs only while its forward encodes at most this many windows per item of
the learner's batch; the learner passes over each item four times (online forward at x, two forwards at x', the
backward). On an H200 at the h100 preset (batch 256; docs/BENCHMARKS.md v9), acting on 64 of 132 SMs made the
step faster at 256 and 1,024 windows (0.991 against 1.006 ms, 1.073 against 1.128) and slower at 2,569 (the row
table at 4,096 and 16,384 envs: 2.39 against 2.16 ms, 2.25 against 1.72), where acting alone outlasts the
learner's chain (1.1–1.4 against 0.93 ms) and is the step's critical path itself."""


def compile_options(compile: str, device: torch.device) -> dict[str, bool] | None:
    """Inductor options for `LoopConfig.compile`: with 'autotune' on CUDA, max_autotune (matrix products as Triton
    templates with fused epilogues, each picked by timing candidates on the device); else None (the defaults)."""
    return {"max_autotune": True} if compile == "autotune" and device.type == "cuda" else None


def acting_sm_share(share: float, act_windows: int, batch_size: int) -> float:
    """The SM share acting runs in: `share` while acting encodes at most ACT_CONFINED_MAX_WINDOWS_PER_ITEM windows
    per batch item, else 1 (every SM)."""
    return share if act_windows <= ACT_CONFINED_MAX_WINDOWS_PER_ITEM * batch_size else 1.0


class TrainStep:
    """Closure over the fold's persistent state; `act_and_store()` before learning starts, `__call__()` after."""

    def __init__(self, features: torch.Tensor, sim: Simulator, state, learner: Learner, nstep: NStepAccumulator,
                 replay: PrioritizedReplay, window: int, batch_size: int, dir_counts: torch.Tensor,
                 row_range: tuple[int, int] | None = None, compile: str = "none", overlap: bool = True,
                 act_sm_share: float = 1.0):
        self.features, self.sim, self.state = features, sim, state
        # torch.compile (LoopConfig.compile): inductor fuses the simulator's elementwise chain and, with 'all' or
        # 'autotune' (the same pieces, GEMM kernels picked by timing: `compile_options`), the acting path, storing,
        # sampling and the learner's tensor-only pieces. Compiled on the first eager step, so a graph capture
        # afterwards records the compiled kernels.
        compiled = functools.partial(torch.compile, dynamic=False, options=compile_options(compile, features.device))
        self.sim_step = compiled(sim.step) if compile != "none" else sim.step
        if compile != "none":
            # Random draws (Thompson sampling) through ATen's generator, as eager makes them: the same seed gives
            # the same actions compiled or not (inductor's own RNG would draw other numbers).
            torch._inductor.config.fallback_random = True
        if compile in ("all", "autotune"):
            # Instance attributes wrapping bound methods: state_dict and the checkpoint layout are unchanged.
            self._act = compiled(self._act)
            self._store = compiled(self._store)
            self._sample = compiled(self._sample)
            self._priorities = compiled(self._priorities)
            learner.compile(compiled)
        # Acting by row table: the encoder reads only the feature window, a function of the decision row, so when
        # the window has fewer usable rows than there are envs, encoding each row once and gathering by cursor
        # does less work than encoding every env's window (same values; a shape-static choice made here).
        self.table_rows = None
        if row_range is not None and row_range[1] - row_range[0] < state.cursor.shape[0]:
            self.table_rows = torch.arange(row_range[0], row_range[1], device=features.device)  # (R,)
        # Acting runs on a side stream while the learner computes, at low priority, and confined to `act_sm_share`
        # of the SMs while it is the smaller of the two (`acting_sm_share`).
        act_windows = state.cursor.shape[0] if self.table_rows is None else self.table_rows.shape[0]
        self.side = SideStream(features.device, enabled=overlap, priority=LOW_PRIORITY,
                               sm_share=acting_sm_share(act_sm_share, act_windows, batch_size))
        self.learner, self.nstep, self.replay = learner, nstep, replay
        self.window, self.batch_size = window, batch_size
        self.metrics = StepMetrics.zeros(features.device)
        self.dir_counts = dir_counts  # (4,) float32 direction choices this interval (training entropy)

    def act_and_store(self) -> None:
        with _region("act"):
            row, env_state, actions = self._act()
        with _region("sim"):
            out = self.sim_step(self.state, actions)
        with _region("store"):
            self._store(row, env_state, actions, out.reward, out.done, out.truncated)

    def _store(self, row: torch.Tensor, env_state: torch.Tensor, actions: torch.Tensor, reward: torch.Tensor,
               done: torch.Tensor, truncated: torch.Tensor) -> None:
        """n-step accumulate the step just taken and add the matured transitions to the replay."""
        state = self.state
        next_env_state = self.sim.env_features(state)
        transitions, valid = self.nstep.push(row, env_state, actions, reward, done, self.sim.obs_rows(state),
                                             next_env_state, reset=truncated)
        self.replay.add(transitions, valid)
        self.dir_counts += torch.nn.functional.one_hot(actions[:, 0], 4).sum(0)
        self.metrics.sums[6] += reward.mean()

    def _act(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decision rows (n_envs,) observed now, the env state (n_envs, S) the agent sees, and the actions
        (n_envs, n_branches) int64 from the online net, Thompson-sampled on every branch. The env features are
        computed here so that, compiled, their two dozen elementwise ops fuse with the rest of acting."""
        row = self.sim.obs_rows(self.state)  # (n_envs,) cursor - feed latency: the market the agent has seen
        env_state = self.sim.env_features(self.state)
        if self.table_rows is None:
            obs = gather_windows(self.features, row, self.window)  # (n_envs, W, F)
            return row, env_state, self.learner.act(obs, env_state, explore=True)
        net = self.learner.online
        with torch.no_grad():
            z_table = net.encoder(gather_windows(self.features, self.table_rows, self.window))  # (R, d_model)
            z = z_table.index_select(0, row - self.table_rows[0])  # (n_envs, d_model)
            logits = net.head(z, env_state)  # (n_envs, n_branches, A_max, n_atoms)
            return row, env_state, select_actions(logits, net.support, net.action_mask, explore=True)

    def __call__(self) -> None:
        """One training step (see the module docstring for the order and the overlap)."""
        with _region("sample"):
            idx, batch = self._sample()
        with self.side.fork():
            self.act_and_store()  # reads the online weights; AdamW below waits for it (join)
        with _region("update"):
            grads = self.learner.backward(batch)
            self.side.join()
            out = self.learner.apply(grads)
        with _region("priorities"):
            self._priorities(idx, out)

    def _sample(self) -> tuple[torch.Tensor, Batch]:
        """A prioritised batch with its observation windows gathered: replay indices (B,) and the learner's Batch."""
        idx, batch, weights = self.replay.sample(self.batch_size)
        obs = gather_windows(self.features, batch.row, self.window)  # (B, W, F)
        next_obs = gather_windows(self.features, batch.next_row, self.window)
        return idx, Batch(obs, batch.env_state, batch.action.long(), batch.return_n, batch.discount_n, next_obs,
                          batch.next_env_state, weights)

    def _priorities(self, idx: torch.Tensor, out: dict[str, torch.Tensor]) -> None:
        """New priorities for the sampled items; the update's statistics into the interval sums."""
        self.replay.update_priorities(idx, out["priorities"])
        self.metrics.sums[:6] += torch.stack([out[k] for k in StepMetrics.NAMES[:6]]).float()
        self.metrics.count += 1


def capture_graph(fn: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
    """`fn()` captured once as a CUDA graph (not run), on a high-priority stream: the learner's kernels (this stream
    and its side streams) are then scheduled ahead of acting's (trainer/streams.py)."""
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream(device, priority=HIGH_PRIORITY)):
        fn()
    return graph


class GraphedStep:
    """The whole TrainStep captured once as a CUDA graph and replayed (static buffers, graph-safe RNG)."""

    def __init__(self, step: TrainStep):
        """Capture only: the caller has already run a few eager steps (lazy inits), and no step runs here,
        so eager and graph runs consume the same sequence of steps."""
        if step.features.device.type != "cuda":
            raise ValueError("graph mode needs a CUDA device; use mode=eager on CPU")
        self.step = step
        self.graph = capture_graph(step, step.features.device)

    def __call__(self) -> None:
        self.graph.replay()
