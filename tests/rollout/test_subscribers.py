"""Subscribers: the background writer keeps order, drains on close, surfaces failures; metrics."""

from __future__ import annotations

import threading
import time

import pytest

from rollcap.rollout.recording import synthetic_record
from rollcap.rollout.subscribers import InBackground, Metrics, Subscriber


class Slow(Subscriber):
    def __init__(self, fail_at: int | None = None):
        self.seen: list[int] = []
        self.threads: set[str] = set()
        self.closed = False
        self.fail_at = fail_at

    def on_episode_end(self, record):
        time.sleep(0.01)
        self.threads.add(threading.current_thread().name)
        if record.index == self.fail_at:
            raise OSError("disk full")
        self.seen.append(record.index)

    def close(self):
        self.closed = True


def test_background_writer_keeps_order_and_drains_on_close():
    """Episodes are handled in order on the writer thread; close() waits for all of them."""
    inner = Slow()
    bg = InBackground(inner, max_pending=2)
    for i in range(6):
        bg.on_episode_end(synthetic_record(index=i, steps=2))
    bg.on_run_end()
    assert inner.seen == list(range(6))
    assert inner.threads == {"rollcap-writer"}
    assert inner.closed
    bg.close()  # idempotent


def test_background_failure_surfaces_on_the_host_thread():
    """A writer failure is re-raised at the next call, naming the wrapped subscriber."""
    bg = InBackground(Slow(fail_at=1))
    bg.on_episode_end(synthetic_record(index=0, steps=2))
    bg.on_episode_end(synthetic_record(index=1, steps=2))
    with pytest.raises(RuntimeError, match="background Slow failed: disk full"):
        bg.flush()


def test_metrics_summary_counts_outcomes():
    """Metrics summarises success rate and stop reasons."""
    m = Metrics()
    a = synthetic_record(index=0, steps=3)
    b = synthetic_record(index=1, steps=3)
    b.success, b.stop_reason = (not a.success), "critic"
    m.on_episode_end(a)
    m.on_episode_end(b)
    s = m.summary()
    assert s["episodes"] == 2 and s["successes"] == 1
    assert s["stop_reasons"]["critic"] >= 1
