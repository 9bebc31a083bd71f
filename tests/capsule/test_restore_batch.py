"""restore copies GraphRunners (loads_by_copy) in one batch after validation; others through load_live_state."""

from __future__ import annotations

import threading

import pytest
import torch

from rollcap.capsule import CapsuleMismatch, restore, snapshot
from rollcap.kernels import BufferSpec
from rollcap.kernels.errors import ReplayInFlight
from rollcap.kernels.lanes import CpuLane
from rollcap.kernels.runner import GraphRunner


def _runner(label: str, lane=None) -> GraphRunner:
    return GraphRunner(
        lambda b: {"y": b["x"] * 2},
        [BufferSpec("x", (2, 3), torch.float32)],
        [BufferSpec("y", (2, 3), torch.float32)],
        label=label,
        backend="eager",
        lane=lane,
    )


class _Logged(GraphRunner):
    """A runner that overrides load_live_state: restore must call it, not batch it."""

    calls = 0

    def load_live_state(self, state):
        type(self).calls += 1
        super().load_live_state(state)


def test_batched_restore_puts_every_byte_back():
    """Two runners and an overriding subclass: all restored exactly; the override is called once."""
    a, b = _runner("a"), _runner("b")
    c = _Logged(
        lambda x: {"y": x["x"] * 2},
        [BufferSpec("x", (2, 3), torch.float32)],
        [BufferSpec("y", (2, 3), torch.float32)],
        label="c",
        backend="eager",
    )
    comps = {"a": a, "b": b, "c": c}
    assert a.loads_by_copy and not c.loads_by_copy
    for i, r in enumerate(comps.values()):
        r.write({"x": torch.full((2, 3), float(i + 1))})
        r.launch()
        r.wait()
    cap = snapshot(comps, "t")
    before = {n: {k: v.clone() for k, v in r.live_state().items()} for n, r in comps.items()}
    for r in comps.values():
        r.write({"x": torch.full((2, 3), -7.0)})
        r.launch()
        r.wait()
    _Logged.calls = 0
    restore(cap, comps)
    assert _Logged.calls == 1
    for n, r in comps.items():
        for k, v in r.live_state().items():
            assert torch.equal(v, before[n][k]), (n, k)
    for r in comps.values():
        r.close()


def test_refused_restore_copies_nothing_into_batched_runners():
    """A fingerprint mismatch in the last component leaves the first (batched) one untouched."""
    a, b = _runner("a"), _runner("b")
    cap = snapshot({"a": a, "b": b}, "t")
    a.write({"x": torch.full((2, 3), 5.0)})
    b._fingerprint = dict(b.state_fingerprint(), weights_digest="other")
    with pytest.raises(CapsuleMismatch, match="weights_digest"):
        restore(cap, {"a": a, "b": b})
    assert torch.equal(a.live_state()["in.x"], torch.full((2, 3), 5.0))


def test_restore_while_a_replay_is_in_flight_is_refused():
    """The batch reads its targets through live_state(), so a runner mid-replay still refuses."""
    lane = CpuLane("t", threads=1)
    a = _runner("a", lane)
    cap = snapshot({"a": a}, "t")
    gate = threading.Event()
    lane.submit(gate.wait)
    a.launch()
    with pytest.raises(ReplayInFlight):
        restore(cap, {"a": a})
    gate.set()
    a.wait()
    restore(cap, {"a": a})
    lane.close()
