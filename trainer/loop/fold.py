"""One fold's training: build the device state, run act → store → learn, log, checkpoint, resume.

`FoldTrainer` owns every piece of state the fold needs to continue exactly (networks, optimiser, controllers,
replay, n-step rings, simulator, counters, RNG). The checkpoint stage (which comes after this one) persists what
`state_dict()` returns through the `Checkpointer` protocol passed to `run()`; this module never touches files.
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from trainer.agent.act import held_margin, min_hold
from trainer.agent.aux import mid_change_target
from trainer.agent.config import AgentConfig
from trainer.agent.forecast import FORECAST_COLUMN, append_forecast
from trainer.agent.learner import Learner
from trainer.agent.network import QNetwork
from trainer.agent.replay import NStepAccumulator, PrioritizedReplay, effective_capacity
from trainer.features.compute import Normaliser, reflection_signs
from trainer.features.decision import DecisionTape
from trainer.loop.config import TrainConfig
from trainer.loop.exposure import ExposureController
from trainer.loop.log import JsonLog, eta_text
from trainer.loop.select import Selector, split_validation
from trainer.loop.step import GraphedStep, StepMetrics, TrainStep
from trainer.sim import ENV_FEATURES, ENV_REFLECTION, FLAT, MARKET, Simulator


class Checkpointer(Protocol):
    def save(self, trainer: "FoldTrainer", final: bool = False) -> None: ...


class Stopped(Exception):
    """SIGTERM/SIGINT arrived; a checkpoint was written; the process should exit 143."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"LoopConfig.device={name!r} but no CUDA device is available")
    return device


def configure_torch(cfg: TrainConfig) -> None:
    """TF32 on for matmuls and convolutions; determinism when asked (before any CUDA work)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    if cfg.loop.deterministic:
        # cuBLAS is only reproducible with a fixed workspace split; it reads this when it first initialises.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)
        # torch.compile'd code: inductor then emits no atomics (scatter/index_put fall back to deterministic ATen)
        # and picks kernels without timing them on the device, so a restarted process compiles the same code.
        torch._inductor.config.deterministic = True


def agent_config_for(cfg: TrainConfig, n_features: int) -> AgentConfig:
    """The agent config with the data-dependent widths filled in."""
    return dataclasses.replace(cfg.agent, n_features=n_features, env_state_dim=ENV_FEATURES)


@dataclass
class Window:
    start: int
    stop: int


def fold_inputs(cfg: TrainConfig, raw: np.ndarray, names: list[str], tape: DecisionTape,
                train: Window) -> tuple[np.ndarray, list[str], np.ndarray | None]:
    """The fold's input columns, their names, and the same columns of the reflected market (None unless
    AgentConfig.mirror): the raw features normalised on the training window (no look-ahead); plus the per-fold
    forecast column when AgentConfig.forecast_lags > 0, fitted on the rows the agent trains on (the selection slice
    held out, trainer/agent/forecast.py). The reflected columns are the raw features times their reflection signs,
    through the same normaliser."""
    normaliser = Normaliser.fit(raw[train.start:train.stop])
    features = normaliser.apply(raw)
    a = cfg.agent
    reflected = normaliser.apply(raw * reflection_signs(names)) if a.mirror or a.mirror_augment else None
    if a.forecast_lags == 0:
        return features, list(names), reflected
    train_stop, _ = split_validation(train.start, train.stop, cfg.loop.select_frac, a.window)
    features = append_forecast(features, tape.bid_px[:, 0], tape.ask_px[:, 0], train.start, train_stop,
                               a.forecast_lags, a.forecast_horizon, a.forecast_ridge)
    return features, [*names, FORECAST_COLUMN], reflected


def mirrored_policy(learner: Learner, n_features: int, flat_margin: torch.Tensor | float = 0.0,
                    keep_frac: float = 1.0):
    """The greedy policy of AgentConfig.mirror as a `Policy` over observations of 2F columns: the fold's inputs, then
    the reflected market's (FoldTrainer.policy_features); the env state is reflected with ENV_REFLECTION. FLAT's
    score is raised by `flat_margin` (LoopConfig.max_exposure), by `keep_frac` of it where a position is held
    (LoopConfig.keep_margin_frac, trainer.agent.act.held_margin)."""
    signs = torch.tensor(ENV_REFLECTION, device=learner.device)  # (ENV_FEATURES,)

    def policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        return learner.act_mirrored(obs[..., :n_features], env_state, obs[..., n_features:], env_state * signs,
                                    held_margin(flat_margin, env_state, keep_frac))

    return policy


def direction_entropy(counts: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the direction-choice frequencies; log(4) = 1.386 is uniform."""
    p = counts / counts.sum().clamp(min=1)
    return -(p * torch.log(p.clamp(min=1e-12))).sum()


class FoldTrainer:
    GRAPH_WARMUP_UPDATES = 3
    """Eager gradient steps before graph capture (cuBLAS handles, optimizer state, allocator warm-up)."""

    def __init__(self, cfg: TrainConfig, features: np.ndarray, tape: DecisionTape, train: Window, fold: int,
                 log: JsonLog | None = None, reflected: np.ndarray | None = None):
        self.cfg, self.fold = cfg, fold
        self.log = log or JsonLog(fold)
        self.device = resolve_device(cfg.loop.device)
        configure_torch(cfg)
        torch.manual_seed(cfg.loop.seed)
        np.random.seed(cfg.loop.seed)
        random.seed(cfg.loop.seed)  # checkpointed with the others: seeded, two fresh runs write equal files
        self.agent_cfg = agent_config_for(cfg, int(features.shape[1]))
        W = self.agent_cfg.window
        dev = self.device
        lc = cfg.loop
        self.features = torch.as_tensor(features, dtype=torch.float32, device=dev)  # (T, F) normalised
        a = self.agent_cfg
        if (a.mirror or a.mirror_augment) != (reflected is not None):
            raise ValueError(f"AgentConfig.mirror={a.mirror}, mirror_augment={a.mirror_augment}: the reflected "
                             f"inputs are needed exactly when either is on (trainer.loop.fold.fold_inputs gives them)")
        reflected_t = None if reflected is None else torch.as_tensor(reflected, dtype=torch.float32, device=dev)
        # (T, 2F) with mirror: the inputs, then the reflected market's; what the deployed policy reads
        # (self.deployed_policy)
        self.policy_features = self.features if not a.mirror else torch.cat([self.features, reflected_t], dim=1)
        # Model selection holds out the window's last rows: training acts on [train.start, train_stop) only.
        train_stop, val_start = split_validation(train.start, train.stop, lc.select_frac, W)
        self.sim = Simulator(tape, cfg.sim, dev)
        self.state = self.sim.reset(train.start, train_stop, min_history=W - 1)
        self.mode = lc.mode if lc.mode != "auto" else (
            "graph" if dev.type == "cuda" and not lc.deterministic else "eager")
        # Side streams pay off in a captured graph only: an eager step is host-bound, and they cost it host time.
        overlap = lc.overlap and self.mode == "graph" and not lc.deterministic
        self.learner = Learner(QNetwork(self.agent_cfg), self.agent_cfg, dev, overlap=overlap,
                               time_scale_steps=cfg.sim.time_scale_steps)
        if self.agent_cfg.aux_weight > 0:  # the training rows' own future mid change (trainer/agent/aux.py)
            target = mid_change_target(tape.bid_px[:, 0], tape.ask_px[:, 0], train.start, train_stop,
                                       self.agent_cfg.aux_horizon)
            self.learner.aux_target = torch.as_tensor(target, device=dev)  # (T,)
        n_envs = cfg.sim.n_envs
        self.nstep = NStepAccumulator(n_envs, self.agent_cfg.n_step, self.agent_cfg.gamma, ENV_FEATURES,
                                      self.agent_cfg.n_branches, dev)
        rc = cfg.replay
        self.replay = PrioritizedReplay(effective_capacity(rc.capacity, n_envs), ENV_FEATURES,
                                        self.agent_cfg.n_branches, dev, alpha=rc.alpha, beta_start=rc.beta_start,
                                        beta_end=rc.beta_end, beta_steps=rc.beta_steps, eps=rc.eps,
                                        alpha_end=rc.alpha_end)
        self.dir_counts = torch.zeros(4, device=dev)
        self.step_fn = TrainStep(self.features, self.sim, self.state, self.learner, self.nstep, self.replay,
                                 W, self.agent_cfg.batch_size, self.dir_counts,
                                 row_range=(train.start + W - 1, train_stop), compile=cfg.loop.compile,
                                 overlap=overlap, act_sm_share=lc.act_sm_share,
                                 reflected=reflected_t if a.mirror_augment else None)
        self.selector = None if lc.select_frac <= 0 else Selector(
            self.learner, self.policy_features, tape, cfg.sim, W, val_start, train.stop, lc.select_envs,
            lc.select_min_net, lc.select_min_t, policy=self._greedy())
        self.env_step = 0  # loop iterations done (each is n_envs env steps); host-side, no sync needed
        self.update_step = 0  # gradient steps done
        self.wall_seconds = 0.0  # accumulated over attempts
        self._stop_signal: int | None = None

    # ---------------------------------------------------------------- state for checkpoints

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        counters = torch.tensor([self.env_step, self.update_step, self.fold], dtype=torch.int64)
        select = {} if self.selector is None else {"select": self.selector.state_dict()}
        return {**select,
            "learner": self.learner.state_dict(),
            "replay": self.replay.state_dict(),
            "nstep": self.nstep.state_dict(),
            "sim": self.state.state_dict(),
            "loop": {"counters": counters, "dir_counts": self.dir_counts,
                     "wall_seconds": torch.tensor(self.wall_seconds, dtype=torch.float64)},
        }

    def load_state_dict(self, sections: dict[str, dict[str, torch.Tensor]]) -> None:
        self.learner.load_state_dict(sections["learner"])
        self.replay.load_state_dict(sections["replay"])
        self.nstep.load_state_dict(sections["nstep"])
        self.state.load_state_dict(sections["sim"])
        if self.selector is not None:
            self.selector.load_state_dict(sections["select"])
        loop = sections["loop"]
        env_step, update_step, fold = (int(x) for x in loop["counters"].tolist())
        if fold != self.fold:
            raise ValueError(f"checkpoint belongs to fold {fold}, not fold {self.fold}")
        self.env_step, self.update_step = env_step, update_step
        self.dir_counts.copy_(loop["dir_counts"])
        self.wall_seconds = float(loop["wall_seconds"])

    # ---------------------------------------------------------------- running

    def _handle_signal(self, signum, _frame) -> None:
        self._stop_signal = signum  # acted on between steps: finish the step, checkpoint, exit 143

    def _learning(self) -> bool:
        return self.env_step >= self.cfg.loop.learning_starts

    def _log_interval(self, t0: float, steps_at_t0: int) -> None:
        """One JSON line of metrics. Reading device buffers here is the interval's host sync."""
        m = self.step_fn.metrics
        count = max(float(m.count), 1.0)  # host sync (log interval)
        sums = (m.sums / count).tolist()
        stats = {k: float(v) for k, v in self.sim.stats(self.state).items()}
        elapsed = max(time.perf_counter() - t0, 1e-9)
        sps = (self.env_step - steps_at_t0) / elapsed
        values = dict(zip(StepMetrics.NAMES, sums))
        record = self.log.event(
            "step", env_step=self.env_step, update_step=self.update_step, sps=round(sps, 2),
            transitions_per_s=round(sps * self.cfg.sim.n_envs, 1),
            loss=values["loss"], q_mean=values["q_mean"], grad_norm=values["grad_norm"], lr=values["lr"],
            clip=values["clip"], tau=values["tau"], reward=values["reward"],
            win_rate=stats["win_rate"], hold_frac=stats["hold_frac"],
            dir_entropy=float(direction_entropy(self.dir_counts)), trades=int(stats["round_trips"]),
            net_pnl=stats["net_pnl"],
        )
        m.reset()
        n = self.cfg.loop.n_steps
        # The floats, not the record: the record holds a non-finite loss as the string "nan", which a float
        # format refuses (ValueError, exit 2) before the kill check below could report it as exit 3.
        self.log.human(f"fold {self.fold} step {self.env_step}/{n} sps {record['sps']:.1f} "
                       f"loss {values['loss']:.4f} q {values['q_mean']:.3f} win {record['win_rate']:.3f} "
                       f"eta {eta_text(self.env_step - steps_at_t0, n - steps_at_t0, elapsed)}")
        self.learner.kill.check()  # raises KillCriterion (exit 3); flags were set on the device inside the step

    def run(self, checkpointer: Checkpointer | None = None) -> None:
        """Train to cfg.loop.n_steps from wherever the state is (fresh or resumed), in `self.mode`."""
        lc = self.cfg.loop
        mode = self.mode
        old = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        t0, steps_at_t0 = time.perf_counter(), self.env_step
        attempt_t0 = t0
        graphed: GraphedStep | None = None
        try:
            while self.env_step < lc.n_steps:
                if not self._learning():
                    self.step_fn.act_and_store()
                elif mode == "graph" and self.update_step >= self.GRAPH_WARMUP_UPDATES:
                    if graphed is None:  # eager updates before this point did the lazy inits capture needs
                        graphed = GraphedStep(self.step_fn)
                    graphed()
                    self.update_step += 1
                else:
                    self.step_fn()
                    self.update_step += 1
                self.env_step += 1
                if self.env_step % lc.log_every == 0 or self.env_step == lc.n_steps:
                    self._log_interval(t0, steps_at_t0)
                    t0, steps_at_t0 = time.perf_counter(), self.env_step
                if self.selector is not None and self._learning() and (
                        self.env_step % lc.select_every == 0 or self.env_step == lc.n_steps):
                    self._validate()
                if self._stop_signal is not None:
                    self.wall_seconds += time.perf_counter() - attempt_t0
                    attempt_t0 = time.perf_counter()
                    if checkpointer is not None:
                        checkpointer.save(self)
                    raise Stopped(f"signal {self._stop_signal} at env_step {self.env_step}")
                if checkpointer is not None and self.env_step % lc.checkpoint_every == 0 \
                        and self.env_step < lc.n_steps:
                    self.wall_seconds += time.perf_counter() - attempt_t0
                    attempt_t0 = time.perf_counter()
                    checkpointer.save(self)
            if self.selector is not None and self.selector.last_step != self.env_step:
                self._validate()  # e.g. n_steps raised on a resumed run: the last weights are a candidate too
            self.wall_seconds += time.perf_counter() - attempt_t0
            if checkpointer is not None:
                checkpointer.save(self, final=True)
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _validate(self) -> None:
        self.log.event("validate", env_step=self.env_step, **self.selector.validate(self.env_step))

    def _greedy(self, flat_margin: torch.Tensor | float = 0.0):
        """The greedy policy over `policy_features` windows: argmax E[Q], or its mirrored form (AgentConfig.mirror),
        FLAT's score raised by `flat_margin` (by LoopConfig.keep_margin_frac of it while a position is held)."""
        keep = self.cfg.loop.keep_margin_frac
        if self.agent_cfg.mirror:
            return mirrored_policy(self.learner, self.features.shape[1], flat_margin, keep)

        def greedy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
            return self.learner.act(obs, env_state, explore=False,
                                    flat_margin=held_margin(flat_margin, env_state, keep))

        return greedy

    def deployed_policy(self):
        """The policy that goes to out-of-sample evaluation, over `policy_features` windows: greedy (argmax E[Q], or
        its mirrored form) with the selected weights loaded into the online net, or always FLAT when model
        selection stood aside (trainer/loop/select.py). Under LoopConfig.max_exposure < 1 the greedy policy stands
        aside by the margin calibrated on the held-out slice (Selector.calibrate; computed once, then reused), and with
        LoopConfig.exposure_gain > 0 that margin is where an ExposureController (trainer/loop/exposure.py) starts:
        a new one, with a fresh state, at every call."""
        self.learner.online.eval()
        if self.selector is not None:
            self.selector.load_best()
            if self.selector.stands_aside:
                def stand_aside(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
                    a = torch.zeros(obs.shape[0], self.agent_cfg.n_branches, dtype=torch.int64, device=obs.device)
                    a[:, 0], a[:, 2] = FLAT, MARKET
                    return a

                return stand_aside
            if self.cfg.loop.max_exposure < 1.0:
                if not self.selector.exposure:
                    self.selector.calibrate(self._deployed, self.cfg.loop.max_exposure)
                margin = self.selector.exposure["select_margin"]
                if self.cfg.loop.exposure_gain > 0.0:  # the cap kept out of sample, causally
                    return ExposureController(self._deployed, margin, self.cfg.loop.max_exposure,
                                              self.cfg.loop.exposure_gain)
                return self._deployed(margin)

        return self._deployed()

    def _deployed(self, flat_margin: torch.Tensor | float = 0.0):
        """`_greedy(flat_margin)` under the deployment-only rule LoopConfig.min_hold_steps (trainer.agent.act.min_hold):
        what evaluation, the calibration and the controller run; model selection reads `_greedy` alone."""
        return min_hold(self._greedy(flat_margin), self.cfg.loop.min_hold_steps, self.cfg.sim.time_scale_steps)

    def selection_summary(self) -> dict:
        return {} if self.selector is None else self.selector.summary()

    @property
    def weights_hash(self) -> str:
        """sha256 over the online network's parameters (bit-identity checks for resume)."""
        import hashlib

        h = hashlib.sha256()
        for name, p in sorted(self.learner.online.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
