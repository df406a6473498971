#!/usr/bin/env bash
# The walk-forward run on the H200 through the `device` tool (docs/RESULTS.md): three folds trained at once on
# one GPU (separate processes; the step does not fill the GPU), then the report.
# Usage: bash scripts/gpu-train.sh OUTDIR DATA_SPEC N_STEPS [extra trainer flags...]
set -uo pipefail
out=$1; data=$2; steps=$3; shift 3
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 ALPHA_RL_DATA_DIR=${ALPHA_RL_DATA_DIR:-$PWD/.devdata/data}
run=/tmp/alpha-run/$(git rev-parse --short HEAD 2>/dev/null || echo dev)
mkdir -p "$run" "$out"
for fold in 0 1 2; do
  python3 -m trainer.train --run-dir "$run" --fold $fold --folds 3 --data "$data" --preset h100 \
    --n-steps "$steps" --fxcache "${FXCACHE:-$PWD/.devdata/fxcache}" "$@" > "$out/fold$fold.log" 2> "$out/fold$fold.err" &
done
wait
tail -n 3 "$out"/fold*.err
python3 -m trainer.report --run-dir "$run" > "$out/report.log" 2>&1; tail -n 5 "$out/report.log"
cp "$run"/summary.json "$run"/report.md "$run"/*.png "$out"/ 2>/dev/null
for fold in 0 1 2; do cp "$run/fold$fold/result.json" "$out/result$fold.json" 2>/dev/null; done
