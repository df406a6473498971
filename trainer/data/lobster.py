"""LOBSTER message + orderbook CSV pair -> MarketTape (any number of levels), vectorised parsing.

Files: `TICKER_YYYY-MM-DD_START_END_message_L.csv` (time s after midnight, type, order id, size,
price x 1e4, direction) and `..._orderbook_L.csv` (ask px, ask sz, bid px, bid sz per level); row i of
the orderbook is the book after message i. Input: a directory holding one pair, a .zip holding one
pair (read in memory, not extracted), or the message (or orderbook) file path.

Mapping (LOBSTER ReadMe): prices / 10,000 USD -> ticks of 0.01 (tick_value 0.01 USD per share);
time = seconds after midnight US/Eastern (NASDAQ local time) on the file's date -> ns since the
epoch; types 4 (visible) and 5 (hidden) executions are the trades; direction is the *resting* order's
side, so -1 (sell limit executed) is a buyer-initiated trade (BUY) and +1 a seller-initiated one
(SELL). Hidden executions at a half-cent midpoint are rounded toward the aggressor side. Empty
levels (dummy prices +/-9999999999, size 0) become price 0, size 0. Type 7 (halt)
rows carry price -1 and are not trades.
"""
from __future__ import annotations

import datetime as dt
import logging
import re
import zipfile
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np

from trainer.data.tape import BUY, SELL, BookSeries, Instrument, MarketTape, TradeSeries
from trainer.data.validate import Origin, check_finite, check_monotonic, require_file, validate_tape
from trainer.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["read_lobster", "find_lobster_pair", "parse_csv_numbers"]

_NAME_RE = re.compile(
    r"^(?P<ticker>[^_]+)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<start>\d+)_(?P<end>\d+)"
    r"_(?P<kind>message|orderbook)_(?P<levels>\d+)\.csv$"
)
PRICE_SCALE = 10_000  # LOBSTER price = USD x 1e4
TICK_USD = 0.01
DUMMY_PX = 9_999_999_999
EXCHANGE_TZ = ZoneInfo("America/New_York")


def parse_csv_numbers(text: bytes, n_cols: int, path: object) -> np.ndarray:
    """Comma/newline separated numbers -> (rows, n_cols) float64 without a per-row Python loop.

    np.fromstring in text mode parses in C; newlines are turned into separators first. Unparseable
    text stops the parse early, which shows up as a count mismatch and is reported with the row.
    """
    body = text.replace(b"\r", b"").strip(b"\n")
    if not body:
        raise InputError(path, None, "file is empty")
    n_rows = body.count(b"\n") + 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        vals = np.fromstring(body.replace(b"\n", b",").decode("ascii", "replace"), dtype=np.float64, sep=",")
    if vals.size != n_rows * n_cols:
        # Find the first bad row (slow path, only on error).
        for i, line in enumerate(body.split(b"\n")):
            parts = line.split(b",")
            ok = len(parts) == n_cols
            if ok:
                try:
                    [float(p) for p in parts]
                except ValueError:
                    ok = False
            if not ok:
                raise InputError(path, i, f"expected {n_cols} numeric comma-separated columns, got {line[:80]!r}")
        raise InputError(path, None, f"expected {n_rows} x {n_cols} numbers, parsed {vals.size}")
    return vals.reshape(n_rows, n_cols)


def find_lobster_pair(path: str | Path) -> tuple[dict[str, bytes], dict[str, str], re.Match]:
    """Read the message + orderbook files of one LOBSTER pair from a dir, a .zip or one of the files.

    Returns ({'message': bytes, 'orderbook': bytes}, {'message': name, 'orderbook': name}, name match).
    """
    p = Path(path)
    if p.is_dir():
        members = {f.name: f for f in p.iterdir() if _NAME_RE.match(f.name)}
        zips = sorted(p.glob("*.zip"))
        if not members and len(zips) == 1:  # a folder holding one LOBSTER sample zip, as downloaded
            return find_lobster_pair(zips[0])
        reader = lambda name: require_file(members[name]).read_bytes()  # noqa: E731
        label = lambda name: str(members[name])  # noqa: E731
    elif p.suffix == ".zip":
        require_file(p)
        try:
            zf = zipfile.ZipFile(p)
        except zipfile.BadZipFile as e:
            raise InputError(p, None, f"not a zip file ({e})") from e
        members = {Path(n).name: n for n in zf.namelist() if _NAME_RE.match(Path(n).name)}
        reader = lambda name: zf.read(members[name])  # noqa: E731
        label = lambda name: f"{p}!{members[name]}"  # noqa: E731
    else:
        require_file(p)
        m = _NAME_RE.match(p.name)
        if not m:
            raise InputError(p, None, "not a LOBSTER file name (TICKER_DATE_START_END_message|orderbook_LEVELS.csv)")
        members = {f.name: f for f in p.parent.iterdir() if _NAME_RE.match(f.name)}
        members = {k: v for k, v in members.items() if k.startswith(p.name[: m.start("kind")])}
        reader = lambda name: require_file(members[name]).read_bytes()  # noqa: E731
        label = lambda name: str(members[name])  # noqa: E731
    by_kind: dict[str, list[str]] = {"message": [], "orderbook": []}
    for name in members:
        by_kind[_NAME_RE.match(name).group("kind")].append(name)
    for kind in ("message", "orderbook"):
        if len(by_kind[kind]) != 1:
            raise InputError(
                p, None, f"book and trades are both mandatory: need exactly one LOBSTER {kind} file, "
                f"found {len(by_kind[kind])}"
            )
    names = {k: v[0] for k, v in by_kind.items()}
    return ({k: reader(n) for k, n in names.items()}, {k: label(n) for k, n in names.items()},
            _NAME_RE.match(names["message"]))


def read_lobster(path: str | Path, levels: int | None = None) -> MarketTape:
    """LOBSTER pair -> validated MarketTape. `levels` (default: all in the file) keeps the first N."""
    data, labels, m = find_lobster_pair(path)
    msg_path, ob_path = labels["message"], labels["orderbook"]
    msg = parse_csv_numbers(data["message"], 6, msg_path)  # (n, 6)
    ob_text = data["orderbook"]
    first = ob_text.split(b"\n", 1)[0]
    n_cols = first.count(b",") + 1
    if n_cols % 4:
        raise InputError(ob_path, 0, f"orderbook rows need 4 columns per level, got {n_cols}")
    ob = parse_csv_numbers(ob_text, n_cols, ob_path)  # (n, 4L)
    file_levels = n_cols // 4
    if levels is None:
        levels = file_levels
    if not 1 <= levels <= file_levels:
        raise InputError(ob_path, None, f"levels={levels} requested, file has {file_levels}")
    if msg.shape[0] != ob.shape[0]:
        raise InputError(
            ob_path, min(msg.shape[0], ob.shape[0]),
            f"message/orderbook row-count mismatch: {msg.shape[0]} messages vs {ob.shape[0]} book rows",
        )
    n = msg.shape[0]
    m_org = Origin.single(msg_path, np.arange(n))
    b_org = Origin.single(ob_path, np.arange(n))
    check_finite(msg, m_org, "message field")
    check_finite(ob, b_org, "orderbook field")

    # Time: float seconds after local midnight. float64 resolution at 86,400 s is ~1.5e-11 s, so
    # rounding to the nearest ns recovers the printed nanoseconds exactly.
    day = dt.date.fromisoformat(m.group("date"))
    midnight = dt.datetime(day.year, day.month, day.day, tzinfo=EXCHANGE_TZ)
    midnight_ns = int(midnight.timestamp()) * 1_000_000_000
    ts = midnight_ns + np.rint(msg[:, 0] * 1e9).astype(np.int64)  # (n,)
    check_monotonic(ts, m_org, "message")

    ob = ob[:, : 4 * levels].reshape(n, levels, 4)  # (n, L, [ask px, ask sz, bid px, bid sz])
    ask_sz = ob[:, :, 1].astype(np.int64)
    bid_sz = ob[:, :, 3].astype(np.int64)
    tick_scale = int(round(TICK_USD * PRICE_SCALE))  # 100 LOBSTER units per cent tick
    ask_raw = ob[:, :, 0].astype(np.int64)
    bid_raw = ob[:, :, 2].astype(np.int64)
    ask_live = (np.abs(ask_raw) != DUMMY_PX) & (ask_sz != 0)
    bid_live = (np.abs(bid_raw) != DUMMY_PX) & (bid_sz != 0)
    ask_sz = np.where(ask_live, ask_sz, 0)
    bid_sz = np.where(bid_live, bid_sz, 0)
    off = (ask_live & (ask_raw % tick_scale != 0)) | (bid_live & (bid_raw % tick_scale != 0))
    if off.any():
        raise b_org.error(int(np.flatnonzero(off.any(1))[0]), "book price not a multiple of $0.01")

    kind = msg[:, 1].astype(np.int64)
    is_trade = (kind == 4) | (kind == 5)
    t_rows = np.flatnonzero(is_trade)
    t_raw = msg[t_rows, 4].astype(np.int64)
    direction = msg[t_rows, 5].astype(np.int64)
    # Resting sell (-1) executed -> buyer-initiated; resting buy (+1) executed -> seller-initiated.
    side = np.where(direction == -1, BUY, SELL).astype(np.int8)
    t_org = m_org.take(t_rows)
    # Hidden (type 5) executions can print at the half-cent midpoint. Ticks are integers, so such a
    # price is rounded toward the aggressor's own side (BUY down, SELL up): a simulated resting order
    # is then only filled by a trade that really reached its price (never optimistic).
    t_ticks = np.where(side == BUY, np.floor_divide(t_raw, tick_scale), -np.floor_divide(-t_raw, tick_scale))
    n_sub = int(((t_raw > 0) & (t_raw % tick_scale != 0)).sum())
    if n_sub:
        log.info("%s: %d executions off the $0.01 grid rounded toward the aggressor side", msg_path, n_sub)

    tape = MarketTape(
        instrument=Instrument(m.group("ticker"), TICK_USD, TICK_USD),
        book=BookSeries(
            ts,
            np.where(bid_live, bid_raw // tick_scale, 0),
            bid_sz,
            np.where(ask_live, ask_raw // tick_scale, 0),
            ask_sz,
        ),
        trades=TradeSeries(ts[t_rows], t_ticks.astype(np.int64), msg[t_rows, 3].astype(np.int64), side),
        sources=(msg_path, ob_path),
        preopen_end_ns=0,  # LOBSTER samples cover continuous trading only
    )
    return validate_tape(tape, b_org, t_org)
