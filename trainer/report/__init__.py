"""Cross-fold summary of a run: per-fold out-of-sample metrics, baselines, success gates and a verdict.

`summarise(run_dir)` reads RUN/fold<N>/result.json (written by `python -m trainer.train`) and returns the dict
that `python -m trainer.report` writes to RUN/summary.json. Pure file reading: no torch, no training code.

Gates (the seed plan's; thresholds in `GateConfig`), each evaluated over every fold present:
  win_rate_every_fold      out-of-sample win rate per round trip > 0.55 on every fold
  win_rate_floor           no fold below 0.50 (implied by the first; reported separately so a run that misses the
                           target but never loses more often than it wins is told apart from one that does)
  dir_entropy              the training direction-choice entropy is not collapsed: >= 0.25 · ln 4 nats on every fold
  hold_frac                the evaluation hold fraction lies within [0.30, 0.70] on every fold; "hold fraction"
                           is read as the share of time holding a position (`time_in_market`, beside the mean
                           holding time), not the share of HOLD actions (`GateConfig.hold_metric`)
  complete                 every fold 0..K-1 has a result (K from the results' `folds`)
verdict: "pass" when every gate passes, "incomplete" when folds are missing, else "fail".

Leakage guard (`leakage` block, thresholds in `LeakageConfig`; not a gate, it does not change the verdict): the
folds' cost-free mid edges (trainer.folds.metrics.mid_edge: decided position × next mid move, fees and spread left
out) are pooled exactly from their per-fold sums into one t-statistic and hit rate; together with the net-PnL
t-statistic across folds they give `leak_suspected` = pooled mid-edge t > 2 or pooled hit rate > 0.53 or net-PnL
t > 2. It means "leak" only on a control market without signal (`synthetic:...,signal=0`), where no causal policy
can have an edge; on a market with signal the same numbers measure the (wanted) edge. See docs/walk-forward.md.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import InputError
from trainer.folds.metrics import edge_stats, t_statistic

FOLD_DIR = re.compile(r"^fold(\d+)$")
REQUIRED = ("fold", "folds", "win_rate", "net_pnl", "dir_entropy")
HOLD_METRICS = ("time_in_market", "hold_frac")
TABLE_METRICS = ("win_rate", "trades", "net_pnl", "gross_pnl", "fees", "sharpe", "sortino", "max_drawdown", "calmar",
                 "turnover_contracts", "hold_frac", "time_in_market", "mean_holding_seconds", "limit_fill_rate",
                 "dir_entropy", "eval_dir_entropy", "mid_edge", "mid_edge_tstat", "mid_hit_rate", "mid_edge_n")
EDGE_SUMS = ("mid_edge_n", "mid_edge", "mid_edge_sumsq", "mid_edge_wins")
"""The per-fold sufficient statistics of the mid edge (result.json) that pool exactly across folds."""


@dataclass(frozen=True)
class GateConfig:
    min_win_rate: float = 0.55
    """Every fold's out-of-sample win rate must be strictly above this."""
    floor_win_rate: float = 0.50
    """No fold's win rate may be below this."""
    min_dir_entropy_nats: float = 0.25 * math.log(4.0)
    """Training direction entropy (nats) at or above this on every fold (ln 4 = 1.386 is uniform, 0 collapsed)."""
    hold_frac_min: float = 0.30
    """Lowest acceptable evaluation hold fraction."""
    hold_frac_max: float = 0.70
    """Highest acceptable evaluation hold fraction."""
    hold_metric: str = "time_in_market"
    """The per-fold number the hold gate reads. 'time_in_market': the share of the continuous pass's decision
    intervals spent holding a position — the issue lists "hold fraction" beside "mean holding time", i.e. holding a
    position. 'hold_frac': the share of the policy's direction choices that are the HOLD action — not a behaviour
    on its own, because repeating the held direction keeps a position exactly as HOLD does (simulator rule 2)."""

    def __post_init__(self) -> None:
        for name in ("min_win_rate", "floor_win_rate", "hold_frac_min", "hold_frac_max"):
            v = getattr(self, name)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"GateConfig.{name} must be in [0, 1], got {v!r}")
        if not (math.isfinite(self.min_dir_entropy_nats) and self.min_dir_entropy_nats >= 0):
            raise ValueError(f"GateConfig.min_dir_entropy_nats must be finite and >= 0, got {self.min_dir_entropy_nats!r}")
        if self.hold_metric not in HOLD_METRICS:
            raise ValueError(f"GateConfig.hold_metric must be one of {HOLD_METRICS}, got {self.hold_metric!r}")
        if self.hold_frac_min > self.hold_frac_max:
            raise ValueError(f"GateConfig.hold_frac_max must be >= hold_frac_min, got {self.hold_frac_max!r}")


@dataclass(frozen=True)
class LeakageConfig:
    max_mid_edge_tstat: float = 2.0
    """Leak suspected when the pooled mid-edge t-statistic (all folds' nonzero steps) is above this."""
    max_mid_hit_rate: float = 0.53
    """Leak suspected when the pooled share of positive mid-edge steps is above this (0.5 under no edge)."""
    max_net_pnl_tstat: float = 2.0
    """Leak suspected when the net-PnL t-statistic across folds is above this (one-sided: losses are costs)."""

    def __post_init__(self) -> None:
        for name in ("max_mid_edge_tstat", "max_net_pnl_tstat"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"LeakageConfig.{name} must be finite and > 0, got {v!r}")
        if not (math.isfinite(self.max_mid_hit_rate) and 0.5 <= self.max_mid_hit_rate < 1.0):
            raise ValueError(f"LeakageConfig.max_mid_hit_rate must be in [0.5, 1), got {self.max_mid_hit_rate!r}")


def leakage(results: list[dict[str, Any]], net_pnl_tstat: float | None,
            cfg: LeakageConfig = LeakageConfig()) -> dict[str, Any]:
    """The leakage block of summary.json from the fold results (see the module docstring).

    Folds whose result.json predates the mid edge are listed in `folds_without_mid_edge` and left out of the pool;
    a statistic that cannot be computed (None: no folds with the edge, fewer than 2 nonzero steps, under 2 folds for
    the net-PnL t) raises no suspicion on its own."""
    with_edge = [r for r in results if all(r.get(k) is not None for k in EDGE_SUMS)]
    pooled = edge_stats([{k: r[k] for k in EDGE_SUMS} for r in with_edge])
    t, hit = pooled["mid_edge_tstat"], pooled["mid_hit_rate"]
    reasons = []
    if t is not None and t > cfg.max_mid_edge_tstat:
        reasons.append(f"pooled mid-edge t {t:.2f} > {cfg.max_mid_edge_tstat:g}")
    if hit is not None and hit > cfg.max_mid_hit_rate:
        reasons.append(f"pooled mid hit rate {hit:.3f} > {cfg.max_mid_hit_rate:g}")
    if net_pnl_tstat is not None and net_pnl_tstat > cfg.max_net_pnl_tstat:
        reasons.append(f"net-PnL t across folds {net_pnl_tstat:.2f} > {cfg.max_net_pnl_tstat:g}")
    per_fold = {str(r["fold"]): {"mid_edge": r["mid_edge"], "mid_edge_n": r["mid_edge_n"],
                                 **{k: v for k, v in edge_stats({k: r[k] for k in EDGE_SUMS}).items()
                                    if k in ("mid_edge_tstat", "mid_hit_rate")},
                                 "win_rate": r["win_rate"], "net_pnl": r["net_pnl"]} for r in with_edge}
    return {
        "rule": (f"leak suspected when pooled mid-edge t > {cfg.max_mid_edge_tstat:g}, pooled mid hit rate > "
                 f"{cfg.max_mid_hit_rate:g} or net-PnL t across folds > {cfg.max_net_pnl_tstat:g} "
                 "(meaningful on a signal=0 control market)"),
        "mid_edge": pooled["mid_edge"],
        "mid_edge_n": pooled["mid_edge_n"],
        "mid_edge_tstat": t,
        "mid_hit_rate": hit,
        "net_pnl_tstat": net_pnl_tstat,
        "folds": per_fold,
        "folds_without_mid_edge": sorted({r["fold"] for r in results} - {r["fold"] for r in with_edge}),
        "reasons": reasons,
        "leak_suspected": bool(reasons),
    }


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every RUN/fold<N>/result.json, sorted by fold; InputError for an unreadable one or a missing field."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, None, "run directory does not exist")
    results = []
    for d in sorted(run_dir.iterdir()):
        m = FOLD_DIR.match(d.name)
        path = d / "result.json"
        if not (m and path.is_file()):
            continue
        try:
            r = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(path, None, f"unreadable result: {exc}") from None
        if not isinstance(r, dict):
            raise InputError(path, None, "result must be a JSON object")
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise InputError(path, None, f"result lacks {missing}")
        if r["fold"] != int(m.group(1)):
            raise InputError(path, None, f"result says fold {r['fold']} but lives in {d.name}")
        results.append(r)
    results.sort(key=lambda r: r["fold"])
    return results


def _gate(rule: str, values: dict[int, float | None], ok) -> dict[str, Any]:
    """A fold fails when its value breaks the rule or is missing (None: a result.json without that metric)."""
    failing = sorted(f for f, v in values.items() if v is None or not ok(v))
    return {"rule": rule, "passed": bool(values) and not failing, "failing_folds": failing,
            "values": {str(f): v for f, v in sorted(values.items())}}


def gates(folds: list[dict[str, Any]], expected: int, cfg: GateConfig = GateConfig()) -> dict[str, dict[str, Any]]:
    win = {f["fold"]: float(f["win_rate"]) for f in folds}
    ent = {f["fold"]: float(f["dir_entropy"]) for f in folds}
    hold = {f["fold"]: None if f.get(cfg.hold_metric) is None else float(f[cfg.hold_metric]) for f in folds}
    present = {f["fold"] for f in folds}
    missing = [i for i in range(expected) if i not in present]
    return {
        "win_rate_every_fold": _gate(f"win_rate > {cfg.min_win_rate:g} on every fold", win,
                                     lambda v: v > cfg.min_win_rate),
        "win_rate_floor": _gate(f"no fold with win_rate < {cfg.floor_win_rate:g}", win,
                                lambda v: v >= cfg.floor_win_rate),
        "dir_entropy": _gate(f"training direction entropy >= {cfg.min_dir_entropy_nats:.3f} nats on every fold", ent,
                             lambda v: v >= cfg.min_dir_entropy_nats),
        "hold_frac": _gate(f"hold fraction ({cfg.hold_metric}) in [{cfg.hold_frac_min:g}, {cfg.hold_frac_max:g}] "
                           "on every fold", hold, lambda v: cfg.hold_frac_min <= v <= cfg.hold_frac_max),
        "complete": {"rule": f"all {expected} folds have a result", "passed": not missing, "failing_folds": missing,
                     "values": {}},
    }


def summarise(run_dir: str | Path, cfg: GateConfig = GateConfig(),
              leak_cfg: LeakageConfig = LeakageConfig()) -> dict[str, Any]:
    """The run's summary (what summary.json holds): `folds` (one object per fold: the metrics incl. `win_rate`, and
    `baselines`), `gates`, `verdict`, `net_pnl_tstat` (t of the per-fold net PnL against 0; None below 2 folds),
    `leakage` (the pooled mid edge and `leak_suspected`), and cross-fold aggregates. InputError when the run has no
    fold result at all."""
    run_dir = Path(run_dir)
    results = read_results(run_dir)
    if not results:
        raise InputError(run_dir, None, "no fold results (RUN/fold<N>/result.json): nothing to report")
    expected = max(int(r["folds"]) for r in results)
    folds = []
    for r in results:
        row = {k: r[k] for k in TABLE_METRICS if k in r}
        row.update({"fold": r["fold"], "eval_window": r.get("eval_window"), "action_freq": r.get("action_freq"),
                    "baselines": r.get("baselines", {}), "fold_mode": r.get("fold_mode", "independent")})
        folds.append(row)
    g = gates(folds, expected, cfg)
    missing = g["complete"]["failing_folds"]
    verdict = "incomplete" if missing else ("pass" if all(x["passed"] for x in g.values()) else "fail")
    net = [float(f["net_pnl"]) for f in folds]
    baseline_names = sorted({b for f in folds for b in f["baselines"]})
    net_t = t_statistic(net)
    return {
        "run_dir": str(run_dir),
        "folds": folds,
        "expected_folds": expected,
        "missing_folds": missing,
        "net_pnl_tstat": net_t,
        "leakage": leakage(results, net_t, leak_cfg),
        "aggregate": {
            "mean_win_rate": sum(f["win_rate"] for f in folds) / len(folds),
            "total_net_pnl": sum(net),
            "mean_net_pnl": sum(net) / len(net),
            "mean_sharpe": sum(float(f.get("sharpe", 0.0)) for f in folds) / len(folds),
            "baselines_total_net_pnl": {b: sum(float(f["baselines"][b]["net_pnl"]) for f in folds
                                               if b in f["baselines"]) for b in baseline_names},
        },
        "gates": g,
        "verdict": verdict,
    }
