"""`python -m trainer.data`: inspect JSON lines, exit code 2 with one clear line on bad input, help."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer.data.__main__ import main


def _lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_inspect_prints_one_json_line_per_dbn_file_with_book_fields(shared_data, capsys):
    assert main(["inspect", str(shared_data / "dbn")]) == 0
    rows = _lines(capsys)
    assert len(rows) == 6
    mbp = next(r for r in rows if r["path"].endswith("test_data.mbp-10.dbn"))
    assert mbp == {
        "path": str(shared_data / "dbn" / "test_data.mbp-10.dbn"), "format": "dbn", "schema": "mbp-10",
        "version": 2, "records": 2, "start_ns": 1609160400000704060, "end_ns": 1609160400000750544,
        "symbols": ["ESH1"], "levels": 10, "crossed": 0,
    }
    trades = next(r for r in rows if r["path"].endswith("test_data.trades.v3.dbn.zst"))
    assert trades["schema"] == "trades" and trades["version"] == 3 and "levels" not in trades


def test_inspect_mbo_reports_rebuilt_book_states_and_preopen_crossings(shared_data, capsys):
    assert main(["inspect", str(shared_data / "es-mbo" / "esh4-glbx-mdp3-20231225.mbo.dbn.zst")]) == 0
    (row,) = _lines(capsys)
    assert (row["schema"], row["records"], row["book_states"], row["symbols"]) == ("mbo", 68_792, 47_022, ["ESH4"])
    assert row["crossed"] > 0  # the indicative pre-open book (inspect reports, it does not judge)


def test_inspect_lobster_zip_is_one_input(shared_data, capsys):
    assert main(["inspect", str(shared_data / "lobster")]) == 0  # the folder holding the sample zip
    (row,) = _lines(capsys)
    assert (row["format"], row["records"], row["levels"], row["crossed"], row["symbols"]) == (
        "lobster", 155_935, 5, 0, ["AMZN"])


def test_bad_input_exits_2_with_one_line_naming_file_and_rule(shared_data, tmp_path, capsys):
    bad = tmp_path / "x.dbn"
    bad.write_bytes((shared_data / "dbn" / "test_data.trades.dbn").read_bytes()[:-5])
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "truncated record" in err[0]


def test_module_entry_point_exit_code_and_help():
    r = subprocess.run([sys.executable, "-m", "trainer.data", "inspect", "/nonexistent/file.dbn"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = subprocess.run([sys.executable, "-m", "trainer.data", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "inspect" in r.stdout and "synth" in r.stdout and "bench" in r.stdout


@pytest.mark.slow  # runs the synthetic generator (numba compile on a cold cache)
def test_synth_subcommand_dispatches_to_the_generator(tmp_path, capsys):
    pytest.importorskip("trainer.data.synth")
    code = main(["synth", "--out", str(tmp_path / "syn"), "--days", "1", "--seed", "2"])
    assert code == 0
    assert list((tmp_path / "syn").rglob("*.dbn*"))
