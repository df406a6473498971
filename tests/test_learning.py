"""End to end on CPU: the smoke preset learns a planted signal out of sample, and the leakage guard finds no edge
without one.

Each fold is one real `python -m trainer.train` process (fold i of 3: train on window i, evaluate greedily on the
unseen window i+1), deterministic (--deterministic, one thread each), about a minute on an idle core. The leakage
guard (docs/walk-forward.md) is the cost-free mid edge of the decided positions, pooled over the folds by
`python -m trainer.report`. It judges the control run, the same config on `signal=0` (RUN/control/): the mid is a
martingale there, so a causal agent can have none; on the `signal=2` market the same statistics measure the edge
found, and that walk-forward passes every gate.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.report import summarise


def _train_cmd(tmp_path: Path, run: Path, fold: int, signal: float, *extra: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "ALPHA_RL_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(run), "--fold", str(fold), "--folds", "3",
           "--data", f"synthetic:seed=3,days=4,signal={signal}", "--fxcache", str(tmp_path / "fxcache"),
           "--preset", "smoke", "--seed", "0", "--deterministic", *extra]
    return cmd, env


def _train(tmp_path: Path, run: Path, fold: int, signal: float, *extra: str) -> dict:
    cmd, env = _train_cmd(tmp_path, run, fold, signal, *extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((run / f"fold{fold}" / "result.json").read_text())


def _walk_forward(tmp_path: Path, run: Path, signal: float, *extra: str) -> None:
    """Folds 0, 1, 2: fold 0 alone first (it writes the synthetic data and the feature cache), then two
    single-thread folds at once (both cores busy, the same results as one by one)."""
    _train(tmp_path, run, 0, signal, *extra)
    started = []
    for fold in (1, 2):
        cmd, env = _train_cmd(tmp_path, run, fold, signal, *extra)
        started.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for proc in started:
        _, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err[-2000:]


@pytest.mark.slow
def test_strong_planted_signal_passes_every_gate_and_the_guard_finds_no_edge_on_its_signal_zero_control(tmp_path):
    """The issue's must-show on the CPU smoke budget: signal 2, and a bounded inventory penalty (0.3 reward units per
    step at full position, SimConfig.inventory_penalty) so that waiting flat pays: without it the
    agent is in a position ~99 % of the time (docs/RESULTS.md). The same config on `signal=0`, laid out as the
    run's control (RUN/control/fold<N>), is what the leakage guard judges."""
    run = tmp_path / "signal2"
    _walk_forward(tmp_path, run, 2.0, "--inventory-penalty", "0.3")
    _walk_forward(tmp_path, run / "control", 0.0, "--inventory-penalty", "0.3")
    rep = subprocess.run([sys.executable, "-m", "trainer.report", "--run-dir", str(run)], capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "pass", {k: g for k, g in summary["gates"].items() if not g["passed"]}
    for fold in summary["folds"]:
        assert fold["trades"] >= 20 and fold["net_pnl"] > 0, fold
        assert 0.30 <= fold["time_in_market"] <= 0.70 and fold["win_rate"] > 0.55, fold
    leak = summary["leakage"]
    # the wanted edge on the signal market, in the statistics a leak would show on the control
    signal = leak["signal"]
    assert leak["edge_found"] is True and signal["mid_edge_tstat"] > 2 and signal["mid_hit_rate"] > 0.53, signal
    # the control: with the inventory penalty the agent mostly waits flat where there is nothing to trade (11
    # decided steps measured), so the guard passes it and says it has little power; the power test is below
    ctl = leak["control"]
    assert leak["control_missing_folds"] == [] and ctl["folds_without_mid_edge"] == []
    assert leak["leak_suspected"] is False, leak
    assert leak["words"].startswith("edge found on the signal market, none on the control"), leak["words"]
    md = (run / "report.md").read_text()
    assert "LEAK SUSPECTED" not in md and "edge found on the signal market, none on the control" in md
    head = summary["headline"]
    assert head["edge_vs_best_baseline"] is not None and head["leak_suspected"] is False, head


@pytest.mark.slow
def test_a_trading_agent_on_the_signal_zero_control_shows_no_edge_over_three_folds(tmp_path):
    """The guard's power case: without the inventory penalty the agent trades on `signal=0` (hundreds of decided
    steps), and the control statistics still show no edge. The run is judged as a control (`--control` itself)."""
    run = tmp_path / "signal0"
    _walk_forward(tmp_path, run, 0.0)
    rep = subprocess.run([sys.executable, "-m", "trainer.report", "--run-dir", str(run), "--control", str(run)],
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    leak = s["leakage"]["control"]
    assert s["missing_folds"] == [] and leak["folds_without_mid_edge"] == []
    assert all(f["trades"] > 0 and f["mid_edge_n"] > 0 for f in s["folds"]), s["folds"]  # it traded: not vacuous
    n = leak["mid_edge_n"]
    assert n >= 200, leak  # enough decided positions for the tests below to have power
    assert abs(leak["mid_edge_tstat"]) < 2, leak
    # hit rate within two binomial standard errors of a coin (±0.071 at n = 200, ±0.058 at 300)
    assert abs(leak["mid_hit_rate"] - 0.5) <= 2 * 0.5 / n**0.5, leak
    assert s["net_pnl_tstat"] < 2, s["net_pnl_tstat"]  # one-sided: losing to fees and the spread is not an edge
    assert all(f["win_rate"] is None or f["win_rate"] <= 0.53 for f in s["folds"]), [f["win_rate"] for f in s["folds"]]
    assert s["leakage"]["leak_suspected"] is False and "none on the control" in (run / "report.md").read_text()
