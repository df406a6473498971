"""`python -m trainer.report --run-dir RUN [--control DIR] [--trials N] [--strict]`: summary.json, report.md,
equity.png, training.png in RUN.

Exit codes: 0 written (and, with --strict, every gate passed); 1 with --strict when a gate fails or folds are
missing; 2 bad input (no run directory, no fold results, an unreadable result.json).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainer.errors import EXIT_OK, exit_code_for
from trainer.fsutil import atomic_write_text
from trainer.report import fmt_p, summarise
from trainer.report.plots import plot_equity, plot_training

EXIT_GATE_FAILED = 1


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 1e4 else f"{v:.4g}"
    return str(v)


def _ci(ci: list[float] | None, digits: int = 2) -> str:
    return "" if ci is None else f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def render_markdown(summary: dict[str, Any], plots: list[str]) -> str:
    """The headline first, then the folds as rows (agent, baselines' net PnL and win rate beside), the statistics,
    the gates and the leakage guard."""
    folds = summary["folds"]
    baselines = sorted({b for f in folds for b in f["baselines"]})
    cols = [("trades", "trades"), ("net_pnl", "net PnL"), ("fees", "fees"), ("max_drawdown", "max DD"),
            ("hold_frac", "hold"), ("time_in_market", "in market"), ("mean_holding_seconds", "mean hold s"),
            ("dir_entropy", "dir H (train)")]
    head = ["fold", "outcome", "win rate", "mean PnL / trade [95 % CI]"] + [c[1] for c in cols]
    seeds = summary["seeds"]
    if seeds["n_seeds"] > 1:
        head.append("IQM net PnL over seeds [95 % CI]")
    for b in baselines:
        head += [f"{b} net PnL", f"{b} win"]
    lines = [f"# Walk-forward report: {summary['run_dir']}", ""]
    if summary.get("fees"):
        lines += [f"Fees: {summary['fees']['text']}.", ""]
    lines += [f"**{summary['headline']['lines'][0]}**", ""] + [f"- {x}" for x in summary["headline"]["lines"][1:]]
    lines += ["", "## Out-of-sample results (agent, greedy, seed 0) and baselines on the same windows", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in folds:
        ts = f.get("trade_stats")
        per_trade = "–" if not ts or not ts["n"] else f"{ts['mean']:.2f}{_ci(ts['mean_ci'])} (n {ts['n']})"
        row = [str(f["fold"]), f["outcome"], "–" if f["win_rate"] is None else _fmt(f["win_rate"]), per_trade]
        row += [_fmt(f.get(k)) for k, _ in cols]
        if seeds["n_seeds"] > 1:
            sf = seeds["folds"][str(f["fold"])]
            row.append(f"{sf['iqm']:.2f}{_ci(sf['ci'])} ({len(sf['seeds'])})")
        for b in baselines:
            m = f["baselines"].get(b, {})
            row += [_fmt(m.get("net_pnl")), "–" if not m.get("trades", 1) else _fmt(m.get("win_rate"))]
        lines.append("| " + " | ".join(row) + " |")
    agg = summary["aggregate"]
    lines += ["", f"Mean win rate over the folds that traded {_fmt(agg['mean_win_rate'])}, total net PnL "
              f"{_fmt(agg['total_net_pnl'], 2)}" + "".join(f", {b} {_fmt(v, 2)}"
                                                          for b, v in agg["baselines_total_net_pnl"].items()) + "."]
    lines += render_stats(summary["stats"])
    lines += ["", "## Gates", "", "| gate | rule | passed | failing folds |", "|---|---|---|---|"]
    for name, g in summary["gates"].items():
        aside = f" (stood aside: {', '.join(map(str, g['stood_aside_folds']))})" if g.get("stood_aside_folds") else ""
        lines.append(f"| {name} | {g['rule']} | {_fmt(g['passed'])} | "
                     f"{', '.join(map(str, g['failing_folds'])) or '–'}{aside} |")
    lines += render_leakage(summary["leakage"])
    if plots:
        lines += ["", "## Figures", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def render_stats(st: dict[str, Any]) -> list[str]:
    """Per-trade and per-day PnL with intervals, Sharpe at the horizons the sample carries, the reality check."""
    lines = ["", "## Statistics (all folds, continuous pass; 95 % bootstrap intervals)", "",
             "| horizon | n | mean PnL | Sharpe | PSR(0) | deflated Sharpe |", "|---|---|---|---|---|---|"]
    for key in ("per_trade", "per_day"):
        t = st[key]
        if t is None:
            continue
        sr = (f"{t['sharpe']:.3f}{_ci(t['sharpe_ci'], 3)}" + (" (× √252)" if t["annualised"] else "")
              if t["sharpe"] is not None else t["sharpe_note"])
        lines.append(f"| {t['horizon']} | {t['n']} | {_fmt(t['mean'], 2)}{_ci(t['mean_ci'])} | {sr} | "
                     f"{_fmt(t['psr'])} | {_fmt(t['dsr'])} |")
    lines += ["", f"Deflated Sharpe over {st['n_trials']} trial(s) (configurations × seeds); Sharpe shown per trade "
              f"when n ≥ 30 and per day (× √252) when n ≥ 20 days, never on annualised 5-minute bars "
              "(docs/walk-forward.md)."]
    e = st["edge_vs_baselines"]
    if e is not None:
        lines += ["", "| vs baseline | its mean PnL / bar | agent − it, per bar [95 % CI] | SPA p |", "|---|---|---|---|"]
        for b, r in e["baselines"].items():
            lines.append(f"| {b}{' (best)' if b == e['best'] else ''} | {r['mean_pnl']:.2f} | "
                         f"{r['edge_mean']:+.2f}{_ci(r['edge_ci'])} | {'–' if r['spa_p_value'] is None else fmt_p(r['spa_p_value'])} |")
    return lines


def render_leakage(leak: dict[str, Any]) -> list[str]:
    """The leakage-guard section: the verdict in words, then the control's and the run's pooled mid edges."""
    lines = ["", "## Leakage guard", "", f"**{leak['words']}**.", "",
             "Cost-free mid edge: the position decided at each step times the next mid move (fees and spread left "
             "out). The guard judges a control run without exploitable structure (`signal=0`), where a causal policy "
             "has none, so an edge there means the policy sees the future; on the signal market the same numbers are "
             f"the edge the agent found. Rule: {leak['rule']}."]
    for name, block in (("control", leak["control"]), ("signal market", leak["signal"])):
        if block is None:
            continue
        lines += ["", f"{name}:", "", "| fold | mid edge | steps | mid-edge t | mid hit rate | win rate | net PnL |",
                  "|---|---|---|---|---|---|---|"]
        for fold, f in block["folds"].items():
            lines.append(f"| {fold} | {_fmt(f['mid_edge'], 2)} | {f['mid_edge_n']} | {_fmt(f['mid_edge_tstat'], 2)} "
                         f"| {_fmt(f['mid_hit_rate'])} | {_fmt(f['win_rate'])} | {_fmt(f['net_pnl'], 2)} |")
        lines.append(f"| pooled | {_fmt(block['mid_edge'], 2)} | {block['mid_edge_n']} | "
                     f"{_fmt(block['mid_edge_tstat'], 2)} | {_fmt(block['mid_hit_rate'])} | | |")
        lines.append(f"Net-PnL t across folds {_fmt(block['net_pnl_tstat'], 2)}.")
        if block["folds_without_mid_edge"]:
            lines.append(f"Folds without a mid edge in result.json (left out): "
                         f"{', '.join(map(str, block['folds_without_mid_edge']))}.")
    if leak["control_missing_folds"]:
        lines.append(f"Control run lacks folds {', '.join(map(str, leak['control_missing_folds']))}.")
    return lines


def write_report(run_dir: Path, control_dir: Path | None = None, n_trials: int | None = None) -> dict[str, Any]:
    summary = summarise(run_dir, control_dir=control_dir, n_trials=n_trials)
    fold_ids = [f["fold"] for f in summary["folds"]]
    plots = [name for name, fn in (("equity.png", plot_equity), ("training.png", plot_training))
             if fn(run_dir, fold_ids, run_dir / name)]
    summary["plots"] = plots
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    atomic_write_text(run_dir / "report.md", render_markdown(summary, plots))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.report",
                                description="Summarise a walk-forward run: summary.json, report.md and PNGs in RUN.")
    p.add_argument("--run-dir", required=True, type=Path, help="run directory holding fold<N>/result.json")
    p.add_argument("--control", type=Path, default=None,
                   help="control run (same config on a market without signal; default RUN/control when present)")
    p.add_argument("--trials", type=int, default=None,
                   help="configurations x seeds tried for this result: the deflated Sharpe's N (default: seeds found)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a gate fails or folds are missing")
    args = p.parse_args(argv)
    try:
        summary = write_report(args.run_dir, args.control, args.trials)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exit_code_for(exc)
    print(json.dumps({"event": "report", "run_dir": str(args.run_dir), "verdict": summary["verdict"],
                      "folds": len(summary["folds"]), "net_pnl_tstat": summary["net_pnl_tstat"],
                      "failed_gates": [k for k, g in summary["gates"].items() if not g["passed"]],
                      "leak_suspected": summary["leakage"]["leak_suspected"],
                      "control": summary["leakage"]["words"]}), flush=True)
    if args.strict and summary["verdict"] != "pass":
        return EXIT_GATE_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
