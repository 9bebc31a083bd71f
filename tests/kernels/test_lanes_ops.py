"""Lanes run work concurrently and deliver failures; the fused op matches its reference."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rollcap.kernels import CpuLane, CudaLane, LaneError, cfg_euler_step, cfg_euler_step_reference
from rollcap.kernels.lanes import CallerLane, Ticket


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


def test_ticket_seconds_is_the_call_on_the_lane():
    """Ticket.seconds is how long the call ran on the lane, not how long it queued."""
    lane = CpuLane("t", threads=1)
    gate = threading.Event()
    lane.submit(gate.wait, 5)
    ticket = lane.submit(time.sleep, 0.05)
    threading.Timer(0.2, gate.set).start()
    ticket.wait(5)
    assert 0.05 <= ticket.seconds < 0.15
    lane.close()


def test_a_caller_lane_runs_the_call_in_the_waiting_thread_with_its_budget():
    """submit() runs nothing; wait() runs the call here with the lane's thread count, then puts the caller's back."""
    lane = CallerLane("here", threads=1)
    seen = []
    ticket = lane.submit(lambda: seen.append((threading.get_ident(), torch.get_num_threads())) or 7)
    assert seen == [] and not ticket.done()
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert ticket.wait() == 7 and ticket.done() and ticket.seconds >= 0
        assert seen == [(threading.get_ident(), 1)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(outer)


def test_a_caller_lane_failure_is_a_lane_error_and_an_interrupt_stays_an_interrupt():
    """An exception comes back as LaneError (chained); KeyboardInterrupt propagates, and settling afterwards is quiet."""
    lane = CallerLane("here")

    def fail():
        raise ZeroDivisionError("x")

    with pytest.raises(LaneError, match="lane here: ZeroDivisionError") as info:
        lane.submit(fail).wait()
    assert isinstance(info.value.__cause__, ZeroDivisionError)

    def interrupt():
        raise KeyboardInterrupt

    ticket = lane.submit(interrupt)
    with pytest.raises(KeyboardInterrupt):
        ticket.wait()
    assert ticket.done()
    ticket.settle()  # the call is over: nothing runs again, nothing is raised


def test_settling_a_caller_ticket_that_never_ran_drops_the_call():
    """settle() on a call nobody waited for does not run it."""
    ran = []
    ticket = CallerLane("here").submit(ran.append, 1)
    ticket.settle()
    assert ran == [] and ticket.done()


class _FakeEvent:
    """Stands in for a CUDA event on a machine without one: complete once ``fired`` is set."""

    def __init__(self, fired: threading.Event, fail: bool = False):
        self.fired, self.fail = fired, fail

    def query(self) -> bool:
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.fired.is_set()

    def synchronize(self) -> None:
        self.fired.wait(5)
        self.query()

    def elapsed_time(self, end) -> float:
        return 25.0  # milliseconds, as CUDA reports it


def _event_ticket(fired: threading.Event, fail: bool = False) -> Ticket:
    """A ticket as CudaLane.submit leaves it: the call returned, its device work pending on an end event."""
    t = Ticket("gpu")
    t._events = (_FakeEvent(fired), _FakeEvent(fired, fail))
    t._finish(result="out")
    return t


def test_event_ticket_waits_on_its_end_event():
    """A CUDA-lane ticket is done when its end event is; wait() blocks on that event; seconds come from the events."""
    fired = threading.Event()
    t = _event_ticket(fired)
    assert not t.done()
    with pytest.raises(LaneError, match="wait\\(\\) first"):
        t.seconds
    with pytest.raises(TimeoutError):
        t.wait(timeout=0.01)
    threading.Timer(0.05, fired.set).start()
    assert t.wait() == "out"
    assert t.done() and t.seconds == 0.025


@pytest.mark.slow
def test_event_ticket_reports_an_asynchronous_device_failure():
    """A device failure that surfaces at the end event comes back from wait() and done() as LaneError."""
    t = _event_ticket(threading.Event(), fail=True)
    with pytest.raises(LaneError, match="lane gpu: RuntimeError: CUDA error") as info:
        t.wait()
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(LaneError):
        t.done()


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


@pytest.mark.cuda
def test_cuda_lane_failure_after_enqueue_is_reraised_at_wait():
    """fn failing after it enqueued work: wait() covers that work, then raises LaneError; the lane goes on."""
    lane = CudaLane("gpu")
    x = torch.ones(1024, device="cuda")

    def fail():
        x.mul_(2)
        raise ZeroDivisionError("after enqueue")

    ticket = lane.submit(fail)
    with pytest.raises(LaneError, match="ZeroDivisionError") as info:
        ticket.wait()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert ticket.done()
    assert lane.run(lambda: x.sum()).item() == 2048.0
