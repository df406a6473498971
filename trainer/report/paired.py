"""Two deployments (or two trainings) compared run by run: the same (seed, fold) under each, so the difference is the
rule's, not the seed's or the window's (docs/RESULTS.md §12, §13: `scripts/experiment.py --eval-variant` runs a
trained fold again under other deployment fields on the same weights).

Runs are {(seed, fold): result.json dict}. What it gives, for a variant against its base:
  * win rate up on how many pairs of the pairs where both traded, and the mean change;
  * trips and net PnL: the change of the totals over the pairs, and the mean and range of the per-pair relative
    change of net over the pairs whose base netted more than 0 (a ratio to a loss has no sign to read);
  * every gate per seed (`trainer.report.gates` on the seed's folds, as `python -m trainer.report` judges one seed's
    run): which seeds pass, which fail, which lack a fold;
  * the IQM over seeds of agent − baseline net per fold and over all folds, with the 95 % stratified-bootstrap
    interval (`trainer.report.stats.iqm_interval`).
"""
from __future__ import annotations

from statistics import fmean
from typing import Any, Mapping

from trainer.report import GateConfig, gate_row, gates, stood_aside, stats

Runs = Mapping[tuple[int, int], Mapping[str, Any]]


def seed_gates(runs: Runs, folds: int, cfg: GateConfig = GateConfig()) -> dict[str, Any]:
    """Seeds whose `folds` folds all pass every gate (`passed`), those with a failing gate (`failed`, with the gate
    names in `why`), and those missing a fold (`incomplete`)."""
    out: dict[str, Any] = {"passed": [], "failed": [], "incomplete": [], "why": {}}
    for seed in sorted({s for s, _ in runs}):
        have = [runs[(seed, f)] for f in range(folds) if (seed, f) in runs]
        if len(have) < folds:
            out["incomplete"].append(seed)
            continue
        bad = [name for name, g in gates([gate_row(r) for r in have], folds, cfg).items() if not g["passed"]]
        out["failed" if bad else "passed"].append(seed)
        if bad:
            out["why"][seed] = bad
    return out


def baseline_edge(runs: Runs, baseline: str, folds: int, seed: int = 0) -> dict[str, Any]:
    """IQM over seeds of (agent net − `baseline` net) per fold and over all folds (stratified by fold), each with its
    95 % interval (None with one seed). Folds without runs are left out."""
    strata = {f: [float(r["net_pnl"]) - float(r["baselines"][baseline]["net_pnl"])
                  for (_, fold), r in sorted(runs.items()) if fold == f] for f in range(folds)}
    strata = {f: v for f, v in strata.items() if v}
    return {"baseline": baseline, "folds": {f: stats.iqm_interval([v], seed=seed) for f, v in strata.items()},
            "all": stats.iqm_interval(list(strata.values()), seed=seed) if strata else None}


def paired(base: Runs, other: Runs) -> dict[str, Any]:
    """`other` against `base` on the (seed, fold) runs both have (see the module docstring)."""
    keys = sorted(set(base) & set(other))
    traded = [k for k in keys if not stood_aside(base[k]) and not stood_aside(other[k])]
    dwin = [float(other[k]["win_rate"]) - float(base[k]["win_rate"]) for k in traded]
    trips_b, trips_o = sum(int(base[k]["trades"]) for k in keys), sum(int(other[k]["trades"]) for k in keys)
    net_b, net_o = sum(float(base[k]["net_pnl"]) for k in keys), sum(float(other[k]["net_pnl"]) for k in keys)
    rel = [float(other[k]["net_pnl"]) / float(base[k]["net_pnl"]) - 1.0 for k in keys if float(base[k]["net_pnl"]) > 0]
    return {
        "pairs": len(keys),
        "win_pairs": len(traded),
        "win_up": sum(d > 0 for d in dwin),
        "win_down": sum(d < 0 for d in dwin),
        "win_change_mean": fmean(dwin) if dwin else None,
        "win_change_range": [min(dwin), max(dwin)] if dwin else None,
        "trips_change": trips_o / trips_b - 1.0 if trips_b else None,
        "net_change": net_o / net_b - 1.0 if net_b > 0 else None,
        "net_change_pairs": len(rel),
        "net_change_mean": fmean(rel) if rel else None,
        "net_change_range": [min(rel), max(rel)] if rel else None,
    }
