"""End to end on CPU: the smoke preset learns a planted signal out of sample, and finds no edge without one.

Each case is one real `python -m trainer.train` process (fold 0 of 3: train on window 0, evaluate greedily on the
unseen window 1), deterministic, about a minute on 2 idle cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _train_fold0(tmp_path: Path, signal: float) -> dict:
    run = tmp_path / f"signal{signal}"
    env = {**os.environ, "ALPHA_RL_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(run), "--fold", "0", "--folds", "3",
           "--data", f"synthetic:seed=3,days=4,signal={signal}", "--fxcache", str(tmp_path / "fxcache"),
           "--preset", "smoke", "--seed", "0", "--deterministic"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((run / "fold0" / "result.json").read_text())


@pytest.mark.slow
def test_smoke_preset_learns_a_strong_planted_signal_out_of_sample(tmp_path):
    result = _train_fold0(tmp_path, signal=2.0)
    assert result["trades"] >= 20
    assert result["win_rate"] > 0.55 and result["net_pnl"] > 0, result


@pytest.mark.slow
def test_same_budget_on_signal_zero_shows_no_edge(tmp_path):
    result = _train_fold0(tmp_path, signal=0.0)
    assert not (result["win_rate"] > 0.55 and result["net_pnl"] > 0), result
    assert result["win_rate"] < 0.53, result
