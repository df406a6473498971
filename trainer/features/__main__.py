"""python -m trainer.features --data SPEC --cache-dir DIR [--clock-events N | --clock-time-ms MS]

Builds (or finds) the fxcache entry for SPEC and prints one JSON line:
{"key": ..., "rows": T, "features": F, "skipped": bool}. Exit 2 on bad usage, spec or data.

python -m trainer.features bench [--data SPEC] [--tile K] [--clock-events N] [--repeat R]
times the decision clock, the DecisionTape builder and the features on SPEC's tape tiled K times
(each copy a later day, sizes jittered) and prints a table (see docs/features.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from trainer.errors import EXIT_OK, exit_code_for


def tile_tape(tape, copies: int, seed: int = 0):
    """`copies` back-to-back days of `tape`, sizes jittered by +-1 (kept >= 1 where present): a long tape
    with the real one's microstructure for benchmarks."""
    from trainer.data.tape import BookSeries, TradeSeries

    rng = np.random.default_rng(seed)
    b, tr = tape.book, tape.trades
    day = 86_400 * 1_000_000_000
    span = (int(max(b.ts_ns[-1], tr.ts_ns[-1]) - min(b.ts_ns[0], tr.ts_ns[0])) // day + 1) * day

    def jitter(sz: np.ndarray) -> np.ndarray:
        return np.where(sz > 0, np.maximum(sz + rng.integers(-1, 2, sz.shape), 1), 0)

    book = BookSeries(
        ts_ns=np.concatenate([b.ts_ns + k * span for k in range(copies)]),
        bid_px=np.concatenate([b.bid_px] * copies), bid_sz=np.concatenate([jitter(b.bid_sz) for _ in range(copies)]),
        ask_px=np.concatenate([b.ask_px] * copies), ask_sz=np.concatenate([jitter(b.ask_sz) for _ in range(copies)]))
    trades = TradeSeries(
        ts_ns=np.concatenate([tr.ts_ns + k * span for k in range(copies)]), px=np.concatenate([tr.px] * copies),
        size=np.concatenate([jitter(tr.size) for _ in range(copies)]), side=np.concatenate([tr.side] * copies))
    return dataclasses.replace(tape, book=book, trades=trades)


def bench(argv: list[str]) -> int:
    from trainer.data.spec import load_tape
    from trainer.features.clock import decision_rows
    from trainer.features.compute import compute_features
    from trainer.features.config import FeatureConfig
    from trainer.features.decision import build_decision_tape

    parser = argparse.ArgumentParser(prog="python -m trainer.features bench")
    parser.add_argument("--data", default="lobster:../shared/data/lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip")
    parser.add_argument("--tile", type=int, default=20, help="copies of the tape, one per day")
    parser.add_argument("--clock-events", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per stage (best is reported)")
    args = parser.parse_args(argv)
    cfg = FeatureConfig(clock_events=args.clock_events)
    tape = tile_tape(load_tape(args.data), args.tile)
    stages = {
        "decision_rows": lambda: decision_rows(tape.book, cfg, start_ns=tape.preopen_end_ns),
    }
    rows = stages["decision_rows"]()
    stages["build_decision_tape"] = lambda: build_decision_tape(tape, rows, cfg.trade_radius_ticks)
    stages["compute_features"] = lambda: compute_features(tape, rows, cfg)
    print(f"tape: {len(tape.book):,} book rows, {len(tape.trades):,} trades, {tape.book.levels} levels; "
          f"{rows.size:,} decisions (clock_events={cfg.clock_events}, R={cfg.trade_radius_ticks})")
    stages["compute_features"]()  # first call loads the numba kernel from its on-disk cache (or compiles)
    # Wall time is what a user waits; CPU time (this process only) is the stable number on a shared box.
    print(f"{'stage':<22}{'wall s':>9}{'cpu s':>9}{'decisions/s (wall)':>20}{'decisions/s (cpu)':>20}")
    for name, fn in stages.items():
        wall = cpu = float("inf")
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
        print(f"{name:<22}{wall:>9.3f}{cpu:>9.3f}{rows.size / wall:>20,.0f}{rows.size / cpu:>20,.0f}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m trainer.features", description=__doc__.split("\n\n")[1])
    parser.add_argument("--data", required=True, help="data spec (see docs/data.md), e.g. lobster:PATH.zip")
    parser.add_argument("--cache-dir", required=True, type=Path, help="fxcache root: entries go to DIR/<key>/")
    clock = parser.add_mutually_exclusive_group()
    clock.add_argument("--clock-events", type=int, help="decide every N book events (default 100)")
    clock.add_argument("--clock-time-ms", type=float, help="decide at most once per MS milliseconds")
    parser.add_argument("--trade-radius-ticks", type=int, help="trade histogram radius R (default 16)")
    args = parser.parse_args(argv)  # usage errors exit 2 via argparse

    try:
        from trainer.features.cache import load_or_build
        from trainer.features.config import FeatureConfig

        kw: dict[str, object] = {}
        if args.clock_events is not None:
            kw.update(clock="events", clock_events=args.clock_events)
        if args.clock_time_ms is not None:
            kw.update(clock="time", clock_time_ns=int(round(args.clock_time_ms * 1e6)))
        if args.trade_radius_ticks is not None:
            kw.update(trade_radius_ticks=args.trade_radius_ticks)
        fs, skipped = load_or_build(args.data, FeatureConfig(**kw), args.cache_dir)
    except Exception as exc:  # process edge: one clear line, exit code per DESIGN.md
        print(f"trainer.features: error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    print(json.dumps({"key": fs.key, "rows": int(fs.raw.shape[0]), "features": int(fs.raw.shape[1]),
                      "skipped": skipped}), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
