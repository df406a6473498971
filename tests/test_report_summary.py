"""trainer.report: summarise(), gates, verdict, t-statistic, report.md, PNGs and the CLI's exit codes."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from trainer.errors import InputError
from trainer.report import GateConfig, summarise
from trainer.report.__main__ import main
from trainer.report.plots import training_curves

BASE = {"ofi_rule": {"net_pnl": 50.0, "win_rate": 0.6}, "flat": {"net_pnl": 0.0, "win_rate": 0.0},
        "random": {"net_pnl": -80.0, "win_rate": 0.3}}


def _fold(run, i, folds=3, win=0.6, net=100.0, hold=0.5, ent=1.2, curves=True):
    d = run / f"fold{i}"
    d.mkdir(parents=True)
    r = {"fold": i, "folds": folds, "win_rate": win, "net_pnl": net, "hold_frac": hold, "dir_entropy": ent,
         "trades": 40, "sharpe": 1.5, "max_drawdown": 20.0, "eval_window": [10 * (i + 1), 10 * (i + 2)],
         "baselines": BASE}
    (d / "result.json").write_text(json.dumps(r))
    if curves:
        np.save(d / "equity.npy", np.cumsum(np.r_[0.0, np.ones(20)]) * (i + 1))
        lines = [json.dumps({"event": "step", "env_step": s, "update_step": s, "loss": 1.0 / s, "q_mean": 0.1,
                             "win_rate": 0.5, "dir_entropy": 1.3}) for s in (10, 20, 30)]
        (d / "metrics.jsonl").write_text("\n".join(lines) + '\n{"event": "step", "env_st')  # torn last line
    return r


def test_all_gates_pass_and_t_statistic_of_fold_net_pnl(tmp_path):
    for i, net in enumerate((100.0, 200.0, 300.0)):
        _fold(tmp_path, i, net=net)
    s = summarise(tmp_path)
    assert [f["fold"] for f in s["folds"]] == [0, 1, 2]
    assert all("win_rate" in f for f in s["folds"])
    assert s["net_pnl_tstat"] == pytest.approx(200.0 / (100.0 / math.sqrt(3)))
    assert s["verdict"] == "pass" and all(g["passed"] for g in s["gates"].values())
    assert s["aggregate"]["total_net_pnl"] == 600.0
    assert s["aggregate"]["baselines_total_net_pnl"] == {"flat": 0.0, "ofi_rule": 150.0, "random": -240.0}
    assert s["folds"][1]["baselines"]["ofi_rule"]["win_rate"] == 0.6


@pytest.mark.parametrize("field, value, gate", [
    ("win", 0.54, "win_rate_every_fold"),
    ("hold", 0.75, "hold_frac"),
    ("hold", 0.29, "hold_frac"),
    ("ent", 0.1, "dir_entropy"),
])
def test_each_gate_fails_on_one_bad_fold(tmp_path, field, value, gate):
    _fold(tmp_path, 0)
    _fold(tmp_path, 1, **{field: value})
    _fold(tmp_path, 2)
    s = summarise(tmp_path)
    assert s["verdict"] == "fail"
    assert s["gates"][gate]["passed"] is False and s["gates"][gate]["failing_folds"] == [1]
    assert [k for k, g in s["gates"].items() if not g["passed"]] == [gate]


def test_win_rate_floor_separates_a_losing_fold(tmp_path):
    _fold(tmp_path, 0, folds=2, win=0.52)
    _fold(tmp_path, 1, folds=2, win=0.49)
    g = summarise(tmp_path)["gates"]
    assert g["win_rate_every_fold"]["failing_folds"] == [0, 1]
    assert g["win_rate_floor"]["failing_folds"] == [1]


def test_hold_fraction_bounds_are_inclusive_and_config_is_validated(tmp_path):
    _fold(tmp_path, 0, folds=2, hold=0.30)
    _fold(tmp_path, 1, folds=2, hold=0.70)
    assert summarise(tmp_path)["gates"]["hold_frac"]["passed"] is True
    with pytest.raises(ValueError, match="hold_frac_max"):
        GateConfig(hold_frac_min=0.8, hold_frac_max=0.7)


def test_missing_fold_makes_the_run_incomplete(tmp_path):
    _fold(tmp_path, 0)
    _fold(tmp_path, 2)
    s = summarise(tmp_path)
    assert s["verdict"] == "incomplete" and s["missing_folds"] == [1]
    assert s["gates"]["complete"]["passed"] is False


def test_cli_writes_summary_report_and_plots_and_strict_exit_codes(tmp_path, capsys):
    _fold(tmp_path, 0)
    _fold(tmp_path, 1)
    _fold(tmp_path, 2, win=0.4)
    assert main(["--run-dir", str(tmp_path)]) == 0
    assert main(["--run-dir", str(tmp_path), "--strict"]) == 1
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["verdict"] == "fail" and s["plots"] == ["equity.png", "training.png"]
    for png in ("equity.png", "training.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "| fold | win rate |" in md and "ofi_rule net PnL" in md and "random win" in md
    assert md.count("\n| 2 | 0.400 |") == 1 and "win_rate_every_fold" in md
    assert not list(tmp_path.glob(".*tmp*"))  # temp files renamed away
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "report" and "win_rate_every_fold" in line["failed_gates"]


def test_cli_strict_passes_on_a_good_run(tmp_path):
    for i in range(3):
        _fold(tmp_path, i, curves=False)
    assert main(["--run-dir", str(tmp_path), "--strict"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["plots"] == []


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trainer.report", "--run-dir", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert main(["--run-dir", str(tmp_path)]) == 2  # exists, but no fold results
    (tmp_path / "fold0").mkdir()
    (tmp_path / "fold0" / "result.json").write_text('{"fold": 0, "folds": 1')
    with pytest.raises(InputError, match="unreadable result"):
        summarise(tmp_path)
    (tmp_path / "fold0" / "result.json").write_text('{"fold": 0, "folds": 1, "win_rate": 0.6}')
    with pytest.raises(InputError, match="lacks"):
        summarise(tmp_path)


def test_training_curves_skip_torn_lines_and_keep_the_last_record_per_step(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join([
        json.dumps({"event": "step", "env_step": 5, "update_step": 0, "loss": 0.0, "win_rate": 0.1}),
        json.dumps({"event": "step", "env_step": 10, "update_step": 3, "loss": 2.0, "win_rate": 0.2}),
        json.dumps({"event": "checkpoint", "env_step": 10}),
        json.dumps({"event": "step", "env_step": 10, "update_step": 3, "loss": 1.0, "win_rate": 0.3}),  # resumed
        '{"event": "step", "env_',
    ]))
    c = training_curves(p)
    assert c["env_step"].tolist() == [5, 10]
    assert math.isnan(c["loss"][0]) and c["loss"][1] == 1.0  # no gradient step yet → no loss point
    assert c["win_rate"].tolist() == [0.1, 0.3]
