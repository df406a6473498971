"""Where a fold's run lives on the volume: seed replicas and the control market (issue 21).

    <sha>/fold<N>/                  seed index 0: the layout every one-seed run has always had
    <sha>/fold<N>/seed<S>/          seed index S = 1..seeds-1 (own checkpoints, result.json, metrics.jsonl)
    <sha>/control/fold<N>[/seed<S>] the control market's runs (synthetic signal=0), the same shape

Seed index S trains with seed = base seed + S (torch, numpy, python and the simulator), so replica 0 is the
one-seed run bit for bit, and replicas differ only in their seed. The checkpoint store lists only the files of
its own folder, so fold<N>/'s retention and latest-valid never see the seed<S>/ subfolders.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["CONTROL_DIR", "fold_dir", "replica_seed"]

CONTROL_DIR = "control"
"""Sub-folder of the run dir (<sha>/control) holding the control market's folds; the report finds it by name."""


def fold_dir(run_dir: str | Path, fold: int, replica: int = 0) -> Path:
    """RUN/fold<fold> for seed index 0, RUN/fold<fold>/seed<replica> for the extra seeds."""
    for name, value in (("fold", fold), ("replica", replica)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    base = Path(run_dir) / f"fold{fold}"
    return base if replica == 0 else base / f"seed{replica}"


def replica_seed(base_seed: int, replica: int) -> int:
    """Training seed of seed index `replica`: base + replica (replica 0 keeps the base seed)."""
    if isinstance(replica, bool) or not isinstance(replica, int) or replica < 0:
        raise ValueError(f"replica must be an integer >= 0, got {replica!r}")
    return base_seed + replica
