"""cgroup-v1 memory limits for local tasks, so a real kernel OOM kill happens as it would in a pod.

Kubernetes enforces a container's memory limit with a memory cgroup; when the container goes
past it the kernel's OOM killer SIGKILLs it and the pod reports exit 137 / OOMKilled. Locally we
do the same: one child memory cgroup per attempt, the command joined to it by a tiny wrapper
(`python -m workflows.cgroup PROCS_FILE -- CMD...` writes its own pid to PROCS_FILE, then execs
CMD, so CMD and all its children are charged to the group from their first byte), and the
group's `memory.oom_control` `oom_kill` counter read after exit to tell an OOM kill from any
other SIGKILL.
"""
from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

__all__ = ["MEMORY_ROOT", "memory_cgroup_parent", "MemoryCgroup", "main"]

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


def memory_cgroup_parent() -> Path | None:
    """This process's own v1 memory cgroup directory, if it exists and we may create children in it."""
    if not (MEMORY_ROOT / "cgroup.procs").exists():
        return None
    rel = ""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                rel = path.lstrip("/")
    except OSError:
        return None
    parent = MEMORY_ROOT / rel
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return None
    return parent


class MemoryCgroup:
    """A child memory cgroup with a hard limit; use as a context manager (removed on exit)."""

    def __init__(self, limit_bytes: int, tag: str = "task", parent: Path | None = None):
        if limit_bytes <= 0:
            raise ValueError(f"memory limit must be > 0 bytes, got {limit_bytes!r}")
        parent = parent or memory_cgroup_parent()
        if parent is None:
            raise RuntimeError(f"no writable cgroup-v1 memory hierarchy under {MEMORY_ROOT}")
        safe_tag = "".join(c if c.isalnum() or c in "-_" else "-" for c in tag)[:40]
        self.path = parent / f"alpha-rl-{safe_tag}-{uuid.uuid4().hex[:8]}"
        self.limit_bytes = limit_bytes
        self.path.mkdir()
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            # With swap the limit only bounds RAM and the task would page instead of being killed;
            # memsw (RAM + swap) exists only where swap accounting is on.
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(limit_bytes))
        except OSError:
            self.path.rmdir()
            raise

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` prefixed by the wrapper that joins this cgroup and then execs `cmd`."""
        return [sys.executable, "-m", "workflows.cgroup", str(self.procs_file), "--", *cmd]

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this group (memory.oom_control `oom_kill`)."""
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        # Kernels before 4.13 lack the counter; failcnt > 0 then means the limit was hit.
        return int((self.path / "memory.failcnt").read_text())

    def remove(self, timeout_s: float = 5.0) -> None:
        """rmdir the group; waits for exiting processes to leave it (EBUSY until they have)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m workflows.cgroup CGROUP_PROCS_FILE -- CMD [ARGS...]", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(str(os.getpid()))
    os.execvp(argv[2], argv[2:])
    return 1  # unreachable: execvp replaces the process or raises


if __name__ == "__main__":
    raise SystemExit(main())
