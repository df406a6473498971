"""trainer.train's flags land in the config they name (the rest stays the preset's)."""
from __future__ import annotations

import pytest

from trainer import train
from trainer.loop.config import preset


def _cfg(*extra: str):
    args = train.build_parser().parse_args(["--run-dir", "/tmp/x", "--fold", "0", "--folds", "3", *extra])
    return train.config_from_args(args)


def test_flags_override_their_config_fields_and_leave_the_preset_alone():
    cfg = _cfg("--preset", "h100", "--inventory-penalty", "0.05", "--compile", "sim", "--n-envs", "256",
               "--seed", "9", "--encoder", "gru")
    base = preset("h100")
    assert cfg.sim.inventory_penalty == 0.05 and cfg.sim.n_envs == 256 and cfg.sim.seed == 9
    assert cfg.loop.compile == "sim" and cfg.loop.seed == 9 and cfg.agent.encoder == "gru"
    assert cfg.replay == base.replay and cfg.agent.d_model == base.agent.d_model
    assert cfg.loop.n_steps == base.loop.n_steps == 25_000


def test_defaults_are_the_preset():
    cfg = _cfg("--preset", "smoke")
    assert cfg.sim.inventory_penalty == 0.0 and cfg.loop.compile == "none"
    assert cfg.sim == preset("smoke").sim


@pytest.mark.parametrize("bad", [["--compile", "everything"], ["--inventory-penalty", "x"]])
def test_malformed_flags_exit_2(bad):
    with pytest.raises(SystemExit) as exc:
        _cfg(*bad)
    assert exc.value.code == 2


def test_negative_inventory_penalty_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="inventory_penalty"):
        _cfg("--inventory-penalty", "-1")
