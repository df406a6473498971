"""fxcache: features and DecisionTape on disk, keyed by content, built once, never half-written.

Layout (DESIGN.md "Volume layout"):

    <cache_dir>/<key>/manifest.json          key, spec, data fingerprint, config, shapes, versions, created
    <cache_dir>/<key>/raw.npy                (T, F) float32 features
    <cache_dir>/<key>/decision.<field>.npy   one file per DecisionTape array

key = sha256 of (describe_spec(spec) incl. every input file's sha256, FeatureConfig, FEATURE_CODE_VERSION).

Publishing protocol: an entry is written into a private temp dir inside cache_dir, every file fsynced,
then `os.rename`d to `<key>`. rename(2) of a directory onto an existing non-empty one fails, so when two
processes race exactly one rename wins; the loser deletes its copy and loads the winner's. Readers
therefore see either no entry or a complete one. An entry that fails validation (missing or truncated
file, bad manifest) is moved aside and rebuilt. No pickle anywhere: arrays load with allow_pickle=False.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.spec import describe_spec, load_tape
from trainer.data.tape import Instrument
from trainer.features.compute import FeatureSet, build_feature_set
from trainer.features.config import FeatureConfig
from trainer.features.decision import DecisionTape
from trainer.fsutil import publish_directory, write_durably

FEATURE_CODE_VERSION = 2  # 2: DecisionTape classifies unknown-aggressor trades inside the spread (trade_signs)
"""Bump whenever clock, DecisionTape builder or feature code changes what it computes: old entries then miss."""
MANIFEST_FORMAT = 1
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
STALE_TMP_S = 3600.0  # a temp dir this old is from a crashed builder (a build takes seconds to minutes)


def feature_key(description: dict[str, Any], cfg: FeatureConfig) -> str:
    """sha256 hex of the data fingerprint, the feature config and the feature code version."""
    payload = {"data": description, "features": cfg.to_dict(), "feature_code_version": FEATURE_CODE_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_or_build(spec: str, cfg: FeatureConfig, cache_dir: Path, *,
                  work_dir: Path | None = None) -> tuple[FeatureSet, bool]:
    """The FeatureSet for (spec, cfg), from `cache_dir` if a valid entry exists, else built and published.

    Returns (feature_set, skipped): skipped is False only for the call whose build was published.
    Bad data or spec raises InputError (ValueError) before anything is written.
    """
    cache_dir = Path(cache_dir)
    description = describe_spec(spec, work_dir=work_dir)  # hashes every input file: cost ~ 1 s per GB
    key = feature_key(description, cfg)
    final = cache_dir / key
    found = load_entry(final, key)
    if found is not None:
        return found, True

    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale(cache_dir, key)
    fs = build_feature_set(load_tape(spec, work_dir=work_dir), cfg, key=key)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{key[:16]}-", dir=cache_dir))
    try:
        _write_entry(tmp, fs, _manifest(key, description, cfg, fs))
        won = publish_directory(tmp, final)  # False: another process published `final` first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if won:
        return fs, False
    other = load_entry(final, key)
    if other is None:
        raise RuntimeError(f"fxcache: lost the publish race for {final} but the winner's entry is not valid")
    return other, True


def load_entry(entry: Path, key: str) -> FeatureSet | None:
    """A published entry, or None if absent. A present but invalid entry is moved aside (then None)."""
    if not entry.exists():
        return None
    try:
        return _read_entry(entry, key)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # json errors are ValueErrors
        _discard(entry, reason=str(exc))
        return None


# ---------------------------------------------------------------- writing


def _manifest(key: str, description: dict[str, Any], cfg: FeatureConfig, fs: FeatureSet) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "key": key,
        "spec": description.get("spec"),
        "data": description,
        "config": cfg.to_dict(),
        "rows": int(fs.raw.shape[0]),
        "features": int(fs.raw.shape[1]),
        "names": list(fs.names),
        "instrument": dataclasses.asdict(fs.instrument),
        "decision": {"tick_value": fs.decision.tick_value, "trade_radius_ticks": fs.decision.trade_radius_ticks},
        "versions": {"feature_code": FEATURE_CODE_VERSION, "numpy": np.__version__,
                     "python": platform.python_version()},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _arrays(fs: FeatureSet) -> dict[str, np.ndarray]:
    out = {"raw.npy": fs.raw}
    out.update({f"decision.{name}.npy": a for name, a in fs.decision.arrays().items()})
    return out


def _write_entry(tmp: Path, fs: FeatureSet, manifest: dict[str, Any]) -> None:
    files: dict[str, Any] = {}
    for name, arr in _arrays(fs).items():
        arr = np.ascontiguousarray(arr)
        write_durably(tmp / name, lambda f, a=arr: np.save(f, a, allow_pickle=False))
        files[name] = {"shape": list(arr.shape), "dtype": arr.dtype.str, "bytes": (tmp / name).stat().st_size}
    manifest = {**manifest, "arrays": files}
    write_durably(tmp / "manifest.json", lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; pods under other uids read the shared PVC


# ---------------------------------------------------------------- reading and repair


def _read_entry(entry: Path, key: str) -> FeatureSet:
    manifest = json.loads((entry / "manifest.json").read_text())
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("key") != key:
        raise ValueError(f"manifest format/key mismatch in {entry}")
    arrays: dict[str, np.ndarray] = {}
    for name, meta in manifest["arrays"].items():
        path = entry / name
        if path.stat().st_size != meta["bytes"]:
            raise ValueError(f"{path}: {path.stat().st_size} bytes, manifest says {meta['bytes']}")
        arr = np.load(path, allow_pickle=False)
        if list(arr.shape) != meta["shape"] or arr.dtype.str != meta["dtype"]:
            raise ValueError(f"{path}: {arr.dtype.str}{arr.shape} != manifest {meta['dtype']}{meta['shape']}")
        arrays[name] = arr
    decision_fields = {f.name for f in dataclasses.fields(DecisionTape)} - {"tick_value", "trade_radius_ticks"}
    decision = DecisionTape(**{f: arrays[f"decision.{f}.npy"] for f in decision_fields}, **manifest["decision"])
    fs = FeatureSet(raw=arrays["raw.npy"], names=tuple(manifest["names"]), decision=decision,
                    instrument=Instrument(**manifest["instrument"]), key=key)
    if fs.raw.shape != (manifest["rows"], manifest["features"]):
        raise ValueError(f"{entry}: raw {fs.raw.shape} != manifest rows x features")
    return fs


def _discard(entry: Path, reason: str) -> None:
    """Move a broken entry out of the way (atomic), then delete it. Losing this race to another repairer is fine."""
    trash = entry.parent / f"{TRASH_PREFIX}{entry.name[:16]}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(entry, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale(cache_dir: Path, key: str) -> None:
    """Delete temp/trash dirs for this key left by crashed processes (older than STALE_TMP_S)."""
    now = time.time()
    for prefix in (f"{TMP_PREFIX}{key[:16]}-", f"{TRASH_PREFIX}{key[:16]}-"):
        for p in cache_dir.glob(prefix + "*"):
            try:
                if now - p.stat().st_mtime > STALE_TMP_S:
                    shutil.rmtree(p, ignore_errors=True)
            except FileNotFoundError:
                pass
