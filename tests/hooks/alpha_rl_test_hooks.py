"""Fault injection into real trainer processes, for tests only: nothing under trainer/ or workflows/ imports it.

A test starts `python -m trainer.train` (directly, or through the local workflow runner's `--env`) with
PYTHONPATH=tests/hooks (`HOOKS_DIR`) and one of these variables; Python's start-up imports sitecustomize.py from
there, which calls `install()`, which patches the named trainer classes as they are imported:

- ALPHA_RL_TEST_OOM_AT_STEP=N [ALPHA_RL_TEST_OOM_FOLD=F]: right after the first checkpoint at or after env step N,
  allocate host memory until the kernel's OOM killer ends the process (SIGKILL, exit 137, in a memory cgroup).
- ALPHA_RL_TEST_CUDA_OOM_AT_UPDATE=K [ALPHA_RL_TEST_OOM_FOLD=F]: the K-th gradient step of the process raises
  torch.cuda.OutOfMemoryError from inside the training step, as a real CUDA allocation failure would.

Each fires on attempt 0 only (`--attempt`): a workflow retries with the same environment, and one planted fault
per run is what a test wants to see recovered from. With ALPHA_RL_TEST_OOM_FOLD only that fold plants it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from pathlib import Path
from typing import Callable

HOOKS_DIR = Path(__file__).resolve().parent
"""Put this on PYTHONPATH to arm the hooks in a child process."""
OOM_AT_STEP = "ALPHA_RL_TEST_OOM_AT_STEP"
CUDA_OOM_AT_UPDATE = "ALPHA_RL_TEST_CUDA_OOM_AT_UPDATE"
OOM_FOLD = "ALPHA_RL_TEST_OOM_FOLD"


def _env_int(name: str, minimum: int) -> int:
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return value


def _flag_int(argv: list[str], names: tuple[str, ...], default: int) -> int:
    """The last value given to any of `names` (the trainer's parser, too, lets the last one win)."""
    found = default
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = int(argv[i + 1])
            elif arg.startswith(name + "="):
                found = int(arg.split("=", 1)[1])
    return found


def armed_at(variable: str, argv: list[str]) -> int | None:
    """The step (or update) `variable` plants its fault at, for the trainer command line `argv`; None when unset,
    or when this is not attempt 0 or not the fold ALPHA_RL_TEST_OOM_FOLD names. A bad value raises ValueError
    naming the variable."""
    if variable not in os.environ:
        return None
    at = _env_int(variable, minimum=1)
    fold = _env_int(OOM_FOLD, minimum=0) if OOM_FOLD in os.environ else None
    if _flag_int(argv, ("--attempt",), 0) != 0:
        return None
    if fold is not None and fold != _flag_int(argv, ("--fold", "--folds.fold"), 0):
        return None
    return at


def _announce(event: str, **fields: object) -> None:
    """One JSON line on stdout, as the trainer's own log lines (the tests read the hook's arming from the log)."""
    print(json.dumps({"event": event, "attempt": 0, **fields}), flush=True)


def allocate_until_killed() -> None:
    import numpy as np  # here, not at the top: sitecustomize imports this module into every hooked process

    hog = []
    while True:
        hog.append(np.ones(64 << 20, dtype=np.uint8))  # 64 MiB, written so the pages are really committed


def _patch_checkpointer(module) -> None:
    at = armed_at(OOM_AT_STEP, sys.argv)
    if at is None:
        return
    _announce("test_oom_armed", at_step=at, source=OOM_AT_STEP)
    save = module.FileCheckpointer.save

    def save_then_oom(self, trainer, final: bool = False):
        path = save(self, trainer, final)
        if trainer.env_step >= at:
            self.log.event("test_oom_hook", env_step=trainer.env_step)
            allocate_until_killed()
        return path

    module.FileCheckpointer.save = save_then_oom


def _patch_step(module) -> None:
    at = armed_at(CUDA_OOM_AT_UPDATE, sys.argv)
    if at is None:
        return
    _announce("test_cuda_oom_armed", at_update=at, source=CUDA_OOM_AT_UPDATE)
    call = module.TrainStep.__call__
    calls = [0]

    def step_or_cuda_oom(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            import torch  # loaded by now (the step is running): this import only looks it up

            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (planted by "
                                              f"{CUDA_OOM_AT_UPDATE}={at})")
        return call(self, *args, **kwargs)

    module.TrainStep.__call__ = step_or_cuda_oom


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs patches[name](module) right after module `name` is first executed."""

    def __init__(self, patches: dict[str, Callable]):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patch = spec.loader.exec_module, self.patches.pop(name)

        def exec_then_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def install() -> None:
    patches = {}
    if OOM_AT_STEP in os.environ:
        patches["trainer.checkpoint.resume"] = _patch_checkpointer
    if CUDA_OOM_AT_UPDATE in os.environ:
        patches["trainer.loop.step"] = _patch_step
    if patches:
        sys.meta_path.insert(0, _PatchOnImport(patches))
