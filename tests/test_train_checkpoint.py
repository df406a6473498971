"""Crash recovery of `python -m trainer.train`, with real processes.

Every scenario interrupts a real trainer process (SIGKILL at chosen and at arbitrary moments, a kernel OOM kill
in a memory cgroup, SIGTERM, SIGINT, damaged checkpoints, checkpoints only in S3), restarts it with the same
command, and requires the finished fold to be bit-identical to one uninterrupted run with the same arguments:
the same `weights_sha256`, the same result.json apart from the wall-clock fields, the same equity curve and the
same final checkpoint state (every tensor byte, the RNG states, the counters).

The trainer runs single-threaded (OMP/MKL_NUM_THREADS=1): with two intra-op threads on a loaded 2-core box one
early trial of a resumed run differed from its uninterrupted twin by ~1e-8 in the weights (thread-count-dependent
float reduction order), which no checkpoint can capture; see docs/checkpoints.md, "Resume".
"""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.hooks.alpha_rl_test_hooks import CUDA_OOM_AT_UPDATE, HOOKS_DIR, OOM_AT_STEP
from tests.s3server import BUCKET, seaweed_s3, s3_env  # noqa: F401  (pytest finds fixtures by name)
from trainer.checkpoint.format import read_checkpoint
from trainer.checkpoint.store import list_checkpoints
from trainer.checkpoint.tensors import decode_json, decode_tensors

ROOT = Path(__file__).resolve().parents[1]
DATA = "synthetic:seed=3,days=2,signal=2"
N_STEPS = 80
CHECKPOINT_EVERY = 20
LOG_EVERY = 5
WALL_CLOCK_FIELDS = {"wall_seconds", "checkpoint_seconds"}
"""result.json fields allowed to differ between an interrupted and an uninterrupted run (they time the run)."""
PROCESS_TIMEOUT_S = 300.0
"""A trainer process still running after this long is killed and the test fails (a hang, not a slow box)."""
KILL_RNG_SEED = 20_261_202
"""Fixed seed for every randomly chosen kill point, corruption offset and delay: failures reproduce."""


# ──────────────────────────────────────────────────────────────────────── running real trainer processes


def train_cmd(run_dir: Path, fxcache: Path, *extra: str, attempt: int = 0) -> list[str]:
    """The smoke preset shrunk to ~2 s of training: 16 envs, 80 steps, learning from step 32, deterministic."""
    return [sys.executable, "-m", "trainer.train", "--run-dir", str(run_dir), "--fold", "0", "--folds", "3",
            "--data", DATA, "--fxcache", str(fxcache), "--n-envs", "16", "--batch-size", "32",
            "--per-capacity", "2048", "--n-steps", str(N_STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY),
            "--log-every", str(LOG_EVERY), "--deterministic", "--attempt", str(attempt), *extra]


def trainer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHA_RL_TEST_")}
    env = {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return {**env, **extra}


def hooked_env(**faults: str) -> dict[str, str]:
    """trainer_env with the test-only fault hooks (tests/hooks) armed by `faults` (their variables)."""
    return trainer_env(PYTHONPATH=str(HOOKS_DIR), **faults)


@dataclass
class Attempt:
    """One finished trainer process: exit status (negative = killed by that signal), JSON events, stderr."""

    rc: int
    events: list[dict] = field(default_factory=list)
    stderr: str = ""
    seconds: float = 0.0
    first_step_ready_s: float | None = None
    """Seconds from process start (Popen) to the `first_step_ready` line: the restart cost a workflow sees."""

    def named(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]

    def one(self, name: str) -> dict:
        found = self.named(name)
        assert len(found) == 1, f"expected one {name!r} event, got {len(found)}: {found}\nstderr:\n{self.stderr}"
        return found[0]


def run_trainer(cmd: list[str], env: dict[str, str] | None = None, stop_when=None, sig: int = signal.SIGKILL,
                stop_after_s: float | None = None) -> Attempt:
    """Run `cmd`, reading its JSON log as it is written.

    `stop_when(event) -> bool`: send `sig` as soon as an event satisfies it (the process is mid-run: the kill lands
    within a step or two of that event). `stop_after_s`: send `sig` this many seconds after `first_step_ready`
    (an arbitrary moment: mid-step, mid-checkpoint-write, mid-evaluation). Reads to EOF either way.
    """
    started = time.monotonic()
    err = io.BytesIO()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env or trainer_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    drain = threading.Thread(target=lambda: err.write(proc.stderr.buffer.read()), daemon=True)
    drain.start()
    watchdog = threading.Timer(PROCESS_TIMEOUT_S, proc.kill)
    watchdog.start()
    timer: threading.Timer | None = None
    attempt = Attempt(rc=0)
    sent = False
    try:
        for line in proc.stdout:
            event = json.loads(line)  # every stdout line is one JSON object (the log contract)
            attempt.events.append(event)
            if event["event"] == "first_step_ready":
                attempt.first_step_ready_s = time.monotonic() - started
                if stop_after_s is not None:
                    timer = threading.Timer(stop_after_s, proc.send_signal, args=(sig,))
                    timer.start()
            if stop_when is not None and not sent and stop_when(event):
                proc.send_signal(sig)
                sent = True
        attempt.rc = proc.wait()
    finally:
        watchdog.cancel()
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        drain.join(timeout=10)
    attempt.stderr = err.getvalue().decode(errors="replace")
    attempt.seconds = time.monotonic() - started
    assert time.monotonic() - started < PROCESS_TIMEOUT_S, f"trainer hung: {cmd}"
    return attempt


def fold_dir(run_dir: Path) -> Path:
    return run_dir / "fold0"


def newest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(fold_dir(run_dir))
    return found[-1] if found else None


def assert_resumed_from(attempt: Attempt, expected: tuple[int, Path] | None, attempt_no: int) -> None:
    """The restart logs which checkpoint it resumed from (or that it started fresh) and its attempt number."""
    if expected is None:
        fresh = attempt.one("fresh")
        assert fresh["attempt"] == attempt_no and fresh["env_step"] == 0
        return
    resume = attempt.one("resume")
    assert resume["checkpoint"] == str(expected[1]), resume
    assert resume["env_step"] == expected[0] and resume["attempt"] == attempt_no, resume


# ──────────────────────────────────────────────────────────────────────── comparing finished folds


def final_state(run_dir: Path) -> dict[str, bytes]:
    """Every tensor of the final checkpoint as raw bytes (NaN-safe), plus the RNG section; wall time left out."""
    step, path = newest_checkpoint(run_dir)
    assert step == N_STEPS
    ckpt = read_checkpoint(path)
    assert decode_json(ckpt.sections["meta"])["final"] is True
    state = {"rng": ckpt.sections["rng"]}
    for name, data in ckpt.sections.items():
        if name.startswith("state/"):
            for key, tensor in decode_tensors(data).items():
                if f"{name}.{key}" != "state/loop.wall_seconds":
                    state[f"{name}.{key}"] = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return state


def assert_same_outcome(run_dir: Path, baseline: Path) -> None:
    """Interrupted-and-resumed `run_dir` ended exactly as the uninterrupted `baseline` did."""
    got = json.loads((fold_dir(run_dir) / "result.json").read_text())
    want = json.loads((fold_dir(baseline) / "result.json").read_text())
    assert got["weights_sha256"] == want["weights_sha256"]
    differing = {k for k in got.keys() | want.keys() if got.get(k) != want.get(k)} - WALL_CLOCK_FIELDS
    assert not differing, {k: (got.get(k), want.get(k)) for k in sorted(differing)}
    assert got["env_steps"] == N_STEPS
    assert np.array_equal(np.load(fold_dir(run_dir) / "equity.npy"), np.load(fold_dir(baseline) / "equity.npy"))
    got_state, want_state = final_state(run_dir), final_state(baseline)
    assert got_state.keys() == want_state.keys()
    assert [k for k in want_state if got_state[k] != want_state[k]] == []
    leftovers = [p.name for p in fold_dir(run_dir).iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temp files left behind: {leftovers}"


# ──────────────────────────────────────────────────────────────────────── fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train-checkpoint")


@pytest.fixture(scope="module")
def fxcache(workdir) -> Path:
    return workdir / "fxcache"


@pytest.fixture(scope="module")
def baseline(workdir, fxcache) -> tuple[Path, Attempt]:
    """One uninterrupted run: the reference every interrupted run must reproduce bit for bit."""
    run_dir = workdir / "baseline"
    done = run_trainer(train_cmd(run_dir, fxcache))
    assert done.rc == 0, done.stderr
    result = json.loads((fold_dir(run_dir) / "result.json").read_text())
    assert result["env_steps"] == N_STEPS and result["update_steps"] > 0  # learning happened
    assert [e["env_step"] for e in done.named("checkpoint")] == list(range(CHECKPOINT_EVERY, N_STEPS + 1,
                                                                          CHECKPOINT_EVERY))
    return run_dir, done


def training_seconds(attempt: Attempt) -> float:
    """Wall time from first_step_ready to the final checkpoint, from the events' timestamps."""
    ready = attempt.one("first_step_ready")["ts"]
    final = [e for e in attempt.named("checkpoint") if e["final"]][-1]["ts"]
    return final - ready


# ──────────────────────────────────────────────────────────────────────── 1. SIGKILL at random points


def _kill_plans():
    """Each trial: a list of kill rules, applied to successive attempts; the attempt after the last one finishes.

    Chosen once from a fixed RNG. A rule is ("checkpoint", n): right after the n-th checkpoint event;
    ("step", s): right after the step event at env_step s; ("final", None): right after the final checkpoint,
    before result.json; ("time", fraction): at fraction x (baseline training time) after first_step_ready.
    """
    rng = random.Random(KILL_RNG_SEED)
    steps = list(range(LOG_EVERY, N_STEPS, LOG_EVERY))
    first = rng.choice(steps[: len(steps) // 2])
    return {
        "after-checkpoint": [("checkpoint", rng.randrange(1, N_STEPS // CHECKPOINT_EVERY))],
        "twice-after-steps": [("step", first), ("step", rng.choice([s for s in steps if s > first + LOG_EVERY]))],
        "after-final-checkpoint": [("final", None)],
        "arbitrary-times": [("time", rng.uniform(0.05, 0.8)), ("time", rng.uniform(0.05, 0.8))],
    }


KILL_PLANS = _kill_plans()


def _stop_rule(kind: str, value):
    if kind == "checkpoint":
        counter = iter(range(1, 10**6))
        return lambda e: e["event"] == "checkpoint" and not e["final"] and next(counter) == value
    if kind == "step":
        return lambda e: e["event"] == "step" and e["env_step"] == value
    if kind == "final":
        return lambda e: e["event"] == "checkpoint" and e["final"]
    return None


@pytest.mark.slow
@pytest.mark.parametrize("plan", list(KILL_PLANS), ids=list(KILL_PLANS))
def test_sigkill_then_restart_with_same_command_matches_uninterrupted_run(plan, workdir, fxcache, baseline):
    baseline_dir, baseline_run = baseline
    run_dir = workdir / f"sigkill-{plan}"
    before: tuple[int, Path] | None = None
    for attempt_no, (kind, value) in enumerate(KILL_PLANS[plan]):
        delay = value * training_seconds(baseline_run) if kind == "time" else None
        killed = run_trainer(train_cmd(run_dir, fxcache, attempt=attempt_no), stop_when=_stop_rule(kind, value),
                             stop_after_s=delay)
        assert killed.rc == -signal.SIGKILL, f"attempt {attempt_no} was not killed (rc {killed.rc}): {plan}"
        assert not (fold_dir(run_dir) / "result.json").exists()
        assert_resumed_from(killed, before, attempt_no)
        before = newest_checkpoint(run_dir)
        if kind == "final":
            assert before[0] == N_STEPS
    done = run_trainer(train_cmd(run_dir, fxcache, attempt=len(KILL_PLANS[plan])))
    assert done.rc == 0, done.stderr
    assert_resumed_from(done, before, len(KILL_PLANS[plan]))
    assert_same_outcome(run_dir, baseline_dir)


# ──────────────────────────────────────────────────────────────────────── 2. a real kernel OOM kill


def _memory_cgroup_parent():
    from workflows.cgroup import memory_cgroup_parent

    return memory_cgroup_parent()


@pytest.mark.slow
def test_oom_kill_in_memory_cgroup_then_same_command_resumes_identically(workdir, fxcache, baseline):
    from workflows.cgroup import MemoryCgroup

    if _memory_cgroup_parent() is None:
        pytest.skip("no writable cgroup-v1 memory hierarchy (/sys/fs/cgroup/memory): cannot OOM-kill for real")
    baseline_dir, _ = baseline
    run_dir = workdir / "oom"
    # The trainer peaks near 0.5 GB here; 1 GiB leaves room for a normal run and makes the hook's 64 MiB
    # allocations hit the limit within a second.
    limit = 1 << 30
    cmd = train_cmd(run_dir, fxcache)
    env = hooked_env(**{OOM_AT_STEP: "30"})
    with MemoryCgroup(limit, tag="oom-test") as group:
        assert group.oom_kills() == 0
        killed = run_trainer(group.wrap(cmd), env=env)
        oom_kills = group.oom_kills()
    assert killed.rc == -signal.SIGKILL, f"expected an OOM SIGKILL (shell exit 137), got {killed.rc}"
    assert oom_kills >= 1, "the kernel's oom_kill counter did not move: the kill was not an OOM kill"
    assert killed.one("test_oom_hook")["env_step"] == 40  # the first checkpoint at or after step 30
    assert newest_checkpoint(run_dir)[0] == 40
    # The workflow retries with the very same environment (hook armed), as attempt 1: it must not fire again.
    with MemoryCgroup(limit, tag="oom-retry") as group:
        done = run_trainer(group.wrap(train_cmd(run_dir, fxcache, attempt=1)), env=env)
        assert group.oom_kills() == 0
    assert done.rc == 0, done.stderr
    assert done.named("test_oom_hook") == []
    assert_resumed_from(done, (40, fold_dir(run_dir) / "checkpoint-000000000040.bin"), 1)
    assert_same_outcome(run_dir, baseline_dir)


def test_production_trainer_has_no_fault_hook_flag_or_code(workdir, fxcache):
    """The OOM test hook lives in tests/hooks only: the trainer refuses the old flag as a usage error (exit 2,
    nothing written), and no module under trainer/ or workflows/ names the hooks or their variables."""
    bad = run_trainer(train_cmd(workdir / "oom-flag", fxcache, "--test-oom-at-step", "30"))
    assert bad.rc == 2 and "--test-oom-at-step" in bad.stderr
    assert not (workdir / "oom-flag").exists()
    named = [str(p.relative_to(ROOT)) for d in ("trainer", "workflows") for p in (ROOT / d).rglob("*.py")
             if "ALPHA_RL_TEST_" in p.read_text() or "alpha_rl_test_hooks" in p.read_text()]
    assert named == []


# ──────────────────────────────────────────────────────────────────────── 2b. CUDA out of memory (an exception)


CUDA_OOM_UPDATE = 15
"""Learning starts at env step 32 (smoke preset), so the 15th gradient step runs at env step 46: between the
checkpoints at 40 and 60."""


def test_cuda_oom_exits_retryable_without_checkpointing_the_broken_state_and_resume_matches(workdir, fxcache,
                                                                                           baseline):
    """torch.cuda.OutOfMemoryError raised inside a real training step (test hook; this runs on the CPU) ends the
    process with one `cuda_oom` JSON line and exit 75, which the workflow retries; no checkpoint is written from
    the interrupted step's state, and the retry resumes from the last periodic checkpoint to the uninterrupted
    result."""
    baseline_dir, _ = baseline
    run_dir = workdir / "cuda-oom"
    env = hooked_env(**{CUDA_OOM_AT_UPDATE: str(CUDA_OOM_UPDATE)})
    failed = run_trainer(train_cmd(run_dir, fxcache), env=env)
    assert failed.rc == 75, failed.stderr
    oom = failed.one("cuda_oom")
    assert oom["fold"] == 0 and oom["exit_code"] == 75 and "CUDA out of memory" in oom["detail"]
    assert [e["env_step"] for e in failed.named("checkpoint")] == [20, 40]
    assert [step for step, _ in list_checkpoints(fold_dir(run_dir))] == [20, 40]  # nothing from step 46
    assert failed.named("result") == [] and not (fold_dir(run_dir) / "result.json").exists()
    done = run_trainer(train_cmd(run_dir, fxcache, attempt=1), env=env)  # the retry: same environment
    assert done.rc == 0, done.stderr
    assert_resumed_from(done, (40, fold_dir(run_dir) / "checkpoint-000000000040.bin"), 1)
    assert_same_outcome(run_dir, baseline_dir)


# ──────────────────────────────────────────────────────────────────────── 3. SIGTERM / SIGINT


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_writes_checkpoint_exits_143_and_resume_matches(sig, workdir, fxcache, baseline):
    baseline_dir, _ = baseline
    run_dir = workdir / f"signal-{sig.name}"
    at = 45 if sig == signal.SIGTERM else 65  # between checkpoints: the stop writes its own
    stopped = run_trainer(train_cmd(run_dir, fxcache), sig=sig,
                          stop_when=lambda e: e["event"] == "step" and e["env_step"] == at)
    assert stopped.rc == 143, stopped.stderr
    stop = stopped.one("stopped")
    assert f"signal {int(sig)}" in stop["reason"]
    step = stop["env_step"]
    assert at <= step < N_STEPS
    assert stopped.named("checkpoint")[-1]["env_step"] == step  # written after the signal, before exit
    assert newest_checkpoint(run_dir) == (step, fold_dir(run_dir) / f"checkpoint-{step:012d}.bin")
    done = run_trainer(train_cmd(run_dir, fxcache, attempt=1))
    assert done.rc == 0, done.stderr
    assert_resumed_from(done, (step, fold_dir(run_dir) / f"checkpoint-{step:012d}.bin"), 1)
    assert_same_outcome(run_dir, baseline_dir)


# ──────────────────────────────────────────────────────────────────────── 4. damaged checkpoints


@pytest.fixture(scope="module")
def interrupted(workdir, fxcache) -> Path:
    """A run SIGKILLed after its checkpoint at step 50, written every 10 steps with the newest 3 kept."""
    run_dir = workdir / "interrupted"
    killed = run_trainer(train_cmd(run_dir, fxcache, "--checkpoint-every", "10", "--keep-checkpoints", "3"),
                         stop_when=lambda e: e["event"] == "checkpoint" and e["env_step"] == 50)
    assert killed.rc == -signal.SIGKILL
    assert len(list_checkpoints(fold_dir(run_dir))) == 3
    return run_dir


def _flip_bit(path: Path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def _truncate(path: Path, length: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(length)


@pytest.mark.slow
def test_damaged_newest_checkpoints_are_skipped_and_run_still_ends_identical(workdir, fxcache, baseline,
                                                                             interrupted):
    baseline_dir, _ = baseline
    run_dir = workdir / "damaged"
    shutil.copytree(interrupted, run_dir)
    (oldest, oldest_path), (_, middle), (_, newest) = list_checkpoints(fold_dir(run_dir))
    rng = random.Random(KILL_RNG_SEED + 4)
    _flip_bit(newest, rng.randrange(newest.stat().st_size), rng.randrange(8))
    _truncate(middle, rng.randrange(middle.stat().st_size))
    done = run_trainer(train_cmd(run_dir, fxcache, "--checkpoint-every", "10", "--keep-checkpoints", "3",
                                 attempt=1))
    assert done.rc == 0, done.stderr
    skipped = done.named("checkpoint_skipped")
    assert [e["path"] for e in skipped] == [str(newest), str(middle)]
    assert all(e["reason"].startswith("corrupt at byte ") for e in skipped), skipped
    assert_resumed_from(done, (oldest, oldest_path), 1)
    # Checkpointing every 10 steps instead of every 20 must not change what the run computes either.
    assert_same_outcome(run_dir, baseline_dir)


def test_resume_from_an_older_checkpoint_replaces_newer_ones_and_ends_identical(workdir, fxcache, baseline,
                                                                               interrupted):
    baseline_dir, _ = baseline
    run_dir = workdir / "resume-from"
    shutil.copytree(interrupted, run_dir)
    (oldest, oldest_path), _, (newest, _) = list_checkpoints(fold_dir(run_dir))
    done = run_trainer(train_cmd(run_dir, fxcache, "--checkpoint-every", "10", "--keep-checkpoints", "3",
                                 "--resume-from", str(oldest_path), attempt=1))
    assert done.rc == 0, done.stderr
    assert_resumed_from(done, (oldest, oldest_path), 1)
    written = [e["env_step"] for e in done.named("checkpoint")]
    assert written == list(range(oldest + 10, N_STEPS + 1, 10))  # the abandoned later ones were written again
    assert newest in written
    assert_same_outcome(run_dir, baseline_dir)


def _fold_trainer_for(run_dir: Path, fxcache: Path):
    """The trainer `python -m trainer.train` builds for train_cmd's arguments, built in this process."""
    from trainer.checkpoint.resume import fingerprint, tensor_layout
    from trainer.cli import parse
    from trainer.features.cache import load_or_build
    from trainer.folds.windows import fold_windows, walk_forward_windows
    from trainer.loop.config import fingerprint_config
    from trainer.loop.fold import FoldTrainer, Window, fold_inputs
    from trainer.loop.log import JsonLog

    cfg = parse(train_cmd(run_dir, fxcache)[3:]).config
    fs, skipped = load_or_build(cfg.data, cfg.features, fxcache)
    assert skipped  # the baseline built the cache
    train_w, _ = fold_windows(walk_forward_windows(fs.raw.shape[0], cfg.folds.folds), 0,
                              train_window=cfg.folds.train_window)
    window = Window(train_w.start, train_w.stop)
    features, _, reflected = fold_inputs(cfg, fs.raw, list(fs.names), fs.decision, window)  # as train.py builds them
    quiet = JsonLog(0, out=io.StringIO(), err=io.StringIO())
    trainer = FoldTrainer(cfg, features, fs.decision, window, 0, quiet, reflected=reflected)
    fp = fingerprint(fingerprint_config(cfg.to_dict()), fs.key, tensor_layout(trainer.state_dict()))
    return trainer, fp


def test_restore_skips_newest_checkpoint_damaged_at_many_offsets(tmp_path, workdir, fxcache, baseline, interrupted):
    """The trainer's restore() on a real run directory: a bit flip anywhere, or a cut at any length, of the newest
    checkpoint is logged as `checkpoint_skipped` and the previous checkpoint is loaded instead."""
    from trainer.checkpoint.tensors import capture_rng_state, restore_rng_state

    # Building a FoldTrainer and restoring set process-wide torch/numpy/python state: put it back afterwards.
    saved = (capture_rng_state(), torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision())
    try:
        _check_many_offsets(tmp_path, workdir, fxcache, interrupted)
    finally:
        restore_rng_state(saved[0])
        torch.use_deterministic_algorithms(saved[1])
        torch.set_float32_matmul_precision(saved[2])


def _check_many_offsets(tmp_path: Path, workdir: Path, fxcache: Path, interrupted: Path) -> None:
    from trainer.checkpoint.resume import restore
    from trainer.loop.log import JsonLog

    trainer, fp = _fold_trainer_for(workdir / "unused", fxcache)
    (_, _), (prev_step, prev), (_, newest) = list_checkpoints(fold_dir(interrupted))
    size = newest.stat().st_size
    rng = random.Random(KILL_RNG_SEED + 5)
    # Header fields, first section's name and length, the last section's digest, the file digest, and random bytes.
    flips = sorted({0, 3, 4, 8, 15, 16, 20, 22, size - 64, size - 33, size - 32, size - 1}
                   | {rng.randrange(size) for _ in range(20)})
    cuts = sorted({0, 1, 19, 20, 21, size // 2, size - 33, size - 1} | {rng.randrange(size) for _ in range(6)})
    cases = [("flip", offset) for offset in flips] + [("cut", length) for length in cuts]
    for kind, where in cases:
        case_dir = tmp_path / f"{kind}-{where}"
        case_dir.mkdir()
        shutil.copy2(prev, case_dir / prev.name)
        damaged = case_dir / newest.name
        shutil.copy2(newest, damaged)
        if kind == "flip":
            _flip_bit(damaged, where, rng.randrange(8))
        else:
            _truncate(damaged, where)
        out = io.StringIO()
        resumed = restore(trainer, case_dir, fp, None, JsonLog(0, out=out, err=io.StringIO()))
        events = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [(e["event"], e["path"]) for e in events] == [("checkpoint_skipped", str(damaged))], (kind, where)
        assert resumed["path"] == str(case_dir / prev.name) and resumed["env_step"] == prev_step, (kind, where)
        assert trainer.env_step == prev_step
        shutil.rmtree(case_dir)
    assert len(cases) >= 40


# ──────────────────────────────────────────────────────────────────────── 5. config mismatch


@pytest.mark.parametrize("change, fields", [
    (("--n-envs", "8"), ["sim.n_envs"]),
    (("--encoder", "mamba"), ["agent.encoder"]),
    # fold geometry, evaluation and chain settings change the fold's result: part of the fingerprint too
    (("--folds", "4"), ["folds.folds"]),
    (("--embargo-rows", "7"), ["folds.embargo_rows"]),
    (("--fold-mode", "chain"), ["folds.fold_mode"]),
    (("--folds.train-window", "anchored"), ["folds.train_window"]),
    (("--eval.n-envs", "8"), ["eval.n_envs"]),
    (("--eval.bar-seconds", "60"), ["eval.bar_seconds"]),
    (("--eval.day-offset-hours", "-2"), ["eval.day_offset_hours"]),
    (("--chain.shrink-alpha", "0.5"), ["chain.shrink_alpha"]),
], ids=["n-envs", "encoder", "folds", "embargo-rows", "fold-mode", "train-window", "eval-n-envs", "eval-bar-seconds",
        "eval-day-offset", "chain-shrink-alpha"])
def test_mismatching_config_on_same_run_dir_is_refused_with_exit_2_naming_fields(change, fields, workdir, fxcache,
                                                                                baseline):
    baseline_dir, _ = baseline
    run_dir = workdir / f"mismatch-{change[0].strip('-')}"
    fold_dir(run_dir).mkdir(parents=True)
    for _, path in list_checkpoints(fold_dir(baseline_dir)):
        shutil.copy2(path, fold_dir(run_dir) / path.name)
    before = {p.name: p.read_bytes() for p in fold_dir(run_dir).iterdir()}
    cmd = train_cmd(run_dir, fxcache)
    for i in range(0, len(cmd) - 1):  # replace the flag's value (train_cmd already passes --n-envs)
        if cmd[i] == change[0]:
            cmd[i + 1] = change[1]
            break
    else:
        cmd += list(change)
    refused = run_trainer(cmd)
    assert refused.rc == 2
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith("error: ") and "checkpoint does not match this run; differing fields: " in message
    for name in fields:
        assert f"config.{name} (run " in message, message
    assert "checkpoint-000000000080.bin" in message  # names the file it refused
    after = {p.name: p.read_bytes() for p in fold_dir(run_dir).iterdir() if p.name != "metrics.jsonl"}
    assert after == before  # nothing written, nothing deleted
    assert refused.named("checkpoint") == [] and refused.named("result") == []


def test_run_json_records_fold_geometry_eval_and_chain_settings(baseline):
    """run.json (one per run, shared by its folds) holds every section of the resolved config but the fold index."""
    baseline_dir, _ = baseline
    config = json.loads((baseline_dir / "run.json").read_text())["config"]
    assert config["folds"] == {"folds": 3, "embargo_rows": 0, "train_window": "rolling", "fold_mode": "independent",
                               "chain_wait_seconds": 0.0}
    assert config["eval"]["n_envs"] == 64 and config["eval"]["bar_seconds"] == 300  # the smoke preset's
    assert config["chain"]["shrink_alpha"] == 0.8 and config["sim"]["n_envs"] == 16


def test_anchored_fold_1_trains_from_window_0_start_through_fold_0s_eval_window(workdir, fxcache, baseline):
    """--folds.train-window anchored: fold 1 trains on windows 0 and 1, so its training rows begin where fold 0's
    do and end where fold 0's evaluation rows end (no embargo); it is evaluated on window 2, and model selection's
    held-out slice is the end of that longer window."""
    baseline_dir, _ = baseline
    fold0 = json.loads((fold_dir(baseline_dir) / "result.json").read_text())
    run_dir = workdir / "anchored"
    done = run_trainer(train_cmd(run_dir, fxcache, "--fold", "1", "--folds.train-window", "anchored"))
    assert done.rc == 0, done.stderr
    fold1 = json.loads((run_dir / "fold1" / "result.json").read_text())
    assert fold0["train_window"][0] == 0 and fold0["train_window"][1] == fold0["eval_window"][0]
    assert fold1["train_window"] == [0, fold0["eval_window"][1]]
    assert fold1["eval_window"][0] == fold0["eval_window"][1] and fold1["fold"] == 1
    assert fold1["select_rows"][1] == fold0["eval_window"][1] > fold1["select_rows"][0] > fold0["eval_window"][0]
    assert json.loads((run_dir / "run.json").read_text())["config"]["folds"]["train_window"] == "anchored"


# ──────────────────────────────────────────────────────────────────────── 6. S3: restore from the mirror


@pytest.mark.slow
def test_checkpoints_mirrored_to_s3_restore_a_lost_fold_dir_and_end_identical(s3_env, workdir, fxcache, baseline):
    baseline_dir, _ = baseline
    run_dir = workdir / "s3"
    prefix = s3_env.new_prefix()
    cmd = train_cmd(run_dir, fxcache, "--s3-bucket", BUCKET, "--s3-prefix", prefix)
    stopped = run_trainer(cmd, sig=signal.SIGTERM,
                          stop_when=lambda e: e["event"] == "checkpoint" and e["env_step"] == 40)
    assert stopped.rc == 143, stopped.stderr
    step = stopped.one("stopped")["env_step"]
    uploaded = {Path(e["path"]).name for e in stopped.named("s3_uploaded")}
    assert f"checkpoint-{step:012d}.bin" in uploaded  # SIGTERM drains the mirror before exit 143
    remote_dir = f"{prefix}/{run_dir.name}/fold0/"
    listing = s3_env.client().list_objects_v2(Bucket=BUCKET, Prefix=remote_dir)
    remote = sorted(o["Key"][len(remote_dir):] for o in listing.get("Contents", []))
    assert len(remote) == 2 and remote[-1] == f"checkpoint-{step:012d}.bin"  # newest two, as locally

    shutil.rmtree(fold_dir(run_dir))  # the pod moved to a node without the volume
    done = run_trainer(train_cmd(run_dir, fxcache, "--s3-bucket", BUCKET, "--s3-prefix", prefix, attempt=1))
    assert done.rc == 0, done.stderr
    restored = done.one("s3_restored")
    assert restored["step"] == step and restored["key"] == f"{remote_dir}checkpoint-{step:012d}.bin"
    assert_resumed_from(done, (step, fold_dir(run_dir) / f"checkpoint-{step:012d}.bin"), 1)
    assert_same_outcome(run_dir, baseline_dir)
    listing = s3_env.client().list_objects_v2(Bucket=BUCKET, Prefix=remote_dir)
    assert f"{remote_dir}checkpoint-{N_STEPS:012d}.bin" in {o["Key"] for o in listing.get("Contents", [])}


# ──────────────────────────────────────────────────────────────────────── 7. a finished fold


def test_fold_with_result_json_exits_0_at_once_and_touches_nothing(workdir, fxcache, baseline):
    baseline_dir, _ = baseline
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in fold_dir(baseline_dir).iterdir()}
    again = run_trainer(train_cmd(baseline_dir, fxcache, attempt=3))
    assert again.rc == 0, again.stderr
    assert [e["event"] for e in again.events] == ["done_already"]
    assert again.events[0]["attempt"] == 3
    assert again.events[0]["result"] == str(fold_dir(baseline_dir) / "result.json")
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in fold_dir(baseline_dir).iterdir()} == before


# ──────────────────────────────────────────────────────────────────────── 8. --evaluate-from: a trained fold redeployed

DEPLOYMENT = ("--loop.select-min-net", "-1e12", "--loop.max-exposure", "0.3", "--loop.keep-margin-frac", "0")
"""Deployment fields only (trainer.settings.EVALUATION_ONLY): never stand aside, a tighter cap, full hysteresis."""


def _comparable(fold: Path) -> dict:
    r = json.loads((fold / "result.json").read_text())
    return {k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS | {"evaluated_from"}}


def test_evaluate_from_redeploys_the_trained_weights_as_a_full_run_with_those_rules_would(workdir, fxcache, baseline):
    """The same trained fold evaluated under other deployment rules gives what training from scratch with those rules
    gives (deterministic CPU), and under the same rules what the trained run gave; it writes no checkpoint."""
    baseline_dir, _ = baseline
    same = workdir / "evaluate-same"
    done = run_trainer(train_cmd(same, fxcache, "--evaluate-from", str(fold_dir(baseline_dir))))
    assert done.rc == 0, done.stderr
    assert done.one("evaluate_from")["checkpoint"].endswith(f"checkpoint-{N_STEPS:012d}.bin")
    assert _comparable(fold_dir(same)) == _comparable(fold_dir(baseline_dir))
    assert json.loads((fold_dir(same) / "result.json").read_text())["evaluated_from"] == str(fold_dir(baseline_dir))
    assert np.array_equal(np.load(fold_dir(same) / "equity.npy"), np.load(fold_dir(baseline_dir) / "equity.npy"))
    assert list_checkpoints(fold_dir(same)) == [] and done.named("checkpoint") == []

    redeployed, trained = workdir / "evaluate-other", workdir / "trained-other"
    done = run_trainer(train_cmd(redeployed, fxcache, *DEPLOYMENT, "--evaluate-from", str(fold_dir(baseline_dir))))
    assert done.rc == 0, done.stderr
    full = run_trainer(train_cmd(trained, fxcache, *DEPLOYMENT))
    assert full.rc == 0, full.stderr
    got, want = _comparable(fold_dir(redeployed)), _comparable(fold_dir(trained))
    assert got == want
    base = _comparable(fold_dir(baseline_dir))
    assert got["weights_sha256"] == base["weights_sha256"]  # the same weights, deployed otherwise:
    assert base["stood_aside"] is True and base.get("select_margin") is None  # the trained run stood aside,
    assert got["stood_aside"] is False and got["select_max_exposure"] == 0.3  # this one calibrated the cap


def test_evaluate_from_deploys_a_trading_fold_under_the_cap_and_hysteresis_it_is_given(workdir, fxcache, baseline):
    """A fold that trades (the baseline's final state with perturbed weights, saved as a final checkpoint, as if
    selected with a profit) evaluated three times from the same checkpoint: uncapped, under a cap of 0.3 with full
    hysteresis, and uncapped with a minimum holding time. Same weights; the capped deployment calibrates a margin and
    holds a position less of the time; the held one makes fewer, longer trips."""
    from trainer.checkpoint.resume import FileCheckpointer, restore
    from trainer.loop.log import JsonLog

    baseline_dir, _ = baseline
    trainer, fp = _fold_trainer_for(baseline_dir, fxcache)
    quiet = JsonLog(0, out=io.StringIO(), err=io.StringIO())
    restore(trainer, fold_dir(baseline_dir), fp, None, quiet)
    gen = torch.Generator().manual_seed(KILL_RNG_SEED)
    with torch.no_grad():  # weights that trade
        for p in trainer.learner.params:
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    trainer.selector.best_params.copy_(torch.cat([p.detach().reshape(-1) for p in trainer.learner.params]))
    trainer.selector.record[0], trainer.selector.record[5] = 1e9, float("nan")  # selected with a profit
    src = workdir / "trading" / "fold0"
    src.mkdir(parents=True)
    FileCheckpointer(src, 2, {"fingerprint": fp, "fold": 0, "folds": 3}, quiet).save(trainer, final=True)

    results = {}
    held = ("--loop.max-exposure", "1", "--loop.min-hold-steps", "12")
    for name, extra in (("free", ("--loop.max-exposure", "1")), ("capped", DEPLOYMENT[2:]), ("held", held)):
        done = run_trainer(train_cmd(workdir / f"trading-{name}", fxcache, *extra, "--evaluate-from", str(src)))
        assert done.rc == 0, done.stderr
        results[name] = _comparable(fold_dir(workdir / f"trading-{name}"))
    free, capped = results["free"], results["capped"]
    assert free["weights_sha256"] == capped["weights_sha256"] and not free["stood_aside"] and free["trades"] > 0
    assert "select_margin" not in free and capped["select_margin"] > 0 and capped["select_max_exposure"] == 0.3
    assert capped["time_in_market"] < free["time_in_market"]
    held = results["held"]  # every trip kept for 12 decisions at least: fewer and longer trips from the same weights
    assert held["weights_sha256"] == free["weights_sha256"] and 0 < held["trades"] < free["trades"]
    assert held["mean_holding_steps"] > max(free["mean_holding_steps"], 10)


@pytest.mark.parametrize(("extra", "keep", "match"), [
    (("--agent.lr", "1e-4"), None, "config.agent.lr (run "),  # a training field: not the same trained fold
    # the rows a fold trains on are training too, even where (fold 0) both choices give the same rows
    (("--folds.train-window", "anchored"), None, "config.folds.train_window (run "),
    ((), f"checkpoint-{N_STEPS - CHECKPOINT_EVERY:012d}.bin", "not a finished training"),  # the newest checkpoint is not final
], ids=["training-field", "train-window", "unfinished"])
def test_evaluate_from_refuses_another_training_or_an_unfinished_one_with_exit_2(extra, keep, match, workdir, fxcache,
                                                                                baseline):
    baseline_dir, _ = baseline
    src = fold_dir(baseline_dir)
    if keep is not None:  # a copy of the fold holding only a mid-run checkpoint
        src = workdir / f"unfinished-{keep}" / "fold0"
        src.mkdir(parents=True)
        shutil.copy2(fold_dir(baseline_dir) / keep, src / keep)
    run_dir = workdir / f"evaluate-refused-{'-'.join(extra).strip('-') or 'unfinished'}"
    refused = run_trainer(train_cmd(run_dir, fxcache, *extra, "--evaluate-from", str(src)))
    assert refused.rc == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("error: ") and match in refused.stderr
    assert not (fold_dir(run_dir) / "result.json").exists() and refused.named("result") == []


# ──────────────────────────────────────────────────────────────────────── CUDA, deterministic mode


@pytest.mark.gpu
@pytest.mark.parametrize("encoder, compile", [("mamba", "none"), ("gru", "none"), ("mamba", "all")])
def test_cuda_deterministic_run_killed_twice_and_resumed_matches_uninterrupted_run(encoder, compile, workdir,
                                                                                   fxcache):
    """The resume contract on the GPU: --deterministic on CUDA (eager step, deterministic kernels, the fused
    Triton scan for mamba, and torch.compile'd code as the h100 preset runs it), SIGKILL after a mid-run step and
    again at an arbitrary moment, then a clean finish."""
    extra = ("--device", "cuda", "--encoder", encoder, "--compile", compile)
    baseline_dir = workdir / f"cuda-{encoder}-{compile}-baseline"
    done = run_trainer(train_cmd(baseline_dir, fxcache, *extra))
    assert done.rc == 0, done.stderr
    run_dir = workdir / f"cuda-{encoder}-{compile}-killed"
    first = run_trainer(train_cmd(run_dir, fxcache, *extra), stop_when=_stop_rule("step", N_STEPS // 2 + LOG_EVERY))
    assert first.rc == -signal.SIGKILL, first.stderr
    after_first = newest_checkpoint(run_dir)
    assert after_first is not None and after_first[0] == N_STEPS // 2
    second = run_trainer(train_cmd(run_dir, fxcache, *extra, attempt=1),
                         stop_after_s=0.5 * training_seconds(done))
    assert second.rc in (-signal.SIGKILL, 0), second.stderr
    assert_resumed_from(second, after_first, 1)
    final = run_trainer(train_cmd(run_dir, fxcache, *extra, attempt=2))
    assert final.rc == 0, final.stderr
    assert_same_outcome(run_dir, baseline_dir)
