"""The training step: sample a batch → act on all envs and store → one gradient step, over explicit state.

Everything here stays on the device. The same `TrainStep.__call__` runs eagerly or is captured once as a CUDA
graph and replayed (`GraphedStep`); host syncs happen only when the loop reads `StepMetrics`, at log intervals.

`TrainStep.__call__` reads top to bottom; what each line calls, and where it lives:

    1. sample    `_sample`: PrioritizedReplay.sample (agent/replay.py), `gather_windows` → Transitions with obs
    2. act       `act_and_store`: `_act` (agent/act.py select_actions), Simulator.step (sim/), `_store`
                 (NStepAccumulator.push, PrioritizedReplay.add)
    3. update    Learner.backward (agent/learner.py, steps 1-4: target, loss, gradient), then Learner.apply
                 (steps 5-8: clip, AdamW, Polyak, statistics)
    4. priorities `_priorities`: PrioritizedReplay.update_priorities, `StepMetrics.add_update`

Order within a step, and what runs concurrently in graph mode on CUDA (trainer/streams.py):

    main:    sample ─┬─┬─┬─► online fwd at x ─┬─► loss ─► backward ──┬─► clip, AdamW ─► priorities
    learner:         │ │ └─► online fwd at x' ┤                      │
    learner:         │ └───► target fwd at x' ┘                      │
    acting:          └───► act ─► sim ─► store, replay add ──────────┘   (on half of the SMs, see below)

The batch is sampled before this step's transitions are added (they can be drawn from the next step on), so acting
and storing depend on nothing the learner computes before AdamW changes the weights. The learner's chain of small
kernels is the step's critical path (docs/BENCHMARKS.md, "Pieces of the step"), so its streams have high
priority, and acting runs on a low-priority stream confined to `LoopConfig.act_sm_share` of the SMs (a CUDA green
context) while it is the smaller of the two (`acting_sm_share`): given the whole device, acting's large kernels
hold SMs that the learner's next kernel waits for ("Acting on part of the SMs"). Acting larger than the learner
gets every SM.
The values do not depend on the overlap (`LoopConfig.overlap`): the host issues the same calls, random draws
included, in the same order either way. Eager steps run everything on one stream.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from trainer.agent.act import mirror_actions, select_actions
from trainer.agent.learner import Learner
from trainer.agent.replay import NStepAccumulator, PrioritizedReplay, Transitions
from trainer.sim import ENV_REFLECTION, Simulator
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


UPDATE_METRICS = ("loss", "q_mean", "grad_norm", "lr", "clip", "tau")
"""The learner's statistics (`Learner.apply`), summed once per gradient step."""
METRICS = UPDATE_METRICS + ("reward",)
"""Every slot of `StepMetrics.sums`, in order; "reward" is the mean over envs, summed once per env step."""
SLOT = {name: i for i, name in enumerate(METRICS)}
"""Slot of each metric in `StepMetrics.sums` (Python ints: indexing with them is fixed at capture, no host sync)."""


@dataclass
class StepMetrics:
    """Device-side running sums over the current log interval (read at log time only)."""

    sums: torch.Tensor  # (len(METRICS),) float32, slots named by SLOT
    count: torch.Tensor  # () float32 gradient steps in the interval

    NAMES = METRICS

    @classmethod
    def zeros(cls, device: torch.device) -> "StepMetrics":
        return cls(torch.zeros(len(METRICS), device=device), torch.zeros((), device=device))

    def reset(self) -> None:
        self.sums.zero_()
        self.count.zero_()

    def add_update(self, stats: dict[str, torch.Tensor]) -> None:
        """One gradient step's statistics into their slots, the first len(UPDATE_METRICS) (one stack, one add)."""
        self.sums[:len(UPDATE_METRICS)] += torch.stack([stats[k] for k in UPDATE_METRICS]).float()
        self.count += 1

    def add_reward(self, reward: torch.Tensor) -> None:
        """One env step's rewards (n_envs,), as their mean."""
        self.sums[SLOT["reward"]] += reward.mean()

    def mean(self, name: str) -> torch.Tensor:
        """sums / max(count, 1) of one metric, as the log line reports it; 0-dim on the device (no sync)."""
        return self.sums[SLOT[name]] / self.count.clamp(min=1)


ACT_CONFINED_MAX_WINDOWS_PER_ITEM = 4
"""Acting is confined to a share of the SMs only while its forward encodes at most this many windows per item of
the learner's batch; the learner passes over each item four times (online forward at x, two forwards at x', the
backward). Measured on an H200 at the h100 preset (batch 256; docs/BENCHMARKS.md, "Acting on part of the SMs"):
confining acting made the step faster at 256 and 1,024 windows and slower at the 2,569-row table of 4,096 and
16,384 envs, where acting alone outlasts the learner's chain and is the step's critical path itself."""


def compile_options(compile: str, device: torch.device) -> dict[str, bool] | None:
    """Inductor options for `LoopConfig.compile`: with 'autotune' on CUDA, max_autotune (matrix products as Triton
    templates with fused epilogues, each picked by timing candidates on the device); else None (the defaults)."""
    return {"max_autotune": True} if compile == "autotune" and device.type == "cuda" else None


def acting_sm_share(share: float, act_windows: int, batch_size: int) -> float:
    """The SM share acting runs in: `share` while acting encodes at most ACT_CONFINED_MAX_WINDOWS_PER_ITEM windows
    per batch item, else 1 (every SM)."""
    return share if act_windows <= ACT_CONFINED_MAX_WINDOWS_PER_ITEM * batch_size else 1.0


class StepKernels(NamedTuple):
    """The pieces of the step that `LoopConfig.compile` puts through torch.compile: the simulator's step with any
    mode but 'none', the rest with 'all' or 'autotune'; eager bound methods otherwise."""
    act: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    sim_step: Callable
    store: Callable[..., None]
    sample: Callable[[], tuple[torch.Tensor, Transitions]]
    priorities: Callable[[torch.Tensor, dict[str, torch.Tensor]], None]


class TrainStep:
    """Closure over the fold's persistent state; `act_and_store()` before learning starts, `__call__()` after."""

    def __init__(self, features: torch.Tensor, sim: Simulator, state, learner: Learner, nstep: NStepAccumulator,
                 replay: PrioritizedReplay, window: int, batch_size: int, dir_counts: torch.Tensor,
                 row_range: tuple[int, int] | None = None, compile: str = "none", overlap: bool = True,
                 act_sm_share: float = 1.0, reflected: torch.Tensor | None = None):
        """`reflected` (T, F): the same inputs of the reflected market (AgentConfig.mirror_augment): the batch's
        odd items are then drawn as their reflected transitions (`_sample`); None trains on the inputs alone."""
        self.features, self.sim, self.state = features, sim, state
        self.both_markets = None
        if reflected is not None:
            if reflected.shape != features.shape:
                raise ValueError(f"reflected inputs {tuple(reflected.shape)} must match the inputs "
                                 f"{tuple(features.shape)}")
            # Both markets in one (2T, F) table, the reflected rows after the observed ones: an odd item's rows
            # shifted by T gather its reflected windows in the same single gather as the even items' (a window
            # never reaches below row W - 1, so never across the seam).
            self.both_markets = torch.cat([features, reflected])  # (2T, F)
            self.reflect_item = torch.arange(batch_size, device=features.device) % 2 == 1  # (B,) the odd items
            self.row_shift = self.reflect_item.long() * features.shape[0]  # (B,) T on the odd items, 0 on the even
            # Env-state signs per item: ENV_REFLECTION on the odd items, ones on the even (x * 1.0 is x exactly).
            signs = torch.tensor(ENV_REFLECTION, device=features.device)  # (ENV_FEATURES,)
            self.item_env_signs = torch.where(self.reflect_item[:, None], signs, torch.ones_like(signs))  # (B, S)
        # torch.compile (LoopConfig.compile): inductor fuses the simulator's elementwise chain and, with 'all' or
        # 'autotune' (the same pieces, GEMM kernels picked by timing: `compile_options`), the acting path, storing,
        # sampling and the learner's tensor-only pieces. Compiled on the first eager step, so a graph capture
        # afterwards records the compiled kernels. The methods stay as they are; `kernels` holds what runs.
        compiled = functools.partial(torch.compile, dynamic=False, options=compile_options(compile, features.device))
        self.kernels = StepKernels(self._act, sim.step, self._store, self._sample, self._priorities)
        if compile != "none":
            # Random draws (Thompson sampling) through ATen's generator, as eager makes them: the same seed gives
            # the same actions compiled or not (inductor's own RNG would draw other numbers).
            torch._inductor.config.fallback_random = True
            self.kernels = self.kernels._replace(sim_step=compiled(sim.step))
        if compile in ("all", "autotune"):
            self.kernels = StepKernels(*(fn if name == "sim_step" else compiled(fn)
                                         for name, fn in zip(StepKernels._fields, self.kernels)))
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

    def __call__(self) -> None:
        """One training step (the module docstring says what overlaps what)."""
        k = self.kernels
        # 1. A prioritised batch with its observation windows, drawn before this step's transitions are added.
        with _region("sample"):
            idx, batch = k.sample()  # (B,) replay slots; Transitions with obs, next_obs (B, W, F) and weight
        # 2. Act on every env, step the simulator, store: on the side stream, concurrent with 3 up to AdamW.
        with self.side.fork():
            self.act_and_store()
        # 3. The update: loss and gradient (weights only read), wait for acting, then clip, AdamW, Polyak.
        with _region("update"):
            loss = self.learner.backward(batch)
            self.side.join()
            stats = self.learner.apply(loss)
        # 4. New priorities for the sampled slots; the update's statistics into the interval sums.
        with _region("priorities"):
            k.priorities(idx, stats)

    def act_and_store(self) -> None:
        """Step 2 alone (also the whole step before learning starts)."""
        k = self.kernels
        with _region("act"):
            row, env_state, actions = k.act()
        with _region("sim"):
            out = k.sim_step(self.state, actions)
        with _region("store"):
            k.store(row, env_state, actions, out.reward, out.done, out.truncated)

    def _sample(self) -> tuple[torch.Tensor, Transitions]:
        """Replay slots (B,) and their transitions, with the observation windows gathered from the features."""
        idx, b = self.replay.sample(self.batch_size)
        env_state, action, next_env_state = b.env_state, b.action, b.next_env_state
        if self.both_markets is None:
            obs = gather_windows(self.features, b.row, self.window)  # (B, W, F)
            next_obs = gather_windows(self.features, b.next_row, self.window)
        else:  # AgentConfig.mirror_augment: the odd items in the reflected market
            obs = gather_windows(self.both_markets, b.row + self.row_shift, self.window)  # (B, W, F)
            next_obs = gather_windows(self.both_markets, b.next_row + self.row_shift, self.window)
            env_state, next_env_state = env_state * self.item_env_signs, next_env_state * self.item_env_signs
            action = torch.where(self.reflect_item[:, None], mirror_actions(action), action)
        # Built by the constructor, not `b._replace`: dynamo of PyTorch 2.11 cannot return a namedtuple made by
        # `_replace` from a compiled function (an AssertionError in side_effects; 2.13 can).
        return idx, Transitions(b.row, env_state, action, b.return_n, b.discount_n, b.next_row, next_env_state,
                                b.weight, obs=obs, next_obs=next_obs)

    def _act(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decision rows (n_envs,) observed now, the env state (n_envs, S) the agent sees, and the actions
        (n_envs, n_branches) int64 from the online net, Thompson-sampled on every branch. The env features are
        computed here so that, compiled, their two dozen elementwise ops fuse with the rest of acting."""
        row = self.sim.obs_rows(self.state)  # (n_envs,) cursor - feed latency: the market the agent has seen
        env_state = self.sim.env_features(self.state)
        if self.table_rows is None:
            obs = gather_windows(self.features, row, self.window)  # (n_envs, W, F)
            actions = self.learner.act(obs, env_state, explore=True)
        else:
            net = self.learner.online
            with torch.no_grad():
                z_table = net.encoder(gather_windows(self.features, self.table_rows, self.window))  # (R, d_model)
                z = z_table.index_select(0, row - self.table_rows[0])  # (n_envs, d_model)
                logits = net.head(z, env_state)  # (n_envs, n_branches, A_max, n_atoms)
                actions = select_actions(logits, net.support, net.action_mask, explore=True,
                                         noise_scale=self.learner.thompson_scale(),
                                         branch_epsilon=self.learner.cfg.branch_epsilon)
        # AgentConfig.train_min_hold_steps: exits of young trips sent as HOLD (no-op when off)
        return row, env_state, self.learner.hold_young(actions, env_state)

    def _store(self, row: torch.Tensor, env_state: torch.Tensor, actions: torch.Tensor, reward: torch.Tensor,
               done: torch.Tensor, truncated: torch.Tensor) -> None:
        """n-step accumulate the step just taken and add the matured transitions to the replay."""
        state = self.state
        next_env_state = self.sim.env_features(state)
        transitions, valid = self.nstep.push(row, env_state, actions, reward, done, self.sim.obs_rows(state),
                                             next_env_state, reset=truncated)
        self.replay.add(transitions, valid)
        self.dir_counts += torch.nn.functional.one_hot(actions[:, 0], 4).sum(0)
        self.metrics.add_reward(reward)

    def _priorities(self, idx: torch.Tensor, stats: dict[str, torch.Tensor]) -> None:
        """New priorities for the sampled slots; the update's statistics into the interval sums."""
        self.replay.update_priorities(idx, stats["priorities"])
        self.metrics.add_update(stats)


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
