"""trainer.report: summarise(), gates, verdict, t-statistic, the leakage guard, report.md, PNGs and the CLI's exit
codes."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from trainer.errors import InputError
from trainer.folds.metrics import edge_stats, edge_sums
from trainer.report import GateConfig, LeakageConfig, summarise
from trainer.report.__main__ import main
from trainer.report.plots import training_curves

BASE = {"ofi_rule": {"net_pnl": 50.0, "win_rate": 0.6}, "flat": {"net_pnl": 0.0, "win_rate": 0.0},
        "random": {"net_pnl": -80.0, "win_rate": 0.3}}


def _fold(run, i, folds=3, win=0.6, net=100.0, hold=0.5, ent=1.2, curves=True, edge=None, hold_action=0.2):
    d = run / f"fold{i}"
    d.mkdir(parents=True)
    r = {"fold": i, "folds": folds, "win_rate": win, "net_pnl": net, "time_in_market": hold, "hold_frac": hold_action,
         "dir_entropy": ent,
         "trades": 40, "sharpe": 1.5, "max_drawdown": 20.0, "eval_window": [10 * (i + 1), 10 * (i + 2)],
         "baselines": BASE}
    if edge is not None:  # what evaluate() writes: the sums and this fold's own statistics
        r.update(edge_stats(edge_sums(edge)))
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


def test_fold_rows_carry_the_rows_each_fold_trained_and_was_evaluated_on(tmp_path):
    """An anchored run's fold 1 trained on windows 0 and 1, [0, 20); summary.json shows it beside the eval rows."""
    for i in range(2):
        r = _fold(tmp_path, i, folds=2)
        r["train_window"] = [0, 10 * (i + 1)]
        (tmp_path / f"fold{i}" / "result.json").write_text(json.dumps(r))
    rows = summarise(tmp_path)["folds"]
    assert [(f["train_window"], f["eval_window"]) for f in rows] == [([0, 10], [10, 20]), ([0, 20], [20, 30])]


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


def test_hold_gate_reads_time_in_market_by_default_and_the_hold_action_share_when_asked(tmp_path):
    _fold(tmp_path, 0, folds=2, hold=0.5, hold_action=0.1)  # in a position half the time, rarely the HOLD action
    _fold(tmp_path, 1, folds=2, hold=0.6, hold_action=0.5)
    g = summarise(tmp_path)["gates"]["hold_frac"]
    assert g["passed"] is True and g["values"] == {"0": 0.5, "1": 0.6} and "time_in_market" in g["rule"]
    g = summarise(tmp_path, GateConfig(hold_metric="hold_frac"))["gates"]["hold_frac"]
    assert g["passed"] is False and g["failing_folds"] == [0] and "hold_frac" in g["rule"]
    with pytest.raises(ValueError, match="hold_metric"):
        GateConfig(hold_metric="exposure")


def test_a_fold_without_the_hold_metric_fails_the_hold_gate(tmp_path):
    _fold(tmp_path, 0, folds=2)
    r = _fold(tmp_path, 1, folds=2)
    del r["time_in_market"]
    (tmp_path / "fold1" / "result.json").write_text(json.dumps(r))
    g = summarise(tmp_path)["gates"]["hold_frac"]
    assert g["passed"] is False and g["failing_folds"] == [1] and g["values"]["1"] is None


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
    assert "| fold | outcome | win rate |" in md and "ofi_rule net PnL" in md and "random win" in md
    assert md.count("\n| 2 | traded | 0.400 |") == 1 and "win_rate_every_fold" in md
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


def _edges(seed, n, bias=0.0):
    """Per-step mid edges like a fold's: price moves of +-0.5..1.5 ticks times positions in -3..3, many zeros."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-3, 4, n)
    move = rng.choice([-3, -2, -1, 0, 1, 2, 3], n) + np.where(rng.random(n) < bias, np.sign(q), 0)
    return q * move * 6.25


def test_leakage_pools_the_folds_mid_edges_exactly_and_suspects_nothing_on_noise(tmp_path):
    folds = [_edges(s, n) for s, n in ((1, 400), (2, 650), (3, 520))]
    for i, (e, net) in enumerate(zip(folds, (-2400.0, -900.0, -3100.0))):
        _fold(tmp_path, i, curves=False)
        _fold(tmp_path / "control", i, win=0.3, net=net, edge=e, curves=False)
    s = summarise(tmp_path)["leakage"]
    assert s["control_dir"] == str(tmp_path / "control") and s["leak_suspected"] is False
    leak = s["control"]
    nz = np.concatenate(folds)
    nz = nz[nz != 0]
    assert leak["mid_edge_n"] == nz.size > 1000
    assert leak["mid_edge"] == pytest.approx(nz.sum())
    assert leak["mid_edge_tstat"] == pytest.approx(nz.mean() / (nz.std(ddof=1) / math.sqrt(nz.size)), rel=1e-12)
    assert leak["mid_hit_rate"] == pytest.approx(float(np.mean(nz > 0)))
    assert abs(leak["mid_edge_tstat"]) < 2 and abs(leak["mid_hit_rate"] - 0.5) < 0.03
    assert leak["net_pnl_tstat"] < 0  # losing folds: costs, not edge, and no suspicion
    assert leak["leak_suspected"] is False and leak["reasons"] == []
    assert set(leak["folds"]) == {"0", "1", "2"} and leak["folds"]["1"]["mid_edge_n"] == int(np.sum(folds[1] != 0))
    assert leak["folds_without_mid_edge"] == []


@pytest.mark.parametrize("kind", ["tstat", "hit_rate", "net_pnl"])
def test_each_leakage_rule_alone_raises_the_suspicion(tmp_path, kind):
    cfg = LeakageConfig()
    if kind == "tstat":  # fewer but larger winners: positive mean, hit rate stays at or below one half
        edges = [np.r_[np.full(200, 30.0), np.full(220, -20.0)] for _ in range(3)]
    elif kind == "hit_rate":  # more winners than losers, zero mean
        edges = [np.r_[np.full(280, 10.0), np.full(200, -14.0)] for _ in range(3)]
    else:
        edges = [_edges(s, 500) for s in range(3)]
    nets = (100.0, 110.0, 120.0) if kind == "net_pnl" else (-100.0, 50.0, -20.0)
    for i, (e, net) in enumerate(zip(edges, nets)):
        _fold(tmp_path, i, curves=False)
        _fold(tmp_path / "control", i, net=net, edge=e, curves=False)
    s = summarise(tmp_path, leak_cfg=cfg)["leakage"]
    leak = s["control"]
    assert s["leak_suspected"] is True and s["words"].startswith("LEAK SUSPECTED: edge on the control market")
    assert leak["leak_suspected"] is True and len(leak["reasons"]) == 1
    assert {"tstat": "mid-edge t", "hit_rate": "hit rate", "net_pnl": "net-PnL t"}[kind] in leak["reasons"][0]
    if kind == "hit_rate":
        assert leak["mid_edge"] == 0.0 and leak["mid_hit_rate"] == pytest.approx(280 / 480)
    with pytest.raises(ValueError, match="max_mid_hit_rate"):
        LeakageConfig(max_mid_hit_rate=0.4)


def test_leakage_detects_a_small_directional_bias_pooled_over_folds(tmp_path):
    # 8 % of the steps move one tick more with the position: not every fold shows it alone, the pooled t does
    for i in range(3):
        _fold(tmp_path, i, win=0.3, net=-500.0, curves=False)
        _fold(tmp_path / "control", i, win=0.3, net=-500.0, edge=_edges(10 + i, 900, bias=0.08), curves=False)
    s = summarise(tmp_path)
    per_fold = [f["mid_edge_tstat"] for f in s["leakage"]["control"]["folds"].values()]
    assert s["leakage"]["control"]["mid_edge_tstat"] > 2 and min(per_fold) < 2
    assert s["leakage"]["leak_suspected"] is True and s["verdict"] == "fail"  # the verdict comes from the gates


def test_folds_without_mid_edge_are_listed_and_left_out_of_the_pool(tmp_path):
    for i in (0, 1):
        _fold(tmp_path, i, curves=False)
    _fold(tmp_path / "control", 0, edge=_edges(1, 300), curves=False)
    _fold(tmp_path / "control", 1, curves=False)  # an older result.json without the mid edge
    leak = summarise(tmp_path)["leakage"]["control"]
    assert leak["folds_without_mid_edge"] == [1] and list(leak["folds"]) == ["0"]
    assert leak["mid_edge_n"] == int(np.sum(_edges(1, 300) != 0))
    for i in (0, 1):
        _fold(tmp_path / "old", i, folds=2, curves=False)
        _fold(tmp_path / "old" / "control", i, folds=2, net=500.0 + i, curves=False)
    s = summarise(tmp_path / "old")["leakage"]  # no fold has it: nothing to pool, no suspicion from it
    leak = s["control"]
    assert leak["mid_edge_n"] == 0 and leak["mid_edge_tstat"] is None and leak["mid_hit_rate"] is None
    assert leak["folds_without_mid_edge"] == [0, 1] and s["leak_suspected"] is True  # net PnL t = 1001: still judged


def test_report_markdown_has_the_leakage_section(tmp_path, capsys):
    for i in range(3):
        _fold(tmp_path, i, edge=_edges(20 + i, 300), curves=False)
        _fold(tmp_path / "ctl", i, edge=_edges(i, 300), net=-100.0 * (i + 1), curves=False)
    assert main(["--run-dir", str(tmp_path), "--control", str(tmp_path / "ctl")]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "## Leakage guard" in md and md.count("| pooled |") == 2
    assert "**no edge found on the signal market, none on the control**" in md and "LEAK" not in md
    assert json.loads((tmp_path / "summary.json").read_text())["leakage"]["leak_suspected"] is False
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["leak_suspected"] is False
