"""`SideStream`: run a stretch of independent device work concurrently with the current CUDA stream.

    side = SideStream(device)
    with side.fork():        # side waits for everything queued so far on the current stream, then runs the block
        a = f(x)
    b = g(y)                 # queued on the current stream: runs on the device concurrently with f
    side.join()              # the current stream waits for the side's work; now a may be read

The small kernels of one training step each fill only a fraction of an H200, so two independent chains of them
(acting vs the learner's backward, the target net's forward vs the online forward) overlap on the device. Values
are unchanged: only the order in which independent kernels run changes, and the host issues every call (random
draws included) in the same order, so a CUDA graph captures the fork and join as parallel branches and replays
the same numbers as eager.

Rules the callers keep (the caching allocator ties a block to the stream that allocated it): a tensor made inside
`fork()` is read on the current stream only after `join()`; a tensor the block reads was made before the fork or
inside it; nothing the block writes is read or written by the current stream before `join()`.

On CPU, or with `enabled=False`, `fork()` runs the block in place and `join()` does nothing: the same calls in the
same order, one after another.

`SideStream(device, sm_share=s)` with s < 1 takes its stream from a CUDA green context holding that share of the SMs:
the block's kernels run on those SMs only, while the current stream's kernels may use every SM. Acting takes this,
so that its large kernels cannot hold the whole device while the learner's chain of small ones waits
(docs/BENCHMARKS.md, "Acting on part of the SMs").
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


HIGH_PRIORITY, LOW_PRIORITY = -1, 0
"""CUDA stream priorities (lower is more urgent): when SMs free up, the block scheduler starts waiting blocks of a
high-priority stream's kernels before those of a low-priority one. A captured kernel keeps its stream's priority in
the graph when the graph is instantiated with cudaGraphInstantiateFlagUseNodePriority, as PyTorch does (pytorch
PR 167346); what the priorities gain on an H200 is in docs/BENCHMARKS.md, "Acting on part of the SMs"."""


SM_GRANULE = 8
"""Green contexts take SMs in groups: 8 from compute capability 9.0 on (CUDA driver API, "Green Contexts"); a
multiple of 8 is a valid count on every architecture that has them."""


def green_context_sms(share: float, device_sms: int) -> int | None:
    """SMs for a green context holding `share` of a device of `device_sms` SMs: rounded down to whole granules, at
    least one; None for a share of 1 or when the granules cover the whole device (no green context needed)."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"SM share must be in (0, 1], got {share!r}")
    sms = max(SM_GRANULE, int(share * device_sms) // SM_GRANULE * SM_GRANULE)
    return None if share == 1.0 or sms >= device_sms else sms


class SideStream:
    def __init__(self, device: torch.device | str, enabled: bool = True, priority: int = LOW_PRIORITY,
                 sm_share: float = 1.0):
        """`sm_share` < 1 confines the side stream's kernels to that share of the device's SMs (a green context;
        its stream has the default priority, LOW_PRIORITY). Where green contexts are unavailable (an older torch or
        driver) the stream is an ordinary one; `sms` says which it got (None: every SM)."""
        device = torch.device(device)
        self.stream, self.sms, self._green = None, None, None
        if not (enabled and device.type == "cuda"):
            return
        sms = green_context_sms(sm_share, torch.cuda.get_device_properties(device).multi_processor_count)
        if sms is not None:
            try:
                from torch.cuda.green_contexts import GreenContext

                index = device.index if device.index is not None else torch.cuda.current_device()
                self._green = GreenContext.create(sms, index)  # kept alive: the stream lives in it
                self.stream, self.sms = self._green.Stream(), sms
                return
            except (ImportError, AttributeError, RuntimeError):  # no green contexts here: every SM, as below
                self._green = None
        self.stream = torch.cuda.Stream(device, priority=priority)

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield

    def join(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
