"""Checkpoint file format and run-directory store: layout, verification, fallback, retention, atomicity."""
from __future__ import annotations

import hashlib
import os
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.checkpoint.format import MAGIC, VERSION, CorruptCheckpoint, read_checkpoint
from trainer.checkpoint.store import (
    ConfigMismatch,
    checkpoint_name,
    fingerprint_mismatch,
    latest_valid,
    list_checkpoints,
    retention_victims,
    write_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = {
    "config": b'{"lr": 0.001}',
    "empty": b"",
    "netz/online": bytes(range(256)) * 3,
    "état": bytearray(b"\x00\xff" * 17),
}


def _plain(sections):
    return {k: bytes(v) for k, v in sections.items()}


def test_round_trip_preserves_step_sections_and_their_order(tmp_path):
    path = write_checkpoint(tmp_path, 1234, SECTIONS)
    assert path == tmp_path / "checkpoint-000000001234.bin"
    checkpoint = read_checkpoint(path)
    assert (checkpoint.step, checkpoint.version, checkpoint.path) == (1234, VERSION, path)
    assert checkpoint.sections == _plain(SECTIONS)
    assert list(checkpoint.sections) == list(SECTIONS)


def test_file_bytes_match_the_documented_layout(tmp_path):
    """Rebuild the file from the table in docs/checkpoints.md with struct + hashlib, byte for byte."""
    sections = {"a": b"xyz", "bc": b""}
    path = write_checkpoint(tmp_path, 7, sections)
    header = struct.pack("<IIQI", 0x464F5843, 1, 7, 2)
    body, digests = b"", b""
    for name, data in sections.items():
        section = struct.pack("<H", len(name)) + name.encode() + struct.pack("<Q", len(data)) + data
        digest = hashlib.sha256(section).digest()
        body += section + digest
        digests += digest
    expected = header + body + hashlib.sha256(header + digests).digest()
    assert path.read_bytes() == expected
    assert MAGIC == 0x464F5843 and path.read_bytes()[:4] == b"CXOF"


def test_truncation_at_every_offset_is_detected(tmp_path):
    path = write_checkpoint(tmp_path, 5, SECTIONS)
    full = path.read_bytes()
    damaged = tmp_path / "damaged.bin"
    for cut in range(len(full)):
        damaged.write_bytes(full[:cut])
        with pytest.raises(CorruptCheckpoint):
            read_checkpoint(damaged)


def test_every_single_bit_flip_is_detected(tmp_path):
    path = write_checkpoint(tmp_path, 5, {"a": b"payload" * 9, "b": b"\x01\x02"})
    full = bytearray(path.read_bytes())
    damaged = tmp_path / "damaged.bin"
    for offset in range(len(full)):
        for bit in range(8):
            full[offset] ^= 1 << bit
            damaged.write_bytes(full)
            full[offset] ^= 1 << bit
            with pytest.raises(CorruptCheckpoint):
                read_checkpoint(damaged)


def test_trailing_bytes_bad_magic_and_unknown_version_name_their_rule(tmp_path):
    full = write_checkpoint(tmp_path, 5, {"a": b"x"}).read_bytes()
    cases = {
        "trailing bytes": full + b"\x00",
        "bad magic": b"PK\x03\x04" + full[4:],
        "unknown format version 2": full[:4] + struct.pack("<I", 2) + full[8:],
        "cannot fit": full[:16] + struct.pack("<I", 2**32 - 1) + full[20:],
    }
    for rule, data in cases.items():
        damaged = tmp_path / "damaged.bin"
        damaged.write_bytes(data)
        with pytest.raises(CorruptCheckpoint, match=rule) as caught:
            read_checkpoint(damaged)
        assert str(damaged) in str(caught.value)


def test_huge_data_length_is_an_overrun_not_an_allocation(tmp_path):
    full = bytearray(write_checkpoint(tmp_path, 5, {"a": b"x" * 100}).read_bytes())
    data_len_at = 20 + 2 + 1  # header, name_len, name "a"
    full[data_len_at : data_len_at + 8] = struct.pack("<Q", 2**63)
    damaged = tmp_path / "damaged.bin"
    damaged.write_bytes(full)
    with pytest.raises(CorruptCheckpoint, match="overruns") as caught:
        read_checkpoint(damaged)
    assert caught.value.offset == data_len_at


def test_latest_valid_falls_back_past_a_damaged_newest_file_and_logs_why(tmp_path):
    """Truncations and bit flips at many offsets of the newest file: always the previous one, intact."""
    older = {"state": os.urandom(3000), "meta": b"older"}
    newer = {"state": os.urandom(3000), "meta": b"newer"}
    write_checkpoint(tmp_path, 100, older)
    newest = write_checkpoint(tmp_path, 200, newer)
    good = newest.read_bytes()
    rng = random.Random(0)
    damages = [good[:cut] for cut in rng.sample(range(len(good)), 60)]
    for offset in rng.sample(range(len(good)), 60):
        flipped = bytearray(good)
        flipped[offset] ^= 1 << rng.randrange(8)
        damages.append(bytes(flipped))
    for damaged in damages:
        newest.write_bytes(damaged)
        skipped = []
        checkpoint = latest_valid(tmp_path, log=lambda path, reason: skipped.append((path, reason)))
        assert checkpoint is not None and checkpoint.step == 100
        assert checkpoint.sections == older
        assert len(skipped) == 1 and skipped[0][0] == newest and "corrupt at byte" in skipped[0][1]
    newest.write_bytes(good)
    assert latest_valid(tmp_path, log=pytest.fail).sections == newer


def test_latest_valid_is_none_when_nothing_verifies(tmp_path):
    assert latest_valid(tmp_path / "absent") is None
    (tmp_path / checkpoint_name(3)).write_bytes(b"PK\x03\x04 a zip file, not a checkpoint" * 4)
    skipped = []
    assert latest_valid(tmp_path, log=lambda p, r: skipped.append(r)) is None
    assert len(skipped) == 1 and "bad magic" in skipped[0]


def test_latest_valid_skips_a_file_whose_name_disagrees_with_its_header_step(tmp_path):
    write_checkpoint(tmp_path, 100, {"a": b"1"})
    moved = write_checkpoint(tmp_path, 200, {"a": b"2"})
    moved.rename(tmp_path / checkpoint_name(300))
    skipped = []
    checkpoint = latest_valid(tmp_path, log=lambda p, r: skipped.append(r))
    assert checkpoint.step == 100
    assert skipped == ["header step 200 disagrees with the file name (step 300)"]


def test_retention_keeps_the_newest_k_files(tmp_path):
    for step in (1, 2, 3, 10, 11):
        write_checkpoint(tmp_path, step, {"s": str(step).encode()})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 11]
    for step in (12, 13, 14):
        write_checkpoint(tmp_path, step, {"s": b""}, keep=3)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [12, 13, 14]


def test_writing_an_older_step_deletes_newer_files_a_resume_rejected(tmp_path):
    write_checkpoint(tmp_path, 100, {"s": b"100"})
    write_checkpoint(tmp_path, 200, {"s": b"200"})
    (tmp_path / checkpoint_name(200)).write_bytes(b"torn")  # the resume fell back to 100
    write_checkpoint(tmp_path, 150, {"s": b"150"})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [100, 150]
    assert retention_victims([1, 2, 3, 4, 9], written_step=4, keep=2) == [1, 2, 9]


def test_keep_below_two_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match="keep must be an int >= 2.*got 1"):
        write_checkpoint(tmp_path, 1, {"a": b""}, keep=1)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_value_errors_naming_the_value(tmp_path):
    with pytest.raises(ValueError, match="step must be"):
        write_checkpoint(tmp_path, -1, {"a": b""})
    with pytest.raises(ValueError, match=r"sections\['a'\]: data must be bytes-like, got str"):
        write_checkpoint(tmp_path, 1, {"a": "text"})
    with pytest.raises(ValueError, match="non-empty str"):
        write_checkpoint(tmp_path, 1, {"": b""})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_file_and_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, 1, {"a": b"one"})

    class DiskFull(OSError):
        pass

    def fail_midway(out, step, sections):
        out.write(b"partial bytes")
        raise DiskFull("no space left on device")

    monkeypatch.setattr("trainer.checkpoint.store.write_stream", fail_midway)
    with pytest.raises(DiskFull):
        write_checkpoint(tmp_path, 2, {"a": b"two"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(1)]


def test_a_crash_between_write_and_rename_leaves_an_ignored_temp_that_the_next_write_removes(tmp_path):
    """A real crash: a child process is SIGKILLed right where it would rename its complete temp file."""
    write_checkpoint(tmp_path, 1, {"a": b"one"})
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        import trainer.checkpoint.store as store
        store.os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
        store.write_checkpoint({str(tmp_path)!r}, 2, {{"a": b"two"}})
        """
    )
    result = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, timeout=60)
    assert result.returncode == -9, result.stderr.decode()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0].startswith(".checkpoint-000000000002.bin.tmp-")
    assert names[1] == checkpoint_name(1)
    temp = tmp_path / names[0]
    assert read_checkpoint(temp).sections == {"a": b"two"}  # complete, just never renamed
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert latest_valid(tmp_path, log=pytest.fail).sections == {"a": b"one"}
    write_checkpoint(tmp_path, 3, {"a": b"three"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(1), checkpoint_name(3)]


def test_fingerprint_mismatch_names_nested_dotted_fields():
    expected = {"agent": {"n_atoms": 51, "encoder": {"kind": "mamba", "d_model": 128}}, "n_envs": 64, "flag": True}
    found = {"agent": {"n_atoms": 21, "encoder": {"kind": "mamba", "d_model": 128}, "extra": 1}, "n_envs": 64, "flag": 1}
    assert fingerprint_mismatch(expected, found) == ["agent.extra", "agent.n_atoms", "flag"]
    assert fingerprint_mismatch(expected, expected) == []
    assert fingerprint_mismatch({"a": {"b": 1}}, {"a": 5}) == ["a"]


def test_config_mismatch_message_names_fields_and_both_values():
    expected, found = {"agent": {"n_atoms": 51}, "w": 8}, {"agent": {"n_atoms": 21}}
    error = ConfigMismatch("run/fold0/checkpoint-000000000100.bin", fingerprint_mismatch(expected, found), expected, found)
    assert isinstance(error, ValueError)
    assert error.fields == ["agent.n_atoms", "w"]
    assert str(error) == (
        "run/fold0/checkpoint-000000000100.bin: checkpoint does not match this run; differing fields: "
        "agent.n_atoms (run 51, checkpoint 21), w (run 8, checkpoint <absent>)"
    )


def test_a_folds_retention_and_latest_valid_never_see_its_seed_subfolders(tmp_path):
    # <sha>/fold0/ (seed index 0) holds <sha>/fold0/seed1/ (seed index 1): each folder's store is its own.
    fold0, seed1 = tmp_path / "fold0", tmp_path / "fold0" / "seed1"
    for step in (100, 200, 300):
        write_checkpoint(seed1, step, {"s": b"seed1"})
    write_checkpoint(fold0, 5, {"s": b"seed0"})
    write_checkpoint(fold0, 7, {"s": b"seed0"})
    write_checkpoint(fold0, 9, {"s": b"seed0"})  # retention in fold0 (keep 2) must not delete seed1's files
    assert [s for s, _ in list_checkpoints(fold0)] == [7, 9]
    assert [s for s, _ in list_checkpoints(seed1)] == [200, 300]
    newest = latest_valid(fold0, log=lambda p, why: None)
    assert newest is not None and newest.step == 9 and newest.path.parent == fold0  # not seed1's step 300
    write_checkpoint(seed1, 400, {"s": b"seed1"})  # and the other way round
    assert [s for s, _ in list_checkpoints(fold0)] == [7, 9]
