"""End to end on CPU: the smoke preset learns a planted signal out of sample, and the leakage guard finds no edge
without one.

Each fold is one real `python -m trainer.train` process (fold i of 3: train on window i, evaluate greedily on the
unseen window i+1), deterministic (--deterministic, one thread each), about a minute on an idle core. The leakage
guard (docs/walk-forward.md) is the cost-free mid edge of the decided positions, pooled over the folds by
`python -m trainer.report`: on `signal=0` the mid is a martingale, so a causal agent can have none; the `signal=2`
fold is the positive control showing the same statistics do fire on a real edge.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.report import summarise


def _train_cmd(tmp_path: Path, run: Path, fold: int, signal: float) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "ALPHA_RL_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(run), "--fold", str(fold), "--folds", "3",
           "--data", f"synthetic:seed=3,days=4,signal={signal}", "--fxcache", str(tmp_path / "fxcache"),
           "--preset", "smoke", "--seed", "0", "--deterministic"]
    return cmd, env


def _train(tmp_path: Path, run: Path, fold: int, signal: float) -> dict:
    cmd, env = _train_cmd(tmp_path, run, fold, signal)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((run / f"fold{fold}" / "result.json").read_text())


@pytest.mark.slow
def test_smoke_preset_learns_a_strong_planted_signal_out_of_sample_and_the_leak_guard_fires_on_it(tmp_path):
    run = tmp_path / "signal2"
    result = _train(tmp_path, run, 0, signal=2.0)
    assert result["trades"] >= 20
    assert result["win_rate"] > 0.55 and result["net_pnl"] > 0, result
    # positive control: a real edge is what a leak would look like on signal=0, and the guard sees it
    assert result["mid_edge_tstat"] > 2 and result["mid_hit_rate"] > 0.53, result
    leak = summarise(run)["leakage"]
    assert leak["leak_suspected"] is True and leak["mid_edge_n"] == result["mid_edge_n"]


@pytest.mark.slow
def test_signal_zero_walk_forward_shows_no_edge_over_three_folds(tmp_path):
    run = tmp_path / "signal0"
    _train(tmp_path, run, 0, signal=0.0)  # first alone: it writes the synthetic data and the feature cache
    started = []
    for fold in (1, 2):  # then two single-thread folds at once: both cores busy, same results as one by one
        cmd, env = _train_cmd(tmp_path, run, fold, 0.0)
        started.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for proc in started:
        _, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err[-2000:]
    rep = subprocess.run([sys.executable, "-m", "trainer.report", "--run-dir", str(run)], capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    leak = s["leakage"]
    assert s["missing_folds"] == [] and leak["folds_without_mid_edge"] == []
    assert all(f["trades"] > 0 and f["mid_edge_n"] > 0 for f in s["folds"]), s["folds"]  # it traded: not vacuous
    assert leak["mid_edge_n"] > 300, leak
    assert abs(leak["mid_edge_tstat"]) < 2, leak
    assert abs(leak["mid_hit_rate"] - 0.5) <= 0.03, leak
    assert s["net_pnl_tstat"] < 2, s["net_pnl_tstat"]  # one-sided: losing to fees and the spread is not an edge
    assert all(f["win_rate"] <= 0.53 for f in s["folds"]), [f["win_rate"] for f in s["folds"]]
    assert leak["leak_suspected"] is False and "no leak suspected" in (run / "report.md").read_text()

