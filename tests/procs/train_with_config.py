"""`python -m train_with_config ARGS`: the real `trainer.train` process, with config values from the environment.

Tests run it as the train-fold command (`python -m workflows.launch train_with_config ...`, with this folder on
PYTHONPATH) to drive a real trainer into a kill criterion through real settings, e.g. an absurd learning rate: the rendered
train command is the template's, so a test cannot add `--agent.lr` to one fold's command line. ALPHA_RL_TEST_CONFIG is a JSON object of TrainConfig
sections, applied with `TrainConfig.replace` on top of the preset the command line names:

    ALPHA_RL_TEST_CONFIG='{"agent": {"lr": 1e6}, "loop": {"log_every": 10}}'

Nothing else changes: the same argument parsing, checkpoints, kill monitor and exit codes (3 on a kill).
Kept out of trainer/ so that no production entry point can read the variable.
"""
from __future__ import annotations

import json
import os
import sys

CONFIG_ENV = "ALPHA_RL_TEST_CONFIG"


def main(argv: list[str] | None = None) -> int:
    import trainer.cli as cli
    from trainer import train

    overrides = json.loads(os.environ.get(CONFIG_ENV, "{}"))
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        print(f"error: {CONFIG_ENV} must be a JSON object of config sections, got {overrides!r}", file=sys.stderr)
        return 2
    real_preset = cli.preset
    # trainer.cli builds the command line's defaults from `preset(name)`: the overrides become those defaults.
    cli.preset = lambda name: real_preset(name).replace(**overrides)
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
