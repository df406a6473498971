"""Trainer launcher used as the train-fold container command: `python -m workflows.launch MODULE ARGS...`.

Argo cannot drop an argument, so optional overrides are always rendered (`--n-steps
{{workflow.parameters.n-steps}}`). This launcher:

1. logs one JSON line `{"event": "attempt", ...}` with the retry attempt and fold, so
   `kubectl logs` of every retry pod says which attempt it is;
2. removes `--flag ""` pairs (an empty parameter means "let the preset decide");
3. execs `python -m MODULE` with the rest in place of itself: same pid, so SIGTERM reaches the
   trainer directly and its exit code (0/2/3/143/...) is the container's exit code.
"""
from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["drop_empty_flags", "main"]


def drop_empty_flags(args: list[str]) -> list[str]:
    """Remove every `--flag ""` pair; keep everything else in order."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i].startswith("--") and "=" not in args[i] and i + 1 < len(args) and args[i + 1] == "":
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args[:-1]):
        if a == name:
            return args[i + 1]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print("usage: python -m workflows.launch MODULE [ARGS...]", file=sys.stderr)
        return 2
    module, args = argv[0], drop_empty_flags(argv[1:])
    attempt = _flag(args, "--attempt") or os.environ.get("ALPHA_RL_ATTEMPT", "0")
    record = {
        "event": "attempt",
        "fold": _flag(args, "--fold"),
        "attempt": int(attempt) if attempt.isdigit() else attempt,
        "module": module,
        "fold_dir": os.environ.get("ALPHA_RL_FOLD_DIR"),
        "time_unix_s": round(time.time(), 3),
    }
    print(json.dumps(record), flush=True)
    os.execv(sys.executable, [sys.executable, "-m", module, *args])
    return 1  # unreachable: execv replaces the process or raises


if __name__ == "__main__":
    raise SystemExit(main())
