"""The `--data SPEC` string: one line that names a market-data input for every reader.

Grammar (see docs/data.md):

    SPEC  := KIND [":" ITEM (SEP ITEM)*]        SEP := "," | ";"
    ITEM  := VALUE | KEY "=" VALUE

    synthetic[:seed=S,days=D,signal=X]
    dbn:mbp10=DIR_OR_FILE,trades=DIR_OR_FILE[,symbol=SYM,tick=0.25,tick_value=12.5]
    dbn-mbo:FILE[,FILE...][;symbol=ESH4,levels=10,tick=...,tick_value=...]
    lobster:PATH[;levels=N]
    any of them [,fee=cme-es|us-equity|crypto|none]   (venue fee schedule, trainer.data.fees)

Separators never collide with paths: items are split on every "," and ";" first, and each value
is then percent-decoded, so a path containing ",", ";", "=" or "%" is written with %2C, %3B, %3D,
%25 (`quote_path` does it; `spec_from_dirs` uses it). An item with a raw "=" is always KEY=VALUE.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote

from trainer.data.tape import MarketTape
from trainer.errors import InputError
from trainer.fsutil import publish_directory, write_durably

__all__ = ["ParsedSpec", "parse_spec", "quote_path", "spec_from_dirs", "load_tape", "describe_spec", "synthetic_dir",
           "control_spec"]

KINDS = ("synthetic", "dbn", "dbn-mbo", "lobster")
_KEYS = {
    "synthetic": {"seed": int, "days": int, "signal": float, "fee": str},
    "dbn": {"mbp10": str, "trades": str, "symbol": str, "tick": float, "tick_value": float, "fee": str},
    "dbn-mbo": {"symbol": str, "levels": int, "tick": float, "tick_value": float, "fee": str},
    "lobster": {"levels": int, "fee": str},
}
# fee=NAME picks the venue fee schedule (trainer.data.fees); without it the kind's default (CME futures for
# synthetic/dbn/dbn-mbo, US equity for lobster). The readers ignore it.
_POSITIONAL = {"synthetic": (0, 0), "dbn": (0, 0), "dbn-mbo": (1, None), "lobster": (1, 1)}  # (min, max) paths


class ParsedSpec:
    """A parsed spec: kind, positional paths and typed options."""

    def __init__(self, kind: str, paths: list[str], options: dict[str, object]):
        self.kind, self.paths, self.options = kind, paths, options

    def normalised(self) -> str:
        """Canonical spec: absolute paths, options sorted, values percent-encoded."""
        opts = dict(self.options)
        items: list[str] = []
        for key in ("mbp10", "trades"):
            if key in opts:
                items.append(f"{key}={quote_path(str(Path(str(opts.pop(key))).resolve()))}")
        items += [quote_path(str(Path(p).resolve())) for p in self.paths]
        body = ",".join(items)
        rest = ",".join(f"{k}={quote_path(str(v))}" for k, v in sorted(opts.items()))
        if body and rest:
            body += ";" + rest
        elif rest:
            body = rest
        return f"{self.kind}:{body}" if body else self.kind

    def __repr__(self) -> str:
        return f"ParsedSpec({self.kind!r}, {self.paths!r}, {self.options!r})"


def quote_path(path: str) -> str:
    """Percent-encode the characters the spec grammar reserves (%, comma, semicolon, equals)."""
    return path.replace("%", "%25").replace(",", "%2C").replace(";", "%3B").replace("=", "%3D")


def parse_spec(spec: str) -> ParsedSpec:
    """Parse and type-check a spec string; any malformation is an InputError naming the spec."""
    if not isinstance(spec, str) or not spec.strip():
        raise InputError("--data", None, f"empty data spec {spec!r}")
    kind, _, body = spec.strip().partition(":")
    if kind not in KINDS:
        raise InputError("--data", None, f"unknown data spec kind {kind!r} in {spec!r} (one of {', '.join(KINDS)})")
    paths: list[str] = []
    options: dict[str, object] = {}
    for raw in body.replace(";", ",").split(",") if body else []:
        if not raw.strip():
            raise InputError("--data", None, f"empty item in data spec {spec!r}")
        key, eq, value = raw.partition("=")
        if not eq:
            paths.append(unquote(raw))
            continue
        key = key.strip()
        if key not in _KEYS[kind]:
            raise InputError("--data", None,
                             f"unknown key {key!r} for {kind} in {spec!r} (allowed: {sorted(_KEYS[kind])})")
        if key in options:
            raise InputError("--data", None, f"key {key!r} given twice in {spec!r}")
        typ = _KEYS[kind][key]
        try:
            options[key] = typ(unquote(value))
        except ValueError as e:
            raise InputError("--data", None, f"{key}={value!r} is not a valid {typ.__name__} in {spec!r}") from e
    lo, hi = _POSITIONAL[kind]
    if len(paths) < lo or (hi is not None and len(paths) > hi):
        want = f"{lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo}-{hi}"
        raise InputError("--data", None, f"{kind} spec takes {want} path(s), got {len(paths)} in {spec!r}")
    if kind == "dbn":
        for key in ("mbp10", "trades"):
            if key not in options:
                raise InputError("--data", None, f"dbn spec needs {key}=DIR_OR_FILE in {spec!r}")
    for key in ("levels", "days"):
        if key in options and int(options[key]) < 1:  # type: ignore[call-overload]
            raise InputError("--data", None, f"{key} must be >= 1 in {spec!r}")
    return ParsedSpec(kind, paths, options)


def spec_from_dirs(mbp10_dir: str | Path, trades_dir: str | Path) -> str:
    """Spec for the seed system's `--mbp10-data-dir --trades-data-dir` flags."""
    return f"dbn:mbp10={quote_path(str(mbp10_dir))},trades={quote_path(str(trades_dir))}"


def control_spec(spec: str) -> str | None:
    """The leakage guard's control market for `spec`: the same synthetic market with signal=0, or None for real data.

    Only the planted signal changes (seed, days and the market's dynamics stay), so a config that still "wins" on
    the control is exploiting something other than the signal: look-ahead, leakage, or an evaluation bug. Real
    data has no such knob; see docs/orchestration.md for why no automatic control is derived for it.
    'synthetic' -> 'synthetic:signal=0'; 'synthetic:seed=3,days=4,signal=2' -> 'synthetic:seed=3,days=4,signal=0'.
    """
    parsed = parse_spec(spec)  # InputError (exit 2) for a malformed spec
    if parsed.kind != "synthetic":
        return None
    options = {**{k: v for k, v in parsed.options.items() if k != "signal"}, "signal": 0}
    return "synthetic:" + ",".join(f"{k}={v}" for k, v in options.items())


# ---------------------------------------------------------------- synthetic (cached on disk)


def _synth_defaults() -> dict[str, object]:
    from trainer.data import synth

    sig = inspect.signature(synth.write_synthetic)
    return {k: sig.parameters[k].default for k in ("seed", "days", "signal")
            if k in sig.parameters and sig.parameters[k].default is not inspect.Parameter.empty}


def _data_root(work_dir: Path | None) -> Path:
    if work_dir is not None:
        return Path(work_dir)
    env = os.environ.get("ALPHA_RL_DATA_DIR")
    return Path(env) if env else Path.home() / ".cache" / "alpha-rl"


def synthetic_dir(parsed: ParsedSpec, work_dir: Path | None = None) -> tuple[Path, Path]:
    """Write (once) the synthetic market for this spec; returns (mbp10_dir, trades_dir).

    Built in a temporary sibling directory, then renamed into place, so a crash never leaves a
    half-written cache entry; a concurrent builder that loses the rename race discards its copy.
    """
    from trainer.data import synth

    opts = {**_synth_defaults(), **parsed.options}
    missing = [k for k in ("seed", "days", "signal") if k not in opts]
    if missing:
        raise InputError("--data", None,
                         f"synthetic spec needs {', '.join(missing)}= (no default in trainer.data.synth)")
    seed, days, signal = int(opts["seed"]), int(opts["days"]), float(opts["signal"])  # type: ignore[arg-type]
    final = _data_root(work_dir) / "synthetic" / f"seed={seed},days={days},signal={signal!r}"
    manifest = final / "manifest.json"
    if not manifest.is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            mbp10, trades = synth.write_synthetic(tmp, seed=seed, days=days, signal=signal)
            rel = {"mbp10": str(Path(mbp10).resolve().relative_to(tmp.resolve())),
                   "trades": str(Path(trades).resolve().relative_to(tmp.resolve()))}
            write_durably(tmp / "manifest.json", lambda f: f.write(json.dumps(rel).encode()))
            try:
                publish_directory(tmp, final)  # False: a concurrent builder published first
            except OSError:
                if not manifest.is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    rel = json.loads(manifest.read_text())
    return final / rel["mbp10"], final / rel["trades"]


# ---------------------------------------------------------------- load / describe


def load_tape(spec: str, *, work_dir: Path | None = None) -> MarketTape:
    """Read the MarketTape a spec names (validated by the reader)."""
    p = parse_spec(spec)
    o = p.options
    if p.kind == "synthetic":
        from trainer.data.dbn import read_dbn_pair

        from trainer.data import synth

        mbp10, trades = synthetic_dir(p, work_dir)
        # The synthetic contract's tick value is a property of the generator, not of the DBN bytes.
        cfg = synth.SynthConfig()
        return read_dbn_pair(mbp10, trades, tick_size=getattr(cfg, "tick_size", None),
                             tick_value=getattr(cfg, "tick_value", None))
    if p.kind == "dbn":
        from trainer.data.dbn import read_dbn_pair

        return read_dbn_pair(str(o["mbp10"]), str(o["trades"]), symbol=o.get("symbol"),  # type: ignore[arg-type]
                             tick_size=o.get("tick"), tick_value=o.get("tick_value"))  # type: ignore[arg-type]
    if p.kind == "dbn-mbo":
        from trainer.data.mbo import read_dbn_mbo

        return read_dbn_mbo(p.paths, symbol=o.get("symbol"), levels=int(o.get("levels", 10)),  # type: ignore[arg-type]
                            tick_size=o.get("tick"), tick_value=o.get("tick_value"))  # type: ignore[arg-type]
    from trainer.data.lobster import read_lobster

    return read_lobster(p.paths[0], levels=o.get("levels"))  # type: ignore[arg-type]


def _input_files(p: ParsedSpec, work_dir: Path | None) -> list[Path]:
    from trainer.data.dbn import expand_inputs

    if p.kind == "synthetic":
        mbp10, trades = synthetic_dir(p, work_dir)
        return expand_inputs([mbp10]) + expand_inputs([trades])
    if p.kind == "dbn":
        return expand_inputs([str(p.options["mbp10"])]) + expand_inputs([str(p.options["trades"])])
    if p.kind == "dbn-mbo":
        return expand_inputs(p.paths)
    path = Path(p.paths[0])
    if path.is_dir():
        return sorted(f for f in path.iterdir() if f.suffix == ".csv" and f.is_file())
    if path.suffix == ".zip":
        return [path]
    from trainer.data.lobster import _NAME_RE

    m = _NAME_RE.match(path.name)
    prefix = path.name[: m.start("kind")] if m else path.name
    return sorted(f for f in path.parent.iterdir() if f.name.startswith(prefix) and f.suffix == ".csv")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_spec(spec: str, *, work_dir: Path | None = None) -> dict:
    """Fingerprint of a spec: normalised spec plus sha256 and size of every input file's bytes."""
    p = parse_spec(spec)
    if p.kind == "synthetic":
        p = ParsedSpec(p.kind, p.paths, {**_synth_defaults(), **p.options})
    files = _input_files(p, work_dir)
    for f in files:
        if not f.is_file():
            raise InputError(f, None, "file does not exist")
    return {
        "spec": p.normalised(),
        "kind": p.kind,
        "files": [{"path": str(f.resolve()), "bytes": f.stat().st_size, "sha256": _sha256(f)} for f in files],
    }
