"""Learning experiments: every (variant, seed, fold) as its own `python -m trainer.train` process, a pool of them in
parallel, then one table per variant against the OFI rule (docs/RESULTS.md keeps the tables and the commands).

    python scripts/experiment.py --out DIR --data synthetic --preset smoke --seeds 0,1 --workers 8 \
        --variant base= --variant k02="--agent.thompson-scale 0.2"

Each variant is NAME=FLAGS (extra trainer flags, shell-quoted). An evaluation variant, `--eval-variant
NAME=BASE:FLAGS`, trains nothing: each of its runs evaluates BASE's trained fold of the same seed (`python -m
trainer.train --evaluate-from`) with BASE's flags plus FLAGS, which may change only deployment and evaluation fields
(trainer.settings.EVALUATION_ONLY); the same weights under another deployment rule, so the comparison with BASE is
paired. Each runs as soon as its BASE fold is trained, in the same worker. Results land in DIR/NAME/seed<S>/fold<N>/result.json;
the table (stdout and DIR/table.md) gives per variant: net PnL per fold (mean over seeds), the OFI rule's net on the
same windows at one contract and at the agent's position limit (`ofi_rule_max`, the size-matched comparison), win rate,
trades, time in market, folds stood aside, and how many (seed, fold) runs beat each rule; for runs with the forecast
input (--agent.forecast-lags), the `forecast_rule_max` baseline too. Below it (trainer.report.paired): which seeds
pass every gate, each evaluation variant (and each `--compare NAME:BASE`) against its base run by run, and the IQM over
seeds of agent − OFI rule per fold with its bootstrap interval.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.report import GateConfig  # noqa: E402
from trainer.report.paired import baseline_edge, paired, seed_gates  # noqa: E402


def run_one(out: Path, name: str, flags: str, seed: int, fold: int, args,
            base: str | None = None) -> tuple[str, int, int, int, float]:
    """One `python -m trainer.train` process: train and evaluate (seed, fold) of variant `name`, or, with `base`,
    evaluate base's trained fold under `flags` (--evaluate-from)."""
    run_dir = out / name / f"seed{seed}"
    cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(run_dir), "--fold", str(fold), "--folds",
           str(args.folds), "--data", args.data, "--preset", args.preset, "--seed", str(seed),
           "--fxcache", str(out / "fxcache"), *shlex.split(flags)]
    if base is not None:
        cmd += ["--evaluate-from", str(out / base / f"seed{seed}" / f"fold{fold}")]
    if args.n_steps:
        cmd += ["--n-steps", str(args.n_steps)]
    t0 = time.time()
    (run_dir / f"fold{fold}").mkdir(parents=True, exist_ok=True)
    with open(run_dir / f"fold{fold}" / "stdout.log", "w") as so, open(run_dir / f"fold{fold}" / "stderr.log", "w") as se:
        rc = subprocess.call(cmd, stdout=so, stderr=se)
    return name, seed, fold, rc, time.time() - t0


def table(results: dict[str, dict[tuple[int, int], dict]], folds: int) -> str:
    """The variants' table; `results`: variant -> `load_runs`."""
    lines = ["| variant | agent net per fold (mean over seeds) | OFI net per fold | OFI max net per fold | agent total | "
             "OFI total | OFI max total | beats OFI (runs) | beats OFI max (runs) | win rate | trades | time in market | "
             "stood aside | val best net | win & hold gates (runs) | forecast rule net per fold, beats it (runs) |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    gates = GateConfig()
    for name, done in results.items():
        per_fold, ofi_fold, max_fold, wins, trades, tim, aside, beats, runs, val = [], [], [], [], [], [], 0, 0, 0, []
        gated = beats_max = beats_fc = 0
        fc_fold: list[float] = []
        for fold in range(folds):
            nets, ofis, maxes, fcs = [], [], [], []
            for r in (r for (_, f), r in sorted(done.items()) if f == fold):
                ofi = r["baselines"]["ofi_rule"]["net_pnl"]
                big = r["baselines"].get("ofi_rule_max", {}).get("net_pnl", float("nan"))  # absent before 2026-12-05
                nets.append(r["net_pnl"]), ofis.append(ofi), maxes.append(big)
                if "forecast_rule_max" in r["baselines"]:  # runs with --agent.forecast-lags > 0
                    fcs.append(r["baselines"]["forecast_rule_max"]["net_pnl"])
                    beats_fc += r["net_pnl"] > fcs[-1]
                runs += 1
                beats += r["net_pnl"] > ofi
                beats_max += r["net_pnl"] > big
                if r["trades"]:
                    wins.append(r["win_rate"])
                trades.append(r["trades"]), tim.append(r.get("time_in_market", 0.0))
                aside += bool(r.get("stood_aside", False))
                gated += ((not r["trades"] or r["win_rate"] > gates.min_win_rate)
                          and gates.hold_frac_min <= r.get(gates.hold_metric, 0.0) <= gates.hold_frac_max)
                if r.get("select_best_net_pnl") is not None:
                    val.append(r["select_best_net_pnl"])
            per_fold.append(statistics.fmean(nets) if nets else float("nan"))
            ofi_fold.append(statistics.fmean(ofis) if ofis else float("nan"))
            max_fold.append(statistics.fmean(maxes) if maxes else float("nan"))
            if fcs:
                fc_fold.append(statistics.fmean(fcs))
        mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
        lines.append(f"| {name} | {' / '.join(f'{x:+,.0f}' for x in per_fold)} | "
                     f"{' / '.join(f'{x:+,.0f}' for x in ofi_fold)} | {' / '.join(f'{x:+,.0f}' for x in max_fold)} | "
                     f"{sum(per_fold):+,.0f} | {sum(ofi_fold):+,.0f} | {sum(max_fold):+,.0f} | "
                     f"{beats}/{runs} | {beats_max}/{runs} | {mean(wins):.3f} | {mean(trades):.0f} | {mean(tim):.2f} | {aside} | "
                     f"{mean(val):+,.0f} | {gated}/{runs} | "
                     f"{' / '.join(f'{x:+,.0f}' for x in fc_fold) + f', {beats_fc}/{runs}' if fc_fold else '—'} |")
    return "\n".join(lines)


def run_rows(results: dict[str, dict[tuple[int, int], dict]]) -> str:
    """One row per run, with what the deployment did (docs/RESULTS.md §14 read these to tell a weaker direction call
    from a throttled one): the mid hit rate and the continuous pass (the trained values; its win rate and trips beside
    the segments' and their forced closes, §15), the held-out slice's free time in market and margin, and the
    margin's mean out of sample (the exposure rules)."""
    lines = ["| variant | seed / fold | net | win rate | trips (forced closes) | time in market | holding (decisions) | "
             "mid hit rate | continuous: net, win rate, trips | best step | slice: free time in market, margin | "
             "margin out of sample, mean |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"]
    num = lambda r, k, f: "–" if r.get(k) is None else format(r[k], f)  # noqa: E731
    for name, done in results.items():
        for (seed, fold), r in sorted(done.items()):
            lines.append(f"| {name} | {seed} / {fold} | {r['net_pnl']:+,.0f} | {num(r, 'win_rate', '.3f')} | "
                         f"{r['trades']} ({num(r, 'segment_forced_closes', 'd')}) | {num(r, 'time_in_market', '.2f')} | "
                         f"{num(r, 'mean_holding_steps', '.1f')} | {num(r, 'mid_hit_rate', '.3f')} | "
                         f"{num(r, 'continuous_net_pnl', '+,.0f')}, {num(r, 'continuous_win_rate', '.3f')}, "
                         f"{num(r, 'continuous_trades', 'd')} | "
                         f"{num(r, 'select_best_step', 'd')} | {num(r, 'select_free_time_in_market', '.2f')}, "
                         f"{num(r, 'select_margin', '.3f')} | {num(r, 'eval_margin_mean', '.3f')} |")
    return "\n".join(lines)


def load_runs(out: Path, name: str, seeds: list[int], folds: int) -> dict[tuple[int, int], dict]:
    """{(seed, fold): result.json} of variant `name`, the runs that finished."""
    runs = {}
    for seed in seeds:
        for fold in range(folds):
            p = out / name / f"seed{seed}" / f"fold{fold}" / "result.json"
            if p.exists():
                runs[(seed, fold)] = json.loads(p.read_text())
    return runs


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.0f} %"


def _iqm(x: dict | None) -> str:
    if x is None:
        return "–"
    ci = "" if x["ci"] is None else f" [{x['ci'][0] / 1e3:+.1f}k, {x['ci'][1] / 1e3:+.1f}k]"
    return f"{x['iqm'] / 1e3:+.1f}k{ci}"


def seed_tables(runs: dict[str, dict[tuple[int, int], dict]], pairs: list[tuple[str, str]], folds: int) -> str:
    """Every gate per seed, each pair (variant, base) run by run, and the IQM of agent − OFI rule per fold
    (trainer.report.paired); `runs`: variant -> `load_runs`."""
    names = list(runs)
    lines = ["", "Every gate per seed (`trainer.report.gates` on each seed's folds):", "",
             "| variant | seeds passing | seeds failing (gates) | seeds missing a fold |", "|---|---|---|---|"]
    for n in names:
        g = seed_gates(runs[n], folds)
        why = ", ".join(f"{s} ({' '.join(g['why'][s])})" for s in g["failed"])
        lines.append(f"| {n} | {len(g['passed'])} of {len(g['passed']) + len(g['failed'])}: "
                     f"{', '.join(map(str, g['passed'])) or '–'} | {why or '–'} | "
                     f"{', '.join(map(str, g['incomplete'])) or '–'} |")
    if pairs:
        lines += ["", "Paired, run by run (same seed and fold; an evaluation variant is its base's weights):", "",
                  "| variant | against | pairs | win rate up (pairs that traded) | win rate change, mean (range) | "
                  "trips | net (totals) | net per pair, mean (range; pairs whose base netted > 0) |",
                  "|---|---|---:|---:|---|---:|---:|---|"]
        for n, b in pairs:
            p = paired(runs[b], runs[n])
            wr = "–" if p["win_change_mean"] is None else (
                f"{p['win_change_mean']:+.3f} ({p['win_change_range'][0]:+.3f} to {p['win_change_range'][1]:+.3f})")
            nr = "–" if p["net_change_mean"] is None else (
                f"{_pct(p['net_change_mean'])} ({_pct(p['net_change_range'][0])} to "
                f"{_pct(p['net_change_range'][1])}; {p['net_change_pairs']})")
            lines.append(f"| {n} | {b} | {p['pairs']} | {p['win_up']} of {p['win_pairs']} | {wr} | "
                         f"{_pct(p['trips_change'])} | {_pct(p['net_change'])} | {nr} |")
    lines += ["", "IQM over seeds of agent − rule net PnL, 95 % stratified-bootstrap interval:", "",
              "| variant | − `ofi_rule` per fold | all folds | − `ofi_rule_max` per fold | all folds |",
              "|---|---|---|---|---|"]
    for n in names:
        if not runs[n]:
            continue
        cells = []
        for rule in ("ofi_rule", "ofi_rule_max"):
            if not all(rule in r["baselines"] for r in runs[n].values()):
                cells += ["–", "–"]
                continue
            e = baseline_edge(runs[n], rule, folds)
            cells += [" / ".join(_iqm(x) for x in e["folds"].values()), _iqm(e["all"])]
        lines.append(f"| {n} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", default="synthetic")
    p.add_argument("--preset", default="smoke")
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--seeds", default="0")
    p.add_argument("--n-steps", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--variant", action="append", default=[], help="NAME=FLAGS")
    p.add_argument("--eval-variant", action="append", default=[],
                   help="NAME=BASE:FLAGS: BASE's trained folds evaluated with BASE's flags plus FLAGS")
    p.add_argument("--compare", action="append", default=[],
                   help="NAME:BASE: pair NAME's runs with BASE's by seed and fold (each --eval-variant is paired with "
                        "its base without this)")
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant)
    evals = {}  # NAME -> (BASE, FLAGS)
    for v in args.eval_variant:
        name, rest = v.split("=", 1)
        base, _, flags = rest.partition(":")
        if base not in variants:
            p.error(f"--eval-variant {name}: its base {base!r} is not a --variant of this invocation")
        evals[name] = (base, f"{variants[base]} {flags}")
    if not variants:
        p.error("at least one --variant")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        # Features once, before the pool: every process then finds them in the cache.
        datas = {args.data}
        for flags in variants.values():
            words = shlex.split(flags)
            datas.update(words[i + 1] for i, w in enumerate(words[:-1]) if w == "--data")
        for data in sorted(datas):
            subprocess.check_call([sys.executable, "-m", "trainer.features", "--data", data, "--cache-dir",
                                   str(args.out / "fxcache")], stdout=subprocess.DEVNULL)
        # Seed-major, and each trained fold's evaluation variants right after it in the same worker: a call cut off
        # by its time limit leaves every variant of the (seed, fold) runs it reached, paired (on the lent GPU, 12
        # processes training at once took the whole call, and evaluation variants queued behind them never ran).
        def chain(name: str, flags: str, seed: int, fold: int) -> list[tuple[str, int, int, int, float]]:
            done = [run_one(args.out, name, flags, seed, fold, args)]
            for ename, (base, eflags) in evals.items():
                if base == name and done[0][3] == 0:
                    done.append(run_one(args.out, ename, eflags, seed, fold, args, base=base))
            return done

        jobs = [(n, f, s, k) for s in seeds for n, f in variants.items() for k in range(args.folds)]
        with ThreadPoolExecutor(args.workers) as pool:
            for finished in pool.map(lambda j: chain(*j), jobs):
                for name, seed, fold, rc, sec in finished:
                    print(f"{name} seed{seed} fold{fold} rc={rc} {sec:.0f}s", flush=True)
    names = {**variants, **{n: f for n, (_, f) in evals.items()}}
    pairs = [(n, b) for n, (b, _) in evals.items()]
    for c in args.compare:
        name, _, base = c.partition(":")
        if name not in names or base not in names:
            p.error(f"--compare {c}: both must be a --variant or --eval-variant of this invocation")
        pairs.append((name, base))
    results = {n: load_runs(args.out, n, seeds, args.folds) for n in names}  # each result.json read once
    text = table(results, args.folds) + "\n" + seed_tables(results, pairs, args.folds) + "\n\nPer run:\n\n" + run_rows(results)
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
