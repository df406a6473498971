"""LoopConfig.exposure_gain: the exposure cap kept out of sample by trainer.loop.exposure.ExposureController. The
margin's recursion on a hand-computed stream; the segments starting from the recorded pass; the whole evaluation
(continuous pass and segments) against a one-env-at-a-time reference replay that runs the recursion with Python
floats; the cap pulling an always-in policy to about its share, and leaving one under it about as it was."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.folds.evaluate import evaluate
from trainer.loop.exposure import ExposureController
from trainer.loop.config import fingerprint_config, preset
from trainer.settings import EvalConfig, LoopConfig
from trainer.sim import FLAT, LONG, MARKET, SimConfig, Simulator
from trainer.sim.synthetic import random_decision_tape

W, N_ROWS, START, STOP = 4, 400, 100, 400
SIM = SimConfig(n_envs=1, seed=3)


def _env(positions: list[int]) -> torch.Tensor:
    env = torch.zeros(len(positions), 7)
    env[:, 0] = torch.tensor(positions, dtype=torch.float32) / 3.0
    return env


def test_the_margin_follows_the_recursion_by_hand_and_never_goes_below_zero():
    seen = []

    def policy_at(m):  # the policy reads the margin tensor when it decides
        def policy(obs, env):
            seen.append(m.clone())
            return torch.zeros(obs.shape[0], 4, dtype=torch.int64)
        return policy

    c = ExposureController(policy_at, margin0=0.1, cap=0.5, gain=0.05)
    c.start(torch.tensor([10]), record=True)
    obs = torch.zeros(1, W, 2)
    for pos in (0, 1, -2, 0, 0, 0, 0):  # held 0, 1, 1, 0, 0, 0, 0
        c(obs, _env([pos]))
    # m_k = max(0, m_{k-1} + 0.05 (held_k - 0.5)) from 0.1: 0.075, 0.1, 0.125, 0.1, 0.075, 0.05, 0.025
    want = [0.075, 0.1, 0.125, 0.1, 0.075, 0.05, 0.025]
    assert [round(float(m), 6) for m in seen] == want
    c.start(torch.tensor([0, 12, 16, 17, 40]))  # ends the recording; segments start from it
    assert c.path.tolist() == pytest.approx([0.1, *want[:-1]])  # m_{k-1}: the margin decision k starts from
    # rows 12 and 16 are decisions 2 and 6 of the recorded pass (first row 10); 0 is before it, 17 and 40 after
    assert c._margin.tolist() == pytest.approx([0.1, 0.1, 0.05, 0.1, 0.1])
    floor = ExposureController(policy_at, margin0=0.01, cap=0.5, gain=0.05)
    floor.start(torch.tensor([0, 1]))
    floor(obs.expand(2, W, 2), _env([0, 3]))
    assert seen[-1].tolist() == pytest.approx([0.0, 0.035])  # max(0, 0.01 - 0.025), 0.01 + 0.025
    assert c.summary()["eval_margin_start"] == 0.1 and c.summary()["eval_margin_mean"] == pytest.approx(
        float(np.mean([0.1, *want[:-1]])))


def test_the_controller_refuses_a_decision_before_start_and_bad_settings():
    c = ExposureController(lambda m: None, 0.0, 0.5, 0.1)
    with pytest.raises(RuntimeError, match="start"):
        c(torch.zeros(1, W, 2), _env([0]))
    for cap, gain in ((1.0, 0.1), (0.0, 0.1), (0.5, 0.0)):
        with pytest.raises(ValueError):
            ExposureController(lambda m: None, 0.0, cap, gain)


def test_exposure_gain_is_a_config_field_with_its_rules_and_in_the_fingerprint():
    base = preset("smoke").replace(loop={"exposure_gain": 0.0})
    assert LoopConfig().exposure_gain == 0.0  # off by default: the slice's margin throughout
    on = base.replace(loop={"exposure_gain": 0.01})
    assert fingerprint_config(on.to_dict())["loop"]["exposure_gain"] == 0.01
    assert fingerprint_config(on.to_dict()) != fingerprint_config(base.to_dict())
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="exposure_gain"):
            base.replace(loop={"exposure_gain": bad})


@pytest.mark.parametrize(("field", "on", "bad"), [
    ("keep_margin_frac", 0.0, (-0.1, 1.5, float("nan"))),
    ("min_hold_steps", 8, (-1,)),
])
def test_the_deployment_rules_beside_the_cap_are_config_fields_off_by_default_and_in_the_fingerprint(field, on, bad):
    from trainer.settings import EVALUATION_ONLY

    base = preset("smoke")
    assert getattr(LoopConfig(), field) == getattr(base.loop, field) and getattr(base.loop, field) != on
    fp = fingerprint_config(base.replace(loop={field: on}).to_dict())
    assert fp["loop"][field] == on and fp != fingerprint_config(base.to_dict())
    assert f"loop.{field}" in EVALUATION_ONLY  # --evaluate-from may redeploy a trained fold under another value
    for b in bad:
        with pytest.raises(ValueError, match=field):
            base.replace(loop={field: b})


@pytest.fixture(scope="module")
def market():
    tape = random_decision_tape(N_ROWS, seed=5)
    feats = torch.as_tensor(np.random.default_rng(2).standard_normal((N_ROWS, 2)), dtype=torch.float32)
    return tape, feats


def _threshold_at(offset: float):
    """policy_at(margin): LONG (one lot, market) where the last row's first feature beats margin - offset, else FLAT.
    offset 2: the free policy (margin 0) is in the market ~98 % of the time; offset -1: ~16 %."""
    def policy_at(margin):
        def policy(obs, env):
            a = torch.zeros(obs.shape[0], 4, dtype=torch.int64)
            a[:, 0] = torch.where(obs[:, -1, 0] > margin - offset, LONG, FLAT)
            a[:, 2] = MARKET
            return a
        return policy
    return policy_at


def _reference(tape, feats, offset: float, m0: float, cap: float, gain: float, n_seg: int):
    """The continuous pass one step at a time with the margin as a Python float, then each segment alone from the
    margin the pass had at its first row. Returns (pass time in market, pass net, segments' net, trips)."""
    first = START + W - 1
    span = STOP - 1 - first
    sim = Simulator(tape, SIM, "cpu")
    st = sim.reset(START, STOP, min_history=W - 1, start_rows=torch.tensor([first]))
    m, path, held_steps = m0, [], 0
    for _ in range(span):
        path.append(m)
        held = int(st.position[0]) != 0
        m = max(0.0, m + gain * (float(held) - cap))
        x = float(feats[int(st.cursor[0]), 0])
        a = torch.tensor([[LONG if x > m - offset else FLAT, 0, MARKET, 0]])
        sim.step(st, a)
        held_steps += int(st.position[0]) != 0
    cont = sim.stats(st)
    seg_len = span // n_seg
    net, trips = 0.0, 0
    for i in range(n_seg):
        row = first + i * seg_len
        s = Simulator(tape, SIM, "cpu")
        st = s.reset(START, STOP, min_history=W - 1, start_rows=torch.tensor([row]))
        m = path[row - first]
        for _ in range(seg_len):
            held = int(st.position[0]) != 0
            m = max(0.0, m + gain * (float(held) - cap))
            x = float(feats[int(st.cursor[0]), 0])
            s.step(st, torch.tensor([[LONG if x > m - offset else FLAT, 0, MARKET, 0]]))
        s.step(st, torch.tensor([[FLAT, 0, MARKET, 0]]))
        stats = s.stats(st)
        net, trips = net + float(stats["net_pnl"]), trips + int(stats["round_trips"])
    return held_steps, float(cont["net_pnl"]), net, trips


@pytest.mark.parametrize("offset", [2.0, -1.0])
def test_evaluation_under_the_controller_matches_a_step_by_step_reference(market, offset):
    tape, feats = market
    m0, cap, gain, n_seg = 0.3, 0.5, 0.2, 8
    c = ExposureController(_threshold_at(offset), m0, cap, gain)
    cfg = EvalConfig(n_envs=n_seg)
    res = evaluate(c, feats, tape, SIM, W, START, STOP, cfg=cfg)
    held_steps, cont_net, seg_net, trips = _reference(tape, feats, offset, m0, cap, gain, n_seg)
    span = STOP - 1 - (START + W - 1)
    assert res.metrics["continuous_net_pnl"] == pytest.approx(cont_net, abs=1e-3)
    assert int((res.position[1:] != 0).sum()) == held_steps
    assert res.metrics["net_pnl"] == pytest.approx(seg_net, abs=1e-3) and res.metrics["trades"] == trips
    held = held_steps / span
    free = evaluate(_threshold_at(offset)(0.0), feats, tape, SIM, W, START, STOP, cfg=cfg)
    free_held = float((free.position[1:] != 0).mean())
    if offset == 2.0:  # always in when free: the controller pulls it to about the cap
        assert free_held > 0.95 and abs(held - cap) < 0.08, (free_held, held)
    else:  # under the cap when free: a cap, not a floor; the margin stays near 0
        assert free_held < cap and abs(held - free_held) < 0.05, (free_held, held)
        assert c.summary()["eval_margin_mean"] < 0.1
