"""PrioritizedReplay: storage, proportional sampling, IS weights, priority updates, checkpoint state."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer.agent.replay import (
    NStepAccumulator, PrioritizedReplay, ReplayConfig, Transitions, bench_replay, effective_capacity,
)

S, B = 3, 4


def make_transitions(ids, device="cpu") -> Transitions:
    """Rows whose every field is derived from an id, so a stored slot can be traced back to it."""
    ids = torch.as_tensor(ids, dtype=torch.int64, device=device)
    f = ids.to(torch.float32)
    return Transitions(
        row=ids, env_state=f.unsqueeze(1) * torch.tensor([1.0, 2.0, 3.0], device=device),
        action=(ids.unsqueeze(1) + torch.arange(B, device=device)) % 7,
        return_n=f * 0.5, discount_n=torch.full_like(f, 0.9), next_row=ids + 1000,
        next_env_state=-f.unsqueeze(1).expand(-1, S).clone(),
    )


def filled(capacity, n, **kw) -> PrioritizedReplay:
    rb = PrioritizedReplay(capacity, S, B, "cpu", **kw)
    rb.add(make_transitions(range(n)), torch.ones(n, dtype=torch.bool))
    return rb


def test_effective_capacity_is_at_least_four_pushes_rounded_up_to_a_power_of_two():
    assert effective_capacity(1000, 10) == 1024
    assert effective_capacity(1024, 10) == 1024
    assert effective_capacity(100, 256) == 1024  # 4 * 256
    assert effective_capacity(1, 1) == 4
    assert effective_capacity(1025, 1) == 2048
    with pytest.raises(ValueError, match="capacity"):
        effective_capacity(0, 4)


def test_add_compacts_valid_rows_contiguously_and_wraps_the_ring():
    rb = PrioritizedReplay(8, S, B, "cpu")
    rb.add(make_transitions([10, 11, 12, 13, 14]), torch.tensor([True, False, True, False, True]))
    assert rb.row[:3].tolist() == [10, 12, 14]
    assert rb.write_ptr.item() == 3 and rb.size.item() == 3
    assert rb.priority[:8].tolist() == [1.0, 1.0, 1.0, 0, 0, 0, 0, 0]
    rb.add(make_transitions([20, 21, 22, 23, 24, 25, 26]), torch.tensor([True] * 6 + [False]))
    # 3 + 6 = 9 rows into 8 slots: 20..24 fill slots 3..7, 25 overwrites slot 0 (oldest)
    assert rb.row[:8].tolist() == [25, 12, 14, 20, 21, 22, 23, 24]
    assert rb.write_ptr.item() == 1 and rb.size.item() == 8
    # all fields travel together; actions come back int64 from compact storage
    idx = torch.tensor([0, 3])
    assert rb.action.dtype == torch.int16
    ref = make_transitions([25, 20])
    for f in ("env_state", "return_n", "discount_n", "next_row", "next_env_state"):
        assert torch.equal(getattr(rb, f)[idx], getattr(ref, f)), f
    assert torch.equal(rb.action[idx].long(), ref.action)


def test_add_of_more_rows_than_capacity_is_refused():
    rb = PrioritizedReplay(4, S, B, "cpu")
    with pytest.raises(ValueError, match="exceeds capacity 4"):
        rb.add(make_transitions(range(5)), torch.ones(5, dtype=torch.bool))


def test_new_items_get_the_running_max_priority():
    rb = filled(16, 4)
    rb.update_priorities(torch.tensor([1]), torch.tensor([5.0]))
    rb.update_priorities(torch.tensor([1]), torch.tensor([0.5]))  # max never decreases
    rb.add(make_transitions([50, 51]), torch.ones(2, dtype=torch.bool))
    assert rb.priority[4:6].tolist() == pytest.approx([5.0 + 1e-6] * 2)


def test_zero_priority_and_empty_slots_are_never_sampled():
    torch.manual_seed(0)
    rb = filled(64, 40, alpha=0.5, eps=0.0)
    zero = torch.arange(0, 40, 2)  # even slots → priority exactly 0
    rb.update_priorities(zero, torch.zeros(20))
    rb.update_priorities(torch.tensor([39]), torch.tensor([1e4]))  # one dominant slot, so rounding is stressed
    seen = torch.zeros(64, dtype=torch.int64)
    for _ in range(100):
        idx, batch = rb.sample(1024)
        w = batch.weight
        seen += torch.bincount(idx, minlength=64)
        assert torch.equal(batch.row, idx)  # rows were added as ids == slots
    assert seen[zero].sum().item() == 0
    assert seen[40:].sum().item() == 0  # empty slots
    assert (seen[1:40:2] > 0).all()  # every positive slot does get drawn


@pytest.mark.parametrize("u01", [0.0, 1.0])
def test_draws_exactly_on_cdf_boundaries_never_pick_zero_priority_or_empty_slots(monkeypatch, u01):
    """Force torch.rand to 0 (u on every stratum's left edge) or 1 (u reaches the total).

    priorities (0, 1, 0, 1, empty...), α = 1: cdf = (0, 1, 1, 2, 2, ...). u = 0 and u = 1 sit on
    steps of zero-priority slots 0 and 2; u = total = 2 would run past the last positive slot.
    """
    rb = filled(8, 4, alpha=1.0, eps=0.0)
    rb.update_priorities(torch.arange(4), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full_like(real_rand(*a, **k), u01))
    idx, _ = rb.sample(4)
    expect = [1, 1, 3, 3] if u01 == 0.0 else [1, 3, 3, 3]
    assert idx.tolist() == expect


def test_sampling_frequency_is_proportional_to_priority_to_the_alpha():
    torch.manual_seed(1234)
    K, alpha = 32, 0.7
    rb = filled(K, K, alpha=alpha, eps=0.0)
    prio = torch.linspace(0.05, 3.0, K)
    rb.update_priorities(torch.arange(K), prio)
    counts = torch.zeros(K, dtype=torch.float64)
    draws, batch = 0, 64
    for _ in range(1500):
        idx, _ = rb.sample(batch)
        counts += torch.bincount(idx, minlength=K).double()
        draws += batch

    def chi2(p):
        expected = draws * p / p.sum()
        return (((counts - expected) ** 2) / expected).sum().item()

    # df = 31: the 0.999 quantile of chi^2(31) is 61.1. A stratified sampler is less noisy than
    # multinomial draws, so a correct sampler sits well below it.
    assert chi2(prio.double() ** alpha) < 61.1
    # power check: the same counts are far from the wrong exponent
    assert chi2(prio.double() ** 1.0) > 300


def test_alpha_zero_samples_uniformly_over_filled_slots_only():
    torch.manual_seed(3)
    rb = filled(32, 10, alpha=0.0)
    rb.update_priorities(torch.arange(10), torch.linspace(0.1, 9.0, 10))
    idx, sampled = rb.sample(1000)
    w = sampled.weight
    assert idx.max().item() < 10
    # stratified: each filled slot gets 100 ± 1 of 1000 draws
    assert (torch.bincount(idx, minlength=10) - 100).abs().max().item() <= 1
    assert torch.allclose(w, torch.ones_like(w))


def test_importance_weights_match_hand_computed_values():
    # priorities 1 and 3, α = 1, β = 1, N = 2: P = (0.25, 0.75); w = (N·P)^-1 = (2, 2/3) → /max = (1, 1/3)
    rb = filled(8, 2, alpha=1.0, beta_start=1.0, beta_end=1.0, eps=0.0)
    rb.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, 3.0]))
    idx, sampled = rb.sample(8)  # stratified over 8 segments: exactly 2 draws of slot 0, 6 of slot 1
    w = sampled.weight
    assert idx.tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert w.tolist() == pytest.approx([1.0, 1.0] + [1 / 3] * 6)


def test_beta_and_alpha_anneal_linearly_on_the_sample_counter():
    rb = filled(8, 4, alpha=0.6, alpha_end=0.2, beta_start=0.4, beta_end=1.0, beta_steps=4)
    betas, alphas = [], []
    for _ in range(6):
        betas.append(rb.beta.item())
        alphas.append(rb.alpha.item())
        rb.sample(2)
    assert betas == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    assert alphas == pytest.approx([0.6, 0.5, 0.4, 0.3, 0.2, 0.2])
    # weights use the current β: priorities 1 and 4, α = 0.2 → P ∝ (1, 4^0.2); β = 1 now
    rb.update_priorities(torch.arange(4), torch.tensor([1.0, 4.0, 1.0, 4.0]))
    idx, sampled = rb.sample(64)
    w = sampled.weight
    pa = torch.tensor([1.0, 4.0, 1.0, 4.0]) ** 0.2
    expect = 1.0 / (4 * pa[idx] / pa.sum())
    assert torch.allclose(w, expect / expect.max(), rtol=1e-5)


def test_duplicate_indices_in_one_update_take_the_max_and_the_priority_sum_stays_exact():
    rb = filled(16, 10, eps=0.01)
    idx = torch.tensor([3, 7, 3, 3, 7, 9])
    new = torch.tensor([0.2, 5.0, 0.9, 0.4, 1.0, -2.0])  # sign ignored (|TD error|)
    rb.update_priorities(idx, new)
    expect = [1.0] * 10 + [0.0] * 6
    expect[3], expect[7], expect[9] = 0.9 + 0.01, 5.0 + 0.01, 2.0 + 0.01
    assert rb.priority[:16].tolist() == pytest.approx(expect)
    assert rb.priority[:16].sum().item() == pytest.approx(sum(expect))
    assert rb.max_priority.item() == pytest.approx(5.01)


def test_cached_priority_to_the_alpha_stays_equal_to_a_recomputation():
    torch.manual_seed(2)
    rb = PrioritizedReplay(32, S, B, "cpu", alpha=0.6, eps=0.0)
    for t in range(12):  # wraps the ring several times; duplicates and zeros in the updates
        rb.add(make_transitions(torch.arange(7) + 7 * t), torch.rand(7) < 0.8)
        idx = torch.randint(0, 32, (20,))
        rb.update_priorities(idx, torch.rand(20) * 4 * (torch.rand(20) < 0.7))
    p = rb.priority[:32]
    assert torch.equal(rb.priority_alpha[:32], torch.where(p > 0, p.pow(0.6), torch.zeros_like(p)))


def test_non_finite_priorities_keep_the_old_priority():
    rb = filled(8, 4, eps=0.0)
    rb.update_priorities(torch.tensor([0, 1, 2]), torch.tensor([2.0, 3.0, 4.0]))
    rb.update_priorities(torch.tensor([0, 1, 2]), torch.tensor([float("nan"), float("inf"), 0.5]))
    assert rb.priority[:4].tolist() == [2.0, 3.0, 0.5, 1.0]
    assert math.isfinite(rb.max_priority.item())


def test_state_dict_round_trip_continues_identically():
    acc = NStepAccumulator(8, 3, 0.9, S, B, "cpu")
    a = PrioritizedReplay(64, S, B, "cpu", beta_steps=10)
    gen = torch.Generator().manual_seed(5)

    def step(rb, acc, t):
        ids = torch.arange(8) + 8 * t
        tr = make_transitions(ids)
        out, valid = acc.push(tr.row, tr.env_state, tr.action, tr.return_n, ids % 5 == 0, tr.next_row, tr.next_env_state)
        rb.add(out, valid)
        idx, batch = rb.sample(16)
        w = batch.weight
        rb.update_priorities(idx, torch.rand(16, generator=gen) * 3)
        return idx, batch, w

    torch.manual_seed(11)
    for t in range(12):
        step(a, acc, t)
    saved_rb = {k: v.clone() for k, v in a.state_dict().items()}
    saved_acc = {k: v.clone() for k, v in acc.state_dict().items()}
    rng_torch, rng_gen = torch.get_rng_state(), gen.get_state()
    run_a = [step(a, acc, t) for t in range(12, 20)]

    b, acc_b = PrioritizedReplay(64, S, B, "cpu", beta_steps=10), NStepAccumulator(8, 3, 0.9, S, B, "cpu")
    b.load_state_dict(saved_rb)
    acc_b.load_state_dict(saved_acc)
    torch.set_rng_state(rng_torch)
    gen.set_state(rng_gen)
    run_b = [step(b, acc_b, t) for t in range(12, 20)]
    for (ia, ba, wa), (ib, bb, wb) in zip(run_a, run_b):
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
        assert torch.equal(ba.return_n, bb.return_n) and torch.equal(ba.action, bb.action)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_load_state_dict_refuses_a_different_layout_naming_the_key():
    a = PrioritizedReplay(64, S, B, "cpu")
    with pytest.raises(ValueError, match="'row' has shape"):
        PrioritizedReplay(128, S, B, "cpu").load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="'env_state' has shape"):
        PrioritizedReplay(64, S + 1, B, "cpu").load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(capacity=0), "capacity"), (dict(alpha=1.5), "alpha"), (dict(alpha_end=-0.1), "alpha_end"),
        (dict(beta_start=-1.0), "beta_start"), (dict(beta_end=2.0), "beta_end"), (dict(beta_steps=0), "beta_steps"),
        (dict(eps=-1e-3), "eps"), (dict(eps=float("nan")), "eps"),
    ],
)
def test_invalid_config_is_refused_naming_the_field_and_value(kwargs, field):
    base = dict(capacity=16, env_state_dim=S, n_branches=B, device="cpu")
    with pytest.raises(ValueError, match=f"{field} must be .*got {list(kwargs.values())[0]}"):
        PrioritizedReplay(**{**base, **kwargs})
    with pytest.raises(ValueError, match=field):
        ReplayConfig(**kwargs)


def test_add_sample_update_have_no_host_sync_on_meta_device():
    """Meta tensors have no data: any .item()/bool()/nonzero/data-dependent shape would raise here."""
    rb = PrioritizedReplay(64, S, B, "meta")
    rb.add(make_transitions(torch.zeros(8, dtype=torch.long, device="meta"), "meta"),
           torch.zeros(8, dtype=torch.bool, device="meta"))
    idx, batch = rb.sample(16)
    w = batch.weight
    rb.update_priorities(idx, torch.zeros(16, device="meta"))
    assert idx.shape == (16,) and batch.next_env_state.shape == (16, S) and w.shape == (16,)


def test_bench_replay_reports_positive_rates():
    r = bench_replay(capacity=256, n_envs=16, batch=32, device="cpu", steps=3)
    for k in ("push_add_per_s", "transitions_added_per_s", "sample_per_s", "rows_sampled_per_s", "update_per_s"):
        assert r[k] > 0, k
    assert r["transitions_added_per_s"] == pytest.approx(16 * r["push_add_per_s"])


@pytest.mark.gpu
def test_push_add_sample_update_capture_as_a_cuda_graph_and_replay_like_eager():
    dev = torch.device("cuda")
    n_envs, n_step, batch = 64, 3, 128

    def build():
        return NStepAccumulator(n_envs, n_step, 0.9, S, B, dev), PrioritizedReplay(1024, S, B, dev, beta_steps=50)

    # static inputs, refilled in place before every replay
    gen = torch.Generator().manual_seed(0)
    stream = []
    for t in range(40):
        tr = make_transitions(torch.randint(0, 10_000, (n_envs,), generator=gen))
        stream.append((tr.row, tr.env_state, tr.action, torch.randn(n_envs, generator=gen),
                       torch.rand(n_envs, generator=gen) < 0.1, tr.next_row, tr.next_env_state))
    static = [x.to(dev).clone() for x in stream[0]]

    def step(acc, rb, inputs):
        out, valid = acc.push(*inputs)
        rb.add(out, valid)
        idx, b = rb.sample(batch)
        w = b.weight
        rb.update_priorities(idx, b.return_n.abs() * w)  # a priority that depends on the sample
        return idx, w

    warm_stream = stream[:n_step]  # fill the buffer eagerly so sampling is defined before capture
    acc_e, rb_e = build()
    acc_g, rb_g = build()
    for acc, rb in ((acc_e, rb_e), (acc_g, rb_g)):
        for x in warm_stream:
            out, valid = acc.push(*[y.to(dev) for y in x])
            rb.add(out, valid)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        # eager warm-up of every op on the capture stream (lazy inits must not happen in capture)
        step(acc_g, rb_g, static)
        torch.cuda.synchronize()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_idx, g_w = step(acc_g, rb_g, static)
    # undo the warm-up step: both runs continue from the same state (in place, graph addresses kept)
    acc_g.load_state_dict(acc_e.state_dict())
    rb_g.load_state_dict(rb_e.state_dict())

    torch.manual_seed(42)
    eager = []
    for x in stream[n_step:]:
        idx, w = step(acc_e, rb_e, [y.to(dev) for y in x])
        eager.append((idx.clone(), w.clone()))
    torch.manual_seed(42)
    for (e_idx, e_w), x in zip(eager, stream[n_step:]):
        for dst, src in zip(static, x):
            dst.copy_(src.to(dev))
        graph.replay()
        assert torch.equal(g_idx, e_idx)
        assert torch.allclose(g_w, e_w)
    for k, v in rb_e.state_dict().items():
        assert torch.allclose(v.float(), rb_g.state_dict()[k].float()), k
