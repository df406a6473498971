"""`python -m trainer.train`: train fold N on walk-forward window N (windows 0..N with `--folds.train-window
anchored`), evaluate on window N+1, write result.json.

Process contract (DESIGN.md): started again with the same arguments it resumes from the newest valid checkpoint in
RUN/fold<N>/; if result.json exists it does nothing and exits 0. Exit codes: 0 done, 2 bad usage/config/data,
3 kill criterion, 143 stopped by SIGTERM/SIGINT after a checkpoint, 75 CUDA out of memory (retried, like anything
else). Flags: trainer/cli.py.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from trainer.checkpoint.resume import FileCheckpointer, fingerprint, open_mirror, restore, tensor_layout
from trainer.cli import Invocation, parse
from trainer.errors import EXIT_BAD_INPUT, EXIT_CUDA_OOM, EXIT_OK, EXIT_SIGTERM, KillCriterion, exit_code_for
from trainer.data.fees import venue_fees
from trainer.features.cache import load_or_build
from trainer.folds.chain import wait_for_previous, warm_start
from trainer.folds.result import evaluate_fold, write_result, write_run_json
from trainer.folds.windows import fold_windows, walk_forward_windows
from trainer.loop.config import fingerprint_config
from trainer.loop.fold import FoldTrainer, Stopped, Window, fold_inputs
from trainer.loop.log import JsonLog
from trainer.settings import EVALUATION_ONLY


def run(inv: Invocation) -> int:
    opts = inv.run
    cfg = opts.seeded(inv.config)
    n, chained = cfg.folds.fold, cfg.folds.fold_mode == "chain" and cfg.folds.fold > 0
    fold_dir = opts.fold_dir(n)  # RUN/fold<N>, or RUN/fold<N>/seed<S> for an extra seed
    log = JsonLog(n)
    if (fold_dir / "result.json").exists():
        log.event("done_already", result=str(fold_dir / "result.json"), attempt=opts.attempt)
        return EXIT_OK
    if chained:
        # InputError (exit 2) if this seed's previous fold is unfinished
        wait_for_previous(opts.run_dir, n, cfg.folds.chain_wait_seconds, replica=opts.replica)
    fold_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log.event("start", attempt=opts.attempt, run_dir=str(opts.run_dir), folds=cfg.folds.folds, data=cfg.data,
              replica=opts.replica, fold_dir=str(fold_dir), seed=cfg.loop.seed, preset=opts.preset,
              host=platform.node(), torch=torch.__version__)

    # features: the fxcache (built once per data spec + feature config; skipped when present)
    fs, skipped = load_or_build(cfg.data, cfg.features, opts.fxcache_dir())
    fees = None
    if cfg.sim.fees == "venue":  # the data's venue fee schedule sets what the simulator charges
        fees = venue_fees(cfg.data, fs.decision.bid_px[:, 0], fs.decision.ask_px[:, 0], fs.decision.tick_value)
        cfg = cfg.replace(sim={"maker_fee": fees["maker_fee"], "taker_fee": fees["taker_fee"]})
    log.event("features", key=fs.key, rows=int(fs.raw.shape[0]), features=int(fs.raw.shape[1]), skipped=skipped)
    if cfg.loop.compile != "none":  # inductor reads the variable at its first compile
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = opts.inductor_cache_dir()
        log.event("compile_cache", path=os.environ["TORCHINDUCTOR_CACHE_DIR"], mode=cfg.loop.compile)
    windows = walk_forward_windows(fs.raw.shape[0], cfg.folds.folds, embargo_rows=cfg.folds.embargo_rows)
    train_w, eval_w = fold_windows(windows, n, train_window=cfg.folds.train_window)
    features, names, reflected = fold_inputs(cfg, fs.raw, fs.names, fs.decision, Window(train_w.start, train_w.stop))

    with open(fold_dir / "metrics.jsonl", "a") as metrics_file:
        log = JsonLog(n, copy_to=metrics_file)
        trainer = FoldTrainer(cfg, features, fs.decision, Window(train_w.start, train_w.stop), n, log, reflected)
        fp = fingerprint(fingerprint_config(cfg.to_dict()), fs.key, tensor_layout(trainer.state_dict()))
        write_run_json(opts.run_dir, cfg, fs, trainer, fees, names)
        if opts.evaluate_from is not None:  # another run's trained fold under other deployment rules
            seconds = load_trained(trainer, opts.evaluate_from, fp, cfg.loop.n_steps, log)["checkpoint_seconds"]
        else:
            mirror = open_mirror(opts.s3_bucket, opts.s3_fold_prefix(n), fold_dir, log.event)
            resumed = restore(trainer, fold_dir, fp, opts.resume_from, log)
            if resumed is None and chained:
                log.event("chain_warm_start",
                          **warm_start(trainer, opts.run_dir, fp, cfg.chain, replica=opts.replica))
            log.event("resume" if resumed else "fresh", attempt=opts.attempt,
                      checkpoint=resumed["path"] if resumed else None, env_step=trainer.env_step)
            meta = {"fingerprint": fp, "fold": n, "folds": cfg.folds.folds}
            ckpt = FileCheckpointer(fold_dir, cfg.loop.keep_checkpoints, meta, log, mirror,
                                    seconds=resumed["checkpoint_seconds"] if resumed else 0.0)
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
            seconds = ckpt.seconds
        source = None if opts.evaluate_from is None else str(opts.evaluate_from)
        record = write_result(fold_dir, *evaluate_fold(trainer, fs, cfg, train_w, eval_w, seconds, names,
                                                         evaluated_from=source))
        log.event("result", **{k: v for k, v in record.items() if not isinstance(v, (list, dict))})
    return EXIT_OK


def load_trained(trainer: FoldTrainer, src: Path, fp: dict, n_steps: int, log: JsonLog) -> dict:
    """--evaluate-from: load the final checkpoint of the fold directory `src` into `trainer`; only the EVALUATION_ONLY
    fields may differ from this run's fingerprint. Returns what `restore` returns."""
    if not src.is_dir():
        raise FileNotFoundError(f"--evaluate-from {src}: not a fold directory")
    resumed = restore(trainer, src, fp, None, log, may_differ=EVALUATION_ONLY)
    if resumed is None:
        raise FileNotFoundError(f"--evaluate-from {src}: no valid checkpoint there")
    if not resumed["final"] or trainer.env_step != n_steps:
        raise ValueError(f"--evaluate-from {resumed['path']}: not a finished training (env_step {trainer.env_step} "
                         f"of {n_steps}, final={resumed['final']}); only a final checkpoint is evaluated")
    log.event("evaluate_from", checkpoint=resumed["path"], env_step=trainer.env_step)
    return resumed


def main(argv: list[str] | None = None) -> int:
    fold = None
    try:
        inv = parse(argv)
        fold = inv.config.folds.fold
        return run(inv)
    except KillCriterion as exc:
        print(json.dumps({"event": "killed", "fold": fold, "reason": exc.reason, "detail": str(exc)}), flush=True)
        return exit_code_for(exc)
    except torch.cuda.OutOfMemoryError as exc:  # the step stopped mid-way: nothing is saved from that state
        print(json.dumps({"event": "cuda_oom", "fold": fold, "exit_code": EXIT_CUDA_OOM,
                          "detail": str(exc).splitlines()[0] if str(exc) else ""}), flush=True)
        return EXIT_CUDA_OOM
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
