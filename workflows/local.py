"""Run the rendered WorkflowTemplate's DAG on this machine: no Docker, no cluster.

Each task runs the container's command and args from the rendered template, with `{{...}}`
parameters substituted, `python` replaced by this interpreter, and the PVC mount path mapped to a
local run root. What the cluster would do is honoured with real processes and real exit codes:

- the DAG's `depends`, `withSequence` fan-out, and a `parallelism` bound on concurrent tasks (the chain
  shape's train-fold-0 -> train-fold-1 -> ... runs one fold at a time through its `depends`);
- parameter `enum`s (a shape refuses the fold-mode / folds it was not built for, as Argo does);
- `retryStrategy`: `limit`, `retryPolicy`, `backoff` (duration x factor^n, `cap`, `maxDuration`)
  and `expression`, evaluated by `workflows.expr` exactly as rendered;
- `synchronization.mutexes`: an exclusive file lock per mutex name under <run-root>/.locks, so
  two local runs of the same commit never train the same fold at once;
- `activeDeadlineSeconds` per attempt (SIGTERM, then SIGKILL after the podSpecPatch's
  terminationGracePeriodSeconds) and for the whole workflow;
- optionally a cgroup-v1 memory limit per train attempt (`memory_limit_bytes`), so a real
  kernel OOM kill gives exit 137 and the OOMKilled message, and is retried by the expression.

Every output line of a task is prefixed with its node name, e.g. `train-fold(1) {...}`, and also
kept in <run-root>/logs/<workflow>/<node>.attempt<N>.log (failed attempts keep their logs).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TextIO

from workflows import expr
from workflows.cgroup import MemoryCgroup

__all__ = ["LocalOptions", "Attempt", "NodeResult", "LocalResult", "run_local", "parse_duration_s", "substitute"]

_VAR = re.compile(r"\{\{\s*([A-Za-z0-9_.\-]+)\s*\}\}")


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Thread-count variables a local task gets (torch reads OMP_NUM_THREADS at start-up) unless already set."""


def threads_per_task(parallelism: int, cores: int | None = None) -> int:
    """This machine's cores shared by `parallelism` concurrent tasks, at least 1 each."""
    return max(1, (cores if cores is not None else os.cpu_count() or 1) // parallelism)


@dataclass(frozen=True)
class LocalOptions:
    """How to run the DAG locally."""

    run_root: Path = Path("runs")
    """Local directory standing in for the PVC (every volumeMount of the claim maps here)."""
    parallelism: int = 2
    """Most tasks running at once (fan-out of the fold tasks)."""
    memory_limit_bytes: int | None = None
    """If set, each attempt of the templates in `memory_limited_templates` runs in its own memory cgroup."""
    memory_limited_templates: tuple[str, ...] = ("train-fold", "train-replica")
    """Templates whose attempts get the memory cgroup (the GPU pods, which carry the memory limit): train-fold and
    train-replica (the extra seeds' and the control market's folds)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every task (after the template's own env), e.g. test switches for the trainer."""
    log: TextIO | None = None
    """Where prefixed task output goes; None means sys.stdout."""
    workflow_name: str | None = None
    """Name used for {{workflow.name}} and the log folder; default alpha-rl-local-<random>."""

    def __post_init__(self) -> None:
        if self.parallelism < 1:
            raise ValueError(f"LocalOptions.parallelism must be >= 1, got {self.parallelism!r}")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise ValueError(f"LocalOptions.memory_limit_bytes must be > 0, got {self.memory_limit_bytes!r}")


@dataclass(frozen=True)
class Attempt:
    """One process run of a node."""

    retries: int
    exit_code: int | None
    status: str  # "Succeeded" | "Failed" | "Error"
    message: str
    duration_s: float
    oom_kills: int | None = None
    """The attempt's memory cgroup's kernel `oom_kill` counter after exit; None when it ran without a cgroup."""

    @property
    def oom_killed(self) -> bool:
        """The kernel OOM killer ended a process of this attempt (what a pod reports as OOMKilled)."""
        return bool(self.oom_kills)


@dataclass
class NodeResult:
    name: str
    template: str
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Omitted
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class LocalResult:
    workflow_name: str
    phase: str
    nodes: dict[str, NodeResult]

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    def failed_exit_code(self) -> int | None:
        """Last exit code of the first failed node, if any."""
        for node in self.nodes.values():
            if node.phase == "Failed" and node.attempts:
                return node.attempts[-1].exit_code
        return None


# ---- small helpers -------------------------------------------------------------------------------


def parse_duration_s(text: str | int | float | None) -> float:
    """Argo/Go duration ("30s", "2m", "1h30m", "250ms") or bare seconds -> seconds."""
    if text is None or text == "":
        return 0.0
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h)", s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"bad duration {text!r} (want e.g. 30s, 2m, 1h30m, 250ms)")
    return total


def substitute(value: Any, variables: Mapping[str, str]) -> Any:
    """Replace `{{name}}` in strings (recursively in lists/dicts, keys included); unknown names raise."""
    if isinstance(value, str):

        def repl(m: re.Match) -> str:
            name = m.group(1)
            if name not in variables:
                raise ValueError(f"template variable {{{{{name}}}}} has no value in the local runner")
            return str(variables[name])

        return _VAR.sub(repl, value)
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {substitute(k, variables): substitute(v, variables) for k, v in value.items()}
    return value


def _exit_code(returncode: int) -> int:
    # A process killed by signal N reports -N to Popen; containers report 128 + N (SIGKILL -> 137).
    return 128 - returncode if returncode < 0 else returncode


class _Stop(Exception):
    pass


# ---- the runner ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    name: str
    template: dict
    inputs: dict[str, str]
    deps: tuple[str, ...]


class _Runner:
    def __init__(self, wt: dict, parameters: Mapping[str, str], opts: LocalOptions):
        self.opts = opts
        self.spec = wt["spec"]
        self.template_name = wt["metadata"].get("name", "workflow")
        self.name = opts.workflow_name or f"{self.template_name}-local-{uuid.uuid4().hex[:5]}"
        self.params = self._resolve_parameters(parameters)
        self.templates = {t["name"]: t for t in self.spec["templates"]}
        self.run_root = Path(opts.run_root).resolve()
        self.mounts = self._claim_mount_paths()
        self.log = opts.log or sys.stdout
        self.log_lock = threading.Lock()
        self.log_dir = self.run_root / "logs" / self.name
        self.stop = threading.Event()
        self.procs: set[subprocess.Popen] = set()
        self.procs_lock = threading.Lock()
        deadline = self.spec.get("activeDeadlineSeconds")
        self.deadline = time.monotonic() + float(deadline) if deadline else None

    # -- inputs

    def _resolve_parameters(self, given: Mapping[str, str]) -> dict[str, str]:
        declared = {p["name"]: p.get("value") for p in self.spec.get("arguments", {}).get("parameters", [])}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise ValueError(f"unknown workflow parameter(s) {unknown}; the template declares {sorted(declared)}")
        merged = {**declared, **{k: str(v) for k, v in given.items()}}
        missing = sorted(k for k, v in merged.items() if v is None)
        if missing:
            raise ValueError(f"required workflow parameter(s) {missing} not given")
        # Argo refuses a Workflow whose parameter is outside the template's enum (e.g. fold-mode=chain against the
        # parallel independent shape, whose folds 1+ would exit 2): refuse it here too, before anything runs.
        for p in self.spec.get("arguments", {}).get("parameters", []):
            if "enum" in p and merged[p["name"]] not in [str(v) for v in p["enum"]]:
                raise ValueError(f"workflow parameter {p['name']}={merged[p['name']]!r} is not one of {p['enum']} "
                                 f"allowed by WorkflowTemplate {self.template_name!r}")
        return merged

    def _claim_mount_paths(self) -> dict[str, Path]:
        """volume name -> local dir, for every volume backed by a PVC (all map to the run root)."""
        claims = {v["name"] for v in self.spec.get("volumes", []) if "persistentVolumeClaim" in v}
        paths: dict[str, Path] = {}
        for t in self.spec["templates"]:
            for vm in t.get("container", {}).get("volumeMounts", []):
                if vm["name"] in claims:
                    paths[vm["mountPath"].rstrip("/")] = self.run_root
        return paths

    def _map_paths(self, s: str) -> str:
        for mount, local in self.mounts.items():
            if s == mount or s.startswith(mount + "/"):
                return str(local) + s[len(mount):]
        return s

    # -- DAG expansion

    def expand(self) -> list[_Node]:
        entry = self.templates[self.spec["entrypoint"]]
        if "dag" not in entry:
            raise ValueError(f"entrypoint template {entry['name']!r} is not a DAG")
        wf_vars = {f"workflow.parameters.{k}": v for k, v in self.params.items()} | {"workflow.name": self.name}
        groups: dict[str, list[str]] = {}
        nodes: list[_Node] = []
        for task in entry["dag"]["tasks"]:
            deps = self._task_deps(task)
            for d in deps:
                if d not in groups:
                    raise ValueError(f"task {task['name']!r} depends on {d!r}, which is not defined before it")
            dep_nodes = tuple(n for d in deps for n in groups[d])
            items: list[str | None] = [None]
            if "withSequence" in task:
                seq = substitute(task["withSequence"], wf_vars)
                if "count" in seq:
                    count = int(seq["count"])
                    if count < 1:
                        raise ValueError(f"task {task['name']!r}: withSequence count {count} < 1")
                    start = int(seq.get("start", 0))
                    items = [str(i) for i in range(start, start + count)]
                else:
                    items = [str(i) for i in range(int(seq.get("start", 0)), int(seq["end"]) + 1)]
            groups[task["name"]] = []
            for item in items:
                local = dict(wf_vars) | ({"item": item} if item is not None else {})
                task_params = task.get("arguments", {}).get("parameters", [])
                args = {p["name"]: substitute(p.get("value", ""), local) for p in task_params}
                node_name = task["name"] if item is None else f"{task['name']}({item})"
                nodes.append(_Node(node_name, self.templates[task["template"]], args, dep_nodes))
                groups[task["name"]].append(node_name)
        return nodes

    @staticmethod
    def _task_deps(task: dict) -> list[str]:
        if "dependencies" in task:
            return list(task["dependencies"])
        depends = task.get("depends", "").strip()
        if not depends:
            return []
        names = []
        for part in depends.split("&&"):
            part = part.strip()
            name = part.removesuffix(".Succeeded")
            if not re.fullmatch(r"[A-Za-z0-9\-]+", name):
                raise ValueError(f"depends {depends!r}: only 'a && b(.Succeeded)' is supported locally")
            names.append(name)
        return names

    # -- one node

    def _variables(self, node: _Node, retries: int) -> dict[str, str]:
        declared = [p["name"] for p in node.template.get("inputs", {}).get("parameters", [])]
        missing = [p for p in declared if p not in node.inputs]
        if missing:
            raise ValueError(f"node {node.name!r}: input parameter(s) {missing} not given")
        return (
            {f"workflow.parameters.{k}": v for k, v in self.params.items()}
            | {"workflow.name": self.name, "retries": str(retries)}
            | {f"inputs.parameters.{k}": v for k, v in node.inputs.items()}
        )

    def _emit(self, prefix: str, line: str) -> None:
        with self.log_lock:
            self.log.write(f"{prefix} {line.rstrip(chr(10))}\n")
            self.log.flush()

    def run_node(self, node: _Node, result: NodeResult) -> None:
        tpl = node.template
        variables0 = self._variables(node, 0)
        mutexes = sorted(m["name"] for m in tpl.get("synchronization", {}).get("mutexes", []))
        lock_files = []
        try:
            for name in substitute(mutexes, variables0):
                lock_dir = self.run_root / ".locks"
                lock_dir.mkdir(parents=True, exist_ok=True)
                fh = open(lock_dir / f"{name}.lock", "a+")
                self._acquire(fh, node.name, name)
                lock_files.append(fh)
            self._attempts(node, result)
        finally:
            for fh in lock_files:
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()

    def _acquire(self, fh, node_name: str, mutex: str) -> None:
        waiting = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if not waiting:
                    self._emit(node_name, f"waiting for mutex {mutex} (held by another run of this commit)")
                    waiting = True
                if self.stop.is_set():
                    fh.close()
                    raise _Stop() from None
                time.sleep(0.05)

    def _attempts(self, node: _Node, result: NodeResult) -> None:
        tpl = node.template
        rs = tpl.get("retryStrategy")
        limit = int(rs.get("limit", 0)) if rs else 0
        first_start = time.monotonic()
        retries = 0
        while True:
            if self.stop.is_set():
                raise _Stop()
            attempt = self._run_once(node, retries)
            result.attempts.append(attempt)
            self._emit(
                node.name,
                json.dumps({"event": "local-attempt-end", "node": node.name, "retries": retries,
                            "exit_code": attempt.exit_code, "status": attempt.status, "message": attempt.message,
                            "duration_s": round(attempt.duration_s, 3), "oom_kills": attempt.oom_kills}),
            )  # fmt: skip
            if attempt.status == "Succeeded":
                result.phase = "Succeeded"
                return
            wait_s = self._retry_wait_s(rs, attempt, retries, limit, time.monotonic() - first_start)
            if wait_s is None:
                result.phase = "Failed"
                return
            if self.stop.is_set():
                raise _Stop()
            self._emit(node.name, f"retrying in {wait_s:.2f}s (attempt {retries + 1} of at most {limit})")
            if self.stop.wait(wait_s):
                raise _Stop()
            retries += 1

    @staticmethod
    def _retry_wait_s(rs: dict | None, attempt: Attempt, retries: int, limit: int, elapsed_s: float) -> float | None:
        """Seconds to wait before the next attempt, or None when Argo would not retry."""
        if not rs or retries >= limit:
            return None
        policy = rs.get("retryPolicy", "OnFailure")
        allowed = {
            "Always": attempt.status in ("Failed", "Error"),
            "OnFailure": attempt.status == "Failed",
            "OnError": attempt.status == "Error",
            "OnTransientError": attempt.status == "Error",
        }
        if policy not in allowed:
            raise ValueError(f"retryPolicy {policy!r} is not supported locally")
        if not allowed[policy]:
            return None
        if "expression" in rs:
            env = expr.retry_env(attempt.exit_code, attempt.status, attempt.message, attempt.duration_s)
            if expr.evaluate(rs["expression"], env) is not True:
                return None
        backoff = rs.get("backoff") or {}
        wait_s = parse_duration_s(backoff.get("duration")) * float(backoff.get("factor", 1)) ** retries
        if "cap" in backoff:
            wait_s = min(wait_s, parse_duration_s(backoff["cap"]))
        if "maxDuration" in backoff and elapsed_s + wait_s > parse_duration_s(backoff["maxDuration"]):
            return None
        return wait_s

    def _run_once(self, node: _Node, retries: int) -> Attempt:
        tpl = node.template
        c = tpl["container"]
        variables = self._variables(node, retries)
        cmd = [self._map_paths(a) for a in substitute(list(c.get("command", [])) + list(c.get("args", [])), variables)]
        if not cmd:
            raise ValueError(f"template {tpl['name']!r} has no command (image entrypoints cannot run locally)")
        if cmd[0] in ("python", "python3"):
            cmd[0] = sys.executable
        env = dict(os.environ)
        for e in c.get("env", []):
            env[e["name"]] = self._map_paths(substitute(e.get("value", ""), variables))
        env.update(self.opts.env)
        # A pod has CPUs of its own; local tasks share this machine's. Without a bound every trainer starts torch with
        # a thread per core and `parallelism` of them oversubscribe the cores (on 2 cores, 3 smoke folds ran at a
        # fifth of their one-thread speed). An explicit setting in the environment or --env wins.
        for name in THREAD_VARIABLES:
            env.setdefault(name, str(threads_per_task(self.opts.parallelism)))
        grace_s = float(json.loads(tpl.get("podSpecPatch", "{}")).get("terminationGracePeriodSeconds", 30))
        deadline_s = float(tpl["activeDeadlineSeconds"]) if "activeDeadlineSeconds" in tpl else None

        cgroup = None
        if self.opts.memory_limit_bytes is not None and tpl["name"] in self.opts.memory_limited_templates:
            cgroup = MemoryCgroup(self.opts.memory_limit_bytes, tag=f"{node.name}-{retries}")
            cmd = cgroup.wrap(cmd)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.\-]", "_", node.name)
        log_path = self.log_dir / f"{safe}.attempt{retries}.log"
        self._emit(node.name, f"attempt {retries}: {shlex.join(cmd)}")  # shell-quoted: copy, paste, rerun
        start = time.monotonic()
        try:
            with open(log_path, "w") as log_file:
                proc = subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                    start_new_session=True,  # own process group: a deadline kill reaches its children too
                )  # fmt: skip
                with self.procs_lock:
                    self.procs.add(proc)
                reader = threading.Thread(target=self._pump, args=(proc, node.name, log_file), daemon=True)
                reader.start()
                reason = self._wait(proc, deadline_s, grace_s)
                reader.join()
                with self.procs_lock:
                    self.procs.discard(proc)
            code = _exit_code(proc.returncode)
            oom_kills = None if cgroup is None else cgroup.oom_kills()
        finally:
            if cgroup is not None:
                cgroup.remove()
        duration = time.monotonic() - start
        if code == 0 and reason is None:
            return Attempt(retries, 0, "Succeeded", "", duration, oom_kills=oom_kills)
        if oom_kills:
            message = f"OOMKilled (exit code {code})"
            return Attempt(retries, code, "Failed", message, duration, oom_kills=oom_kills)
        if reason == "deadline":
            message = "Pod was active on the node longer than the specified deadline"
            return Attempt(retries, code, "Failed", message, duration, oom_kills=oom_kills)
        if reason == "stopped":
            return Attempt(retries, code, "Error", "pod deleted", duration, oom_kills=oom_kills)
        return Attempt(retries, code, "Failed", f"Error (exit code {code})", duration, oom_kills=oom_kills)

    def _pump(self, proc: subprocess.Popen, prefix: str, log_file: TextIO) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            self._emit(prefix, line)
        log_file.flush()

    def _wait(self, proc: subprocess.Popen, deadline_s: float | None, grace_s: float) -> str | None:
        """Wait for exit; on the attempt or workflow deadline, or a stop, SIGTERM then SIGKILL after grace."""
        start = time.monotonic()
        while proc.poll() is None:
            reason = None
            if deadline_s is not None and time.monotonic() - start > deadline_s:
                reason = "deadline"
            elif self.deadline is not None and time.monotonic() > self.deadline:
                reason = "deadline"
            elif self.stop.is_set():
                reason = "stopped"
            if reason is not None:
                self._terminate(proc, grace_s)
                return reason
            time.sleep(0.05)
        return None

    @staticmethod
    def _terminate(proc: subprocess.Popen, grace_s: float) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()

    # -- the DAG

    def run(self) -> LocalResult:
        nodes = self.expand()
        results = {n.name: NodeResult(n.name, n.template["name"]) for n in nodes}
        pending = list(nodes)
        running: dict[Future, _Node] = {}
        with ThreadPoolExecutor(max_workers=self.opts.parallelism) as pool:
            try:
                self._schedule(pool, pending, running, results)
            except KeyboardInterrupt:
                # Ctrl-C / SIGTERM of the runner: workers see `stop`, SIGTERM their process groups and
                # wait out the grace period (trainers checkpoint), before the pool's exit returns.
                self._emit(self.name, "interrupted: stopping running tasks")
                self.stop.set()
                pool.shutdown(wait=True)
                raise
        for n in pending:
            results[n.name].phase = "Omitted"
        phase = "Succeeded" if all(r.phase == "Succeeded" for r in results.values()) else "Failed"
        self._emit(self.name, json.dumps({"event": "workflow-end", "workflow": self.name, "phase": phase}))
        return LocalResult(self.name, phase, results)

    def _schedule(self, pool: ThreadPoolExecutor, pending: list[_Node], running: dict[Future, _Node],
                  results: dict[str, NodeResult]) -> None:  # fmt: skip
        failed = False
        while pending or running:
            if self.deadline is not None and time.monotonic() > self.deadline and not self.stop.is_set():
                self._emit(self.name, "workflow activeDeadlineSeconds exceeded: stopping")
                self.stop.set()
                failed = True
            # Fail fast like an Argo DAG: after a failure start nothing new, let running tasks end.
            ready = [] if (failed or self.stop.is_set()) else [
                n for n in pending if all(results[d].phase == "Succeeded" for d in n.deps)
            ]  # fmt: skip
            for n in ready[: self.opts.parallelism - len(running)]:
                pending.remove(n)
                results[n.name].phase = "Running"
                running[pool.submit(self.run_node, n, results[n.name])] = n
            if not running:
                break
            done, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
            for fut in done:
                n = running.pop(fut)
                try:
                    fut.result()
                except _Stop:
                    results[n.name].phase = "Failed"
                if results[n.name].phase != "Succeeded":
                    failed = True


def run_local(wt: dict, parameters: Mapping[str, str], opts: LocalOptions = LocalOptions()) -> LocalResult:
    """Run WorkflowTemplate dict `wt` (as rendered) with workflow `parameters`; returns every node's attempts."""
    return _Runner(wt, parameters, opts).run()
