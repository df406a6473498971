"""`python -m trainer.train`: train fold N on walk-forward window N, evaluate on window N+1, write result.json.

Process contract (DESIGN.md): started again with the same arguments it resumes from the newest valid checkpoint in
RUN/fold<N>/; if result.json exists it does nothing and exits 0. Exit codes: 0 done, 2 bad usage/config/data,
3 kill criterion, 143 stopped by SIGTERM/SIGINT after a checkpoint; anything else is retried by the workflow.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_SIGTERM, KillCriterion, exit_code_for
from trainer.fsutil import atomic_write_text
from trainer.loop.config import COMPILE_CHOICES

# Fields that may change between attempts without changing what the run computes.
RESUMABLE_LOOP_FIELDS = ("n_steps", "log_every", "checkpoint_every", "keep_checkpoints", "mode", "device",
                         "grace_seconds", "eval_envs", "overlap", "act_sm_share")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.train",
        description="Train one walk-forward fold (train on window N, evaluate out of sample on window N+1). "
                    "Resumes from RUN/fold<N>/ checkpoints; exits 0 at once if RUN/fold<N>/result.json exists.",
    )
    p.add_argument("--run-dir", required=True, type=Path, help="run directory, <root>/<git-sha>; fold N writes RUN/fold<N>/")
    p.add_argument("--fold", required=True, type=int, help="fold index N in [0, folds): trains window N, evaluates N+1")
    p.add_argument("--folds", required=True, type=int, help="number of folds K (K+1 windows over the timeline)")
    p.add_argument("--data", default=None, help="data SPEC (docs/data.md), default 'synthetic'")
    p.add_argument("--mbp10-data-dir", type=Path, help="DBN MBP-10 directory (with --trades-data-dir; instead of --data)")
    p.add_argument("--trades-data-dir", type=Path, help="DBN trades directory (with --mbp10-data-dir)")
    p.add_argument("--fxcache", type=Path, default=None, help="feature cache directory (default: RUN/../fxcache)")
    p.add_argument("--compile-cache", type=Path, default=None,
                   help="torch.compile's on-disk cache when --compile is not none (default: TORCHINDUCTOR_CACHE_DIR "
                        "when set, else RUN/../inductor-cache)")
    p.add_argument("--preset", default="smoke", help="config preset: smoke (CPU) or h100 (GPU)")
    p.add_argument("--n-steps", type=int, help="training steps (each: n_envs env steps + 1 gradient step)")
    p.add_argument("--n-envs", "--n-backtests", dest="n_envs", type=int, help="parallel backtests (envs)")
    p.add_argument("--per-capacity", type=int, help="prioritised replay capacity (auto-raised to >= 4 x n_envs)")
    p.add_argument("--batch-size", type=int, help="replay batch per gradient step")
    p.add_argument("--inventory-penalty", type=float,
                   help="bounded reward shaping: reward units per step at full position (SimConfig, default 0)")
    p.add_argument("--seed", type=int, help="seed for torch, numpy, python and the simulator")
    p.add_argument("--device", help="auto | cpu | cuda[:i]")
    p.add_argument("--mode", choices=("auto", "eager", "graph"), help="eager, CUDA graph, or auto (graph on CUDA)")
    p.add_argument("--encoder", choices=("mamba", "gru"), help="sequence encoder")
    p.add_argument("--compile", choices=COMPILE_CHOICES,
                   help="torch.compile in the step: none, sim (simulator step), all (every tensor-only part of "
                        "the step: acting, simulator, storing, sampling, the learner's target, loss and statistics) "
                        "or autotune (all, with GEMM kernels picked by timing on CUDA: ~5 min of compiling)")
    p.add_argument("--deterministic", action="store_true", help="bit-reproducible run (deterministic algorithms)")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (default 5000)")
    p.add_argument("--keep-checkpoints", type=int, help="newest checkpoints kept (>= 2)")
    p.add_argument("--log-every", type=int, help="steps between JSON log lines")
    p.add_argument("--resume-from", type=Path, help="resume from this checkpoint file instead of the newest valid one")
    p.add_argument("--fold-mode", choices=("independent", "chain"), default="independent",
                   help="independent: train from scratch; chain: warm-start from fold N-1's final state")
    p.add_argument("--chain-wait-seconds", type=float, default=0.0,
                   help="chain mode: wait this long for fold N-1's result.json before refusing (exit 2)")
    p.add_argument("--embargo-rows", type=int, default=0, help="decision rows left out between windows")
    p.add_argument("--replica", type=int, default=0,
                   help="seed index S of a multi-seed run: writes RUN/fold<N>/seed<S>/ and trains with seed = base "
                        "seed + S (default 0: RUN/fold<N>/, the base seed)")
    p.add_argument("--attempt", type=int, default=0, help="retry attempt number (Argo {{retries}}), logged")
    p.add_argument("--s3-bucket", default=os.environ.get("ALPHA_RL_S3_BUCKET"),
                   help="mirror checkpoints to s3://BUCKET/PREFIX/<sha>/fold<N>/ (env ALPHA_RL_S3_BUCKET)")
    p.add_argument("--s3-prefix", default=os.environ.get("ALPHA_RL_S3_PREFIX", "alpha-rl"), help="S3 key prefix")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override any config field, e.g. --set agent.thompson_scale=0.2 (value parsed as JSON, "
                        "else taken as a string); repeatable, applied last")
    p.add_argument("--test-oom-at-step", type=int, default=None, help=argparse.SUPPRESS)  # test hook, see tests
    return p


def config_from_args(args: argparse.Namespace):
    from trainer.data.spec import spec_from_dirs
    from trainer.loop.config import preset

    cfg = preset(args.preset)
    if args.mbp10_data_dir or args.trades_data_dir:
        if not (args.mbp10_data_dir and args.trades_data_dir):
            raise ValueError("--mbp10-data-dir and --trades-data-dir go together (book and trades are both mandatory)")
        if args.data:
            raise ValueError("give either --data or --mbp10-data-dir/--trades-data-dir, not both")
        data = spec_from_dirs(args.mbp10_data_dir, args.trades_data_dir)
    else:
        data = args.data or "synthetic"
    loop = {k: v for k, v in {
        "n_steps": args.n_steps, "seed": args.seed, "device": args.device, "mode": args.mode,
        "checkpoint_every": args.checkpoint_every, "keep_checkpoints": args.keep_checkpoints,
        "log_every": args.log_every, "compile": args.compile}.items() if v is not None}
    if args.deterministic:
        loop["deterministic"] = True
    sections: dict[str, dict] = {"loop": loop}
    if args.n_envs is not None:
        sections["sim"] = {"n_envs": args.n_envs}
    if args.seed is not None:
        sections.setdefault("sim", {})["seed"] = args.seed
    if args.inventory_penalty is not None:
        sections.setdefault("sim", {})["inventory_penalty"] = args.inventory_penalty
    if args.per_capacity is not None:
        sections["replay"] = {"capacity": args.per_capacity}
    agent = {k: v for k, v in {"batch_size": args.batch_size, "encoder": args.encoder}.items() if v is not None}
    if agent:
        sections["agent"] = agent
    cfg = cfg.replace(data=data, **sections)
    overrides: dict[str, dict] = {}
    for item in args.set:
        key, sep, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and section in ("features", "sim", "agent", "replay", "loop")):
            raise ValueError(f"--set {item!r}: expected SECTION.FIELD=VALUE with SECTION one of features, sim, agent, "
                             "replay, loop")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides.setdefault(section, {})[name] = value
    return cfg.replace(**overrides) if overrides else cfg


def replica_fold(args: argparse.Namespace, cfg):
    """(cfg, fold dir) of seed index --replica S: RUN/fold<N>/seed<S> with loop and sim seeds raised by S; S = 0 is
    RUN/fold<N> with cfg untouched (trainer/folds/layout.py, docs/checkpoints.md)."""
    from trainer.folds.layout import fold_dir, replica_seed

    path = fold_dir(args.run_dir, args.fold, args.replica)  # ValueError (exit 2) for a negative index
    if args.replica == 0:
        return cfg, path
    return cfg.replace(loop={"seed": replica_seed(cfg.loop.seed, args.replica)},
                       sim={"seed": replica_seed(cfg.sim.seed, args.replica)}), path


def fingerprint(cfg_dict: dict, data_key: str, layout: dict) -> dict:
    """What must match for a checkpoint to be resumed: config (minus resumable loop fields), data, tensor layout."""
    config = json.loads(json.dumps(cfg_dict))
    for name in RESUMABLE_LOOP_FIELDS:
        config["loop"].pop(name, None)
    return {"config": config, "data_key": data_key, "layout": layout}


def tensor_layout(sections: dict[str, dict[str, torch.Tensor]]) -> dict:
    """Shape and dtype of every state tensor. Optimiser moments are left out: AdamW creates them lazily at the
    first update, and their shapes follow from the parameters, which are listed."""
    return {f"{sec}.{name}": [list(t.shape), str(t.dtype).replace("torch.", "")]
            for sec, tensors in sections.items() for name, t in tensors.items() if not name.startswith("optim.")}


class FileCheckpointer:
    """Writes FoldTrainer state through trainer.checkpoint (sections of tensors + JSON meta + RNG states)."""

    def __init__(self, fold_dir: Path, keep: int, meta: dict, log, mirror=None, oom_at_step: int | None = None):
        self.fold_dir, self.keep, self.meta, self.log, self.mirror = fold_dir, keep, meta, log, mirror
        self.oom_at_step = oom_at_step
        self.seconds = 0.0

    def save(self, trainer, final: bool = False) -> None:
        from trainer.checkpoint.store import write_checkpoint
        from trainer.checkpoint.tensors import capture_rng_state, encode_json, encode_tensors

        t0 = time.perf_counter()
        # checkpoint_seconds: the total before this save, carried over attempts like the loop's wall_seconds
        sections = {"meta": encode_json({**self.meta, "env_step": trainer.env_step, "final": final,
                                         "checkpoint_seconds": self.seconds}),
                    "rng": encode_json({k: v.hex() for k, v in capture_rng_state().items()})}
        for name, tensors in trainer.state_dict().items():
            sections[f"state/{name}"] = encode_tensors(tensors)  # device → host copy: a host sync, by design
        path = write_checkpoint(self.fold_dir, trainer.env_step, sections, keep=self.keep)
        dt = time.perf_counter() - t0
        self.seconds += dt
        size = path.stat().st_size
        self.log.event("checkpoint", env_step=trainer.env_step, path=str(path), bytes=size,
                       seconds=round(dt, 4), mb_per_s=round(size / 1e6 / max(dt, 1e-9), 1), final=final)
        if self.mirror is not None:
            self.mirror.submit(path)
        if self.oom_at_step is not None and trainer.env_step >= self.oom_at_step:
            self.log.event("test_oom_hook", env_step=trainer.env_step)
            _allocate_until_killed()


def _allocate_until_killed() -> None:
    """Test hook (--test-oom-at-step): touch memory until the cgroup's OOM killer ends the process (exit 137)."""
    if os.environ.get("ALPHA_RL_TEST_HOOKS") != "1":
        raise RuntimeError("--test-oom-at-step needs ALPHA_RL_TEST_HOOKS=1 (test-only allocation hook)")
    hog = []
    while True:
        hog.append(np.ones(64 << 20, dtype=np.uint8))  # 64 MiB, written so the pages are really committed


TEST_OOM_AT_STEP_ENV = "ALPHA_RL_TEST_OOM_AT_STEP"
"""Test hook for workflow runs (read only with ALPHA_RL_TEST_HOOKS=1): like --test-oom-at-step, on attempt 0."""
TEST_OOM_FOLD_ENV = "ALPHA_RL_TEST_OOM_FOLD"
"""With TEST_OOM_AT_STEP_ENV: the one fold whose trainer plants the OOM (unset: every fold)."""


def oom_hook_step(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """The step after whose checkpoint the OOM test hook allocates until killed, and where that came from.

    `--test-oom-at-step N` needs ALPHA_RL_TEST_HOOKS=1 (else ValueError, exit 2). A workflow run cannot add a
    flag to one fold's rendered command line, so with ALPHA_RL_TEST_HOOKS=1 (and only then: without it these
    variables are never read) ALPHA_RL_TEST_OOM_AT_STEP=N [ALPHA_RL_TEST_OOM_FOLD=F] plant the same kill in
    fold F only, and only on attempt 0 (`--attempt {{retries}}`): the retry gets the same environment, and
    one planted kill per run is what the test wants to see recovered from.
    """
    hooks = os.environ.get("ALPHA_RL_TEST_HOOKS") == "1"
    if args.test_oom_at_step is not None:
        if not hooks:
            raise ValueError("--test-oom-at-step needs ALPHA_RL_TEST_HOOKS=1 (test-only allocation hook)")
        return args.test_oom_at_step, "--test-oom-at-step"
    if not hooks or TEST_OOM_AT_STEP_ENV not in os.environ:
        return None, None
    step = _env_int(TEST_OOM_AT_STEP_ENV, minimum=1)
    fold = _env_int(TEST_OOM_FOLD_ENV, minimum=0) if TEST_OOM_FOLD_ENV in os.environ else None
    if args.attempt != 0 or (fold is not None and fold != args.fold):
        return None, None
    return step, TEST_OOM_AT_STEP_ENV


def _env_int(name: str, minimum: int) -> int:
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {text!r}")
    return value


def restore(trainer, fold_dir: Path, fp: dict, resume_from: Path | None, log) -> dict | None:
    """Load the newest verifying checkpoint (or --resume-from) into `trainer`; None when starting fresh."""
    from trainer.checkpoint.format import read_checkpoint
    from trainer.checkpoint.store import ConfigMismatch, fingerprint_mismatch, latest_valid
    from trainer.checkpoint.tensors import decode_json, decode_tensors, restore_rng_state

    if resume_from is not None:
        ckpt = read_checkpoint(resume_from)
        path = resume_from
    else:
        ckpt = latest_valid(fold_dir, log=lambda p, why: log.event("checkpoint_skipped", path=str(p), reason=why))
        path = None if ckpt is None else ckpt.path
    if ckpt is None:
        return None
    meta = decode_json(ckpt.sections["meta"])
    differing = fingerprint_mismatch(fp, meta["fingerprint"])
    if differing:
        raise ConfigMismatch(path, differing, fp, meta["fingerprint"])
    state = {name.split("/", 1)[1]: decode_tensors(data, device=trainer.device)
             for name, data in ckpt.sections.items() if name.startswith("state/")}
    trainer.load_state_dict(state)
    restore_rng_state({k: bytes.fromhex(v) for k, v in decode_json(ckpt.sections["rng"]).items()})
    return {"path": str(path), "env_step": trainer.env_step,
            "checkpoint_seconds": float(meta.get("checkpoint_seconds", 0.0))}


def run(args: argparse.Namespace) -> int:
    from trainer.features.cache import load_or_build
    from trainer.features.compute import Normaliser
    from trainer.folds.evaluate import evaluate
    from trainer.folds.windows import fold_windows, walk_forward_windows
    from trainer.loop.fold import FoldTrainer, Stopped, Window
    from trainer.loop.log import JsonLog

    if args.folds < 1:
        raise ValueError(f"--folds must be >= 1, got {args.folds}")
    oom_at_step, oom_source = oom_hook_step(args)
    if not 0 <= args.fold < args.folds:
        raise ValueError(f"--fold must be in [0, {args.folds}), got {args.fold}")
    cfg, fold_dir = replica_fold(args, config_from_args(args))
    result_path = fold_dir / "result.json"
    log = JsonLog(args.fold)
    if result_path.exists():
        log.event("done_already", result=str(result_path), attempt=args.attempt)
        return EXIT_OK
    if args.fold_mode == "chain" and args.fold > 0:
        from trainer.folds.chain import wait_for_previous

        # InputError (exit 2) if this seed's previous fold is unfinished
        wait_for_previous(args.run_dir, args.fold, args.chain_wait_seconds, replica=args.replica)
    fold_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log.event("start", attempt=args.attempt, run_dir=str(args.run_dir), folds=args.folds, data=cfg.data,
              replica=args.replica, fold_dir=str(fold_dir), seed=cfg.loop.seed,
              preset=args.preset, host=platform.node(), torch=torch.__version__)

    # features: the fxcache (built once per data spec + feature config; skipped when present)
    fxcache = args.fxcache or args.run_dir.parent / "fxcache"
    fs, skipped = load_or_build(cfg.data, cfg.features, fxcache)
    log.event("features", key=fs.key, rows=int(fs.raw.shape[0]), features=int(fs.raw.shape[1]), skipped=skipped)
    if cfg.loop.compile != "none":
        # Compiled kernels cached beside the runs (on the PVC in the cluster): a retried or resumed attempt, and the
        # other folds, load them instead of compiling again. Inductor reads the variable at its first compile.
        cache = str(args.compile_cache or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                    or args.run_dir.parent / "inductor-cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        log.event("compile_cache", path=cache, mode=cfg.loop.compile)
    windows = walk_forward_windows(fs.raw.shape[0], args.folds, embargo_rows=args.embargo_rows)
    train_w, eval_w = fold_windows(windows, args.fold)
    norm = Normaliser.fit(fs.raw[train_w.start:train_w.stop])  # train window only: no look-ahead
    features = norm.apply(fs.raw)

    with open(fold_dir / "metrics.jsonl", "a") as metrics_file:
        log = JsonLog(args.fold, copy_to=metrics_file)
        trainer = FoldTrainer(cfg, features, fs.decision, Window(train_w.start, train_w.stop), args.fold, log)
        fp = fingerprint(dataclasses.asdict(cfg), fs.key, tensor_layout(trainer.state_dict()))
        _write_run_json(args.run_dir, cfg, fs, trainer)
        mirror = _s3_mirror(args, fold_dir, log)
        resumed = restore(trainer, fold_dir, fp, args.resume_from, log)
        if resumed is None and args.fold_mode == "chain" and args.fold > 0:
            from trainer.folds.chain import warm_start

            log.event("chain_warm_start", **warm_start(trainer, args.run_dir, fp, replica=args.replica))
        log.event("resume" if resumed else "fresh", attempt=args.attempt,
                  checkpoint=resumed["path"] if resumed else None, env_step=trainer.env_step)
        meta = {"fingerprint": fp, "fold": args.fold, "folds": args.folds}
        # The OOM test hook fires once per run: an attempt resumed at or past the step it names is the retry.
        oom_at = oom_at_step
        if oom_at is not None and trainer.env_step >= oom_at:
            oom_at = None
        if oom_at is not None:
            log.event("test_oom_armed", at_step=oom_at, source=oom_source, attempt=args.attempt)
        ckpt = FileCheckpointer(fold_dir, cfg.loop.keep_checkpoints, meta, log, mirror, oom_at)
        if resumed:
            ckpt.seconds = resumed["checkpoint_seconds"]
        log.event("first_step_ready", seconds_since_start=round(time.perf_counter() - started, 3))
        try:
            trainer.run(ckpt)
        except Stopped as stop:
            log.event("stopped", reason=str(stop), env_step=trainer.env_step)
            if mirror is not None:
                mirror.close(timeout=cfg.loop.grace_seconds / 2)
            return EXIT_SIGTERM
        if mirror is not None:
            mirror.close(timeout=60)

        # out-of-sample evaluation on the next window: greedy (argmax E[Q]) with the selected weights, or flat
        greedy = trainer.deployed_policy()

        from trainer.folds.baselines import run_baselines
        from trainer.folds.evaluate import EvalConfig

        eval_cfg = EvalConfig(n_envs=cfg.loop.eval_envs)
        baselines = run_baselines(fs.names, trainer.features, fs.decision, cfg.sim, trainer.agent_cfg.window,
                                  eval_w.start, eval_w.stop, eval_cfg, seed=cfg.loop.seed)
        res = evaluate(greedy, trainer.features, fs.decision, cfg.sim, trainer.agent_cfg.window,
                       eval_w.start, eval_w.stop, cfg=eval_cfg)
        train_stats = {k: float(v) for k, v in trainer.sim.stats(trainer.state).items()}
        from trainer.loop.fold import direction_entropy

        result = {
            "fold": args.fold, "folds": args.folds,
            "train_window": [train_w.start, train_w.stop], "eval_window": [eval_w.start, eval_w.stop],
            **res.metrics,
            "dir_entropy": float(direction_entropy(trainer.dir_counts)),
            "train_win_rate": train_stats["win_rate"], "train_trades": int(train_stats["round_trips"]),
            "env_steps": trainer.env_step, "update_steps": trainer.update_step,
            "transitions": trainer.env_step * cfg.sim.n_envs,
            "weights_sha256": trainer.weights_hash,
            "feature_key": fs.key,
            "wall_seconds": round(trainer.wall_seconds, 3),
            "checkpoint_seconds": round(ckpt.seconds, 3),
            "fold_mode": args.fold_mode,
            **trainer.selection_summary(),
            "baselines": baselines,
        }
        np.save(fold_dir / "equity.npy", res.equity)  # continuous-pass equity curve for the report
        atomic_write_text(result_path, json.dumps(result, indent=2, sort_keys=True) + "\n")
        log.event("result", **{k: v for k, v in result.items() if not isinstance(v, (list, dict))})
    return EXIT_OK


def _write_run_json(run_dir: Path, cfg, fs, trainer) -> None:
    path = run_dir / "run.json"
    if path.exists():
        return
    info = {"config": dataclasses.asdict(cfg), "agent": dataclasses.asdict(trainer.agent_cfg),
            "feature_key": fs.key, "feature_names": list(fs.names), "instrument": dataclasses.asdict(fs.instrument),
            "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
            "data_fingerprint": hashlib.sha256(fs.key.encode()).hexdigest()}
    atomic_write_text(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")


def s3_fold_prefix(s3_prefix: str, run_dir: Path, fold_dir: Path) -> str:
    """PREFIX/<sha>/fold<N>[/seed<S>], or PREFIX/<sha>/control/fold<N>[/seed<S>] (the control's run dir is
    <sha>/control): the fold's place on the PVC, so seeds and markets never share a mirror prefix."""
    from trainer.folds.layout import CONTROL_DIR

    run = run_dir.name if run_dir.name != CONTROL_DIR else f"{run_dir.parent.name}/{CONTROL_DIR}"
    return f"{s3_prefix.strip('/')}/{run}/{fold_dir.relative_to(run_dir).as_posix()}"


def _s3_mirror(args, fold_dir: Path, log):
    if not args.s3_bucket:
        return None
    from trainer.checkpoint.s3 import S3Mirror

    mirror = S3Mirror(args.s3_bucket, s3_fold_prefix(args.s3_prefix, args.run_dir, fold_dir), log=log.event)  # uploads, retries, restores as JSON log lines
    from trainer.checkpoint.store import latest_valid

    if latest_valid(fold_dir, log=lambda p, why: None) is None:
        mirror.restore_latest(fold_dir)
    return mirror


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except KillCriterion as exc:
        print(json.dumps({"event": "killed", "fold": args.fold, "reason": exc.reason, "detail": str(exc)}),
              flush=True)
        return exit_code_for(exc)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
