#!/usr/bin/env bash
# GPU tests and benchmarks, as run on the H200 through the `device` tool (docs/BENCHMARKS.md).
# Usage: bash scripts/gpu-check.sh OUTDIR [tests|bench|all]
set -uo pipefail
out=${1:-/tmp/gpu-check}; what=${2:-all}
mkdir -p "$out"
if [ -d .whl ]; then  # wheels carried to a machine without registry access
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/machine.txt"
date -u | tee -a "$out/machine.txt"
if [ "$what" != bench ]; then
  # One process per file: a failed capture can leave the CUDA RNG in a capturing state for later tests.
  for f in $(grep -l "mark.gpu" tests/test_*.py); do
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider "$f" 2>&1 | tee -a "$out/gpu_tests.log" | tail -3
  done
fi
if [ "$what" != tests ]; then
  for n in 1024 16384; do
    timeout 120 python3 -m trainer.bench --sim-only --n-envs $n --steps 2000 --device cuda --json | tee -a "$out/bench.log"
  done
  timeout 600 python3 -m trainer.bench --sweep --steps 300 --device cuda --compile all 2>&1 | tee "$out/sweep.log" | tail -14
  timeout 300 python3 -m trainer.bench --pieces --n-envs 1024 --steps 300 --device cuda --compile all 2>&1 \
    | tee "$out/pieces.log" | tail -9
fi
