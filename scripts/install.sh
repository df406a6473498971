#!/usr/bin/env bash
# Idempotent set-up: a project-local virtualenv with the pinned CPU torch wheel and the project.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade "pip>=24"
# torch is pinned here (not in pyproject) so CI takes the CPU wheel on local disk; a GPU image pins its own.
.venv/bin/python -m pip install -q "torch==2.13.0" -e ".[dev]"
