"""`python -m workflows.submit`: dry-run output, refusals and their exit codes, sha resolution, parameters."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workflows.submit import _parser, resolve_sha, seeds_and_control, workflow_parameters
from workflows.template import render

ROOT = Path(__file__).resolve().parents[1]
SHA = "feedbee1234"


def cli(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout_s: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "workflows.submit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=cwd, env={**os.environ, **(env or {})}, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGTERM makes a --local runner stop its task processes (grace period) before it exits.
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
        pytest.fail(f"submit timed out after {timeout_s}s:\n{out[-3000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_dry_run_prints_the_template_and_a_workflow_referencing_it():
    proc = cli("--folds", "2", "--sha", SHA, "--n-steps", "500", "--namespace", "research", "--no-control",
               "--dry-run")
    assert proc.returncode == 0, proc.stderr
    template, workflow = yaml.safe_load_all(proc.stdout)
    assert template["kind"] == "WorkflowTemplate" and template["metadata"]["name"] == "alpha-rl"
    assert workflow["kind"] == "Workflow"
    assert workflow["metadata"]["generateName"] == "alpha-rl-"
    assert workflow["metadata"]["namespace"] == "research"
    assert workflow["metadata"]["labels"]["alpha-rl/git-sha"] == SHA
    assert workflow["spec"]["workflowTemplateRef"] == {"name": "alpha-rl"}
    params = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
    assert params == {"git-sha": SHA, "folds": "2", "image": f"ghcr.io/alpha-rl/alpha-rl-trainer:{SHA}", "n-steps": "500"}


def test_synthetic_data_adds_the_control_market_by_default_with_its_signal_0_spec():
    proc = cli("--folds", "2", "--sha", SHA, "--seeds", "3", "--data", "synthetic:seed=3,days=4,signal=2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    template, workflow = yaml.safe_load_all(proc.stdout)
    assert template == render(seeds=3, control=True)
    assert workflow["spec"]["workflowTemplateRef"] == {"name": "alpha-rl-seeds3-control"}
    params = {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}
    assert params["data"] == "synthetic:seed=3,days=4,signal=2"
    assert params["control-data"] == "synthetic:seed=3,days=4,signal=0"


@pytest.mark.parametrize(("args", "seeds", "control", "note"), [
    ([], 1, True, "seeds: 1; control market: on, synthetic:signal=0 (default for synthetic data)"),
    (["--no-control", "--seeds", "2"], 2, False, "seeds: 2; control market: off (given)"),
    (["--data", "lobster:/x.zip"], 1, False, "seeds: 1; control market: off (default for real data)"),
])
def test_seeds_and_control_flags_resolve_with_the_data_kind(args, seeds, control, note):
    ns = _parser().parse_args(args)
    got = seeds_and_control(ns, workflow_parameters(ns, SHA))
    assert got == (seeds, control, {"control-data": "synthetic:signal=0"} if control else {}, note)


@pytest.mark.parametrize(("args", "message"), [
    (["--data", "lobster:/x.zip", "--control"], "real data has no automatic control market"),
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
])
def test_bad_seeds_or_a_control_on_real_data_exit_2_naming_the_flag(args, message):
    proc = cli("--folds", "2", "--sha", SHA, "--dry-run", *args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""


def test_size_parameters_reach_the_workflow_only_when_given_so_the_preset_decides_the_rest():
    ns = _parser().parse_args(["--preset", "smoke", "--n-steps", "77"])
    params = workflow_parameters(ns, SHA)
    assert params["preset"] == "smoke" and params["n-steps"] == "77"
    assert "n-backtests" not in params and "per-capacity" not in params and "seed" not in params
    ns = _parser().parse_args(["--image", "reg/x:1"])
    params = workflow_parameters(ns, SHA)
    assert params["image"] == "reg/x:1" and "preset" not in params and "n-steps" not in params
    # Not given, the template's "" makes workflows.launch drop the trainer flag: the preset's value stands.
    defaults = {p["name"]: p.get("value") for p in render()["spec"]["arguments"]["parameters"]}
    assert [defaults[k] for k in ("n-steps", "n-backtests", "per-capacity", "seed", "compile")] == [""] * 5


def test_compile_reaches_the_trainer_only_when_given():
    assert workflow_parameters(_parser().parse_args(["--compile", "autotune"]), SHA)["compile"] == "autotune"
    assert "compile" not in workflow_parameters(_parser().parse_args([]), SHA)
    train = next(t for t in render()["spec"]["templates"] if t["name"] == "train-fold")
    args = train["container"]["args"]
    assert args[args.index("--compile") + 1] == "{{workflow.parameters.compile}}"


@pytest.mark.parametrize(("flags", "train_window"), [(["--train-window", "anchored"], "anchored"), ([], "rolling")])
def test_train_window_reaches_the_trainer_as_its_folds_flag_and_otherwise_the_preset_decides(flags, train_window):
    """submit --train-window -> workflow parameter -> the train-fold pod's `--folds.train-window` -> the trainer's
    config, through the local runner's substitution and workflows.launch; not given, launch drops the `""` pair."""
    from trainer.cli import parse
    from workflows.launch import drop_empty_flags
    from workflows.local import substitute

    rendered = render()
    params = {p["name"]: p.get("value") for p in rendered["spec"]["arguments"]["parameters"]}
    params.update(workflow_parameters(_parser().parse_args(flags), SHA))
    assert params["train-window"] == (train_window if flags else "")
    train = next(t for t in rendered["spec"]["templates"] if t["name"] == "train-fold")
    variables = {**{f"workflow.parameters.{k}": v for k, v in params.items()}, "inputs.parameters.fold": "1",
                 "retries": "0"}
    module, *args = drop_empty_flags(substitute(train["container"]["args"], variables))
    assert module == "trainer.train" and ("--folds.train-window" in args) == bool(flags)
    cfg = parse(args).config
    assert cfg.folds.train_window == train_window and cfg.folds.fold == 1


def test_choices_are_the_trainers_own_and_submitting_imports_no_torch():
    """submit offers the trainer's choices (trainer.settings, torch-free), not copies; importing it loads no torch."""
    from trainer.settings import COMPILE_CHOICES, FOLD_MODES, PRESET_NAMES, TRAIN_WINDOWS

    by_dest = {a.dest: a.choices for a in _parser()._actions}
    assert by_dest["compile"] is COMPILE_CHOICES and by_dest["fold_mode"] is FOLD_MODES
    assert by_dest["train_window"] is TRAIN_WINDOWS
    assert by_dest["preset"] is PRESET_NAMES
    with pytest.raises(SystemExit):
        _parser().parse_args(["--preset", "h200"])
    probe = subprocess.run([sys.executable, "-c", "import sys, workflows.submit; print('torch' in sys.modules)"],
                           capture_output=True, text=True, cwd=ROOT, check=True)
    assert probe.stdout.strip() == "False"


@pytest.mark.parametrize("folds", ["0", "-1"])
def test_fewer_than_one_fold_is_refused_with_exit_2(folds):
    proc = cli("--folds", folds, "--sha", SHA, "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: ValueError: --folds must be >= 1, got {folds}"


def test_no_kubeconfig_gives_a_clear_one_line_error_and_exit_2(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    proc = cli("--sha", SHA, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no Kubernetes cluster configured")
    assert "--local" in lines[0] and "Traceback" not in proc.stderr


def test_bad_sha_is_refused():
    proc = cli("--sha", "HEAD~1", "--dry-run")
    assert proc.returncode == 2 and "--sha must be 7-40" in proc.stderr


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_sha_defaults_to_head_and_a_dirty_tree_is_refused_unless_allowed(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("1")
    _git(repo, "add", "a.txt")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "c")
    head = _git(repo, "rev-parse", "HEAD")
    assert resolve_sha(repo, None, allow_dirty=False) == head
    (repo / "a.txt").write_text("2")
    with pytest.raises(ValueError, match="uncommitted changes.*a.txt"):
        resolve_sha(repo, None, allow_dirty=False)
    assert resolve_sha(repo, None, allow_dirty=True) == head
    assert resolve_sha(repo, "abcdef1", allow_dirty=False) == "abcdef1"
    with pytest.raises(ValueError, match="cannot read git HEAD"):
        resolve_sha(tmp_path / "not-a-repo", None, allow_dirty=False)


@pytest.mark.slow
def test_local_smoke_run_of_the_real_trainer_dag(tmp_path):
    proc = cli("--folds", "2", "--local", "--sha", SHA, "--run-root", str(tmp_path), "--n-steps", "64", timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for fold in range(2):
        json.loads((tmp_path / SHA / f"fold{fold}" / "result.json").read_text())
    assert (tmp_path / SHA / "summary.json").exists()
    assert any(line.startswith("train-fold(1) ") for line in proc.stdout.splitlines())


@pytest.mark.slow
def test_local_run_with_two_seeds_and_the_control_market_writes_every_result_where_the_layout_says(tmp_path):
    data = "synthetic:seed=3,days=2,signal=2"
    proc = cli("--folds", "2", "--seeds", "2", "--local", "--sha", SHA, "--run-root", str(tmp_path), "--device", "cpu",
               "--n-steps", "64", "--n-backtests", "16", "--per-capacity", "2048", "--data", data,
               env={"ALPHA_RL_DATA_DIR": str(tmp_path / "data")}, timeout_s=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "seeds: 2; control market: on, synthetic:seed=3,days=2,signal=0 (default for synthetic data)"
    run = tmp_path / SHA
    results = {}
    for market in ("", "control/"):
        for fold in range(2):
            for seed_dir in ("", "/seed1"):
                rel = f"{market}fold{fold}{seed_dir}"
                results[rel] = json.loads((run / rel / "result.json").read_text())
                assert results[rel]["fold"] == fold and results[rel]["env_steps"] == 64
    # the trainer of seed index S started with seed = base (0) + S, on its market's data
    starts = {}
    for line in lines:
        node, _, rest = line.partition(" ")
        if rest.startswith("{") and '"event":"start"' in rest.replace(" ", ""):
            starts[node] = json.loads(rest)
    for node, seed, market_data in (("train-fold(1)", 0, data), ("train-fold-seed1(1)", 1, data),
                                    ("control-fold(1)", 0, "synthetic:seed=3,days=2,signal=0"),
                                    ("control-fold-seed1(1)", 1, "synthetic:seed=3,days=2,signal=0")):
        assert (starts[node]["seed"], starts[node]["data"]) == (seed, market_data), node
    for fold in range(2):
        assert results[f"fold{fold}"]["weights_sha256"] != results[f"fold{fold}/seed1"]["weights_sha256"]
        assert results[f"fold{fold}"]["feature_key"] != results[f"control/fold{fold}"]["feature_key"]
        assert results[f"control/fold{fold}"]["feature_key"] == results[f"control/fold{fold}/seed1"]["feature_key"]
    assert (run / "summary.json").exists()
