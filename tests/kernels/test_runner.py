"""GraphRunner: one launch in flight, lane-timed latency, drain; CUDA lanes overlap."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import torch

from rollcap.kernels import BadInput, BufferSpec, CpuLane, LaneError
from rollcap.kernels.errors import ReplayInFlight
from rollcap.kernels.runner import GraphRunner

X = BufferSpec("x", (1, 4), torch.float32)
Y = BufferSpec("y", (1, 4), torch.float32)


def _runner(fn, lane=None, backend="eager") -> GraphRunner:
    return GraphRunner(fn, [X], [Y], backend=backend, lane=lane, label="t")


def _double(b):
    return {"y": b["x"] * 2}


def _blocked(lane: CpuLane) -> threading.Event:
    """Queue a call that holds ``lane`` until the returned gate is set."""
    gate = threading.Event()
    lane.submit(gate.wait, 5)
    return gate


@pytest.mark.parametrize("backend", ["eager", "jit"])
def test_write_launch_wait_round_trip(backend):
    """wait() returns the replay's outputs and its latency on the lane."""
    r = _runner(_double, backend=backend)
    r.write({"x": torch.arange(4.0).reshape(1, 4)})
    r.launch()
    assert torch.equal(r.wait()["y"], torch.arange(4.0).reshape(1, 4) * 2)
    assert r.last_latency_s > 0
    r.close()


def test_one_launch_in_flight_at_a_time():
    """While a replay is queued, writing, launching again and reading state are refused."""
    lane = CpuLane("t", threads=1)
    r = _runner(_double, lane)
    gate = _blocked(lane)
    r.launch()
    with pytest.raises(ReplayInFlight, match="inputs written while a replay is in flight"):
        r.write({"x": torch.ones(1, 4)})
    with pytest.raises(ReplayInFlight, match="launch"):
        r.launch()
    with pytest.raises(ReplayInFlight, match="state read"):
        r.live_state()
    gate.set()
    r.wait()
    r.write({"x": torch.ones(1, 4)})  # idle again
    lane.close()


@pytest.mark.parametrize("backend", ["eager", "jit"])
def test_run_in_caller_replays_in_the_waiting_thread_with_the_same_outputs(backend):
    """run_in_caller(): launch() queues nothing, wait() replays here; outputs equal the lane's; off again goes back to the lane."""
    threads = []

    def fn(b):
        threads.append(threading.get_ident())
        return {"y": b["x"] * 2 + 1}

    r = _runner(fn, backend=backend)
    x = torch.arange(4.0).reshape(1, 4)
    r.write({"x": x})
    r.launch()
    on_lane = r.wait()["y"].clone()
    r.run_in_caller()
    assert r.in_caller
    r.write({"x": x})
    threads.clear()
    r.launch()
    with pytest.raises(ReplayInFlight, match="inputs written"):  # the replay reads them later, at wait()
        r.write({"x": torch.zeros(1, 4)})
    with pytest.raises(ReplayInFlight, match="run_in_caller"):
        r.run_in_caller(False)
    assert torch.equal(r.wait()["y"], on_lane) and r.last_latency_s > 0
    if backend == "eager":  # a traced plan does not call fn again
        assert threads == [threading.get_ident()]
    r.run_in_caller(False)
    assert not r.in_caller
    r.write({"x": x})
    r.launch()
    assert torch.equal(r.wait()["y"], on_lane)
    r.close()


def test_drain_drops_an_in_caller_replay_nobody_waited_for():
    """An episode that failed between launch and wait: drain() discards the replay without running it."""
    calls = []
    r = _runner(lambda b: calls.append(1) or {"y": b["x"]})
    calls.clear()  # capture ran it
    r.run_in_caller()
    r.write({"x": torch.ones(1, 4)})
    r.launch()
    r.drain()
    assert calls == []
    r.write({"x": torch.ones(1, 4)})  # idle again
    r.close()


def test_latency_is_the_replay_not_the_queue():
    """last_latency_s counts the replay on its lane, not the time it waited behind other work."""
    lane = CpuLane("t", threads=1)
    r = _runner(_double, lane)
    gate = _blocked(lane)
    t0 = time.perf_counter()
    r.launch()
    threading.Timer(0.2, gate.set).start()
    r.wait()
    assert time.perf_counter() - t0 >= 0.2
    assert 0 < r.last_latency_s < 0.1
    lane.close()


def test_drain_waits_out_a_launch_in_flight():
    """drain() waits for the replay in flight, discards it, and the next round trip works."""
    lane = CpuLane("t", threads=1)
    r = _runner(_double, lane)
    r.drain()  # nothing in flight: a no-op
    gate = _blocked(lane)
    r.write({"x": torch.ones(1, 4)})
    ticket = r.launch()
    threading.Timer(0.05, gate.set).start()
    r.drain()
    assert ticket.done()
    r.write({"x": torch.full((1, 4), 3.0)})
    r.launch()
    assert torch.equal(r.wait()["y"], torch.full((1, 4), 6.0))
    with pytest.raises(BadInput, match="without launch"):
        r.wait()  # drain discarded the first replay: nothing left to wait for
    lane.close()


class _Flaky:
    """A graph function (eager backend) that raises while ``failing`` is set."""

    failing = False

    def __call__(self, b):
        if self.failing:
            raise ZeroDivisionError("replay failed")
        return _double(b)


def test_drain_swallows_a_failed_replay():
    """A replay that fails is discarded by drain() without raising; the runner works again."""
    fn = _Flaky()
    r = _runner(fn)
    fn.failing = True
    r.launch()
    r.drain()
    fn.failing = False
    r.write({"x": torch.ones(1, 4)})
    r.launch()
    assert torch.equal(r.wait()["y"], torch.full((1, 4), 2.0))
    r.close()


def test_failed_replay_is_reraised_by_wait_and_leaves_the_runner_idle():
    """wait() re-raises a failed replay as LaneError (chained); the next launch is allowed."""
    fn = _Flaky()
    r = _runner(fn)
    fn.failing = True
    r.launch()
    with pytest.raises(LaneError, match="ZeroDivisionError") as info:
        r.wait()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    fn.failing = False
    r.launch()
    r.wait()
    r.close()


# -- CUDA -------------------------------------------------------------------------
SPIN_S = 0.05  # GPU time of one spin replay
REPEATS = 7


def _spin_cycles(seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for about ``seconds`` (measured with events)."""
    probe = 10_000_000
    for _ in range(3):  # let the clocks come up first
        torch.cuda._sleep(probe)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * seconds / (start.elapsed_time(end) / 1e3))


def _spin_runner(seconds: float) -> GraphRunner:
    """A CUDA graph that occupies one GPU thread for about ``seconds`` (leaves SMs free for another lane)."""
    cycles = _spin_cycles(seconds)

    def fn(b):
        torch.cuda._sleep(cycles)
        return {"y": b["x"] + 1}

    return GraphRunner(fn, [X], [Y], device="cuda", label="spin")


def _matmul_runner(steps: int = 1500, width: int = 256) -> GraphRunner:
    """A CUDA graph of ``steps`` small batch-1 matmuls: latency-bound, like the policy and critic."""
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(width, width, generator=gen) / width**0.5).cuda()
    spec_in, spec_out = BufferSpec("x", (1, width), torch.float32), BufferSpec("y", (1, width), torch.float32)

    def fn(b):
        x = b["x"]
        for _ in range(steps):
            x = torch.tanh(x @ w)
        return {"y": x}

    return GraphRunner(fn, [spec_in], [spec_out], device="cuda", label="matmul")


def _round(runners, together: bool) -> float:
    """Wall seconds of one replay on each runner, launched together or one after the other."""
    t0 = time.perf_counter()
    if together:
        for r in runners:
            r.launch()
        for r in runners:
            r.wait()
    else:
        for r in runners:
            r.launch()
            r.wait()
    return time.perf_counter() - t0


@pytest.mark.cuda
@pytest.mark.parametrize("work", ["spin", "matmul"])
def test_two_cuda_lanes_overlap(work):
    """Two runners on two CUDA lanes launched together finish in < 0.9x the serial time (median of 7)."""
    make = {"spin": lambda: _spin_runner(SPIN_S), "matmul": _matmul_runner}[work]
    a, b = make(), make()
    assert a.lane.stream != b.lane.stream
    for r in (a, b):  # first replays pay one-off costs
        r.launch()
        r.wait()
    serial, together = [], []
    for _ in range(REPEATS):
        serial.append(_round((a, b), together=False))
        together.append(_round((a, b), together=True))
    assert min(a.last_latency_s, b.last_latency_s) > 1e-3, "each replay must do enough work to measure overlap"
    ser, par = statistics.median(serial), statistics.median(together)
    assert par < 0.9 * ser, (
        f"{work}: together {par * 1e3:.2f} ms vs serial {ser * 1e3:.2f} ms: the lanes did not overlap"
    )


@pytest.mark.cuda
def test_cuda_launch_returns_before_the_replay_finishes():
    """launch() only enqueues (no host synchronisation); wait() blocks; latency is the replay's GPU time."""
    r = _spin_runner(SPIN_S)
    r.launch()
    r.wait()
    launch_s, wall_s = [], []
    for _ in range(5):
        r.write({"x": torch.ones(1, 4)})
        t0 = time.perf_counter()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call in launch() raises
        try:
            ticket = r.launch()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        launch_s.append(time.perf_counter() - t0)
        assert not ticket.done()
        with pytest.raises(ReplayInFlight):
            r.write({"x": torch.ones(1, 4)})
        out = r.wait()
        wall_s.append(time.perf_counter() - t0)
        assert ticket.done()
        assert torch.equal(out["y"].cpu(), torch.full((1, 4), 2.0))
        assert 0.25 * SPIN_S < r.last_latency_s <= wall_s[-1] + 1e-3  # the replay's time, not launch()'s
    assert statistics.median(launch_s) < 0.2 * statistics.median(wall_s)


@pytest.mark.cuda
def test_cuda_drain_then_round_trip():
    """drain() on a CUDA lane waits for the replay's event; the next write/launch/wait works."""
    r = _spin_runner(SPIN_S)
    r.write({"x": torch.ones(1, 4)})
    ticket = r.launch()
    r.drain()
    assert ticket.done()
    r.write({"x": torch.full((1, 4), 5.0)})
    r.launch()
    assert torch.equal(r.wait()["y"].cpu(), torch.full((1, 4), 6.0))


@pytest.mark.cuda
def test_policy_and_critic_launched_together_equal_eager():
    """The tiny policy and critic on two CUDA lanes, launched together, give their eager results."""
    from rollcap.critics import CriticRunner
    from rollcap.policies import PolicyRunner
    from tests.helpers import make_noise, make_obs, tiny_critic, tiny_policy

    policy, critic = PolicyRunner(tiny_policy(), device="cuda"), CriticRunner(tiny_critic(), device="cuda")
    for seed in range(3):
        obs, noise = make_obs(seed), make_noise(seed)
        policy.load(obs, noise)
        critic.load(obs)
        policy.launch()
        critic.launch()
        actions, value = policy.result(), critic.result()
        assert (actions == policy.act_eager(obs, noise)).all()
        assert value == critic.value_eager(obs)


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 2.0), requires_grad=False)

    def forward(self, x):
        return x * self.w


@pytest.mark.parametrize("backend", ["eager", "jit"])
def test_load_weights_reach_the_captured_plan_in_place(backend):
    """New weights copied into the module the plan reads change the next replay, with no recapture; the digest is
    the new weights'; one in flight is refused; a name the module lacks is refused and the weights stay."""
    from rollcap.kernels.graph import capture_count

    lane = CpuLane("t", threads=1)
    m = _Scale()
    r = GraphRunner(lambda b: {"y": m(b["x"])}, [X], [Y], backend=backend, modules=[m], lane=lane, label="t")
    before, x = capture_count(), torch.arange(4.0).reshape(1, 4)
    digest = r.load_weights({"w": torch.full((4,), 3.0)})
    assert digest.startswith("sha256:") and r.state_fingerprint()["weights_digest"] == digest
    r.write({"x": x})
    r.launch()
    assert torch.equal(r.wait()["y"], x * 3) and capture_count() == before
    gate = _blocked(lane)
    r.launch()
    with pytest.raises(ReplayInFlight):
        r.load_weights({"w": torch.zeros(4)})
    gate.set()
    r.wait()
    with pytest.raises(BadInput, match=r"t: new weights lack \['w'\] and have unknown \['v'\]"):
        r.load_weights({"v": torch.zeros(4)})
    assert torch.equal(m.w, torch.full((4,), 3.0))
    r.close()


def test_load_weights_refuses_a_plan_with_its_own_copy():
    """A compiled plan (aoti, compile) holds the weights it was built with: new weights are refused, in one line."""
    r = _runner(_double)
    r.backend = (
        "aoti"  # what the refusal reads; building a real one needs a C++ compiler (tests/kernels/test_compiled.py)
    )
    with pytest.raises(BadInput, match="backend aoti compiled the weights into its plan"):
        r.load_weights({})
