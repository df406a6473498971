"""The full-step benchmark and its profile (trainer.bench): shapes of the output, not speeds."""
from __future__ import annotations

import json
import time

from trainer import bench
from trainer.bench import PIECES, main, profile_step, time_pieces
from trainer.loop.step import REGIONS


class _TimedCalls:
    """Wraps a step callable: records (start, end) of every call, forwards every other attribute."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.calls.append((t0, time.perf_counter()))
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_full_step_bench_rates_agree_with_step_calls_timed_from_outside(capsys, monkeypatch) -> None:
    """The rates must match a clock the bench does not own: `steps` real step calls, each of n_envs transitions,
    inside the span the test saw them run (first call's start to last call's end) and the whole main() call."""
    timed = {}
    real = bench._bench_trainer

    def spy(*args, **kwargs):
        trainer = real(*args, **kwargs)
        if not timed:  # the timed trainer is built first; count_step_flops' uncompiled twin comes after
            trainer.step_fn = timed["step"] = _TimedCalls(trainer.step_fn)
        return trainer

    monkeypatch.setattr(bench, "_bench_trainer", spy)
    t0 = time.perf_counter()
    assert main(["--n-envs", "16", "--steps", "3", "--device", "cpu", "--preset", "smoke", "--window-rows", "400",
                 "--json"]) == 0
    wall_s = time.perf_counter() - t0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # --mode both on CPU runs eager only (side by side needs CUDA)
    r = json.loads(lines[0])
    assert r["mode"] == "eager" and r["n_envs"] == 16 and r["steps"] == 3
    calls = timed["step"].calls
    assert len(calls) == 3  # the timed loop ran exactly --steps real steps
    span_s = calls[-1][1] - calls[0][0]
    assert 3 / wall_s <= r["steps_per_s"] <= 3 / span_s
    assert 16 * 3 / wall_s <= r["transitions_per_s"] <= 16 * 3 / span_s  # 16 transitions per step, not 1 or 32
    assert r["flops_per_step"] > 0
    assert r["act_sms"] is None  # no green context on CPU


def test_full_step_bench_refuses_an_sm_share_outside_0_1_with_exit_2(capsys) -> None:
    assert main(["--n-envs", "16", "--steps", "3", "--device", "cpu", "--preset", "smoke", "--act-sm-share", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "act_sm_share must be in (0, 1]" in err[0]


def test_full_step_graph_mode_on_cpu_exits_2_with_one_line_error(capsys) -> None:
    assert main(["--n-envs", "16", "--steps", "3", "--device", "cpu", "--preset", "smoke", "--mode", "graph"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "graph mode needs" in err[0]


def test_profile_attributes_every_op_of_a_step_to_a_region() -> None:
    r = profile_step(16, "cpu", "smoke", steps=2, window_rows=400)
    regions = r["regions"]
    assert set(regions) == {*REGIONS, "unlabelled"}
    assert sum(v["kernels"] for v in regions.values()) == r["kernels_per_step"]
    for name in ("act", "sim", "store", "sample", "update", "priorities"):
        assert regions[name]["kernels"] > 0, name  # every labelled part of the step ran ops
    assert r["top_kernels"] and all(k["calls_per_step"] > 0 for k in r["top_kernels"])


def test_pieces_prints_one_json_line_with_a_time_for_every_piece(capsys) -> None:
    assert main(["--pieces", "--n-envs", "16", "--steps", "2", "--device", "cpu", "--preset", "smoke",
                 "--window-rows", "400", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["bench"] == "pieces" and r["mode"] == "eager"  # --mode both on CPU: eager
    assert list(r["ms"]) == list(PIECES) and all(v > 0 for v in r["ms"].values())


def test_pieces_in_graph_mode_on_cpu_exits_2_with_one_line_error(capsys) -> None:
    assert main(["--pieces", "--n-envs", "16", "--steps", "2", "--device", "cpu", "--preset", "smoke",
                 "--mode", "graph"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "graph mode needs" in err[0]


def test_pieces_update_the_learner_once_per_call_of_a_piece_that_learns(monkeypatch) -> None:
    """Each learning piece really runs an update: step, learner, apply (2 warm-up + 3 timed calls each), and the
    one `backward` that makes apply's gradient, which updates nothing; act_and_store, sample, loss_gradient none."""
    seen = {}
    real = bench._bench_trainer

    def spy(*args, **kwargs):
        trainer = real(*args, **kwargs)
        seen["learner"], seen["before"] = trainer.step_fn.learner, int(trainer.step_fn.learner.update_step)
        return trainer

    monkeypatch.setattr(bench, "_bench_trainer", spy)
    time_pieces(16, 3, "cpu", "smoke", window_rows=400)
    assert int(seen["learner"].update_step) - seen["before"] == 3 * (2 + 3)


def test_env_count_defaults_to_the_presets(capsys) -> None:
    """Without --n-envs the benchmark steps as many envs as the preset trains with (smoke: 64), not a copy of its own."""
    for name, want in (("smoke", 64), ("h100", 1024)):
        assert main(["--sim-only", "--steps", "2", "--device", "cpu", "--preset", name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["n_envs"] == want


def test_mirror_augment_flag_overrides_the_presets_and_the_timed_step_samples_both_markets(capsys, monkeypatch) -> None:
    """--mirror-augment / --no-mirror-augment reach the timed trainer: its step then holds the (2T, F) table of both
    markets (or none), and the JSON line says which step was timed."""
    built = []
    real = bench._bench_trainer
    monkeypatch.setattr(bench, "_bench_trainer", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    for flag, want in (("--mirror-augment", True), ("--no-mirror-augment", False)):
        built.clear()
        assert main(["--n-envs", "16", "--steps", "2", "--device", "cpu", "--preset", "h100", "--encoder", "gru",
                     "--window-rows", "400", "--json", flag]) == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["mirror_augment"] is want
        table = built[0].step_fn.both_markets
        assert (table is not None and table.shape == (800, 23)) if want else table is None
