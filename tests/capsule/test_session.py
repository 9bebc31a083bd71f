"""Session history and rollback to an earlier boundary."""

from __future__ import annotations

import _capsule_components as comps
import pytest

from rollcap.capsule import Session, UnknownBoundary, rollback
from rollcap.kernels import capture_count


def test_rollback_then_replay_reproduces(world):
    """Roll back to boundary k, replay k..m: byte-identical to the first pass; no recapture."""
    session = Session(world, max_boundaries=8)
    outputs = {}
    for k in range(2, 7):
        session.snapshot("chunk", chunk=k)
        outputs[k] = comps.run_chunk(world, k)
    n = capture_count()
    restored = rollback(session, session.ids[1])  # boundary before chunk 3
    assert restored.boundary.chunk == 3
    assert [comps.run_chunk(world, k) for k in range(3, 7)] == [outputs[k] for k in range(3, 7)]
    assert capture_count() == n


def test_rollback_truncates_the_abandoned_future(world):
    """After a rollback the later boundaries are gone; the target stays and can be rolled back to again."""
    session = Session(world)
    for k in range(4):
        session.snapshot(f"b{k}", chunk=k)
        comps.run_chunk(world, k)
    ids = session.ids
    rollback(session, "b1")
    assert session.ids == ids[:2]
    first = comps.run_chunk(world, 1)
    comps.run_chunk(world, 2)
    rollback(session, ids[1])
    assert comps.run_chunk(world, 1) == first


def test_rollback_without_truncate_keeps_history(world):
    """truncate=False keeps every boundary, so one can jump forward again."""
    session = Session(world)
    session.snapshot("a")
    comps.run_chunk(world, 2)
    session.snapshot("b")
    after_b = comps.state_bytes(world)
    rollback(session, "a", truncate=False)
    assert len(session) == 2
    rollback(session, "b")
    assert comps.state_bytes(world) == after_b


def test_history_is_bounded(world):
    """Only max_boundaries are kept; rolling back to a dropped one names what is kept."""
    session = Session(world, max_boundaries=3, tier="host")
    for k in range(5):
        session.snapshot("chunk", chunk=k)
    assert session.ids == [2, 3, 4]
    assert all(c.tier == "host" for c in session.boundaries)
    assert session.nbytes == 3 * session.boundaries[0].nbytes
    with pytest.raises(UnknownBoundary, match="kept: 2:'chunk', 3:'chunk', 4:'chunk'"):
        rollback(session, 0)
    with pytest.raises(UnknownBoundary):
        rollback(session, "never")
    with pytest.raises(ValueError, match="max_boundaries"):
        Session(world, max_boundaries=0)
