"""trainer.report headline and protocol: the guard judges a control run, folds that stood aside, seeds aggregated
by IQM, the edge over the best baseline, and no annualised bar Sharpe in the tables."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trainer.errors import InputError
from trainer.report import STOOD_ASIDE, summarise
from trainer.report.__main__ import main


def _edges(seed: int, n: int, bias: float = 0.0) -> np.ndarray:
    """Per-step mid edges: ±0.5..1.5-tick moves times positions in −3..3; `bias` = share of steps that move one
    tick more with the position (a planted edge or leak)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-3, 4, n)
    move = rng.choice([-3, -2, -1, 0, 1, 2, 3], n) + np.where(rng.random(n) < bias, np.sign(q), 0)
    e = (q * move * 6.25).astype(np.float64)
    nz = e[e != 0]
    return {"mid_edge_n": int(nz.size), "mid_edge": float(nz.sum()), "mid_edge_sumsq": float((nz * nz).sum()),
            "mid_edge_wins": int((nz > 0).sum())}


def _fold(run, i, folds=3, seed=None, trades=40, win=0.6, net=100.0, edge=None, bars=None, trade_pnl=None,
          base_bars=None):
    d = run / f"fold{i}" / (f"seed{seed}" if seed else "")
    d.mkdir(parents=True, exist_ok=True)
    r = {"fold": i, "folds": folds, "win_rate": win, "net_pnl": net, "time_in_market": 0.5, "hold_frac": 0.2,
         "dir_entropy": 1.2, "trades": trades, "sharpe": 59.0, "sortino": 80.0, "calmar": 300.0,
         "baselines": {"flat": {"net_pnl": 0.0, "win_rate": 0.0, "trades": 0},
                       "ofi_rule": {"net_pnl": 50.0, "win_rate": 0.6, "trades": 30}}}
    if edge is not None:
        r.update(edge)
    if bars is not None:
        r["bar_pnl"] = list(map(float, bars))
        for name, b in base_bars.items():
            r["baselines"][name]["bar_pnl"] = list(map(float, b))
    if trade_pnl is not None:
        r["trade_pnl"] = list(map(float, trade_pnl))
    (d / "result.json").write_text(json.dumps(r))


def test_control_guard_fires_on_a_planted_leak_and_not_on_a_clean_signal_market(tmp_path):
    for i in range(3):  # a strong (wanted) edge on the signal market, noise on the control
        _fold(tmp_path, i, edge=_edges(i, 900, bias=0.3))
        _fold(tmp_path / "control", i, net=-300.0 - 50 * i, win=0.3, edge=_edges(10 + i, 900))
    s = summarise(tmp_path)["leakage"]
    assert s["edge_found"] is True and s["signal"]["mid_edge_tstat"] > 5
    assert s["leak_suspected"] is False and s["control"]["mid_edge_tstat"] < 2
    assert s["words"].startswith("edge found on the signal market, none on the control")
    for i in range(3):  # the control now shows an edge: a policy that sees the future
        _fold(tmp_path / "leaky", i, net=-300.0 - 50 * i, win=0.3, edge=_edges(10 + i, 900, bias=0.08))
    s = summarise(tmp_path, control_dir=tmp_path / "leaky")["leakage"]
    assert s["leak_suspected"] is True and s["words"].startswith("LEAK SUSPECTED: edge on the control market")
    assert "pooled mid-edge t" in s["words"]


def test_without_a_control_run_a_planted_edge_is_not_called_a_leak(tmp_path, capsys):
    for i in range(3):
        _fold(tmp_path, i, edge=_edges(i, 900, bias=0.3))
    assert main(["--run-dir", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["leakage"]["leak_suspected"] is None and s["leakage"]["control"] is None
    assert s["leakage"]["words"].startswith("no control run: the guard cannot judge a leak; edge found")
    md = (tmp_path / "report.md").read_text()
    assert "LEAK SUSPECTED" not in md and "Control: no control run" in md
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["leak_suspected"] is None


def test_a_fold_without_trades_stood_aside_and_the_win_rate_gates_leave_it_out(tmp_path):
    _fold(tmp_path, 0)
    _fold(tmp_path, 1, trades=0, win=0.0, net=0.0)  # the simulator reports win rate 0 for no trips
    _fold(tmp_path, 2)
    s = summarise(tmp_path)
    f1 = s["folds"][1]
    assert f1["outcome"] == STOOD_ASIDE and f1["win_rate"] is None and s["stood_aside_folds"] == [1]
    for gate in ("win_rate_every_fold", "win_rate_floor"):
        g = s["gates"][gate]
        assert g["passed"] is True and g["failing_folds"] == [] and g["stood_aside_folds"] == [1]
        assert g["values"]["1"] == STOOD_ASIDE
    assert s["aggregate"]["mean_win_rate"] == pytest.approx(0.6)
    assert "stood aside on fold 1" in s["headline"]["lines"][0]
    for i in range(3):  # a run that never traded does not pass the win-rate gates
        _fold(tmp_path / "never", i, trades=0, win=0.0, net=0.0)
    g = summarise(tmp_path / "never")["gates"]["win_rate_every_fold"]
    assert g["passed"] is False and g["failing_folds"] == [] and g["stood_aside_folds"] == [0, 1, 2]


def test_seeds_are_read_from_seed_folders_and_aggregated_by_iqm(tmp_path):
    nets = {0: (100.0, 120.0, 80.0, 5000.0), 1: (-10.0, 20.0, 0.0, 10.0)}
    for i, per_seed in nets.items():
        for seed, net in enumerate(per_seed):
            _fold(tmp_path, i, folds=2, seed=seed, net=net)
    s = summarise(tmp_path)
    seeds = s["seeds"]
    assert seeds["n_seeds"] == 4 and seeds["n_runs"] == 8 and seeds["note"] is None
    # IQM of the 8 runs: the middle four of (-10, 0, 10, 20, 80, 100, 120, 5000) = (10, 20, 80, 100) -> 52.5
    assert seeds["iqm"] == 52.5 and seeds["ci"][0] <= 52.5 <= seeds["ci"][1]
    assert seeds["folds"]["0"]["iqm"] == 110.0 and seeds["folds"]["0"]["net_pnl"] == [100.0, 120.0, 80.0, 5000.0]
    assert s["folds"][0]["net_pnl"] == 100.0  # tables and gates read seed 0
    assert s["stats"]["n_trials"] == 4 and summarise(tmp_path, n_trials=40)["stats"]["n_trials"] == 40
    assert "IQM net PnL +52.50" in s["headline"]["lines"][-1]
    one = tmp_path / "one"
    _fold(one, 0, folds=1)
    assert summarise(one)["seeds"]["note"] == "one seed per fold: no spread over seeds"


def test_headline_gives_the_edge_over_the_best_baseline_and_tables_drop_annualised_sharpe(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(3):
        ofi = rng.normal(1, 10, 60)
        agent = ofi + 4 + rng.normal(0, 2, 60)
        _fold(tmp_path, i, bars=agent, base_bars={"ofi_rule": ofi, "flat": np.zeros(60)},
              trade_pnl=rng.normal(8, 20, 25), edge=_edges(i, 300))
    assert main(["--run-dir", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    e = s["headline"]["edge_vs_best_baseline"]
    assert e["best"] == "ofi_rule" and e["n_bars"] == 180 and e["edge_ci"][0] > 0 and e["p_value_all"] < 0.05
    t = s["stats"]["per_trade"]
    assert t["n"] == 75 and t["sharpe"] is not None and t["dsr"] is not None and t["n_trials"] == 1
    assert all(f["trade_stats"]["sharpe"] is None for f in s["folds"])  # 25 trades a fold: below the rule
    assert all("sharpe" not in f and "sortino" not in f and "calmar" not in f for f in s["folds"])
    assert "bar_pnl" not in s["folds"][0]["baselines"]["ofi_rule"]
    md = (tmp_path / "report.md").read_text()
    lines = md.splitlines()
    assert lines[2].startswith("**Verdict: PASS") and lines[4].startswith("- Edge vs best baseline (ofi_rule): +")
    fold_head = next(x for x in lines if x.startswith("| fold | outcome |"))
    assert "Sharpe" not in fold_head and "59.000" not in md  # the annualised bar Sharpe of result.json
    assert "| trade | 75 |" in md and "| day |" not in md  # no day_pnl in these results


@pytest.mark.parametrize("spec, maker, applied, consistent, words", [
    ("synthetic:seed=3,days=4,signal=1", 1.40, None, True, "cme-es: maker 1.4 / taker 1.4 per contract"),
    ("lobster:/d/AMZN.zip", 1.40, None, False, "us-equity: maker 0 / taker 0.003 per share"),
    ("lobster:/d/AMZN.zip", 0.0031, "us-equity", True, "27.8 USD per million sold"),
])
def test_report_header_shows_the_venue_fee_schedule_and_whether_the_run_charged_it(tmp_path, spec, maker, applied,
                                                                                   consistent, words):
    _fold(tmp_path, 0, folds=1)
    run = {"config": {"data": spec, "sim": {"maker_fee": maker, "taker_fee": maker}}}
    if applied:
        run["fees"] = {"schedule": applied}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["--run-dir", str(tmp_path)]) == 0
    fees = json.loads((tmp_path / "summary.json").read_text())["fees"]
    assert fees["consistent"] is consistent and words in fees["text"]
    md = (tmp_path / "report.md").read_text().splitlines()
    assert md[2].startswith("Fees: ") and ("NOT from this schedule" in md[2]) is (not consistent)


def test_an_unreadable_run_json_is_refused_with_its_path(tmp_path):
    _fold(tmp_path, 0, folds=1)
    (tmp_path / "run.json").write_text('{"config": {}}')
    assert main(["--run-dir", str(tmp_path)]) == 2


def test_a_control_that_barely_traded_is_reported_as_weak(tmp_path):
    for i in range(3):
        _fold(tmp_path, i, edge=_edges(i, 900, bias=0.3))
        _fold(tmp_path / "control", i, trades=2, net=-10.0 - i, win=0.0,  # 10 steps of ±1, five up: t 0, hit 0.5
              edge={"mid_edge_n": 10, "mid_edge": 0.0, "mid_edge_sumsq": 10.0, "mid_edge_wins": 5})
    s = summarise(tmp_path)["leakage"]
    n = s["control"]["mid_edge_n"]
    assert s["leak_suspected"] is False and n == 30
    assert f"none on the control (only {n} decided steps on the control: little power)" in s["words"]


@pytest.mark.parametrize("patch, field, rule", [
    ({"trade_pnl": [1.0, float("nan")]}, "trade_pnl", "list of finite numbers"),
    ({"day_pnl": "12"}, "day_pnl", "list of finite numbers"),
    ({"bar_pnl": [1.0, 2.0], "baselines": {"flat": {"net_pnl": 0.0, "win_rate": 0.0, "bar_pnl": [0.0]}}},
     "baselines.flat.bar_pnl", "1 bars, the agent's bar_pnl has 2"),
])
def test_bad_samples_in_a_result_are_refused_naming_file_field_and_rule(tmp_path, patch, field, rule):
    _fold(tmp_path, 0, folds=1)
    path = tmp_path / "fold0" / "result.json"
    r = json.loads(path.read_text())
    r.update(patch)
    path.write_text(json.dumps(r))  # Python's json writes NaN as NaN and reads it back
    with pytest.raises(InputError, match=f"{path}, record {field}: .*{rule}"):
        summarise(tmp_path)
    assert main(["--run-dir", str(tmp_path)]) == 2


def test_headline_says_not_tested_when_too_few_bars_differ(tmp_path):
    spike = np.zeros(20)
    spike[3] = 5.0
    _fold(tmp_path, 0, folds=1, bars=np.zeros(20), base_bars={"ofi_rule": spike, "flat": np.zeros(20)})
    assert main(["--run-dir", str(tmp_path)]) == 0
    head = json.loads((tmp_path / "summary.json").read_text())["headline"]
    assert head["edge_vs_best_baseline"]["best"] == "ofi_rule" and head["edge_vs_best_baseline"]["p_value_best"] is None
    assert "SPA p not tested (too few differing bars); beats every baseline: not tested." in head["lines"][1]
