"""The `--sim-only` benchmark command: JSON contract and error exits (not a timing test)."""
from __future__ import annotations

import json

from trainer.bench import main, run_sim_bench


def test_sim_bench_prints_one_json_line_with_env_steps_per_s(capsys) -> None:
    assert main(["--sim-only", "--n-envs", "64", "--steps", "5", "--device", "cpu", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["n_envs"] == 64 and result["steps"] == 5 and result["device"] == "cpu"
    assert result["env_steps_per_s"] > 0
    total = result["env_steps_per_s"] * result["seconds"]
    assert abs(total - 64 * 5) < 1e-6 * 320


def test_sim_bench_bad_usage_exits_2_with_one_line_error(capsys) -> None:
    assert main(["--n-envs", "8", "--steps", "2", "--device", "cpu", "--mode", "graph"]) == 2  # graph needs CUDA
    assert main(["--sim-only", "--n-envs", "0", "--steps", "2", "--device", "cpu"]) == 2
    assert main(["--sim-only", "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("trainer.bench: error: ") for line in err)


def test_sim_bench_function_returns_the_documented_keys() -> None:
    result = run_sim_bench(32, 3, "cpu", tape_rows=500)
    assert {"env_steps_per_s", "step_ms", "seconds", "cuda_graph"} <= set(result) and result["cuda_graph"] is False
