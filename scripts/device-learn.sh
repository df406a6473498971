#!/usr/bin/env bash
# Learning experiments on the lent H200 machine (docs/RESULTS.md): CPU smoke variants on its cores and h100 variants
# on its GPU, at once. Usage: bash scripts/device-learn.sh OUT SECONDS "SMOKE_ARGS" "H100_ARGS"
# (SMOKE_ARGS / H100_ARGS: scripts/experiment.py arguments without --out; empty skips that part).
# .whl (carried, git-ignored) holds the wheels the lent image lacks: tyro, docstring_parser, typeguard, databento-dbn,
# arch, zstandard, and boto3, botocore, s3transfer, jmespath (trainer.checkpoint imports boto3).
# 12 h100 processes at once train 15 (seed, fold) runs in about 500 s cold (docs/RESULTS.md §11): plan ~9 runs, with
# their --eval-variant runs, per call. While the machine is still warm (it is given back after 30 s idle), a second call
# with the same --variant and other --eval-variant reuses the trained folds: a finished base fold exits at once
# (done_already) and only the new evaluations run (docs/RESULTS.md §12).
set -uo pipefail
out=$1; secs=$2; smoke=$3; h100=$4
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD
fi
# One compile cache for every process: the runs of a call compile the same graphs (docs/RESULTS.md §5: 18 processes
# compiling cold took ~180 s). Keep 6-9 processes per call: evaluation runs eagerly and slows down on shared cores.
export PYTHONUNBUFFERED=1 ALPHA_RL_DATA_DIR=${ALPHA_RL_DATA_DIR:-$PWD/.devdata/data} \
  TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
mkdir -p "$out"
if [ -n "$h100" ]; then
  (eval timeout "$secs" python3 scripts/experiment.py --out /tmp/exp-h100 --preset h100 $h100 > "$out/h100.log" 2>&1;
   eval python3 scripts/experiment.py --out /tmp/exp-h100 --preset h100 $h100 --table-only > "$out/h100-table.md" 2>&1) &
fi
if [ -n "$smoke" ]; then
  (export OMP_NUM_THREADS=1; eval timeout "$secs" python3 scripts/experiment.py --out /tmp/exp-smoke --preset smoke $smoke > "$out/smoke.log" 2>&1;
   eval python3 scripts/experiment.py --out /tmp/exp-smoke --preset smoke $smoke --table-only > "$out/smoke-table.md" 2>&1) &
fi
wait
tar czf "$out/results.tgz" --exclude='*.bin' --exclude='*.npy' --exclude=fxcache --exclude=inductor-cache \
  /tmp/exp-smoke /tmp/exp-h100 2>/dev/null
tail -n 4 "$out"/*.log
cat "$out"/*-table.md
