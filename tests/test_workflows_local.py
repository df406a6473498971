"""The local DAG runner on templates built by the production Hera builders, with real processes and exit codes."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workflows import template as T
from workflows.cgroup import memory_cgroup_parent
from workflows.launch import drop_empty_flags
from workflows.local import LocalOptions, parse_duration_s, run_local, substitute

SHA = "0123abc"
MOUNT = T.DEFAULTS.mount_path

# Stand-in trainer: a real process that exits with the code planned for (fold, attempt) in $PLAN,
# writes result.json into the fold dir it was given, and refuses to start before features ran.
FOLD_CODE = r"""
import json, os, sys, time
fold, retries, fold_dir, fxcache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(json.dumps({"event": "fake-train", "fold": int(fold), "attempt": retries}), flush=True)
if not os.path.exists(os.path.join(fxcache, "done")):
    sys.exit(9)
time.sleep(float(os.environ.get("SLEEP_S", "0")))
codes = json.loads(os.environ.get("PLAN", "{}")).get(fold, [])
code = codes[retries] if retries < len(codes) else 0
if code == 0:
    os.makedirs(fold_dir, exist_ok=True)
    with open(os.path.join(fold_dir, "result.json"), "w") as f:
        json.dump({"fold": int(fold), "attempt": retries}, f)
sys.exit(code)
"""
FEATURES_CODE = "import os, sys; os.makedirs(sys.argv[1], exist_ok=True); open(os.path.join(sys.argv[1], 'done'), 'w').close()"
REPORT_CODE = (
    "import json, os, sys; d = sys.argv[1]; os.makedirs(d, exist_ok=True); "
    "folds = sorted(n for n in os.listdir(d) if n.startswith('fold')); "
    "json.dump({'folds': folds}, open(os.path.join(d, 'summary.json'), 'w'))"
)


def fake_template(cfg: T.TemplateConfig, fold_code: str = FOLD_CODE, fold_args: list[str] | None = None,
                  fold_mode: str = "independent", folds: int | None = None, seeds: int = 1, control: bool = False,
                  replica_args: list[str] | None = None, report_code: str = REPORT_CODE) -> dict:
    """The production WorkflowTemplate structure with `python -c` commands in place of the trainer CLIs."""
    run_dir = f"{MOUNT}/{{{{workflow.parameters.git-sha}}}}"
    if fold_args is None:
        fold_args = ["{{inputs.parameters.fold}}", "{{retries}}", f"{run_dir}/fold{{{{inputs.parameters.fold}}}}",
                     f"{MOUNT}/fxcache"]  # fmt: skip
    if replica_args is None:  # the fold dir the DAG gives a seed replica or control fold
        replica_args = ["{{inputs.parameters.fold}}", "{{retries}}", "{{inputs.parameters.fold-dir}}",
                        f"{MOUNT}/fxcache"]
    features = ["python", "-c", FEATURES_CODE]
    return T.render(
        cfg,
        fold_mode=fold_mode,
        folds=folds,
        seeds=seeds,
        control=control,
        features=T.features_template(cfg, command=features, args=[f"{MOUNT}/fxcache"]),
        train_fold=T.train_fold_template(cfg, command=["python", "-c", fold_code], args=fold_args),
        report=T.report_template(cfg, command=["python", "-c", report_code], args=[run_dir]),
        train_replica=T.train_replica_template(cfg, command=["python", "-c", fold_code], args=replica_args),
        features_control=T.features_control_template(cfg, command=features, args=[f"{MOUNT}/fxcache"]),
    )


FAST = T.TemplateConfig(backoff_duration="300ms", backoff_cap="1s", retry_limit=2)


def run(tmp_path: Path, cfg=FAST, folds: int = 3, parallelism: int = 3, env=None, wt=None, params=None, **kw):
    log = io.StringIO()
    opts = LocalOptions(run_root=tmp_path / "runs", parallelism=parallelism, env=env or {}, log=log, **kw)
    res = run_local(wt or fake_template(cfg), {"git-sha": SHA, "folds": str(folds), **(params or {})}, opts)
    return res, log.getvalue()


def codes(res, node: str) -> list[int | None]:
    return [a.exit_code for a in res.nodes[node].attempts]


def test_local_dag_runs_features_then_every_fold_then_report_on_the_run_root(tmp_path):
    res, log = run(tmp_path)
    assert res.succeeded
    assert list(res.nodes) == ["features", "train-fold(0)", "train-fold(1)", "train-fold(2)", "report"]
    run_dir = tmp_path / "runs" / SHA
    for fold in range(3):
        assert json.loads((run_dir / f"fold{fold}" / "result.json").read_text()) == {"fold": fold, "attempt": 0}
    # report ran after all folds had written their results
    assert json.loads((run_dir / "summary.json").read_text()) == {"folds": ["fold0", "fold1", "fold2"]}
    for fold in range(3):
        assert f'train-fold({fold}) {{"event": "fake-train", "fold": {fold}, "attempt": 0}}' in log.splitlines()
    assert (tmp_path / "runs" / "logs" / res.workflow_name / "train-fold_1_.attempt0.log").exists()


@pytest.mark.parametrize("first_exit", [137, 143, 1])
def test_retryable_exit_is_retried_after_the_backoff_and_then_succeeds(tmp_path, first_exit):
    t0 = time.monotonic()
    res, log = run(tmp_path, env={"PLAN": json.dumps({"1": [first_exit]})})
    assert res.succeeded
    assert codes(res, "train-fold(1)") == [first_exit, 0]
    assert codes(res, "train-fold(0)") == [0]
    assert 'train-fold(1) {"event": "fake-train", "fold": 1, "attempt": 1}' in log
    assert "retrying in 0.30s" in log
    assert time.monotonic() - t0 >= 0.3


@pytest.mark.parametrize("exit_code", [2, 3])
def test_exit_2_or_3_is_never_retried_and_the_report_never_runs(tmp_path, exit_code):
    res, _ = run(tmp_path, env={"PLAN": json.dumps({"0": [exit_code, 0]})})
    assert not res.succeeded
    assert codes(res, "train-fold(0)") == [exit_code]
    assert res.nodes["train-fold(0)"].phase == "Failed"
    assert res.nodes["report"].phase == "Omitted" and res.nodes["report"].attempts == []
    assert res.failed_exit_code() == exit_code


def test_retry_limit_bounds_the_attempts(tmp_path):
    cfg = T.TemplateConfig(backoff_duration="10ms", retry_limit=2)
    res, _ = run(tmp_path, cfg=cfg, folds=1, env={"PLAN": json.dumps({"0": [1, 1, 1, 1]})})
    assert codes(res, "train-fold(0)") == [1, 1, 1]  # limit 2 -> 3 attempts in all
    assert not res.succeeded


def test_backoff_grows_by_factor_and_is_capped():
    from workflows.local import Attempt, _Runner

    rs = {"limit": 10, "retryPolicy": "Always", "backoff": {"duration": "1s", "factor": 2, "cap": "5s", "maxDuration": "1m"}}
    failed = Attempt(0, 1, "Failed", "Error (exit code 1)", 1.0)
    waits = [_Runner._retry_wait_s(rs, failed, n, 10, elapsed_s=0.0) for n in range(5)]
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert _Runner._retry_wait_s(rs, failed, 0, 10, elapsed_s=59.5) is None  # past maxDuration
    assert _Runner._retry_wait_s({**rs, "retryPolicy": "OnError"}, failed, 0, 10, 0.0) is None


def test_parallelism_bounds_how_many_folds_run_at_once(tmp_path):
    # Each fold registers itself in a shared folder for 0.6 s and records the most peers it saw.
    code = r"""
import os, sys, time
d, fold = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
me = os.path.join(d, fold); open(me, "w").close()
seen, end = 0, time.monotonic() + 0.6
while time.monotonic() < end:
    seen = max(seen, len([n for n in os.listdir(d) if not n.startswith("max")])); time.sleep(0.02)
os.remove(me)
open(os.path.join(d, "max" + fold), "w").write(str(seen))
"""
    peers = tmp_path / "peers"
    for parallelism, expect in ((1, {1}), (3, {3})):
        for f in peers.glob("*"):
            f.unlink()
        wt = fake_template(FAST, fold_code=code, fold_args=[str(peers), "{{inputs.parameters.fold}}"])
        res, _ = run(tmp_path, parallelism=parallelism, wt=wt)
        assert res.succeeded
        assert {int(f.read_text()) for f in peers.glob("max*")} == expect, f"parallelism={parallelism}"


SPAN_CODE = r"""
import sys, time
t0 = time.time(); time.sleep(0.8)
open(sys.argv[1], "a").write(f"{sys.argv[2]} {t0} {time.time()}\n")
"""


def _spans(path: Path) -> dict[int, tuple[float, float]]:
    rows = [line.split() for line in path.read_text().splitlines()]
    return {int(fold): (float(t0), float(t1)) for fold, t0, t1 in rows}


def test_chain_shape_runs_each_fold_only_after_the_previous_one_ended(tmp_path):
    spans = tmp_path / "spans.txt"
    wt = fake_template(FAST, fold_code=SPAN_CODE, fold_args=[str(spans), "{{inputs.parameters.fold}}"],
                       fold_mode="chain", folds=3)
    res, _ = run(tmp_path, parallelism=3, wt=wt, params={"fold-mode": "chain"})
    assert res.succeeded
    assert list(res.nodes) == ["features", "train-fold-0", "train-fold-1", "train-fold-2", "report"]
    got = _spans(spans)
    assert got[0][1] <= got[1][0] and got[1][1] <= got[2][0], f"chain folds overlapped: {got}"
    # the same fake folds in the independent shape, same parallelism: they overlap
    spans.unlink()
    res, _ = run(tmp_path, parallelism=3, wt=fake_template(FAST, fold_code=SPAN_CODE,
                                                           fold_args=[str(spans), "{{inputs.parameters.fold}}"]))
    got = _spans(spans)
    assert res.succeeded and max(t0 for t0, _ in got.values()) < min(t1 for _, t1 in got.values())


# The report's view of the run dir: every result.json below it (so it must start after every train task ended).
REPORT_WALK_CODE = (
    "import json, os, sys; d = sys.argv[1]; "
    "found = sorted(os.path.relpath(os.path.join(r, 'result.json'), d) for r, _, fs in os.walk(d) "
    "if 'result.json' in fs); json.dump(found, open(os.path.join(d, 'summary.json'), 'w'))"
)


def test_seeds_and_control_write_every_result_where_the_layout_says_before_the_report(tmp_path):
    wt = fake_template(FAST, seeds=2, control=True, report_code=REPORT_WALK_CODE)
    res, log = run(tmp_path, folds=2, parallelism=3, wt=wt, params={"control-data": "synthetic:signal=0"})
    assert res.succeeded
    assert list(res.nodes) == ["features", "features-control", "train-fold(0)", "train-fold(1)",
                               "train-fold-seed1(0)", "train-fold-seed1(1)", "control-fold(0)", "control-fold(1)",
                               "control-fold-seed1(0)", "control-fold-seed1(1)", "report"]
    layout = ["control/fold0/result.json", "control/fold0/seed1/result.json", "control/fold1/result.json",
              "control/fold1/seed1/result.json", "fold0/result.json", "fold0/seed1/result.json",
              "fold1/result.json", "fold1/seed1/result.json"]
    assert json.loads((tmp_path / "runs" / SHA / "summary.json").read_text()) == layout
    locks = sorted(p.name for p in (tmp_path / "runs" / ".locks").iterdir())
    assert locks == sorted(f"alpha-rl-{SHA}-{u}.lock" for u in (
        "fold0", "fold1", "fold0-seed1", "fold1-seed1", "control-fold0", "control-fold1", "control-fold0-seed1",
        "control-fold1-seed1"))


def test_chain_shape_with_seeds_and_control_runs_each_chain_in_order_and_the_chains_side_by_side(tmp_path):
    spans = tmp_path / "spans.txt"
    wt = fake_template(FAST, fold_code=SPAN_CODE, fold_args=[str(spans), "fold{{inputs.parameters.fold}}"],
                       replica_args=[str(spans), "{{inputs.parameters.unit}}"], fold_mode="chain", folds=2,
                       seeds=2, control=True)
    res, _ = run(tmp_path, folds=2, parallelism=4, wt=wt,
                 params={"fold-mode": "chain", "control-data": "synthetic:signal=0"})
    assert res.succeeded
    got = {unit: (float(t0), float(t1)) for unit, t0, t1 in (r.split() for r in spans.read_text().splitlines())}
    for first, second in (("fold0", "fold1"), ("fold0-seed1", "fold1-seed1"), ("control-fold0", "control-fold1"),
                          ("control-fold0-seed1", "control-fold1-seed1")):
        assert got[first][1] <= got[second][0], f"{second} started before {first} ended: {got}"
    firsts = [got[u] for u in ("fold0", "fold0-seed1", "control-fold0", "control-fold0-seed1")]
    assert max(t0 for t0, _ in firsts) < min(t1 for _, t1 in firsts), f"the four chains did not overlap: {got}"


def test_chain_fold_exit_3_stops_the_chain_without_retry_and_later_folds_never_start(tmp_path):
    res, _ = run(tmp_path, wt=fake_template(FAST, fold_mode="chain", folds=3), params={"fold-mode": "chain"},
                 env={"PLAN": json.dumps({"1": [3, 0]})})
    assert not res.succeeded and res.failed_exit_code() == 3
    assert codes(res, "train-fold-0") == [0] and codes(res, "train-fold-1") == [3]
    assert res.nodes["train-fold-2"].phase == "Omitted" and res.nodes["report"].phase == "Omitted"


@pytest.mark.parametrize(("shape", "params", "bad"), [
    (("independent", None), {"fold-mode": "chain"}, "fold-mode='chain' is not one of ['independent']"),
    (("chain", 3), {"fold-mode": "independent"}, "fold-mode='independent' is not one of ['chain']"),
    (("chain", 3), {"fold-mode": "chain", "folds": "2"}, "folds='2' is not one of ['3']"),
])
def test_a_parameter_outside_the_shapes_enum_is_refused_before_anything_runs(tmp_path, shape, params, bad):
    wt = fake_template(FAST, fold_mode=shape[0], folds=shape[1])
    with pytest.raises(ValueError, match=re.escape(bad)):
        run_local(wt, {"git-sha": SHA, **params}, LocalOptions(run_root=tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_fold_mutex_keeps_two_runs_of_the_same_commit_off_the_same_fold(tmp_path):
    code = r"""
import sys, time
t0 = time.time(); time.sleep(0.5)
open(sys.argv[1], "a").write(f"{t0} {time.time()}\n")
"""
    spans = tmp_path / "spans.txt"
    wt = fake_template(FAST, fold_code=code, fold_args=[str(spans)])
    results = []
    threads = [threading.Thread(target=lambda: results.append(run(tmp_path, folds=1, wt=wt)[1])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(tuple(map(float, line.split())) for line in spans.read_text().splitlines())
    assert a1 <= b0, "the two fold-0 processes overlapped despite the mutex"
    assert any(f"waiting for mutex alpha-rl-{SHA}-fold0" in log for log in results)


def test_attempt_deadline_sends_sigterm_then_the_retry_succeeds(tmp_path):
    code = r"""
import signal, sys, time
if int(sys.argv[1]) == 0:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # "checkpoint, then exit 143"
    print("ready", flush=True); time.sleep(60)
"""
    cfg = T.TemplateConfig(train_deadline_s=1, termination_grace_s=10, backoff_duration="10ms")
    wt = fake_template(cfg, fold_code=code, fold_args=["{{retries}}"])
    t0 = time.monotonic()
    res, _ = run(tmp_path, cfg=cfg, folds=1, wt=wt)
    assert res.succeeded
    first, second = res.nodes["train-fold(0)"].attempts
    assert first.exit_code == 143 and "deadline" in first.message
    assert second.exit_code == 0
    assert time.monotonic() - t0 < 10  # ended by SIGTERM, not by the grace-period SIGKILL


def test_workflow_parameters_are_checked(tmp_path):
    wt = fake_template(FAST)
    with pytest.raises(ValueError, match="git-sha"):
        run_local(wt, {}, LocalOptions(run_root=tmp_path))
    with pytest.raises(ValueError, match="n-stepz"):
        run_local(wt, {"git-sha": SHA, "n-stepz": "1"}, LocalOptions(run_root=tmp_path))
    with pytest.raises(ValueError, match="parallelism"):
        LocalOptions(parallelism=0)


def test_substitute_and_durations():
    assert substitute(["a{{x}}b", {"{{x}}": "{{ y }}"}], {"x": "1", "y": "2"}) == ["a1b", {"1": "2"}]
    with pytest.raises(ValueError, match="nope"):
        substitute("{{nope}}", {})
    assert [parse_duration_s(d) for d in ("30s", "2m", "1h30m", "250ms", "5", 7)] == [30, 120, 5400, 0.25, 5, 7]
    with pytest.raises(ValueError):
        parse_duration_s("3 days")


@pytest.mark.skipif(memory_cgroup_parent() is None, reason="no writable cgroup-v1 memory hierarchy on this machine")
def test_memory_limit_gives_a_real_oom_kill_137_that_is_retried(tmp_path):
    # Attempt 0 writes 400 MiB into a 160 MiB cgroup: the kernel OOM-kills it. Attempt 1 stays small.
    code = r"""
import sys
if int(sys.argv[1]) == 0:
    chunks = [b"x" * (16 << 20) for _ in range(25)]
print("fits", flush=True)
"""
    parent = memory_cgroup_parent()
    before = set(parent.iterdir())
    wt = fake_template(FAST, fold_code=code, fold_args=["{{retries}}"])
    res, log = run(tmp_path, folds=1, wt=wt, memory_limit_bytes=160 << 20)
    first, second = res.nodes["train-fold(0)"].attempts
    assert first.exit_code == 137 and first.oom_killed and first.message == "OOMKilled (exit code 137)"
    assert first.oom_kills >= 1  # the kernel's own count, read from the attempt's memory.oom_control
    assert second.exit_code == 0 and not second.oom_killed and second.oom_kills == 0
    assert res.succeeded and "train-fold(0) fits" in log
    assert set(parent.iterdir()) == before  # every per-attempt cgroup removed


@pytest.mark.skipif(memory_cgroup_parent() is None, reason="no writable cgroup-v1 memory hierarchy on this machine")
def test_memory_limit_also_oom_kills_and_retries_the_extra_seeds_and_the_control_folds(tmp_path):
    # The same 400 MiB attempt 0 in every train task (train-fold and train-replica): each is OOM-killed, then retried.
    code = r"""
import sys
if int(sys.argv[1]) == 0:
    chunks = [b"x" * (16 << 20) for _ in range(25)]
print("fits", flush=True)
"""
    wt = fake_template(FAST, fold_code=code, fold_args=["{{retries}}"], replica_args=["{{retries}}"], seeds=2,
                       control=True)
    res, _ = run(tmp_path, folds=1, parallelism=2, wt=wt, memory_limit_bytes=160 << 20,
                 params={"control-data": "synthetic:signal=0"})
    assert res.succeeded
    for node in ("train-fold(0)", "train-fold-seed1(0)", "control-fold(0)", "control-fold-seed1(0)"):
        first, second = res.nodes[node].attempts
        assert (first.exit_code, first.oom_killed, second.exit_code) == (137, True, 0), node
    assert [a.oom_kills for a in res.nodes["features-control"].attempts] == [None]  # CPU pods: no cgroup


def test_launch_drops_empty_flags_logs_the_attempt_and_execs_with_its_exit_code(tmp_path):
    assert drop_empty_flags(["--a", "", "--b", "1", "--c", "", "x"]) == ["--b", "1", "x"]
    (tmp_path / "fake_trainer.py").write_text("import sys, json; print(json.dumps(sys.argv[1:])); sys.exit(7)")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "workflows.launch", "fake_trainer", "--fold", "2", "--n-steps", "", "--attempt", "1"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert proc.returncode == 7
    first, second = proc.stdout.splitlines()
    assert json.loads(first) | {"time_unix_s": 0} == {
        "event": "attempt", "fold": "2", "attempt": 1, "module": "fake_trainer", "fold_dir": None, "time_unix_s": 0,
    }  # fmt: skip
    assert json.loads(second) == ["--fold", "2", "--attempt", "1"]


def test_local_tasks_share_the_cores_through_their_thread_count_unless_it_is_set(tmp_path, monkeypatch):
    from workflows.local import threads_per_task

    assert [threads_per_task(p, cores=8) for p in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    code = FOLD_CODE.replace('print(json.dumps({"event": "fake-train"',
                             'print(json.dumps({"threads": os.environ.get("OMP_NUM_THREADS")}), flush=True)\n'
                             'print(json.dumps({"event": "fake-train"')
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    res, log = run(tmp_path / "a", folds=1, parallelism=2, wt=fake_template(FAST, fold_code=code))
    assert res.succeeded and f'train-fold(0) {{"threads": "{threads_per_task(2)}"}}' in log.splitlines()
    res, log = run(tmp_path / "b", folds=1, parallelism=2, env={"OMP_NUM_THREADS": "7"},
                   wt=fake_template(FAST, fold_code=code))
    assert res.succeeded and 'train-fold(0) {"threads": "7"}' in log.splitlines()
