"""Checkpoints in a run directory: atomic write, retention, newest-valid lookup, config fingerprints.

One writer per directory (one fold process owns `RUN/fold<N>/`); any number of readers. A file is
visible under its final name only once it is complete and on disk: it is written to a hidden temp
name in the same directory, flushed, fsynced, renamed, and the directory is fsynced so the rename
itself survives a power cut. A crash at any point leaves either the previous set of checkpoints or
the previous set plus a hidden temp file, which readers ignore and the next write deletes.

    python -m trainer.checkpoint.store bench [--mb 200] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from trainer.checkpoint.format import Checkpoint, CorruptCheckpoint, read_checkpoint, write_stream
from trainer.fsutil import atomic_write, fsync_directory

__all__ = [
    "Checkpoint",
    "ConfigMismatch",
    "CorruptCheckpoint",
    "checkpoint_name",
    "fingerprint_mismatch",
    "latest_valid",
    "list_checkpoints",
    "read_checkpoint",
    "retention_victims",
    "write_checkpoint",
]

NAME_RE = re.compile(r"^checkpoint-(\d{12})\.bin$")
_TEMP_PREFIX = ".checkpoint-"
_TEMP_RE = re.compile(r"^\.checkpoint-\d{12}\.bin\.tmp-[0-9a-f]{32}$")
_MAX_NAMED_STEP = 10**12 - 1  # 12 digits keep lexical order == step order


def checkpoint_name(step: int) -> str:
    """File name for a step; zero-padded so names sort by step."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_NAMED_STEP:
        raise ValueError(f"step must be an int in [0, {_MAX_NAMED_STEP}], got {step!r}")
    return f"checkpoint-{step:012d}.bin"


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every file named like a checkpoint, oldest first. Temp files are not listed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = NAME_RE.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def retention_victims(steps: Iterable[int], written_step: int, keep: int) -> list[int]:
    """Steps to delete after `written_step` was written: all but the newest `keep` (the written one included).

    Steps above `written_step` are deleted too. A run only writes step s after resuming from the newest
    valid checkpoint at or below s, so a file with a higher step is one the resume rejected (corrupt)
    or abandoned; left in place it would shadow the checkpoint just written. Shared with the S3 mirror.
    """
    if keep < 2:
        raise ValueError(f"keep must be >= 2 (a torn newest file must leave a previous one), got {keep}")
    unique = set(steps)
    older = sorted((s for s in unique if s < written_step), reverse=True)
    newer = [s for s in unique if s > written_step]
    return sorted(older[keep - 1 :] + newer)


def _remove_stale_temps(directory: Path) -> None:
    """Delete temp files left by a writer that crashed before its rename (one writer per directory)."""
    for entry in directory.iterdir():
        if _TEMP_RE.match(entry.name):
            entry.unlink(missing_ok=True)


def write_checkpoint(
    directory: str | os.PathLike, step: int, sections: Mapping[str, bytes], *, keep: int = 2
) -> Path:
    """Atomically write `checkpoint-<step:012d>.bin` into `directory`, then apply retention.

    Returns the final path. Costs one sha256 pass over the data, the write and an fsync (the fsync
    dominates on network volumes). Retention keeps the newest `keep` checkpoints (>= 2) and deletes
    the rest, see retention_victims; it also removes temp files of earlier crashed writes.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
        raise ValueError(f"keep must be an int >= 2 (a torn newest file must leave a previous one), got {keep!r}")
    final_name = checkpoint_name(step)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # A unique temp name that _remove_stale_temps recognises (a crashed writer's file is swept by the next write).
    temp = directory / f"{_TEMP_PREFIX}{step:012d}.bin.tmp-{uuid.uuid4().hex}"
    final = directory / final_name
    atomic_write(final, lambda out: write_stream(out, step, sections), temp=temp, buffering=1 << 20)
    victims = set(retention_victims((s for s, _ in list_checkpoints(directory)), step, keep))
    for victim_step, victim in list_checkpoints(directory):
        if victim_step in victims:
            victim.unlink(missing_ok=True)
    _remove_stale_temps(directory)
    fsync_directory(directory)
    return final


def _log_to_stderr(path: Path, reason: str) -> None:
    print(f"checkpoint: skipping {path}: {reason}", file=sys.stderr, flush=True)


def latest_valid(
    directory: str | os.PathLike, log: Callable[[Path, str], None] = _log_to_stderr
) -> Checkpoint | None:
    """The newest checkpoint in `directory` that verifies, or None if there is none.

    Tries files newest first; each one skipped (corrupt, unreadable, or its header step disagrees with
    its name) is reported through `log(path, reason)` before falling back to the previous one. Reads
    and hashes every file it tries (the newest one, normally).
    """
    for step, path in reversed(list_checkpoints(directory)):
        try:
            checkpoint = read_checkpoint(path)
        except CorruptCheckpoint as exc:
            log(path, f"corrupt at byte {exc.offset}: {exc.rule}")
            continue
        except OSError as exc:  # vanished (concurrent retention) or unreadable
            log(path, f"unreadable: {exc}")
            continue
        if checkpoint.step != step:
            log(path, f"header step {checkpoint.step} disagrees with the file name (step {step})")
            continue
        return checkpoint
    return None


# ── Config / tensor-layout fingerprints ──────────────────────────────────────────────────────────


_MISSING = object()


def fingerprint_mismatch(expected: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Dotted names of fields that differ between two nested dicts (added or removed keys included), sorted.

    Dicts are compared key by key recursively; anything else (lists, numbers, strings) by equality,
    with bool and int told apart (True == 1 in Python, but a flag is not a count).
    """
    differing: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in set(a) | set(b):
                walk(a.get(key, _MISSING), b.get(key, _MISSING), f"{prefix}.{key}" if prefix else str(key))
        elif a is _MISSING or b is _MISSING or type(a) is bool or type(b) is bool:
            if a is _MISSING or b is _MISSING or type(a) is not type(b) or a != b:
                differing.append(prefix)
        elif a != b:
            differing.append(prefix)

    walk(expected, found, "")
    return sorted(differing)


class ConfigMismatch(ValueError):
    """A checkpoint written under a different config or tensor layout than the run resuming from it."""

    def __init__(
        self,
        path: object,
        fields: list[str],
        expected: Mapping[str, Any] | None = None,
        found: Mapping[str, Any] | None = None,
    ):
        self.path, self.fields = path, list(fields)

        def value(tree: Mapping[str, Any] | None, dotted: str) -> str:
            node: Any = tree
            for part in dotted.split("."):
                if not isinstance(node, Mapping) or part not in node:
                    return "<absent>"
                node = node[part]
            return repr(node)

        if expected is not None and found is not None:
            shown = ", ".join(f"{f} (run {value(expected, f)}, checkpoint {value(found, f)})" for f in self.fields)
        else:
            shown = ", ".join(self.fields)
        super().__init__(f"{path}: checkpoint does not match this run; differing fields: {shown}")


# ── Benchmark ────────────────────────────────────────────────────────────────────────────────────


def bench(total_mb: int = 200, directory: str | os.PathLike | None = None) -> dict[str, float]:
    """Time encode → write (fsync included) → read (verify) → decode of ~total_mb MB of float32 tensors.

    Prints a table and returns MB/s per phase. Cold-cache reads are not measured (the file was just
    written, so it is in the page cache): the read number is the verify + copy cost.
    """
    import torch

    from trainer.checkpoint.tensors import decode_tensors, encode_tensors

    # Eight tensors, the shape of a real save: networks, optimiser moments, replay buffer.
    per_tensor = total_mb * 2**20 // 8 // 4
    generator = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(per_tensor, generator=generator) for i in range(8)}
    with tempfile.TemporaryDirectory(dir=directory) as run_dir:
        t0 = time.perf_counter()
        payload = encode_tensors(tensors)
        t1 = time.perf_counter()
        path = write_checkpoint(run_dir, 1, {"tensors": payload, "meta": b"{}"})
        t2 = time.perf_counter()
        loaded = read_checkpoint(path)
        t3 = time.perf_counter()
        decoded = decode_tensors(loaded.sections["tensors"])
        t4 = time.perf_counter()
        if not all(torch.equal(decoded[k], v) for k, v in tensors.items()):
            raise RuntimeError("bench: round trip changed the tensors")
        size_mb = path.stat().st_size / 2**20
    rates = {
        "encode_tensors": size_mb / (t1 - t0),
        "write_checkpoint (fsync)": size_mb / (t2 - t1),
        "read_checkpoint (verify)": size_mb / (t3 - t2),
        "decode_tensors": size_mb / (t4 - t3),
        "save total": size_mb / (t2 - t0),
        "load total": size_mb / (t4 - t2),
    }
    print(f"checkpoint bench: {size_mb:.1f} MiB file in {directory or tempfile.gettempdir()}")
    print(f"{'phase':<26} {'MiB/s':>8}")
    for phase, rate in rates.items():
        print(f"{phase:<26} {rate:>8.0f}")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.checkpoint.store", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bench_parser = sub.add_parser("bench", help="measure save / load MiB/s")
    bench_parser.add_argument("--mb", type=int, default=200, help="payload size in MiB (default 200)")
    bench_parser.add_argument("--dir", default=None, help="directory to write in (default: the temp dir)")
    args = parser.parse_args(argv)
    if args.mb < 1:
        parser.error(f"--mb must be >= 1, got {args.mb}")
    bench(args.mb, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
