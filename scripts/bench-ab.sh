#!/usr/bin/env bash
# The full step's speed, an older commit's code against the working tree's, on one GPU machine (docs/BENCHMARKS.md).
# Each side gets its own warm compile cache (a cold run first, then the timed one). Usage: bash scripts/bench-ab.sh SHA
set -uo pipefail
old=${1:?usage: bash scripts/bench-ab.sh SHA}
root=$PWD; tree=$(mktemp -d)
git archive "$old" trainer | tar -x -C "$tree"
bench=(python3 -m trainer.bench --n-envs 1024 --steps 500 --device cuda --json --mode graph --compile all)
run() {  # run NAME DIR: one cold and one warm bench of the code in DIR
  for pass in cold warm; do
    (cd "$2" && PYTHONPATH="$2:${PYTHONPATH:-}" TORCHINDUCTOR_CACHE_DIR="/tmp/bench-ab-$1" timeout 300 "${bench[@]}") \
      > "/tmp/bench-ab-$1-$pass.json" 2>/dev/null
  done
  echo "$1 $(grep -o '"steps_per_s": [0-9.]*' "/tmp/bench-ab-$1-warm.json")"
}
run new "$root"
run old "$tree"
run new2 "$root"
