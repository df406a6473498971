"""trainer.data.fees: schedules chosen from the data kind or the SPEC, per-unit fees on hand cases, the reference
price of the real AMZN LOBSTER sample."""
from __future__ import annotations

import pytest

from trainer.data.lobster import read_lobster
from trainer.errors import InputError
from trainer.sim import SimConfig
from trainer.data.fees import (SCHEDULES, FeeSchedule, fee_schedule, reference_price, schedule_for_spec,
                               venue_fees)


def test_each_data_kind_gets_its_venue_schedule_and_the_spec_can_override_it():
    assert schedule_for_spec("synthetic:seed=1").name == "cme-es"
    assert schedule_for_spec("dbn-mbo:/a/x.dbn.zst;symbol=ESH4").name == "cme-es"
    assert schedule_for_spec("lobster:/d/AMZN.zip").name == "us-equity"
    assert schedule_for_spec("lobster:/d/AMZN.zip;levels=3,fee=crypto").name == "crypto"
    with pytest.raises(ValueError, match="fee='cme'.*unknown fee schedule.*cme-es"):
        schedule_for_spec("synthetic:fee=cme")
    with pytest.raises(InputError, match="unknown key 'fees'"):
        schedule_for_spec("synthetic:fees=none")
    with pytest.raises(ValueError, match="no default fee schedule"):
        fee_schedule("csv")


def test_cme_es_schedule_is_the_simulators_existing_default():
    cfg = SimConfig()
    assert SCHEDULES["cme-es"].per_unit_fees(250_000.0) == (cfg.maker_fee, cfg.taker_fee) == (1.40, 1.40)


def test_us_equity_fees_on_a_hand_round_trip():
    s = SCHEDULES["us-equity"]
    maker, taker = s.per_unit_fees(50.0)
    # buy 100 shares at market, sell 100 at market, price 50: access fees 2 x 100 x 0.003 = 0.60; SEC fee on the
    # 5,000 USD sold: 5,000 x 27.80 / 1e6 = 0.139; FINRA TAF 100 x 0.000166 = 0.0166. Total 0.7556.
    assert 200 * taker == pytest.approx(0.60 + 0.139 + 0.0166)
    assert 200 * maker == pytest.approx(0.139 + 0.0166)  # no access fee for adding liquidity (rebate left out)
    assert "27.8 USD per million sold" in s.describe() and "per share sold" in s.describe()


def test_crypto_fees_are_basis_points_of_notional():
    assert SCHEDULES["crypto"].per_unit_fees(30_000.0) == pytest.approx((30.0, 30.0))  # 10 bps of 30,000
    with pytest.raises(ValueError, match="ref_price"):
        SCHEDULES["crypto"].per_unit_fees(0.0)
    with pytest.raises(ValueError, match="FeeSchedule.taker_bps"):
        FeeSchedule("x", "coin", taker_bps=-1.0)


def test_reference_price_of_the_amzn_sample_is_its_share_price(shared_data):
    tape = read_lobster(shared_data / "lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip")
    ref = reference_price(tape.book.bid_px[:, 0], tape.book.ask_px[:, 0], tape.instrument.tick_value)
    assert 218.0 < ref < 224.0  # AMZN traded 218-224 USD on 2012-06-21
    maker, taker = SCHEDULES["us-equity"].per_unit_fees(ref)
    assert taker == pytest.approx(0.003 + (0.278e-4 * ref + 0.000166) / 2) and 0.006 < taker < 0.0062
    v = venue_fees("lobster:/d/AMZN.zip", tape.book.bid_px[:, 0], tape.book.ask_px[:, 0], tape.instrument.tick_value)
    assert v == {"schedule": "us-equity", "unit": "share", "ref_price": ref, "maker_fee": maker, "taker_fee": taker}


def test_venue_fees_on_the_cme_default_keep_the_simulators_fee():
    v = venue_fees("synthetic:seed=1", [19_000, 0], [19_001, 19_002], 12.5)  # the row without a bid is left out
    assert v["ref_price"] == 19_000.5 * 12.5 and (v["maker_fee"], v["taker_fee"]) == (1.40, 1.40)


@pytest.mark.slow
def test_a_lobster_training_run_charges_the_us_equity_schedule_and_run_json_says_so(shared_data, tmp_path):
    """The trainer (SimConfig.fees='venue') sets the simulator's fees from the data's schedule; 'manual' keeps them."""
    import json
    import os
    import subprocess
    import sys

    spec = f"lobster:{shared_data / 'lobster/LOBSTER_SampleFile_AMZN_2012-06-21_5.zip'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for fees, run in (("venue", tmp_path / "venue"), ("manual", tmp_path / "manual")):
        cmd = [sys.executable, "-m", "trainer.train", "--run-dir", str(run), "--fold", "0", "--folds", "3",
               "--data", spec, "--preset", "smoke", "--n-steps", "40", "--loop.select-frac", "0",
               "--loop.max-exposure", "1",
               "--sim.fees", fees, "--fxcache", str(tmp_path / "fxcache")]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    venue = json.loads((tmp_path / "venue" / "run.json").read_text())
    assert venue["fees"]["schedule"] == "us-equity"
    sim = venue["config"]["sim"]
    assert (sim["maker_fee"], sim["taker_fee"]) == (venue["fees"]["maker_fee"], venue["fees"]["taker_fee"])
    assert 0.003 < sim["taker_fee"] < 0.007 and sim["maker_fee"] < sim["taker_fee"]  # cents a share, not 1.40
    manual = json.loads((tmp_path / "manual" / "run.json").read_text())
    assert "fees" not in manual and (manual["config"]["sim"]["maker_fee"], manual["config"]["sim"]["taker_fee"]) \
        == (SimConfig().maker_fee, SimConfig().taker_fee)
