"""The auxiliary mid-change target and head (AgentConfig.aux_weight): a hand-checked target, the training rows as its
only input, the head's absence by default, and the update that trains it without touching the C51 loss value."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.test_agent_learner import random_batch, tiny_cfg
from trainer.agent.aux import mid_change_target
from trainer.agent.config import AgentConfig
from trainer.agent.learner import Learner
from trainer.agent.network import QNetwork

BID = np.array([100, 100, 101, 102, 102, 100])
ASK = BID + 1  # 2 x mid = 201, 201, 203, 205, 205, 201


def test_mid_change_target_on_a_hand_checked_path():
    # rows 1..4 train, horizon 2: ahead = min(t + 2, 4) = 3, 4, 4, 4; changes (205-201)/2, (205-203)/2, 0, 0 ticks
    y = mid_change_target(BID, ASK, 1, 5, 2)
    change = np.array([2.0, 1.0, 0.0, 0.0])
    sd = math.sqrt(((change - 0.75) ** 2).mean())  # 0.829: population std over the training rows
    assert y.dtype == np.float32 and y.shape == (6,)
    np.testing.assert_allclose(y, [0.0, *(change / sd), 0.0], rtol=1e-6)
    # rows outside [start, stop) are never read: a different price after the window changes nothing
    np.testing.assert_array_equal(mid_change_target(BID, np.r_[ASK[:5], 999], 1, 5, 2), y)
    assert not mid_change_target(BID, ASK, 0, 1, 3).any()  # a single training row: no spread, all 0


def test_mid_change_target_refuses_bad_rows_and_horizon():
    with pytest.raises(ValueError, match="horizon"):
        mid_change_target(BID, ASK, 0, 6, 0)
    with pytest.raises(ValueError, match="inside a tape of 6 rows"):
        mid_change_target(BID, ASK, 2, 7, 1)
    with pytest.raises(ValueError, match="aux_weight"):
        AgentConfig(n_features=3, env_state_dim=2, aux_weight=-1.0)
    with pytest.raises(ValueError, match="aux_horizon"):
        AgentConfig(n_features=3, env_state_dim=2, aux_horizon=0)


def test_off_by_default_no_head_and_the_same_parameters():
    plain = QNetwork(tiny_cfg())
    assert plain.aux_head is None and not any(k.startswith("aux_head") for k in plain.state_dict())
    with_aux = QNetwork(tiny_cfg(aux_weight=0.5))
    extra = set(with_aux.state_dict()) - set(plain.state_dict())
    assert extra == {"aux_head.weight", "aux_head.bias"}


def test_the_aux_loss_trains_the_head_and_leaves_the_c51_loss_value_alone():
    cfg = tiny_cfg(aux_weight=1.0)
    torch.manual_seed(0)
    aux = Learner(QNetwork(cfg), cfg, "cpu", adaptive=False)
    plain = Learner(QNetwork(tiny_cfg()), tiny_cfg(), "cpu", adaptive=False)
    plain.online.load_state_dict(aux.online.state_dict(), strict=False)  # same weights but the aux head
    plain.target.load_state_dict(aux.target.state_dict(), strict=False)
    batch = random_batch(cfg, seed=1)
    rows = torch.arange(batch.obs.shape[0])
    target = batch.obs[:, -1, 0] - batch.obs[:, -1, 1]  # (B,) a linear function of the newest row
    aux.aux_target = target
    batch = batch._replace(row=rows)
    first_aux, first_plain = aux.update(batch), plain.update(batch)
    # the same C51 loss and priorities: the aux term adds to the gradient, not to the reported loss
    torch.testing.assert_close(first_aux["loss"], first_plain["loss"])
    torch.testing.assert_close(first_aux["priorities"], first_plain["priorities"])

    def mse() -> float:
        with torch.no_grad():
            return float((aux.online.aux_head(aux.online.encoder(batch.obs)).squeeze(-1) - target).square().mean())

    before = mse()
    for _ in range(150):
        aux.update(batch)
    assert mse() < 0.5 * before, (before, mse())
    # the encoder moved differently from the plain learner's: the aux gradient reaches it
    assert not torch.allclose(aux.online.encoder.embed.weight, plain.online.encoder.embed.weight)


def test_aux_without_a_target_is_refused():
    cfg = tiny_cfg(aux_weight=1.0)
    learner = Learner(QNetwork(cfg), cfg, "cpu")
    with pytest.raises(ValueError, match="aux_target"):
        learner.update(random_batch(cfg))
