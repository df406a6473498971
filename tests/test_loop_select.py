"""Model selection on the held-out slice: the split, the best-weights bookkeeping, standing aside, resume."""
from __future__ import annotations

import pytest
import torch

from tests.test_sim_fills import make_tape
from trainer.agent.config import AgentConfig
from trainer.agent.learner import Learner
from trainer.agent.network import QNetwork
from trainer.loop.select import Selector, split_validation
from trainer.sim import ENV_FEATURES, FLAT, LONG, SHORT, SimConfig


def test_split_validation_holds_out_the_windows_last_rows_with_room_for_an_observation_window():
    assert split_validation(100, 300, 0.0, 16) == (300, 300)  # off: train on everything
    assert split_validation(100, 300, 0.2, 16) == (260, 260)  # 40 of 200 rows held out
    assert split_validation(0, 100, 0.05, 16) == (82, 82)  # 5 rows < W + 2 = 18: at least 18 held out
    with pytest.raises(ValueError, match="select_frac=0.5"):
        split_validation(0, 30, 0.5, 16)  # 18 held out would leave 12 < 18 to train on


def rising_tape(n: int = 40):
    """Best bid 100, 102, 104, ... and ask one tick above: a market LONG gains ~2 ticks a row, a SHORT loses them."""
    rows = [dict(bids=[(100 + 2 * t, 50), (99 + 2 * t, 50), (98 + 2 * t, 50)],
                 asks=[(101 + 2 * t, 50), (102 + 2 * t, 50), (103 + 2 * t, 50)]) for t in range(n)]
    return make_tape(rows)


def fixed_direction(learner: Learner, direction: int) -> None:
    """Weights whose greedy direction is `direction` everywhere: the direction branch's advantage output puts that
    action's mass on the top atom (every other output 0, so the other branches tie and argmax takes index 0:
    magnitude 1/3, MARKET)."""
    last = learner.online.advantages[0][-1]
    n_atoms = learner.online.support.shape[0]
    with torch.no_grad():
        for p in learner.online.parameters():
            p.zero_()
        last.bias.view(-1, n_atoms)[direction, -1] = 20.0


@pytest.fixture
def selector():
    torch.manual_seed(0)
    cfg = AgentConfig(n_features=2, env_state_dim=ENV_FEATURES, window=4, encoder="gru", d_model=8, head_hidden=8,
                      n_atoms=5, v_min=-2.0, v_max=2.0, n_layers=1, batch_size=4)
    learner = Learner(QNetwork(cfg), cfg, "cpu")
    tape = rising_tape()
    features = torch.zeros(len(tape), 2)
    sim_cfg = SimConfig(n_envs=1, max_position=3, maker_fee=0.5, taker_fee=1.0)
    return Selector(learner, features, tape, sim_cfg, window=4, val_start=0, val_stop=len(tape), n_envs=3,
                    min_net=0.0)


def test_selector_keeps_the_best_validated_weights_and_deploys_them(selector):
    learner = selector.learner
    fixed_direction(learner, SHORT)
    short = selector.validate(env_step=10)
    fixed_direction(learner, LONG)
    long_weights = [p.detach().clone() for p in learner.params]
    long = selector.validate(env_step=20)
    fixed_direction(learner, SHORT)
    again = selector.validate(env_step=30)
    assert short["val_net_pnl"] < 0 < long["val_net_pnl"] and short["val_trades"] == long["val_trades"] == 3
    assert short["improved"] and long["improved"] and not again["improved"]
    assert again["val_best_net_pnl"] == long["val_net_pnl"]
    s = selector.summary()
    assert (s["select_best_step"], s["select_validations"], s["stood_aside"]) == (20, 3, False)
    assert s["select_last_net_pnl"] == short["val_net_pnl"]
    selector.load_best()
    assert all(torch.equal(p, q) for p, q in zip(learner.params, long_weights))


def test_selector_stands_aside_when_no_validated_network_nets_more_than_the_floor(selector):
    assert selector.stands_aside  # nothing validated yet
    fixed_direction(selector.learner, SHORT)
    selector.validate(env_step=10)
    assert selector.stands_aside and selector.summary()["stood_aside"]
    fixed_direction(selector.learner, LONG)
    net = selector.validate(env_step=20)["val_net_pnl"]
    assert not selector.stands_aside
    selector.min_net = net  # the floor is strict: netting exactly the floor is not enough
    assert selector.stands_aside


def test_selector_state_round_trips_so_a_resumed_fold_selects_as_an_uninterrupted_one(selector):
    fixed_direction(selector.learner, LONG)
    selector.validate(env_step=20)
    state = {k: v.clone() for k, v in selector.state_dict().items()}
    fixed_direction(selector.learner, SHORT)
    selector.validate(env_step=30)
    selector.load_state_dict(state)  # as a restart from the checkpoint written after step 20
    assert selector.last_step == 20 and selector.summary()["select_validations"] == 1
    assert not selector.validate(env_step=30)["improved"]  # SHORT weights still lose to the restored best


def one_lucky_stretch_tape(n: int = 40):
    """Rows 0–15 rise 2 ticks a row, then the book stands still: of three validation segments (rows 3–15, 15–27,
    27–39) a LONG wins ~23 ticks on the first and pays the spread and fees on the other two."""
    rows = []
    for t in range(n):
        b = 100 + 2 * min(t, 15)
        rows.append(dict(bids=[(b, 50), (b - 1, 50), (b - 2, 50)], asks=[(b + 1, 50), (b + 2, 50), (b + 3, 50)]))
    return make_tape(rows)


def test_t_floor_stands_aside_on_one_lucky_stretch_but_not_on_a_steady_edge():
    torch.manual_seed(0)
    cfg = AgentConfig(n_features=2, env_state_dim=ENV_FEATURES, window=4, encoder="gru", d_model=8, head_hidden=8,
                      n_atoms=5, v_min=-2.0, v_max=2.0, n_layers=1, batch_size=4)
    learner = Learner(QNetwork(cfg), cfg, "cpu")
    sim_cfg = SimConfig(n_envs=1, max_position=3, maker_fee=0.5, taker_fee=1.0)
    fixed_direction(learner, LONG)

    def select(tape, min_t, n_envs=3):
        sel = Selector(learner, torch.zeros(len(tape), 2), tape, sim_cfg, window=4, val_start=0, val_stop=len(tape),
                       n_envs=n_envs, min_net=0.0, min_t=min_t)
        return sel, sel.validate(env_step=10)

    lucky, out = select(one_lucky_stretch_tape(), 2.0)
    # segments [+23, -1, -1] ticks less fees: mean ~7 ticks, sd ~13.9 ticks, t ~0.9: net > 0 but t < 2
    assert out["val_net_pnl"] > 0 and 0 < out["val_t"] < 2
    assert lucky.stands_aside and lucky.summary()["select_best_t"] == out["val_t"]
    lucky.min_t = 0.0  # the net-only rule deploys the same network
    assert not lucky.stands_aside
    # where t is undefined the net floor alone decides: every segment gains the same (no spread), or one segment
    steady, out = select(rising_tape(), 2.0)
    assert out["val_net_pnl"] > 0 and out["val_t"] is None and not steady.stands_aside
    assert steady.summary()["select_best_t"] is None
    single, out = select(one_lucky_stretch_tape(), 2.0, n_envs=1)
    assert single.seg_len > 10 and out["val_net_pnl"] > 0 and out["val_t"] is None and not single.stands_aside


def threshold_policy(threshold: float):
    """A market LONG where the newest observed feature is above `threshold`, else a market FLAT."""
    def policy(obs: torch.Tensor, env_state: torch.Tensor) -> torch.Tensor:
        a = torch.zeros(obs.shape[0], 4, dtype=torch.int64)
        a[:, 0] = torch.where(obs[:, -1, 0] > threshold, LONG, FLAT)
        return a

    return policy


def test_backtest_time_in_market_counts_the_steps_that_end_holding_a_position(selector):
    selector.features[:, 0] = torch.arange(len(selector.features), dtype=torch.float32)  # the row index
    assert (selector.seg_len, selector.start_rows.tolist()) == (12, [3, 15, 27])
    # always long (no latency: the order fills at the row it is decided on): every step ends holding, except the
    # last segment's last, which reaches the slice's last row, where the simulator flattens: 35 of 36
    assert selector.backtest(threshold_policy(-1.0))[3] == 35 / 36
    # long only where the observed row is > 20: segment 2 (rows 15-26) holds after rows 21..26 (6 steps), segment
    # 3 (rows 27-38) 11 steps, segment 1 none: 17 of 36
    assert selector.backtest(threshold_policy(20.0))[3] == 17 / 36
    assert selector.backtest(threshold_policy(99.0))[3] == 0.0


@pytest.mark.parametrize("cap", [0.2, 0.5, 0.75])
def test_calibrate_finds_the_smallest_margin_that_keeps_the_slice_under_the_cap(selector, cap):
    n = len(selector.features)
    selector.features[:, 0] = torch.arange(n, dtype=torch.float32) / n  # rises 1/40 a row

    def held(m: float) -> float:
        return selector.backtest(threshold_policy(m))[3]

    # slow reference: the share held only changes where the threshold crosses a row's value k/40, so the smallest
    # margin under the cap is the first such value under it
    reference = min(k / n for k in range(n + 1) if held(k / n) <= cap)
    margin = selector.calibrate(threshold_policy, cap)
    assert reference <= margin <= reference * (1 + 1 / 63) and held(margin) <= cap
    s = selector.summary()
    assert s["select_margin"] == margin and s["select_time_in_market"] == held(margin) <= cap
    assert s["select_free_time_in_market"] == held(0.0) > cap and s["select_max_exposure"] == cap


def test_calibrate_keeps_a_policy_already_under_the_cap_as_it_is(selector):
    selector.features[:, 0] = torch.arange(len(selector.features), dtype=torch.float32)
    assert selector.calibrate(lambda m: threshold_policy(20.0 + m), 0.5) == 0.0
    s = selector.summary()
    assert (s["select_margin_probes"], s["select_time_in_market"]) == (1, 17 / 36)


def test_the_exposure_cap_is_in_the_checkpoint_fingerprint_and_needs_the_slice():
    from trainer.loop.config import fingerprint_config, preset

    base = preset("smoke")
    a, b = (fingerprint_config(base.replace(loop={"max_exposure": x}).to_dict()) for x in (0.6, 0.5))
    assert a["loop"]["max_exposure"] == 0.6 and b["loop"]["max_exposure"] == 0.5 and a != b
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="max_exposure"):
            base.replace(loop={"max_exposure": bad})
    with pytest.raises(ValueError, match="select_frac > 0"):
        base.replace(loop={"select_frac": 0.0})
    assert base.replace(loop={"select_frac": 0.0, "max_exposure": 1.0}).loop.max_exposure == 1.0
