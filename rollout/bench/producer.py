"""A synthetic producer of finished episodes at a fixed rate: does the recorder keep up, and what does it cost the rollout?

At GPU speed a rollout finishes far more episodes per second than on this
CPU, so the writer's throughput and its cost to the host show only when
episodes arrive that fast. :func:`produce` hands recorded episodes (real ones,
from the bench's env) to a writer subscriber at ``rate`` episodes per second.
Between hand-offs the producer thread does the host's own work, stood in by
``work_ms`` of Python that holds the GIL (what the host thread of a GPU
rollout keeps busy per episode: boundaries, steps, the env's Python), then
sleeps until the next episode is due (the GPU's and MuJoCo's time, which
releases the GIL).

The writer's cost is the extra wall the producer spends on that work and on
the hand-offs with the writer running, against the same rounds without one,
as a share of the rollout wall (``episodes / rate``). It keeps up when the
producer never waits on a full queue and the queue drains within a couple
of episode periods after the last hand-off.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.protocols import EpisodeEnd, Subscriber


def _spin(n: int) -> int:
    """Python work that holds the GIL: ``n`` loop iterations."""
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1000003
    return acc


def calibrate(work_ms: float) -> int:
    """Iterations of :func:`_spin` that take ``work_ms`` on this thread (median of 5 tries)."""
    n = 20000
    t0 = time.perf_counter()
    _spin(n)
    per = max(time.perf_counter() - t0, 1e-6) / n
    tries = []
    for _ in range(5):
        m = int(work_ms / 1e3 / per)
        t0 = time.perf_counter()
        _spin(m)
        tries.append((time.perf_counter() - t0) / m)
    return max(1, int(work_ms / 1e3 / statistics.median(tries)))


class CpuOf(Subscriber):
    """Wraps a writer's inner subscriber: the CPU seconds its ``on_episode_end`` takes on the thread that runs it."""

    def __init__(self, inner: Subscriber):
        self.inner, self.cpu_s, self.episodes = inner, 0.0, 0
        self.wants_records = getattr(inner, "wants_records", False)

    def on_episode_end(self, end: EpisodeEnd) -> None:
        c0 = time.thread_time()
        try:
            self.inner.on_episode_end(end)
        finally:
            self.cpu_s += time.thread_time() - c0
            self.episodes += 1

    def on_episode_ends(self, ends: list[EpisodeEnd]) -> None:
        c0 = time.thread_time()
        try:
            many = getattr(self.inner, "on_episode_ends", None)
            if many is not None:
                many(ends)
            else:
                for end in ends:
                    self.inner.on_episode_end(end)
        finally:
            self.cpu_s += time.thread_time() - c0
            self.episodes += len(ends)

    def on_run_end(self) -> None:
        self.inner.on_run_end()

    def close(self) -> None:
        close = getattr(self.inner, "close", None) or self.inner.on_run_end
        close()


def produce(
    records: Sequence[EpisodeRecord], writer: Subscriber | None, episodes: int, rate: float, spin_n: int
) -> dict:
    """Hand ``episodes`` copies of ``records`` (new indices) to ``writer`` at ``rate`` per second; None: no writer.

    Returns seconds: ``work_s`` (the producer's own work), ``handoff_s`` (in ``on_episode_end``, waits on a
    full queue included), ``handoff_max_s``, ``late_s`` (behind schedule at the last hand-off),
    ``drain_s`` (``on_run_end`` after it: the queue left), ``wall_s``.
    """
    period = 1.0 / rate
    work = handoff = handoff_max = 0.0
    t_start = time.perf_counter()
    due = t_start
    for i in range(episodes):
        w0 = time.perf_counter()
        _spin(spin_n)
        w1 = time.perf_counter()
        rec = replace(records[i % len(records)], index=i)
        if writer is not None:
            writer.on_episode_end(
                EpisodeEnd(i, rec.seed, rec.stop_reason, rec.success, rec.num_steps, rec.num_chunks, record=rec)
            )
        h = time.perf_counter() - w1
        work, handoff, handoff_max = work + (w1 - w0), handoff + h, max(handoff_max, h)
        due += period
        left = due - time.perf_counter()
        if left > 0:
            time.sleep(left)
    t_last = time.perf_counter()
    if writer is not None:
        writer.on_run_end()
    t_end = time.perf_counter()
    return {
        "work_s": work,
        "handoff_s": handoff,
        "handoff_max_s": handoff_max,
        "late_s": max(0.0, t_last - due),
        "drain_s": t_end - t_last,
        "wall_s": t_end - t_start,
    }


def compare(
    records: Sequence[EpisodeRecord],
    writers: dict[str, Callable[[int], tuple[Subscriber, CpuOf | None]]],
    episodes: int,
    rate: float,
    work_ms: float,
    rounds: int,
) -> dict:
    """Interleaved rounds of no writer and each of ``writers`` (name -> ``round -> (subscriber, its CpuOf or None)``;
    a subscriber with ``writer_cpu_s`` and ``episodes``, such as a :class:`~rollcap.rollout.recording.process.WriterProcess`, reports its CPU itself).

    Returns per writer: ``cost`` (median, min, max over rounds of the extra producer wall over the rollout wall
    ``episodes / rate``), ``drain_ms`` and ``handoff_max_ms`` (max over rounds), ``late_ms`` (max),
    ``writer_cpu_ms`` per episode (when measured) and ``writer_cores`` (its CPU over the rollout wall).
    """
    spin_n = calibrate(work_ms)
    runs: dict[str, list[dict]] = {"none": [], **{k: [] for k in writers}}
    cpu: dict[str, list[float]] = {k: [] for k in writers}
    for r in range(rounds):
        for name in runs:
            if name == "none":
                runs[name].append(produce(records, None, episodes, rate, spin_n))
                continue
            sub, meter = writers[name](r)
            runs[name].append(produce(records, sub, episodes, rate, spin_n))
            if meter is not None and meter.episodes:
                cpu[name].append(meter.cpu_s / meter.episodes)
            elif getattr(sub, "writer_cpu_s", None) is not None and sub.episodes:  # a writer process reports its own
                cpu[name].append(sub.writer_cpu_s / sub.episodes)
    base = [x["work_s"] + x["handoff_s"] for x in runs["none"]]
    rollout_s = episodes / rate
    out: dict = {
        "episodes": episodes,
        "rate": rate,
        "work_ms": work_ms,
        "rounds": rounds,
        "work_ms_measured": statistics.median(x["work_s"] for x in runs["none"]) / episodes * 1e3,
    }
    for name in writers:
        costs = [(x["work_s"] + x["handoff_s"] - b) / rollout_s for x, b in zip(runs[name], base)]
        row = {
            "cost": {"median": statistics.median(costs), "min": min(costs), "max": max(costs), "n": len(costs)},
            "drain_ms": max(x["drain_s"] for x in runs[name]) * 1e3,
            "handoff_max_ms": max(x["handoff_max_s"] for x in runs[name]) * 1e3,
            "late_ms": max(x["late_s"] for x in runs[name]) * 1e3,
        }
        if cpu[name]:
            row["writer_cpu_ms"] = statistics.median(cpu[name]) * 1e3
            row["writer_cores"] = row["writer_cpu_ms"] / 1e3 * rate
        out[name] = row
    return out
