"""trainer.train's flags land in the config they name (the rest stays the preset's)."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer import train
from trainer.loop.config import preset


def _cfg(*extra: str):
    args = train.build_parser().parse_args(["--run-dir", "/tmp/x", "--fold", "0", "--folds", "3", *extra])
    return train.config_from_args(args)


def test_flags_override_their_config_fields_and_leave_the_preset_alone():
    cfg = _cfg("--preset", "h100", "--inventory-penalty", "0.05", "--compile", "sim", "--n-envs", "256",
               "--seed", "9", "--encoder", "gru")
    base = preset("h100")
    assert cfg.sim.inventory_penalty == 0.05 and cfg.sim.n_envs == 256 and cfg.sim.seed == 9
    assert cfg.loop.compile == "sim" and cfg.loop.seed == 9 and cfg.agent.encoder == "gru"
    assert cfg.replay == base.replay and cfg.agent.d_model == base.agent.d_model
    assert cfg.loop.n_steps == base.loop.n_steps == 25_000


def test_defaults_are_the_preset():
    cfg = _cfg("--preset", "smoke")
    assert cfg.sim.inventory_penalty == 0.0 and cfg.loop.compile == "none"
    assert cfg.sim == preset("smoke").sim


@pytest.mark.parametrize("bad", [["--compile", "everything"], ["--inventory-penalty", "x"]])
def test_malformed_flags_exit_2(bad):
    with pytest.raises(SystemExit) as exc:
        _cfg(*bad)
    assert exc.value.code == 2


def test_negative_inventory_penalty_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="inventory_penalty"):
        _cfg("--inventory-penalty", "-1")


def test_autotune_compiles_everything_and_is_refused_with_deterministic():
    assert _cfg("--preset", "h100", "--compile", "autotune").loop.compile == "autotune"
    with pytest.raises(ValueError, match="compile='autotune'.*deterministic"):
        _cfg("--preset", "h100", "--compile", "autotune", "--deterministic")


def _replica(*extra: str):
    args = train.build_parser().parse_args(["--run-dir", "/tmp/x", "--fold", "1", "--folds", "3", *extra])
    return train.replica_fold(args, train.config_from_args(args))


def test_replica_0_is_todays_fold_dir_and_config():
    cfg, path = _replica("--seed", "9")
    assert str(path) == "/tmp/x/fold1" and cfg == _cfg("--seed", "9")


def test_replica_s_writes_under_fold_seed_s_and_trains_with_base_seed_plus_s():
    cfg, path = _replica("--seed", "9", "--replica", "2")
    assert str(path) == "/tmp/x/fold1/seed2"
    assert cfg.loop.seed == 11 and cfg.sim.seed == 11
    base = _cfg("--seed", "9")
    assert cfg.replace(loop={"seed": 9}, sim={"seed": 9}) == base  # nothing else differs
    smoke = preset("smoke")  # without --seed the preset's seeds are the base
    cfg, _ = _replica("--preset", "smoke", "--replica", "3")
    assert (cfg.loop.seed, cfg.sim.seed) == (smoke.loop.seed + 3, smoke.sim.seed + 3)


@pytest.mark.parametrize(("run_dir", "fold_dir", "prefix"), [
    ("/m/abc", "/m/abc/fold1", "alpha-rl/abc/fold1"),  # the one-seed prefix, unchanged
    ("/m/abc", "/m/abc/fold1/seed2", "alpha-rl/abc/fold1/seed2"),
    ("/m/abc/control", "/m/abc/control/fold0", "alpha-rl/abc/control/fold0"),
    ("/m/abc/control", "/m/abc/control/fold0/seed1", "alpha-rl/abc/control/fold0/seed1"),
])
def test_s3_mirror_prefix_follows_the_fold_dir_so_seeds_and_markets_never_share_one(run_dir, fold_dir, prefix):
    assert train.s3_fold_prefix("/alpha-rl/", Path(run_dir), Path(fold_dir)) == prefix


def test_a_negative_replica_exits_2_naming_it(tmp_path, capsys):
    code = train.main(["--run-dir", str(tmp_path), "--fold", "0", "--folds", "2", "--replica", "-1"])
    assert code == 2 and "replica must be an integer >= 0, got -1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_compiled_runs_share_the_inductor_cache_beside_the_runs(tmp_path):
    """--compile puts torch.compile's cache at RUN/../inductor-cache (the PVC in the cluster): the second run of the
    same graphs adds no compiled graph to it, it loads the first run's (a retried pod skips most of the compile)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "ALPHA_RL_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    cache = tmp_path / "runs" / "inductor-cache"

    def run(name: str) -> set[str]:
        cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(tmp_path / "runs" / name), "--fold", "0",
               "--folds", "3", "--data", "synthetic:seed=3,days=2,signal=2", "--preset", "smoke", "--n-steps", "40",
               "--log-every", "20", "--checkpoint-every", "40", "--compile", "sim"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert [e["path"] for e in events if e["event"] == "compile_cache"] == [str(cache)]
        return {str(p.relative_to(cache)) for p in (cache / "fxgraph").rglob("*") if p.is_file()}

    first = run("a")
    assert first  # the compiled simulator step was written to the cache
    assert run("b") == first  # and found there by the next run: nothing new compiled


def test_fingerprint_ignores_where_kernels_run_but_not_what_they_compute():
    """A checkpoint resumes under another overlap or acting SM share (same values), not under another compile."""
    import dataclasses

    base = preset("h100")
    fp = train.fingerprint(dataclasses.asdict(base), "key", {})
    moved = base.replace(loop={"overlap": False, "act_sm_share": 1.0})
    assert train.fingerprint(dataclasses.asdict(moved), "key", {}) == fp
    other = base.replace(loop={"compile": "none" if base.loop.compile != "none" else "all"})
    assert train.fingerprint(dataclasses.asdict(other), "key", {}) != fp
