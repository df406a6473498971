"""`python -m trainer.data {inspect,synth,bench}`: look at market-data inputs, write synthetic data, time the readers.

Exit codes follow DESIGN.md: 0 ok, 2 bad input or usage (one clear line on stderr).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trainer.errors import InputError, exit_code_for

__all__ = ["main", "inspect_path", "bench"]


# ---------------------------------------------------------------- inspect


def _crossed(bid_px: np.ndarray, bid_sz: np.ndarray, ask_px: np.ndarray, ask_sz: np.ndarray) -> int:
    return int(((bid_sz[:, 0] > 0) & (ask_sz[:, 0] > 0) & (bid_px[:, 0] >= ask_px[:, 0])).sum())


def _is_lobster(p: Path) -> bool:
    from trainer.data.lobster import _NAME_RE

    if p.is_dir():
        return any(_NAME_RE.match(f.name) for f in p.iterdir()) or len(list(p.glob("*.zip"))) == 1
    return p.suffix in (".zip", ".csv")


def inspect_path(path: str | Path) -> list[dict]:
    """One summary dict per input: a DBN file, each DBN file of a directory, or one LOBSTER pair."""
    from trainer.data.dbn import expand_inputs, read_dbn_file

    p = Path(path)
    if not p.exists():
        raise InputError(p, None, "file does not exist")
    if _is_lobster(p):
        from trainer.data.lobster import read_lobster

        t = read_lobster(p)
        b = t.book
        return [{
            "path": str(p), "format": "lobster", "schema": "message+orderbook", "records": len(b),
            "start_ns": int(b.ts_ns[0]), "end_ns": int(b.ts_ns[-1]), "symbols": [t.instrument.symbol],
            "levels": b.levels, "crossed": _crossed(b.bid_px, b.bid_sz, b.ask_px, b.ask_sz), "trades": len(t.trades),
        }]
    out = []
    for f in expand_inputs([p]):
        d = read_dbn_file(f, ("mbp-10", "trades", "mbo"))
        r = d.records
        schema = d.schema or {0x00: "trades", 0x0A: "mbp-10", 0xA0: "mbo"}[int(r["rtype"][0]) if len(r) else 0]
        ts = r["ts_recv"].astype(np.int64)
        row = {
            "path": str(f), "format": "dbn", "schema": schema, "version": d.version, "records": int(len(r)),
            "start_ns": int(ts[0]) if len(ts) else None, "end_ns": int(ts[-1]) if len(ts) else None,
            "symbols": sorted({d.name_of(i) for i in np.unique(r["instrument_id"]).tolist()}),
        }
        if schema == "mbp-10":
            lv = r["levels"]
            row["levels"] = 10
            row["crossed"] = _crossed(lv["bid_px"], lv["bid_sz"], lv["ask_px"], lv["ask_sz"])
        elif schema == "mbo" and len(r):
            from trainer.data.mbo import rebuild_book

            iids, counts = np.unique(r["instrument_id"], return_counts=True)
            top = r[r["instrument_id"] == iids[np.argmax(counts)]]
            _, bid, bsz, ask, asz = rebuild_book(top, 10)
            row.update(levels=10, book_states=int(len(bid)), crossed=_crossed(bid, bsz, ask, asz),
                       book_symbol=d.name_of(int(iids[np.argmax(counts)])))
        out.append(row)
    return out


# ---------------------------------------------------------------- bench


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench(shared_data: Path, n_records: int = 1_000_000, repeat: int = 3) -> list[tuple[str, int, float]]:
    """(name, items, seconds) rows: DBN MBP-10 decode, MBO rebuild, LOBSTER load (best of `repeat`)."""
    import zstandard

    from trainer.data.dbn import MBP10_DTYPE, read_dbn_file, read_dbn_pair
    from trainer.data.lobster import read_lobster
    from trainer.data.mbo import read_dbn_mbo, rebuild_book

    rows: list[tuple[str, int, float]] = []
    src = shared_data / "dbn" / "test_data.mbp-10.dbn"
    trades = shared_data / "dbn" / "test_data.trades.dbn"
    raw = src.read_bytes()
    start = 8 + int.from_bytes(raw[4:8], "little")
    base = np.frombuffer(raw, MBP10_DTYPE, offset=start)
    with tempfile.TemporaryDirectory() as tmp:
        big = np.resize(base, n_records)  # repeats the fixture records
        big["ts_recv"] = base["ts_recv"][0] + np.arange(n_records, dtype=np.uint64) * 1000  # 1 us apart
        big_path = Path(tmp) / "big.mbp-10.dbn"
        big_path.write_bytes(raw[:start] + big.tobytes())
        zst_path = Path(tmp) / "big.mbp-10.dbn.zst"
        zst_path.write_bytes(zstandard.ZstdCompressor(level=3).compress(big_path.read_bytes()))
        # Trades must not start before the book, or the whole tape is pre-open; reuse the fixture pair.
        rows.append(("dbn mbp-10 frame+check (plain)", n_records,
                     _best(lambda: read_dbn_file(big_path, "mbp-10"), repeat)))
        rows.append(("dbn mbp-10 -> MarketTape (plain)", n_records,
                     _best(lambda: read_dbn_pair(big_path, trades, preopen_end_ns=0), repeat)))
        rows.append(("dbn mbp-10 -> MarketTape (zstd)", n_records,
                     _best(lambda: read_dbn_pair(zst_path, trades, preopen_end_ns=0), repeat)))
    es = shared_data / "es-mbo" / "esh4-glbx-mdp3-20231225.mbo.dbn.zst"
    recs = read_dbn_file(es, "mbo").records
    rebuild_book(recs[:100])  # numba compile (or cache load) outside the timing
    rows.append(("mbo rebuild kernel (ES day)", len(recs), _best(lambda: rebuild_book(recs, 10), repeat)))
    rows.append(("mbo file -> MarketTape (ES day)", len(recs), _best(lambda: read_dbn_mbo(es), repeat)))
    lob = shared_data / "lobster" / "LOBSTER_SampleFile_AMZN_2012-06-21_5.zip"
    rows.append(("lobster zip -> MarketTape (AMZN)", 155_935, _best(lambda: read_lobster(lob), repeat)))
    return rows


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m trainer.data",
        description="Market-data tools. Subcommands: inspect (one JSON line per input), "
        "synth (write a synthetic DBN market), bench (reader throughput table).",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ins = sub.add_parser("inspect", help="print one JSON line per input: path, format, schema, records, "
                         "start_ns, end_ns, symbols; for books also levels and crossed rows")
    ins.add_argument("paths", nargs="+", help="DBN files or directories, LOBSTER .zip / directory / csv")
    syn = sub.add_parser("synth", help="write a synthetic market as DBN MBP-10 + trades (trainer.data.synth)")
    try:
        from trainer.data import synth  # lazy: optional module owned by the synthetic-market engineer
    except ImportError:
        synth = None
    if synth is not None:
        synth.add_arguments(syn)
    ben = sub.add_parser("bench", help="time the readers on the reference data and print a table")
    ben.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data",
                     help="reference data folder (default: ../shared/data next to the repository)")
    ben.add_argument("--records", type=int, default=1_000_000, help="MBP-10 records in the generated file")
    ben.add_argument("--repeat", type=int, default=3, help="timing repeats (best is reported)")
    ap.set_defaults(_synth=synth)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "inspect":
            for p in args.paths:
                for row in inspect_path(p):
                    print(json.dumps(row), flush=True)
            return 0
        if args.cmd == "synth":
            if args._synth is None:
                raise InputError("synth", None, "trainer.data.synth is not available in this build")
            return int(args._synth.run(args))
        rows = bench(args.data_dir, args.records, args.repeat)
        print(f"{'what':36s} {'items':>10s} {'seconds':>9s} {'items/s':>12s}")
        for name, n, s in rows:
            print(f"{name:36s} {n:10d} {s:9.4f} {n / s:12,.0f}")
        return 0
    except Exception as e:  # process edge: map to DESIGN.md exit codes
        code = exit_code_for(e)
        print(f"error: {e}" if code == 2 else f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
