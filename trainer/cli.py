"""The command line of `python -m trainer.train`, generated from the config tree by tyro.

Every field of `TrainConfig` is a dotted flag named after its section and field (`--sim.n-envs 2048`,
`--agent.lr 1e-4`, `--folds.embargo-rows 10`), documented by the field's docstring and grouped by section in
`--help`. `--preset NAME` picks the defaults the flags override (preset < explicit flags). Process options that
change nothing the run computes (where it writes, which attempt it is, the S3 mirror) are `RunOptions`.

tyro rather than jsonargparse or simple-parsing: it reads the frozen dataclasses and their field docstrings as
they are (no registration, no field metadata in the stage configs), takes a default instance (the preset), turns
Literal fields into checked choices, and groups --help by nested dataclass.

The flags of the earlier hand-written parser still work (`ALIASES`): the workflow template, the tests and users'
scripts pass `--fold`, `--folds`, `--n-steps`, `--n-envs`, `--seed` and the rest.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import tyro

from trainer.data.spec import spec_from_dirs
from trainer.folds import layout
from trainer.loop.config import TrainConfig, preset
from trainer.settings import DEFAULT_PRESET, PRESET_NAMES

__all__ = ["RunOptions", "Invocation", "ALIASES", "parse"]

PresetName = Literal[PRESET_NAMES]  # type: ignore[valid-type]

ALIASES: dict[str, tuple[str, ...]] = {
    "--fold": ("--folds.fold",),
    "--folds": ("--folds.folds",),
    "--fold-mode": ("--folds.fold-mode",),
    "--embargo-rows": ("--folds.embargo-rows",),
    "--chain-wait-seconds": ("--folds.chain-wait-seconds",),
    "--n-steps": ("--loop.n-steps",),
    "--n-envs": ("--sim.n-envs",),
    "--n-backtests": ("--sim.n-envs",),
    "--per-capacity": ("--replay.capacity",),
    "--batch-size": ("--agent.batch-size",),
    "--encoder": ("--agent.encoder",),
    "--inventory-penalty": ("--sim.inventory-penalty",),
    "--seed": ("--loop.seed", "--sim.seed"),
    "--device": ("--loop.device",),
    "--mode": ("--loop.mode",),
    "--compile": ("--loop.compile",),
    "--deterministic": ("--loop.deterministic",),
    "--checkpoint-every": ("--loop.checkpoint-every",),
    "--keep-checkpoints": ("--loop.keep-checkpoints",),
    "--log-every": ("--loop.log-every",),
    "--eval-envs": ("--eval.n-envs",),
}
"""Flags of the earlier CLI -> the dotted flags they stand for (--seed seeds the loop and the simulator)."""
_FLAGS = frozenset({"--deterministic"})
"""Aliases that take no value."""
_REQUIRED = (("--folds.fold", "--fold"), ("--folds.folds", "--folds"))


@dataclass(frozen=True)
class RunOptions:
    """Where the fold runs and what it reads; none of these change what it computes."""

    run_dir: Path
    """Run directory, <root>/<git-sha>; fold N writes RUN/fold<N>/ (and run.json beside the folds)."""
    preset: PresetName = DEFAULT_PRESET  # type: ignore[valid-type]
    """Config preset the other flags override: smoke (CPU) or h100 (GPU)."""
    mbp10_data_dir: Optional[Path] = None
    """DBN MBP-10 directory (with --trades-data-dir; instead of --data)."""
    trades_data_dir: Optional[Path] = None
    """DBN trades directory (with --mbp10-data-dir)."""
    fxcache: Optional[Path] = None
    """Feature cache directory (default: RUN/../fxcache)."""
    compile_cache: Optional[Path] = None
    """torch.compile's on-disk cache when loop.compile is not none (default: TORCHINDUCTOR_CACHE_DIR when set,
    else RUN/../inductor-cache)."""
    resume_from: Optional[Path] = None
    """Resume from this checkpoint file instead of the newest valid one in RUN/fold<N>/."""
    evaluate_from: Optional[Path] = None
    """Evaluate another run's finished training instead of training: FOLD_DIR is that fold's directory (RUN/fold<N>
    or RUN/fold<N>/seed<S>); its newest valid checkpoint must be the final one. The config must match that
    checkpoint's except for the deployment and evaluation fields (trainer.settings.EVALUATION_ONLY: the stand-aside
    rule, the exposure cap and its margin's rules), which is what this is for: the same trained weights under another
    deployment rule. Writes this run's result.json; trains nothing and writes no checkpoint."""
    attempt: int = 0
    """Retry attempt number (Argo {{retries}}), logged."""
    replica: int = 0
    """Seed index S of a multi-seed run: writes RUN/fold<N>/seed<S>/ and trains with seed = base seed + S (loop and
    sim seeds; trainer/folds/layout.py). 0: RUN/fold<N>/ and the base seed, the one-seed layout."""
    s3_bucket: Optional[str] = None
    """Mirror checkpoints to s3://BUCKET/PREFIX/<sha>/fold<N>/ (default: env ALPHA_RL_S3_BUCKET)."""
    s3_prefix: str = "alpha-rl"
    """S3 key prefix (default: env ALPHA_RL_S3_PREFIX, else alpha-rl)."""

    def fxcache_dir(self) -> Path:
        return self.fxcache or self.run_dir.parent / "fxcache"

    def inductor_cache_dir(self) -> str:
        # Beside the runs (on the PVC in the cluster): a retried or resumed attempt, and the other folds, load the
        # compiled kernels instead of compiling again.
        return str(self.compile_cache or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                   or self.run_dir.parent / "inductor-cache")

    def fold_dir(self, fold: int) -> Path:
        """RUN/fold<N>, or RUN/fold<N>/seed<S> for replica S (ValueError, exit 2, for a negative index)."""
        return layout.fold_dir(self.run_dir, fold, self.replica)

    def s3_fold_prefix(self, fold: int) -> str:
        """PREFIX/<sha>/fold<N>[/seed<S>], or PREFIX/<sha>/control/fold<N>[/seed<S>] (the control's run dir is
        <sha>/control): the fold's place on the PVC, so seeds and markets never share a mirror prefix."""
        run = self.run_dir.name if self.run_dir.name != layout.CONTROL_DIR else \
            f"{self.run_dir.parent.name}/{layout.CONTROL_DIR}"
        return f"{self.s3_prefix.strip('/')}/{run}/{self.fold_dir(fold).relative_to(self.run_dir).as_posix()}"

    def seeded(self, cfg: TrainConfig) -> TrainConfig:
        """`cfg` with the loop and sim seeds raised by the replica index (unchanged for replica 0)."""
        if self.replica == 0:
            return cfg
        return cfg.replace(loop={"seed": layout.replica_seed(cfg.loop.seed, self.replica)},
                           sim={"seed": layout.replica_seed(cfg.sim.seed, self.replica)})


@dataclass(frozen=True)
class Invocation:
    """What the command line asks for: the process options and the resolved config."""

    run: Annotated[RunOptions, tyro.conf.arg(name="")]
    config: Annotated[TrainConfig, tyro.conf.arg(name="")]


def expand_aliases(argv: list[str]) -> list[str]:
    """Rewrite the earlier CLI's flags (`--n-envs 64`, `--seed=3`) as the dotted flags they stand for."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag not in ALIASES:
            out.append(argv[i])
            i += 1
            continue
        if flag in _FLAGS:
            out.extend(ALIASES[flag])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                out.append(ALIASES[flag][0])  # tyro reports the missing value
                break
            value = argv[i + 1]
            i += 1
        for target in ALIASES[flag]:
            out.extend((target, value))
        i += 1
    return out


def _value(argv: list[str], flag: str) -> str | None:
    """The last value given for `flag` (`--flag V` or `--flag=V`), else None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def parse(argv: list[str] | None = None, prog: str = "python -m trainer.train") -> Invocation:
    """The Invocation for `argv`. Usage errors exit 2 (SystemExit, from tyro); a value a config refuses raises
    ValueError naming the field (the caller maps it to exit 2)."""
    argv = expand_aliases(list(argv) if argv is not None else list(sys.argv[1:]))
    name = _value(argv, "--preset") or DEFAULT_PRESET
    if name not in PRESET_NAMES:
        name = DEFAULT_PRESET  # tyro refuses the value itself, with the choices
    default = Invocation(run=RunOptions(run_dir=tyro.MISSING, s3_bucket=os.environ.get("ALPHA_RL_S3_BUCKET"),
                                        s3_prefix=os.environ.get("ALPHA_RL_S3_PREFIX", "alpha-rl")),
                         config=preset(name))
    description = (
        "Train one walk-forward fold (train on window N, evaluate out of sample on window N+1). Resumes from "
        "RUN/fold<N>/ checkpoints; exits 0 at once if RUN/fold<N>/result.json exists. Every config field is a "
        "dotted flag; --preset sets their defaults. Short flags kept from the earlier CLI: "
        + ", ".join(f"{a} ({' + '.join(t)})" for a, t in ALIASES.items()) + ".")
    inv = tyro.cli(Invocation, default=default, args=argv, prog=prog, description=description)
    for dotted, short in _REQUIRED:
        if _value(argv, dotted) is None:
            raise SystemExit(_usage_error(prog, f"{short} (or {dotted}) is required"))
    run = inv.run
    if run.mbp10_data_dir or run.trades_data_dir:
        if not (run.mbp10_data_dir and run.trades_data_dir):
            raise ValueError("--mbp10-data-dir and --trades-data-dir go together (book and trades are both mandatory)")
        if _value(argv, "--data") is not None:
            raise ValueError("give either --data or --mbp10-data-dir/--trades-data-dir, not both")
        inv = dataclasses.replace(inv, config=dataclasses.replace(
            inv.config, data=spec_from_dirs(run.mbp10_data_dir, run.trades_data_dir)))
    return inv


def _usage_error(prog: str, message: str) -> int:
    print(f"usage: {prog} --run-dir PATH --fold N --folds K [OPTIONS]\n{prog}: error: {message}", file=sys.stderr)
    return 2
