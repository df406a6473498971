"""trainer.streams: side streams, and the green-context share acting runs in."""
from __future__ import annotations

import pytest
import torch

from trainer.streams import SM_GRANULE, SideStream, green_context_sms


def test_green_context_sms_rounds_a_share_down_to_whole_granules() -> None:
    assert SM_GRANULE == 8
    assert green_context_sms(0.5, 132) == 64  # H100/H200: 66 → 64
    assert green_context_sms(0.99, 132) == 128
    assert green_context_sms(0.5, 108) == 48  # A100: 54 → 48
    assert green_context_sms(0.01, 132) == 8  # at least one granule


def test_green_context_sms_is_none_for_the_whole_device() -> None:
    assert green_context_sms(1.0, 132) is None
    assert green_context_sms(0.5, 8) is None  # one granule is the whole device


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_green_context_sms_refuses_a_share_outside_0_1(share: float) -> None:
    with pytest.raises(ValueError, match="SM share must be in"):
        green_context_sms(share, 132)


def test_on_cpu_fork_runs_in_place_and_join_does_nothing() -> None:
    side = SideStream("cpu", sm_share=0.5)
    assert side.stream is None and side.sms is None
    x = torch.zeros(3)
    with side.fork():
        x += 1
    side.join()
    assert x.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.gpu
def test_side_stream_with_an_sm_share_gets_a_green_context_of_the_rounded_count_and_computes_on_it() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run through `device`)")
    device_sms = torch.cuda.get_device_properties(0).multi_processor_count
    side = SideStream("cuda", sm_share=0.5)
    assert side.sms == green_context_sms(0.5, device_sms)
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    with side.fork():
        y = x * 2
    side.join()
    assert torch.equal(y, x * 2)
    assert SideStream("cuda", sm_share=1.0).sms is None  # the whole device: an ordinary stream
