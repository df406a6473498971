"""trainer.train's command line (trainer/cli.py): every config field is a dotted flag, the earlier flags still work,
the preset gives the defaults and explicit flags win, and values a config refuses are refused naming the field."""
from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from trainer.checkpoint.resume import fingerprint
from trainer.cli import ALIASES, parse
from trainer.data.spec import describe_spec
from trainer.loop.config import SECTIONS, TrainConfig, fingerprint_config, preset
from trainer.settings import PRESET_NAMES
from trainer.train import main

BASE = ["--run-dir", "/tmp/x", "--fold", "0", "--folds", "3"]


def _cfg(*extra: str) -> TrainConfig:
    return parse([*BASE, *extra]).config


def test_flags_override_their_config_fields_and_leave_the_preset_alone():
    cfg = _cfg("--preset", "h100", "--inventory-penalty", "0.05", "--compile", "sim", "--n-envs", "256",
               "--seed", "9", "--encoder", "gru")
    base = preset("h100")
    assert cfg.sim.inventory_penalty == 0.05 and cfg.sim.n_envs == 256 and cfg.sim.seed == 9
    assert cfg.loop.compile == "sim" and cfg.loop.seed == 9 and cfg.agent.encoder == "gru"
    assert cfg.replay == base.replay and cfg.agent.d_model == base.agent.d_model
    assert cfg.loop.n_steps == base.loop.n_steps == 5_000


def test_defaults_are_the_preset():
    cfg = _cfg("--preset", "smoke")
    assert cfg.sim.inventory_penalty == 0.6 and cfg.loop.compile == "none"
    assert dataclasses.replace(cfg, folds=preset("smoke").folds) == preset("smoke")


# A valid value other than the default, per field type; fields whose type cannot say which values are valid
# are listed by name.
NAMED_VALUES = {
    ("features", "clock"): ["time"], ("sim", "on_expiry"): ["market"], ("agent", "encoder"): ["gru"],
    ("agent", "scan"): ["parallel"], ("loop", "device"): ["cpu"], ("sim", "magnitudes"): ["0.25", "0.5", "1.0"],
    ("sim", "order_types"): ["market", "ioc", "post_only"],
}


def _other_value(section: str, name: str, default: object, annotation: object) -> tuple[list[str], object]:
    """(command-line words, parsed value) of a valid value different from `default`."""
    if (section, name) in NAMED_VALUES:
        words = NAMED_VALUES[section, name]
        numeric = all(w.replace(".", "", 1).isdigit() for w in words)
        value = (tuple(float(w) for w in words) if numeric else tuple(words)) if len(words) > 1 else words[0]
        return words, value
    choices = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
    if choices:
        other = next(c for c in choices if c != default)
        return [other], other
    if isinstance(default, tuple):
        value = (*default[:-1], default[-1] + 1)  # distinct ints stay distinct
        return [str(v) for v in value], value
    if isinstance(default, float):
        value = default / 2 if default else 0.5
        return [repr(value)], value
    if isinstance(default, int):
        return [str(default + 1)], default + 1
    if default is None:  # the optional floats (ReplayConfig.alpha_end)
        return ["0.5"], 0.5
    if isinstance(default, str):
        return [default + ":x=1"], default + ":x=1"
    raise AssertionError(f"no test value for {section}.{name}={default!r}")


def _leaf_fields(cfg: TrainConfig):
    hints = {sec: typing.get_type_hints(type(getattr(cfg, sec))) for sec in SECTIONS}
    for sec in SECTIONS:
        for f in dataclasses.fields(getattr(cfg, sec)):
            yield sec, f.name, getattr(getattr(cfg, sec), f.name), hints[sec][f.name]


def test_every_config_field_has_a_dotted_flag_that_sets_only_that_field():
    base = preset("smoke").replace(agent={"mirror": False, "mirror_augment": False})  # both exclude forecast_lags > 0
    seen = 0
    for sec, name, default, annotation in _leaf_fields(base):
        flag = f"--{sec}.{name.replace('_', '-')}"
        if isinstance(default, bool):
            words, value = [flag if not default else f"--{sec}.no-{name.replace('_', '-')}"], not default
        else:
            values, value = _other_value(sec, name, default, annotation)
            words = [flag, *values]
        got = _cfg("--preset", "smoke", "--agent.no-mirror", "--agent.no-mirror-augment", *words)
        want = base.replace(**{sec: {name: value}})
        assert getattr(getattr(got, sec), name) == value, (words, getattr(getattr(got, sec), name))
        assert got == dataclasses.replace(want, folds=got.folds) and (sec == "folds" or got.folds == base.folds), words
        seen += 1
    assert seen >= 90  # every section's every field; the top-level `data` is below
    assert _cfg("--data", "synthetic:seed=7").data == "synthetic:seed=7"


def test_dotted_flags_from_the_issue_and_the_last_of_a_flag_and_its_alias_wins():
    cfg = _cfg("--preset", "h100", "--sim.n-envs", "2048", "--agent.lr", "1e-4")
    assert cfg.sim.n_envs == 2048 and cfg.agent.lr == 1e-4
    assert _cfg("--n-envs", "8", "--sim.n-envs", "32").sim.n_envs == 32
    assert _cfg("--sim.n-envs", "32", "--n-backtests=8").sim.n_envs == 8


def test_every_alias_reaches_the_field_it_names():
    for alias, targets in ALIASES.items():
        if alias in ("--fold", "--folds"):
            continue  # BASE gives both; checked by every parse
        if alias == "--deterministic":
            cfg, words = _cfg(alias), []
        else:
            sec, name = targets[0][2:].split(".")
            default = getattr(getattr(preset("smoke"), sec), name.replace("-", "_"))
            hint = typing.get_type_hints(type(getattr(preset("smoke"), sec)))[name.replace("-", "_")]
            words, value = _other_value(sec, name.replace("-", "_"), default, hint)
            cfg = _cfg(alias, *words)
        for target in targets:
            sec, name = target[2:].split(".")
            got = getattr(getattr(cfg, sec), name.replace("-", "_"))
            assert got == (True if not words else value), (alias, target, got)


def test_fold_and_folds_are_required(capsys):
    for argv in (["--run-dir", "/x", "--folds", "3"], ["--run-dir", "/x", "--fold", "0"]):
        with pytest.raises(SystemExit) as exc:
            parse(argv)
        assert exc.value.code == 2
    assert "--fold (or --folds.fold) is required" in capsys.readouterr().err


def test_help_lists_every_section_and_the_presets(capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for sec in SECTIONS:
        assert f"{sec} options" in text, sec
    assert "--sim.n-envs" in text and "--agent.lr" in text and "--folds.embargo-rows" in text
    assert "{" + ",".join(PRESET_NAMES) + "}" in text


def test_train_window_flag_picks_anchored_folds_and_defaults_to_rolling():
    assert _cfg("--folds.train-window", "anchored").folds.train_window == "anchored"
    assert _cfg().folds.train_window == _cfg("--preset", "h100").folds.train_window == "rolling"


def test_a_train_window_the_folds_do_not_know_is_refused_naming_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"FoldConfig.train_window must be one of \('rolling', 'anchored'\), "
                                         r"got 'expanding'"):
        preset("smoke").replace(folds={"train_window": "expanding"})


@pytest.mark.parametrize("bad", [["--compile", "everything"], ["--inventory-penalty", "x"], ["--preset", "h200"],
                                 ["--sim.no-such-field", "1"], ["--folds.train-window", "expanding"]])
def test_malformed_flags_exit_2(bad):
    with pytest.raises(SystemExit) as exc:
        _cfg(*bad)
    assert exc.value.code == 2


@pytest.mark.parametrize(("flags", "message"), [
    (["--inventory-penalty", "-1"], "SimConfig.inventory_penalty"),
    (["--fold", "3"], r"FoldConfig.fold must be in \[0, folds=3\), got 3"),
    (["--embargo-rows", "-1"], "FoldConfig.embargo_rows"),
    (["--loop.device", "gpu"], "LoopConfig.device"),
    (["--eval.n-envs", "0"], "EvalConfig.n_envs"),
])
def test_a_value_a_config_refuses_is_refused_with_exit_2_naming_the_field(flags, message, capsys):
    assert _exit_code([*BASE, *flags]) == 2
    assert re.search(message, _unboxed(capsys.readouterr().err))


def _exit_code(argv: list[str]) -> int:
    """trainer.train's exit status for a command line that must be refused before any work."""
    try:
        return main(argv)
    except SystemExit as exc:  # usage errors and values refused while tyro builds a section
        return exc.code


def _unboxed(text: str) -> str:
    """tyro's error box as one line: frame characters dropped, wrapped lines joined."""
    return " ".join(text.replace("│", " ").replace("╭", " ").replace("╰", " ").split())


@pytest.mark.parametrize(("flags", "message"), [
    (["--preset", "h100", "--compile", "autotune", "--deterministic"], "compile='autotune'.*deterministic"),
    (["--preset", "smoke", "--mode", "graph"], "mode='graph'.*device='cpu'"),
    # capacity 64 is raised to 4 x 64 envs = 256 slots: a batch of 257 does not fit
    (["--per-capacity", "64", "--batch-size", "257"], "batch_size=257 exceeds the replay's capacity 256"),
])
def test_cross_section_checks_refuse_impossible_combinations_with_exit_2(flags, message, capsys):
    assert _exit_code([*BASE, *flags]) == 2
    assert re.search(message, _unboxed(capsys.readouterr().err))
    with pytest.raises(ValueError, match=message):  # the same check where the config is built in code
        preset("h100").replace(loop={"compile": "autotune", "deterministic": True}) if "autotune" in message \
            else preset("smoke").replace(loop={"mode": "graph"}) if "graph" in message \
            else preset("smoke").replace(replay={"capacity": 64}, agent={"batch_size": 257})


def test_cross_section_checks_accept_the_edge_cases():
    assert _cfg("--preset", "h100", "--compile", "autotune").loop.compile == "autotune"
    assert _cfg("--per-capacity", "64", "--batch-size", "256").agent.batch_size == 256
    assert _cfg("--preset", "h100", "--mode", "graph").loop.mode == "graph"


def test_dbn_data_dirs_become_the_data_spec_the_reader_loads(shared_data):
    """--mbp10-data-dir/--trades-data-dir (the seed system's flags) on the real DBN sample in ../shared/data."""
    d = shared_data / "dbn"
    cfg = _cfg("--mbp10-data-dir", str(d / "test_data.mbp-10.dbn"), "--trades-data-dir", str(d / "test_data.trades.dbn"))
    assert cfg.data.startswith("dbn:mbp10=") and describe_spec(cfg.data)["kind"] == "dbn"


def test_data_dirs_make_the_data_spec_and_exclude_data(tmp_path):
    with pytest.raises(ValueError, match="go together"):
        _cfg("--mbp10-data-dir", str(tmp_path))
    with pytest.raises(ValueError, match="either --data or"):
        _cfg("--data", "synthetic", "--mbp10-data-dir", str(tmp_path), "--trades-data-dir", str(tmp_path))


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


def _fp(cfg: TrainConfig) -> dict:
    return fingerprint(fingerprint_config(cfg.to_dict()), "key", {})


def test_fingerprint_ignores_where_kernels_run_but_not_what_they_compute():
    """A checkpoint resumes under another overlap or acting SM share (same values), not under another compile."""
    base = preset("h100")
    moved = base.replace(loop={"overlap": False, "act_sm_share": 1.0})
    assert _fp(moved) == _fp(base)
    other = base.replace(loop={"compile": "none" if base.loop.compile != "none" else "all"})
    assert _fp(other) != _fp(base)


def test_fingerprint_holds_fold_geometry_eval_and_chain_but_not_the_fold_index_or_the_chain_wait():
    """The fold index is the fold's identity (chain mode compares fold N with fold N-1), and the wait for fold N-1
    changes nothing computed; fold geometry, evaluation and chain settings change the result."""
    base = preset("smoke")
    assert _fp(base.replace(folds={"fold": 2})) == _fp(base)
    assert _fp(base.replace(folds={"chain_wait_seconds": 60.0})) == _fp(base)
    for section, change in (("folds", {"folds": 4}), ("folds", {"embargo_rows": 3}), ("folds", {"fold_mode": "chain"}),
                            ("folds", {"train_window": "anchored"}), ("eval", {"n_envs": 8}),
                            ("chain", {"shrink_alpha": 0.5})):
        fp = _fp(base.replace(**{section: change}))
        (name,) = change
        assert fp != _fp(base) and fp["config"][section][name] == change[name], (section, change)


def _replica(*extra: str):
    inv = parse([*BASE, "--fold", "1", *extra])  # the last --fold wins
    return inv.run.seeded(inv.config), inv.run.fold_dir(inv.config.folds.fold)


def test_replica_0_is_todays_fold_dir_and_config():
    cfg, path = _replica("--seed", "9")
    assert str(path) == "/tmp/x/fold1" and cfg == _cfg("--seed", "9", "--fold", "1")


def test_replica_s_writes_under_fold_seed_s_and_trains_with_base_seed_plus_s():
    cfg, path = _replica("--seed", "9", "--replica", "2")
    assert str(path) == "/tmp/x/fold1/seed2"
    assert cfg.loop.seed == 11 and cfg.sim.seed == 11
    base = _cfg("--seed", "9", "--fold", "1")
    assert cfg.replace(loop={"seed": 9}, sim={"seed": 9}) == base  # nothing else differs
    smoke = preset("smoke")  # without --seed the preset's seeds are the base
    cfg, _ = _replica("--preset", "smoke", "--replica", "3")
    assert (cfg.loop.seed, cfg.sim.seed) == (smoke.loop.seed + 3, smoke.sim.seed + 3)


@pytest.mark.parametrize(("run_dir", "replica", "prefix"), [
    ("/m/abc", "0", "alpha-rl/abc/fold1"),  # the one-seed prefix, unchanged
    ("/m/abc", "2", "alpha-rl/abc/fold1/seed2"),
    ("/m/abc/control", "0", "alpha-rl/abc/control/fold1"),
    ("/m/abc/control", "1", "alpha-rl/abc/control/fold1/seed1"),
])
def test_s3_mirror_prefix_follows_the_fold_dir_so_seeds_and_markets_never_share_one(run_dir, replica, prefix):
    inv = parse(["--run-dir", run_dir, "--fold", "1", "--folds", "3", "--replica", replica, "--s3-prefix", "/alpha-rl/"])
    assert inv.run.s3_fold_prefix(1) == prefix


def test_a_negative_replica_exits_2_naming_it(tmp_path, capsys):
    code = main(["--run-dir", str(tmp_path), "--fold", "0", "--folds", "2", "--replica", "-1"])
    assert code == 2 and "replica must be an integer >= 0, got -1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
