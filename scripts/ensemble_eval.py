"""Evaluate the seeds of an experiment as one policy: the mean of their expected returns, greedy.

Each (seed, fold) run of `scripts/experiment.py` keeps, in its last checkpoint, the weights that model selection
chose (trainer/loop/select.py). This script loads those weights for every seed of a fold and evaluates, through the
fold's own `evaluate` and baselines, (a) each seed alone (it reproduces that run's result.json net PnL exactly on the
CPU: the check that the weights and inputs are the ones evaluated in training; a difference is shown) and (b) the ensemble:

    a_b = argmax_a  mean over the seeds that did not stand aside of E[Q_seed(s, b, a)]     for every branch b

(always FLAT when every seed stood aside). Averaging independently trained value estimates lowers the variance of
each greedy decision (Averaged-/Ensemble-DQN); docs/RESULTS.md §8 says whether it pays here. `--mirror` scores the
same decisions as AgentConfig.mirror does (each action with its mirror in the reflected market), for runs trained
without it: how §8 first measured the mirror, before the option existed. It applies no stand-aside margin
(LoopConfig.max_exposure, §9): runs with the cap on (the presets since §9) are re-evaluated without it, so their
result.json is not reproduced; pass `--flags "--loop.max-exposure 1"` when training runs meant for this script.

    python scripts/experiment.py --out DIR --preset smoke --data SPEC --seeds 0,1,2 --variant base=FLAGS
    python scripts/ensemble_eval.py --dir DIR/base --preset smoke --data SPEC --seeds 0,1,2 --flags "FLAGS"
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.agent.act import mirror_directions  # noqa: E402
from trainer.agent.network import QNetwork, expected_q  # noqa: E402
from trainer.checkpoint.tensors import decode_tensors  # noqa: E402
from trainer.checkpoint.store import latest_valid  # noqa: E402
from trainer.cli import parse  # noqa: E402
from trainer.data.fees import venue_fees  # noqa: E402
from trainer.features.cache import load_or_build  # noqa: E402
from trainer.folds.baselines import flat_policy, run_baselines  # noqa: E402
from trainer.folds.evaluate import evaluate  # noqa: E402
from trainer.folds.windows import fold_windows, walk_forward_windows  # noqa: E402
from trainer.loop.fold import Window, agent_config_for, fold_inputs  # noqa: E402
from trainer.sim import ENV_REFLECTION  # noqa: E402


def selected_network(fold_dir: Path, agent_cfg, device: torch.device) -> tuple[QNetwork, bool]:
    """The network model selection chose in `fold_dir`'s last checkpoint, and whether the run stood aside."""
    ckpt = latest_valid(fold_dir)
    if ckpt is None:
        raise SystemExit(f"{fold_dir}: no checkpoint")
    select = decode_tensors(ckpt.sections["state/select"], device=device)
    net = QNetwork(agent_cfg).to(device)
    flat, offset = select["best_params"], 0
    with torch.no_grad():
        for p in net.parameters():  # the order of Learner.params, which filled best_params
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    if offset != flat.numel():
        raise SystemExit(f"{fold_dir}: {flat.numel()} selected parameters, the network has {offset}")
    result = json.loads((fold_dir / "result.json").read_text())
    return net.eval(), bool(result.get("stood_aside", False))


def ensemble_policy(nets: list[QNetwork], n_features: int | None = None):
    """Greedy on the seeds' mean E[Q]. With `n_features` F, the observation carries 2F columns: the inputs, then the
    same inputs of the reflected market, and each action's score also averages E[Q] of the mirrored action (LONG
    <-> SHORT) in the reflected state: a policy with no preferred direction of its own."""
    if not nets:
        return flat_policy()
    env_signs = torch.tensor(ENV_REFLECTION)

    def mean_q(obs, env_state):
        return torch.stack([expected_q(n(obs, env_state), n.support) for n in nets]).mean(0)  # (B, nb, A_max)

    @torch.no_grad()
    def policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        if n_features is None:
            q = mean_q(obs, env_state)
        else:
            q = mean_q(obs[..., :n_features], env_state)
            qm = mean_q(obs[..., n_features:], env_state * env_signs.to(env_state.device))
            q = 0.5 * (q + mirror_directions(qm))  # as trainer.agent.act.mirrored_greedy, on the seeds' mean
        return q.masked_fill(~nets[0].action_mask, float("-inf")).argmax(-1)

    return policy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="an experiment variant's folder: DIR/NAME")
    ap.add_argument("--data", required=True)
    ap.add_argument("--preset", default="smoke")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--flags", default="", help="the variant's trainer flags, as given to experiment.py")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mirror", action="store_true", help="average each decision with the reflected market's")
    args = ap.parse_args()
    device = torch.device(args.device)
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"| fold | seeds alone (net) | ensemble net | win | trades | time in market | mid hit | ofi_rule_max | "
          f"beats it |\n|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for n in range(args.folds):
        nets, alone = [], []
        for s in seeds:
            inv = parse(["--run-dir", str(args.dir / f"seed{s}"), "--fold", str(n), "--folds", str(args.folds),
                         "--data", args.data, "--preset", args.preset, "--seed", str(s), *shlex.split(args.flags)])
            cfg = inv.run.seeded(inv.config)
            fs, _ = load_or_build(cfg.data, cfg.features, args.dir.parent / "fxcache")
            if cfg.sim.fees == "venue":
                fees = venue_fees(cfg.data, fs.decision.bid_px[:, 0], fs.decision.ask_px[:, 0], fs.decision.tick_value)
                cfg = cfg.replace(sim={"maker_fee": fees["maker_fee"], "taker_fee": fees["taker_fee"]})
            windows = walk_forward_windows(fs.raw.shape[0], cfg.folds.folds, embargo_rows=cfg.folds.embargo_rows)
            train_w, eval_w = fold_windows(windows, n, train_window=cfg.folds.train_window)
            # --mirror: the reflected inputs as the folds build them (AgentConfig.mirror refuses the forecast input)
            inputs_cfg = cfg.replace(agent={"mirror": True}) if args.mirror else cfg
            feats, names, reflected = fold_inputs(inputs_cfg, fs.raw, fs.names, fs.decision,
                                                  Window(train_w.start, train_w.stop))
            n_feats = feats.shape[1]
            if reflected is not None:
                feats = np.concatenate([feats, reflected], axis=1)
            feats = torch.as_tensor(feats, dtype=torch.float32, device=device)
            fold_dir = args.dir / f"seed{s}" / f"fold{n}"
            if not (fold_dir / "result.json").exists():
                alone.append("unfinished")
                continue
            net, aside = selected_network(fold_dir, agent_config_for(cfg, n_feats), device)
            W = cfg.agent.window
            own = json.loads((fold_dir / "result.json").read_text())["net_pnl"]
            if aside:
                alone.append(f"aside ({own:+,.0f})")
                continue
            m = evaluate(ensemble_policy([net], n_feats if args.mirror else None), feats, fs.decision, cfg.sim, W, eval_w.start, eval_w.stop,
                         cfg=cfg.eval).metrics
            nets.append(net)
            # the same weights and inputs give the same net; on CUDA a compiled training network may round
            # differently from this eager one and flip a near-tie, so a mismatch is shown, not fatal
            same = abs(m["net_pnl"] - own) <= 1e-6 * max(1.0, abs(own))
            alone.append(f"{own:+,.0f}" if same else f"{own:+,.0f} (here {m['net_pnl']:+,.0f})")
        m = evaluate(ensemble_policy(nets, n_feats if args.mirror else None), feats, fs.decision, cfg.sim, W, eval_w.start, eval_w.stop,
                     cfg=cfg.eval).metrics
        rule = run_baselines(names, feats, fs.decision, cfg.sim, W, eval_w.start, eval_w.stop, cfg.eval,
                             seed=cfg.loop.seed)["ofi_rule_max"]["net_pnl"]
        print(f"| {n} | {' / '.join(alone)} | {m['net_pnl']:+,.0f} | {m['win_rate']:.3f} | {m['trades']} | "
              f"{m['time_in_market']:.2f} | {(m['mid_hit_rate'] or 0):.3f} | {rule:+,.0f} | "
              f"{'yes' if m['net_pnl'] > rule else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
