"""`python -m trainer.report --run-dir RUN [--strict]`: summary.json, report.md, equity.png, training.png in RUN.

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
from trainer.report import summarise
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


def render_markdown(summary: dict[str, Any], plots: list[str]) -> str:
    """Folds as rows, the agent's metrics first and the baselines' net PnL and win rate beside them."""
    folds = summary["folds"]
    baselines = sorted({b for f in folds for b in f["baselines"]})
    cols = [("win_rate", "win rate"), ("trades", "trades"), ("net_pnl", "net PnL"), ("fees", "fees"),
            ("sharpe", "Sharpe"), ("max_drawdown", "max DD"), ("hold_frac", "hold"),
            ("time_in_market", "in market"), ("mean_holding_seconds", "mean hold s"),
            ("dir_entropy", "dir H (train)")]
    head = ["fold"] + [c[1] for c in cols]
    for b in baselines:
        head += [f"{b} net PnL", f"{b} win"]
    lines = [f"# Walk-forward report: {summary['run_dir']}", "",
             f"**Verdict: {summary['verdict'].upper()}**  ·  folds {len(folds)}/{summary['expected_folds']}"
             f"  ·  net-PnL t-statistic across folds: {_fmt(summary['net_pnl_tstat'], 2)}", "",
             "## Out-of-sample results (agent, greedy) and baselines on the same windows", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in folds:
        row = [str(f["fold"])] + [_fmt(f.get(k)) for k, _ in cols]
        for b in baselines:
            m = f["baselines"].get(b, {})
            row += [_fmt(m.get("net_pnl")), _fmt(m.get("win_rate"))]
        lines.append("| " + " | ".join(row) + " |")
    agg = summary["aggregate"]
    lines += ["", f"Mean win rate {_fmt(agg['mean_win_rate'])}, total net PnL {_fmt(agg['total_net_pnl'], 2)}"
              + "".join(f", {b} {_fmt(v, 2)}" for b, v in agg["baselines_total_net_pnl"].items()) + ".", "",
              "Sharpe / Sortino / Calmar: 5-minute bar PnL of the continuous pass, annualised by sqrt(252 × bars per "
              "session day); see docs/walk-forward.md.", "", "## Gates", "", "| gate | rule | passed | failing folds |",
              "|---|---|---|---|"]
    for name, g in summary["gates"].items():
        lines.append(f"| {name} | {g['rule']} | {_fmt(g['passed'])} | {', '.join(map(str, g['failing_folds'])) or '–'} |")
    lines += render_leakage(summary["leakage"])
    if plots:
        lines += ["", "## Figures", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def render_leakage(leak: dict[str, Any]) -> list[str]:
    """The leakage-guard section: per-fold and pooled mid edge, hit rate, net-PnL t and the verdict."""
    verdict = "LEAK SUSPECTED: " + "; ".join(leak["reasons"]) if leak["leak_suspected"] else "no leak suspected"
    lines = ["", "## Leakage guard", "",
             "Cost-free mid edge: the position decided at each step times the next mid move (fees and spread left "
             "out). On a control market without signal (`signal=0`) a causal policy has none, so an edge there "
             "means the policy sees the future; on a market with signal it is the edge the agent found. "
             f"Rule: {leak['rule']}.", "",
             "| fold | mid edge | steps | mid-edge t | mid hit rate | win rate | net PnL |",
             "|---|---|---|---|---|---|---|"]
    for fold, f in leak["folds"].items():
        lines.append(f"| {fold} | {_fmt(f['mid_edge'], 2)} | {f['mid_edge_n']} | {_fmt(f['mid_edge_tstat'], 2)} | "
                     f"{_fmt(f['mid_hit_rate'])} | {_fmt(f['win_rate'])} | {_fmt(f['net_pnl'], 2)} |")
    lines.append(f"| pooled | {_fmt(leak['mid_edge'], 2)} | {leak['mid_edge_n']} | {_fmt(leak['mid_edge_tstat'], 2)} | "
                 f"{_fmt(leak['mid_hit_rate'])} | | |")
    lines += ["", f"Net-PnL t across folds {_fmt(leak['net_pnl_tstat'], 2)}. **{verdict}**."]
    if leak["folds_without_mid_edge"]:
        lines.append(f"Folds without a mid edge in result.json (left out): "
                     f"{', '.join(map(str, leak['folds_without_mid_edge']))}.")
    return lines


def write_report(run_dir: Path) -> dict[str, Any]:
    summary = summarise(run_dir)
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
    p.add_argument("--strict", action="store_true", help="exit 1 when a gate fails or folds are missing")
    args = p.parse_args(argv)
    try:
        summary = write_report(args.run_dir)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exit_code_for(exc)
    print(json.dumps({"event": "report", "run_dir": str(args.run_dir), "verdict": summary["verdict"],
                      "folds": len(summary["folds"]), "net_pnl_tstat": summary["net_pnl_tstat"],
                      "failed_gates": [k for k, g in summary["gates"].items() if not g["passed"]],
                      "leak_suspected": summary["leakage"]["leak_suspected"]}), flush=True)
    if args.strict and summary["verdict"] != "pass":
        return EXIT_GATE_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
