"""S3 mirror against a real SeaweedFS server: upload + remote retention, restore, and a server outage."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.s3server import BUCKET, _free_ports, seaweed_s3, s3_env  # noqa: F401  (fixtures are found by name)
from trainer.checkpoint.format import read_checkpoint
from trainer.checkpoint.s3 import S3Mirror, S3MirrorConfig
from trainer.checkpoint.store import checkpoint_name, latest_valid, list_checkpoints, write_checkpoint


class Events:
    """Collects mirror log events (the `log(event, **fields)` hook) from the upload thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items: list[tuple[str, dict]] = []

    def __call__(self, event, **fields):
        with self.lock:
            self.items.append((event, fields))

    def names(self) -> list[str]:
        with self.lock:
            return [event for event, _ in self.items]


def _remote(server, bucket: str, prefix: str) -> dict[str, bytes]:
    client = server.client()
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listing}


def test_submitted_checkpoints_land_in_s3_with_remote_retention(s3_env, tmp_path):
    bucket, base, events = BUCKET, s3_env.new_prefix(), Events()
    mirror = S3Mirror(bucket, f"/{base}/fold0/", log=events, backoff_initial_s=0.05)  # endpoint from env
    assert mirror.endpoint_url == s3_env.endpoint
    paths = [write_checkpoint(tmp_path, step, {"w": bytes([step]) * 5000}, keep=3) for step in (10, 20, 30)]
    for path in paths:
        mirror.submit(path)
    assert mirror.close(timeout=60)
    remote = _remote(s3_env, bucket, f"{base}/fold0")
    assert sorted(remote) == [f"{base}/fold0/{checkpoint_name(s)}" for s in (20, 30)]
    for path in paths[1:]:
        assert remote[f"{base}/fold0/{path.name}"] == path.read_bytes()
    assert mirror.counts["uploaded"] == 3 and events.names().count("s3_retention_deleted") == 1
    with pytest.raises(RuntimeError, match="after close"):
        mirror.submit(paths[-1])


def test_restore_latest_fills_an_empty_run_dir_with_the_newest_remote_file_that_verifies(s3_env, tmp_path):
    bucket, prefix, events = BUCKET, f"{s3_env.new_prefix()}/fold1", Events()
    source = tmp_path / "pvc-lost"
    mirror = S3Mirror(bucket, prefix, log=events)
    for step in (100, 200):
        mirror.submit(write_checkpoint(source, step, {"state": str(step).encode() * 1000}))
    assert mirror.close(timeout=60)
    # A torn upload under a newer name: restore must skip it, not load garbage.
    torn = (source / checkpoint_name(200)).read_bytes()[:-7]
    s3_env.client().put_object(Bucket=bucket, Key=f"{prefix}/{checkpoint_name(300)}", Body=torn)

    run_dir = tmp_path / "fresh-pod" / "fold1"
    restorer = S3Mirror(bucket, prefix, log=events)
    restored = restorer.restore_latest(run_dir)
    assert restored == run_dir / checkpoint_name(200)
    assert read_checkpoint(restored).sections == {"state": b"200" * 1000}
    assert [p.name for p in run_dir.iterdir()] == [checkpoint_name(200)]  # no temp files left
    skipped = [f for e, f in events.items if e == "s3_restore_skipped"]
    assert len(skipped) == 1 and skipped[0]["key"] == f"{prefix}/{checkpoint_name(300)}"
    # A run dir that already holds a valid checkpoint is left alone.
    assert restorer.restore_latest(run_dir) is None
    assert latest_valid(run_dir).step == 200
    assert S3Mirror(bucket, s3_env.new_prefix()).restore_latest(tmp_path / "other") is None
    restorer.close(timeout=5)


def test_upload_lands_after_the_server_was_down_and_the_caller_never_blocked(s3_env, tmp_path):
    bucket, prefix, events = BUCKET, s3_env.new_prefix(), Events()
    mirror = S3Mirror(
        bucket, prefix, queue_size=2, retries=200, backoff_initial_s=0.1, backoff_max_s=0.5, timeout_s=2.0, log=events
    )
    paths = [write_checkpoint(tmp_path, step, {"w": bytes([step]) * 4000}, keep=5) for step in (1, 2, 3, 4, 5)]
    s3_env.stop()
    try:
        submit_s = []
        for path in paths:
            started = time.perf_counter()
            mirror.submit(path)
            submit_s.append(time.perf_counter() - started)
        deadline = time.monotonic() + 30
        while "s3_upload_retry" not in events.names() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "s3_upload_retry" in events.names()  # it really was failing against a dead server
    finally:
        s3_env.start()
    assert mirror.close(timeout=60)
    assert max(submit_s) < 0.05, submit_s  # a deque append under a lock, whatever the server does
    counts = mirror.counts
    # Nothing could land before the restart, and then at most 3 were left (1 in flight + a queue of 2).
    assert counts["failed"] == 0 and 1 <= counts["uploaded"] <= 3
    assert counts["dropped"] + counts["superseded"] >= 2
    assert counts["uploaded"] + counts["dropped"] + counts["superseded"] == 5
    remote = _remote(s3_env, bucket, prefix)
    assert remote[f"{prefix}/{checkpoint_name(5)}"] == paths[-1].read_bytes()  # the newest always lands
    assert len(remote) <= 2


def test_a_full_queue_drops_the_oldest_pending_upload_and_keeps_the_newest(tmp_path, monkeypatch):
    """A server that accepts connections and never answers pins the one upload in flight."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    events = Events()
    mirror = S3Mirror(
        "bucket-x", "p", endpoint_url=f"http://127.0.0.1:{silent.getsockname()[1]}", queue_size=2,
        timeout_s=30.0, log=events,
    )
    try:
        paths = [write_checkpoint(tmp_path, step, {"a": b"x"}, keep=5) for step in (1, 2, 3, 4, 5)]
        mirror.submit(paths[0])
        deadline = time.monotonic() + 10
        while mirror.queued and time.monotonic() < deadline:  # wait until the upload thread took it
            time.sleep(0.01)
        assert mirror.queued == 0 and mirror.pending == 1
        for path in paths[1:]:
            mirror.submit(path)
        assert mirror.counts["dropped"] == 2 and mirror.queued == 2 and mirror.pending == 3
        dropped = [f["path"] for e, f in events.items if e == "s3_upload_dropped"]
        assert dropped == [str(paths[1]), str(paths[2])]
        assert mirror.close(timeout=0.2) is False  # the silent server never lets it drain
    finally:
        silent.close()


def test_close_gives_up_after_its_timeout_when_the_server_never_comes_back(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    (dead_port,) = _free_ports(1)
    events = Events()
    mirror = S3Mirror(
        "bucket-x", "p", endpoint_url=f"http://127.0.0.1:{dead_port}", retries=1000, backoff_initial_s=0.05,
        backoff_max_s=0.1, timeout_s=1.0, log=events,
    )
    mirror.submit(write_checkpoint(tmp_path, 1, {"a": b"1"}))
    started = time.monotonic()
    assert mirror.close(timeout=0.5) is False
    assert time.monotonic() - started < 2.0
    assert "s3_upload_retry" in events.names()


def test_restore_raises_instead_of_starting_fresh_when_s3_is_unreachable(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    (dead_port,) = _free_ports(1)
    mirror = S3Mirror("bucket-x", "p", endpoint_url=f"http://127.0.0.1:{dead_port}", retries=2,
                      backoff_initial_s=0.01, timeout_s=1.0, log=Events())
    with pytest.raises(RuntimeError, match="S3 list failed after 2 attempts"):
        mirror.restore_latest(tmp_path)
    assert list_checkpoints(tmp_path) == []


def test_mirror_config_is_validated_naming_field_and_value():
    with pytest.raises(ValueError, match="queue_size must be an int >= 1, got 0"):
        S3MirrorConfig("bucket-x", queue_size=0)
    with pytest.raises(ValueError, match="keep must be an int >= 2, got 1"):
        S3MirrorConfig("bucket-x", keep=1)
    with pytest.raises(ValueError, match="bucket must be a valid S3 bucket name, got 'B'"):
        S3MirrorConfig("B")
    with pytest.raises(ValueError, match="endpoint_url must start with http"):
        S3MirrorConfig("bucket-x", endpoint_url="localhost:9000")
    with pytest.raises(ValueError, match="backoff_max_s 0.1 is below backoff_initial_s 1"):
        S3MirrorConfig("bucket-x", backoff_initial_s=1, backoff_max_s=0.1)
    with pytest.raises(ValueError, match="not a checkpoint file name"):
        mirror = S3Mirror("bucket-x", endpoint_url="http://127.0.0.1:1")
        try:
            mirror.submit("model.pt")
        finally:
            mirror.close(timeout=1)
