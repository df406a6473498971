"""Mirror checkpoints to S3 in the background, and restore the newest verified one into an empty run dir.

    mirror = S3Mirror("my-bucket", f"runs/{sha}/fold{n}")
    mirror.restore_latest(fold_dir)              # startup: only acts when fold_dir has no valid checkpoint
    ...
    mirror.submit(write_checkpoint(fold_dir, step, sections))   # never blocks the training loop
    ...
    mirror.close(timeout=60)                    # at exit: drain what is queued

Uploads run on one daemon thread. The queue is bounded: when it is full the OLDEST pending upload
is dropped (a newer checkpoint makes it worthless) and counted. A failed upload is retried with
exponential backoff while nothing newer is queued; once something newer is queued the failing one
is abandoned ("superseded"), so a long outage ends with the newest checkpoint uploaded first.
After each upload the remote prefix gets the same retention as the local directory.

Credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profile,
IRSA web identity, instance role); the endpoint from `endpoint_url`, else $ALPHA_RL_S3_ENDPOINT,
else AWS.
"""
from __future__ import annotations

import collections
import os
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig

from trainer.checkpoint.format import CorruptCheckpoint, read_checkpoint
from trainer.checkpoint.store import NAME_RE, latest_valid, retention_victims
from trainer.fsutil import fsync_file, replace_file

__all__ = ["ENDPOINT_ENV", "S3Mirror", "S3MirrorConfig"]

ENDPOINT_ENV = "ALPHA_RL_S3_ENDPOINT"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# 200 MB checkpoints go up in 32 MiB parts, 4 at a time: bounded memory, parallel enough for a pod NIC.
_TRANSFER = TransferConfig(multipart_threshold=64 * 2**20, multipart_chunksize=32 * 2**20, max_concurrency=4)


@dataclass(frozen=True)
class S3MirrorConfig:
    """Where and how checkpoints are mirrored to S3."""

    bucket: str
    """Bucket name (S3 rules: 3-63 chars of a-z 0-9 . -). The bucket must exist."""
    prefix: str = ""
    """Key prefix, e.g. "runs/<git-sha>/fold3"; objects are PREFIX/checkpoint-<step>.bin. Slashes at
    either end are ignored."""
    endpoint_url: str | None = None
    """S3 endpoint, e.g. http://seaweedfs:8333; None → $ALPHA_RL_S3_ENDPOINT, else AWS."""
    queue_size: int = 4
    """Pending uploads held; when full the oldest pending one is dropped."""
    retries: int = 8
    """Attempts per upload, download or listing before giving up on it."""
    backoff_initial_s: float = 0.5
    """Wait after the first failed attempt; doubles per attempt."""
    backoff_max_s: float = 30.0
    """Cap on the wait between attempts."""
    keep: int = 2
    """Remote retention: newest checkpoints kept under the prefix (>= 2, as locally)."""
    timeout_s: float = 30.0
    """Connect and read timeout of each S3 request."""

    def __post_init__(self) -> None:
        if not isinstance(self.bucket, str) or not _BUCKET_RE.match(self.bucket):
            raise ValueError(f"bucket must be a valid S3 bucket name, got {self.bucket!r}")
        if not isinstance(self.prefix, str):
            raise ValueError(f"prefix must be a str, got {self.prefix!r}")
        if self.endpoint_url is not None and not str(self.endpoint_url).startswith(("http://", "https://")):
            raise ValueError(f"endpoint_url must start with http:// or https://, got {self.endpoint_url!r}")
        for name in ("queue_size", "retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 2:
            raise ValueError(f"keep must be an int >= 2, got {self.keep!r}")
        for name in ("backoff_initial_s", "backoff_max_s", "timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s {self.backoff_max_s} is below backoff_initial_s {self.backoff_initial_s}")


def _log_to_stderr(event: str, **fields: Any) -> None:
    detail = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"s3 mirror: {event} {detail}", file=sys.stderr, flush=True)


class S3Mirror:
    """Background uploader of checkpoint files plus restore; see the module docstring."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        queue_size: int = 4,
        retries: int = 8,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        keep: int = 2,
        timeout_s: float = 30.0,
        log: Callable[..., Any] = _log_to_stderr,
    ):
        """`log(event, **fields)` receives every retry, drop, failure and upload (JsonLog.event fits)."""
        self.config = S3MirrorConfig(
            bucket, prefix, endpoint_url, queue_size, retries, backoff_initial_s, backoff_max_s, keep, timeout_s
        )
        self.endpoint_url = endpoint_url or os.environ.get(ENDPOINT_ENV) or None
        self.prefix = prefix.strip("/")
        self.log = log
        # Our own retry loop (with the supersede rule) replaces botocore's retries.
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            config=BotoConfig(
                connect_timeout=timeout_s,
                read_timeout=timeout_s,
                retries={"mode": "standard", "total_max_attempts": 1},
            ),
        )
        self._pending: collections.deque[Path] = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._abandon = False
        self.counts = {"submitted": 0, "uploaded": 0, "dropped": 0, "superseded": 0, "failed": 0, "vanished": 0}
        self._thread = threading.Thread(target=self._run, name="s3-mirror", daemon=True)
        self._thread.start()

    # ── naming ──

    def key_for(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _backoff_s(self, attempt: int) -> float:
        return min(self.config.backoff_initial_s * 2**attempt, self.config.backoff_max_s)

    # ── caller side ──

    def submit(self, path: str | os.PathLike) -> None:
        """Queue an upload of a written checkpoint; returns at once (a lock and a deque append)."""
        path = Path(path)
        if not NAME_RE.match(path.name):
            raise ValueError(f"{path}: not a checkpoint file name (checkpoint-<12 digits>.bin)")
        with self._cond:
            if self._closing:
                raise RuntimeError("S3Mirror.submit after close()")
            if len(self._pending) >= self.config.queue_size:
                dropped = self._pending.popleft()
                self.counts["dropped"] += 1
                self.log("s3_upload_dropped", path=str(dropped), reason="queue full, newer checkpoint queued")
            self._pending.append(path)
            self.counts["submitted"] += 1
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        """Uploads waiting in the queue (not counting one in flight)."""
        with self._cond:
            return len(self._pending)

    @property
    def pending(self) -> int:
        """Uploads queued or in flight."""
        with self._cond:
            return len(self._pending) + int(self._busy)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting uploads and wait up to `timeout` s for the queue to drain; True if it drained.

        On timeout the thread abandons what is left (it is a daemon: process exit never waits on it).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._pending or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._abandon = True
                    self._cond.notify_all()
                    return False
                self._cond.wait(left)
        self._thread.join(timeout=1.0)
        return True

    # ── upload thread ──

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending or self._abandon:
                    self._pending.clear()
                    self._cond.notify_all()
                    return
                path = self._pending.popleft()
                self._busy = True
            try:
                self._upload_with_retries(path)
            except Exception as exc:  # noqa: BLE001 - the thread must survive anything one upload does
                self.counts["failed"] += 1
                self.log("s3_upload_failed", path=str(path), error=repr(exc))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upload_with_retries(self, path: Path) -> None:
        key = self.key_for(path.name)
        for attempt in range(self.config.retries):
            try:
                # Open once: local retention may unlink the file mid-upload; the open handle still reads it.
                with open(path, "rb") as handle:
                    self.client.upload_fileobj(handle, self.config.bucket, key, Config=_TRANSFER)
            except FileNotFoundError:
                self.counts["vanished"] += 1
                self.log("s3_upload_skipped", path=str(path), reason="file gone before upload (local retention)")
                return
            except Exception as exc:  # noqa: BLE001 - network, server and auth errors are all retried
                with self._cond:
                    superseded = bool(self._pending)
                    last = attempt + 1 == self.config.retries
                    if superseded or last or self._abandon:
                        outcome = "superseded" if superseded else "failed"
                        self.counts[outcome] += 1
                        self.log(f"s3_upload_{outcome}", path=str(path), attempts=attempt + 1, error=repr(exc))
                        return
                    wait_s = self._backoff_s(attempt)
                    self.log("s3_upload_retry", path=str(path), attempt=attempt + 1, wait_s=wait_s, error=repr(exc))
                    # Sleep, but wake at once if a newer upload arrives (it supersedes this one) or on abandon.
                    self._cond.wait_for(lambda: bool(self._pending) or self._abandon, timeout=wait_s)
                continue
            self.counts["uploaded"] += 1
            self.log("s3_uploaded", path=str(path), key=key, attempts=attempt + 1)
            self._apply_retention(NAME_RE.match(path.name), key)
            return

    def _remote_checkpoints(self) -> list[tuple[int, str]]:
        """(step, key) of every checkpoint object under the prefix, oldest first."""
        found = []
        start = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.config.bucket, Prefix=start):
            for item in page.get("Contents", []):
                match = NAME_RE.match(item["Key"][len(start) :])
                if match:
                    found.append((int(match.group(1)), item["Key"]))
        return sorted(found)

    def _apply_retention(self, match: re.Match[str], uploaded_key: str) -> None:
        try:
            remote = self._remote_checkpoints()
            victims = set(retention_victims((s for s, _ in remote), int(match.group(1)), self.config.keep))
            for step, key in remote:
                if step in victims and key != uploaded_key:
                    self.client.delete_object(Bucket=self.config.bucket, Key=key)
                    self.log("s3_retention_deleted", key=key)
        except Exception as exc:  # noqa: BLE001 - retention is retried after the next upload
            self.log("s3_retention_failed", error=repr(exc))

    # ── restore ──

    def _with_retries(self, what: str, call: Callable[[], Any]) -> Any:
        for attempt in range(self.config.retries):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - retried, then re-raised
                if attempt + 1 == self.config.retries:
                    raise RuntimeError(f"S3 {what} failed after {attempt + 1} attempts: {exc!r}") from exc
                wait_s = self._backoff_s(attempt)
                self.log("s3_retry", what=what, attempt=attempt + 1, wait_s=wait_s, error=repr(exc))
                time.sleep(wait_s)
        raise AssertionError("unreachable")

    def restore_latest(self, directory: str | os.PathLike) -> Path | None:
        """Download the newest remote checkpoint that verifies into `directory`; its path, or None.

        Does nothing (None) when `directory` already holds a valid checkpoint: the local copy is at
        least as new as anything this process mirrored. Each remote file is downloaded to a hidden
        temp name, verified with read_checkpoint, then renamed; corrupt ones are logged and skipped.
        An unreachable S3 raises RuntimeError after the retries rather than returning None, so a run
        never silently restarts from scratch (and then prunes the good remote checkpoints).
        """
        directory = Path(directory)
        if latest_valid(directory, log=lambda p, r: self.log("checkpoint_skipped", path=str(p), reason=r)):
            return None
        remote = self._with_retries("list", self._remote_checkpoints)
        directory.mkdir(parents=True, exist_ok=True)
        for step, key in reversed(remote):
            name = key.rsplit("/", 1)[-1]
            temp = directory / f".{name}.tmp-{uuid.uuid4().hex}"  # the store's temp pattern: cleaned on next write
            try:
                self._with_retries(
                    f"download {key}", lambda: self.client.download_file(self.config.bucket, key, str(temp), Config=_TRANSFER)
                )
                try:
                    checkpoint = read_checkpoint(temp)
                except CorruptCheckpoint as exc:
                    self.log("s3_restore_skipped", key=key, reason=f"corrupt at byte {exc.offset}: {exc.rule}")
                    continue
                if checkpoint.step != step:
                    self.log("s3_restore_skipped", key=key, reason=f"header step {checkpoint.step} != name step {step}")
                    continue
                fsync_file(temp)  # boto wrote it; durable before it takes the final name
                final = directory / name
                replace_file(temp, final)
                self.log("s3_restored", key=key, path=str(final), step=step)
                return final
            finally:
                temp.unlink(missing_ok=True)
        return None
