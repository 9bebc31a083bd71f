"""Subscribers: the background writer keeps order, drains on close, surfaces failures; metrics."""

from __future__ import annotations

import threading
import time

import pytest

from rollcap.rollout.errors import RecordingFailed
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.subscribers import InBackground, Metrics


def end(index: int, success: bool = False, stop_reason: str = "success") -> EpisodeEnd:
    return EpisodeEnd(index, seed=index, stop_reason=stop_reason, success=success, num_steps=3, num_chunks=1)


class Slow(Subscriber):
    def __init__(self, fail_at: int | None = None):
        self.seen: list[int] = []
        self.threads: set[str] = set()
        self.closed = False
        self.fail_at = fail_at

    def on_episode_end(self, end):
        time.sleep(0.01)
        self.threads.add(threading.current_thread().name)
        if end.index == self.fail_at:
            raise OSError("disk full")
        self.seen.append(end.index)

    def close(self):
        self.closed = True


def test_background_writer_keeps_order_and_drains_on_close():
    """Episodes are handled in order on the writer thread; close() waits for all of them."""
    inner = Slow()
    bg = InBackground(inner, max_pending=2)
    for i in range(6):
        bg.on_episode_end(end(i))
    bg.on_run_end()
    assert inner.seen == list(range(6))
    assert inner.threads == {"rollcap-writer"}
    assert inner.closed
    bg.close()  # idempotent


def test_background_failure_surfaces_on_the_host_thread():
    """A writer failure is re-raised at the next call, naming the wrapped subscriber."""
    bg = InBackground(Slow(fail_at=1))
    bg.on_episode_end(end(0))
    bg.on_episode_end(end(1))
    with pytest.raises(RecordingFailed, match="Slow failed on its writer thread: disk full"):
        bg.flush()


def test_metrics_summary_counts_outcomes():
    """Metrics summarises success rate and stop reasons."""
    m = Metrics()
    m.on_episode_end(end(0, success=True))
    m.on_episode_end(end(1, stop_reason="critic"))
    s = m.summary()
    assert s["episodes"] == 2 and s["successes"] == 1
    assert s["stop_reasons"]["critic"] >= 1


class Batches(Subscriber):
    """Takes episodes in batches (as EpisodeRecorder does: one HDF5 commit a call) and notes each batch's indices."""

    def __init__(self):
        self.batches: list[list[int]] = []

    def on_episode_end(self, end):
        self.batches.append([end.index])

    def on_episode_ends(self, ends):
        self.batches.append([e.index for e in ends])


def test_background_writer_commits_what_arrives_within_its_window_together():
    """Episodes that end within GATHER_S of each other reach the recorder in one call (one commit), in order; one
    that comes later is a call of its own; close() hands over what is gathered at once."""
    inner = Batches()
    bg = InBackground(inner, max_pending=8)
    for i in range(3):  # three episodes 20 ms apart: one commit
        bg.on_episode_end(end(i))
        time.sleep(0.02)
    time.sleep(0.6)
    bg.on_episode_end(end(3))
    t0 = time.monotonic()
    bg.on_run_end()
    assert inner.batches == [[0, 1, 2], [3]] and time.monotonic() - t0 < 0.5 + 0.1
