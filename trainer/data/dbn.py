"""Databento DBN readers: MBP-10 book + trades files -> MarketTape, with no per-record Python.

Layout (DBN v1-v3, identical for the three record types read here; rust/dbn/src/record.rs):

    file     = b"DBN" + version u8 + metadata_len u32 (LE) + metadata[metadata_len] + records...
    header   = length u8 (record size / 4), rtype u8, publisher_id u16, instrument_id u32, ts_event u64
    TradeMsg = header + price i64, size u32, action c_char, side c_char, flags u8, depth u8,
               ts_recv u64, ts_in_delta i32, sequence u32                                    (48 B)
    Mbp10Msg = TradeMsg layout + 10 x BidAskPair{bid_px i64, ask_px i64, bid_sz u32, ask_sz u32,
               bid_ct u32, ask_ct u32}                                                       (368 B)
    MboMsg   = header + order_id u64, price i64, size u32, flags u8, channel_id u8, action c_char,
               side c_char, ts_recv u64, ts_in_delta i32, sequence u32                      (56 B)

The metadata (schema, symbology) is parsed by `databento_dbn.Metadata.decode`; the record bytes are
viewed through the numpy structured dtypes below (zero copy), and rtype/length are checked for every
record at once. `tests/test_data_dbn.py` pins these dtypes field by field against `DBNDecoder`.

Timestamps: `ts_recv` (Databento's capture time; historical files are sorted by it) is the tape's
`ts_ns`. Trade aggressor: DBN `side` of a trade is the aggressor's side: 'B' buy aggressor -> BUY,
'A' sell aggressor -> SELL, 'N' -> UNKNOWN.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.jit import njit
import numpy as np

from trainer.data.tape import BUY, SELL, UNKNOWN, BookSeries, Instrument, MarketTape, TradeSeries
from trainer.data.validate import Origin, check_both_present, check_monotonic, require_file, validate_tape
from trainer.errors import InputError

log = logging.getLogger(__name__)

__all__ = [
    "MBO_DTYPE",
    "MBP10_DTYPE",
    "TRADE_DTYPE",
    "DbnFile",
    "read_dbn_file",
    "expand_inputs",
    "instrument_for",
    "read_dbn_pair",
]

UNDEF_PRICE = np.iinfo(np.int64).max  # DBN null price
PRICE_SCALE = 1_000_000_000  # DBN prices are int64 x 1e-9
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
F_LAST, F_SNAPSHOT = 128, 32

_HEADER = [("length", "u1"), ("rtype", "u1"), ("publisher_id", "<u2"), ("instrument_id", "<u4"), ("ts_event", "<u8")]
_TOP = [("price", "<i8"), ("size", "<u4"), ("action", "S1"), ("side", "S1"), ("flags", "u1"), ("depth", "u1"),
        ("ts_recv", "<u8"), ("ts_in_delta", "<i4"), ("sequence", "<u4")]
_LEVEL = np.dtype([("bid_px", "<i8"), ("ask_px", "<i8"), ("bid_sz", "<u4"), ("ask_sz", "<u4"),
                   ("bid_ct", "<u4"), ("ask_ct", "<u4")])
TRADE_DTYPE = np.dtype(_HEADER + _TOP)
MBP10_DTYPE = np.dtype(_HEADER + _TOP + [("levels", _LEVEL, (10,))])
MBO_DTYPE = np.dtype(_HEADER + [("order_id", "<u8"), ("price", "<i8"), ("size", "<u4"), ("flags", "u1"),
                                ("channel_id", "u1"), ("action", "S1"), ("side", "S1"), ("ts_recv", "<u8"),
                                ("ts_in_delta", "<i4"), ("sequence", "<u4")])
assert (TRADE_DTYPE.itemsize, MBP10_DTYPE.itemsize, MBO_DTYPE.itemsize) == (48, 368, 56)

# schema name -> (rtype, dtype). Only these three are readable; anything else is a wrong-schema error.
SCHEMAS: dict[str, tuple[int, np.dtype]] = {
    "trades": (0x00, TRADE_DTYPE),
    "mbp-10": (0x0A, MBP10_DTYPE),
    "mbo": (0xA0, MBO_DTYPE),
}

# Known CME roots: (tick size in index points / price units, USD per tick per contract).
KNOWN_ROOTS: dict[str, tuple[float, float]] = {
    "ES": (0.25, 12.5), "MES": (0.25, 1.25), "NQ": (0.25, 5.0), "MNQ": (0.25, 0.5),
    "YM": (1.0, 5.0), "MYM": (1.0, 0.5), "RTY": (0.1, 5.0), "M2K": (0.1, 0.5),
    "CL": (0.01, 10.0), "MCL": (0.01, 1.0), "GC": (0.1, 10.0), "MGC": (0.1, 1.0),
    "ZN": (0.015625, 15.625), "ZB": (0.03125, 31.25), "ZF": (0.0078125, 7.8125),
    "6E": (0.00005, 6.25),
}
# A CME outright future is ROOT + month code + 1-2 year digits; continuous symbols are ROOT.c.0 etc.
_FUTURE_RE = re.compile(r"^([A-Z0-9]+?)[FGHJKMNQUVXZ]\d{1,2}$")


@dataclass(frozen=True)
class DbnFile:
    """One decoded DBN file: metadata plus a zero-copy structured view of its records."""

    path: Path
    version: int
    """DBN version from the file header (1-3)."""
    schema: str | None
    """Schema named in the metadata ('mbp-10', 'trades', 'mbo', ...); None for mixed-schema files."""
    records: np.ndarray
    """(n,) structured array with the dtype of `schema`."""
    names: dict[int, str]
    """instrument_id -> symbol from the metadata's symbology mappings (may be empty)."""

    def name_of(self, iid: int) -> str:
        return self.names.get(int(iid), str(int(iid)))


def _rtype_name(rtype: int) -> str:
    import databento_dbn

    try:
        return str(databento_dbn.RType(rtype))
    except ValueError:
        return hex(rtype)


def _read_buffer(path: Path) -> bytes | np.ndarray:
    """The file's DBN bytes: a read-only memory map for plain files (zero copy: only the pages the
    decoder touches are read), or the zstd-decompressed bytes (all frames)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != ZSTD_MAGIC:
        return np.memmap(path, dtype=np.uint8, mode="r")
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(path.read_bytes(), read_across_frames=True) as r:
            out = r.read()
    except zstandard.ZstdError as e:
        raise InputError(path, None, f"corrupt or truncated zstd stream ({e})") from e
    if not out:
        raise InputError(path, None, "zstd stream decompresses to nothing")
    return out


def read_dbn_file(path: str | Path, expect: str | tuple[str, ...]) -> DbnFile:
    """Decode one .dbn / .dbn.zst file whose schema must be one of `expect`."""
    path = require_file(path)
    expect = (expect,) if isinstance(expect, str) else tuple(expect)
    buf = _read_buffer(path)
    head = bytes(buf[:8])
    if len(head) < 8 or head[:3] != b"DBN":
        raise InputError(path, None, f"not a DBN file (starts with {head[:4]!r}, expected b'DBN' + version)")
    version = head[3]
    if version not in (1, 2, 3):
        raise InputError(path, None, f"unsupported DBN version {version} (1-3 supported)")
    meta_len = int.from_bytes(head[4:8], "little")
    start = 8 + meta_len
    if start > len(buf):
        raise InputError(path, None, f"truncated DBN metadata ({len(buf)} bytes, header says {start})")
    import databento_dbn

    try:
        meta = databento_dbn.Metadata.decode(bytes(buf[:start]))
    except Exception as e:  # databento_dbn raises its own DBNError; any failure here means a bad header
        raise InputError(path, None, f"unreadable DBN metadata ({e})") from e
    schema = None if meta.schema is None else str(meta.schema)
    if schema is not None and schema not in expect:
        raise InputError(path, None, f"wrong schema {schema!r}, expected {' or '.join(expect)}")
    rtype, dtype = SCHEMAS[schema if schema is not None else expect[0]]
    body = len(buf) - start
    n = body // dtype.itemsize
    if body % dtype.itemsize:
        raise InputError(
            path, n, f"truncated record: {body % dtype.itemsize} trailing bytes, {schema or expect[0]} records are "
            f"{dtype.itemsize} bytes"
        )
    recs = np.frombuffer(buf, dtype=dtype, count=n, offset=start)
    # Vectorised framing check: every record must declare our size and rtype. A mismatch also catches
    # mixed-schema files and corrupted bytes. (One strided pass over the file's pages.)
    bad = np.flatnonzero((recs["rtype"] != rtype) | (recs["length"] != dtype.itemsize // 4))
    if bad.size:
        i = int(bad[0])
        got = _rtype_name(int(recs["rtype"][i]))
        raise InputError(
            path, i, f"wrong record type {got} (length {int(recs['length'][i]) * 4} B), expected {expect[0]}"
        )
    names: dict[int, str] = {}
    if str(meta.stype_out) == "instrument_id":
        for sym, intervals in (meta.mappings or {}).items():
            for iv in intervals:
                try:
                    names[int(iv["symbol"])] = sym
                except (KeyError, ValueError):
                    continue
    return DbnFile(path, int(version), schema, recs, names)


def expand_inputs(paths: str | Path | list | tuple, patterns: tuple[str, ...] = ("*.dbn", "*.dbn.zst")) -> list[Path]:
    """Files of each input in order; a directory contributes its matching files sorted by name."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted({f for pat in patterns for f in p.glob(pat) if f.is_file()}, key=lambda f: f.name)
            if not found:
                raise InputError(p, None, f"directory has no {' / '.join(patterns)} files")
            out.extend(found)
        else:
            out.append(p)
    return out


def _root_of(symbol: str) -> str:
    s = symbol.split(".")[0].upper()
    m = _FUTURE_RE.match(s)
    return m.group(1) if m else s


def instrument_for(
    symbol: str,
    observed_px_nanos: Callable[[], np.ndarray],
    tick_size: float | None = None,
    tick_value: float | None = None,
) -> Instrument:
    """Tick size/value: explicit arguments win, then the known-root table, then the GCD of observed prices.

    `observed_px_nanos` is only called for the GCD fallback (it can be expensive). The fallback sets
    tick_value = tick_size (one price unit per unit) and logs a warning: PnL is
    then in price units, not currency.
    """
    known = KNOWN_ROOTS.get(_root_of(symbol))
    if tick_size is None and known is not None:
        tick_size = known[0]
    if tick_value is None and known is not None and tick_size == known[0]:
        tick_value = known[1]
    if tick_size is None:
        px = np.unique(observed_px_nanos())  # (k,) distinct present prices, nanos
        # A single distinct price has no increments; its own value is then the only bound on the tick.
        g = int(np.gcd.reduce(np.diff(px))) if px.size > 1 else (int(px[0]) if px.size else 0)
        if g <= 0:
            raise InputError(symbol, None, "cannot infer the tick size: no prices observed; pass tick_size")
        tick_size = g / PRICE_SCALE
        log.warning("symbol %s: unknown root, tick size inferred as GCD of price increments = %g", symbol, tick_size)
    if tick_value is None:
        tick_value = tick_size
        log.warning("symbol %s: tick_value unknown, using tick_size (%g): PnL in price units", symbol, tick_size)
    return Instrument(symbol, float(tick_size), float(tick_value))


def _tick_nanos(tick_size: float) -> int:
    tick_nanos = int(round(tick_size * PRICE_SCALE))
    if tick_nanos <= 0 or not math.isclose(tick_nanos / PRICE_SCALE, tick_size, rel_tol=1e-12):
        raise ValueError(f"tick_size {tick_size!r} is not representable in DBN 1e-9 fixed point")
    return tick_nanos


# Word offsets in an Mbp10Msg viewed as 46 little-endian int64 words (see the module docstring):
# word 4 = ts_recv, level k: word 6+4k bid_px, 7+4k ask_px, 8+4k = bid_sz (low 32 bits) | ask_sz (high).
_W_LEVEL0 = 6


@njit(cache=True, nogil=True)
def _mbp10_fill(words, tick_nanos, bid_px, bid_sz, ask_px, ask_sz):  # pragma: no cover - compiled
    """(n, 46) int64 record words -> ticks/sizes into the (n, 10) outputs; (first bad row, rule code).

    Rule codes: 1 null price on a present level, 2 price off the tick grid. One pass, no temporaries.
    Division is replaced by a float reciprocal multiply (exact while |price| < 2**53 nanos) and
    verified by an integer multiply; a miss falls back to `//`.
    """
    n = words.shape[0]
    inv = 1.0 / tick_nanos
    undef = 9223372036854775807
    for i in range(n):
        for k in range(10):
            w = _W_LEVEL0 + 4 * k
            sizes = words[i, w + 2]
            bs = sizes & 0xFFFFFFFF
            a_s = (sizes >> 32) & 0xFFFFFFFF
            bid_sz[i, k] = bs
            ask_sz[i, k] = a_s
            bid_px[i, k] = 0
            ask_px[i, k] = 0
            for side in range(2):
                if (bs if side == 0 else a_s) == 0:
                    continue
                px = words[i, w + side]
                if px == undef:
                    return i, 1
                q = np.int64(np.rint(px * inv))
                if q * tick_nanos != px:
                    q = px // tick_nanos
                    if q * tick_nanos != px:
                        return i, 2
                if side == 0:
                    bid_px[i, k] = q
                else:
                    ask_px[i, k] = q
    return -1, 0


def _mbp10_levels(words: np.ndarray, tick_nanos: int) -> tuple[np.ndarray, ...]:
    """(n, 46) record words -> (bid_px, bid_sz, ask_px, ask_sz) (n, 10) int64 each, err_row, err_code.

    Outputs are allocated by numpy rather than inside the kernel: numpy advises transparent huge pages
    for large arrays, which cuts the first-touch page-fault cost that dominates this conversion.
    """
    n = words.shape[0]
    out = [np.empty((n, 10), np.int64) for _ in range(4)]  # bid_px, bid_sz, ask_px, ask_sz
    err_row, err_code = _mbp10_fill(words, tick_nanos, *out)
    return out[0], out[1], out[2], out[3], int(err_row), int(err_code)


def to_ticks(px_nanos: np.ndarray, present: np.ndarray, tick_size: float, origin: Origin, what: str) -> np.ndarray:
    """int64 nanos -> int64 ticks; absent entries (present False) -> 0. Off-grid or null prices are errors."""
    tick_nanos = _tick_nanos(tick_size)
    bad = present & (px_nanos == UNDEF_PRICE)
    if bad.any():
        row = int(np.flatnonzero(bad.reshape(bad.shape[0], -1).any(1))[0])
        raise origin.error(row, f"non-finite (null) {what} price")
    off = present & (px_nanos % tick_nanos != 0)
    if off.any():
        row = int(np.flatnonzero(off.reshape(off.shape[0], -1).any(1))[0])
        raise origin.error(row, f"{what} price not a multiple of the tick size {tick_size}")
    return np.where(present, px_nanos // tick_nanos, 0).astype(np.int64)


def select_instrument(files: list[DbnFile], symbol: str | None, *, default_most_active: bool = False) -> str:
    """The symbol to read. Several instruments and no choice -> InputError (or the most active one)."""
    counts: dict[str, int] = {}
    first_other: tuple[Path, int] | None = None
    for f in files:
        ids = f.records["instrument_id"]
        if len(ids) and (ids == ids[0]).all():  # common single-instrument file: skip the sort
            iids, first_idx, cnt = ids[:1], np.zeros(1, np.int64), np.array([len(ids)])
        else:
            iids, first_idx, cnt = np.unique(ids, return_index=True, return_counts=True)
        order = np.argsort(first_idx)  # in order of first appearance, so the error names the intruder
        for iid, i0, c in zip(iids[order].tolist(), first_idx[order].tolist(), cnt[order].tolist()):
            name = f.name_of(iid)
            if name not in counts and counts and first_other is None:
                first_other = (f.path, int(i0))
            counts[name] = counts.get(name, 0) + int(c)
    if symbol is not None:
        if symbol not in counts:
            raise InputError(files[0].path if files else symbol, None,
                             f"symbol {symbol!r} not in the input (has {sorted(counts)})")
        return symbol
    if len(counts) > 1:
        if default_most_active:
            return max(counts, key=lambda k: counts[k])
        path, rec = first_other if first_other else (files[0].path, None)
        raise InputError(path, rec, f"several instruments {sorted(counts)} and no symbol chosen")
    if not counts:
        return ""
    return next(iter(counts))


def _concat(files: list[DbnFile], symbol: str) -> tuple[np.ndarray, Origin]:
    """Records of `symbol` from every file, concatenated in file order, with their origins."""
    if len(files) == 1 and np.all(files[0].records["instrument_id"] == files[0].records["instrument_id"][:1]):
        f = files[0]
        if len(f.records) and f.name_of(int(f.records["instrument_id"][0])) == symbol:
            return f.records, Origin.single(f.path, np.arange(len(f.records)))  # zero-copy common case
    parts, origins = [], []
    for f in files:
        iids = [iid for iid in np.unique(f.records["instrument_id"]).tolist() if f.name_of(iid) == symbol]
        idx = np.flatnonzero(np.isin(f.records["instrument_id"], iids))
        parts.append(f.records[idx])
        origins.append(Origin.single(f.path, idx))
    if not parts:
        return np.zeros(0, files[0].records.dtype if files else TRADE_DTYPE), Origin.concat([])
    return np.concatenate(parts), Origin.concat(origins)


def _sides(side: np.ndarray) -> np.ndarray:
    """DBN aggressor side char -> tape code: 'B' buy aggressor -> BUY, 'A' sell aggressor -> SELL."""
    return np.where(side == b"B", BUY, np.where(side == b"A", SELL, UNKNOWN)).astype(np.int8)


def read_dbn_pair(
    mbp10_paths: str | Path | list,
    trades_paths: str | Path | list,
    symbol: str | None = None,
    tick_size: float | None = None,
    tick_value: float | None = None,
    preopen_end_ns: int | None = None,
) -> MarketTape:
    """MBP-10 book + trades DBN inputs -> validated MarketTape.

    Each input is a file or a directory (every *.dbn / *.dbn.zst inside, sorted by name, read in
    that order; timestamps must then be non-decreasing across files). `preopen_end_ns` defaults to
    the first trade's time: before the first print the venue is in its pre-open and an indicative
    crossed book is allowed.
    """
    book_files = [read_dbn_file(p, "mbp-10") for p in expand_inputs(mbp10_paths)]
    trade_files = [read_dbn_file(p, "trades") for p in expand_inputs(trades_paths)]
    if symbol is None:
        select_instrument(trade_files, None)  # several instruments in the trades and no choice: refuse
    symbol = select_instrument(book_files, symbol)
    book, b_org = _concat(book_files, symbol)
    trades, t_org = _concat(trade_files, symbol)
    srcs = tuple(str(f.path) for f in book_files + trade_files)
    check_both_present(len(book), len(trades), ", ".join(str(f.path) for f in book_files),
                       ", ".join(str(f.path) for f in trade_files))
    # Check order on the raw u64 stamps before any arithmetic on them.
    b_ts = book["ts_recv"].astype(np.int64)
    t_ts = trades["ts_recv"].astype(np.int64)
    check_monotonic(b_ts, b_org, "book")
    check_monotonic(t_ts, t_org, "trade")

    # Instrument first (tick size), then one fused pass over the raw words of the book records.
    def observed() -> np.ndarray:
        lv = book["levels"]
        px = np.concatenate([lv["bid_px"][lv["bid_sz"] > 0], lv["ask_px"][lv["ask_sz"] > 0], trades["price"]])
        return px[px != UNDEF_PRICE]

    inst = instrument_for(symbol, observed, tick_size, tick_value)
    tick_nanos = _tick_nanos(inst.tick_size)
    words = np.ascontiguousarray(book).view("<i8").reshape(len(book), MBP10_DTYPE.itemsize // 8)  # (n, 46)
    bid_px, bid_sz, ask_px, ask_sz, err_row, err_code = _mbp10_levels(words, tick_nanos)
    if err_row >= 0:
        raise b_org.error(err_row, ("non-finite (null) book price on a present level",
                                    f"book price not a multiple of the tick size {inst.tick_size}")[err_code - 1])
    t_px = to_ticks(trades["price"], np.ones(len(trades), bool), inst.tick_size, t_org, "trade")
    tape = MarketTape(
        instrument=inst,
        book=BookSeries(b_ts, bid_px, bid_sz, ask_px, ask_sz),
        trades=TradeSeries(t_ts, t_px, trades["size"].astype(np.int64), _sides(trades["side"])),
        sources=srcs,
        preopen_end_ns=int(t_ts[0]) if preopen_end_ns is None else int(preopen_end_ns),
    )
    return validate_tape(tape, b_org, t_org)
