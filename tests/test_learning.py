"""End to end on CPU: the smoke preset learns a planted signal out of sample, and the leakage guard finds no edge
without one.

Each fold is one real `python -m trainer.train` process (fold i of 3: train on window i, evaluate greedily on the
unseen window i+1), deterministic (--deterministic, one thread each), about a minute on an idle core. The leakage
guard (docs/walk-forward.md) is the cost-free mid edge of the decided positions, pooled over the folds by
`python -m trainer.report`. It judges the control run, the same config on `signal=0` (RUN/control/): the mid is a
martingale there, so a causal agent can have none; on the strong-signal market the same statistics measure the edge
found.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest



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
def test_smoke_preset_beats_the_ofi_rule_on_every_fold_of_the_strong_signal_market_and_finds_nothing_on_its_control(
        tmp_path):
    """The issue's must-show on the CPU smoke budget, with the smoke preset as it is (κ 0.2, model selection on the
    last 20 % of each training window, inventory penalty 0.6, mirrored decisions, exposure cap 0.6 kept out of
    sample by the causal controller, trained on the reflected market too, 1,000 steps; docs/RESULTS.md §10: on 5
    seeds of this market it beat the OFI rule on 15 of 15 runs on one box, where the fixed margin did on 13; §16:
    training on the reflected market too raised its net on this market by 15 %, 5 seeds): on the README demo's
    strong-signal market (signal 3) the agent nets more than the OFI rule on every fold; the same config on
    `signal=0`, laid out as the run's control (RUN/control/fold<N>), finds no edge and the guard says so. "The OFI
    rule" is the issue's, `ofi_rule`, one contract. At the agent's own position limit (`ofi_rule_max`) the rule nets
    more than this agent on every fold of this market (docs/RESULTS.md §7), so that is not asserted here."""
    run = tmp_path / "signal3"
    _walk_forward(tmp_path, run, 3.0)
    _walk_forward(tmp_path, run / "control", 0.0)
    rep = subprocess.run([sys.executable, "-m", "trainer.report", "--run-dir", str(run)], capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    for fold in range(3):
        r = json.loads((run / f"fold{fold}" / "result.json").read_text())
        assert r["trades"] >= 20 and r["net_pnl"] > r["baselines"]["ofi_rule"]["net_pnl"] > 0, (fold, r["net_pnl"])
        assert r["stood_aside"] is False and r["select_best_net_pnl"] > 0, fold
    leak = summary["leakage"]
    signal = leak["signal"]
    assert leak["edge_found"] is True and signal["mid_edge_tstat"] > 2 and signal["mid_hit_rate"] > 0.53, signal
    assert leak["control_missing_folds"] == [] and leak["leak_suspected"] is False, leak
    assert leak["words"].startswith("edge found on the signal market, none on the control"), leak["words"]
    for fold in range(3):  # on the control the held-out slice never paid: every fold stood aside
        r = json.loads((run / "control" / f"fold{fold}" / "result.json").read_text())
        assert r["stood_aside"] is True and r["trades"] == 0 and r["net_pnl"] == 0, (fold, r.get("net_pnl"))
    md = (run / "report.md").read_text()
    assert "LEAK SUSPECTED" not in md and "edge found on the signal market, none on the control" in md


@pytest.mark.slow
def test_a_trading_agent_on_the_signal_zero_control_shows_no_edge_over_three_folds(tmp_path):
    """The guard's power case: an agent that trades on `signal=0` (hundreds of decided steps: the smoke preset without
    the inventory penalty, model selection (which stands aside there) and κ), and the control statistics still show
    no edge, two-sided. The run is judged as a control (`--control` itself)."""
    run = tmp_path / "signal0"
    # the smoke preset of before κ, selection, the penalty, the mirror (at decisions and in training) and the exposure
    # cap (docs/RESULTS.md): plain Thompson draws, 1,500 steps
    _walk_forward(tmp_path, run, 0.0, "--sim.inventory-penalty", "0", "--loop.select-frac", "0",
                  "--loop.max-exposure", "1", "--agent.no-mirror", "--agent.no-mirror-augment",
                  "--agent.thompson-scale", "1", "--n-steps", "1500")
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
    # net PnL: losing to fees and the spread is not an edge (one-sided); the cost-free mid edge above is two-sided
    assert s["net_pnl_tstat"] < 2, s["net_pnl_tstat"]
    assert all(f["win_rate"] is None or f["win_rate"] <= 0.53 for f in s["folds"]), [f["win_rate"] for f in s["folds"]]
    assert s["leakage"]["leak_suspected"] is False and "none on the control" in (run / "report.md").read_text()
