import os

import pytest

from trainer.fsutil import atomic_write, atomic_write_bytes, atomic_write_text, publish_directory


def test_atomic_write_replaces_the_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "result.json"
    atomic_write_text(path, "old")
    atomic_write_bytes(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_a_writer_that_fails_midway_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_text(path, "complete old file")

    def fail_midway(f):
        f.write(b"torn")
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        atomic_write(path, fail_midway)
    assert path.read_text() == "complete old file"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_atomic_write_uses_the_callers_temp_name(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append(os.path.basename(src)), real_replace(src, dst)))
    atomic_write(tmp_path / "checkpoint.bin", lambda f: f.write(b"x"), temp=tmp_path / ".checkpoint.bin.tmp-abc")
    assert seen == [".checkpoint.bin.tmp-abc"]
    assert (tmp_path / "checkpoint.bin").read_bytes() == b"x"


def test_publish_directory_moves_a_complete_directory_into_place(tmp_path):
    build = tmp_path / ".build-1"
    build.mkdir()
    (build / "manifest.json").write_text("{}")
    assert publish_directory(build, tmp_path / "entry")
    assert (tmp_path / "entry" / "manifest.json").read_text() == "{}"
    assert not build.exists()


def test_publish_directory_returns_false_when_another_process_published_first(tmp_path):
    winner = tmp_path / "entry"
    winner.mkdir()
    (winner / "manifest.json").write_text("winner")
    loser = tmp_path / ".build-2"
    loser.mkdir()
    (loser / "manifest.json").write_text("loser")
    assert publish_directory(loser, winner) is False
    assert (winner / "manifest.json").read_text() == "winner"
    assert (loser / "manifest.json").read_text() == "loser"  # left for the caller to discard
