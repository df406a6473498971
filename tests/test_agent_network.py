"""QNetwork: shapes, the selective scan against its sequential reference, causality, the dueling
identity, padded actions, initial Q ≈ 0, config validation."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.agent.config import AgentConfig
from trainer.agent.network import (MambaBlock, causal_depthwise_conv, QNetwork, branch_action_mask, expected_q, selective_scan_parallel,
                                   selective_scan_sequential)


def tiny_cfg(**kw) -> AgentConfig:
    base = dict(n_features=5, env_state_dim=3, window=12, d_model=16, d_state=4, n_layers=2, head_hidden=32,
                n_atoms=11)
    base.update(kw)
    return AgentConfig(**base)


def inputs(cfg: AgentConfig, batch: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.window, cfg.n_features, generator=g), torch.randn(batch, cfg.env_state_dim,
                                                                                     generator=g)


@pytest.mark.parametrize("encoder", ["mamba", "gru"])
def test_forward_returns_padded_branch_logits(encoder):
    cfg = tiny_cfg(encoder=encoder)
    logits = QNetwork(cfg)(*inputs(cfg))
    assert logits.shape == (6, 4, 4, 11) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("length", [1, 2, 7, 16, 33])
def test_parallel_scan_matches_sequential_reference_values_and_gradients(length):
    g = torch.Generator().manual_seed(length)
    shapes = dict(u=(3, length, 6), delta=(3, length, 6), B=(3, length, 4), C=(3, length, 4))
    t = {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    t["delta"] = torch.nn.functional.softplus(t["delta"])
    t["A"] = -torch.rand(6, 4, generator=g, dtype=torch.float64) * 3
    t["D"] = torch.randn(6, generator=g, dtype=torch.float64)
    args = {k: v.requires_grad_() for k, v in t.items()}
    order = ("u", "delta", "A", "B", "C", "D")
    y_seq = selective_scan_sequential(*(args[k] for k in order))
    grads_seq = torch.autograd.grad(y_seq.square().sum(), [args[k] for k in order], allow_unused=True,
                                    materialize_grads=True)
    y_par = selective_scan_parallel(*(args[k] for k in order))
    grads_par = torch.autograd.grad(y_par.square().sum(), [args[k] for k in order], allow_unused=True,
                                    materialize_grads=True)
    torch.testing.assert_close(y_par, y_seq)
    for a, b in zip(grads_par, grads_seq):
        torch.testing.assert_close(a, b)


def test_sequential_scan_matches_hand_computed_recurrence():
    # One channel, one state: h_t = e^{Δ A} h_{t-1} + Δ B_t u_t, y_t = C_t h_t + D u_t.
    u = torch.tensor([[[1.0], [2.0]]])
    delta = torch.tensor([[[0.5], [0.5]]])
    A = torch.tensor([[-2.0]])
    B = torch.tensor([[[1.0], [3.0]]])
    C = torch.tensor([[[2.0], [1.0]]])
    D = torch.tensor([0.1])
    h1 = 0.5 * 1.0 * 1.0
    h2 = torch.exp(torch.tensor(-1.0)) * h1 + 0.5 * 3.0 * 2.0
    want = torch.tensor([[[2.0 * h1 + 0.1], [float(h2) + 0.2]]])
    torch.testing.assert_close(selective_scan_sequential(u, delta, A, B, C, D), want)


def test_causal_depthwise_conv_matches_hand_computed_taps():
    # K = 2, one channel: y_t = b + w_0 u_{t-1} + w_1 u_t with u_{-1} = 0.
    u = torch.tensor([[[1.0], [2.0], [4.0]]])  # (1, 3, 1)
    y = causal_depthwise_conv(u, torch.tensor([[[10.0, 1.0]]]), torch.tensor([0.5]))
    assert y.flatten().tolist() == [0.5 + 1.0, 0.5 + 10.0 + 2.0, 0.5 + 20.0 + 4.0]


def test_causal_depthwise_conv_matches_torch_conv1d_values_and_gradients():
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(6, 6, 4, groups=6, padding=3).double()
    u = torch.randn(3, 9, 6, dtype=torch.float64, requires_grad=True)
    ref = conv(u.transpose(1, 2))[..., :9].transpose(1, 2)  # the Conv1d formulation: pad both sides, keep the first L
    got = causal_depthwise_conv(u, conv.weight, conv.bias)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (u, conv.weight, conv.bias), g)
    got_grads = torch.autograd.grad(got, (u, conv.weight, conv.bias), g)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_mamba_block_is_causal():
    torch.manual_seed(0)
    block = MambaBlock(d_model=8, d_state=4, d_conv=4, expand=2)
    x = torch.randn(2, 10, 8)
    y = block(x)
    x2 = x.clone()
    x2[:, 6:] += torch.randn(2, 4, 8)  # change only the future of position 5
    y2 = block(x2)
    torch.testing.assert_close(y2[:, :6], y[:, :6])
    assert (y2[:, 6:] - y[:, 6:]).abs().max() > 1e-3


@pytest.mark.parametrize("n_layers", [1, 3])
def test_encoder_final_block_at_the_last_position_equals_every_position_sliced(n_layers):
    """The encoder's final block computes only the last position; a plain loop over every position, sliced at the
    end, gives the same encoding and the same parameter gradients."""
    torch.manual_seed(3)
    enc = QNetwork(tiny_cfg(n_layers=n_layers, scan="sequential")).encoder
    obs, _ = inputs(tiny_cfg(n_layers=n_layers))

    def every_position() -> torch.Tensor:
        x = enc.embed(obs)
        for norm, block in zip(enc.norms, enc.blocks):
            x = x + block(norm(x))
        return enc.norm_out(x[:, -1])

    want = every_position()
    got = enc(obs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    weights = torch.randn_like(want)
    want_grads = torch.autograd.grad((want * weights).sum(), list(enc.parameters()))
    got_grads = torch.autograd.grad((got * weights).sum(), list(enc.parameters()))
    for (name, _), a, b in zip(enc.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_batched_head_equals_the_streams_one_at_a_time_values_and_gradients():
    torch.manual_seed(4)
    cfg = tiny_cfg(branch_sizes=(4, 3, 2, 5))  # streams of unequal width: the padding is exercised
    net = QNetwork(cfg)
    for layer in [net.value[-1], *[a[-1] for a in net.advantages]]:  # undo the near-zero head init
        torch.nn.init.normal_(layer.weight, std=0.3)
        torch.nn.init.normal_(layer.bias, std=0.3)
    z, env_state = torch.randn(7, cfg.d_model), torch.randn(7, cfg.env_state_dim)
    got, want = net.head(z, env_state), net.head_per_stream(z, env_state)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(want)
    params = [p for name, p in net.named_parameters() if not name.startswith("encoder.")]
    got_grads = torch.autograd.grad((got * weights).sum(), params)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_network_output_does_not_depend_on_the_scan_method():
    torch.manual_seed(1)
    net_par = QNetwork(tiny_cfg(scan="parallel"))
    net_seq = QNetwork(tiny_cfg(scan="sequential"))
    net_seq.load_state_dict(net_par.state_dict())
    obs, env_state = inputs(net_par.cfg)
    torch.testing.assert_close(net_par(obs, env_state), net_seq(obs, env_state), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoder", ["mamba", "gru"])
def test_observation_window_and_env_state_both_change_the_output(encoder):
    torch.manual_seed(2)
    cfg = tiny_cfg(encoder=encoder)
    net = QNetwork(cfg)
    for layer in [net.value[-1], *[a[-1] for a in net.advantages]]:  # undo the near-zero head init
        torch.nn.init.normal_(layer.weight, std=0.3)
    obs, env_state = inputs(cfg)
    base = net(obs, env_state)
    obs2 = obs.clone()
    obs2[:, 0] += 1.0  # the OLDEST step of the window
    # At init Δ ∈ [1e-3, 1e-1] keeps the long-range path weak (Mamba's init), but it is there; the
    # forward pass is deterministic, so any change is signal, not noise.
    assert (net(obs2, env_state) - base).abs().max() > 1e-6
    assert (net(obs, env_state + 1.0) - base).abs().max() > 1e-4


def test_mean_advantage_is_over_real_actions_so_every_branch_averages_to_the_value_stream():
    torch.manual_seed(3)
    cfg = tiny_cfg()
    net = QNetwork(cfg)
    for layer in [net.value[-1], *[a[-1] for a in net.advantages]]:
        torch.nn.init.normal_(layer.weight, std=0.5)
    logits = net(*inputs(cfg))  # (B, nb, A_max, N)
    # logits_b = V + A_b - mean_a A_b  ⇒  mean over the branch's real actions of logits_b = V.
    means = [logits[:, b, :n].mean(1) for b, n in enumerate(cfg.branch_sizes)]
    for m in means[1:]:
        torch.testing.assert_close(m, means[0], atol=1e-5, rtol=1e-5)


def test_padded_actions_are_constant_point_masses_at_v_min_with_no_gradient():
    torch.manual_seed(4)
    cfg = tiny_cfg()
    net = QNetwork(cfg)
    logits = net(*inputs(cfg))
    mask = branch_action_mask(cfg.branch_sizes)
    assert mask.tolist() == [[True] * 4] + [[True, True, True, False]] * 3
    padded = logits[:, ~mask]  # (B, 3, N)
    probs = torch.softmax(padded, -1)
    assert torch.equal(probs[..., 0], torch.ones_like(probs[..., 0]))
    torch.testing.assert_close(expected_q(padded, net.support), torch.full(padded.shape[:-1], cfg.v_min))
    padded.sum().backward()
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in net.parameters())


@pytest.mark.parametrize("v_min,v_max", [(-10.0, 10.0), (-3.0, 12.0), (-1.0, 0.5)])
def test_initial_q_is_near_zero_for_every_real_action(v_min, v_max):
    torch.manual_seed(5)
    cfg = tiny_cfg(v_min=v_min, v_max=v_max, n_atoms=51)
    net = QNetwork(cfg)
    q = expected_q(net(*inputs(cfg, batch=32)), net.support)[:, branch_action_mask(cfg.branch_sizes)]
    assert q.abs().max() < 0.01 * (v_max - v_min)


@pytest.mark.parametrize("field,value,match", [
    ("encoder", "lstm", "encoder"), ("branch_sizes", (4, 1), "branch_sizes"), ("v_max", -20.0, "v_max"),
    ("gamma", 0.0, "gamma"), ("tau", 1.5, "tau"), ("n_atoms", 1, "n_atoms"), ("window", 0, "window"),
    ("kill_warmup_samples", 2, "kill_warmup_samples"), ("clip_max", 0.01, "clip_max"), ("lr", float("nan"), "lr"),
    ("scan", "fft", "scan"),
])
def test_config_rejects_bad_values_naming_the_field(field, value, match):
    with pytest.raises(ValueError, match=rf"AgentConfig\.{match}="):
        dataclasses.replace(tiny_cfg(), **{field: value})


def test_config_refuses_training_on_the_reflected_market_with_inputs_that_have_no_reflection():
    dataclasses.replace(tiny_cfg(), mirror_augment=True)  # alone it is fine
    for other in ({"forecast_lags": 8}, {"aux_weight": 1.0}):
        with pytest.raises(ValueError, match=r"AgentConfig\.mirror_augment="):
            dataclasses.replace(tiny_cfg(), mirror_augment=True, **other)
