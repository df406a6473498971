"""The trainer image recipe, its lock file and its build script (no Docker daemon in CI; pins resolve on the index)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from workflows.submit import DEFAULT_REGISTRY
from workflows.template import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
LOCK = DOCKER / "requirements.lock"
MEASURED = {"torch": "2.11.0", "triton": "3.6.0"}
"""The builds of every H200 measurement in docs/BENCHMARKS.md (torch 2.11.0+cu130, Triton 3.6.0), typed here by hand."""


def test_dockerfile_pins_a_cuda_pytorch_base_runs_non_root_and_enters_the_trainer():
    text = (DOCKER / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG BASE=(\S+)$", text, flags=re.M)
    # exact version tag (or digest), never a floating tag
    assert re.fullmatch(r"pytorch/pytorch(:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime|@sha256:[0-9a-f]{64})", base)
    assert base == "pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime"  # the measured torch, CUDA 13.0
    assert re.search(r"^FROM \$\{BASE\}$", text, flags=re.M)
    (user,) = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert user == f"{DEFAULTS.run_as_user}:{DEFAULTS.run_as_user}"
    assert 'ENTRYPOINT ["python", "-m", "trainer.train"]' in text
    assert "pip install --no-deps -r docker/requirements.lock" in text and "pip install --no-deps ." in text
    assert "pip check" in text and "-e" not in re.findall(r"pip install (\S+)", text)
    # the build refuses a base with another torch / CUDA / Triton than the measured ones
    assert "('2.11.0+cu130', '13.0', '3.6.0')" in text


def test_build_script_tags_by_sha_skips_existing_tags_and_refuses_a_dirty_tree():
    text = (DOCKER / "build.sh").read_text()
    assert subprocess.run(["bash", "-n", str(DOCKER / "build.sh")]).returncode == 0
    assert 'IMAGE="$REGISTRY/alpha-rl-trainer:$SHA"' in text
    assert f"REGISTRY=${{REGISTRY:-{DEFAULT_REGISTRY}}}" in text  # same default as workflows.submit
    assert 'docker manifest inspect "$IMAGE"' in text
    assert "git status --porcelain" in text
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(DOCKER / "build.sh")]).returncode == 0


def _pins(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier  # exactly one specifier per line ...
        assert spec.operator == "==" and "*" not in spec.version, f"{LOCK.name}:{n}: {line!r} is not an exact pin"
        assert not req.extras and req.marker is None and req.url is None, f"{LOCK.name}:{n}: {line!r}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{LOCK.name}:{n}: {req.name} pinned twice"
        pins[name] = spec.version
    return pins


def test_lock_pins_every_package_exactly_with_the_measured_torch_and_triton():
    pins = _pins(LOCK.read_text())
    assert {k: pins[k] for k in MEASURED} == MEASURED
    # every runtime dependency of the project is in the lock, at a version its pyproject bound accepts
    deps = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    for dep in deps:
        name = canonicalize_name(dep.name)
        assert name in pins, f"{dep.name} (pyproject.toml) is not pinned in {LOCK.name}"
        assert dep.specifier.contains(pins[name], prereleases=True), f"{dep.name}=={pins[name]} breaks {dep}"
    # the docs name the CUDA version the image runs
    docs = (ROOT / "docs" / "orchestration.md").read_text()
    assert "torch 2.11.0+cu130" in docs and "CUDA 13.0" in docs and "Triton 3.6.0" in docs


def test_lock_parser_refuses_a_range_or_a_duplicate():
    with pytest.raises(AssertionError, match="not an exact pin"):
        _pins("numpy>=2.0\n")
    with pytest.raises(AssertionError, match="pinned twice"):
        _pins("PyYAML==6.0.4\npyyaml==6.0.4\n")


def _index_reachable(url: str = "https://pypi.org/simple/pip/") -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except OSError:
        return False


def _resolve(lock: Path) -> subprocess.CompletedProcess:
    """Resolve every pin of `lock` on the index for the image's platform, one by one (--no-deps), installing nothing.
    --isolated: no local pip config, constraints or wheel folders, only the index. Where the index serves PEP 658
    metadata pip fetches only that; an index without it (as on the machine this was written on) makes pip
    download each wheel (about 0.9 GB in all) and discard it."""
    # manylinux x86_64 tags up to glibc 2.35 (assumed present in the base image; not checked without Docker)
    tags = [f"manylinux_2_{v}_x86_64" for v in (35, 34, 31, 28, 27, 17)] + ["manylinux2014_x86_64"]
    platforms = [f"--platform={tag}" for tag in tags]
    return subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--no-cache-dir", "--only-binary=:all:", "--python-version=3.11", "--implementation=cp", *platforms,
         "-r", str(lock)], capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not _index_reachable(), reason="the package index (pypi.org) is not reachable from here")
def test_every_pin_of_the_lock_resolves_on_the_index_and_a_broken_pin_fails(tmp_path):
    proc = _resolve(LOCK)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    would = re.search(r"^Would install (.+)$", proc.stdout, flags=re.M)
    assert would is not None, proc.stdout[-2000:]
    assert len(would.group(1).split()) == len(_pins(LOCK.read_text()))  # every pin, none skipped
    broken = tmp_path / "broken.lock"
    broken.write_text(LOCK.read_text().replace("triton==3.6.0", "triton==3.6.99"))
    proc = _resolve(broken)
    assert proc.returncode != 0 and "triton==3.6.99" in proc.stderr
