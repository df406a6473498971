"""Atomic file writes shared by every stage: temp name in the same directory, fsync, rename.

(Checkpoints have their own writer in trainer/checkpoint/store.py: unique temp names that a restarted writer can
recognise and sweep, and an fsync of the directory after the rename.)"""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` of `text` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode())
