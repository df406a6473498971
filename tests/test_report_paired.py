"""trainer.report.paired on hand-built runs whose answers are counted by hand, and scripts/experiment.py's tables
on an experiment directory laid out as it writes one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.report.paired import baseline_edge, paired, seed_gates

REPO = Path(__file__).resolve().parents[1]


def _run(fold: int, net: float, win: float, trades: int, tim: float = 0.5, ofi: float = 0.0, ofi_max: float = 0.0,
         entropy: float = 1.3) -> dict:
    return {"fold": fold, "folds": 2, "net_pnl": net, "win_rate": win, "trades": trades, "time_in_market": tim,
            "dir_entropy": entropy, "baselines": {"ofi_rule": {"net_pnl": ofi}, "ofi_rule_max": {"net_pnl": ofi_max}}}


def test_seed_gates_pass_fail_and_incomplete_per_seed():
    runs = {
        (0, 0): _run(0, 10, 0.60, 10), (0, 1): _run(1, 10, 0.58, 10),                # every gate
        (1, 0): _run(0, 10, 0.60, 10), (1, 1): _run(1, 10, 0.60, 10, tim=0.75),      # over the hold band
        (2, 0): _run(0, 10, 0.54, 10), (2, 1): _run(1, 10, 0.49, 10),                # 0.54 not > 0.55; 0.49 < 0.50
        (3, 0): _run(0, 10, 0.60, 10),                                               # fold 1 missing
        (4, 0): _run(0, 10, 0.60, 10), (4, 1): _run(1, 0, 0.0, 0, tim=0.0),          # fold 1 stood aside
    }
    g = seed_gates(runs, folds=2)
    assert g["passed"] == [0]
    assert g["failed"] == [1, 2, 4]
    assert g["incomplete"] == [3]
    assert g["why"][1] == ["hold_frac"]
    assert g["why"][2] == ["win_rate_every_fold", "win_rate_floor"]
    # a fold that stood aside is left out of the win-rate gates, but it held nothing: the hold gate fails
    assert g["why"][4] == ["hold_frac"]


def test_paired_counts_and_changes_by_hand():
    base = {(0, 0): _run(0, 100, 0.50, 10), (0, 1): _run(1, 200, 0.60, 20), (1, 0): _run(0, -50, 0.40, 10),
            (1, 1): _run(1, 0, 0.0, 0)}
    other = {(0, 0): _run(0, 90, 0.55, 8), (0, 1): _run(1, 250, 0.58, 12), (1, 0): _run(0, -40, 0.45, 6),
             (1, 1): _run(1, 10, 0.70, 4), (2, 0): _run(0, 1, 0.9, 1)}   # (2, 0) has no base: not a pair
    p = paired(base, other)
    assert p["pairs"] == 4
    assert p["win_pairs"] == 3            # (1, 1) stood aside under the base
    assert p["win_up"] == 2 and p["win_down"] == 1
    assert p["win_change_mean"] == pytest.approx((0.05 - 0.02 + 0.05) / 3)
    assert p["win_change_range"] == pytest.approx([-0.02, 0.05])
    assert p["trips_change"] == pytest.approx(30 / 40 - 1)          # 8 + 12 + 6 + 4 against 10 + 20 + 10 + 0
    assert p["net_change"] == pytest.approx(310 / 250 - 1)          # 90 + 250 − 40 + 10 against 100 + 200 − 50 + 0
    assert p["net_change_pairs"] == 2                               # bases netting > 0: (0, 0) and (0, 1)
    assert p["net_change_mean"] == pytest.approx((-0.1 + 0.25) / 2)
    assert p["net_change_range"] == pytest.approx([-0.1, 0.25])


def test_paired_with_a_losing_base_total_gives_no_relative_change():
    p = paired({(0, 0): _run(0, -10, 0.5, 4)}, {(0, 0): _run(0, 5, 0.6, 4)})
    assert p["net_change"] is None and p["net_change_mean"] is None and p["net_change_pairs"] == 0


def test_baseline_edge_is_the_iqm_of_agent_minus_rule_per_fold():
    # fold 0: agent − rule = 1, 2, 3, 100 -> the interquartile mean of four values is the mean of the middle two, 2.5
    runs = {(s, 0): _run(0, net, 0.6, 5, ofi=0.0) for s, net in enumerate((1.0, 2.0, 3.0, 100.0))}
    runs.update({(s, 1): _run(1, 10.0, 0.6, 5, ofi=4.0) for s in range(4)})   # fold 1: 6 on every seed
    e = baseline_edge(runs, "ofi_rule", folds=2)
    assert e["folds"][0]["iqm"] == pytest.approx(2.5)
    assert e["folds"][1]["iqm"] == pytest.approx(6.0)
    assert e["folds"][1]["ci"] == pytest.approx([6.0, 6.0])        # no spread to resample
    # all folds: 1, 2, 3, 6, 6, 6, 6, 100 -> the middle four 3, 6, 6, 6
    assert e["all"]["iqm"] == pytest.approx(21 / 4)
    lo, hi = e["folds"][0]["ci"]
    assert lo <= 2.5 <= hi


def _write(out: Path, name: str, seed: int, r: dict) -> None:
    d = out / name / f"seed{seed}" / f"fold{r['fold']}"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps(r))


def test_experiment_table_only_prints_seed_gates_pairs_and_iqm(tmp_path):
    for seed in (0, 1):
        _write(tmp_path, "base", seed, _run(0, 100 + seed, 0.52, 10, ofi=40, ofi_max=90))
        _write(tmp_path, "base", seed, _run(1, 200, 0.60, 20, ofi=40, ofi_max=90))
        _write(tmp_path, "held", seed, _run(0, 90, 0.58 - 0.05 * seed, 8, ofi=40, ofi_max=90))
        _write(tmp_path, "held", seed, _run(1, 180, 0.62, 16, ofi=40, ofi_max=90))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "experiment.py"), "--out", str(tmp_path),
                           "--folds", "2", "--seeds", "0,1", "--variant", "base=", "--eval-variant", "held=base:",
                           "--table-only"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "| base | 0 of 2: – | 0 (win_rate_every_fold), 1 (win_rate_every_fold) | – |" in text
    assert "| held | 1 of 2: 0 | 1 (win_rate_every_fold) | – |" in text   # seed 1 fold 0: 0.53
    # held against base: 4 pairs, the win rate up on all (0.58 and 0.53 against 0.52, 0.62 against 0.60 twice);
    # trips 48 against 60: −20 %; net 540 against 601: −10 %
    assert "| held | base | 4 | 4 of 4 |" in text
    assert "| -20 % | -10 % |" in text
    assert (tmp_path / "table.md").read_text().strip() == text.strip()
