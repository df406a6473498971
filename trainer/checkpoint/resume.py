"""Saving a training job's state to, and restoring it from, its own checkpoint folder.

Generic over what it saves: any object with `state_dict()` -> {section: {name: tensor}}, `load_state_dict`,
an `env_step` counter and a `device` (trainer.loop.fold.FoldTrainer is the one in use). A checkpoint holds those
sections, the RNG states and a JSON meta section with the fingerprint: the config (minus the fields that may
change between attempts), the data key and the tensor layout. A checkpoint whose fingerprint differs is refused
(ConfigMismatch, exit 2) naming the differing fields.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from trainer.checkpoint.format import read_checkpoint
from trainer.checkpoint.s3 import S3Mirror
from trainer.checkpoint.store import ConfigMismatch, fingerprint_mismatch, latest_valid, write_checkpoint
from trainer.checkpoint.tensors import (capture_rng_state, decode_json, decode_tensors, encode_json, encode_tensors,
                                        restore_rng_state)

__all__ = ["Stateful", "fingerprint", "tensor_layout", "FileCheckpointer", "restore", "open_mirror"]


class Stateful(Protocol):
    env_step: int
    device: torch.device

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]: ...

    def load_state_dict(self, sections: dict[str, dict[str, torch.Tensor]]) -> None: ...


class EventLog(Protocol):
    def event(self, name: str, **fields: Any) -> dict: ...


def fingerprint(config: dict, data_key: str, layout: dict) -> dict:
    """What must match for a checkpoint to be resumed: `config` (already stripped of the fields that may change
    between attempts: trainer.loop.config.fingerprint_config), the data key and the tensor layout. Plain JSON
    (tuples become lists), as it reads back from a checkpoint's meta section."""
    return json.loads(json.dumps({"config": config, "data_key": data_key, "layout": layout}))


def tensor_layout(sections: dict[str, dict[str, torch.Tensor]]) -> dict:
    """Shape and dtype of every state tensor. Optimiser moments are left out: AdamW creates them lazily at the
    first update, and their shapes follow from the parameters, which are listed."""
    return {f"{sec}.{name}": [list(t.shape), str(t.dtype).replace("torch.", "")]
            for sec, tensors in sections.items() for name, t in tensors.items() if not name.startswith("optim.")}


class FileCheckpointer:
    """Writes a Stateful's state through trainer.checkpoint (sections of tensors + JSON meta + RNG states)."""

    def __init__(self, fold_dir: Path, keep: int, meta: dict, log: EventLog, mirror: S3Mirror | None = None,
                 seconds: float = 0.0):
        self.fold_dir, self.keep, self.meta, self.log, self.mirror = fold_dir, keep, meta, log, mirror
        self.seconds = seconds
        """Seconds spent saving, over all attempts (restored from the checkpoint resumed from)."""

    def save(self, trainer: Stateful, final: bool = False) -> Path:
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
        return path


def restore(trainer: Stateful, fold_dir: Path, fp: dict, resume_from: Path | None, log: EventLog,
            may_differ: tuple[str, ...] = ()) -> dict | None:
    """Load the newest verifying checkpoint (or `resume_from`) into `trainer`; None when starting fresh.

    Returns the path, env_step, checkpoint_seconds and whether it is the final one. A checkpoint with another
    fingerprint raises ConfigMismatch (a ValueError: exit 2) before anything is loaded; `may_differ`: config fields
    ("section.field", trainer.settings.EVALUATION_ONLY) that are not compared."""
    if resume_from is not None:
        ckpt = read_checkpoint(resume_from)
        path = resume_from
    else:
        ckpt = latest_valid(fold_dir, log=lambda p, why: log.event("checkpoint_skipped", path=str(p), reason=why))
        path = None if ckpt is None else ckpt.path
    if ckpt is None:
        return None
    meta = decode_json(ckpt.sections["meta"])
    ignored = {f"config.{name}" for name in may_differ}
    differing = [name for name in fingerprint_mismatch(fp, meta["fingerprint"]) if name not in ignored]
    if differing:
        raise ConfigMismatch(path, differing, fp, meta["fingerprint"])
    state = {name.split("/", 1)[1]: decode_tensors(data, device=trainer.device)
             for name, data in ckpt.sections.items() if name.startswith("state/")}
    trainer.load_state_dict(state)
    restore_rng_state({k: bytes.fromhex(v) for k, v in decode_json(ckpt.sections["rng"]).items()})
    return {"path": str(path), "env_step": trainer.env_step,
            "checkpoint_seconds": float(meta.get("checkpoint_seconds", 0.0)), "final": bool(meta.get("final"))}


def open_mirror(bucket: str | None, prefix: str, fold_dir: Path, log: Callable[..., Any]) -> S3Mirror | None:
    """The S3 mirror of `fold_dir` under s3://bucket/prefix/ (None without a bucket). When the fold folder holds no
    valid checkpoint (a new node, a lost volume), the newest mirrored one is downloaded first, so restore finds it."""
    if not bucket:
        return None
    mirror = S3Mirror(bucket, prefix, log=log)  # uploads, retries, restores as JSON log lines
    if latest_valid(fold_dir, log=lambda p, why: None) is None:
        mirror.restore_latest(fold_dir)
    return mirror
