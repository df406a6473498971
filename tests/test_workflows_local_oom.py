"""A real kernel OOM kill of the real trainer in fold 1 of a local DAG run: retried, resumed, same result.

`python -m workflows.submit --local --memory-limit` runs every train attempt in its own cgroup-v1 memory
group; the test-only fault hook (tests/hooks on PYTHONPATH plus ALPHA_RL_TEST_OOM_AT_STEP / ALPHA_RL_TEST_OOM_FOLD,
passed with --env) makes fold 1's attempt 0 allocate after its checkpoint until the kernel kills it. The
runner must report OOMKilled (exit 137) with the group's oom_kill counter, wait the rendered backoff, retry
with `--attempt 1`, and the retry must resume from the checkpoint and end with the result.json of an
uninterrupted trainer run of the identical command line.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.hooks import alpha_rl_test_hooks as hooks
from trainer.loop.config import preset
from workflows import template as T
from workflows.cgroup import memory_cgroup_parent
from workflows.local import parse_duration_s

ROOT = Path(__file__).resolve().parents[1]
SHA = "0123abc"
DATA = "synthetic:seed=3,days=2,signal=2"
CHECKPOINT_EVERY = preset("smoke").loop.checkpoint_every
"""500: the rendered template cannot pass --checkpoint-every, so the smoke preset's cadence is what runs."""
OOM_AT_STEP = CHECKPOINT_EVERY
"""The hook allocates right after the first checkpoint at or after this step: the one at step 500."""
N_STEPS = CHECKPOINT_EVERY + 60
"""560: the retry trains 60 steps from the restored checkpoint (replay, RNG and optimiser state all matter)."""
MEMORY_LIMIT = 1 << 30
"""1 GiB per train attempt: the trainer peaks near 0.6 GB here, the hook's 64 MiB blocks pass 1 GiB in a second."""
WALL_CLOCK_FIELDS = {"wall_seconds", "checkpoint_seconds"}
"""result.json fields allowed to differ between the OOM-killed-and-retried fold and its uninterrupted twin."""
RUN_TIMEOUT_S = 600.0


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHA_RL_TEST_")}
    # Single-threaded: bit-identical resume on CPU needs a fixed float reduction order (docs/checkpoints.md).
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "ALPHA_RL_DATA_DIR": str(tmp_path / "data")}


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the local runner stops its tasks (grace period), then exits
        out, err = proc.communicate(timeout=180)
        pytest.fail(f"{cmd[:4]} timed out after {RUN_TIMEOUT_S}s:\n{out[-3000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _node_lines(stdout: str, node: str) -> list[str]:
    prefix = f"{node} "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


def _attempt_ends(stdout: str, node: str) -> list[dict]:
    events = [json.loads(s) for s in _node_lines(stdout, node) if s.startswith('{"event": "local-attempt-end"')]
    return [{k: v for k, v in e.items() if k != "duration_s"} for e in events]


def _events(log_file: Path) -> list[dict]:
    return [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]


def _named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


@pytest.mark.slow
@pytest.mark.skipif(memory_cgroup_parent() is None,
                    reason="no writable cgroup-v1 memory hierarchy (/sys/fs/cgroup/memory): cannot OOM-kill for real")
def test_real_oom_kill_of_fold_1_is_retried_and_resumes_to_the_uninterrupted_result(tmp_path):
    parent = memory_cgroup_parent()
    groups_before = set(parent.iterdir())
    run_root = tmp_path / "runs"
    env = _env(tmp_path)
    submit = [
        sys.executable, "-m", "workflows.submit", "--folds", "3", "--local", "--sha", SHA, "--preset", "smoke",
        "--device", "cpu", "--n-steps", str(N_STEPS), "--n-backtests", "16", "--per-capacity", "2048",
        "--data", DATA, "--run-root", str(run_root), "--memory-limit", str(MEMORY_LIMIT), "--no-control",
        "--env", f"PYTHONPATH={hooks.HOOKS_DIR}", "--env", f"ALPHA_RL_TEST_OOM_AT_STEP={OOM_AT_STEP}",
        "--env", "ALPHA_RL_TEST_OOM_FOLD=1",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = _run(submit, env)
    dag_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    workflow = proc.stdout.splitlines()[-1].split()[2].rstrip(":")  # "local workflow NAME: Succeeded; ..."
    logs = run_root / "logs" / workflow

    # The runner: fold 1 OOM-killed by the kernel on attempt 0, retried once after the rendered backoff.
    first, second = _attempt_ends(proc.stdout, "train-fold(1)")
    assert first == {"event": "local-attempt-end", "node": "train-fold(1)", "retries": 0, "exit_code": 137,
                     "status": "Failed", "message": "OOMKilled (exit code 137)", "oom_kills": first["oom_kills"]}
    assert first["oom_kills"] >= 1, "the kernel's oom_kill counter did not move: not an OOM kill"
    assert second == {"event": "local-attempt-end", "node": "train-fold(1)", "retries": 1, "exit_code": 0,
                      "status": "Succeeded", "message": "", "oom_kills": 0}
    (retry,) = [t["retryStrategy"] for t in T.render()["spec"]["templates"] if t["name"] == "train-fold"]
    backoff_s, limit = parse_duration_s(retry["backoff"]["duration"]), retry["limit"]  # 30 s, 5 as rendered
    assert f"retrying in {backoff_s:.2f}s (attempt 1 of at most {limit})" in _node_lines(proc.stdout, "train-fold(1)")
    for fold in (0, 2):
        assert _attempt_ends(proc.stdout, f"train-fold({fold})") == [
            {"event": "local-attempt-end", "node": f"train-fold({fold})", "retries": 0, "exit_code": 0,
             "status": "Succeeded", "message": "", "oom_kills": 0}]  # fmt: skip
        assert sorted(p.name for p in logs.glob(f"train-fold_{fold}_.attempt*.log")) == [
            f"train-fold_{fold}_.attempt0.log"]  # fmt: skip
        ran = _events(logs / f"train-fold_{fold}_.attempt0.log")
        assert _named(ran, "test_oom_armed") == [] and len(_named(ran, "fresh")) == 1
    assert set(parent.iterdir()) == groups_before  # every per-attempt cgroup removed

    # The trainer: attempt 0 checkpointed at step 500, then the hook ran it out of memory; no result.
    killed = _events(logs / "train-fold_1_.attempt0.log")
    launch0 = _named(killed, "attempt")[0]
    assert (launch0["fold"], launch0["attempt"]) == ("1", 0)
    assert [(e["at_step"], e["attempt"]) for e in _named(killed, "test_oom_armed")] == [(OOM_AT_STEP, 0)]
    assert [e["env_step"] for e in _named(killed, "checkpoint")] == [OOM_AT_STEP]
    assert [e["env_step"] for e in _named(killed, "test_oom_hook")] == [OOM_AT_STEP]
    assert _named(killed, "result") == []
    # Attempt 1 (`--attempt 1`, same environment): resumed from that checkpoint, the hook stayed off.
    retried = _events(logs / "train-fold_1_.attempt1.log")
    launch1 = _named(retried, "attempt")[0]
    assert (launch1["fold"], launch1["attempt"]) == ("1", 1)
    assert launch1["time_unix_s"] - _named(killed, "test_oom_hook")[0]["ts"] >= backoff_s
    fold1 = run_root / SHA / "fold1"
    (resume,) = _named(retried, "resume")
    assert (resume["attempt"], resume["env_step"]) == (1, OOM_AT_STEP)
    assert resume["checkpoint"] == str(fold1 / f"checkpoint-{OOM_AT_STEP:012d}.bin")
    assert _named(retried, "fresh") == [] and _named(retried, "test_oom_armed") == []
    assert [e["env_step"] for e in _named(retried, "checkpoint")] == [N_STEPS]
    assert len(_named(retried, "result")) == 1

    # The same fold uninterrupted: attempt 0's exact command line (cgroup wrapper off), own run dir, no hooks.
    (cmd_line,) = [s for s in _node_lines(proc.stdout, "train-fold(1)") if s.startswith("attempt 0: ")]
    cmd = shlex.split(cmd_line.removeprefix("attempt 0: "))
    cmd = cmd[cmd.index("--") + 1:]
    assert cmd[:4] == [sys.executable, "-m", "workflows.launch", "trainer.train"]
    ref_run = tmp_path / "reference" / SHA
    cmd[cmd.index("--run-dir") + 1] = str(ref_run)
    t0 = time.monotonic()
    ref = _run(cmd, env)
    ref_s = time.monotonic() - t0
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-2000:]
    got = json.loads((fold1 / "result.json").read_text())
    want = json.loads((ref_run / "fold1" / "result.json").read_text())
    assert got["env_steps"] == N_STEPS
    assert {k: v for k, v in got.items() if k not in WALL_CLOCK_FIELDS} == \
        {k: v for k, v in want.items() if k not in WALL_CLOCK_FIELDS}
    np.testing.assert_array_equal(np.load(fold1 / "equity.npy"), np.load(ref_run / "fold1" / "equity.npy"))
    print(f"\nlocal DAG with the OOM: {dag_s:.1f} s; uninterrupted fold-1 trainer: {ref_s:.1f} s")


# ──────────────────────────────────────────────────────────────────────── the hook's gating (fast)


def _argv(fold: int, attempt: int) -> list[str]:
    return ["-m", "trainer.train", "--run-dir", "/r", "--fold", str(fold), "--folds", "3", "--attempt", str(attempt)]


@pytest.mark.parametrize("variable", [hooks.OOM_AT_STEP, hooks.CUDA_OOM_AT_UPDATE])
def test_fault_hook_arms_only_the_named_fold_on_attempt_0(monkeypatch, variable):
    monkeypatch.setenv(variable, "500")
    monkeypatch.setenv(hooks.OOM_FOLD, "1")
    assert hooks.armed_at(variable, _argv(1, 0)) == 500
    assert hooks.armed_at(variable, _argv(0, 0)) is None
    assert hooks.armed_at(variable, _argv(2, 0)) is None
    assert hooks.armed_at(variable, _argv(1, 1)) is None  # the retry runs with the same env and must not re-plant
    assert hooks.armed_at(variable, [*_argv(0, 0), "--folds.fold=1"]) == 500  # the dotted flag counts too
    monkeypatch.delenv(hooks.OOM_FOLD)
    assert [hooks.armed_at(variable, _argv(f, 0)) for f in range(3)] == [500, 500, 500]  # no fold named: every fold
    monkeypatch.delenv(variable)
    assert hooks.armed_at(variable, _argv(1, 0)) is None


@pytest.mark.parametrize(("name", "value"), [(hooks.OOM_AT_STEP, "0"), (hooks.OOM_AT_STEP, "5x"), (hooks.OOM_FOLD, "-1")])
def test_fault_hook_with_a_bad_value_is_refused_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(hooks.OOM_AT_STEP, "500")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name} must be an integer >= ., got '{value}'"):
        hooks.armed_at(hooks.OOM_AT_STEP, _argv(1, 0))


def test_fault_hooks_load_only_with_their_directory_on_pythonpath():
    """The hooks are armed by sitecustomize in tests/hooks: a process without that directory on PYTHONPATH never
    patches anything, whatever the variables say; with it, the checkpointer is patched when imported."""
    probe = ("import sys, trainer.checkpoint.resume as r; "
             "print(r.FileCheckpointer.save.__name__, 'alpha_rl_test_hooks' in sys.modules)")
    env = {**_env(Path("/nonexistent")), hooks.OOM_AT_STEP: "5"}
    off = subprocess.run([sys.executable, "-c", probe, "--attempt", "0"], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert off.stdout.split() == ["save", "False"]
    on = subprocess.run([sys.executable, "-c", probe, "--attempt", "0"], env={**env, "PYTHONPATH": str(hooks.HOOKS_DIR)},
                        capture_output=True, text=True, cwd=ROOT, check=True)
    assert on.stdout.splitlines()[-1].split() == ["save_then_oom", "True"]
    assert json.loads(on.stdout.splitlines()[0]) == {"event": "test_oom_armed", "attempt": 0, "at_step": 5,
                                                     "source": hooks.OOM_AT_STEP}


# ──────────────────────────────────────────────────────────────── chain mode, end to end (slow)


def _attempt_cmd(stdout: str, node: str, attempt: int) -> list[str]:
    """The exact trainer command line of one attempt, as the runner printed it, without the cgroup wrapper."""
    (line,) = [s for s in _node_lines(stdout, node) if s.startswith(f"attempt {attempt}: ")]
    cmd = shlex.split(line.removeprefix(f"attempt {attempt}: "))
    return cmd[cmd.index("--") + 1:] if "--" in cmd else cmd


@pytest.mark.slow
@pytest.mark.skipif(memory_cgroup_parent() is None,
                    reason="no writable cgroup-v1 memory hierarchy (/sys/fs/cgroup/memory): cannot OOM-kill for real")
def test_chain_mode_runs_folds_in_sequence_and_an_oom_in_fold_1_ends_identical_to_uninterrupted(tmp_path):
    import shutil

    run_root = tmp_path / "runs"
    env = _env(tmp_path)
    submit = [
        sys.executable, "-m", "workflows.submit", "--folds", "3", "--local", "--sha", SHA, "--preset", "smoke",
        "--device", "cpu", "--n-steps", str(N_STEPS), "--n-backtests", "16", "--per-capacity", "2048",
        "--data", DATA, "--run-root", str(run_root), "--memory-limit", str(MEMORY_LIMIT), "--no-control",
        "--fold-mode", "chain",
        "--parallelism", "3",  # room for all folds at once: only the DAG's chain keeps them in order
        "--env", f"PYTHONPATH={hooks.HOOKS_DIR}", "--env", f"ALPHA_RL_TEST_OOM_AT_STEP={OOM_AT_STEP}",
        "--env", "ALPHA_RL_TEST_OOM_FOLD=1",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = _run(submit, env)
    dag_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    workflow = proc.stdout.splitlines()[-1].split()[2].rstrip(":")
    assert workflow.startswith("alpha-rl-chain-3-local-")
    logs = run_root / "logs" / workflow

    # Sequence: every fold's first attempt starts only after the previous fold's last attempt ended.
    lines = proc.stdout.splitlines()

    def at(node: str, prefix: str) -> list[int]:
        return [i for i, s in enumerate(lines) if s.startswith(f"{node} {prefix}")]

    ends = {f: at(f"train-fold-{f}", '{"event": "local-attempt-end"') for f in range(3)}
    starts = {f: at(f"train-fold-{f}", "attempt 0: ") for f in range(3)}
    assert [len(ends[f]) for f in range(3)] == [1, 2, 1]  # fold 1: OOM-killed once, then succeeded
    assert ends[0][-1] < starts[1][0] and ends[1][-1] < starts[2][0]
    first, second = _attempt_ends(proc.stdout, "train-fold-1")
    assert (first["exit_code"], first["message"], second["exit_code"]) == (137, "OOMKilled (exit code 137)", 0)
    assert first["oom_kills"] >= 1

    # Fold 1 warm-started from fold 0 on attempt 0, and its retry resumed from its own checkpoint instead.
    killed = _events(logs / "train-fold-1.attempt0.log")
    assert len(_named(killed, "chain_warm_start")) == 1 and _named(killed, "result") == []
    retried = _events(logs / "train-fold-1.attempt1.log")
    assert _named(retried, "chain_warm_start") == [] and _named(retried, "fresh") == []
    assert [e["env_step"] for e in _named(retried, "resume")] == [OOM_AT_STEP]
    assert len(_named(_events(logs / "train-fold-2.attempt0.log"), "chain_warm_start")) == 1

    # Uninterrupted twin: fold 0 is the same (no plant there), so it is copied; folds 1 and 2 rerun with the
    # DAG's own attempt-0 command lines, in order, without hooks, in their own run dir.
    ref_run = tmp_path / "reference" / SHA
    ref_run.mkdir(parents=True)
    shutil.copytree(run_root / SHA / "fold0", ref_run / "fold0")
    t0 = time.monotonic()
    for fold in (1, 2):
        cmd = _attempt_cmd(proc.stdout, f"train-fold-{fold}", 0)
        assert cmd[:4] == [sys.executable, "-m", "workflows.launch", "trainer.train"]
        assert cmd[cmd.index("--fold-mode") + 1] == "chain"
        cmd[cmd.index("--run-dir") + 1] = str(ref_run)
        ref = _run(cmd, env)
        assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-2000:]
    ref_s = time.monotonic() - t0
    for fold in (1, 2):
        got = json.loads((run_root / SHA / f"fold{fold}" / "result.json").read_text())
        want = json.loads((ref_run / f"fold{fold}" / "result.json").read_text())
        assert got["env_steps"] == N_STEPS and got["fold_mode"] == "chain"
        assert {k: v for k, v in got.items() if k not in WALL_CLOCK_FIELDS} == \
            {k: v for k, v in want.items() if k not in WALL_CLOCK_FIELDS}, f"fold {fold}"
        np.testing.assert_array_equal(np.load(run_root / SHA / f"fold{fold}" / "equity.npy"),
                                      np.load(ref_run / f"fold{fold}" / "equity.npy"))
    print(f"\nchain DAG with the OOM: {dag_s:.1f} s; uninterrupted folds 1-2: {ref_s:.1f} s")
