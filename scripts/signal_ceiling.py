"""What win rate and net PnL the planted signal allows: rules that read the synthetic market's latent pressure.

The synthetic market (trainer/data/synth.py) tilts each price step by tanh(signal * drift_beta * p) where p is a
latent AR(1) pressure. A causal policy can at best know p at the row it observes; every feature is a noisy view of
it. So a rule that reads the true p at the observed row (the feed latency applies, as to every policy) and trades
market orders when |p| exceeds a threshold is a ceiling for direction-only policies: no feature-based policy knows
more. It goes through the same `evaluate` (segment backtests with the forced close, the continuous pass, fees,
spread) as the agent and the OFI rule, on each fold's eval window, so its win rate says what the win gate asks of
the agent at this signal strength. Beside it, the same rules on a linear probe: a ridge regression of the pressure
on the last `--lags` rows of every normalised feature, fitted on the fold's training window only, which says how much
of the pressure the features carry for a linear reader (the agent's network can do better than linear; no rule here
is a baseline of the report). And on a forecast: the same regression of what a trader can observe, the mid change over
the next 4 rows, fitted on the training window: a plain supervised forecaster with a threshold rule.

    python scripts/signal_ceiling.py --data synthetic:seed=11,days=8,signal=1 --preset h100

Prints one row per (rule, fold): win rate, net PnL, trades, time in market, mid hit rate, continuous-pass win rate.
The rules trade the agent's position limit (`--magnitude 2`, as `ofi_rule_max`). CPU is enough (a minute or two per
market on 2 cores). A diagnostic (docs/RESULTS.md §7), not a test.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from trainer.data import synth  # noqa: E402
from trainer.agent.aux import mid_change_target  # noqa: E402
from trainer.agent.forecast import ridge_forecast  # noqa: E402
from trainer.data.fees import venue_fees  # noqa: E402
from trainer.data.spec import parse_spec  # noqa: E402
from trainer.features.cache import load_or_build  # noqa: E402
from trainer.features.compute import Normaliser  # noqa: E402
from trainer.folds.baselines import OfiRuleConfig, ofi_rule_policy  # noqa: E402
from trainer.folds.evaluate import evaluate  # noqa: E402
from trainer.folds.windows import fold_windows, walk_forward_windows  # noqa: E402
from trainer.loop.config import preset  # noqa: E402
from trainer.settings import TRAIN_WINDOWS  # noqa: E402
from trainer.sim import FLAT, HOLD  # noqa: E402
from trainer.sim.actions import BRANCH_SIZES  # noqa: E402


def latent_pressure(spec: str, ts_ns: np.ndarray) -> np.ndarray:
    """(T,) the generator's latent pressure at each decision time (the last book record at or before it)."""
    opts = parse_spec(spec).options
    cfg = synth.SynthConfig(seed=int(opts.get("seed", synth.SynthConfig.seed)),
                            days=int(opts.get("days", synth.SynthConfig.days)),
                            signal=float(opts.get("signal", synth.SynthConfig.signal)))
    days = synth.simulate(cfg)
    ts = np.concatenate([d.ts_recv for _, d in days]).astype(np.int64)
    p = np.concatenate([d.pressure for _, d in days])
    if np.any(np.diff(ts) < 0):
        raise ValueError("synthetic ts_recv is not sorted; cannot align the pressure")
    idx = np.searchsorted(ts, ts_ns, side="right") - 1
    if np.any(idx < 0):
        raise ValueError("a decision precedes the first book record")
    return p[idx]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="synthetic:seed=11,days=8,signal=1")
    ap.add_argument("--preset", default="h100")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--train-window", choices=TRAIN_WINDOWS, default="rolling",
                    help="what each fold's normaliser, probe and forecast are fitted on (FoldConfig.train_window)")
    ap.add_argument("--thresholds", default="0.5,1,1.5")
    ap.add_argument("--magnitude", type=int, default=BRANCH_SIZES[1] - 1,
                    help="magnitude choice of the rules (default 2: the position limit, as ofi_rule_max)")
    ap.add_argument("--lags", type=int, default=8, help="rows of every feature the linear probe reads")
    ap.add_argument("--fxcache", default=None, help="feature cache directory (default: a temporary one)")
    args = ap.parse_args(argv)
    if parse_spec(args.data).kind != "synthetic":
        raise SystemExit("--data must be a synthetic spec: only the generator knows the latent pressure")

    cfg = preset(args.preset).replace(data=args.data, folds={"folds": args.folds, "train_window": args.train_window})
    cache = Path(args.fxcache) if args.fxcache else Path(tempfile.mkdtemp(prefix="ceiling-fx-"))
    fs, _ = load_or_build(cfg.data, cfg.features, cache)
    if cfg.sim.fees == "venue":
        fees = venue_fees(cfg.data, fs.decision.bid_px[:, 0], fs.decision.ask_px[:, 0], fs.decision.tick_value)
        cfg = cfg.replace(sim={"maker_fee": fees["maker_fee"], "taker_fee": fees["taker_fee"]})
    pressure = latent_pressure(cfg.data, np.asarray(fs.decision.ts_ns))
    windows = walk_forward_windows(fs.raw.shape[0], cfg.folds.folds, embargo_rows=cfg.folds.embargo_rows)
    window = cfg.agent.window
    names = list(fs.names)
    print(f"data {cfg.data}  preset {args.preset}  rows {fs.raw.shape[0]}  window {window}  "
          f"eval envs {cfg.eval.n_envs}  corr(pressure, ofi_sum) "
          f"{np.corrcoef(pressure, fs.raw[:, names.index('ofi_sum')])[0, 1]:.3f}")
    print(f"{'rule':<22}{'fold':>5}{'win':>8}{'net':>10}{'trades':>8}{'in mkt':>8}{'mid hit':>9}{'cont win':>9}")
    for n in range(cfg.folds.folds):
        train_w, eval_w = fold_windows(windows, n, train_window=cfg.folds.train_window)
        feats = Normaliser.fit(fs.raw[train_w.start:train_w.stop]).apply(fs.raw)
        fit = slice(train_w.start, train_w.stop)
        probe = ridge_forecast(feats, pressure, fit, args.lags, ridge=1.0)
        # the same regression on what a trader can observe: the mid change over the next 4 rows (the agent's
        # auxiliary target, trainer/agent/aux.py), fitted on the training window
        ahead = mid_change_target(fs.decision.bid_px[:, 0], fs.decision.ask_px[:, 0], train_w.start, train_w.stop, 4)
        forecast = ridge_forecast(feats, ahead, fit, args.lags, ridge=1.0)
        ev = slice(eval_w.start, eval_w.stop)
        print(f"fold {n}: corr(probe, pressure) on the eval window {np.corrcoef(probe[ev], pressure[ev])[0, 1]:.3f}, "
              f"corr(forecast, pressure) {np.corrcoef(forecast[ev], pressure[ev])[0, 1]:.3f}, "
              f"corr(ofi_sum, pressure) {np.corrcoef(feats[ev, names.index('ofi_sum')], pressure[ev])[0, 1]:.3f}")
        extra = np.stack([pressure, probe, forecast], axis=1).astype(np.float32)
        feats = torch.from_numpy(np.concatenate([feats, extra], axis=1))
        # pressure, probe and forecast ride as extra columns, read by the OFI rule's own policy (feed latency and all)
        columns = [*names, "pressure", "probe", "forecast"]
        rules = {"ofi_rule": ofi_rule_policy(names),
                 "ofi_rule_max": ofi_rule_policy(names, OfiRuleConfig(magnitude=BRANCH_SIZES[1] - 1))}
        for th in (float(t) for t in args.thresholds.split(",")):
            for src in ("pressure", "probe", "forecast"):
                for inside, word in ((HOLD, "hold"), (FLAT, "flat")):
                    rule = OfiRuleConfig(column=src, threshold=th, magnitude=args.magnitude, inside=inside)
                    rules[f"{src}>{th:g} {word}"] = ofi_rule_policy(columns, rule)
        for name, policy in rules.items():
            m = evaluate(policy, feats, fs.decision, cfg.sim, window, eval_w.start, eval_w.stop, cfg=cfg.eval).metrics
            print(f"{name:<22}{n:>5}{m['win_rate']:>8.3f}{m['net_pnl']:>10.0f}{m['trades']:>8d}"
                  f"{m['time_in_market']:>8.2f}{(m['mid_hit_rate'] or 0):>9.3f}{m['continuous_win_rate']:>9.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
