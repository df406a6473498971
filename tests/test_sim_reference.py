"""Property tests: the vectorised Simulator and the plain-Python ReferenceSimulator give identical
trajectories (positions, orders, fills, fees, rewards, statistics) for random actions on random slices of
random, real (LOBSTER AMZN) and synthetic (trainer.data.synth) decision tapes, with the default order kinds and
with the marketable-limit kinds (IOC / FOK / POST_ONLY) and feed latency."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.features.decision import DecisionTape, build_decision_tape
from trainer.sim import BRANCH_SIZES, SimConfig, Simulator
from trainer.sim.reference import ReferenceSimulator
from trainer.sim.synthetic import random_decision_tape

# Integer state compared exactly, by SimState field name -> reference attribute getter.
_INT_FIELDS = {
    "cursor": lambda e: e.cursor,
    "reset_count": lambda e: e.reset_count,
    "position": lambda e: e.position,
    "cash_ticks": lambda e: e.cash_ticks,
    "entry_cost_ticks": lambda e: e.entry_cost_ticks,
    "realised_ticks": lambda e: e.realised_ticks,
    "maker_qty": lambda e: e.maker_qty,
    "taker_qty": lambda e: e.taker_qty,
    "trip_maker_qty": lambda e: e.trip_maker_qty,
    "trip_taker_qty": lambda e: e.trip_taker_qty,
    "time_in_trade": lambda e: e.time_in_trade,
    "order_side": lambda e: e.order.side if e.order else 0,
    "order_px": lambda e: e.order.px if e.order else 0,
    "order_size": lambda e: e.order.size if e.order else 0,
    "order_remaining": lambda e: e.order.remaining if e.order else 0,
    "order_queue": lambda e: e.order.queue if e.order else 0,
    "order_age": lambda e: e.order.age if e.order else 0,
    "order_lifetime": lambda e: e.order.lifetime if e.order else 0,
    "round_trips": lambda e: e.round_trips,
    "wins": lambda e: e.wins,
    "closed_maker_qty": lambda e: e.closed_maker_qty,
    "closed_taker_qty": lambda e: e.closed_taker_qty,
    "limit_orders": lambda e: e.limit_orders,
    "limit_filled": lambda e: e.limit_filled,
    "market_orders": lambda e: e.market_orders,
    "expired_orders": lambda e: e.expired_orders,
    "rejected_orders": lambda e: e.rejected_orders,
}


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(np.abs(a - b) <= 1e-6 * np.maximum(1.0, np.abs(b))))


def run_sim_vs_reference(tape: DecisionTape, cfg: SimConfig, window: tuple[int, int], min_history: int,
                         n_steps: int, action_seed: int) -> dict[str, int]:
    """Step both simulators with the same random actions; assert equality after every step."""
    sim = Simulator(tape, cfg, "cpu")
    ref = ReferenceSimulator(tape, cfg)
    st = sim.reset(window[0], window[1], min_history)
    ref.reset(window[0], window[1], min_history)
    rng = np.random.default_rng(action_seed)
    for k in range(n_steps):
        # Bias towards HOLD now and then so limit orders live long enough to queue, expire and fill.
        actions = np.stack([rng.integers(0, b, cfg.n_envs) for b in BRANCH_SIZES], axis=1)
        actions[rng.random(cfg.n_envs) < 0.4, 0] = 1
        out = sim.step(st, torch.as_tensor(actions, dtype=torch.int64))
        ref_out = ref.step(actions.tolist())
        for name, get in _INT_FIELDS.items():
            want = np.array([get(e) for e in ref.envs])
            got = getattr(st, name).numpy()
            assert np.array_equal(got, want), f"step {k}: {name} differs: sim {got} ref {want}"
        assert np.array_equal(st.action_counts.numpy(), np.array([e.action_counts for e in ref.envs]))
        assert np.array_equal(out.done.numpy(), np.array([o.done for o in ref_out])), f"step {k}: done"
        assert np.array_equal(out.truncated.numpy(), np.array([o.truncated for o in ref_out]))
        assert np.array_equal(out.trip_closed.numpy(), np.array([o.trip_closed for o in ref_out]))
        assert np.array_equal(out.filled_qty.numpy(), np.array([o.filled_qty for o in ref_out]))
        assert _close(out.reward.double().numpy(), np.array([o.reward for o in ref_out])), f"step {k}: reward"
        assert _close(out.trip_pnl.double().numpy(), np.array([o.trip_pnl for o in ref_out])), f"step {k}: trip_pnl"
        assert _close(out.fees.double().numpy(), np.array([o.fees for o in ref_out])), f"step {k}: fees"
        # The env must never observe a row outside its window.
        assert bool(((st.cursor >= window[0] + min_history) & (st.cursor <= window[1] - 2)).all())
    assert _close(sim.equity(st).double().numpy(), np.array([ref.equity(e) for e in ref.envs]))
    stats = sim.stats(st)
    assert int(stats["round_trips"]) == sum(e.round_trips for e in ref.envs)
    assert int(stats["wins"]) == sum(e.wins for e in ref.envs)
    return {"round_trips": int(stats["round_trips"]), "resets": int(st.reset_count.sum()),
            "limit_fills": int(st.limit_filled.sum()), "expired": int(st.expired_orders.sum()),
            "maker": int(st.maker_qty.sum()), "taker": int(st.taker_qty.sum()),
            "rejected": int(st.rejected_orders.sum()), "market_orders": int(st.market_orders.sum())}


def _assert_rich(counts: dict[str, int]) -> None:
    """The run exercised the rules it claims to test (not a vacuous comparison of idle envs)."""
    for key in ("round_trips", "resets", "limit_fills", "maker", "taker"):
        assert counts[key] > 0, f"random run never produced any {key}: {counts}"


@pytest.mark.parametrize(
    "latency,on_expiry,beyond",
    [(0, "cancel", 1), (2, "market", 0), (1, "cancel", 3)],
)
def test_sim_matches_reference_on_random_tape(latency: int, on_expiry: str, beyond: int) -> None:
    tape = random_decision_tape(400, levels=4, radius=3, seed=latency + 11)
    cfg = SimConfig(n_envs=24, max_position=4, latency_steps=latency, on_expiry=on_expiry, beyond_depth_ticks=beyond,
                    urgency_lifetimes=(1, 3, 8), maker_fee=0.35, taker_fee=1.1, inventory_penalty=0.02, seed=5)
    counts = run_sim_vs_reference(tape, cfg, window=(40, 130), min_history=10, n_steps=150, action_seed=latency)
    _assert_rich(counts)
    assert counts["expired"] > 0


@pytest.mark.parametrize(
    "order_types,marketable,post_only,latency,feed",
    [(("ioc", "limit_touch", "post_only"), 1, 1, 0, 0),
     (("fok", "post_only", "limit_passive"), 2, 2, 1, 3),
     (("post_only", "ioc", "fok"), 0, 0, 2, 1),
     (("market", "fok", "ioc"), 0, 1, 0, 2)],
)
def test_sim_matches_reference_with_marketable_limit_kinds_and_feed_latency(
        order_types: tuple[str, str, str], marketable: int, post_only: int, latency: int, feed: int) -> None:
    tape = random_decision_tape(400, levels=4, radius=3, seed=17 + latency)
    cfg = SimConfig(n_envs=24, max_position=9, latency_steps=latency, on_expiry="market", urgency_lifetimes=(1, 3, 8),
                    maker_fee=0.35, taker_fee=1.1, seed=6, order_types=order_types,
                    marketable_limit_ticks=marketable, post_only_ticks=post_only, feed_latency_steps=feed)
    counts = run_sim_vs_reference(tape, cfg, window=(40, 130), min_history=10, n_steps=150, action_seed=31 + feed)
    for key in ("round_trips", "resets", "taker", "market_orders", "rejected"):
        assert counts[key] > 0, f"random run never produced any {key}: {counts}"
    if any(k in order_types for k in ("limit_touch", "limit_passive", "post_only")):
        assert counts["limit_fills"] > 0 and counts["maker"] > 0, counts


def _decision_tape_for(spec: str, clock_events: int, radius: int, work_dir=None) -> DecisionTape:
    from trainer.data.spec import load_tape
    from trainer.features.clock import decision_rows
    from trainer.features.config import FeatureConfig

    tape = load_tape(spec, work_dir=work_dir)
    fcfg = FeatureConfig(clock="events", clock_events=clock_events, trade_radius_ticks=radius)
    rows = decision_rows(tape.book, fcfg, start_ns=tape.preopen_end_ns)
    return build_decision_tape(tape, rows, radius)


@pytest.fixture(scope="module")
def lobster_decisions(shared_data) -> DecisionTape:
    zip_path = shared_data / "lobster" / "LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
    return _decision_tape_for(f"lobster:{zip_path}", clock_events=20, radius=8)


@pytest.mark.parametrize("seed", [0, 1])
def test_sim_matches_reference_on_random_slices_of_real_lobster_tape(lobster_decisions: DecisionTape,
                                                                     seed: int) -> None:
    rng = np.random.default_rng(seed)
    start = int(rng.integers(0, len(lobster_decisions) - 400))
    cfg = SimConfig(n_envs=16, max_position=3, latency_steps=seed, on_expiry=("cancel", "market")[seed],
                    urgency_lifetimes=(1, 4, 12), seed=seed)
    counts = run_sim_vs_reference(lobster_decisions, cfg, window=(start, start + 120), min_history=5, n_steps=120,
                                  action_seed=100 + seed)
    _assert_rich(counts)


def test_sim_matches_reference_with_marketable_limit_kinds_on_real_lobster_tape(
        lobster_decisions: DecisionTape) -> None:
    rng = np.random.default_rng(5)
    start = int(rng.integers(0, len(lobster_decisions) - 400))
    # AMZN spreads are 5-23 ticks (5th-95th percentile): a post-only 10 ticks in front crosses now and then.
    cfg = SimConfig(n_envs=16, max_position=9, latency_steps=1, order_types=("ioc", "post_only", "fok"),
                    marketable_limit_ticks=2, post_only_ticks=10, feed_latency_steps=2, urgency_lifetimes=(1, 4, 12))
    counts = run_sim_vs_reference(lobster_decisions, cfg, window=(start, start + 120), min_history=5, n_steps=120,
                                  action_seed=77)
    for key in ("round_trips", "resets", "limit_fills", "maker", "taker", "rejected"):
        assert counts[key] > 0, f"random run never produced any {key}: {counts}"


def test_sim_matches_reference_on_random_slices_of_synthetic_tape(tmp_path) -> None:
    decisions = _decision_tape_for("synthetic:seed=1,days=1", clock_events=20, radius=8, work_dir=tmp_path)
    rng = np.random.default_rng(3)
    start = int(rng.integers(0, len(decisions) - 400))
    cfg = SimConfig(n_envs=16, latency_steps=1, on_expiry="market", urgency_lifetimes=(1, 4, 12), seed=3)
    counts = run_sim_vs_reference(decisions, cfg, window=(start, start + 150), min_history=5, n_steps=150,
                                  action_seed=7)
    _assert_rich(counts)
