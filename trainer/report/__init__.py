"""Cross-fold summary of a run: per-fold out-of-sample metrics, baselines, success gates and a verdict.

`summarise(run_dir)` reads RUN/fold<N>/result.json (written by `python -m trainer.train`) and returns the dict
that `python -m trainer.report` writes to RUN/summary.json. Pure file reading: no torch, no training code.

Headline (`headline` in summary.json, first in report.md): the verdict, the agent's edge over the best baseline
per bar with a 95 % interval and Hansen's SPA p-value, the per-trade PnL and Sharpe with intervals (Sharpe only when
the sample carries it) and the deflated Sharpe ratio over the trials, the control-run result in words, and the
interquartile mean over seeds. The statistics are trainer.report.stats; docs/walk-forward.md has the rules.

Gates (the seed plan's; thresholds in `GateConfig`), each evaluated over every fold present:
  win_rate_every_fold      out-of-sample win rate per round trip > 0.55 on every fold that traded
  win_rate_floor           no fold that traded below 0.50 (reported apart: "missed the target" vs "loses more often")
  dir_entropy              the training direction-choice entropy is not collapsed: >= 0.25 · ln 4 nats on every fold
  hold_frac                the evaluation hold fraction lies within [0.30, 0.70] on every fold; "hold fraction"
                           is read as the share of time holding a position (`time_in_market`, beside the mean
                           holding time), not the share of HOLD actions (`GateConfig.hold_metric`)
  complete                 every fold 0..K-1 has a result (K from the results' `folds`)
A fold with no round trip "stood aside": it has no win rate (not 0.000), the win-rate gates leave it out and list
it, and they fail only when no fold traded at all. (It still fails the hold gate: it held nothing.)
verdict: "pass" when every gate passes, "incomplete" when folds are missing, else "fail".

Leakage guard (`leakage` block, thresholds in `LeakageConfig`; not a gate, it does not change the verdict): the
guard judges a CONTROL run — the same config on a market without exploitable structure, laid out like the run
(`RUN/control/fold<N>/result.json`, or `--control DIR`). On the control the folds' cost-free mid edges
(trainer.folds.metrics.mid_edge) are pooled exactly into one t-statistic and hit rate; with the control's net-PnL
t across folds they give `leak_suspected` = pooled mid-edge t > 2 or pooled hit rate > 0.53 or net-PnL t > 2. The
same numbers on the run itself are the edge it found (wanted), reported as such. Without a control run the guard
says "no control run" and `leak_suspected` is null.

Seeds: RUN/fold<N>/result.json is seed 0 (a one-seed run keeps exactly that layout); extra training seeds S write
RUN/fold<N>/seed<S>/result.json. Tables and gates read seed 0; `seeds` aggregates net PnL over seeds per fold and
overall as an IQM with a 95 % stratified-bootstrap interval.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.fees import schedule_for_spec
from trainer.errors import InputError
from trainer.folds.metrics import edge_stats
from trainer.numeric import t_statistic
from trainer.report import stats

FOLD_DIR = re.compile(r"^fold(\d+)$")
SEED_DIR = re.compile(r"^seed(\d+)$")
REQUIRED = ("fold", "folds", "win_rate", "net_pnl", "dir_entropy")
HOLD_METRICS = ("time_in_market", "hold_frac")
STOOD_ASIDE = "stood aside"
# Annualised 5-minute-bar Sharpe / Sortino / Calmar stay in result.json but are not reported (trainer.report.stats)
TABLE_METRICS = ("win_rate", "trades", "net_pnl", "gross_pnl", "fees", "max_drawdown",
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
    min_control_steps: int = 100
    """A control with fewer pooled nonzero mid-edge steps than this (an agent that mostly stood aside) is reported
    as clean but with little power: at n = 100 a true hit rate of 0.6 is missed about half the time."""

    def __post_init__(self) -> None:
        for name in ("max_mid_edge_tstat", "max_net_pnl_tstat"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"LeakageConfig.{name} must be finite and > 0, got {v!r}")
        if not (isinstance(self.min_control_steps, int) and self.min_control_steps >= 0):
            raise ValueError(f"LeakageConfig.min_control_steps must be an int >= 0, got {self.min_control_steps!r}")
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


def _read_result(path: Path, fold: int) -> dict[str, Any]:
    try:
        r = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(path, None, f"unreadable result: {exc}") from None
    if not isinstance(r, dict):
        raise InputError(path, None, "result must be a JSON object")
    missing = [k for k in REQUIRED if k not in r]
    if missing:
        raise InputError(path, None, f"result lacks {missing}")
    if r["fold"] != fold:
        raise InputError(path, None, f"result says fold {r['fold']} but lives in fold{fold}")
    _check_samples(r, path)
    return r


SAMPLES = ("bar_pnl", "trade_pnl", "day_pnl")
"""The per-bar / per-trade / per-day PnL lists of result.json behind the report's statistics."""


def _check_samples(r: dict[str, Any], path: Path) -> None:
    """InputError naming the file, the field and the rule: every sample a list of finite numbers, and each
    baseline's bar PnL paired with the agent's (same number of bars)."""
    fields = [(k, r.get(k)) for k in SAMPLES]
    fields += [(f"baselines.{b}.bar_pnl", m.get("bar_pnl")) for b, m in (r.get("baselines") or {}).items()
               if isinstance(m, dict)]
    for name, v in fields:
        if v is None:
            continue
        if not (isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                            and math.isfinite(x) for x in v)):
            raise InputError(path, name, "must be a list of finite numbers")
    n = len(r["bar_pnl"]) if r.get("bar_pnl") is not None else None
    for b, m in (r.get("baselines") or {}).items():
        if n is not None and isinstance(m, dict) and m.get("bar_pnl") is not None and len(m["bar_pnl"]) != n:
            raise InputError(path, f"baselines.{b}.bar_pnl",
                             f"{len(m['bar_pnl'])} bars, the agent's bar_pnl has {n}: they must be paired")


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every RUN/fold<N>/result.json (seed 0), sorted by fold; InputError for an unreadable one or a missing field."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, None, "run directory does not exist")
    results = []
    for d in sorted(run_dir.iterdir()):
        m = FOLD_DIR.match(d.name)
        if m and (d / "result.json").is_file():
            results.append(_read_result(d / "result.json", int(m.group(1))))
    results.sort(key=lambda r: r["fold"])
    return results


def read_seed_results(run_dir: Path) -> dict[int, dict[int, dict[str, Any]]]:
    """{fold: {seed: result}}: seed 0 from RUN/fold<N>/result.json, seed S from RUN/fold<N>/seed<S>/result.json."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for r in read_results(run_dir):
        out[r["fold"]] = {0: r}
    for fold, seeds in out.items():
        fold_dir = Path(run_dir) / f"fold{fold}"
        for d in sorted(fold_dir.iterdir()):
            m = SEED_DIR.match(d.name)
            if m and int(m.group(1)) > 0 and (d / "result.json").is_file():
                seeds[int(m.group(1))] = _read_result(d / "result.json", fold)
    return out


def stood_aside(result: dict[str, Any]) -> bool:
    """A fold whose segment backtests closed no round trip: it chose not to trade, it did not lose."""
    return int(result.get("trades", 1) or 0) == 0


def gate_row(result: dict[str, Any]) -> dict[str, Any]:
    """The part of a fold's summary row that `gates` reads, from its result.json: the table metrics, `fold`,
    `outcome` (traded or stood aside) and `win_rate` (None when it stood aside)."""
    aside = stood_aside(result)
    return {**{k: result[k] for k in TABLE_METRICS if k in result}, "fold": result["fold"],
            "outcome": STOOD_ASIDE if aside else "traded", "win_rate": None if aside else result["win_rate"]}


def _gate(rule: str, values: dict[int, float | None], ok, aside: tuple[int, ...] = ()) -> dict[str, Any]:
    """A fold fails when its value breaks the rule or is missing (None: a result.json without that metric); folds
    in `aside` (stood aside) are neither passed nor failed, but the gate needs at least one judged fold."""
    judged = {f: v for f, v in values.items() if f not in aside}
    failing = sorted(f for f, v in judged.items() if v is None or not ok(v))
    out = {"rule": rule, "passed": bool(judged) and not failing, "failing_folds": failing,
           "values": {str(f): (STOOD_ASIDE if f in aside else v) for f, v in sorted(values.items())}}
    if aside:
        out["stood_aside_folds"] = sorted(aside)
    return out


def gates(folds: list[dict[str, Any]], expected: int, cfg: GateConfig = GateConfig()) -> dict[str, dict[str, Any]]:
    aside = tuple(f["fold"] for f in folds if f.get("outcome") == STOOD_ASIDE)
    win = {f["fold"]: None if f["win_rate"] is None else float(f["win_rate"]) for f in folds}
    ent = {f["fold"]: float(f["dir_entropy"]) for f in folds}
    hold = {f["fold"]: None if f.get(cfg.hold_metric) is None else float(f[cfg.hold_metric]) for f in folds}
    present = {f["fold"] for f in folds}
    missing = [i for i in range(expected) if i not in present]
    return {
        "win_rate_every_fold": _gate(f"win_rate > {cfg.min_win_rate:g} on every fold that traded", win,
                                     lambda v: v > cfg.min_win_rate, aside),
        "win_rate_floor": _gate(f"no fold that traded with win_rate < {cfg.floor_win_rate:g}", win,
                                lambda v: v >= cfg.floor_win_rate, aside),
        "dir_entropy": _gate(f"training direction entropy >= {cfg.min_dir_entropy_nats:.3f} nats on every fold", ent,
                             lambda v: v >= cfg.min_dir_entropy_nats),
        "hold_frac": _gate(f"hold fraction ({cfg.hold_metric}) in [{cfg.hold_frac_min:g}, {cfg.hold_frac_max:g}] "
                           "on every fold", hold, lambda v: cfg.hold_frac_min <= v <= cfg.hold_frac_max),
        "complete": {"rule": f"all {expected} folds have a result", "passed": not missing, "failing_folds": missing,
                     "values": {}},
    }


def guard(results: list[dict[str, Any]], control_dir: Path | None,
          cfg: LeakageConfig = LeakageConfig()) -> dict[str, Any]:
    """The leakage block: the guard on the control run (when there is one) and the run's own edge, in words."""
    signal = leakage(results, t_statistic([float(r["net_pnl"]) for r in results]), cfg)
    edge_found = signal["leak_suspected"]  # the same rules, read on the run itself: an edge, not a leak
    found = "edge found" if edge_found else "no edge found"
    why = f" (signal market: {'; '.join(signal['reasons'])})" if edge_found else ""
    out: dict[str, Any] = {"rule": signal["rule"], "signal": signal, "edge_found": edge_found, "control_dir": None,
                           "control": None, "leak_suspected": None, "control_missing_folds": []}
    if control_dir is None:
        out["words"] = (f"no control run: the guard cannot judge a leak; {found} on the signal market (pooled mid-edge "
                        f"t {_num(signal['mid_edge_tstat'])}), where an edge is the point, not a leak")
        return out
    control = read_results(control_dir)
    if not control:
        raise InputError(control_dir, None, "control run has no fold results (control/fold<N>/result.json)")
    judged = leakage(control, t_statistic([float(r["net_pnl"]) for r in control]), cfg)
    out.update(control_dir=str(control_dir), control=judged, leak_suspected=judged["leak_suspected"],
               control_missing_folds=sorted({r["fold"] for r in results} - {r["fold"] for r in control}))
    if judged["leak_suspected"]:
        out["words"] = "LEAK SUSPECTED: edge on the control market (" + "; ".join(judged["reasons"]) + ")"
    else:
        n = judged["mid_edge_n"]
        weak = (f" (only {n} decided steps on the control: little power)" if n < cfg.min_control_steps else "")
        out["words"] = f"{found} on the signal market, none on the control{weak}{why}"
    return out


def fmt_p(p: float) -> str:
    """A p-value for the report: three decimals, or "< 0.001" (a bootstrap p of 0 only says below 1 / reps)."""
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def _num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _concat(results: list[dict[str, Any]], key: str) -> np.ndarray | None:
    """The folds' samples end to end (eval windows are disjoint); None when no fold has them (older result.json)."""
    parts = [r[key] for r in results if r.get(key) is not None]
    return np.asarray([v for p in parts for v in p], dtype=np.float64) if parts else None


def edge_vs_baselines(results: list[dict[str, Any]], seed: int = 0) -> dict[str, Any] | None:
    """trainer.report.stats.edge_vs_baselines on the bar PnL of every fold whose agent and baselines all carry
    `bar_pnl` (paired bar by bar within a fold, folds end to end)."""
    usable = [r for r in results if r.get("bar_pnl") is not None and r.get("baselines")
              and all(b.get("bar_pnl") is not None for b in r["baselines"].values())]
    names = sorted(set.intersection(*[set(r["baselines"]) for r in usable])) if usable else []
    if not names:
        return None
    agent = [v for r in usable for v in r["bar_pnl"]]
    base = {b: [v for r in usable for v in r["baselines"][b]["bar_pnl"]] for b in names}
    out = stats.edge_vs_baselines(agent, base, seed=seed)
    if out is not None:
        out["folds"] = [r["fold"] for r in usable]
    return out


def seed_spread(by_fold: dict[int, dict[int, dict[str, Any]]], seed: int = 0) -> dict[str, Any]:
    """Net PnL over training seeds: IQM with a 95 % stratified-bootstrap interval per fold and over all folds."""
    per_fold = {}
    for fold, seeds in sorted(by_fold.items()):
        net = [float(seeds[s]["net_pnl"]) for s in sorted(seeds)]
        per_fold[str(fold)] = {"seeds": sorted(seeds), "net_pnl": net, **stats.iqm_interval([net], seed=seed)}
    overall = stats.iqm_interval([f["net_pnl"] for f in per_fold.values()], seed=seed)
    n_seeds = max(len(f["seeds"]) for f in per_fold.values())
    return {"metric": "net_pnl", "n_seeds": n_seeds, "folds": per_fold, **overall,
            "note": None if n_seeds > 1 else "one seed per fold: no spread over seeds"}


def fees_header(run_dir: Path) -> dict[str, Any] | None:
    """The venue fee schedule for the run's data (trainer.data.fees, from run.json's data SPEC) beside the fees the
    simulator charged (run.json's SimConfig). None without run.json. `consistent` says whether the charged fees
    follow the schedule: run.json's `fees.schedule` names it, or the schedule is per unit only and equal."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
        cfg = info["config"]
        spec, sim = cfg["data"], cfg["sim"]
        charged = (float(sim["maker_fee"]), float(sim["taker_fee"]))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InputError(path, None, f"unreadable run.json (need config.data and config.sim fees): {exc!r}") from None
    try:
        sch = schedule_for_spec(spec)
    except ValueError as exc:
        return {"schedule": None, "charged": list(charged), "consistent": False, "text": f"no fee schedule: {exc}"}
    per_unit_only = not (sch.maker_bps or sch.taker_bps or sch.sell_bps or sch.sell_per_unit)
    applied = (info.get("fees") or {}).get("schedule")
    consistent = applied == sch.name or (applied is None and per_unit_only
                                        and charged == (sch.maker_per_unit, sch.taker_per_unit))
    text = (f"{sch.describe()} [{sch.source}]; charged per {sch.unit} per fill: maker {charged[0]:g}, taker "
            f"{charged[1]:g}" + ("" if consistent else " — NOT from this schedule: the run's fees do not match the "
                                                      "venue; read PnL with care"))
    return {"schedule": sch.name, "unit": sch.unit, "charged": list(charged), "consistent": consistent, "text": text}


def summarise(run_dir: str | Path, cfg: GateConfig = GateConfig(), leak_cfg: LeakageConfig = LeakageConfig(),
              control_dir: str | Path | None = None, n_trials: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The run's summary (what summary.json holds): `headline`, `folds` (one object per fold: the metrics incl.
    `win_rate` (None when the fold stood aside), `outcome`, `trade_stats`, `baselines`, the [start, stop) rows it
    trained and was evaluated on, `train_window` and `eval_window`), `gates`, `verdict`,
    `net_pnl_tstat`, `stats` (per-trade and per-day PnL statistics, edge vs baselines), `seeds`, `leakage` (the
    guard) and cross-fold aggregates. InputError when the run has no fold result at all.

    control_dir: the control run (default RUN/control when it exists). n_trials: configurations × seeds tried for
    this result (the deflated Sharpe's N); default the number of seeds found. seed: of the bootstraps."""
    run_dir = Path(run_dir)
    results = read_results(run_dir)
    if not results:
        raise InputError(run_dir, None, "no fold results (RUN/fold<N>/result.json): nothing to report")
    if control_dir is None and (run_dir / "control").is_dir():
        control_dir = run_dir / "control"
    by_fold = read_seed_results(run_dir)
    seeds = seed_spread(by_fold, seed)
    trials = seeds["n_seeds"] if n_trials is None else n_trials
    if not (isinstance(trials, int) and trials >= 1):
        raise ValueError(f"n_trials must be an int >= 1, got {trials!r}")
    expected = max(int(r["folds"]) for r in results)
    folds = []
    for r in results:
        row = gate_row(r)
        row.update({"train_window": r.get("train_window"), "eval_window": r.get("eval_window"),
                    "action_freq": r.get("action_freq"),
                    "baselines": {b: {k: v for k, v in m.items() if k != "bar_pnl"}
                                  for b, m in r.get("baselines", {}).items()},
                    "fold_mode": r.get("fold_mode", "independent"),
                    "trade_stats": None if r.get("trade_pnl") is None
                    else stats.pnl_summary(r["trade_pnl"], "trade", trials, seed=seed)})
        folds.append(row)
    g = gates(folds, expected, cfg)
    missing = g["complete"]["failing_folds"]
    verdict = "incomplete" if missing else ("pass" if all(x["passed"] for x in g.values()) else "fail")
    net = [float(f["net_pnl"]) for f in folds]
    baseline_names = sorted({b for f in folds for b in f["baselines"]})
    trades, days = _concat(results, "trade_pnl"), _concat(results, "day_pnl")
    # the DSR's V: the spread of the per-trade Sharpe over the seeds tried, when there are seeds to spread
    seed_sr = [stats.sharpe(np.asarray([v for f in by_fold.values() if s in f for v in f[s].get("trade_pnl") or []]))
               for s in sorted({s for f in by_fold.values() for s in f})]
    seed_sr = [x for x in seed_sr if x is not None]
    sr_var = float(np.var(seed_sr, ddof=1)) if len(seed_sr) >= 2 else None
    run_stats = {
        "per_trade": None if trades is None else stats.pnl_summary(trades, "trade", trials, sr_var, seed),
        "per_day": None if days is None else stats.pnl_summary(days, "day", trials, seed=seed),
        "edge_vs_baselines": edge_vs_baselines(results, seed),
        "n_trials": trials,
        "sr_var_trials": sr_var,
    }
    leak = guard(results, None if control_dir is None else Path(control_dir), leak_cfg)
    fees = fees_header(run_dir)
    summary = {
        "run_dir": str(run_dir),
        "fees": fees,
        "folds": folds,
        "expected_folds": expected,
        "missing_folds": missing,
        "stood_aside_folds": [f["fold"] for f in folds if f["outcome"] == STOOD_ASIDE],
        "net_pnl_tstat": t_statistic(net),
        "leakage": leak,
        "stats": run_stats,
        "seeds": seeds,
        "aggregate": {
            "mean_win_rate": (None if all(f["win_rate"] is None for f in folds) else
                              float(np.mean([f["win_rate"] for f in folds if f["win_rate"] is not None]))),
            "total_net_pnl": sum(net),
            "mean_net_pnl": sum(net) / len(net),
            "baselines_total_net_pnl": {b: sum(float(f["baselines"][b]["net_pnl"]) for f in folds
                                               if b in f["baselines"]) for b in baseline_names},
        },
        "gates": g,
        "verdict": verdict,
    }
    summary["headline"] = headline(summary)
    return summary


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """What a user reads first, as values and as sentences (`lines`, the top of report.md)."""
    st, seeds, leak = summary["stats"], summary["seeds"], summary["leakage"]
    lines = [f"Verdict: {summary['verdict'].upper()} ({len(summary['folds'])}/{summary['expected_folds']} folds"
             + (f"; stood aside on fold {', '.join(map(str, summary['stood_aside_folds']))}"
                if summary["stood_aside_folds"] else "") + ")."]
    e = st["edge_vs_baselines"]
    if e is None:
        lines.append("Edge vs best baseline: not computed (result.json without paired bar PnL, or < "
                     f"{stats.MIN_BARS} bars).")
    else:
        ci = "–" if e["edge_ci"] is None else f"[{e['edge_ci'][0]:+.2f}, {e['edge_ci'][1]:+.2f}]"
        p_best = "not tested (too few differing bars)" if e["p_value_best"] is None else fmt_p(e["p_value_best"])
        beats = ("not tested" if e["p_value_all"] is None else
                 f"{'yes' if e['p_value_all'] < 0.05 else 'no'} (largest p {fmt_p(e['p_value_all'])})")
        lines.append(f"Edge vs best baseline ({e['best']}): {e['edge_mean']:+.2f} per bar, 95 % CI {ci} "
                     f"({e['edge_total']:+.2f} over {e['n_bars']} bars); SPA p {p_best}; "
                     f"beats every baseline: {beats}.")
    t = st["per_trade"]
    if t is not None and t["n"]:
        ci = "" if t["mean_ci"] is None else f" [{t['mean_ci'][0]:+.2f}, {t['mean_ci'][1]:+.2f}]"
        sr = (f"Sharpe per trade {t['sharpe']:.3f}"
              + ("" if t["sharpe_ci"] is None else f" [{t['sharpe_ci'][0]:.3f}, {t['sharpe_ci'][1]:.3f}]")
              + ("" if t["dsr"] is None else f", deflated Sharpe {t['dsr']:.3f} over {t['n_trials']} trial(s)")
              if t["sharpe"] is not None else f"Sharpe {t['sharpe_note']}")
        lines.append(f"Per trade: mean {t['mean']:+.2f}{ci} over {t['n']} trades; {sr}.")
    else:
        lines.append("Per trade: no closed trades in the continuous passes.")
    lines.append(f"Control: {leak['words']}.")
    lines.append(f"Seeds: {seeds['note']}." if seeds["note"] else
                 f"Seeds: IQM net PnL {seeds['iqm']:+.2f}"
                 + ("" if seeds["ci"] is None else f" [{seeds['ci'][0]:+.2f}, {seeds['ci'][1]:+.2f}]")
                 + f" over {seeds['n_runs']} runs ({seeds['n_seeds']} seeds × {seeds['n_strata']} folds).")
    return {"verdict": summary["verdict"], "edge_vs_best_baseline": None if e is None else
            {k: e[k] for k in ("best", "edge_mean", "edge_ci", "edge_total", "n_bars", "p_value_best", "p_value_all")},
            "control": leak["words"], "leak_suspected": leak["leak_suspected"],
            "seeds_iqm": None if seeds["note"] else {"iqm": seeds["iqm"], "ci": seeds["ci"]}, "lines": lines}
