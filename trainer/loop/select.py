"""Model selection on a held-out slice at the end of the training window (LoopConfig.select_frac).

The last `select_frac` of the training window's rows are never trained on. Every `select_every` steps the greedy
policy (argmax E[Q], as in out-of-sample evaluation) is backtested on that slice, and the online weights with the
best validation net PnL are kept (a device copy). At the end of the fold those weights, not the last ones, go to
out-of-sample evaluation. The null model is a candidate too: the fold stands aside (its deployed policy never opens
a position) unless the best network netted more than `select_min_net` on the slice *and* its segments' net PnLs
have a t-statistic above `select_min_t` (where t is undefined, one segment or no spread, the net floor alone
decides). Staying flat when nothing paid on data the network never trained on is then a decision taken on
evidence, not a collapse. The t-rule is the stricter one: the best of ~20 validations of
a network with no edge often nets a little by chance (winner's curse), but rarely does so consistently across
the slice's segments (docs/RESULTS.md, "A stricter stand-aside rule").

Exposure cap (LoopConfig.max_exposure < 1): once the weights are chosen (and the fold does not stand aside),
`calibrate` finds the smallest stand-aside margin m >= 0 for which the greedy policy with FLAT's E[Q] raised by m
holds a position on at most the cap's share of the slice's steps; evaluation deploys that margin. It searches by
doubling from MARGIN_START, then bisects; each probe is one validation backtest. The slice decides it, never the
evaluation window.

Validation backtests: `select_envs` envs start at evenly spaced rows of the slice, each replays its own contiguous
part greedily, then every env is flattened by a market order so open positions are counted with their fees (the
same rules as trainer/folds/evaluate.py's segment backtests, which this stage cannot import). Deterministic: greedy
actions and given start rows draw no random numbers, so a resumed run selects exactly as an uninterrupted one.
Each validation is one host sync (reading the backtest's PnL), at the select interval only.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from trainer.agent.learner import Learner
from trainer.features.decision import DecisionTape
from trainer.loop.step import gather_windows
from trainer.numeric import t_statistic
from trainer.sim import FLAT, MARKET, SimConfig, Simulator


def split_validation(start: int, stop: int, select_frac: float, window: int) -> tuple[int, int]:
    """(train_stop, val_start): the rows [val_start, stop) are held out; [start, train_stop) are trained on.

    train_stop == val_start. The slice keeps at least `window` + 2 rows (a full observation window plus one step) and
    so does the training part; ValueError naming the sizes otherwise."""
    if select_frac <= 0.0:
        return stop, stop
    n = stop - start
    n_val = max(int(round(n * select_frac)), window + 2)
    if n - n_val < window + 2:
        raise ValueError(f"LoopConfig.select_frac={select_frac}: the training window [{start}, {stop}) has {n} rows, "
                         f"too few to hold out {n_val} and keep {window + 2} to train on")
    return stop - n_val, stop - n_val


class Selector:
    """Validation backtests of the greedy policy and the best weights so far (state for checkpoints)."""

    def __init__(self, learner: Learner, features: torch.Tensor, tape: DecisionTape, sim_cfg: SimConfig,
                 window: int, val_start: int, val_stop: int, n_envs: int, min_net: float, min_t: float = 0.0,
                 policy=None):
        """policy: the greedy policy to validate, (obs, env_state) -> actions over windows of `features` (the
        deployed policy and its inputs, FoldTrainer.policy_features); default the learner's plain greedy."""
        self.learner, self.features, self.window = learner, features, window
        self.policy = policy or (lambda obs, env_state: learner.act(obs, env_state, explore=False))
        self.val_start, self.val_stop, self.min_net, self.min_t = val_start, val_stop, min_net, min_t
        # First row with a full observation window inside the slice, as the agent sees it (feed latency k rows late).
        first = val_start + window - 1 + sim_cfg.feed_latency_steps
        span = val_stop - 1 - first
        n_seg = max(1, min(n_envs, span))
        self.seg_len = span // n_seg
        dev = features.device
        self.sim = Simulator(tape, dataclasses.replace(sim_cfg, n_envs=n_seg), dev)
        self.start_rows = first + torch.arange(n_seg, device=dev, dtype=torch.int64) * self.seg_len  # (n_seg,)
        n_params = sum(p.numel() for p in learner.params)
        self.best_params = torch.zeros(n_params, device=dev)  # (n_params,) flat copy of the best online weights
        # [best validation net PnL, env_step it was seen at, validations run, latest net PnL, latest env_step,
        #  t-statistic of the best network's segment net PnLs]
        self.record = torch.tensor([float("-inf"), -1.0, 0.0, float("nan"), -1.0, float("nan")], dtype=torch.float64)
        self.exposure: dict[str, float | int] = {}  # what `calibrate` found (LoopConfig.max_exposure), for `summary`

    @torch.no_grad()
    def backtest(self, policy) -> tuple[float, int, list[float], float]:
        """(net PnL, round trips, each segment's net PnL, time in market) of `policy` on the slice. Time in market:
        the share of the segments' steps that end holding a position (before the closing step). One host sync."""
        net = self.learner.online
        was_training = net.training
        net.eval()
        sim = self.sim
        state = sim.reset(self.val_start, self.val_stop, min_history=self.window - 1, start_rows=self.start_rows)
        held = torch.zeros((), dtype=torch.float64, device=self.features.device)  # env-steps holding a position
        for _ in range(self.seg_len):
            obs = gather_windows(self.features, sim.obs_rows(state), self.window)
            sim.step(state, policy(obs, sim.env_features(state)))
            held += (state.position != 0).sum()
        close = torch.zeros(sim.cfg.n_envs, 4, dtype=torch.int64, device=self.features.device)
        close[:, 0], close[:, 2] = FLAT, MARKET
        sim.step(state, close)
        stats = sim.stats(state)
        segments = sim.equity(state).double()  # (n_seg,) each segment's net PnL: every env is flat after the close
        net_pnl, trades, held, *seg = torch.cat([torch.stack([stats["net_pnl"], stats["round_trips"].double(), held]),
                                                 segments]).tolist()  # the host sync, once per backtest
        net.train(was_training)
        return net_pnl, int(trades), seg, held / (sim.cfg.n_envs * self.seg_len)

    def validate(self, env_step: int) -> dict[str, float]:
        """Backtest the current greedy policy on the slice; keep its weights if it is the best so far."""
        net_pnl, trades, seg, _ = self.backtest(self.policy)
        t = t_statistic(seg)  # None: one segment, or no spread
        best, _, count, _, _, best_t = self.record.tolist()
        improved = net_pnl > best
        if improved:
            torch.cat([p.detach().reshape(-1) for p in self.learner.params], out=self.best_params)
            best, best_t = net_pnl, math.nan if t is None else t
            self.record[1] = env_step
        self.record[0], self.record[2], self.record[3], self.record[4] = best, count + 1, net_pnl, env_step
        self.record[5] = best_t
        return {"val_net_pnl": net_pnl, "val_trades": trades, "val_t": t, "val_best_net_pnl": best,
                "improved": improved}

    @property
    def last_step(self) -> int:
        """env_step of the latest validation (-1: none yet)."""
        return int(self.record[4])

    @property
    def stands_aside(self) -> bool:
        """True unless the best validated network netted more than `min_net` on the slice and its segments' t-statistic
        exceeds `min_t` or is undefined (also True when none was validated)."""
        best, best_t = float(self.record[0]), float(self.record[5])
        return not (best > self.min_net and (math.isnan(best_t) or best_t > self.min_t))

    def load_best(self) -> None:
        """Copy the best weights into the online network (the one evaluation reads)."""
        offset = 0
        with torch.no_grad():
            for p in self.learner.params:
                p.copy_(self.best_params[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    MARGIN_START = 1e-3
    """calibrate's first nonzero margin probe, in E[Q] units (reward units; the C51 support spans v_min..v_max)."""
    MARGIN_DOUBLINGS = 24
    """calibrate doubles the margin at most this often looking for one under the cap (MARGIN_START · 2^24 ≈ 1.7e4,
    far beyond any support); beyond it the margin stays at the last probe."""
    MARGIN_BISECTIONS = 6
    """Halvings of the bracket [m/2, m] once a margin m under the cap is found: m is found to within 1/64 of itself."""

    def calibrate(self, policy_at, cap: float) -> float:
        """The stand-aside margin of LoopConfig.max_exposure for the weights loaded now: the smallest margin m >= 0
        (to within 1/64 of m) at which `policy_at(m)` holds a position on at most `cap` of the slice's steps. 0 when
        the plain policy is already under the cap. policy_at(m) -> the greedy policy with FLAT's E[Q] raised by m.
        Deterministic (greedy, fixed start rows); records what it found for `summary` (one host sync per probe)."""
        probes = []

        def probe(m: float) -> bool:
            net_pnl, trades, _, held = self.backtest(policy_at(m))
            probes.append((m, held, net_pnl, trades))
            return held <= cap

        lo, hi = 0.0, 0.0
        if not probe(0.0):
            hi = self.MARGIN_START
            for _ in range(self.MARGIN_DOUBLINGS):
                if probe(hi):
                    break
                lo, hi = hi, 2.0 * hi
            for _ in range(self.MARGIN_BISECTIONS):
                mid = 0.5 * (lo + hi)
                if probe(mid):
                    hi = mid
                else:
                    lo = mid
        _, free_held, free_net, free_trades = probes[0]
        _, held, net_pnl, trades = next(p for p in reversed(probes) if p[0] == hi)
        self.exposure = {"select_max_exposure": cap, "select_margin": hi, "select_margin_probes": len(probes),
                         "select_time_in_market": held, "select_capped_net_pnl": net_pnl,
                         "select_capped_trades": trades, "select_free_time_in_market": free_held,
                         "select_free_net_pnl": free_net, "select_free_trades": free_trades}
        return hi

    def summary(self) -> dict[str, float | int | bool]:
        best, step, count, last, _, best_t = self.record.tolist()
        return {"select_best_net_pnl": best if count else None, "select_best_t": None if math.isnan(best_t) else best_t,
                "select_best_step": int(step),
                "select_validations": int(count), "select_last_net_pnl": last if count else None,
                "stood_aside": self.stands_aside, "select_rows": [self.val_start, self.val_stop], **self.exposure}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"best_params": self.best_params, "record": self.record}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        self.best_params.copy_(d["best_params"])
        self.record.copy_(d["record"])
