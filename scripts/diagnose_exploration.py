"""Diagnosis behind docs/RESULTS.md ("why the direction entropy stays near ln 4"): train one fold in-process, then
measure on the training window's states what the training-time statistics cannot tell apart.

    python scripts/diagnose_exploration.py [--data synthetic] [--n-steps 600] [--seed 0]

Prints one JSON line:
  marginal_entropy_greedy   entropy (nats) of the greedy direction's frequencies over the window's states: a
                            deterministic policy that goes long, short, flat or holds depending on the state has a
                            marginal entropy near ln 4 too, so the training log's dir_entropy cannot show uniformity
  agree_greedy[κ]           share of states where a Thompson draw shrunk by κ picks the greedy direction (1 = greedy
                            behaviour, 0.25 = uniform), for κ = 1 (plain draws), 0.2, 0.05
  q_gap                     mean over states of E[Q](best direction) − E[Q](second best)
  draw_sd                   mean over states and directions of the standard deviation of the C51 return distribution
  return_quantiles          1, 50, 99 % quantiles of the stored n-step returns, beside the support [v_min, v_max]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from trainer.agent.act import select_actions
from trainer.agent.network import expected_q
from trainer.features.cache import load_or_build
from trainer.features.compute import Normaliser
from trainer.folds.windows import fold_windows, walk_forward_windows
from trainer.loop.config import preset
from trainer.loop.fold import FoldTrainer, Window
from trainer.loop.step import gather_windows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="synthetic")
    p.add_argument("--n-steps", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fxcache", default="/tmp/alpha-rl-diag-fxcache")
    args = p.parse_args()
    # Training's exploration only: no selection (so no exposure cap) and no mirrored decisions, which act at decision
    # time, not in training.
    cfg = preset("smoke").replace(data=args.data, loop={"n_steps": args.n_steps, "seed": args.seed,
                                                        "select_frac": 0.0, "max_exposure": 1.0},
                                  agent={"thompson_scale": 1.0, "mirror": False})
    fs, _ = load_or_build(cfg.data, cfg.features, Path(args.fxcache))
    train_w, _ = fold_windows(walk_forward_windows(fs.raw.shape[0], 3), 0, train_window=cfg.folds.train_window)
    features = Normaliser.fit(fs.raw[train_w.start:train_w.stop]).apply(fs.raw)
    torch.manual_seed(args.seed)
    trainer = FoldTrainer(cfg, features, fs.decision, Window(train_w.start, train_w.stop), 0)
    trainer.run()
    net, W = trainer.learner.online, trainer.agent_cfg.window
    rows = torch.arange(train_w.start + W - 1, train_w.stop)  # every state of the window, flat and not in a trade
    obs = gather_windows(trainer.features, rows, W)
    env_state = torch.zeros(rows.shape[0], trainer.agent_cfg.env_state_dim)
    with torch.no_grad():
        logits = net(obs, env_state)  # (R, n_branches, A_max, n_atoms)
    mask = net.action_mask
    greedy = select_actions(logits, net.support, mask, explore=False)[:, 0]
    freq = torch.bincount(greedy, minlength=4).double() / greedy.shape[0]
    out = {"data": args.data, "n_steps": args.n_steps, "states": int(rows.shape[0]),
           "marginal_entropy_greedy": float(-(freq * freq.clamp(min=1e-12).log()).sum()), "ln4": math.log(4),
           "greedy_freq": [round(float(x), 3) for x in freq]}
    agree = {}
    for kappa in (1.0, 0.2, 0.05):
        draws = torch.stack([select_actions(logits, net.support, mask, explore=True, noise_scale=kappa)[:, 0]
                             for _ in range(20)])  # (20, R)
        agree[str(kappa)] = round(float((draws == greedy).double().mean()), 3)
    out["agree_greedy"] = agree
    q = expected_q(logits[:, 0], net.support)  # (R, A_max) direction branch
    top2 = q.topk(2, dim=-1).values
    out["q_gap"] = round(float((top2[:, 0] - top2[:, 1]).mean()), 4)
    probs = torch.softmax(logits[:, 0], dim=-1)
    var = (probs * net.support ** 2).sum(-1) - q ** 2
    out["draw_sd"] = round(float(var.clamp(min=0).sqrt().mean()), 4)
    stored = trainer.replay.state_dict()
    ret = stored["return_n"][: int(stored["size"])] if "return_n" in stored and "size" in stored else None
    if ret is not None and ret.numel():
        qs = torch.quantile(ret.double(), torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64))
        out["return_quantiles"] = [round(float(x), 4) for x in qs]
    out["support"] = [cfg.agent.v_min, cfg.agent.v_max]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
