from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from trainer.features import cache
from trainer.features.cache import FEATURE_CODE_VERSION, feature_key, load_or_build
from trainer.features.config import FeatureConfig

LOBSTER = "lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
CFG = FeatureConfig(clock_events=100)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spec(shared_data) -> str:
    return f"lobster:{shared_data / LOBSTER}"


@pytest.fixture(scope="module")
def prebuilt(spec, tmp_path_factory):
    """(cache_dir, FeatureSet) built once per module; tests copy the entry instead of rebuilding."""
    cache_dir = tmp_path_factory.mktemp("fxcache")
    fs, skipped = load_or_build(spec, CFG, cache_dir)
    assert skipped is False
    return cache_dir, fs


def _copy_entry(prebuilt, dest: Path):
    src, fs = prebuilt
    shutil.copytree(src / fs.key, dest / fs.key)
    return fs


def _digest(fs) -> str:
    """One hash over every array and scalar a FeatureSet carries."""
    h = hashlib.sha256()
    for name, a in sorted({"raw": fs.raw, **fs.decision.arrays()}.items()):
        h.update(name.encode() + a.dtype.str.encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())
    h.update(json.dumps([fs.names, fs.key, fs.instrument.symbol, fs.decision.tick_value,
                         fs.decision.trade_radius_ticks]).encode())
    return h.hexdigest()


def _listing(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir())


def test_second_call_skips_and_returns_identical_data(spec, tmp_path):
    built, skipped = load_or_build(spec, CFG, tmp_path)
    assert skipped is False and len(built.key) == 64
    loaded, skipped = load_or_build(spec, CFG, tmp_path)
    assert skipped is True and _digest(loaded) == _digest(built)
    assert _listing(tmp_path) == [built.key]  # no temp dirs left behind


def test_manifest_records_what_the_entry_holds_and_arrays_load_without_pickle(prebuilt):
    cache_dir, fs = prebuilt
    entry = cache_dir / fs.key
    m = json.loads((entry / "manifest.json").read_text())
    assert m["key"] == fs.key and m["spec"].startswith("lobster:") and m["rows"] == fs.raw.shape[0]
    assert m["features"] == len(m["names"]) == fs.raw.shape[1] and m["names"] == list(fs.names)
    assert FeatureConfig.from_dict(m["config"]) == CFG and m["instrument"]["symbol"] == "AMZN"
    assert m["versions"]["feature_code"] == FEATURE_CODE_VERSION and m["created"].endswith("+00:00")
    assert len(m["data"]["files"][0]["sha256"]) == 64
    for name, meta in m["arrays"].items():
        arr = np.load(entry / name, allow_pickle=False)
        assert arr.dtype != object and list(arr.shape) == meta["shape"]
    assert np.array_equal(np.load(entry / "raw.npy"), fs.raw)


def test_key_covers_data_content_config_and_code_version(monkeypatch):
    desc = {"spec": "lobster:/a.zip", "kind": "lobster", "files": [{"path": "/a.zip", "bytes": 3, "sha256": "aa"}]}
    base = feature_key(desc, CFG)
    other_bytes = {**desc, "files": [{"path": "/a.zip", "bytes": 3, "sha256": "ab"}]}
    assert feature_key(other_bytes, CFG) != base
    assert feature_key(desc, FeatureConfig(clock_events=101)) != base
    assert feature_key(desc, FeatureConfig(clock_events=100)) == base  # equal configs, equal keys
    monkeypatch.setattr(cache, "FEATURE_CODE_VERSION", FEATURE_CODE_VERSION + 1)
    assert feature_key(desc, CFG) != base


@pytest.mark.parametrize("damage", ["missing_array", "truncated_array", "garbage_manifest", "wrong_key"])
def test_broken_entry_is_rebuilt(spec, prebuilt, tmp_path, damage):
    fs = _copy_entry(prebuilt, tmp_path)
    assert load_or_build(spec, CFG, tmp_path)[1] is True  # the copy is a valid entry before the damage
    entry = tmp_path / fs.key
    if damage == "missing_array":
        (entry / "decision.sell_vol.npy").unlink()
    elif damage == "truncated_array":
        data = (entry / "raw.npy").read_bytes()
        (entry / "raw.npy").write_bytes(data[: len(data) // 2])
    elif damage == "garbage_manifest":
        (entry / "manifest.json").write_text("{not json")
    else:
        m = json.loads((entry / "manifest.json").read_text())
        (entry / "manifest.json").write_text(json.dumps({**m, "key": "0" * 64}))
    rebuilt, skipped = load_or_build(spec, CFG, tmp_path)
    assert skipped is False and _digest(rebuilt) == _digest(fs)
    assert _listing(tmp_path) == [fs.key]  # the broken copy was moved aside and deleted


def test_losing_the_publish_race_discards_own_copy_and_returns_the_winners(spec, tmp_path, monkeypatch):
    real_build = cache.build_feature_set
    calls = []

    def build_while_another_process_publishes(tape, cfg, key=""):
        calls.append(key)
        if len(calls) == 1:  # the "other process" runs its whole load_or_build while we are building
            winner, skipped = load_or_build(spec, cfg, tmp_path)
            assert skipped is False
        return real_build(tape, cfg, key=key)

    monkeypatch.setattr(cache, "build_feature_set", build_while_another_process_publishes)
    fs, skipped = load_or_build(spec, CFG, tmp_path)
    assert len(calls) == 2 and skipped is True
    assert _listing(tmp_path) == [fs.key]  # the loser's temp dir is gone


RACER = textwrap.dedent("""
    import hashlib, json, sys, time
    from pathlib import Path
    import numpy as np
    from trainer.features.cache import load_or_build
    from trainer.features.config import FeatureConfig

    spec, cache_dir, barrier, me = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    (barrier / me).touch()
    deadline = time.time() + 60
    while len(list(barrier.iterdir())) < 2 and time.time() < deadline:  # start both builds together
        time.sleep(0.001)
    import trainer.features.cache as cache
    real_build, built = cache.build_feature_set, []
    cache.build_feature_set = lambda *a, **k: built.append(1) or real_build(*a, **k)
    fs, skipped = load_or_build(spec, FeatureConfig(clock_events=100), cache_dir)
    h = hashlib.sha256(fs.raw.tobytes())
    for name, a in sorted(fs.decision.arrays().items()):
        h.update(a.tobytes())
    print(json.dumps({"skipped": skipped, "digest": h.hexdigest(), "key": fs.key, "built": bool(built)}))
""")


def test_two_processes_building_the_same_key_at_once_publish_exactly_one_entry(spec, tmp_path):
    cache_dir, barrier = tmp_path / "fxcache", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, spec, str(cache_dir), str(barrier), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["skipped"] for o in outs) == [False, True]  # exactly one build won
    # Usually both built (the barrier lines them up) and the loser threw its copy away; either way the
    # published winner built.
    assert all(o["built"] for o in outs if not o["skipped"])
    print("both processes built:", all(o["built"] for o in outs))
    assert outs[0]["digest"] == outs[1]["digest"] and outs[0]["key"] == outs[1]["key"]
    assert _listing(cache_dir) == [outs[0]["key"]]  # no torn dir, no leftover temp dirs
    fs, skipped = load_or_build(spec, CFG, cache_dir)
    assert skipped is True and fs.key == outs[0]["key"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.features", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_cli_prints_one_json_line_and_skips_the_second_time(spec, tmp_path):
    first = _cli("--data", spec, "--cache-dir", str(tmp_path), "--clock-events", "200")
    assert first.returncode == 0, first.stderr
    line = json.loads(first.stdout)
    assert set(line) == {"key", "rows", "features", "skipped"} and line["skipped"] is False
    assert 700 < line["rows"] < 800 and line["features"] == 23
    second = json.loads(_cli("--data", spec, "--cache-dir", str(tmp_path), "--clock-events", "200").stdout)
    assert second == {**line, "skipped": True}


@pytest.mark.parametrize("args", [
    ("--data", "lobster:/no/such/file.zip"),
    ("--data", "parquet:/x"),
    ("--data", "lobster:/x.zip", "--clock-events", "0"),
    ("--clock-events", "5"),
])
def test_cli_bad_input_exits_2_with_one_line_error(tmp_path, args):
    if "--data" in args:
        args = (*args, "--cache-dir", str(tmp_path))
    proc = _cli(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert "error:" in lines[-1]
    if "--data" in args:  # our own errors are one line; argparse prints its usage above its error line
        assert len(lines) == 1, proc.stderr


def test_cli_bench_prints_a_timing_table(spec):
    proc = _cli("bench", "--data", spec, "--tile", "2", "--repeat", "1", "--clock-events", "50")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "311,870 book rows" in lines[0] and [ln.split()[0] for ln in lines[2:]] == [
        "decision_rows", "build_decision_tape", "compute_features"]
