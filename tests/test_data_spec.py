"""--data SPEC strings: parser, percent-encoded paths, loading each kind, fingerprints, synthetic cache."""
from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from trainer.data.spec import control_spec, describe_spec, load_tape, parse_spec, quote_path, spec_from_dirs
from trainer.errors import InputError, exit_code_for


def test_parser_splits_items_and_types_options():
    p = parse_spec("dbn-mbo:/a/x.dbn.zst,/a/y.dbn.zst;symbol=ESH4,levels=5")
    assert (p.kind, p.paths) == ("dbn-mbo", ["/a/x.dbn.zst", "/a/y.dbn.zst"])
    assert p.options == {"symbol": "ESH4", "levels": 5}
    p = parse_spec("dbn:mbp10=/m,trades=/t,tick=0.25,tick_value=12.5")
    assert p.options == {"mbp10": "/m", "trades": "/t", "tick": 0.25, "tick_value": 12.5}
    assert parse_spec("synthetic").options == {}
    assert parse_spec("synthetic:seed=3,signal=0").options == {"seed": 3, "signal": 0.0}
    assert parse_spec("lobster:/d/AMZN.zip;levels=3").paths == ["/d/AMZN.zip"]


def test_paths_with_commas_semicolons_and_percent_round_trip_through_quoting():
    weird = "/data/a,b;c%d=e"
    p = parse_spec(f"lobster:{quote_path(weird)};levels=2")
    assert p.paths == [weird] and p.options == {"levels": 2}
    s = spec_from_dirs("/x,1/mbp", "/x;2/trades")
    p = parse_spec(s)
    assert (p.options["mbp10"], p.options["trades"]) == ("/x,1/mbp", "/x;2/trades")


@pytest.mark.parametrize("bad, rule", [
    ("", "empty data spec"),
    ("csv:/a", "unknown data spec kind"),
    ("dbn:mbp10=/a", "needs trades="),
    ("dbn:mbp10=/a,trades=/b,colour=red", "unknown key 'colour'"),
    ("dbn-mbo:", "at least 1 path"),
    ("lobster:/a,/b", "1 path"),
    ("lobster:/a;levels=x", "not a valid int"),
    ("lobster:/a;levels=0", "levels must be >= 1"),
    ("synthetic:seed=1,seed=2", "given twice"),
    ("dbn-mbo:/a,,/b", "empty item"),
])
def test_malformed_specs_are_input_errors(bad, rule):
    with pytest.raises(InputError, match=rule) as ei:
        parse_spec(bad)
    assert exit_code_for(ei.value) == 2


def test_dbn_spec_loads_the_pair_and_matches_the_reader(shared_data):
    d = shared_data / "dbn"
    tape = load_tape(spec_from_dirs(d / "test_data.mbp-10.dbn", d / "test_data.trades.dbn"))
    assert tape.instrument.symbol == "ESH1" and len(tape.book) == 2 and len(tape.trades) == 2
    tape = load_tape(f"dbn:mbp10={d / 'test_data.mbp-10.dbn'},trades={d / 'test_data.trades.dbn'},tick_value=50")
    assert tape.instrument.tick_value == 50.0


def test_dbn_mbo_and_lobster_specs_load(shared_data, tmp_path):
    es = shared_data / "es-mbo" / "esh4-glbx-mdp3-20231225.mbo.dbn.zst"
    assert len(load_tape(f"dbn-mbo:{es};symbol=ESH4,levels=2").book.bid_px[0]) == 2
    src = shared_data / "lobster" / "LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
    odd = tmp_path / "a,b;c"
    odd.mkdir()
    shutil.copy(src, odd / src.name)
    tape = load_tape(f"lobster:{quote_path(str(odd / src.name))};levels=1")
    assert tape.book.levels == 1 and len(tape.book) == 155_935


def test_describe_spec_normalises_and_hashes_every_input_file(shared_data, tmp_path, monkeypatch):
    d = (shared_data / "dbn").resolve()  # the spec holds resolved paths (../shared may be a symlink)
    monkeypatch.chdir(shared_data)
    a = describe_spec("dbn:trades=dbn/test_data.trades.dbn,mbp10=dbn/test_data.mbp-10.dbn")
    b = describe_spec(spec_from_dirs(d / "test_data.mbp-10.dbn", d / "test_data.trades.dbn"))
    assert a == b
    assert a["spec"] == f"dbn:mbp10={d / 'test_data.mbp-10.dbn'},trades={d / 'test_data.trades.dbn'}"
    f0 = a["files"][0]
    assert f0["sha256"] == hashlib.sha256((d / "test_data.mbp-10.dbn").read_bytes()).hexdigest()
    # A changed byte changes the fingerprint.
    (tmp_path / "m.dbn").write_bytes((d / "test_data.mbp-10.dbn").read_bytes()[:-1] + b"\x01")
    c = describe_spec(spec_from_dirs(tmp_path / "m.dbn", d / "test_data.trades.dbn"))
    assert c["files"][0]["sha256"] != f0["sha256"]


@pytest.mark.slow  # the generator's numba kernels compile on a cold cache (~20-30 s on 2 busy cores)
def test_synthetic_spec_builds_once_into_the_cache_and_reads_through_dbn(tmp_path):
    synth = pytest.importorskip("trainer.data.synth")
    spec = "synthetic:seed=5,days=1,signal=0"
    tape = load_tape(spec, work_dir=tmp_path)
    entry = tmp_path / "synthetic" / "seed=5,days=1,signal=0.0"
    assert (entry / "manifest.json").is_file()
    assert sorted(p.name for p in (tmp_path / "synthetic").iterdir()) == [entry.name]  # no temp leftovers
    assert len(tape.book) > 0 and len(tape.trades) > 0
    assert tape.instrument.tick_value == synth.SynthConfig().tick_value
    mtime = entry.stat().st_mtime_ns
    again = load_tape(spec, work_dir=tmp_path)
    assert entry.stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(again.book.bid_px, tape.book.bid_px)
    desc = describe_spec(spec, work_dir=tmp_path)
    assert desc["spec"] == "synthetic:days=1,seed=5,signal=0.0" and len(desc["files"]) >= 2


def test_synthetic_defaults_come_from_the_generator(tmp_path, monkeypatch):
    synth = pytest.importorskip("trainer.data.synth")
    import inspect

    sig = inspect.signature(synth.write_synthetic).parameters
    calls = []

    def fake(out, **kw):
        calls.append(kw)
        raise RuntimeError("stop")

    fake.__wrapped__ = synth.write_synthetic  # inspect.signature follows it: same defaults as the real one
    monkeypatch.setattr(synth, "write_synthetic", fake)
    monkeypatch.setenv("ALPHA_RL_DATA_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="stop"):
        load_tape("synthetic:days=2")
    assert calls == [{"seed": sig["seed"].default, "days": 2, "signal": sig["signal"].default}]
    assert not any(tmp_path.joinpath("synthetic").iterdir())  # the failed build left nothing behind


@pytest.mark.parametrize(("spec", "control"), [
    ("synthetic", "synthetic:signal=0"),
    ("synthetic:seed=3,days=4,signal=2", "synthetic:seed=3,days=4,signal=0"),
    ("synthetic:days=2;seed=5", "synthetic:days=2,seed=5,signal=0"),
    ("synthetic:signal=0", "synthetic:signal=0"),
])
def test_control_spec_is_the_same_synthetic_market_with_signal_0(spec, control):
    assert control_spec(spec) == control
    kept = {k: v for k, v in parse_spec(spec).options.items() if k != "signal"}
    assert parse_spec(control).options == {**kept, "signal": 0.0}


@pytest.mark.parametrize("spec", ["dbn:mbp10=/a,trades=/b", "lobster:/x.zip", "dbn-mbo:/a.dbn"])
def test_real_data_has_no_automatic_control(spec):
    assert control_spec(spec) is None


def test_control_of_a_malformed_spec_is_an_input_error():
    with pytest.raises(InputError, match="unknown key 'signl'"):
        control_spec("synthetic:signl=2")
