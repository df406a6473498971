"""Report figures (matplotlib, Agg backend: no display needed on a pod or CI box).

equity.png     continuous-pass out-of-sample equity per fold (RUN/fold<N>/equity.npy), currency vs decision step.
training.png   training curves per fold from RUN/fold<N>/metrics.jsonl `step` lines: loss, mean Q, win rate,
               direction entropy vs env_step. A resumed fold appends to metrics.jsonl; the last line per env_step wins.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend first)
import numpy as np  # noqa: E402

from trainer.fsutil import atomic_write  # noqa: E402

TRAINING_CURVES = ("loss", "q_mean", "win_rate", "dir_entropy")


def training_curves(metrics_path: Path) -> dict[str, np.ndarray]:
    """{'env_step': (n,), name: (n,)} from the `step` events of a metrics.jsonl; unparseable lines are skipped
    (a line torn by a kill mid-write must not stop the report)."""
    by_step: dict[int, dict] = {}
    if metrics_path.is_file():
        for line in metrics_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("event") == "step" and "env_step" in rec:
                by_step[int(rec["env_step"])] = rec
    steps = sorted(by_step)
    out = {"env_step": np.asarray(steps, dtype=np.int64)}
    for name in TRAINING_CURVES:
        # loss and Q are interval means over gradient steps: before learning starts there are none (logged as 0)
        needs_update = name in ("loss", "q_mean")
        out[name] = np.asarray([np.nan if needs_update and by_step[s].get("update_step", 1) == 0
                                else float(by_step[s].get(name, np.nan)) for s in steps], dtype=np.float64)
    return out


def _save(fig, path: Path) -> None:
    try:
        atomic_write(path, lambda f: fig.savefig(f, format=path.suffix[1:], dpi=110, bbox_inches="tight"))
    finally:
        plt.close(fig)


def plot_equity(run_dir: Path, folds: list[int], path: Path) -> bool:
    """One line per fold with an equity.npy; False (nothing written) when no fold has one."""
    curves = {f: np.load(run_dir / f"fold{f}" / "equity.npy") for f in folds
              if (run_dir / f"fold{f}" / "equity.npy").is_file()}
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(8, 4))
    for f, eq in curves.items():
        ax.plot(np.arange(eq.size), eq, label=f"fold {f}")
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.set(xlabel="decision step in the eval window", ylabel="equity (currency, net of fees)",
           title="Out-of-sample equity, continuous pass")
    ax.legend()
    _save(fig, path)
    return True


def plot_training(run_dir: Path, folds: list[int], path: Path) -> bool:
    curves = {f: training_curves(run_dir / f"fold{f}" / "metrics.jsonl") for f in folds}
    curves = {f: c for f, c in curves.items() if c["env_step"].size}
    if not curves:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(10, 6), sharex=True)
    for ax, name in zip(axes.flat, TRAINING_CURVES):
        for f, c in curves.items():
            ax.plot(c["env_step"], c[name], marker=".", label=f"fold {f}")
        ax.set(title=name, xlabel="env_step")
    axes.flat[0].legend()
    fig.suptitle("Training curves")
    fig.tight_layout()
    _save(fig, path)
    return True
