"""Venue fee schedules per instrument class, chosen from the data's source or the data SPEC's `fee=NAME`.

The simulator charges fees per unit (contract or share) per fill: SimConfig.maker_fee / taker_fee. A schedule
also has notional parts — basis points of the fill's value (crypto venues) and a fee on the value of sales only
(the SEC Section 31 fee on US equities) — which `per_unit_fees(ref_price)` turns into per-unit amounts at a
reference price (the tape's mean mid, `reference_price`). Why not per fill: the notional of each fill would need
new per-env state (and a checkpoint-layout change) in the engine; over one window the price moves by well under
1 % (AMZN 2012-06-21: 218.4–223.9 USD), so the notional fee is off by at most that share of itself. Sale-only fees
are charged half per side: every closed round trip has exactly one sale, so closed-trip totals are exact.

Defaults and where each number comes from (re-check them; venues and regulators change them):

  cme-es     CME E-mini S&P 500 futures, per contract per side: 1.40 USD maker and taker — the project's
             existing default (SimConfig.maker_fee): approximate CME Globex exchange + clearing fee for a
             non-member plus the NFA assessment (0.02 USD); ES has no maker rebate. Default for `synthetic`, `dbn`,
             `dbn-mbo` (the readers decode CME GLBX.MDP3 data).
  us-equity  NASDAQ-listed stock, per share: taker 0.003 USD (the access-fee cap of SEC Reg NMS Rule 610(c),
             which Nasdaq's remove-liquidity fee sits at for ordinary tiers), maker 0 (the rebate, up to
             ~0.003 per share, is left out: conservative); on sales only, the SEC Section 31 fee of 27.80 USD per
             million USD sold (the fiscal-2024 rate, Release 34-99973; the SEC resets it each fiscal year — it was
             0.00 from 2025-05-14) and the FINRA Trading Activity Fee of 0.000166 USD per share sold (its per-trade
             cap of 8.30 USD is not reached by the simulator's few-share orders). Default for `lobster`.
  crypto     spot crypto, 10 bps of notional maker and taker (a large venue's base-tier spot rate, 0.10 %).
  none       no fees (for ablations; never a default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

UNITS = ("contract", "share", "coin")


@dataclass(frozen=True)
class FeeSchedule:
    name: str
    """Schedule name, as written in the data SPEC's `fee=NAME`."""
    unit: str
    """What one simulator unit is: 'contract', 'share' or 'coin'."""
    maker_per_unit: float = 0.0
    """Currency per unit per passive (limit) fill."""
    taker_per_unit: float = 0.0
    """Currency per unit per aggressive (market) fill."""
    maker_bps: float = 0.0
    """Basis points of the fill's notional per passive fill."""
    taker_bps: float = 0.0
    """Basis points of the fill's notional per aggressive fill."""
    sell_bps: float = 0.0
    """Basis points of the notional of sales only (SEC Section 31: 27.80 USD per million = 0.278 bps)."""
    sell_per_unit: float = 0.0
    """Currency per unit sold (FINRA TAF)."""
    source: str = ""
    """Where the numbers come from (shown in the report header)."""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"FeeSchedule.unit must be one of {UNITS}, got {self.unit!r}")
        for name in ("maker_per_unit", "taker_per_unit", "maker_bps", "taker_bps", "sell_bps", "sell_per_unit"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"FeeSchedule.{name} must be finite and >= 0, got {v!r}")

    def per_unit_fees(self, ref_price: float) -> tuple[float, float]:
        """(maker_fee, taker_fee) currency per unit per fill for SimConfig, notional parts at `ref_price`
        (currency per unit); the sale-only parts are split half per side (one sale per round trip)."""
        if not (math.isfinite(ref_price) and ref_price > 0):
            raise ValueError(f"ref_price must be finite and > 0, got {ref_price!r}")
        sale = (self.sell_bps * 1e-4 * ref_price + self.sell_per_unit) / 2
        return (self.maker_per_unit + self.maker_bps * 1e-4 * ref_price + sale,
                self.taker_per_unit + self.taker_bps * 1e-4 * ref_price + sale)

    def describe(self) -> str:
        parts = []
        if self.maker_per_unit or self.taker_per_unit:
            parts.append(f"maker {self.maker_per_unit:g} / taker {self.taker_per_unit:g} per {self.unit} per side")
        if self.maker_bps or self.taker_bps:
            parts.append(f"maker {self.maker_bps:g} / taker {self.taker_bps:g} bps of notional")
        if self.sell_bps:
            parts.append(f"{self.sell_bps * 100:g} USD per million sold")
        if self.sell_per_unit:
            parts.append(f"{self.sell_per_unit:g} per {self.unit} sold")
        return f"{self.name}: " + ("; ".join(parts) or "no fees")


SCHEDULES = {
    "cme-es": FeeSchedule("cme-es", "contract", 1.40, 1.40,
                          source="CME Globex non-member exchange + clearing + NFA, approximate (SimConfig default)"),
    "us-equity": FeeSchedule("us-equity", "share", 0.0, 0.003, sell_bps=0.278, sell_per_unit=0.000166,
                             source="Reg NMS 610(c) access-fee cap; SEC Section 31 FY2024 rate; FINRA TAF"),
    "crypto": FeeSchedule("crypto", "coin", maker_bps=10.0, taker_bps=10.0, source="base-tier spot rate, 0.10 %"),
    "none": FeeSchedule("none", "contract", source="no fees"),
}
DEFAULT_FOR_KIND = {"synthetic": "cme-es", "dbn": "cme-es", "dbn-mbo": "cme-es", "lobster": "us-equity"}
"""The data readers know the source: Databento GLBX.MDP3 files are CME futures, LOBSTER files NASDAQ equities."""


def fee_schedule(kind: str, name: str | None = None) -> FeeSchedule:
    """The schedule named in the SPEC (`fee=NAME`), else the default for the data kind; ValueError naming both."""
    if name is not None:
        if name not in SCHEDULES:
            raise ValueError(f"fee={name!r}: unknown fee schedule (one of {', '.join(SCHEDULES)})")
        return SCHEDULES[name]
    if kind not in DEFAULT_FOR_KIND:
        raise ValueError(f"no default fee schedule for data kind {kind!r} (give fee=NAME)")
    return SCHEDULES[DEFAULT_FOR_KIND[kind]]


def schedule_for_spec(spec: str) -> FeeSchedule:
    """The schedule for a `--data SPEC` string (its kind, or its `fee=NAME`)."""
    from trainer.data.spec import parse_spec

    p = parse_spec(spec)
    return fee_schedule(p.kind, p.options.get("fee"))  # type: ignore[arg-type]


def reference_price(bid_px_ticks: np.ndarray, ask_px_ticks: np.ndarray, tick_value: float) -> float:
    """Mean mid of the tape in currency per unit: mid ticks × tick_value (tick_value is the currency value of one
    tick for one unit, so ES gives the contract's notional and a stock its share price). Rows with a missing
    side (price 0) are left out."""
    bid = np.asarray(bid_px_ticks, dtype=np.float64)
    ask = np.asarray(ask_px_ticks, dtype=np.float64)
    ok = (bid > 0) & (ask > 0)
    if not ok.any():
        raise ValueError("reference_price: no row with both a bid and an ask")
    return float(np.mean((bid[ok] + ask[ok]) / 2) * tick_value)


def venue_fees(spec: str, bid_px_ticks: np.ndarray, ask_px_ticks: np.ndarray, tick_value: float) -> dict:
    """What a trainer needs to charge the venue's fees: SimConfig's `maker_fee` / `taker_fee` for the data SPEC's
    schedule at the tape's reference price, plus `schedule` and `ref_price` for run.json's `fees` block (the report
    header reads `schedule` to tell that the run charged this schedule)."""
    sch = schedule_for_spec(spec)
    ref = reference_price(bid_px_ticks, ask_px_ticks, tick_value)
    maker, taker = sch.per_unit_fees(ref)
    return {"schedule": sch.name, "unit": sch.unit, "ref_price": ref, "maker_fee": maker, "taker_fee": taker}
