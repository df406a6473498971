"""Logs: one JSON object per line on stdout (machine-readable, `kubectl logs -f | grep`), human progress on stderr."""
from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, TextIO


def _plain(value: Any) -> Any:
    """JSON-safe scalars: tensors/numpy scalars → Python numbers; non-finite floats → strings."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class JsonLog:
    """Writes `{"event": ..., "fold": ..., **fields}` lines; every line is flushed at once."""

    def __init__(self, fold: int | None = None, out: TextIO | None = None, err: TextIO | None = None,
                 copy_to: TextIO | None = None):
        self.fold = fold
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.copy_to = copy_to  # e.g. RUN/fold<N>/metrics.jsonl, read by the report's training curves

    def event(self, event: str, **fields: Any) -> dict:
        record = {"event": event, "fold": self.fold, "ts": round(time.time(), 3), **_plain(fields)}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        for sink in (self.out, self.copy_to):
            if sink is not None:
                sink.write(line)
                sink.flush()
        return record

    def human(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()


def eta_text(done: int, total: int, elapsed_s: float) -> str:
    if done <= 0 or total <= done:
        return "0s" if total <= done else "?"
    rest = elapsed_s / done * (total - done)
    m, s = divmod(int(rest), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
