"""The `--sim-only` benchmark command: JSON contract and error exits (not a timing test)."""
from __future__ import annotations

import json
import time

from trainer.bench import main, run_sim_bench
from trainer.sim import Simulator


def test_sim_bench_env_steps_per_s_agrees_with_simulator_steps_timed_from_outside(capsys, monkeypatch) -> None:
    """env_steps_per_s against a clock the bench does not own: the simulator's own step calls, timed by the test.
    The last --steps calls are the timed ones (warm-up comes first); 64 envs advance per call."""
    calls = []
    real_step = Simulator.step

    def timed_step(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = real_step(self, *args, **kwargs)
        calls.append((t0, time.perf_counter()))
        return out

    monkeypatch.setattr(Simulator, "step", timed_step)
    t0 = time.perf_counter()
    assert main(["--sim-only", "--n-envs", "64", "--steps", "5", "--device", "cpu", "--json"]) == 0
    wall_s = time.perf_counter() - t0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["n_envs"] == 64 and result["steps"] == 5 and result["device"] == "cpu"
    assert len(calls) == 20 + 5  # default warm-up, then exactly --steps timed steps
    span_s = calls[-1][1] - calls[-5][0]
    assert 64 * 5 / wall_s <= result["env_steps_per_s"] <= 64 * 5 / span_s
    assert span_s <= result["seconds"] <= wall_s


def test_sim_bench_bad_usage_exits_2_with_one_line_error(capsys) -> None:
    assert main(["--n-envs", "8", "--steps", "2", "--device", "cpu", "--mode", "graph"]) == 2  # graph needs CUDA
    assert main(["--sim-only", "--n-envs", "0", "--steps", "2", "--device", "cpu"]) == 2
    assert main(["--sim-only", "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("trainer.bench: error: ") for line in err)


def test_sim_bench_function_returns_the_documented_keys() -> None:
    result = run_sim_bench(32, 3, "cpu", tape_rows=500)
    assert {"env_steps_per_s", "step_ms", "seconds", "cuda_graph"} <= set(result) and result["cuda_graph"] is False
