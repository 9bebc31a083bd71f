"""Lanes run work concurrently and deliver failures; the fused op matches its reference."""

from __future__ import annotations

import threading

import pytest
import torch

from rollcap.kernels import CpuLane, LaneError, cfg_euler_step, cfg_euler_step_reference


def test_submit_returns_before_work_finishes():
    """submit() does not block; wait() returns the result."""
    lane = CpuLane("t", threads=1)
    gate = threading.Event()
    ticket = lane.submit(lambda: gate.wait(5) and 42)
    assert not ticket.done()
    gate.set()
    assert ticket.wait(5) == 42
    lane.close()


def test_lane_failure_is_reraised_with_cause():
    """An exception on the lane comes back from wait() as LaneError, chained."""
    lane = CpuLane("boom", threads=1)

    def fail():
        raise ZeroDivisionError("x")

    with pytest.raises(LaneError, match="lane boom: ZeroDivisionError") as info:
        lane.submit(fail).wait(5)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert lane.run(lambda: "still alive") == "still alive"
    lane.close()


def test_lane_uses_its_own_thread_budget():
    """Each CPU lane runs torch with its own intra-op thread count."""
    lane = CpuLane("one", threads=1)
    assert lane.run(torch.get_num_threads) == 1
    lane.close()


def test_cfg_step_cpu_matches_reference():
    """On CPU the fused entry point is the reference, bit-for-bit."""
    g = torch.Generator().manual_seed(0)
    x, vu, vc = (torch.randn(1, 8, 2, generator=g) for _ in range(3))
    assert torch.equal(cfg_euler_step(x, vu, vc, -0.1, 1.5), cfg_euler_step_reference(x, vu, vc, -0.1, 1.5))


@pytest.mark.cuda
def test_triton_cfg_step_matches_reference():
    """The Triton kernel equals the torch reference on CUDA (fp32)."""
    from rollcap.kernels.ops import triton_available

    if not triton_available():
        pytest.skip("triton is not importable")
    x, vu, vc = (torch.randn(3, 50, 7, device="cuda") for _ in range(3))
    got = cfg_euler_step(x, vu, vc, -0.1, 1.5)
    want = cfg_euler_step_reference(x, vu, vc, -0.1, 1.5)
    assert torch.allclose(got, want, rtol=0, atol=1e-6)
