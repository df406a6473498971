"""The trainer image recipe and its build script (static checks: no Docker daemon in CI)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from workflows.submit import DEFAULT_REGISTRY
from workflows.template import DEFAULTS

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def test_dockerfile_pins_a_cuda_pytorch_base_runs_non_root_and_enters_the_trainer():
    text = (DOCKER / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG BASE=(\S+)$", text, flags=re.M)
    # exact version tag (or digest), never a floating tag
    assert re.fullmatch(r"pytorch/pytorch(:\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime|@sha256:[0-9a-f]{64})", base)
    assert re.search(r"^FROM \$\{BASE\}$", text, flags=re.M)
    (user,) = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert user == f"{DEFAULTS.run_as_user}:{DEFAULTS.run_as_user}"
    assert 'ENTRYPOINT ["python", "-m", "trainer.train"]' in text
    assert "pip install ." in text and "-e" not in re.findall(r"pip install (\S+)", text)


def test_build_script_tags_by_sha_skips_existing_tags_and_refuses_a_dirty_tree():
    text = (DOCKER / "build.sh").read_text()
    assert subprocess.run(["bash", "-n", str(DOCKER / "build.sh")]).returncode == 0
    assert 'IMAGE="$REGISTRY/alpha-rl-trainer:$SHA"' in text
    assert f"REGISTRY=${{REGISTRY:-{DEFAULT_REGISTRY}}}" in text  # same default as workflows.submit
    assert 'docker manifest inspect "$IMAGE"' in text
    assert "git status --porcelain" in text
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(DOCKER / "build.sh")]).returncode == 0
