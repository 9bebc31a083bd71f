"""Subscribers: behaviour added around the host without flags inside it.

The host calls every subscriber's hooks in order. Hooks run on the host thread
between boundaries, so a slow subscriber slows the rollout: keep them cheap
(the recorder writes once per episode).
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from rollcap.rollout.errors import RecordingFailed
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, EpisodeStart, StepEvent, Subscriber

__all__ = ["InBackground", "Metrics", "Progress", "Subscriber"]

GATHER_S = 0.25
"""How long a writer thread waits, after an episode arrives, for more to write in the same commit (one HDF5 open,
set of masks and five fsyncs for all of them: ~3 ms of CPU an episode when each is committed alone)."""


def take_batch(q: queue.Queue, most: int, window_s: float = GATHER_S, stop=lambda: False) -> list:
    """The next item of ``q`` (waiting for it), then what arrives within ``window_s`` of it: up to ``most`` items, or
    up to an end mark (None, kept last), or until ``stop()`` says so (checked as items arrive)."""
    items = [q.get()]
    deadline = time.monotonic() + window_s
    while items[-1] is not None and len(items) < most and not stop():
        try:
            items.append(q.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
    return items


@dataclass
class Metrics(Subscriber):
    """Collects per-episode outcomes and per-chunk latencies."""

    episodes: list[dict] = field(default_factory=list)
    boundary_s: list[float] = field(default_factory=list)
    policy_s: list[float] = field(default_factory=list)
    critic_s: list[float] = field(default_factory=list)
    dropped: int = 0
    """Episodes that ended but were not recorded (discarded or dropped)."""
    _instruction: str = field(default="", repr=False)

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._instruction = start.instruction

    def on_chunk(self, chunk: ChunkEvent) -> None:
        self.boundary_s.append(chunk.latency_boundary_s)
        self.policy_s.append(chunk.latency_policy_s)
        self.critic_s.append(chunk.latency_critic_s)

    def on_episode_end(self, end: EpisodeEnd) -> None:
        if end.dropped:  # discarded by the operator, or an error under on_error="drop": not part of the run
            self.dropped += 1
            return
        self.episodes.append(self.row(end, self._instruction))

    @staticmethod
    def row(ep, instruction: str | None = None) -> dict:
        """One episode's outcome row, from an :class:`EpisodeEnd` or an :class:`EpisodeRecord`."""
        row = {
            "index": ep.index,
            "seed": ep.seed,
            "steps": ep.num_steps,
            "chunks": ep.num_chunks,
            "stop_reason": ep.stop_reason,
            "success": ep.success,
            "instruction": instruction if instruction is not None else ep.instruction,
        }
        if ep.error is not None:
            row["error"] = ep.error
        return row

    def summary(self, only: set[int] | None = None, earlier: list[dict] = ()) -> dict:
        """Outcomes of ``earlier`` rows plus this session's episodes (those in ``only``, if given); this session's latencies."""
        episodes = [*earlier, *(e for e in self.episodes if only is None or e["index"] in only)]
        n = len(episodes)
        reasons: dict[str, int] = {}
        for e in episodes:
            reasons[e["stop_reason"]] = reasons.get(e["stop_reason"], 0) + 1

        def ms(xs, q):
            return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else float("nan")

        return {
            "episodes": n,
            "successes": sum(e["success"] for e in episodes),
            "success_rate": (sum(e["success"] for e in episodes) / n) if n else float("nan"),
            "stop_reasons": dict(sorted(reasons.items())),
            "dropped": self.dropped,
            "chunks": sum(e["chunks"] for e in episodes),  # the whole run's, as the episodes; latencies: this session's
            "boundary_ms_median": ms(self.boundary_s, 50),
            "boundary_ms_p99": ms(self.boundary_s, 99),
            "policy_ms_median": ms(self.policy_s, 50),
            "critic_ms_median": ms(self.critic_s, 50),
        }


class Progress(Subscriber):
    """A tqdm bar over episodes showing success rate, last stop reason and chunk latency."""

    def __init__(self, total: int, file=None):
        self._total, self._file = total, file or sys.stderr
        self._bar = None  # drawn at the first episode: a run that fails to start leaves no bar behind
        self._ok = 0
        self._done = 0
        self._lat: list[float] = []

    def on_episode_start(self, start: EpisodeStart) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self._total, unit="ep", file=self._file, dynamic_ncols=True, leave=True)

    def on_chunk(self, chunk: ChunkEvent) -> None:
        self._lat.append(chunk.latency_boundary_s)

    def on_episode_end(self, end: EpisodeEnd) -> None:
        self._done += 1
        self._ok += int(end.success)
        lat = np.median(self._lat) * 1e3 if self._lat else float("nan")
        self._bar.set_postfix_str(f"success {self._ok}/{self._done} | last stop {end.stop_reason} | chunk {lat:.1f} ms")
        self._bar.update(1)

    def on_run_end(self) -> None:
        if self._bar is not None:
            self._bar.close()


class InBackground(Subscriber):
    """Runs a subscriber's ``on_episode_end`` on a writer thread, off the rollout's hot path.

    Finished episodes are queued in order and handled in order by a single
    thread; when several wait and the wrapped subscriber has
    ``on_episode_ends(ends)`` (:class:`~rollcap.rollout.recording.EpisodeRecorder`:
    one HDF5 commit for them), they go to it in one call, so a writer that
    fell behind catches up. ``on_run_end`` (and ``close``) waits until every queued
    episode is handled, then calls the wrapped ``on_run_end``. A failure on the
    writer thread is re-raised on the host thread at the next call. Other hooks
    are forwarded synchronously.

    Args:
        inner: the subscriber to wrap (e.g. an ``EpisodeRecorder``).
        max_pending: episodes that may wait in the queue before the host blocks
            (bounds memory when writing is slower than rolling out).
    """

    def __init__(self, inner: Subscriber, max_pending: int = 8):
        import queue
        import threading

        self.inner = inner
        self.wants_records = getattr(inner, "wants_records", False)
        self._q: queue.Queue = queue.Queue(maxsize=max_pending)
        self._max = max_pending
        self._error: BaseException | None = None
        self._failed = (
            False  # once a write failed, nothing after it is written (the files end at the last whole episode)
        )
        self._closed = False
        self._abandon = False
        self.discarded: list[int] = []
        """Indices of queued episodes dropped by :meth:`abandon` (never handed to the inner subscriber)."""
        self._thread = threading.Thread(target=self._loop, name="rollcap-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        many = getattr(self.inner, "on_episode_ends", None)
        while True:  # what waits, and what arrives within GATHER_S, goes in one call (one HDF5 commit)
            dropping = self._abandon  # queued before the abandon: dropped; gathered when it came: written
            batch = take_batch(self._q, self._max if many is not None else 1, stop=lambda: self._abandon)
            ends = [e for e in batch if e is not None]
            try:
                if not ends:
                    pass
                elif dropping or self._failed:  # after a failed write: not written, as after a second Ctrl-C
                    self.discarded.extend(e.index for e in ends)
                elif len(ends) > 1:
                    many(ends)
                else:
                    self.inner.on_episode_end(ends[0])
            except BaseException as err:  # handed to the host thread
                self._error, self._failed = err, True
            finally:
                for _ in batch:
                    self._q.task_done()
            if batch[-1] is None:
                return

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RecordingFailed(f"{type(self.inner).__name__} failed on its writer thread: {err}") from err

    def abandon(self) -> None:
        """Finish the episode (or the episodes taken together) being handled, drop the ones still queued (safe from a signal handler)."""
        self._abandon = True

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._raise()
        self.inner.on_episode_start(start)

    def on_chunk(self, chunk: ChunkEvent) -> None:
        self.inner.on_chunk(chunk)

    def on_step(self, step: StepEvent) -> None:
        self.inner.on_step(step)

    def on_episode_end(self, end: EpisodeEnd) -> None:
        self._raise()
        self._q.put(end)

    def flush(self) -> None:
        """Wait until every queued episode is handled."""
        self._q.join()
        self._raise()

    def on_run_end(self) -> None:
        self.close()

    def close(self) -> None:
        """Drain the queue, stop the thread, close the wrapped subscriber (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._q.put(None)
        self._thread.join()
        self._raise()
        close = getattr(self.inner, "close", None) or self.inner.on_run_end
        close()


class OneInterrupt:
    """While a run records: the first SIGINT / SIGTERM stops it as usual (the previous handler raises);
    any later one only abandons the queued episodes, so the drain ends in bounded time and nothing is half-written.

    Once the episodes stop (``live`` is cleared, the run's teardown begins), no
    signal raises any more: the first is kept in :attr:`caught` (the run ends
    as interrupted, with every finished episode written and ``summary.json``),
    later ones abandon the queue. An exception raised into the drain would
    leave the writer thread mid-write while the process exits (a hot journal,
    no summary, and h5py's exit-time clean-up blocked on the lock that thread
    holds).

    Main thread only (Python runs signal handlers there); elsewhere a no-op.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, writer):
        self.writer, self.seen, self.previous = writer, 0, {}
        self.live = True
        self.caught: BaseException | None = None

    def _handle(self, signum, frame):
        self.seen += 1
        if self.seen == 1:
            try:
                handler = self.previous.get(signum)
                if callable(handler):
                    handler(signum, frame)  # raises (KeyboardInterrupt, or the CLI's SIGTERM exception)
                raise KeyboardInterrupt
            except KeyboardInterrupt as stop:
                if self.live:
                    raise
                self.caught = stop
                return
        self.writer.abandon()
        print("interrupted again: finishing the episode being written, dropping the queued ones", file=sys.stderr)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
