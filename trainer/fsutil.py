"""Durable file writes shared by every stage: temp name in the same directory, fsync, rename, fsync the directory.

A reader sees the old file or the whole new one, never a torn one, and after the call returns the new file survives
a power cut (POSIX keeps a directory entry in the directory's own data, hence its fsync after the rename).

- `atomic_write(path, write)`: the one temp-then-rename writer; `write(f)` streams into the temp file, so large
  outputs (checkpoints, plots) are not held in memory twice. `atomic_write_bytes` / `atomic_write_text` wrap it.
- `replace_file(temp, final)`: the second half alone, for a temp file another library wrote (an S3 download).
- `publish_directory(temp_dir, final_dir)`: the same for a directory built in full under a temp name (the feature
  cache, the synthetic dataset), where a concurrent builder may have published first.
- `write_durably(path, write)` and `fsync_directory(directory)`: the pieces, for files inside such a directory.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make a rename, create or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush the contents of an already written and closed file to the device."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_durably(path: str | os.PathLike, write: Callable[[BinaryIO], object], buffering: int = -1) -> None:
    """Create `path`, let `write(f)` fill it, flush and fsync it (no rename: for files in a private temp folder)."""
    with open(path, "wb", buffering=buffering) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def replace_file(temp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename the complete, fsynced `temp` over `final` (same directory) and fsync that directory."""
    final = Path(final)
    os.replace(temp, final)
    fsync_directory(final.parent)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, temp: Path | None = None,
                 buffering: int = -1) -> None:
    """Write `path` through `write(f)` atomically and durably. `temp` (same directory) defaults to
    `.<name>.tmp-<pid>`; a caller that sweeps its own crashed temps passes a name it recognises. On any error the
    temp file is removed and the error re-raised; `path` is then untouched."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}") if temp is None else Path(temp)
    try:
        write_durably(temp, write, buffering)
        replace_file(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """`atomic_write` of `data`."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """`atomic_write` of `text` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode())


def publish_directory(temp_dir: str | os.PathLike, final_dir: str | os.PathLike) -> bool:
    """Rename the complete `temp_dir` (its files already durable) to `final_dir`, durably. Returns False, leaving
    `temp_dir` for the caller to discard, when another process published `final_dir` first."""
    final_dir = Path(final_dir)
    fsync_directory(temp_dir)  # its entries, before they become visible under the final name
    try:
        os.rename(temp_dir, final_dir)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) and final_dir.is_dir():
            return False
        raise
    fsync_directory(final_dir.parent)
    return True
