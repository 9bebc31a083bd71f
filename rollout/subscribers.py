"""Subscribers: behaviour added around the host without flags inside it.

The host calls every subscriber's hooks in order. Hooks run on the host thread
between boundaries, so a slow subscriber slows the rollout: keep them cheap
(the recorder writes once per episode).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from rollcap.rollout.episode import EpisodeRecord


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk boundary, as subscribers see it."""

    episode: int
    chunk: int
    value: float
    latency_policy_s: float
    latency_critic_s: float
    latency_boundary_s: float
    stop_reason: str | None


class Subscriber:
    """Hooks the host calls; override the ones you need (all optional).

    Order within an episode: ``on_episode_start`` -> (``on_chunk`` -> ``on_step``*)*
    -> ``on_episode_end``. ``on_run_end`` once after the last episode, also when
    the run is interrupted.
    """

    def on_episode_start(self, index: int, seed: int, instruction: str) -> None: ...

    def on_chunk(self, info: ChunkInfo) -> None: ...

    def on_step(self, step: int, reward: float) -> None: ...

    def on_episode_end(self, record: EpisodeRecord) -> None: ...

    def on_run_end(self) -> None: ...


@dataclass
class Metrics(Subscriber):
    """Collects per-episode outcomes and per-chunk latencies."""

    episodes: list[dict] = field(default_factory=list)
    boundary_s: list[float] = field(default_factory=list)
    policy_s: list[float] = field(default_factory=list)
    critic_s: list[float] = field(default_factory=list)

    def on_chunk(self, info: ChunkInfo) -> None:
        self.boundary_s.append(info.latency_boundary_s)
        self.policy_s.append(info.latency_policy_s)
        self.critic_s.append(info.latency_critic_s)

    def on_episode_end(self, record: EpisodeRecord) -> None:
        self.episodes.append(
            {
                "index": record.index,
                "seed": record.seed,
                "steps": record.num_steps,
                "chunks": record.num_chunks,
                "stop_reason": record.stop_reason,
                "success": record.success,
                "instruction": record.instruction,
            }
        )

    def summary(self) -> dict:
        n = len(self.episodes)
        reasons: dict[str, int] = {}
        for e in self.episodes:
            reasons[e["stop_reason"]] = reasons.get(e["stop_reason"], 0) + 1

        def ms(xs, q):
            return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else float("nan")

        return {
            "episodes": n,
            "successes": sum(e["success"] for e in self.episodes),
            "success_rate": (sum(e["success"] for e in self.episodes) / n) if n else float("nan"),
            "stop_reasons": dict(sorted(reasons.items())),
            "chunks": len(self.boundary_s),
            "boundary_ms_median": ms(self.boundary_s, 50),
            "boundary_ms_p99": ms(self.boundary_s, 99),
            "policy_ms_median": ms(self.policy_s, 50),
            "critic_ms_median": ms(self.critic_s, 50),
        }


class Progress(Subscriber):
    """A tqdm bar over episodes showing success rate, last stop reason and chunk latency."""

    def __init__(self, total: int, file=None):
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="ep", file=file or sys.stderr, dynamic_ncols=True, leave=True)
        self._ok = 0
        self._done = 0
        self._lat: list[float] = []

    def on_chunk(self, info: ChunkInfo) -> None:
        self._lat.append(info.latency_boundary_s)

    def on_episode_end(self, record: EpisodeRecord) -> None:
        self._done += 1
        self._ok += int(record.success)
        lat = np.median(self._lat) * 1e3 if self._lat else float("nan")
        self._bar.set_postfix_str(f"success {self._ok}/{self._done} | last stop {record.stop_reason} | chunk {lat:.1f} ms")
        self._bar.update(1)

    def on_run_end(self) -> None:
        self._bar.close()


class InBackground(Subscriber):
    """Runs a subscriber's ``on_episode_end`` on a writer thread, off the rollout's hot path.

    Finished episodes are queued in order and handled one at a time by a
    single thread; ``on_run_end`` (and ``close``) waits until every queued
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
        self._q: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="rollcap-writer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            record = self._q.get()
            try:
                if record is None:
                    return
                if self._error is None:
                    self.inner.on_episode_end(record)
            except BaseException as err:  # handed to the host thread
                self._error = err
            finally:
                self._q.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"background {type(self.inner).__name__} failed: {err}") from err

    def on_episode_start(self, index: int, seed: int, instruction: str) -> None:
        self._raise()
        self.inner.on_episode_start(index, seed, instruction)

    def on_chunk(self, info: ChunkInfo) -> None:
        self.inner.on_chunk(info)

    def on_step(self, step: int, reward: float) -> None:
        self.inner.on_step(step, reward)

    def on_episode_end(self, record: EpisodeRecord) -> None:
        self._raise()
        self._q.put(record)

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
